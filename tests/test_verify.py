"""Speculative verify: cross-backend identity, strict == sample-then-compare, ragged == padded,
batch invariance, graph replay, bad input, opcheck.

CPU: reference + Triton (TRITON_INTERPRET=1). GPU: + CUDA. Statistical tests live in
test_verify_stats.py.

Shape grid (why):
* V = 1000 / 613: not a multiple of any block size; 613 is odd (scalar, unaligned CUDA path for
  bf16/fp16 when the row stride is odd).
* bs = 1 and ragged n_i with zeros (empty requests share cu values; n_i = 0 is bonus-only).
* a lowered Triton block (64) so rows span several vocabulary splits on the CPU too.
* GPU only: bs = 1500 > 1024 (grid over requests), V = 151936 / 262144 (clusters of 8 CTAs), and
  rows * V > 2**31 elements (64-bit row offsets).
"""
from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest
import torch

from tokenspeed_kernel import ops, testing
from tokenspeed_kernel.reference import verify as rv
from cpp_schemas import cpp_schemas

ov = importlib.import_module("tokenspeed_kernel.ops.verify")   # ops.verify is also a function

HAS_CUDA = torch.cuda.is_available()
INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if HAS_CUDA else "cpu"


def _has_ext():
    import tokenspeed_kernel
    return tokenspeed_kernel.extension_available()


def _backends():
    out = ["reference"]
    if HAS_CUDA or INTERP:
        out.append("triton")
    if HAS_CUDA and _has_ext():
        out.append("cuda")
    return out


@pytest.fixture(autouse=True)
def _small_triton_blocks():
    from tokenspeed_kernel.triton import verify as tv
    old = tv.DEFAULT_BLOCK
    if not HAS_CUDA:
        tv.DEFAULT_BLOCK = 64
    yield
    tv.DEFAULT_BLOCK = old


def make_problem(n_list, V, dtype=torch.float32, seed=0, device=DEV, scale=3.0, agree=0.6,
                 noise=0.7):
    """Ragged problem: target rows, draft rows close to the target, drafts from the draft argmax
    for a fraction ``agree`` of the slots (so acceptances happen), random ids otherwise."""
    g = torch.Generator().manual_seed(seed)
    bs = len(n_list)
    n = torch.tensor(n_list, dtype=torch.int64)
    cu = torch.zeros(bs + 1, dtype=torch.int64)
    cu[1:] = n.cumsum(0)
    tot = int(cu[-1])
    tgt = torch.randn(tot + bs, V, generator=g) * scale
    t_start = cu[:-1] + torch.arange(bs)
    rows = [int(t_start[i]) + j for i in range(bs) for j in range(n_list[i])]
    drf = tgt[rows] + torch.randn(tot, V, generator=g) * noise if tot else torch.zeros(0, V)
    ids = torch.randint(0, V, (tot,), generator=g)
    if tot:
        pick = torch.rand(tot, generator=g) < agree
        ids = torch.where(pick, drf.argmax(1), ids)
    seed_t = torch.randint(0, 2**62, (bs,), generator=g)
    off = torch.randint(0, 2**40, (bs,), generator=g)
    return dict(target_logits=tgt.to(dtype).to(device), draft_token_ids=ids.to(device),
                cu_num_draft=cu.to(device), draft_logits=drf.to(dtype).to(device),
                seed=seed_t.to(device), offset=off.to(device))


def params(bs, kind, device=DEV):
    g = torch.Generator().manual_seed(bs * 7 + len(kind))
    T = (torch.rand(bs, generator=g) * 1.5 + 0.3)
    out = {}
    if kind in ("temp", "mixed", "minp"):
        out["temperature"] = T
    if kind == "mixed":
        T[::3] = 0.0     # greedy rows
        out["temperature"] = T
        out["min_p"] = torch.where(torch.arange(bs) % 2 == 0, torch.full((bs,), 0.05),
                                   torch.zeros(bs))
    if kind == "minp":
        out["min_p"] = torch.full((bs,), 0.2)
    if kind == "greedy":
        out["temperature"] = torch.zeros(bs)
    if kind == "topkp":     # top-k / top-p / min-p together; one greedy row
        out["temperature"] = T
        T[1] = 0.0
        out["top_k"] = torch.tensor([5, 0, 40, 1, 0, 7][:bs] + [0] * max(0, bs - 6))
        out["top_p"] = torch.tensor([1.0, 0.8, 0.6, 0.9, 0.3, 1.0][:bs] + [1.0] * max(0, bs - 6))
        out["min_p"] = torch.tensor([0.0, 0.0, 0.02, 0.0, 0.1, 0.0][:bs] + [0.0] * max(0, bs - 6))
    return {k: v.to(device) for k, v in out.items()}


def run(backend, mode, prob, extra=None, logprobs=True, **kw):
    args = dict(prob)
    tl = args.pop("target_logits")
    ids = args.pop("draft_token_ids")
    seed = args.pop("seed")
    off = args.pop("offset")
    if mode != "probabilistic":
        args.pop("draft_logits", None)
    args.update(extra or {})
    args.update(kw)
    fn = ops.verify_with_logprobs if logprobs else ops.verify
    return fn(tl, ids, seed, off, mode=mode, backend=backend, **args)


def assert_same(a, b, lp_tol=2e-4):
    assert torch.equal(a.tokens.cpu(), b.tokens.cpu()), (a.tokens, b.tokens)
    assert torch.equal(a.num_accepted.cpu(), b.num_accepted.cpu())
    assert torch.equal(a.valid.cpu(), b.valid.cpu())
    if hasattr(a, "logprobs") and hasattr(b, "logprobs"):
        torch.testing.assert_close(a.logprobs.cpu(), b.logprobs.cpu(), atol=lp_tol, rtol=1e-4,
                                   equal_nan=True)
        torch.testing.assert_close(a.processed_logprobs.cpu(), b.processed_logprobs.cpu(),
                                   atol=lp_tol, rtol=1e-4, equal_nan=True)


# ---------------------------------------------------------------------------------------------
# cross-backend identity
# ---------------------------------------------------------------------------------------------
CASES = [
    # (n_list, V, dtype, param kind)
    ([3, 0, 2, 4, 1], 1000, torch.float32, "temp"),
    ([2], 613, torch.bfloat16, "mixed"),
    ([1, 5, 0, 3], 613, torch.float16, "minp"),
    ([4, 4, 4], 1000, torch.float32, "greedy"),
    ([0, 0], 300, torch.float32, "none"),
    ([2, 1, 2, 0], 150, torch.float32, "topkp"),
    # 16-byte aligned 16-bit rows: the CUDA pos kernel's vector fast path (FFMA form)
    ([3, 1, 0, 2], 4096, torch.float16, "temp"),
    ([2, 4], 4096, torch.bfloat16, "temp"),
]


