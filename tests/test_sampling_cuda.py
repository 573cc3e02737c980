"""GPU tests of the CUDA sampler's internal paths (csrc/sampling/sampler.cuh).

The CUDA kernel picks per row between a streamed gap test (temperature only), candidate lists
(top-k <= 512, top-p; min-p when chunks stream), cluster-wide radix thresholds (k > 512, or when
the candidates cannot hold the kept set) and the exact pass, and per call between chunks staged in shared memory
(small batches) and streamed chunks (large batches, one CTA per row). Every path must return the
reference's token. Here each path is forced (the ``sampler_flags`` knob) or provoked by
the input (flat rows whose top-p / min-p kept set exceeds the candidate cap, top values laid out
so that one thread's candidate list overflows, logits of magnitude 1e30), and the tokens are
compared with the reference bit for bit; logprobs to 1e-3.

Batch sizes (why): 1 and 3 (temperature / greedy rows: the split launch, up to 64 plain CTAs
per row and a merge kernel; with top-k / top-p / min-p tensors: the split-candidates launch, one
CTA per SM and the row's last CTA finishing it), 40 (temperature / greedy rows: the split launch
with a few CTAs per row; filtered rows: clusters of 2-4), 300 (one CTA per row, streamed), so the
same row is sampled by every layout. ``nosplit`` keeps batches up to 40 on the cluster launch
(clusters of 16 CTAs at B <= 3, chunks in shared memory; of 2-4 at B = 40).
"""
from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, sampler_path, skip_unless_backend
from tokenspeed_kernel import ops
from tokenspeed_kernel.ops import sampling as S
from tokenspeed_kernel.reference import sampling as ref

pytestmark = pytest.mark.gpu

# "launch0": the launches without the default launch-policy bits (k-off rows of the
# split-candidates launch read again by its finishing CTA instead of band masses / the streamed
# gap test, no rescan, undecided rows sampled by that CTA); "scand_topp": opt-in, top-p calls
# without a top-k tensor on that launch; "no_rescan" / "no_defer": the default without
# F_SCAND_RESCAN (top-k-off rows with few forwarded keys read chunks again) / F_SCAND_DEFER
# (undecided rows go to a cluster launch after it); "no_wide": without F_WIDE_DEFER (at one CTA
# per row, the rows that CTA cannot decide go to a launch of clusters after it); "no_hist":
# without F_HIST_TOPP (top-p rows without top-k on a cluster: 512 candidates, not the histogram)
FLAGS = {"default": 0, "generic": S.F_FORCE_GENERIC, "exact": S.F_FORCE_EXACT,
         "stream": S.F_NO_RESIDENT, "nosplit": S.F_NO_SPLIT,
         "nosplit_exact": S.F_NO_SPLIT | S.F_FORCE_EXACT, "scand_topp": S.F_SCAND_TOPP,
         "launch0": (0, 0),
         "no_rescan": (0, S._DEFAULT_LAUNCH_FLAGS & ~S.F_SCAND_RESCAN),
         "no_defer": (0, S._DEFAULT_LAUNCH_FLAGS & ~S.F_SCAND_DEFER),
         "no_wide": (0, S._DEFAULT_LAUNCH_FLAGS & ~S.F_WIDE_DEFER),
         "no_hist": (0, S._DEFAULT_LAUNCH_FLAGS & ~S.F_HIST_TOPP)}


cuda_flags = sampler_path   # an int (testing bits) or a (testing, launch-policy) pair


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _seeds(n, seed):
    g = _gen(seed)
    return (torch.randint(-2**62, 2**62, (n,), generator=g).to(DEVICE),
            torch.randint(0, 2**40, (n,), generator=g).to(DEVICE))


def _check(logits, kw, flags=0, logprobs=True, tpr=1):
    n = logits.shape[0] // tpr
    seed, offset = _seeds(n, logits.shape[0] * 7 + logits.shape[1])
    want = ref.sample(logits, seed, offset, kw.get("temperature"), kw.get("top_k"),
                      kw.get("top_p"), kw.get("min_p"), tpr)
    with cuda_flags(flags):
        if logprobs:
            got = ops.sample_with_logprobs(logits, seed, offset, backend="cuda",
                                           tokens_per_request=tpr, **kw)
        else:
            got = ops.sample(logits, seed, offset, backend="cuda", tokens_per_request=tpr, **kw)
    torch.cuda.synchronize()
    bad = (got.tokens != want[0]).nonzero()[:, 0]
    assert bad.numel() == 0, (f"{bad.numel()} rows differ, first {bad[:5].tolist()}: "
                              f"{got.tokens[bad[:5]].tolist()} vs {want[0][bad[:5]].tolist()}")
    assert torch.equal(got.valid, want[1])
    if logprobs:
        ok = want[1]
        torch.testing.assert_close(got.logprobs[ok], want[2][ok], atol=1e-3, rtol=1e-4)
        torch.testing.assert_close(got.processed_logprobs[ok], want[3][ok], atol=1e-3, rtol=1e-4)
        assert torch.isnan(got.logprobs[~ok]).all()
    return got


