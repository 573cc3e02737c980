"""The logits-processing spec (reference/logits_processing.py) against a per-element loop written
from the documented rules: penalties (HF / vLLM convention), logit bias, the xgrammar bitmask
layout, banned tokens, min_tokens, the token-count updates. CPU only (the spec; no kernel yet)."""
from __future__ import annotations

import math

import pytest
import torch

from tokenspeed_kernel.reference import logits_processing as LP
from tokenspeed_kernel.reference import sampling as ref


def _f32(x):
    return torch.tensor(x, dtype=torch.float32).item()


def _naive(z, inp, tpr):
    """Element by element, in the documented order, with float32 rounding after each op."""
    R, V = z.shape
    out = z.clone().to(torch.float32).tolist()
    for row in range(R):
        q = row // tpr
        x = out[row]
        if inp.logit_bias is not None:
            a, b = int(inp.logit_bias.indptr[q]), int(inp.logit_bias.indptr[q + 1])
            for e in range(a, b):
                t = int(inp.logit_bias.ids[e])
                x[t] = _f32(x[t] + float(inp.logit_bias.values[e]))
        for t in range(V):
            if inp.repetition_penalty is not None:
                seen = (int(inp.counts.seen[q, t >> 5]) >> (t & 31)) & 1
                if seen:
                    r = float(inp.repetition_penalty[q])
                    x[t] = _f32(x[t] / r) if x[t] > 0 else _f32(x[t] * r)
            c = int(inp.counts.output[q, t]) if inp.counts is not None else 0
            if c > 0 and inp.frequency_penalty is not None:
                x[t] = _f32(x[t] - _f32(float(inp.frequency_penalty[q]) * c))
            if c > 0 and inp.presence_penalty is not None:
                x[t] = _f32(x[t] - float(inp.presence_penalty[q]))
            if inp.allowed_mask is not None:
                if not (int(inp.allowed_mask[q, t >> 5]) >> (t & 31)) & 1:
                    x[t] = -math.inf
        if inp.banned is not None:
            for e in range(int(inp.banned.indptr[q]), int(inp.banned.indptr[q + 1])):
                x[int(inp.banned.ids[e])] = -math.inf
        if inp.min_tokens is not None and int(inp.num_output_tokens[q]) < int(inp.min_tokens[q]):
            for e in range(int(inp.stop_ids.indptr[q]), int(inp.stop_ids.indptr[q + 1])):
                x[int(inp.stop_ids.ids[e])] = -math.inf
    return torch.tensor(out, dtype=torch.float32)


def _csr(lists, values=False, g=None):
    indptr = torch.tensor([0] + [len(x) for x in lists]).cumsum(0)
    ids = torch.tensor([t for x in lists for t in x], dtype=torch.int64)
    vals = torch.randn(ids.numel(), generator=g) * 3 if values else None
    return LP.Csr(indptr, ids, vals)