@pytest.mark.parametrize("mode", ["probabilistic", "ngram"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_verify_backends_identical(mode, case):
    n_list, V, dtype, kind = CASES[case]
    prob = make_problem(n_list, V, dtype, seed=case)
    extra = params(len(n_list), kind)
    ref = run("reference", mode, prob, extra)
    for b in _backends()[1:]:
        out = run(b, mode, prob, extra)
        assert_same(ref, out)
        # without logprobs the CUDA kernels take the two-pass order (approximate final tokens)
        assert_same(ref, run(b, mode, prob, extra, logprobs=False))
    # emitted tokens are well formed
    for i, nacc in enumerate(ref.num_accepted.tolist()):
        assert 0 <= nacc <= n_list[i]
        row = ref.tokens[i].tolist()
        assert all(t >= 0 for t in row[:nacc + 1]) and all(t == -1 for t in row[nacc + 1:])


def test_verify_identical_draft_accepts_everything():
    """q == p: every draft sampled from p is accepted (u < 1 = p/q)."""
    prob = make_problem([3, 2], 500, seed=3, agree=0.0)
    prob["draft_logits"] = prob["target_logits"][[0, 1, 2, 4, 5]].clone()
    s = ops.sample(prob["draft_logits"], torch.tensor([5, 6, 7, 8, 9], device=DEV),
                   torch.zeros(5, dtype=torch.int64, device=DEV), backend="reference")
    prob["draft_token_ids"] = s.tokens
    for b in _backends():
        out = run(b, "probabilistic", prob, logprobs=False)
        assert out.num_accepted.tolist() == [3, 2]


def test_verify_invalid_rows():
    """NaN in the target (or draft) row at a position stops the walk there with token 0."""
    prob = make_problem([3, 3, 2], 400, seed=4, agree=1.0, noise=0.0)
    tl = prob["target_logits"]
    tl[1, 7] = float("nan")            # request 0, position 1
    prob["draft_logits"][3 + 0, :] = float("-inf")   # request 1, position 0: no finite logit
    for mode in ("probabilistic", "ngram"):
        ref = run("reference", mode, prob)
        assert not bool(ref.valid[0])
        assert ref.tokens[0, int(ref.num_accepted[0])].item() == 0
        if mode == "probabilistic":
            assert not bool(ref.valid[1]) and int(ref.num_accepted[1]) == 0
        assert bool(ref.valid[2])
        for b in _backends()[1:]:
            assert_same(ref, run(b, mode, prob))


# (dtype, scale, shift, temperatures): logits * scale + shift, per-request temperatures. The
# processed logits are relative to the row max (docs/DESIGN.md), so none of these rows is
# invalid and every backend decides from y = (z - zmax) / T: z / T up to ~1e8 (fp32), the
# temperatures scaled with the logits (y of order 1: real sampling at |z| ~ 1e6), tiny ones
# (near-greedy: y ~ -1e7), T = 1e-38 (z / T overflows float32: y = 0 at the maxima, <= -1e38
# elsewhere) and T = 1e-45 (1 / T = +inf: y = 0 / -inf). 16-bit rows: |z / T| beyond the CUDA
# pos kernel's FFMA form (kFfmaRcMax). Ties: logits rounded to the dtype's grid at that magnitude.
LARGE_CASES = [
    (torch.float32, 1e4, 1e6, [1e4, 2e4, 7e3, 1e-3, 1e-38, 1e-45]),
    (torch.float32, 1.0, 3e7, [1.0, 4.0, 0.5, 8.0, 1e-38, 2.0]),
    (torch.bfloat16, 3e2, 3e4, [3e2, 6e2, 2e2, 1e-2, 1e-38, 1e-45]),
    (torch.float16, 3e2, 3e4, [3e2, 5e2, 1e-45, 2e2, 1e-38, 1.0]),
]


@pytest.mark.parametrize("case", range(len(LARGE_CASES)))
@pytest.mark.parametrize("mode", ["probabilistic", "ngram"])
def test_verify_large_logits_and_tiny_temperatures(mode, case):
    """Every backend emits the reference's tokens at large |z| and |z / T| (identity, with and
    without logprobs; CUDA also with every coin and every residual token through the exact
    path); no row is invalid, even where z / T overflows float32; the rows with T <= 1e-38 emit
    a maximal logit (p is uniform over the row's maxima)."""
    dtype, scale, shift, temps = LARGE_CASES[case]
    n_list = [3, 1, 2, 0, 4, 2]
    V = 1000 if HAS_CUDA else 301
    prob = make_problem(n_list, V, torch.float32, seed=900 + case, agree=0.7, noise=0.3)
    for key in ("target_logits", "draft_logits"):
        prob[key] = (prob[key] * scale + shift).to(dtype)
    extra = {"temperature": torch.tensor(temps, dtype=torch.float32, device=DEV)}
    zmax = max(abs(shift) + 20 * scale, 1.0)
    ulp = zmax * 2.0 ** -23 if dtype == torch.float32 else zmax * 2.0 ** -7
    for lp in (True, False):
        ref = run("reference", mode, prob, extra, logprobs=lp)
        assert bool(ref.valid.all())
        tl = prob["target_logits"].float().cpu()
        cu = prob["cu_num_draft"].cpu()
        for i, T in enumerate(temps):
            f = int(ref.num_accepted[i])
            if T <= 1e-38:
                row = tl[int(cu[i]) + i + f]
                assert row[int(ref.tokens[i, f])] == row.max()
        outs = [run(b, mode, prob, extra, logprobs=lp) for b in _backends()[1:]]
        if "cuda" in _backends():
            for knob in ("verify_exact_coins", "verify_exact_residual"):
                with testing.knobs(**{knob: True}):
                    outs.append(run("cuda", mode, prob, extra, logprobs=lp))
        for out in outs:
            assert torch.equal(ref.tokens.cpu(), out.tokens.cpu()), (ref.tokens, out.tokens)
            assert torch.equal(ref.num_accepted.cpu(), out.num_accepted.cpu())
            assert torch.equal(ref.valid.cpu(), out.valid.cpu())
            if lp:
                # raw logprobs are float sums at |z| ~ shift: a few ulps of it apart; processed
                # ones are relative to the max (-inf where T = 1e-45 and a token is not maximal)
                torch.testing.assert_close(out.logprobs.cpu(), ref.logprobs.cpu(),
                                           atol=8 * ulp + 1e-3, rtol=1e-4)
                torch.testing.assert_close(out.processed_logprobs.cpu(),
                                           ref.processed_logprobs.cpu(), atol=2e-3, rtol=1e-4)


def test_reference_probabilistic_top_k_top_p_kept_sets():
    """Reference probabilistic verify with top-k / top-p: every emitted token is in the
    sampler's kept set (reference.sampling.kept_mask) of its position."""
    prob = make_problem([4, 3, 2], 200, seed=6, agree=0.3)
    extra = {"top_k": torch.tensor([5, 0, 20], device=DEV),
             "top_p": torch.tensor([1.0, 0.7, 0.9], device=DEV),
             "temperature": torch.tensor([1.0, 0.8, 1.2], device=DEV)}
    for mode in ("probabilistic", "ngram"):
        for s in range(4):
            prob["seed"] = prob["seed"] + 1
            out = run("reference", mode, prob, extra)
            P = rv.target_probabilities(prob["target_logits"].cpu(), prob["cu_num_draft"].cpu(),
                                        **{k: v.cpu() for k, v in extra.items()})
            cu = prob["cu_num_draft"].cpu()
            for i in range(3):
                for j in range(int(out.num_accepted[i]) + 1):
                    tok = int(out.tokens[i, j])
                    assert P[int(cu[i]) + i + j, tok] > 0


def test_triton_kept_thresholds_match_kept_mask():
    """Triton's top-k / top-p threshold (bisection over key56) gives exactly the sampler's kept
    set, ties and -inf included."""
    if "triton" not in _backends():
        pytest.skip("triton unavailable")
    from tokenspeed_kernel.reference import prims, sampling as rs
    from tokenspeed_kernel.triton import verify as tv
    g = torch.Generator().manual_seed(5)
    R, V = 8, 96
    z = (torch.randn(R, V, generator=g) * 2).round(decimals=1)    # many exact ties
    z[1, :50] = float("-inf")
    z[2] = 0.5                                                   # all equal
    T = torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0, 0.9, 2.0, 1.0])
    k = torch.tensor([5, 10, 7, 0, 96, 1, 30, 0], dtype=torch.int32)
    p = torch.tensor([1.0, 0.9, 0.5, 0.3, 0.999, 1.0, 0.05, 1.0])
    zd, Td, kd, pd = (t.to(DEV) for t in (z, T, k, p))
    thr = tv.kept_thresholds(zd, Td, kd, pd).cpu()
    zf, y, _, _, _ = rs.process(z, T)
    kept, _ = rs.kept_mask(zf, y, k.long(), p, torch.zeros(R))
    key = prims.key56(zf, torch.arange(V)[None, :])     # keys of the raw logits
    assert torch.equal(key >= thr[:, None], kept)


# ---------------------------------------------------------------------------------------------
# strict mode
# ---------------------------------------------------------------------------------------------
def _triton_sampler_available():
    try:
        import tokenspeed_kernel.triton.sampling  # noqa: F401
        return True
    except Exception:
        return False


def _strict_backends():
    out = []
    for b in _backends():
        if b == "triton" and not _triton_sampler_available():
            continue
        out.append(b)
    return out


@pytest.mark.parametrize("kind", ["temp", "mixed", "greedy"])
def test_strict_equals_sample_then_compare(kind):
    n_list = [3, 0, 2, 4]
    V = 613
    prob = make_problem(n_list, V, seed=11, agree=0.8, noise=0.0)
    extra = params(len(n_list), kind)
    # drafts = the target's own samples at most positions, so long accepted runs happen
    cu = prob["cu_num_draft"].cpu()
    bs = len(n_list)
    for b in _strict_backends():
        req = torch.repeat_interleave(torch.arange(bs), torch.tensor(n_list) + 1).to(DEV)
        pos = torch.cat([torch.arange(k + 1) for k in n_list]).to(DEV)
        kw = {k: v[req] for k, v in extra.items()}
        s = ops.sample(prob["target_logits"], prob["seed"][req], prob["offset"][req] + pos,
                       backend=b, **kw)
        ids = prob["draft_token_ids"].clone()
        rows = torch.cat([torch.arange(int(cu[i]) + i, int(cu[i]) + i + n_list[i])
                          for i in range(bs)]).to(DEV)
        agree = torch.rand(ids.shape[0]) < 0.8
        ids = torch.where(agree.to(DEV), s.tokens[rows], ids)
        prob2 = dict(prob, draft_token_ids=ids)
        out = run(b, "strict", prob2, extra)
        # by hand
        for i in range(bs):
            j = 0
            base = int(cu[i]) + i
            while j < n_list[i] and int(ids[int(cu[i]) + j]) == int(s.tokens[base + j]):
                j += 1
            assert int(out.num_accepted[i]) == j
            expect = ids[int(cu[i]):int(cu[i]) + j].tolist() + [int(s.tokens[base + j])]
            assert out.tokens[i, :j + 1].tolist() == expect
            assert out.tokens[i, j + 1:].eq(-1).all()
        ref = run("reference", "strict", prob2, extra)
        assert_same(ref, out, lp_tol=1e-3)


# ---------------------------------------------------------------------------------------------
# layouts and invariances
# ---------------------------------------------------------------------------------------------
def to_padded(prob, max_n):
    cu = prob["cu_num_draft"].cpu()
    bs = cu.shape[0] - 1
    V = prob["target_logits"].shape[1]
    dev = prob["target_logits"].device
    dt = prob["target_logits"].dtype
    tl = torch.full((bs, max_n + 1, V), float("nan"), dtype=dt, device=dev)   # padding = NaN
    dl = torch.full((bs, max_n, V), float("nan"), dtype=dt, device=dev)
    ids = torch.full((bs, max_n), -1, dtype=torch.int64, device=dev)
    for i in range(bs):
        a, b = int(cu[i]), int(cu[i + 1])
        n = b - a
        tl[i, :n + 1] = prob["target_logits"][a + i:b + i + 1]
        dl[i, :n] = prob["draft_logits"][a:b]
        ids[i, :n] = prob["draft_token_ids"][a:b]
    return tl, dl, ids


@pytest.mark.parametrize("mode", ["probabilistic", "ngram", "strict"])
def test_ragged_equals_padded(mode):
    n_list = [2, 0, 3, 1]
    prob = make_problem(n_list, 613, seed=21)
    extra = params(4, "mixed")
    tl, dl, ids = to_padded(prob, 4)
    bks = _strict_backends() if mode == "strict" else _backends()
    for b in bks:
        a = run(b, mode, prob, extra, max_num_draft=4)
        kw = dict(mode=mode, backend=b, **extra)
        if mode == "probabilistic":
            kw["draft_logits"] = dl
        p1 = ops.verify_with_logprobs(tl, ids, prob["seed"], prob["offset"], **kw)
        assert_same(a, p1)
        # explicit num_draft with arbitrary padding values
        ids2 = torch.where(ids < 0, torch.zeros_like(ids), ids)
        p2 = ops.verify_with_logprobs(tl.reshape(-1, tl.shape[-1]), ids2, prob["seed"],
                                      prob["offset"],
                                      num_draft=torch.tensor(n_list, device=DEV), **kw)
        assert_same(a, p2)