def _per_row(n, gen, k=None, p=None, mp=None, T=None):
    out = {}
    out["temperature"] = (T if T is not None else
                          torch.rand(n, generator=gen) * 1.2 + 0.3).float().to(DEVICE)
    if k is not None:
        out["top_k"] = torch.full((n,), k, dtype=torch.int32, device=DEVICE) if isinstance(
            k, int) else k.to(torch.int32).to(DEVICE)
    if p is not None:
        out["top_p"] = torch.full((n,), p, device=DEVICE)
    if mp is not None:
        out["min_p"] = torch.full((n,), mp, device=DEVICE)
    return out


MODES = {
    "temperature": dict(),
    "top_k_50": dict(k=50),
    "top_k_256": dict(k=256),
    "top_k_500": dict(k=500),
    "top_k_1000": dict(k=1000),
    "top_p": dict(p=0.9),
    "min_p": dict(mp=0.1),
    "top_k_top_p": dict(k=50, p=0.9),
    "all": dict(k=200, p=0.8, mp=0.05),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("B", [1, 3, 40, 300])
@pytest.mark.parametrize("flags", ["default", "generic", "exact", "stream", "nosplit",
                                   "nosplit_exact", "scand_topp", "launch0"])
def test_cuda_paths_match_reference(mode, B, flags):
    skip_unless_backend("cuda")
    if flags == "stream" and B == 300:
        pytest.skip("B = 300 already streams")
    if flags.startswith("nosplit") and B > 40:
        pytest.skip("B = 300 takes the cluster launch anyway")
    if flags in ("scand_topp", "launch0") and B > 3:
        pytest.skip("the split-candidates launch only takes small batches")
    V = 151936 if B <= 40 else 32000
    g = _gen(B * 100 + len(mode))
    logits = (torch.randn(B, V, generator=g) * 4).to(DEVICE)
    _check(logits, _per_row(B, g, **MODES[mode]), FLAGS[flags])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["temperature", "top_k_50", "top_p", "min_p"])
@pytest.mark.parametrize("B", [1, 300])
def test_cuda_half_dtypes(dtype, mode, B):
    skip_unless_backend("cuda")
    g = _gen(7)
    V = 151936 if B == 1 else 32000
    logits = (torch.randn(B, V, generator=g) * 4).to(dtype).to(DEVICE)
    _check(logits, _per_row(B, g, **MODES[mode]))


@pytest.mark.parametrize("B", [1, 300])
@pytest.mark.parametrize("mode", ["top_p", "min_p"])
def test_cuda_kept_set_beyond_candidates(B, mode):
    """Flat rows: the top-p (min-p) kept set holds thousands of tokens, far more than the 512
    candidates, so the kernel must fall back to its exact thresholds."""
    skip_unless_backend("cuda")
    g = _gen(11)
    V = 65536
    logits = (torch.randn(B, V, generator=g) * 0.05).to(DEVICE)
    kw = _per_row(B, g, p=0.95) if mode == "top_p" else _per_row(B, g, mp=0.5)
    _check(logits, kw)


@pytest.mark.parametrize("B", [1, 300])
@pytest.mark.parametrize("flags", ["default", "stream"])
@pytest.mark.parametrize("logprobs", [False, True])
def test_cuda_min_p_plain_path(B, flags, logprobs):
    """min-p alone: the PLAIN path's exact pass with the filter y >= L when the chunks sit in
    shared memory (B = 1), the candidates when they stream (B = 300, "stream"). Flat rows with
    min_p = 0.9 keep few tokens (the unfiltered winner is mostly dropped); peaked rows with
    min_p = 0.001 keep it almost always."""
    skip_unless_backend("cuda")
    if flags == "stream" and B == 300:
        pytest.skip("B = 300 already streams")
    g = _gen(13)
    V = 151936 if B == 1 else 32000
    flat = (torch.randn(B, V, generator=g) * 0.05).to(DEVICE)
    peaked = (torch.randn(B, V, generator=g) * 4).to(DEVICE)
    for logits, mp in ((flat, 0.9), (peaked, 0.001), (peaked, 0.3)):
        _check(logits, _per_row(B, g, mp=mp), FLAGS[flags], logprobs=logprobs)