def _pack(allowed):
    """[n, V] bool -> xgrammar's [n, ceil(V / 32)] int32 words, bit by bit."""
    n, V = allowed.shape
    words = torch.zeros(n, LP.mask_words(V), dtype=torch.int64)
    for q in range(n):
        for t in range(V):
            if allowed[q, t]:
                words[q, t >> 5] |= 1 << (t & 31)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _inputs(n, V, g):
    counts = LP.new_token_counts(n, V)
    prompts = [torch.randint(0, V, (int(torch.randint(0, 12, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(n)]
    LP.add_prompt(counts, torch.arange(n), _csr(prompts))
    for _ in range(5):
        LP.add_tokens(counts, torch.randint(-1, V, (n,), generator=g))
    allowed = torch.rand(n, V, generator=g) < 0.8
    uniq = [torch.randperm(V, generator=g)[:int(torch.randint(0, 6, (1,), generator=g))].tolist()
            for _ in range(n)]
    return LP.LogitsInputs(
        logit_bias=_csr(uniq, values=True, g=g),
        repetition_penalty=torch.rand(n, generator=g) + 0.5,
        frequency_penalty=torch.randn(n, generator=g) * 0.5,
        presence_penalty=torch.randn(n, generator=g) * 0.5,
        counts=counts,
        allowed_mask=_pack(allowed),
        banned=_csr([torch.randint(0, V, (3,), generator=g).tolist() for _ in range(n)]),
        min_tokens=torch.randint(0, 8, (n,), generator=g),
        num_output_tokens=torch.randint(0, 8, (n,), generator=g),
        stop_ids=_csr([torch.randint(0, V, (2,), generator=g).tolist() for _ in range(n)]))


@pytest.mark.parametrize("tpr", [1, 2])
@pytest.mark.parametrize("V", [37, 100])
def test_apply_matches_elementwise_rules(tpr, V):
    g = torch.Generator().manual_seed(V * 10 + tpr)
    n = 5
    inp = _inputs(n, V, g)
    z = torch.randn(n * tpr, V, generator=g) * 4
    z0 = z.clone()
    got = LP.apply(z, inp, tpr)
    want = _naive(z, inp, tpr)
    assert torch.equal(got, want)
    assert torch.equal(z, z0)   # input untouched (apply copies)
    assert (got != z0).any() and (got == float("-inf")).any()


def test_each_input_alone_and_order():
    V = 8
    z = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5, 0.0, 3.0, -3.0]])
    counts = LP.new_token_counts(1, V)
    LP.add_prompt(counts, torch.tensor([0]), _csr([[0, 1]]))
    LP.add_tokens(counts, torch.tensor([[2, 2, 3, -1]]))
    rp = LP.apply(z, LP.LogitsInputs(repetition_penalty=torch.tensor([2.0]), counts=counts))
    # sign-aware on seen tokens (prompt 0, 1; output 2, 3): 2 -> 1, -2 -> -4, 1 -> 0.5, -1 -> -2
    assert rp.tolist() == [[1.0, -4.0, 0.5, -2.0, 0.5, 0.0, 3.0, -3.0]]
    fp = LP.apply(z, LP.LogitsInputs(frequency_penalty=torch.tensor([0.25]),
                                     presence_penalty=torch.tensor([1.0]), counts=counts))
    # output counts: token 2 twice, token 3 once; the prompt does not count
    assert fp.tolist() == [[2.0, -2.0, 1.0 - 0.5 - 1.0, -1.0 - 0.25 - 1.0, 0.5, 0.0, 3.0, -3.0]]
    # bias first, then the sign-aware penalty on the biased value: -1 + 3 = 2 -> 2 / 2
    both = LP.apply(z, LP.LogitsInputs(logit_bias=LP.Csr(torch.tensor([0, 1]), torch.tensor([3]),
                                                         torch.tensor([3.0])),
                                       repetition_penalty=torch.tensor([2.0]), counts=counts))
    assert both[0, 3].item() == 1.0


def test_bitmask_layout_is_xgrammars():
    V = 70
    allowed = torch.zeros(1, V, dtype=torch.bool)
    allowed[0, [0, 31, 32, 63, 69]] = True
    words = _pack(allowed)
    assert words.shape == (1, 3)
    assert words[0, 0].item() == -2147483647       # bits 0 and 31
    assert torch.equal(LP.bit_is_set(words, V), allowed)
    out = LP.apply(torch.zeros(1, V), LP.LogitsInputs(allowed_mask=words))
    assert torch.equal(out[0] > float("-inf"), allowed[0])


def test_min_tokens_only_while_short():
    z = torch.zeros(2, 6)
    inp = LP.LogitsInputs(min_tokens=torch.tensor([3, 3]), num_output_tokens=torch.tensor([2, 3]),
                          stop_ids=_csr([[5], [5]]))
    out = LP.apply(z, inp)
    assert out[0, 5].item() == float("-inf") and out[1, 5].item() == 0.0


def test_token_count_updates():
    V = 40
    c = LP.new_token_counts(3, V)
    LP.add_prompt(c, torch.tensor([2, 0]), _csr([[1, 1, 33], [39]]))
    LP.add_tokens(c, torch.tensor([5, -1, 5]), valid=torch.tensor([True, True, False]))
    LP.add_tokens(c, torch.tensor([[5, 7], [0, -1], [33, 33]]))
    out = torch.zeros(3, V, dtype=torch.int32)
    out[0, 5] = 2
    out[0, 7] = 1
    out[1, 0] = 1
    out[2, 33] = 2
    assert torch.equal(c.output, out)
    seen = LP.bit_is_set(c.seen, V)
    want = out > 0
    want[2, [1, 33]] = True   # slot 2's prompt
    want[0, 39] = True        # slot 0's prompt
    assert torch.equal(seen, want)


def test_nothing_allowed_makes_the_row_invalid():
    z = torch.randn(2, 50)
    allowed = torch.ones(2, 50, dtype=torch.bool)
    allowed[1] = False
    zp = LP.apply(z, LP.LogitsInputs(allowed_mask=_pack(allowed)))
    tok, valid, _, _ = ref.sample(zp, torch.tensor([1, 2]), torch.tensor([0, 0]),
                                  torch.tensor([0.7, 0.7]), None, None, None, 1)
    assert valid.tolist() == [True, False]
    assert bool(torch.isfinite(zp[0, tok[0]]))


def test_penalties_need_counts():
    with pytest.raises(ValueError, match="^counts"):
        LP.apply(torch.zeros(1, 4), LP.LogitsInputs(presence_penalty=torch.tensor([1.0])))


def test_apply_verify_counts_the_earlier_drafts_per_position():
    """apply_verify (spec only): position j of a request is processed after its drafts
    d_0 .. d_{j-1} (penalty counts / seen bits, min_tokens progress), with the request's bias
    and banned ids, and one allowed mask per target row when given so; equal to ``apply`` of each
    row with those inputs written out by hand."""
    g = torch.Generator().manual_seed(3)
    V, W = 40, LP.mask_words(40)
    cu = torch.tensor([0, 3, 3, 5])                     # n_i = 3, 0, 2 drafts
    drafts = torch.tensor([7, 7, 9, 4, 7])
    R_t = int(cu[-1]) + 3
    z = torch.randn(R_t, V, generator=g) * 3
    counts = LP.new_token_counts(4, V)
    LP.admit(counts, torch.tensor([2, 0, 3]), _csr([[1, 7], [], [9]]))
    counts.output[2, 1] = 2
    slots = torch.tensor([2, 0, 3])
    allowed = torch.randint(-2**31, 2**31, (R_t, W), generator=g).to(torch.int32)
    inp = LP.LogitsInputs(
        logit_bias=LP.Csr(torch.tensor([0, 1, 1, 2]), torch.tensor([3, 5]),
                          torch.tensor([1.5, -2.0])),
        repetition_penalty=torch.tensor([1.3, 1.1, 1.2]),
        frequency_penalty=torch.tensor([0.4, 0.2, 0.3]),
        presence_penalty=torch.tensor([0.1, 0.0, 0.5]), counts=counts, count_slots=slots,
        allowed_mask=allowed, banned=_csr([[11], [], [12, 13]]),
        min_tokens=torch.tensor([2, 0, 9]), num_output_tokens=torch.tensor([0, 4, 1]),
        stop_ids=_csr([[0], [0], [0, 1]]))
    got = LP.apply_verify(z, inp, cu, drafts)
    r = 0
    for i in range(3):
        for j in range(int(cu[i + 1] - cu[i]) + 1):
            prev = drafts[int(cu[i]):int(cu[i]) + j]
            c = LP.TokenCounts(counts.seen[slots[i]][None].clone(),
                               counts.output[slots[i]][None].clone())
            for t in prev.tolist():
                c.output[0, t] += 1
                c.seen[0, t >> 5] |= (1 << (t & 31)) if (t & 31) < 31 else -2**31
            one = LP.LogitsInputs(
                logit_bias=LP.Csr(torch.tensor([0, int(inp.logit_bias.indptr[i + 1]
                                                       - inp.logit_bias.indptr[i])]),
                                  inp.logit_bias.ids[inp.logit_bias.indptr[i]:
                                                     inp.logit_bias.indptr[i + 1]],
                                  inp.logit_bias.values[inp.logit_bias.indptr[i]:
                                                        inp.logit_bias.indptr[i + 1]]),
                repetition_penalty=inp.repetition_penalty[i:i + 1],
                frequency_penalty=inp.frequency_penalty[i:i + 1],
                presence_penalty=inp.presence_penalty[i:i + 1], counts=c,
                allowed_mask=allowed[r:r + 1],
                banned=LP.Csr(torch.tensor([0, int(inp.banned.indptr[i + 1]
                                                   - inp.banned.indptr[i])]),
                              inp.banned.ids[inp.banned.indptr[i]:inp.banned.indptr[i + 1]]),
                min_tokens=inp.min_tokens[i:i + 1],
                num_output_tokens=inp.num_output_tokens[i:i + 1] + j,
                stop_ids=LP.Csr(torch.tensor([0, int(inp.stop_ids.indptr[i + 1]
                                                     - inp.stop_ids.indptr[i])]),
                                inp.stop_ids.ids[inp.stop_ids.indptr[i]:
                                                 inp.stop_ids.indptr[i + 1]]))
            want = LP.apply(z[r:r + 1], one)
            assert torch.equal(got[r:r + 1], want), (i, j)
            r += 1
    assert r == R_t
    # the semantics, spelled out: request 0's token 7 (drafts 0 and 1) is penalized by
    # 0 / 1 / 2 extra output counts at positions 0 / 1 / 2; stop id 0 is masked at positions
    # 0 and 1 of request 0 (0 + j < 2), not at 2 and 3
    per_req = LP.apply_verify(z, inp._replace(allowed_mask=None, logit_bias=None), cu, drafts)
    assert [bool(per_req[j, 0] == float("-inf")) for j in range(4)] == [True, True, False, False]
    zs = z[0].repeat(R_t, 1)        # every row the same raw logits: only the position differs
    fp = LP.apply_verify(zs, LP.LogitsInputs(frequency_penalty=torch.tensor([0.5, 0.0, 0.0]),
                                             counts=counts, count_slots=slots), cu, drafts)
    f = float(zs[0, 7]), float(inp.counts.output[2, 7])
    assert [round(float(fp[j, 7]), 4) for j in range(4)] == \
        [round(f[0] - 0.5 * (f[1] + k), 4) for k in (0, 1, 2, 2)]
    # an [n, W] allowed mask applies to every position of its request
    same = LP.apply_verify(z, inp._replace(allowed_mask=allowed[[0, 4, 5]]), cu, drafts)
    rows = LP.apply_verify(z, inp._replace(allowed_mask=allowed[[0, 0, 0, 0, 4, 5, 5, 5]]), cu,
                           drafts)
    assert torch.equal(same, rows)