@pytest.mark.parametrize("mode", ["probabilistic", "ngram"])
def test_batch_invariance(mode):
    """A request's tokens do not depend on its batch position or its neighbours."""
    n_list = [2, 3, 1, 0, 4]
    prob = make_problem(n_list, 400, seed=31)
    extra = params(5, "temp")
    for b in _backends():
        full = run(b, mode, prob, extra, max_num_draft=4)
        cu = prob["cu_num_draft"].cpu()
        for i in (0, 2, 4):
            a, c = int(cu[i]), int(cu[i + 1])
            sub = dict(target_logits=prob["target_logits"][a + i:c + i + 1],
                       draft_token_ids=prob["draft_token_ids"][a:c],
                       cu_num_draft=torch.tensor([0, c - a], device=DEV),
                       draft_logits=prob["draft_logits"][a:c],
                       seed=prob["seed"][i:i + 1], offset=prob["offset"][i:i + 1])
            one = run(b, mode, sub, {k: v[i:i + 1] for k, v in extra.items()}, max_num_draft=4)
            assert torch.equal(one.tokens[0].cpu(), full.tokens[i].cpu())
            assert int(one.num_accepted[0]) == int(full.num_accepted[i])


def test_reproducible_and_seed_sensitive():
    prob = make_problem([3, 3, 3, 3], 300, seed=41, agree=0.0)
    a = run("reference", "probabilistic", prob, logprobs=False)
    b = run("reference", "probabilistic", prob, logprobs=False)
    assert torch.equal(a.tokens, b.tokens)
    prob2 = dict(prob, seed=prob["seed"] + 1)
    c = run("reference", "probabilistic", prob2, logprobs=False)
    assert not torch.equal(a.tokens, c.tokens)


def test_logprobs_match_sampler_definition():
    """Emitted-token logprobs equal log_softmax of the raw row and the processed distribution."""
    prob = make_problem([2, 3], 300, seed=51)
    extra = params(2, "minp")
    out = run("reference", "probabilistic", prob, extra)
    P = rv.target_probabilities(prob["target_logits"].cpu(), prob["cu_num_draft"].cpu(),
                                **{k: v.cpu() for k, v in extra.items()})
    LS = torch.log_softmax(prob["target_logits"].cpu().float(), 1)
    cu = prob["cu_num_draft"].cpu()
    for i in range(2):
        for j in range(int(out.num_accepted[i]) + 1):
            r = int(cu[i]) + i + j
            t = int(out.tokens[i, j])
            assert abs(out.logprobs[i, j].item() - LS[r, t].item()) < 1e-4
            assert abs(out.processed_logprobs[i, j].item() - P[r, t].log().item()) < 1e-4
    # out dtype
    o32 = run("reference", "probabilistic", prob, extra, out_dtype=torch.int32)
    assert o32.tokens.dtype == torch.int32 and torch.equal(o32.tokens.long(), out.tokens)


# ---------------------------------------------------------------------------------------------
# exact arithmetic helpers
# ---------------------------------------------------------------------------------------------
def test_mul_wide_exact():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 2**62, (2000,), generator=g)
    b = torch.randint(0, 2**62, (2000,), generator=g)
    a[:4] = torch.tensor([0, 1, 2**62, 2**62 - 1])
    b[:4] = torch.tensor([2**62, 2**62, 2**62, 2**62 - 1])
    hi, lo = rv.mul_wide(a, b)
    for x, y, h, l in zip(a.tolist(), b.tolist(), hi.tolist(), lo.tolist()):
        assert h * 2**62 + l == x * y and 0 <= l < 2**62


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def test_bad_input_names_the_argument():
    prob = make_problem([2, 1], 100, seed=61)
    tl, ids, cu = prob["target_logits"], prob["draft_token_ids"], prob["cu_num_draft"]
    dl, seed, off = prob["draft_logits"], prob["seed"], prob["offset"]

    def call(**kw):
        a = dict(cu_num_draft=cu, draft_logits=dl, backend="reference")
        a.update(kw)
        t = a.pop("tl", tl)
        i = a.pop("ids", ids)
        return ops.verify(t, i, seed, off, **a)

    with pytest.raises(ValueError, match="cu_num_draft"):
        call(cu_num_draft=torch.tensor([0, 2, 1], device=DEV), tl=tl[:3],
             draft_logits=dl[:1], ids=ids[:1])
    with pytest.raises(ValueError, match="cu_num_draft"):
        call(cu_num_draft=torch.tensor([1, 2, 3], device=DEV))
    with pytest.raises(ValueError, match="draft_token_ids"):
        call(ids=torch.tensor([5, 100, 3], device=DEV))
    with pytest.raises(ValueError, match="draft_token_ids"):
        call(ids=torch.tensor([5, -1, 3], device=DEV))
    with pytest.raises(ValueError, match="target_logits"):
        call(tl=tl[:-1])
    with pytest.raises(ValueError, match="draft_logits"):
        call(draft_logits=None)
    with pytest.raises(ValueError, match="draft_logits"):
        call(draft_logits=dl[:, :50])
    with pytest.raises(ValueError, match="draft_logits"):
        call(mode="ngram")
    with pytest.raises(ValueError, match="mode"):
        call(mode="tree")
    with pytest.raises(ValueError, match="seed"):
        ops.verify(tl, ids, seed[:1], off, cu_num_draft=cu, draft_logits=dl)
    with pytest.raises(ValueError, match="temperature"):
        call(temperature=torch.tensor([1.0, -1.0], device=DEV))
    with pytest.raises(ValueError, match="max_num_draft"):
        call(max_num_draft=1)
    with pytest.raises(ValueError, match="draft_token_ids"):     # padding not a suffix
        ops.verify(torch.zeros(6, 100, device=DEV), torch.tensor([[-1, 3], [1, 2]], device=DEV),
                   seed, off, mode="ngram")
    with pytest.raises(ValueError, match="num_draft"):
        ops.verify(torch.zeros(6, 100, device=DEV), torch.tensor([[1, 3], [1, 2]], device=DEV),
                   seed, off, mode="ngram", num_draft=torch.tensor([3, 0], device=DEV))
    with pytest.raises(ValueError, match="out_dtype"):
        call(out_dtype=torch.float32)


def test_bad_parameter_types_and_ranges():
    """Integer parameters refuse floats and bools (TypeError naming the argument, never a
    truncated value); seed is a 64-bit value (2**64 refused); top_k of any size saturates (k >=
    V stays "off": 2**32 + 1 does not wrap to 1); bools for max_num_draft are refused; meta
    target logits get an error naming target_logits."""
    prob = make_problem([2, 0, 3], 100, seed=62)
    tl, ids, cu = prob["target_logits"], prob["draft_token_ids"], prob["cu_num_draft"]
    dl, seed, off = prob["draft_logits"], prob["seed"], prob["offset"]

    def call(backend="reference", **kw):
        a = dict(cu_num_draft=cu, draft_logits=dl, backend=backend)
        a.update(kw)
        s = a.pop("seed", seed)
        o = a.pop("offset", off)
        return ops.verify(a.pop("tl", tl), ids, s, o, **a)

    for arg, kw in [("seed", dict(seed=1.5)), ("seed", dict(seed=2.0)), ("seed", dict(seed=True)),
                    ("offset", dict(offset=1.5)), ("top_k", dict(top_k=2.5)),
                    ("top_k", dict(top_k=False)), ("num_draft", None),
                    ("max_num_draft", dict(max_num_draft=True)),
                    ("max_num_draft", dict(max_num_draft=3.0)),
                    ("temperature", dict(temperature=True)), ("min_p", dict(min_p="0.1"))]:
        if kw is None:   # padded form
            with pytest.raises(TypeError, match=f"^{arg}"):
                ops.verify(torch.zeros(6, 100, device=DEV), torch.tensor([[1, 3], [1, 2]],
                           device=DEV), 1, 0, mode="ngram", num_draft=2.0)
            continue
        with pytest.raises(TypeError, match=f"^{arg}"):
            call(**kw)
    with pytest.raises(ValueError, match="^seed: must be a 64-bit integer"):
        call(seed=2**64)
    with pytest.raises(ValueError, match="^offset: must be a 64-bit integer"):
        call(offset=-(2**63) - 1)
    with pytest.raises(ValueError, match="^target_logits: is a meta tensor"):
        call(tl=torch.empty(tl.shape, device="meta"))
    with pytest.raises(ValueError, match="^max_num_draft: must be an int >= 0"):
        call(max_num_draft=-1)
    for b in _backends():
        base = call(backend=b, top_k=None)
        for k in (2**32 + 1, 2**40, 10**30, torch.full((3,), 2**32 + 1, device=DEV),
                  torch.full((3,), -(2**40), device=DEV)):
            assert_same(base, call(backend=b, top_k=k))
        # seed is 64 bits: 2**64 - 1 and -1 are the same Philox key
        assert_same(call(backend=b, seed=2**64 - 1), call(backend=b, seed=-1))