@pytest.mark.parametrize("B", [1, 300])
def test_cuda_candidate_list_overflow(B):
    """The 30 largest logits sit at ids 4096 j (j < 30): with 1024 threads and 16-byte vectors
    every one of them lands in the same thread's list (8 entries), which must be detected."""
    skip_unless_backend("cuda")
    g = _gen(12)
    V = 4096 * 32
    logits = torch.randn(B, V, generator=g)
    logits[:, ::4096] = 20 + torch.rand(B, 32, generator=g)
    logits = logits.to(DEVICE)
    for kw in (_per_row(B, g, k=25), _per_row(B, g, k=25, p=0.9), _per_row(B, g, p=0.99),
               _per_row(B, g, mp=0.001)):
        _check(logits, kw)


@pytest.mark.parametrize("B", [1, 300])
@pytest.mark.parametrize("flags", ["default", "stream", "nosplit"])
@pytest.mark.parametrize("V", [5000, 20000])
def test_cuda_huge_magnitudes(B, flags, V):
    """|z / T| up to ~1e30 (the streamed gap test must hand these rows to the exact pass), ties
    at the max, and a subnormal T whose 1/T overflows. V = 20000 at B = 1: the split launch
    (its merge kernel runs the exact pass over the whole row)."""
    skip_unless_backend("cuda")
    g = _gen(13)
    base = torch.full((B, V), 1e30)
    ulp = 7.555786e22
    logits = base - torch.randint(0, 8, (B, V), generator=g).float() * ulp
    T = torch.full((B,), ulp * 2.0)   # |z / T| ~ 7e6: an O(1) spread of y
    T[1::3] = 1.0                     # |z / T| ~ 1e30: beyond the float64 gap test
    T[::3] = 1e-40                    # 1/T overflows: the T -> 0 limit
    _check(logits.to(DEVICE), dict(temperature=T.to(DEVICE)), FLAGS[flags])
    kw = _per_row(B, g, k=7, p=0.9, T=T)
    _check(logits.to(DEVICE), kw, FLAGS[flags])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_split_launch_near_ties(dtype):
    """The split launch's float32 pruning and gap test on rows built for near ties: few distinct
    logit values (many tokens share the max), T from 0.05 to 3, a row at |z t| = 2^14 (the gap
    test's limit) and one above it. Every token must be the reference's, for many seeds."""
    skip_unless_backend("cuda")
    g = _gen(21)
    B, V = 6, 151936
    z = torch.randint(0, 4, (B, V), generator=g).float() * 0.5
    z[4] += 8190.0             # |zmax t| just below 2^14 at T = 0.5
    z[5] += 65536.0            # beyond: the exact pass
    T = torch.tensor([0.05, 0.3, 1.0, 3.0, 0.5, 0.5])
    zz, TT = z.to(dtype).to(DEVICE), T.to(DEVICE)
    for rep in range(4):
        seed, offset = _seeds(B, 100 + rep)
        want = ref.sample(zz, seed, offset, TT, None, None, None, 1)[0]
        got = ops.sample(zz, seed, offset, temperature=TT, backend="cuda").tokens
        assert torch.equal(got.cpu(), want.cpu()), (rep, got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_split_launch_large_batch(dtype):
    """The split launch beyond B = SMs / 4 (F_SPLIT_WIDE: up to SMs / 2 rows; B = 48 here, a few
    CTAs per row), with and without a temperature tensor (None: T = 1). Its Philox-free skip of
    a group whose fl32(z t) + 16.64 is below the CTA's best h, on rows built for it (a shelf far
    below a few near-tied values spread over the row, so that the skipping thread's bound comes
    from another thread), random rows, greedy rows and a row beyond the gap test's |z t| limit:
    every token the reference's, and the cluster launch's (F_NO_SPLIT), for several seeds."""
    skip_unless_backend("cuda")
    g = _gen(23)
    B, V = 48, 151936
    z = torch.randn(B, V, generator=g) * 4
    shelf = torch.full((V,), -40.0)
    for r in range(0, B, 3):                  # every third row: the shelf + few near ties
        z[r] = shelf
        idx = torch.randperm(V, generator=g)[:64]
        z[r, idx] = torch.randint(0, 3, (64,), generator=g).float() * 0.25
    z[5] += 30000.0                           # |zmax t| > 2^14 at T <= 1: the exact pass
    T = torch.rand(B, generator=g) * 1.5 + 0.05
    T[7::11] = 0.0                            # greedy rows
    zz, TT = z.to(dtype).to(DEVICE), T.to(DEVICE)
    for rep in range(3):
        seed, offset = _seeds(B, 200 + rep)
        want = ref.sample(zz, seed, offset, TT, None, None, None, 1)[0]
        got = ops.sample(zz, seed, offset, temperature=TT, backend="cuda").tokens
        with cuda_flags(S.F_NO_SPLIT):
            clu = ops.sample(zz, seed, offset, temperature=TT, backend="cuda").tokens
        bad = (got.cpu() != want.cpu()).nonzero()[:, 0]
        assert bad.numel() == 0, (rep, bad[:5].tolist())
        assert torch.equal(clu.cpu(), want.cpu()), rep
    _check(zz, dict(temperature=TT))          # logprobs too
    # without a temperature tensor (T = 1; the 30000 row: the exact pass)
    seed, offset = _seeds(B, 300)
    want = ref.sample(zz, seed, offset, None, None, None, None, 1)[0]
    got = ops.sample(zz, seed, offset, backend="cuda").tokens
    with cuda_flags(S.F_NO_SPLIT):
        clu = ops.sample(zz, seed, offset, backend="cuda").tokens
    assert torch.equal(got.cpu(), want.cpu())
    assert torch.equal(clu.cpu(), want.cpu())


def test_cuda_special_rows():
    """NaN / +inf rows are invalid, -inf entries are never drawn, V = 1, unaligned rows (a
    sliced tensor: scalar loads), tokens_per_request > 1, greedy rows mixed in."""
    skip_unless_backend("cuda")
    g = _gen(14)
    for B in (1, 5, 300):
        logits = torch.randn(B, 40001, generator=g) * 3
        logits[0, 17] = float("nan")
        if B > 1:
            logits[1, 5] = float("inf")
            logits[2, ::2] = float("-inf")
        logits = logits.to(DEVICE)
        T = torch.rand(B, generator=g) + 0.2
        T[B // 2] = 0.0
        for kw in (dict(temperature=T.to(DEVICE)),
                   dict(temperature=T.to(DEVICE), top_k=torch.full((B,), 30, device=DEVICE,
                                                                    dtype=torch.int32)),
                   dict(temperature=T.to(DEVICE), top_p=torch.full((B,), 0.8, device=DEVICE))):
            _check(logits[:, 1:], kw)    # unaligned row starts
            _check(logits, kw)
    one = torch.randn(4, 1, generator=g).to(DEVICE)
    _check(one, dict(temperature=torch.ones(4, device=DEVICE)))
    tpr = torch.randn(6, 3000, generator=g).to(DEVICE)
    _check(tpr, dict(temperature=torch.rand(3, generator=g).to(DEVICE) + 0.5,
                     top_k=torch.tensor([5, 0, 300], dtype=torch.int32, device=DEVICE)), tpr=2)


def test_cuda_batch_layout_invariance():
    """The same row gives the same token at every batch size (cluster sizes 16 .. 1, shared
    memory or streamed chunks) and row position."""
    skip_unless_backend("cuda")
    g = _gen(15)
    V = 151936
    row = (torch.randn(1, V, generator=g) * 4).to(DEVICE)
    for kw in (dict(temperature=0.8), dict(temperature=0.8, top_k=50, top_p=0.9),
               dict(temperature=0.8, top_p=0.9), dict(temperature=0.8, min_p=0.1)):
        toks = []
        for B in (1, 2, 16, 64, 256):
            batch = row.expand(B, V).contiguous()
            seed = torch.full((B,), 1234, device=DEVICE)
            offset = torch.full((B,), 99, device=DEVICE)
            t = ops.sample(batch, seed, offset, backend="cuda", **kw).tokens
            assert (t == t[0]).all()
            toks.append(t[0].item())
        assert len(set(toks)) == 1, (kw, toks)


def _graph_replay_and_two_streams(inputs, call, stream_call, want):
    """inputs() -> a tuple of fresh input tensors; call(*x) -> sample output with logprobs (the
    captured call); stream_call(*x) -> output with tokens; want(*x) -> the reference's tuple.
    Captures call in a CUDA graph, replays it three times after copying new inputs into the
    captured tensors, and runs stream_call 20 times on each of two streams at once: every token
    must be the reference's (logprobs to 1e-3)."""
    x = inputs()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(*x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(*x)
    for _ in range(3):
        for dst, src in zip(x, inputs()):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        w = want(*x)
        assert torch.equal(out.tokens, w[0])
        torch.testing.assert_close(out.logprobs, w[2], atol=1e-3, rtol=1e-4)
    # two streams at once, each with its own rows
    xs = [inputs() for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in xs]
    outs = []
    torch.cuda.synchronize()
    for st, xx in zip(streams, xs):
        with torch.cuda.stream(st):
            outs.append([stream_call(*xx) for _ in range(20)])
    torch.cuda.synchronize()
    for o, xx in zip(outs, xs):
        w = want(*xx)[0]
        assert all(torch.equal(t.tokens, w) for t in o)


def test_cuda_split_launch_graph_replay_and_streams():
    """Small temperature / greedy batches take the split launch (two kernels, the second with
    programmatic dependent launch, a per-call workspace): under CUDA-graph capture and replay
    with new inputs, and with calls on two streams at once, every token is the reference's."""
    skip_unless_backend("cuda")
    g = _gen(16)
    B, V = 4, 151936

    def inputs():
        z = (torch.randn(B, V, generator=g) * 4).to(DEVICE)
        T = (torch.rand(B, generator=g) + 0.3).to(DEVICE)
        T[1] = 0.0                                    # a greedy row
        seed, offset = _seeds(B, int(torch.randint(0, 1 << 30, (1,), generator=g)))
        return z, T, seed, offset

    _graph_replay_and_two_streams(
        inputs,
        lambda z, T, seed, offset: ops.sample_with_logprobs(z, seed, offset, temperature=T,
                                                            backend="cuda"),
        lambda z, T, seed, offset: ops.sample(z, seed, offset, temperature=T, backend="cuda",
                                              validate=False),
        lambda z, T, seed, offset: ref.sample(z, seed, offset, T, None, None, None, 1))


# ---------------------------------------------------------------------------------------------
# the split-candidates launch (small batches with a top-k tensor)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("B", [2, 8, 16, 33])
@pytest.mark.parametrize("mode", ["top_k_50", "top_k_500", "top_k_1000", "top_p", "min_p",
                                  "top_k_top_p", "all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_scand_batches(B, mode, dtype):
    """Every CTA count the launch takes (S = SMs / B, down to 4 CTAs per row at B = 33 on an
    H100; B > SMs / 4 takes the cluster launch), both dtypes, and the nosplit cluster launch on
    the same rows. The top_p / min_p modes (no top-k tensor) take the cluster launch either
    way: there the two calls are the same path."""
    skip_unless_backend("cuda")
    g = _gen(B * 31 + len(mode))
    logits = (torch.randn(B, 151936, generator=g) * 4).to(dtype).to(DEVICE)
    kw = _per_row(B, g, **MODES[mode])
    a = _check(logits, kw)
    b = _check(logits, kw, S.F_NO_SPLIT)
    assert torch.equal(a.tokens, b.tokens)


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("where", ["low_ids", "one_lane", "spread_wide"])
def test_cuda_scand_rescans(B, where):
    """The row's top values crowd one CTA's chunk (low ids, as in real vocabularies where the
    frequent tokens come first), one lane's vectors (evicted keys: the CTA is incomplete), or
    spread so that a CTA holds more than its share: the finishing CTA must read those chunks
    again. Top-k 50 / 200 / 512, with top-p and with min-p; top-p alone and min-p alone (no
    top-k tensor: the cluster launch) on the same rows."""
    skip_unless_backend("cuda")
    g = _gen(17 + B)
    V = 151936
    z = torch.randn(B, V, generator=g)
    if where == "low_ids":
        z[:, :600] += 9.0 + torch.rand(B, 600, generator=g)
    elif where == "one_lane":
        # thread 0's vectors of the first chunk: ids 4096 j + (0..3)
        idx = torch.tensor([4096 * j + e for j in range(8) for e in range(4) if 4096 * j + e < V])
        z[:, idx] = 15.0 + torch.rand(B, idx.numel(), generator=g)
    else:
        z[:, 1000:9000:7] += 8.0
    z = z.to(DEVICE)
    for kw in (_per_row(B, g, k=50), _per_row(B, g, k=200, p=0.95), _per_row(B, g, k=512),
               _per_row(B, g, p=0.9), _per_row(B, g, mp=0.2), _per_row(B, g, k=20, mp=0.5)):
        _check(z, kw)


def test_cuda_scand_mixed_and_sparse_rows():
    """Per-row modes in one call with a top-k tensor (greedy, temperature only, top-k <= 512 and
    > 512, top-p with top-k off, min-p), rows with fewer finite logits than k, and with a single
    one; the same rows without a top-k tensor (the cluster launch). The k-off rows are decided
    from the chunks' band masses / streamed top-2 scores (default F_SCAND_BAND), and read again
    by the finishing CTA without the launch-policy bits ("launch0"); also with the opt-in
    F_SCAND_TOPP (the top-p call at B = 12, past the route's B <= 6: the cluster launch)."""
    skip_unless_backend("cuda")
    g = _gen(18)
    B, V = 12, 151936
    z = torch.randn(B, V, generator=g) * 3
    z[8, :] = float("-inf")
    z[8, torch.randperm(V, generator=g)[:30]] = torch.randn(30, generator=g)
    z[9, :] = float("-inf")
    z[9, 77777] = 1.0
    z[10, :] = float("-inf")
    z[10, torch.randperm(V, generator=g)[:3000]] = torch.randn(3000, generator=g)
    z = z.to(DEVICE)
    T = torch.rand(B, generator=g) + 0.4
    T[0] = 0.0
    k = torch.tensor([0, 0, 50, 1000, 7, 0, 300, 512, 50, 50, 100, 0], dtype=torch.int32)
    p = torch.tensor([1.0, 1.0, 0.9, 0.9, 1.0, 0.8, 1.0, 0.5, 0.9, 1.0, 0.95, 1.0])
    mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3])
    for kw in (dict(temperature=T, top_k=k, top_p=p, min_p=mp), dict(temperature=T, top_k=k),
               dict(temperature=T, top_p=p), dict(temperature=T, min_p=mp)):
        for fl in ("default", "launch0", "scand_topp"):
            _check(z, {n: v.to(DEVICE) for n, v in kw.items()}, FLAGS[fl])


@pytest.mark.parametrize("B", [8, 16, 24, 33])
def test_cuda_scand_k_off_prefix_rows(B):
    """Rows with top-k off in a call with a top-k tensor at B = 8 / 16 / 24 / 33 (16 / 8 / 5 / 4
    CTAs per row on a 132-SM GPU: fewer forwarded keys than the 512 candidates, so the
    finishing CTA decides from the complete prefix above the largest chunk bound when the kept
    set ends in it): top-p 0.5 / 0.9 / 0.99, with min-p, min-p alone, T from 0.3 to 2, flat
    rows (the kept set past the candidates) and rows with k = 1000 > 512 (at B = 24 / 33 both
    sampled by the cluster launch that follows, F_SCAND_DEFER; at B = 8 / 16 by the finishing
    CTA's generic path), with logprobs:
    == the reference, and == the launches without the default bits (launch0), the cluster
    launch (nosplit), the default without the rescan of the chunks (no_rescan; at >= 8 CTAs per
    row it reads the row's keys above the smallest forwarded key) and without the deferral
    (no_defer)."""
    skip_unless_backend("cuda")
    g = _gen(60 + B)
    V = 151936
    z = torch.randn(B, V, generator=g) * 4
    z[3] *= 0.02                                          # flat: kept set of thousands
    z[5, torch.randperm(V, generator=g)[:40]] += 30.0     # 40 dominant tokens
    z = z.to(DEVICE)
    i = torch.arange(B)
    k = torch.where(i % 2 == 0, 50, 0).to(torch.int32)
    k[6::8] = 1000                                        # k > 512: never decided by candidates
    p = torch.tensor([0.9, 0.5, 0.99, 0.9, 1.0, 0.95, 0.7, 1.0])[i % 8]
    mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.0, 0.02, 0.0])[i % 8]
    T = torch.tensor([0.8, 0.3, 1.0, 1.0, 0.7, 2.0, 1.3, 0.9])[i % 8]
    for kw in (dict(temperature=T, top_k=k, top_p=p, min_p=mp), dict(temperature=T, top_k=k,
                                                                      top_p=p)):
        kw = {n: v.to(DEVICE) for n, v in kw.items()}
        a = _check(z, kw)
        for fl in ("launch0", "nosplit", "no_rescan", "no_defer"):
            assert torch.equal(_check(z, kw, FLAGS[fl]).tokens, a.tokens), fl


# ---------------------------------------------------------------------------------------------
# opt-in (F_SCAND_TOPP): top-p without a top-k tensor on the split-candidates launch, band masses
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("B", [1, 2, 4, 6, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_scand_topp_rows(B, dtype):
    """Calls with a top-p tensor and no top-k tensor on the split-candidates launch (B <= 6 on
    132 SMs; B = 8: the cluster launch, or this launch on GPUs with more SMs): per-row top-p
    (band masses), top-p = 1 rows (temperature only, min-p only), greedy,
    top-p + min-p, T = 1e-3 and 50, T so small that 1 / T overflows (band masses off), flat
    rows (the kept set beyond the 512 candidates), logits of magnitude 1e30, a row with 3
    finite logits: == the reference, and == the cluster launch (nosplit)."""
    skip_unless_backend("cuda")
    g = _gen(40 + B)
    V = 151936
    R = 16      # row kinds, B rows per call
    z = torch.randn(R, V, generator=g) * 4
    z[3] *= 0.02                                   # flat
    z[5] = z[5] * 1e29                             # |z| ~ 1e30
    z[7] = float("-inf")
    z[7, torch.randperm(V, generator=g)[:3]] = torch.randn(3, generator=g)
    T = torch.tensor([0.8, 1.0, 0.0, 1.2, 1e-3, 0.9, 50.0, 0.7, 1e-39, 0.6, 1.1, 0.9,
                      0.8, 2.0, 0.5, 1.0])
    p = torch.tensor([0.9, 1.0, 0.9, 0.95, 0.5, 0.9, 0.99, 0.8, 0.9, 1.0, 0.7, 0.3,
                      0.6, 0.9, 1.0, 0.95])
    mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.05, 0.0,
                       0.0, 0.0, 0.1, 0.0])
    for r0 in range(0, R, B):
        rows = slice(r0, r0 + B)
        logits = z[rows].to(dtype).to(DEVICE)
        for kw in (dict(temperature=T[rows], top_p=p[rows]),
                   dict(temperature=T[rows], top_p=p[rows], min_p=mp[rows])):
            kw = {n: v.to(DEVICE) for n, v in kw.items()}
            a = _check(logits, kw, S.F_SCAND_TOPP)
            b = _check(logits, kw, S.F_NO_SPLIT)
            assert torch.equal(a.tokens, b.tokens)


def test_cuda_scand_topp_band_boundary():
    """Rows whose top-p limit falls exactly on a prefix of the candidates' masses (ten equal top
    logits, p = 0.5 / 0.3 / 0.7: P = 5, 3, 7 masses; ties broken by id), so that the band of the
    approximate mass contains a prefix and the finishing CTA must compute the exact mass; and
    rows just off the boundary. 64 seeds per row: == the reference, draw for draw."""
    skip_unless_backend("cuda")
    g = _gen(44)
    B, V = 4, 32768   # (32 CTAs per row: the top-p route needs >= 16)
    z = torch.randn(B, V, generator=g) - 40.0
    top = torch.randperm(V, generator=g)[:10]
    z[:, top] = 3.0
    z[3, top[0]] = 3.0 + 1e-6 * 8
    p = torch.tensor([0.5, 0.3, 0.7, 0.5])
    T = torch.tensor([1.0, 0.7, 1.3, 1.0])
    zz = z.to(DEVICE)
    kw = dict(temperature=T.to(DEVICE), top_p=p.to(DEVICE))
    for rep in range(64):
        seed = torch.arange(B, device=DEVICE) * 1000 + rep
        want = ref.sample(zz, seed, seed * 3, kw["temperature"], None, kw["top_p"], None, 1)
        with cuda_flags(S.F_SCAND_TOPP):
            got = ops.sample(zz, seed, seed * 3, backend="cuda", **kw)
        assert torch.equal(got.tokens, want[0]), rep


def _wide_rows():
    """A batch that the cluster launch spreads one CTA per row (B > SMs / 2)."""
    return torch.cuda.get_device_properties(DEVICE).multi_processor_count // 2 + 12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_wide_defer_rows(dtype):
    """Calls with a top-p tensor at one CTA per row (B > SMs / 2): rows that CTA cannot decide
    from its 512 candidates (flat rows with top-p 0.95: kept sets of thousands; k = 1000 > 512)
    go to the launch of clusters that follows (F_WIDE_DEFER, at most 8 rows; here more than 8
    are undecided, so the rest take the generic path in their own CTA), among ordinary top-p /
    top-k + top-p / min-p / greedy rows, with and without a top-k tensor, with logprobs: == the
    reference, and == the launch without the bit (no_wide) and the forced generic path."""
    skip_unless_backend("cuda")
    B, V = _wide_rows(), 151936
    g = _gen(77)
    z = torch.randn(B, V, generator=g) * 4
    z[3::6] *= 0.02                                       # flat: kept sets of thousands
    z = z.to(dtype).to(DEVICE)
    i = torch.arange(B)
    T = torch.tensor([0.8, 1.0, 0.7, 1.0, 1.3, 0.0])[i % 6]
    p = torch.tensor([0.9, 0.5, 1.0, 0.95, 0.99, 0.9])[i % 6]
    k = torch.tensor([0, 50, 0, 0, 1000, 0], dtype=torch.int32)[i % 6]
    mp = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.0, 0.0])[i % 6]
    for kw in (dict(temperature=T, top_p=p), dict(temperature=T, top_k=k, top_p=p, min_p=mp)):
        kw = {n: v.to(DEVICE) for n, v in kw.items()}
        a = _check(z, kw)
        for fl in ("no_wide", "generic"):
            assert torch.equal(_check(z, kw, FLAGS[fl]).tokens, a.tokens), fl


