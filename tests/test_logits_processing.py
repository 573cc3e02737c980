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