def _bad_verify_cases():
    """(argument named, case id, overrides of a valid 2-request ragged problem, V = 100)."""
    f = torch.float32
    nan1 = torch.tensor([1.0, float("nan")], device=DEV)
    inf1 = torch.tensor([1.0, float("inf")], device=DEV)
    return [
        ("target_logits", "int", dict(tl=lambda p: p["target_logits"].to(torch.int32))),
        ("target_logits", "float64", dict(tl=lambda p: p["target_logits"].double())),
        ("target_logits", "noncontig", dict(tl=lambda p: p["target_logits"].t().contiguous().t())),
        ("target_logits", "meta", dict(tl=lambda p: torch.empty(5, 100, device="meta"))),
        ("target_logits", "1-D", dict(tl=lambda p: p["target_logits"][0])),
        ("target_logits", "not_tensor", dict(tl=lambda p: [[0.0] * 100] * 5)),
        ("draft_token_ids", "float", dict(ids=lambda p: p["draft_token_ids"].to(f))),
        ("draft_token_ids", "bool", dict(ids=lambda p: p["draft_token_ids"] > 0)),
        ("draft_token_ids", "3-D", dict(ids=lambda p: p["draft_token_ids"].view(1, 1, 3))),
        ("draft_token_ids", "device", dict(ids=lambda p: p["draft_token_ids"].to("meta"))),
        ("cu_num_draft", "float", dict(cu_num_draft=torch.tensor([0.0, 2.0, 3.0], device=DEV))),
        ("cu_num_draft", "2-D", dict(cu_num_draft=torch.tensor([[0, 2, 3]], device=DEV))),
        ("cu_num_draft", "device", dict(cu_num_draft=torch.tensor([0, 2, 3], device="meta"))),
        ("cu_num_draft", "missing", dict(cu_num_draft=None)),
        ("draft_logits", "dtype", dict(draft_logits=lambda p: p["draft_logits"].half())),
        ("draft_logits", "device", dict(draft_logits=lambda p: p["draft_logits"].to("meta"))),
        ("draft_logits", "rows", dict(draft_logits=lambda p: p["draft_logits"][:2])),
        ("temperature", "nan", dict(temperature=nan1)),
        ("temperature", "inf", dict(temperature=inf1)),
        ("temperature", "shape", dict(temperature=torch.ones(3, device=DEV))),
        ("top_p", "nan", dict(top_p=nan1)),
        ("top_p", "inf", dict(top_p=inf1)),
        ("min_p", "nan", dict(min_p=nan1)),
        ("min_p", "inf", dict(min_p=inf1)),
        ("top_k", "float_tensor", dict(top_k=torch.ones(2, device=DEV))),
        ("seed", "2**64", dict(seed=2**64)),
        ("seed", "float_tensor", dict(seed=torch.zeros(2, device=DEV))),
        ("offset", "shape", dict(offset=torch.zeros(3, dtype=torch.int64, device=DEV))),
        ("backend", "unknown", dict(backend="numpy")),
    ]


@pytest.mark.parametrize("arg,kw", [(a, kw) for a, _, kw in _bad_verify_cases()],
                         ids=[f"{a}-{i}" for a, i, _ in _bad_verify_cases()])
def test_bad_tensors_and_values_name_the_argument(arg, kw):
    """Wrong dtype / shape / device / contiguity of every tensor, NaN / inf / out-of-range
    parameters: ValueError whose message starts with the argument's name."""
    prob = make_problem([2, 1], 100, seed=65)
    a = dict(cu_num_draft=prob["cu_num_draft"], draft_logits=prob["draft_logits"],
             backend="reference", seed=prob["seed"], offset=prob["offset"])
    a.update({k: (v(prob) if callable(v) else v) for k, v in kw.items()})
    tl = a.pop("tl", prob["target_logits"])
    ids = a.pop("ids", prob["draft_token_ids"])
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        ops.verify(tl, ids, a.pop("seed"), a.pop("offset"), **a)


@pytest.mark.parametrize("mode", ["probabilistic", "ngram", "strict"])
def test_documented_edges_empty_batch_one_token_vocab_no_drafts(mode):
    """Documented behaviour at the edges, on every backend: an empty batch (bs = 0) gives empty
    outputs; V = 1 accepts every draft (p = q = one-hot on token 0) and emits token 0; ragged
    requests with 0 drafts (all of them, no draft ids at all) emit one token, the sampler's
    token of their row at offset (strict / bonus), num_accepted 0."""
    dl = None
    for b in _backends():
        kw = dict(backend=b, mode=mode)
        e = torch.zeros(0, dtype=torch.int64, device=DEV)
        out = ops.verify_with_logprobs(torch.zeros(0, 7, device=DEV), e, e, e,
                                       cu_num_draft=torch.zeros(1, dtype=torch.int64, device=DEV),
                                       draft_logits=(torch.zeros(0, 7, device=DEV)
                                                     if mode == "probabilistic" else None),
                                       **kw)
        assert out.tokens.shape == (0, 1) and out.num_accepted.shape == (0,)
        assert out.valid.shape == (0,) and out.logprobs.shape == (0, 1)
        # V = 1
        n = [3, 0, 1]
        cu = torch.tensor([0, 3, 3, 4], device=DEV)
        tl = torch.randn(7, 1, device=DEV)
        dl = torch.randn(4, 1, device=DEV) if mode == "probabilistic" else None
        out = ops.verify(tl, torch.zeros(4, dtype=torch.int64, device=DEV), 1, 2,
                         cu_num_draft=cu, draft_logits=dl, temperature=0.7, **kw)
        assert out.num_accepted.tolist() == n and out.valid.all()
        assert out.tokens.tolist() == [[0, 0, 0, 0], [0, -1, -1, -1], [0, 0, -1, -1]]
        # ragged, no drafts at all
        prob = make_problem([0, 0, 0], 50, seed=66)
        T = torch.tensor([0.8, 0.0, 1.3], device=DEV)
        out = ops.verify(prob["target_logits"], prob["draft_token_ids"], prob["seed"],
                         prob["offset"], cu_num_draft=prob["cu_num_draft"],
                         draft_logits=prob["draft_logits"] if mode == "probabilistic" else None,
                         temperature=T, **kw)
        want = ops.sample(prob["target_logits"], prob["seed"], prob["offset"], temperature=T,
                          backend=b)
        assert out.tokens.shape == (3, 1) and out.num_accepted.tolist() == [0, 0, 0]
        assert torch.equal(out.tokens[:, 0], want.tokens) and out.valid.all()


def test_validate_false_without_max_num_draft_says_what_is_needed():
    """Ragged drafts, validate=False, no max_num_draft, no capture / compile: the error says
    that validate=False is the reason, not CUDA-graph capture."""
    prob = make_problem([2, 0, 3], 100, seed=63)
    with pytest.raises(ValueError, match="^max_num_draft: is required with ragged drafts when "
                                         "validate=False") as e:
        run("reference", "probabilistic", prob, validate=False)
    assert "capture" not in str(e.value) and "compile" not in str(e.value)


@pytest.mark.parametrize("mode", ["probabilistic", "ngram", "strict"])
def test_wrong_max_num_draft_never_writes_outside_outputs(mode):
    """A request with more drafts than max_num_draft (possible with validate=False, e.g. a wrong
    bound inside a CUDA graph, where validation is skipped) is made invalid: token 0 at slot 0,
    num_accepted 0, valid False, NaN logprob; the other requests are unaffected, and nothing is
    written outside the outputs (sentinels after each output stay). Triton kernels under the
    interpreter against the reference, ragged and padded (num_draft larger than max_n)."""
    from tokenspeed_kernel.triton import verify as tv
    prob = make_problem([3, 1, 0, 2], 100, seed=64, agree=1.0, noise=0.0)
    max_n = 1
    ref = run("reference", mode, prob, max_num_draft=max_n, validate=False)
    assert ref.valid.tolist() == [False, True, True, False]
    assert ref.num_accepted.tolist()[0::3] == [0, 0]
    assert ref.tokens[0].tolist() == [0, -1] and ref.tokens[3].tolist() == [0, -1]
    assert torch.isnan(ref.logprobs[0, 0]) and torch.isnan(ref.logprobs[3, 0])
    # requests 1 and 2 are as without the wrong bound
    good = make_problem([3, 1, 0, 2], 100, seed=64, agree=1.0, noise=0.0)
    full = run("reference", mode, good)
    assert ref.tokens[1:3].tolist() == full.tokens[1:3, :2].tolist()
    if not (HAS_CUDA or INTERP):
        return
    bs, W, S = 4, max_n + 1, 8
    dev = prob["target_logits"].device

    def guarded(shape, dtype, fill):
        n = 1
        for d in shape:
            n *= d
        buf = torch.full((n + S,), fill, dtype=dtype, device=dev)
        return buf, buf[:n].view(shape)

    bufs = [guarded((bs, W), torch.int64, 77), guarded((bs,), torch.int64, 77),
            guarded((bs,), torch.bool, True), guarded((bs, W), torch.float32, 7.0),
            guarded((bs, W), torch.float32, 7.0)]
    outs = [v for _, v in bufs]
    tgt, cu = prob["target_logits"], prob["cu_num_draft"]
    ids = prob["draft_token_ids"].to(torch.int64)
    seed, off = prob["seed"], prob["offset"]
    if mode == "strict":
        rows = tgt.shape[0]
        req = torch.repeat_interleave(torch.arange(bs, device=dev), cu[1:] - cu[:-1] + 1)
        pos = torch.arange(rows, device=dev) - (cu[:-1] + torch.arange(bs, device=dev))[req]
        s = ops.sample_with_logprobs(tgt, seed[req], off[req] + pos, backend="triton")
        tv.strict_accept(s.tokens, s.valid, s.logprobs, s.processed_logprobs, ids, cu, max_n,
                         False, *outs)
    else:
        tv.verify_probabilistic(tgt, prob["draft_logits"] if mode == "probabilistic" else None,
                                ids, cu, seed, off, None, None, max_n, False, mode == "ngram",
                                *outs, block=64)
    for buf, _ in bufs:
        assert bool((buf[-S:] == buf[-1]).all()) and buf[-1].item() in (77, True, 7.0), \
            "a kernel wrote past the end of an output"
    assert outs[0].tolist() == ref.tokens.tolist()
    assert outs[1].tolist() == ref.num_accepted.tolist()
    assert outs[2].tolist() == ref.valid.tolist()
    torch.testing.assert_close(outs[3], ref.logprobs, atol=2e-4, rtol=1e-4, equal_nan=True)
    # the public op gives the same (Triton; the CUDA kernels too where they are built), padded
    # form too (num_draft above max_n or negative)
    for b in _backends()[1:]:
        assert_same(ref, run(b, mode, prob, max_num_draft=max_n, validate=False))
    bsz, V = 3, 100
    z = torch.randn(bsz * (max_n + 1), V, device=dev)
    dpad = torch.randint(0, V, (bsz, max_n), device=dev)
    kw = dict(mode="ngram" if mode == "probabilistic" else mode, num_draft=torch.tensor(
        [3, 1, -1], device=dev), validate=False)
    outs = [ops.verify_with_logprobs(z, dpad, 5, 6, backend=b, **kw) for b in _backends()]
    assert outs[0].valid.tolist() == [False, True, False]
    assert outs[0].tokens[0].tolist() == [0, -1] and int(outs[0].num_accepted[0]) == 0
    assert outs[0].tokens[2].tolist() == [0, -1] and int(outs[0].num_accepted[2]) == 0
    for o in outs[1:]:
        assert_same(outs[0], o)