def _hist_rows(B, V, g, types):
    """Rows of the HIST path's cases (top-p without top-k on a cluster launch): type 0 bench-like
    (randn * 4, T = 0.8, p = 0.9: a boundary bin of a few tokens); 1 flat (randn * 0.05, p =
    0.95: the boundary bin holds thousands of tokens, past its capacity: the generic path);
    2 one token at 0 and the rest in [-19, -17] (T = 1, p = 0.9999: the cumulative mass reaches
    P below y = -16, at level 1); 3 the same in [-22, -20] with p = 0.99999 (a boundary bin below
    kDead: skipped, the kept mass taken as P for the logprob); 4 randn * 4 with top-p 0.95 and
    min-p 0.05; 5 type 3 with min-p 1e-12 (the dead boundary resolved: min-p and logprobs);
    6 greedy; 7 top-p = 1 (not HIST)."""
    z = torch.randn(B, V, generator=g) * 4
    T = torch.full((B,), 0.8)
    p = torch.full((B,), 0.9)
    mp = torch.zeros(B)
    for i, t in enumerate(types):
        if t == 1:
            z[i] *= 0.0125
            T[i], p[i] = 1.0, 0.95
        elif t in (2, 3, 5):
            lo = -17.0 if t == 2 else -20.0
            z[i] = lo - 2 * torch.rand(V, generator=g)
            z[i, int(torch.randint(0, V, (1,), generator=g))] = 0.0
            T[i], p[i] = 1.0, (0.9999 if t == 2 else 0.99999)
            mp[i] = 1e-12 if t == 5 else 0.0
        elif t == 4:
            T[i], p[i], mp[i] = 1.0, 0.95, 0.05
        elif t == 6:
            T[i] = 0.0
        elif t == 7:
            p[i] = 1.0
    return z, dict(temperature=T.to(DEVICE), top_p=p.to(DEVICE), min_p=mp.to(DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [32000, 151936])
def test_cuda_hist_topp_rows(dtype, V):
    """F_HIST_TOPP (the default): top-p rows without top-k on the cluster launch (B <= SMs / 2),
    every case of _hist_rows, each alone (B = 1: clusters of up to 16 CTAs) and mixed (B = 8 /
    24); with and without logprobs: == the reference, and == the launch without the bit (512
    candidates) and the forced generic path."""
    skip_unless_backend("cuda")
    g = _gen(91 + V)
    calls = [[t] for t in range(8)] + [list(range(8)), [i % 8 for i in range(24)]]
    for types in calls:
        z, kw = _hist_rows(len(types), V, g, types)
        z = z.to(dtype).to(DEVICE)
        for lp in (True, False):
            a = _check(z, kw, logprobs=lp)
            for fl in ("no_hist", "generic"):
                b = _check(z, kw, FLAGS[fl], logprobs=lp)
                assert torch.equal(b.tokens, a.tokens), (types, fl)


@pytest.mark.parametrize("route", ["top_k", "top_p_opt_in", "deferred", "wide"])
def test_cuda_scand_graph_replay_and_streams(route):
    """The split-candidates launch (an arrival-counter memset, then one kernel, a per-call
    workspace) under CUDA-graph capture and replay with new inputs, and on two streams at
    once: calls with a top-k tensor, and (opt-in F_SCAND_TOPP) top-p calls without one, with a
    greedy row and a top-p = 1 row; "deferred": 24 rows, the odd ones flat with top-k off and
    top-p on (kept sets of thousands: left undecided, sampled by the cluster launch that
    follows, F_SCAND_DEFER, a PDL launch); "wide": B > SMs / 2 top-p rows without a top-k
    tensor (one CTA per row), every fifth flat (left to the launch of clusters that follows,
    F_WIDE_DEFER: a memset, the kernel and the PDL launch; more than 8: the rest sampled by
    their CTA)."""
    skip_unless_backend("cuda")
    g = _gen(19)
    B, V = {"deferred": 24, "wide": _wide_rows()}.get(route, 4), 151936
    topk = route not in ("top_p_opt_in", "wide")

    def inputs():
        z = torch.randn(B, V, generator=g) * 4
        if route == "deferred":
            z[1::2] *= 0.05
        if route == "wide":
            z[2::5] *= 0.05
        z = z.to(DEVICE)
        T = (torch.rand(B, generator=g) + 0.3).to(DEVICE)
        T[0 if route in ("deferred", "wide") else 1] = 0.0
        k = torch.randint(1, 300, (B,), generator=g).to(torch.int32).to(DEVICE)
        p = (torch.rand(B, generator=g) * 0.5 + 0.5).to(DEVICE)
        if route == "deferred":
            k[1::2] = 0
        if not topk:
            p[2] = 1.0
        seed, offset = _seeds(B, int(torch.randint(0, 1 << 30, (1,), generator=g)))
        return z, T, k, p, seed, offset

    def call(z, T, k, p, seed, offset, **kw):
        return ops.sample_with_logprobs(z, seed, offset, temperature=T, top_k=k if topk else None,
                                        top_p=p, backend="cuda", **kw)

    with cuda_flags(S.F_SCAND_TOPP if route == "top_p_opt_in" else 0):
        _graph_replay_and_two_streams(
            inputs, call, lambda *x: call(*x, validate=False),
            lambda z, T, k, p, seed, offset: ref.sample(z, seed, offset, T, k if topk else None,
                                                        p, None, 1))