# ---------------------------------------------------------------------------------------------
# opcheck of the op schemas (CPU kernels = reference; CUDA kernels on the GPU)
# ---------------------------------------------------------------------------------------------
_defined = {}
# the verify ops' schemas as csrc/verify/verify_ops.cu defines them (their one source)
SCHEMAS = {n: s for n, s in cpp_schemas().items() if n.startswith("verify_")}


def _ensure_ops():
    """Use the extension's ops; where it lacks them (no extension), define the same schemas from
    Python (test only) and register fake + CPU kernels. An extension built from older sources
    (different schemas) is reported: the opcheck tests skip, test_schemas_match_extension fails."""
    if _defined:
        return
    _has_ext()    # loads the extension (and its registrations) if there is one
    missing = [n for n in SCHEMAS if not hasattr(torch.ops.tokenspeed_kernel, n)]
    _defined["done"] = True
    stale = [n for n in SCHEMAS if n not in missing and _schema_of(n) != SCHEMAS[n]]
    _defined["stale"] = stale
    if not missing:
        return
    lib = torch.library.Library("tokenspeed_kernel", "FRAGMENT")
    for name in missing:
        lib.define(SCHEMAS[name])
    _defined["lib"] = lib
    ov._register_library()


def _schema_of(name):
    op = getattr(torch.ops.tokenspeed_kernel, name).default
    return str(op._schema).replace("tokenspeed_kernel::", "")


def _skip_if_stale():
    if _defined.get("stale"):
        pytest.skip(f"the loaded extension has other schemas for {_defined['stale']}: it was "
                    f"built from older sources; rebuild it (make build)")


def _op_args(device, mode="probabilistic", logprobs=True):
    prob = make_problem([2, 0, 3], 64, seed=71, device=device)
    flags = (ov.F_NGRAM if mode == "ngram" else 0) | (ov.F_LOGPROBS if logprobs else 0)
    bs, W = 3, 4
    out = (torch.empty(bs, W, dtype=torch.int64, device=device),
           torch.empty(bs, dtype=torch.int64, device=device),
           torch.empty(bs, dtype=torch.bool, device=device),
           torch.empty(bs, W, device=device) if logprobs else None,
           torch.empty(bs, W, device=device) if logprobs else None)
    return (prob["target_logits"], prob["draft_logits"] if mode == "probabilistic" else None,
            prob["draft_token_ids"], prob["cu_num_draft"], prob["seed"], prob["offset"],
            torch.full((bs,), 0.9, device=device), torch.tensor([3, 0, 10], device=device,
                                                                dtype=torch.int32),
            torch.tensor([1.0, 0.8, 0.9], device=device), None, W - 1, flags) + out


@pytest.mark.parametrize("mode", ["probabilistic", "ngram"])
@pytest.mark.parametrize("logprobs", [False, True])
def test_opcheck_verify_probabilistic(mode, logprobs):
    _ensure_ops()
    _skip_if_stale()
    op = torch.ops.tokenspeed_kernel.verify_probabilistic.default
    devs = ["cpu"] + (["cuda"] if HAS_CUDA and _has_ext() else [])
    for d in devs:
        torch.library.opcheck(op, _op_args(d, mode, logprobs))


def test_opcheck_verify_strict_accept():
    _ensure_ops()
    _skip_if_stale()
    op = torch.ops.tokenspeed_kernel.verify_strict_accept.default
    devs = ["cpu"] + (["cuda"] if HAS_CUDA and _has_ext() else [])
    for d in devs:
        R, bs, W = 7, 3, 4
        cu = torch.tensor([0, 2, 2, 4], device=d)
        rt = torch.randint(0, 5, (R,), device=d)
        rv_ = torch.ones(R, dtype=torch.bool, device=d)
        ids = torch.randint(0, 5, (4,), device=d)
        lp = torch.randn(R, device=d)
        outs = (torch.empty(bs, W, dtype=torch.int64, device=d),
                torch.empty(bs, dtype=torch.int64, device=d),
                torch.empty(bs, dtype=torch.bool, device=d),
                torch.empty(bs, W, device=d), torch.empty(bs, W, device=d))
        torch.library.opcheck(op, (rt, rv_, ids, cu, lp, lp.clone(), W - 1, 0) + outs)


def test_triton_verify_loads_vectorize():
    """The Triton verify kernels that stream the logits keep 16-byte loads: an ahead-of-time
    compile for sm_90 with the JIT's specialization (tests/triton_verify_aot.py) has ld.global
    .v4 loads in each. Excluding ``chunk`` from specialization (to avoid recompiles it never
    caused: it is always a multiple of BLOCK) made them scalar and the bench ~30 % slower."""
    import triton_aot
    out = triton_aot.run_script("triton_verify_aot.py")
    counts = dict(re.findall(r"^(\w+): v4 loads (\d+)", out, re.M))
    assert set(counts) == {"_pass1", "_pass2", "_final", "_process_rows"}, out
    assert all(int(n) > 0 for n in counts.values()), out
    assert out.count("row table (padded=") == 2 and "compiled" in out, out
    assert out.count("_walk (padded=") == 2 and out.count("_strict_accept (padded=") == 2, out
    assert out.count("_prep_rows (padded=") == 2 and "_lse_combine compiled" in out, out
    # bf16 target / draft rows (and the top-k / top-p thresholds kernel) compile for the GPU
    for k in ("_pass1", "_pass2", "_final"):
        assert f"{k} bf16 compiled" in out, out
    assert "_thresholds fp32 compiled" in out and "_thresholds bf16 compiled" in out, out


def test_schemas_match_extension():
    """The loaded extension has exactly the schemas csrc/ defines, for every op family (an
    extension built from older sources does not)."""
    _ensure_ops()
    if not _has_ext() or _defined.get("lib") is not None:
        pytest.skip("compiled extension with the verify ops not available")
    for name, schema in cpp_schemas().items():
        assert hasattr(torch.ops.tokenspeed_kernel, name), name
        assert _schema_of(name) == schema, (
            f"{name}: extension schema differs (rebuild the extension if it predates csrc/)")


def test_cpu_op_matches_reference():
    _ensure_ops()
    _skip_if_stale()
    args = _op_args("cpu", "probabilistic", True)
    torch.ops.tokenspeed_kernel.verify_probabilistic(*args)
    prob = make_problem([2, 0, 3], 64, seed=71, device="cpu")
    ref = run("reference", "probabilistic", prob, {"temperature": torch.full((3,), 0.9),
                                                   "top_k": torch.tensor([3, 0, 10]),
                                                   "top_p": torch.tensor([1.0, 0.8, 0.9])},
              max_num_draft=3)
    assert torch.equal(args[-5], ref.tokens)     # the tokens out-tensor


# ---------------------------------------------------------------------------------------------
# GPU-only: large shapes, graphs
# ---------------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("V,dtype", [(151936, torch.float32), (262144, torch.bfloat16)])
@pytest.mark.parametrize("mode", ["probabilistic", "ngram"])
def test_gpu_large_vocab_identity(V, dtype, mode):
    n_list = [4, 1, 0, 8, 3, 5]
    prob = make_problem(n_list, V, dtype, seed=81)
    extra = params(len(n_list), "mixed")
    ref = run("reference", mode, prob, extra)
    for b in _backends()[1:]:
        assert_same(ref, run(b, mode, prob, extra), lp_tol=2e-3)
        assert_same(ref, run(b, mode, prob, extra, logprobs=False))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shift", [0.0, 3e4, 3e5])
@pytest.mark.parametrize("mode", ["probabilistic", "ngram"])
def test_gpu_approximate_coins_decide_like_exact(mode, shift):
    """The CUDA kernels decide most accept coins, and (without logprobs) most final tokens at a
    rejection, from error-bounded approximate mass sums (score intervals for the residual) and
    send the undecided ones through the exact sums. Forcing every coin and token through the
    exact sums (exact coins), or every approximately decided token through the exact second pass
    after its scan (exact residual), must not change a token, and all must equal the reference.
    The error bound does not depend on the logits' magnitude (the processed logits are relative
    to the row max); shifted logits check the decisions at |z| ~ 3e4 / 3e5, where a max-free
    float form would lose bits. Logprobs calls take the one-pass order (resolve kernel first).
    Batches of 8 and 40
    requests: at bs <= 32 (sm_90) the listed requests take the fused cluster kernel, above it the
    resolve kernel and the second pass."""
    if "cuda" not in _backends():
        pytest.skip("needs the CUDA extension")
    for k in range(6):
        n_list = [5, 3, 8, 1, 0, 6, 2, 7] * (5 if k < 2 else 1)
        V = (32000, 4099, 151936)[k % 3]
        prob = make_problem(n_list, V, torch.float32, seed=300 + k, agree=0.8, noise=0.3)
        prob["target_logits"] += shift
        prob["draft_logits"] += shift
        extra = params(len(n_list), "mixed" if k % 2 else "temp")
        for lp in ((False, True) if shift == 0.0 else (False,)):
            ref = run("reference", mode, prob, extra, logprobs=lp)
            fast = run("cuda", mode, prob, extra, logprobs=lp)
            assert_same(ref, fast, lp_tol=1e-3)
            for knob in ("verify_exact_coins", "verify_exact_residual"):
                with testing.knobs(**{knob: True}):
                    exact = run("cuda", mode, prob, extra, logprobs=lp)
                assert_same(ref, exact, lp_tol=1e-3)


@gpu
@pytest.mark.gpu
def test_gpu_batch_over_1024():
    n_list = [(i * 7) % 6 for i in range(1500)]
    prob = make_problem(n_list, 1000, torch.bfloat16, seed=91)
    extra = params(1500, "mixed")
    for mode in ("probabilistic", "ngram"):
        ref = run("reference", mode, prob, extra)
        for b in _backends()[1:]:
            assert_same(ref, run(b, mode, prob, extra), lp_tol=1e-3)
            assert_same(ref, run(b, mode, prob, extra, logprobs=False))


# (bs, n_i choices, V, dtype): one CTA per position (V = 1000 fp32: 5600 rows of one CTA, 528
# resident on an H100 / H200), and clusters of 2 (V = 151936 bf16: for 606 rows the launcher's
# model picks s = 2, 1212 CTAs in three waves of 528, on those GPUs; elsewhere the sizes may
# differ, and the identity still holds)
SKIP_SHAPES = {"single": (1200, (4, 3), 1000, torch.float32),
               "cluster": (70, (8, 7), 151936, torch.bfloat16)}


def _skip_problem(kind, seed):
    """SKIP_SHAPES[kind] as a ragged problem (n_i of its two values; at most a quarter of the
    bs x W grid empty): (problem, n_list, W, dtype)."""
    bs, ns, V, dtype = SKIP_SHAPES[kind]
    n_list = [ns[0] if i % 3 else ns[1] for i in range(bs)]
    prob = make_problem(n_list, V, dtype, seed=seed, agree=0.5, noise=0.5)
    return prob, n_list, max(ns) + 1, dtype


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(SKIP_SHAPES))
@pytest.mark.parametrize("layout", ["ragged", "padded"])
@pytest.mark.parametrize("shift", [0.0, 3e4])
def test_gpu_position_major_skips(kind, layout, shift):
    """Where the pos kernel's grid leaves blocks for a later wave, it runs in position-major
    order and skips (reads nothing of) positions after one whose coin it has already decided as
    not accepted, or whose row is bad (verify_pos_kernel, p.stop; in a cluster the decision is
    taken once and shared). Ragged n_i of two values (the bs x W grid is at most a quarter
    empty, so the launcher takes that order) and the padded layout (NaN padding rows). Tokens
    and logprobs must equal the reference's whatever was skipped: a NaN row at a first position
    (bad: the walk stops there), greedy and min-p rows (the exact two-pass path), logprobs on
    and off, and undecided (kUnsure) coins, which must not end a walk: the exact-coins knob
    (every coin undecided); also fp32 logits shifted by 3e4 (tokens only)."""
    if "cuda" not in _backends():
        pytest.skip("needs the CUDA extension")
    if shift and SKIP_SHAPES[kind][3] != torch.float32:
        pytest.skip("bf16 logits near 3e4 are multiples of 128: the exact-coins knob below "
                    "covers undecided coins instead")
    prob, n_list, W, _ = _skip_problem(kind, 97)
    bs = len(n_list)
    prob["target_logits"] += shift
    prob["draft_logits"] += shift
    cu = prob["cu_num_draft"].cpu()
    prob["target_logits"][int(cu[7]) + 7, 11] = float("nan")   # request 7, position 0
    extra = params(bs, "mixed")
    if layout == "padded":
        tl, dl, ids = to_padded(prob, W - 1)
    for mode in ("probabilistic", "ngram"):
        # logprobs only unshifted: at |logit| ~ 3e4 an fp32 ulp is 2e-3, and the backends'
        # logprobs differ by that much (the tokens may not)
        for lp in ((True, False) if shift == 0.0 else (False,)):
            ref = run("reference", mode, prob, extra, logprobs=lp, max_num_draft=W - 1)
            # the case exercises early rejections (what gets skipped) and the bad request
            assert float((ref.num_accepted.cpu() < torch.tensor(n_list)).float().mean()) > 0.3
            assert not bool(ref.valid[7])
            # the exact-coins knob: every coin that needs the sums is kUnsure (only bad rows and
            # p(x) = 0 are decided rejections in the pos kernel)
            for knob in ((False, True) if shift == 0.0 and not lp else (False,)):
                with testing.knobs(verify_exact_coins=knob):
                    if layout == "ragged":
                        got = run("cuda", mode, prob, extra, logprobs=lp, max_num_draft=W - 1)
                    else:
                        kw = dict(mode=mode, backend="cuda", **extra)
                        if mode == "probabilistic":
                            kw["draft_logits"] = dl
                        fn = ops.verify_with_logprobs if lp else ops.verify
                        got = fn(tl, ids, prob["seed"], prob["offset"], **kw)
                assert_same(ref, got, lp_tol=1e-3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(SKIP_SHAPES))
def test_gpu_position_major_graph_replay(kind):
    """The skip words are zeroed by a memset node of the captured graph: replays with new
    offsets (other coins, other rejections, other skips) equal eager calls, and a replay is
    not steered by the skips of the replay before it."""
    if "cuda" not in _backends():
        pytest.skip("needs the CUDA extension")
    prob, n_list, W, _ = _skip_problem(kind, 131)
    extra = params(len(n_list), "temp")
    seed, off = prob["seed"].clone(), prob["offset"].clone()
    kw = dict(backend="cuda", cu_num_draft=prob["cu_num_draft"], max_num_draft=W - 1,
              draft_logits=prob["draft_logits"], **extra)

    def call():
        return ops.verify(prob["target_logits"], prob["draft_token_ids"], seed, off, **kw)

    call()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    accepted = set()
    for step in range(4):
        graph.replay()
        eager = call()
        torch.cuda.synchronize()
        assert_same(eager, out)
        accepted.add(tuple(out.num_accepted.cpu().tolist()))
        off.add_(1 + step)
    assert len(accepted) == 4   # the offsets changed the outcome every time


_SKIP_CHILD = r"""
import sys, torch
from tokenspeed_kernel import ops
bs, n, V, dt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), getattr(torch, sys.argv[4])
g = torch.Generator(device="cuda").manual_seed(5)
tgt = (torch.randn(bs * (n + 1), V, device="cuda", generator=g) * 3).to(dt)
drf = (torch.randn(bs * n, V, device="cuda", generator=g) * 3).to(dt)   # unrelated drafts
ids = torch.randint(0, V, (bs * n,), device="cuda", generator=g)
cu = torch.arange(bs + 1, device="cuda") * n
out = ops.verify(tgt, ids, torch.arange(bs, device="cuda"),
                 torch.zeros(bs, dtype=torch.int64, device="cuda"), cu_num_draft=cu,
                 draft_logits=drf, temperature=torch.full((bs,), 0.8, device="cuda"),
                 max_num_draft=n)
torch.cuda.synchronize()
print("tokens", out.tokens.cpu().tolist(), out.num_accepted.cpu().tolist())
"""


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(SKIP_SHAPES))
def test_gpu_position_major_skips_happen(kind):
    """The skips happen (so the identity tests above test them): through the launcher's
    tuning hook (read once per process, hence a child process), with the list statistics on,
    one call with drafts unrelated to the target (almost every first coin rejects) counts the
    pos-kernel blocks that skipped -- more than zero with the order, zero without it
    (TS_VERIFY_NOSKIP) -- and both give the same tokens. The cluster size is forced (1 / 2)
    so that the grid exceeds one wave on any GPU of up to ~600 resident CTAs."""
    import re
    import subprocess
    import sys
    if "cuda" not in _backends():
        pytest.skip("needs the CUDA extension")
    bs, ns, V, dtype = SKIP_SHAPES[kind]
    args = [sys.executable, "-c", _SKIP_CHILD, str(bs), str(max(ns)), str(V),
            str(dtype).split(".")[-1]]
    res = {}
    for noskip in (False, True):
        env = dict(os.environ, TOKENSPEED_VERIFY_TUNING="1", TS_VERIFY_LISTSTATS="1",
                   TS_VERIFY_CS="1" if kind == "single" else "2")
        if noskip:
            env["TS_VERIFY_NOSKIP"] = "1"
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        m = re.findall(r"verify_list_stats .* skipped=(\d+)", p.stderr)
        assert len(m) == 1, p.stderr[-2000:]
        res[noskip] = (int(m[0]), p.stdout)
    rows = bs * (max(ns) + 1)
    assert 0 < res[False][0] < rows and res[True][0] == 0, (res[False][0], res[True][0])
    assert res[False][1] == res[True][1]


def _tied_problem(n_list, V, dtype, seed):
    """Logits with many exact ties (integers in [-4, 0], some rows N(0, 2)) so that top-k / top-p
    boundaries fall inside tied groups and the radix select has to descend to the id bits; a NaN
    in one target row and an all -inf draft row (invalid rows: thresholds must not fault)."""
    prob = make_problem(n_list, V, torch.float32, seed=seed, agree=0.5)
    g = torch.Generator().manual_seed(seed)
    for key in ("target_logits", "draft_logits"):
        t = prob[key].cpu()
        ties = torch.randint(-4, 1, t.shape, generator=g).float()
        normal = (torch.rand(t.shape[0], 1, generator=g) < 0.3).expand_as(t)
        prob[key] = torch.where(normal, t * (2.0 / 3.0), ties).to(dtype).to(DEV)
    prob["target_logits"][2, 7] = float("nan")        # request 0, position 2
    if prob["draft_logits"].shape[0] > 6:
        prob["draft_logits"][6] = float("-inf")         # a draft row with no finite logit
    return prob


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_top_k_top_p_radix_thresholds(dtype):
    """CUDA top-k / top-p kept sets by the radix select (the sampler's levels) == the reference
    and == the bisection oracle (knob verify_bisect_thresholds): tokens and logprobs. Processed
    logprobs are log(e / S) over the kept set, so a threshold one key off changes them (with
    tied masses by a factor like k / (k + 1)). Two shapes: 30 rows at V = 40000 (rows split over
    ~18 CTAs: the global histograms), and 560 rows at V = 4099 (one CTA per row on an H100 /
    H200: the shared-memory-only path). A third shape (V = 151936, N(0, 3^2) logits, top-k
    around the levels' list capacity of 4096) and the levels without their compaction
    (knob levels_no_list: every level re-reads the rows) must agree too, and so must
    level 0 without its excluded bins (levels_no_excl) and with a cut that forces
    its redo (levels_excl_test)."""
    if "cuda" not in _backends():
        pytest.skip("needs the CUDA extension")
    shapes = [([3, 2, 4, 1, 0, 2], 40000, True, [3, 0, 17, 1, 3000, 5]),
              ([3] * 80, 4099, True, [3, 0, 17, 1, 3000, 5]),
              ([2, 3, 1, 0, 2, 3], 151936, False, [0, 50, 4000, 5000, 4096, 300])]
    for si, (n_list, V, tied, ks) in enumerate(shapes):
        bs = len(n_list)
        prob = (_tied_problem(n_list, V, dtype, seed=700 + si) if tied
                else make_problem(n_list, V, dtype, seed=700 + si, agree=0.5))
        rep = (bs + 5) // 6
        extra = {
            "temperature": torch.tensor([1.0, 0.7, 1.3, 1.0, 0.9, 1.0] * rep)[:bs],
            "top_k": torch.tensor(ks * rep, dtype=torch.int32)[:bs],
            "top_p": torch.tensor([1.0, 0.3, 0.9, 0.9, 0.6, 0.5] * rep)[:bs] if tied else
            torch.tensor([0.9, 0.9, 0.95, 0.99, 0.999, 1.0] * rep)[:bs],
            "min_p": torch.tensor([0.0, 0.0, 0.05, 0.0, 0.0, 0.0] * rep)[:bs],
        }
        extra = {k: v.to(DEV) for k, v in extra.items()}
        for mode in ("probabilistic", "ngram"):
            for s in range(3 if tied else 2):
                prob["seed"] = prob["seed"] + 1
                ref = run("reference", mode, prob, extra)
                radix = run("cuda", mode, prob, extra)
                assert_same(ref, radix)
                with testing.knobs(verify_bisect_thresholds=True):
                    bis = run("cuda", mode, prob, extra)
                with testing.knobs(levels_no_list=True):
                    full = run("cuda", mode, prob, extra)
                others = [bis, full]
                # level 0 of the top-p rows without top-k: every key histogrammed, or a cut at
                # m - 2 that forces the redo path (sampling's test of the excluded bins)
                for knob in ("levels_no_excl", "levels_excl_test"):
                    with testing.knobs(**{knob: True}):
                        others.append(run("cuda", mode, prob, extra))
                for other in others:
                    assert torch.equal(radix.tokens, other.tokens)
                    assert torch.equal(radix.processed_logprobs.nan_to_num(7.0),
                                       other.processed_logprobs.nan_to_num(7.0))
                assert_same(ref, run("cuda", mode, prob, extra, logprobs=False))


@gpu
@pytest.mark.gpu
def test_gpu_rows_times_vocab_over_2_31():
    """8200 rows x 262144 > 2**31 elements: requests at the end (64-bit offsets) match a small
    call on their rows alone."""
    V = 262144
    bs = 2050
    total_rows = bs * 4
    if torch.cuda.get_device_properties(0).total_memory < 20 * 2**30:
        pytest.skip("needs ~10 GB")
    g = torch.Generator(device="cuda").manual_seed(0)
    tl = torch.randn(total_rows, V, device="cuda", dtype=torch.bfloat16, generator=g)
    dl = torch.randn(bs * 3, V, device="cuda", dtype=torch.bfloat16, generator=g)
    ids = torch.randint(0, V, (bs * 3,), device="cuda", generator=g)
    cu = torch.arange(bs + 1, device="cuda") * 3
    seed = torch.arange(bs, device="cuda")
    off = torch.zeros(bs, dtype=torch.int64, device="cuda")
    assert total_rows * V > 2**31
    for b in _backends()[1:]:
        full = ops.verify(tl, ids, seed, off, cu_num_draft=cu, draft_logits=dl, backend=b,
                          max_num_draft=3)
        for i in (bs - 1, bs - 2):
            one = ops.verify(tl[4 * i:4 * i + 4], ids[3 * i:3 * i + 3], seed[i:i + 1],
                             off[i:i + 1], cu_num_draft=torch.tensor([0, 3], device="cuda"),
                             draft_logits=dl[3 * i:3 * i + 3], backend=b, max_num_draft=3)
            assert torch.equal(one.tokens[0], full.tokens[i])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("lp", [True, False])
@pytest.mark.parametrize("mode", ["probabilistic", "ngram", "strict"])
def test_gpu_graph_replay_equals_eager(mode, lp):
    fn = ops.verify_with_logprobs if lp else ops.verify
    n_list = [3, 1, 4, 0]
    prob = make_problem(n_list, 151936, torch.bfloat16, seed=101)
    extra = params(4, "mixed")
    bks = _strict_backends() if mode == "strict" else _backends()
    for b in bks[1:]:
        kw = dict(mode=mode, backend=b, cu_num_draft=prob["cu_num_draft"], max_num_draft=4,
                  draft_logits=prob["draft_logits"] if mode == "probabilistic" else None, **extra)
        seed = prob["seed"].clone()
        off = prob["offset"].clone()
        eager = fn(prob["target_logits"], prob["draft_token_ids"], seed, off, **kw)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(prob["target_logits"], prob["draft_token_ids"], seed, off, **kw)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(prob["target_logits"], prob["draft_token_ids"], seed, off, **kw)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(eager, out, lp_tol=1e-5)   # Triton sums exp with float atomics
        # device-side parameters: a new offset changes the replayed result like eager does
        off.add_(7)
        graph.replay()
        eager2 = fn(prob["target_logits"], prob["draft_token_ids"], seed, off, **kw)
        torch.cuda.synchronize()
        assert_same(eager2, out, lp_tol=1e-5)


# ---------------------------------------------------------------------------------------------
# the bench's read-once bound and its table columns (CPU: the Triton interpreter)
# ---------------------------------------------------------------------------------------------
def test_bench_read_once_and_markdown(tmp_path):
    pytest.importorskip("triton")
    from tokenspeed_kernel.bench import verify as bv
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pb = bv.Problem(2, 1, 40000, torch.bfloat16, dev)   # 32768-element programs, last ones partial
    assert bv._check_read_once(pb, bv._read_once_call()) is None
    out = bv._read_once_call()(pb, pb.tgt, pb.drf)
    nt, nd = pb.tgt.numel(), pb.drf.numel()
    blk = 32768
    want = torch.cat([pb.tgt.reshape(-1).float(), torch.full((-nt % blk,), -float("inf"),
                                                             device=dev)]).view(-1, blk).amax(1)
    want_d = torch.cat([pb.drf.reshape(-1).float(), torch.full((-nd % blk,), -float("inf"),
                                                               device=dev)]).view(-1, blk).amax(1)
    assert torch.equal(out[:want.numel() + want_d.numel()], torch.cat([want, want_d]))
    # a wrong result is caught
    pb2 = bv.Problem(1, 1, 40000, torch.float32, dev)
    bad = lambda p, t, d: torch.zeros(4, device=dev)   # noqa: E731
    assert bv._check_read_once(pb2, bad) is not None

    env = {"gpu": "NVIDIA Test", "gpu_short": "test", "torch": "x", "cuda": "x", "triton": "x",
           "flashinfer": "x", "git_sha": "abc", "date": "d"}
    rows = []
    for prov, t in (("ours-cuda", 30.0), ("flashinfer", 90.0), ("read-once", 10.0)):
        rows.append(dict(env, provider=prov, dtype="bf16", V=151936, bs=16, n=1, status="ok",
                         graph_us=t, eager_us=t + 5, floor_us=4.0, pct_floor=400.0 / t,
                         accept_rate=0.5 if prov == "ours-cuda" else None,
                         ratio_vs_flashinfer=30.0 / 90.0 if prov == "ours-cuda" else None,
                         ratio_vs_read_once=3.0 if prov == "ours-cuda" else None))
    md = bv._markdown(rows, env, 4000.0, {})
    assert "read-once % of floor" in md and "CUDA / read-once" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 1 | 16 |"))
    assert "| 13.3 | 40.0 |" in line and "| 3.00 |" in line, line   # 4/30, 4/10 of floor
    bv.report.write_csv(tmp_path / "v.csv", rows, bv.CSV_COLUMNS)
    assert "ratio_vs_read_once" in (tmp_path / "v.csv").read_text().splitlines()[0]


def test_bench_verify_filters_harness(tmp_path):
    """bench verify-filters without a GPU: the shared check-then-time step (a provider whose
    check fails is never timed), the filtered reference check catching a wrong token, and the
    table / CSV / plot writer."""
    from tokenspeed_kernel.bench import timing as bt, verify as bv, verify_filters as vf
    calls = []

    def timer():
        calls.append(1)
        return bt.Timing(graph_us=10.0, eager_us=12.0, calls=1, samples=3)
    row = {"floor_us": 2.0}
    assert bv.check_and_time(row, None, lambda: None, timer, 4000)
    assert row["status"] == "ok" and row["pct_floor"] == 20.0 and row["gbps"] == 0.4
    row = {"floor_us": 2.0}
    assert not bv.check_and_time(row, None, lambda: "tokens differ", timer, 4000)
    assert row["status"] == "tokens differ" and len(calls) == 1
    row = {"floor_us": 2.0}
    assert not bv.check_and_time(row, "no extension", lambda: 1 / 0, timer, 4000)
    assert row["status"] == "no extension" and len(calls) == 1

    def boom():
        raise RuntimeError("graph capture")
    row = {"floor_us": 2.0}
    assert not bv.check_and_time(row, None, lambda: None, boom, 4000)
    assert row["status"].startswith("FAILED: RuntimeError")

    # the per-shape ratios and progress line both benches use
    ours = {"provider": "ours-cuda", "status": "ok", "graph_us": 30.0, "eager_us": 40.0}
    eager = {"provider": "flashinfer", "status": "ok", "graph_us": None, "eager_us": 60.0}
    bad = {"provider": "x", "status": "FAILED: RuntimeError: boom"}
    bv.set_ratio(ours, "ratio_vs_flashinfer", eager)
    bv.set_ratio(ours, "ratio_vs_bisect", None)
    assert ours["ratio_vs_flashinfer"] == 0.5 and ours["ratio_vs_bisect"] is None
    assert bv.shape_summary([ours, eager, bad]) == \
        "ours-cuda 30.0us, flashinfer 60.0us, x FAILED: RuntimeError: boom"

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Problem() samples its drafts with Triton: needs a GPU or TRITON_INTERPRET=1")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pb = bv.Problem(2, 2, 300, torch.float32, dev)
    pb.filt = vf.filter_params(pb, "top_k_top_p")
    assert pb.filt["top_k"].dtype == torch.int32 and int(pb.filt["top_k"][0]) == 50

    def ref_call(p, t, d):
        return ops.verify(t, p.ids, p.seed, p.offset, cu_num_draft=p.cu, draft_logits=d,
                          max_num_draft=p.n, backend="reference", **p.filt)
    assert bv._check_ours(pb, ref_call, "x") is None

    def wrong(p, t, d):
        o = ref_call(p, t, d)
        return o._replace(tokens=torch.where(o.tokens >= 0, (o.tokens + 1) % p.V, o.tokens))
    assert bv._check_ours(pb, wrong, "x") is not None

    env = {"gpu": "NVIDIA Test", "gpu_short": "test", "torch": "x", "cuda": "x", "triton": "x",
           "flashinfer": "x", "git_sha": "abc", "date": "d"}
    rows = []
    for mode in ("temp", "top_p"):
        for prov, t in (("ours-cuda", 30.0), ("ours-cuda-bisect", 300.0), ("flashinfer", 60.0)):
            r = dict(env, provider=prov, mode=mode, dtype="fp32", V=151936, bs=16, n=3,
                     floor_us=3.0, status="ok", graph_us=t, eager_us=t + 5)
            if mode == "temp" and prov == "ours-cuda-bisect":
                r = dict(r, status="same kernels as ours-cuda (no thresholds)", graph_us=None)
            rows.append(r)
    rows[3]["ratio_vs_bisect"], rows[3]["ratio_vs_flashinfer"] = 0.1, 0.5
    args = type("A", (), {"out": str(tmp_path), "no_plot": False})()
    vf._write(rows, env, 3000.0, args, {})
    md = (tmp_path / "test" / "verify_filters.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("| top_p | 16 |"))
    assert "| 30.0 (35.0) | 300.0 (305.0) | 60.0 (65.0) |" in line and "| 0.10 |" in line, line
    assert "ratio_vs_bisect" in (tmp_path / "test" / "verify_filters.csv").read_text()


# ---------------------------------------------------------------------------------------------
# bench/lab/tools/verify_tokens.py (the pruning check against a -DTS_FINAL_NOPRUNE build): the
# script itself, on small problems with the reference backend (CPU) -- dump is deterministic, cmp
# finds a change
# ---------------------------------------------------------------------------------------------
def test_verify_tokens_tool(tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tool = os.path.join(root, "bench", "lab", "tools", "verify_tokens.py")
    env = dict(os.environ, TS_TOK_SMALL="1", TS_TOK_BACKEND="reference", TS_TOK_DEV="cpu")
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    for f in (a, b):
        subprocess.run([sys.executable, tool, "dump", f, "2"], env=env, check=True,
                       capture_output=True)
    same = subprocess.run([sys.executable, tool, "cmp", a, b], env=env, capture_output=True,
                          text=True)
    assert same.returncode == 0 and "SAME" in same.stdout, same.stdout + same.stderr
    res = torch.load(b)
    k = sorted(res)[0]
    res[k][0, 0, 0] = res[k][0, 0, 0] + 1   # one token of one request changed
    torch.save(res, b)
    diff = subprocess.run([sys.executable, tool, "cmp", a, b], env=env, capture_output=True,
                          text=True)
    assert diff.returncode == 1 and "DIFFER in 1 requests" in diff.stdout, diff.stdout


def test_verify_ab_skip_summary_and_plot(tmp_path):
    """bench/lab/tools/verify_ab_skip.py --plot: per (drafts, shape) of the launcher's own cluster
    size, the mean skip / noskip ratio over the rounds of the last commit that measured it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "verify_ab_skip",
        Path(__file__).resolve().parents[1] / "bench/lab/tools" / "verify_ab_skip.py")
    ab = importlib.util.module_from_spec(spec)
    had = "TOKENSPEED_VERIFY_TUNING" in os.environ
    spec.loader.exec_module(ab)   # the tool turns the launcher's tuning hook on for its runs
    if not had:
        os.environ.pop("TOKENSPEED_VERIFY_TUNING", None)
    cols = "bs,n,V,dtype,cs,round,skip_us,noskip_us,skip/noskip,needed_positions_share,same_tokens"
    p = tmp_path / "ab.csv"
    p.write_text("# NVIDIA Test GPU (1x); torch\n"
                 f"git,kernels,drafts,{cols}\n"
                 "old,k,bench,256,8,151936,bf16,0,1,60,100,0.600,0.23,1\n"   # superseded
                 "new,k,bench,256,8,151936,bf16,0,1,60,100,0.700,0.23,1\n"
                 "new,k,bench,256,8,151936,bf16,0,2,60,100,0.800,0.23,1\n"
                 "new,k,bench,256,8,151936,bf16,8,1,60,100,0.100,0.23,1\n"   # forced size
                 "new,k,same,256,8,151936,bf16,0,1,60,100,1.030,1.00,1\n")
    rows = ab.summarize(str(p))
    assert [(r["drafts"], r["git"], round(r["ratio"], 3), r["needed"]) for r in rows] == [
        ("bench", "new", 0.75, 0.23), ("same", "new", 1.03, 1.0)]
    # the tool's own output (no leading columns) reads the same way
    q = tmp_path / "raw.csv"
    q.write_text(f"# x\n{cols}\n64,8,151936,fp32,0,1,1,1,0.660,0.24,1\n")
    assert [round(r["ratio"], 2) for r in ab.summarize(str(q))] == [0.66]
    pytest.importorskip("matplotlib")
    png = tmp_path / "ab.png"
    ab.plot(str(p), str(png))
    assert png.stat().st_size > 1000


# (cu_num_draft, len(draft_token_ids)): ragged layouts that are not a partition of the drafts
MALFORMED_CU = [([0, 2, 9], 3), ([0, 1, 3], 3), ([2, 3, 3], 3), ([0, 5, 3], 3),
                ([0, 2, 1, 3], 3), ([-1, 1, 3], 3)]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("mode", ["strict", "probabilistic"])
def test_unvalidated_malformed_ragged_layouts(backend, mode):
    """validate=False with a cu_num_draft that is not a partition of the drafts (what a wrong
    value inside a CUDA graph reaches): a request whose range leaves [0, len(draft_token_ids))
    or holds a negative count / more than max_num_draft is invalid (token 0, 0 accepted); the
    others are verified as alone (the reference verifies them one by one); nothing is read
    outside the tensors (the ranges would point past the draft ids and logits). Same tokens on
    every backend."""
    g = torch.Generator().manual_seed(5)
    V, mx = 48, 8
    for cu, nids in MALFORMED_CU:
        bs = len(cu) - 1
        tgt = (torch.randn(nids + bs, V, generator=g) * 3).to(DEV)
        drf = (torch.randn(nids, V, generator=g) * 3).to(DEV)
        ids = torch.randint(0, V, (nids,), generator=g).to(DEV)
        kw = dict(cu_num_draft=torch.tensor(cu, device=DEV), mode=mode, max_num_draft=mx,
                  draft_logits=drf if mode == "probabilistic" else None,
                  temperature=torch.full((bs,), 0.8, device=DEV), validate=False)
        seed = torch.arange(bs, device=DEV) + 7
        off = torch.zeros(bs, dtype=torch.int64, device=DEV)
        want = ops.verify_with_logprobs(tgt, ids, seed, off, backend="reference", **kw)
        got = ops.verify_with_logprobs(tgt, ids, seed, off, backend=backend, **kw)
        ok = [0 <= cu[i] <= cu[i + 1] <= nids and cu[i + 1] - cu[i] <= mx for i in range(bs)]
        assert want.valid.tolist() == ok, (cu, want.valid.tolist())
        assert torch.equal(got.tokens, want.tokens), (cu, got.tokens, want.tokens)
        assert torch.equal(got.num_accepted, want.num_accepted), cu
        assert torch.equal(got.valid, want.valid), cu
        assert torch.allclose(got.logprobs, want.logprobs, atol=1e-4, equal_nan=True), cu
        # a valid request: the tokens of verifying it alone
        for i in [i for i in range(bs) if ok[i]]:
            c0, c1 = cu[i], cu[i + 1]
            one = ops.verify(tgt[c0 + i:c1 + i + 1], ids[c0:c1], seed[i:i + 1], off[i:i + 1],
                             cu_num_draft=torch.tensor([0, c1 - c0], device=DEV), mode=mode,
                             max_num_draft=mx,
                             draft_logits=drf[c0:c1] if mode == "probabilistic" else None,
                             temperature=torch.full((1,), 0.8, device=DEV), backend=backend)
            assert torch.equal(one.tokens[0], got.tokens[i]), (cu, i)


def test_triton_verify_scratch_is_16_byte_aligned_at_every_batch():
    """The verify scratch arrays share one allocation; each must start on a 16-byte boundary at
    every batch size, or Triton's alignment specialization of pointer arguments compiles the
    kernels again for some batches (rows = bs * (n + 1) + bs * n is odd for odd bs). CPU check
    of the offsets behind test_triton_compile.py::test_triton_verify_no_recompile_across_batch_and_values."""
    from tokenspeed_kernel.triton import verify as triv
    for bs in range(0, 40):
        for n in range(0, 5):
            rows = bs * (n + 1) + bs * n
            arrs = triv._scratch(rows, bs, torch.device("cpu"))
            base = arrs[0].data_ptr()
            for name, a in zip(("key", "S", "thr", "nan", "se", "cand", "minp"), arrs):
                assert (a.data_ptr() - base) % 16 == 0, (bs, n, name)
            key, S, thr, nan, se, cand, minp0 = arrs
            assert key.numel() == S.numel() == thr.numel() == nan.numel() == se.numel() == \
                max(rows, 1), (bs, n)
            assert cand.numel() == 2 * bs and minp0.numel() == bs, (bs, n)
            assert cand.dtype == torch.int64 and minp0.dtype == torch.float32
            assert not any(a.any() for a in arrs), "scratch must be zero-initialized"
