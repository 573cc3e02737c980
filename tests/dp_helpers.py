"""Workers of tests/test_dp.py (one process per rank; gloo on CPU, NCCL on GPU) and the
one-GPU virtual-rank harness of DP sampling.

Command line (device runs):

    python tests/dp_helpers.py sanitize-mp [N]   # a few dp_sample / dp_verify calls on N real
                                                 # ranks (default 2; compute-sanitizer memcheck /
                                                 # racecheck)
    python tests/dp_helpers.py sanitize          # virtual ranks (NOT under compute-sanitizer:
                                                 # it serializes kernels, the ranks time out)
    python tests/dp_helpers.py triton-aot        # CPU: compile the Triton DP kernels for sm_90
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

try:
    import tokenspeed_kernel  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch
import torch.multiprocessing as mp

from tokenspeed_kernel import ops

SEED = 4321
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------------
# process plumbing: comm_helpers' (the worker functions live in this module)
# ---------------------------------------------------------------------------------------------
def run_workers(fn_name: str, world: int, backend: str, args: tuple = (),
                timeout_s: float = 600.0) -> None:
    """``fn_name(rank, world, *args)`` of this module in ``world`` spawned processes
    (comm_helpers.run_workers: its process plumbing, failure and hang handling)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import comm_helpers
    comm_helpers.run_workers(f"dp_helpers:{fn_name}", world, backend, args, timeout_s)


# ---------------------------------------------------------------------------------------------
# data: full logits (identical on every rank), the rank's shard with garbage past V
# ---------------------------------------------------------------------------------------------
def full_logits(B: int, V: int, dtype: torch.dtype, device, nan_row: bool = True,
                seed: int = SEED) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(B, V, generator=g) * 3.0
    if nan_row and B > 2:
        x[B // 2, V // 3] = float("nan")
    return x.to(dtype).to(device)


def shard_of(full: torch.Tensor, world: int, rank: int, w: int) -> torch.Tensor:
    """Rank's [B, w] shard of the vocab; columns past V hold +1e4 (they must be ignored)."""
    B, V = full.shape
    out = torch.full((B, w), 1e4, dtype=full.dtype, device=full.device)
    lo, hi = rank * w, min(V, (rank + 1) * w)
    if hi > lo:
        out[:, : hi - lo] = full[:, lo:hi]
    return out


def sample_params(B: int, device, mode: str):
    g = torch.Generator(device="cpu").manual_seed(SEED + 1)
    seed = torch.randint(0, 2**40, (B,), generator=g).to(device)
    offset = torch.randint(0, 2**20, (B,), generator=g).to(device)
    kw = {}
    if mode in ("temp", "topk", "topp", "topk_topp", "minp"):
        kw["temperature"] = (torch.rand(B, generator=g) * 1.2 + 0.2).to(device)
        kw["temperature"][0] = 0.0  # one greedy row
    if mode in ("topk", "topk_topp"):
        kw["top_k"] = torch.randint(1, 80, (B,), generator=g).to(torch.int32).to(device)
    if mode in ("topp", "topk_topp"):
        kw["top_p"] = (torch.rand(B, generator=g) * 0.8 + 0.2).to(device)
    if mode == "minp":
        kw["min_p"] = (torch.rand(B, generator=g) * 0.3).to(device)
    return seed, offset, kw


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Logprobs: float sums whose order depends on the sampler's launch shape (docs/DESIGN.md:
    not bit-identical), so equal to float rounding; NaN where the reference has NaN."""
    if a.shape != b.shape:
        return False
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        it = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(it), b.contiguous().view(it))
    return torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# workers
# ---------------------------------------------------------------------------------------------
def dp_fallback_worker(rank: int, world: int, device_kind: str = "cpu",
                       backends=("nccl", "reference", "auto")) -> None:
    """dp_sample / dp_verify through every backend in ``backends`` (on CPU: the NCCL-style
    fallback over gloo, and the reference): bit-identical to ops.sample / ops.verify on the full
    logits, uneven B and V. ``"triton"`` runs the whole path in Triton (the swap, the gather and
    the per-rank sampling / verify), as on a machine without the extension."""
    dev = torch.device("cpu") if device_kind == "cpu" else torch.device("cuda", rank)
    sb = "reference" if dev.type == "cpu" else "auto"
    inner = {"triton": "triton"}   # the per-rank sample / verify backend, by comm backend
    # The Triton path JIT-compiles the per-rank sampler / verify of each mode between the swap
    # and the gather, and a rank can finish its compile tens of seconds after its peer (a rank
    # with no rows compiles nothing): a long bound, so that a compile is not a timeout.
    tmo = 900_000 if "triton" in backends else ops.dp.DEFAULT_TIMEOUT_MS
    for V, w in ((1000, None), (997, None), (1000, 512 if world == 2 else None)):
        w = w or -(-V // world)
        comm = ops.create_dp_sampling_comm(max_rows=40, vocab_size=V, dtype=torch.float32,
                                           shard_width=w, device=dev, slots=2, timeout_ms=tmo)
        assert not comm.p2p or dev.type == "cuda"
        for B in (1, world + 1, 13):
            full = full_logits(B, V, torch.float32, dev)
            x = shard_of(full, world, rank, w)
            for mode in ("temp", "topk_topp", "minp"):
                seed, offset, kw = sample_params(B, dev, mode)
                ref = ops.sample_with_logprobs(full, seed, offset, backend=sb, **kw)
                for be in backends:
                    out = ops.dp_sample(comm, x, seed, offset, logprobs=True, backend=be,
                                        sample_backend=inner.get(be, sb), **kw)
                    comm.check()   # a comm failure is reported as such, not as wrong tokens
                    assert torch.equal(out.tokens, ref.tokens), (be, V, B, mode)
                    assert torch.equal(out.valid, ref.valid), (be, V, B, mode)
                    assert close(out.logprobs, ref.logprobs), (be, V, B, mode)
                    assert close(out.processed_logprobs, ref.processed_logprobs)
            # the swap itself: rank's rows of the full logits, columns [0, V)
            view = ops.swap_vocab_to_batch(comm, x, backend="nccl")
            s, n = comm.row_range(B)
            assert same(view, full[s:s + n]), (V, B)
        # verify, padded chain form
        bs, nd = 5, 3
        tgt = full_logits(bs * (nd + 1), V, torch.float32, dev, nan_row=False, seed=7)
        drf = full_logits(bs * nd, V, torch.float32, dev, nan_row=False, seed=8)
        g = torch.Generator(device="cpu").manual_seed(9)
        ids = torch.randint(0, V, (bs, nd), generator=g).to(dev)
        ids[1, 2:] = -1
        seed = torch.arange(bs, device=dev) + 11
        offset = torch.zeros(bs, dtype=torch.int64, device=dev)
        temp = torch.full((bs,), 0.9, device=dev)
        for mode in ("strict", "probabilistic"):
            dl = drf if mode == "probabilistic" else None
            ref = ops.verify_with_logprobs(tgt, ids, seed, offset,
                                           draft_logits=None if dl is None else dl.view(bs, nd, V),
                                           mode=mode, temperature=temp, backend=sb)
            for be in [b for b in backends if b != "reference"] or ["nccl"]:
                out = ops.dp_verify(comm, shard_of(tgt, world, rank, w), ids, seed, offset,
                                    draft_shard=None if dl is None else shard_of(dl, world, rank,
                                                                                 w),
                                    mode=mode, temperature=temp, logprobs=True, backend=be,
                                    verify_backend=inner.get(be, sb))
                comm.check()
                assert torch.equal(out.tokens, ref.tokens), (be, mode)
                assert torch.equal(out.num_accepted, ref.num_accepted), (be, mode)
                assert torch.equal(out.valid, ref.valid), (be, mode)
                assert close(out.logprobs, ref.logprobs), (be, mode)


def dp_mismatch_worker(rank: int, world: int, what: str) -> None:
    """Ranks that disagree on a creation parameter: every rank raises the same ValueError."""
    kw = dict(max_rows=16, vocab_size=1000, dtype=torch.float32, device="cpu")
    if what == "dtype" and rank == 1:
        kw["dtype"] = torch.bfloat16
    if what == "max_rows" and rank == 1:
        kw["max_rows"] = 8
    if what == "vocab_size" and rank == 0:
        kw["vocab_size"] = 1002
    try:
        ops.create_dp_sampling_comm(**kw)
    except ValueError as e:
        assert str(e).startswith(what) and "every rank" in str(e), str(e)
    else:
        raise AssertionError(f"rank {rank}: no error for mismatched {what}")


def dp_graph_worker(rank: int, world: int, replays: int, backend: str = "cuda") -> None:
    """Real ranks (NCCL group, one GPU each): dp_sample captured in a CUDA graph with the inputs
    changing on every replay (the shard flips sign, the offset advances); checked against
    ops.sample every few hundred replays. ``backend="triton"``: the Triton swap, gather and
    sampler."""
    dev = torch.device("cuda", rank)
    B, V = 16, 151936
    comm = ops.create_dp_sampling_comm(max_rows=B, vocab_size=V, dtype=torch.bfloat16)
    assert comm.p2p and comm.extension, comm
    full = full_logits(B, V, torch.bfloat16, dev)
    x = shard_of(full, world, rank, comm.shard_width)
    seed, offset, kw = sample_params(B, dev, "topk_topp")
    off0 = offset.clone()
    inner = "triton" if backend == "triton" else "auto"
    run_graph_replays(lambda: ops.dp_sample(comm, x, seed, offset, validate=False,
                                            backend=backend, sample_backend=inner, **kw),
                      x, offset, full, seed, off0, kw, replays, [comm])


def run_graph_replays(call, x, offset, full, seed, off0, kw, replays, comms, streams=None,
                      calls=None):
    """Capture ``x.neg_(); offset.add_(1); call()`` (per rank in ``calls`` when virtual), replay
    ``replays`` times, compare with ops.sample at checkpoints."""
    calls = calls or [(call, x, offset)]
    streams = streams or [torch.cuda.Stream()]  # (capture needs a non-default stream)
    graphs, outs = [], []
    for (fn, xr, offr), st in zip(calls, streams):  # warm-up (eager), then capture
        with torch.cuda.stream(st):
            fn()
    torch.cuda.synchronize()
    for (fn, xr, offr), st in zip(calls, streams):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=st):
            xr.neg_()
            offr.add_(1)
            outs.append(fn())
        graphs.append(g)
    torch.cuda.synchronize()
    # capture ran nothing: the inputs are still x0, offset0 (+0 replays)
    checks = sorted(set([1, 2, 3, replays // 3, replays - 1, replays]))
    done = 0
    for k in range(1, replays + 1):
        for g, st in zip(graphs, streams):
            with torch.cuda.stream(st):
                g.replay()
        if k in checks:
            torch.cuda.synchronize()
            ref = ops.sample(full * (-1) ** k, seed, off0 + k, **kw)
            for o in outs:
                assert torch.equal(o.tokens, ref.tokens), (k,)
                assert torch.equal(o.valid, ref.valid), (k,)
            done += 1
    torch.cuda.synchronize()
    for c in comms:
        c.check()
    assert done == len(checks)


def dp_dead_peer_worker(rank: int, world: int, backend: str = "auto") -> None:
    """Rank 1 never joins the call: rank 0's swap gives up after the timeout, comm.check() raises
    CommError, no hang."""
    dev = torch.device("cuda", rank)
    comm = ops.create_dp_sampling_comm(max_rows=8, vocab_size=4096, dtype=torch.float32,
                                       timeout_ms=300)
    if rank == 0:
        x = torch.randn(8, comm.shard_width, device=dev)
        out = ops.dp_sample(comm, x, 1, 0, temperature=1.0, backend=backend,
                            sample_backend="triton" if backend == "triton" else "auto")
        torch.cuda.synchronize()
        assert not out.valid.any(), "rows of a failed call must read as invalid"
        try:
            comm.check()
        except ops.CommError as e:
            assert "gave up" in str(e)
        else:
            raise AssertionError("no CommError")


def dp_late_peer_worker(rank: int, world: int, backend: str = "cuda") -> None:
    """Rank 1 joins a call after rank 0's bounded wait has given up (as a peer still
    JIT-compiling would): both ranks raise CommError, every row of that call and of a later call
    on the poisoned communicator reads as invalid (token 0, valid false), never uninitialized
    memory; a new communicator works."""
    dev = torch.device("cuda", rank)
    V = 4096
    sb = "triton" if backend == "triton" else "auto"
    full = full_logits(12, V, torch.float32, dev, nan_row=False)
    ops.sample(full, 1, 0, temperature=0.8, backend=sb)       # compile / load first
    torch.cuda.synchronize()
    comm = ops.create_dp_sampling_comm(max_rows=16, vocab_size=V, dtype=torch.float32,
                                       timeout_ms=1500)
    x = shard_of(full, world, rank, comm.shard_width)
    for call in range(2):      # the late call, then a call on the poisoned communicator
        if rank == 1 and call == 0:
            time.sleep(4.0)
        # outputs come from the caching allocator: fill the pool with non-zero bytes first
        junk = torch.full((1 << 16,), -1, dtype=torch.int64, device=dev)
        del junk
        out = ops.dp_sample(comm, x, 1, 0, temperature=0.8, backend=backend,
                            sample_backend=sb, logprobs=True)
        torch.cuda.synchronize()
        err = comm.error()
        assert err is not None and "gave up" in err, f"rank {rank} call {call}: {err}"
        assert not out.valid.any() and not out.tokens.any(), \
            f"rank {rank} call {call}: {out.tokens.tolist()} {out.valid.tolist()}"
        assert not out.logprobs.any(), f"rank {rank} call {call}: logprobs"
    torch.distributed.barrier()
    comm.close()
    comm = ops.create_dp_sampling_comm(max_rows=16, vocab_size=V, dtype=torch.float32)
    out = ops.dp_sample(comm, x, 1, 0, temperature=0.8, backend=backend, sample_backend=sb)
    ref = ops.sample(full, 1, 0, temperature=0.8, backend=sb)
    torch.cuda.synchronize()
    comm.check()
    assert torch.equal(out.tokens, ref.tokens) and bool(out.valid.all())


def _gather_into(comm, fields, outs, items: int, per_rank: int, backend: str) -> None:
    """The results gather of ``backend`` ("cuda" / "triton") into the caller's ``outs``."""
    D = ops.dp
    if backend == "triton":
        D._gather_triton(comm, fields, outs, items, per_rank)
        return
    offs = D._res_layout(comm, outs, per_rank)
    torch.ops.tokenspeed_kernel.dp_gather(
        [f.contiguous() for f in fields], outs, comm.state, comm.symm, comm.peer_res,
        comm.peer_flags, offs, comm.rank, comm.res_bytes, items, per_rank, 0,
        comm.timeout_ms * 1_000_000)


# (name, what the rank calls): "swap" cases pass (B, slot); "sample" cases dp_sample kwargs and
# B; "gather" cases the fields' dtypes (the low-level gather into pre-filled outputs)
DP_MISMATCH_CASES = [
    ("swap B", "swap", lambda r: dict(B=5 + r, slot=0)),
    ("swap slot", "swap", lambda r: dict(B=6, slot=r % 2)),
    ("dp_sample B", "sample", lambda r: dict(B=6 + r, kw={})),
    ("dp_sample logprobs on one rank", "sample", lambda r: dict(B=6, kw=dict(logprobs=r == 0))),
    ("dp_sample out_dtype", "sample",
     lambda r: dict(B=6, kw=dict(out_dtype=torch.int64 if r == 0 else torch.int32))),
    ("gather fields", "gather",
     lambda r: dict(B=6, dts=[torch.int64, torch.bool] + ([torch.float32] if r == 0 else []))),
    ("gather items", "gather", lambda r: dict(B=6 + r, dts=[torch.int64, torch.bool])),
]


def dp_call_mismatch_worker(rank: int, world: int, backend: str = "cuda") -> None:
    """Ranks that call the swap / dp_sample / the results gather with different arguments
    (DP_MISMATCH_CASES), after a matching warm-up: CommError naming the mismatch on every rank
    within the bounded wait, no abort; the swap pushes nothing (every swap buffer keeps the
    sentinel this rank wrote, its own rows included), the gather copies out no peer section; the
    poisoned communicator returns at once; a new communicator samples correctly."""
    dev = torch.device("cuda", rank)
    V, dtype = 4096, torch.float32
    sb = "triton" if backend == "triton" else "auto"
    ckw = dict(max_rows=16, vocab_size=V, dtype=dtype, timeout_ms=2000, slots=2)
    D = ops.dp

    def sample(comm, B, seed, **kw):
        full = full_logits(B, V, dtype, dev, nan_row=False, seed=seed)
        x = shard_of(full, world, rank, comm.shard_width)
        return full, ops.dp_sample(comm, x, 1, 0, temperature=0.8, backend=backend,
                                   sample_backend=sb, **kw)

    # compile / load every kernel first with the default (long) timeout (a Triton JIT compile
    # that ends seconds apart on the two ranks must not time out the short-timeout calls below)
    warm = ops.create_dp_sampling_comm(**{**ckw, "timeout_ms": D.DEFAULT_TIMEOUT_MS})
    for kw in ({}, dict(logprobs=True), dict(out_dtype=torch.int32)):
        sample(warm, 4, 1, **kw)
    s0, n = warm.row_range(6)
    _gather_into(warm, [torch.arange(s0, s0 + n, device=dev).to(dt) for dt in
                        (torch.int64, torch.bool, torch.float32)],
                 [torch.empty(6, dtype=dt, device=dev) for dt in
                  (torch.int64, torch.bool, torch.float32)], 6, warm.rows_per_rank(6), backend)
    torch.cuda.synchronize()
    warm.check()
    torch.distributed.barrier()
    warm.close()
    for name, kind, args in DP_MISMATCH_CASES:
        a = args(rank)
        comm = ops.create_dp_sampling_comm(**ckw)
        assert comm.p2p
        sample(comm, 4, 1)                       # matching warm-up (compiles / loads kernels)
        torch.cuda.synchronize()
        comm.check()
        comm.symm[D.FLAG_BYTES:comm.res_base].fill_(0x5A)
        torch.cuda.synchronize()
        torch.distributed.barrier()
        t0 = time.monotonic()
        gouts = None
        if kind == "swap":
            full = full_logits(a["B"], V, dtype, dev, nan_row=False, seed=2)
            ops.swap_vocab_to_batch(comm, shard_of(full, world, rank, comm.shard_width),
                                    slot=a["slot"], backend=backend)
        elif kind == "sample":
            sample(comm, a["B"], 2, **a["kw"])
        else:
            B, per = a["B"], comm.rows_per_rank(a["B"])
            s0, n = comm.row_range(B)
            fields = [torch.arange(s0, s0 + n, device=dev).to(dt) for dt in a["dts"]]
            gouts = [torch.full((B,), 7, dtype=dt, device=dev) for dt in a["dts"]]
            _gather_into(comm, fields, gouts, B, per, backend)
        torch.cuda.synchronize()
        dt = time.monotonic() - t0
        err = comm.error()
        assert err is not None and "different arguments" in err, f"{name}: rank {rank}: {err}"
        try:
            comm.check()
            raise AssertionError(f"{name}: check() did not raise")
        except ops.CommError:
            pass
        assert dt < 10.0, f"{name}: rank {rank} took {dt:.1f} s"
        if kind == "swap":
            assert bool((comm.symm[D.FLAG_BYTES:comm.res_base] == 0x5A).all()), \
                f"{name}: rank {rank}: the swap pushed after a mismatch"
        if gouts is not None:   # the peers' sections zeroed, never copied out
            s0, n = comm.row_range(a["B"])
            for o in gouts:
                rest = torch.cat([o[:s0], o[s0 + n:]])
                assert torch.equal(rest, torch.zeros_like(rest)), \
                    f"{name}: rank {rank}: peer sections not zeroed"
        print(f"[dp mismatch/{backend}/{name}] rank {rank}: CommError after {dt * 1e3:.1f} ms: "
              f"{err}", flush=True)
        t1 = time.monotonic()
        _, pout = sample(comm, 4, 3)             # poisoned: returns at once, every row invalid
        torch.cuda.synchronize()
        assert time.monotonic() - t1 < 1.0, f"{name}: a poisoned call waited"
        assert not pout.valid.any() and not pout.tokens.any(), f"{name}: poisoned output"
        torch.distributed.barrier()
        comm.close()
        comm = ops.create_dp_sampling_comm(**ckw)   # a new communicator works
        full, out = sample(comm, 5, 4)
        ref = ops.sample(full, 1, 0, temperature=0.8)
        torch.cuda.synchronize()
        comm.check()
        assert torch.equal(out.tokens, ref.tokens), f"{name}: a new communicator"
        torch.distributed.barrier()
        comm.close()


# ---------------------------------------------------------------------------------------------
# one GPU: virtual ranks
# ---------------------------------------------------------------------------------------------
def virtual_dp_sample(world: int, B: int, V: int, dtype: torch.dtype, mode: str,
                      logprobs: bool = True, shard_width=None, timeout_ms: int = 10_000,
                      block_bytes: int = None):
    """Every virtual rank's dp_sample (each on its own stream) and the full-logits reference.
    Returns (outputs per rank, ops.sample output, comms)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    kw_c = {} if block_bytes is None else {"block_bytes": block_bytes}
    comms = ops.dp.create_virtual_dp_comms(world, max_rows=max(B, 1), vocab_size=V, dtype=dtype,
                                           shard_width=shard_width, device=dev,
                                           timeout_ms=timeout_ms, **kw_c)
    w = comms[0].shard_width
    full = full_logits(B, V, dtype, dev)
    shards = [shard_of(full, world, r, w) for r in range(world)]
    seed, offset, kw = sample_params(B, dev, mode)
    fn = ops.sample_with_logprobs if logprobs else ops.sample
    ref = fn(full, seed, offset, **kw)
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(world)]
    outs = []
    for r in range(world):
        with torch.cuda.stream(streams[r]):
            outs.append(ops.dp_sample(comms[r], shards[r], seed, offset, logprobs=logprobs,
                                      backend="cuda", validate=False, **kw))
    torch.cuda.synchronize()
    return outs, ref, comms


def virtual_graph_replays(world: int, replays: int) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    B, V = 16, 151936
    comms = ops.dp.create_virtual_dp_comms(world, max_rows=B, vocab_size=V, dtype=torch.bfloat16,
                                           device=dev)
    full = full_logits(B, V, torch.bfloat16, dev)
    xs = [shard_of(full, world, r, comms[0].shard_width) for r in range(world)]
    seed, offset, kw = sample_params(B, dev, "topk_topp")
    off0 = offset.clone()
    offs = [offset.clone() for _ in range(world)]
    calls = [(lambda r=r: ops.dp_sample(comms[r], xs[r], seed, offs[r], validate=False, **kw),
              xs[r], offs[r]) for r in range(world)]
    streams = [torch.cuda.Stream() for _ in range(world)]
    run_graph_replays(None, None, None, full, seed, off0, kw, replays, comms, streams, calls)


# ---------------------------------------------------------------------------------------------
# virtual-rank checks: each runs in a fresh process (run_virtual) with CUDA_MODULE_LOADING=EAGER.
# One host thread drives every virtual rank, so a kernel that spins for a peer must never wait
# on the host: with lazy module loading, the first launch of a kernel can block while another
# rank's kernel spins (a deadlock until the bounded wait gives up). Real ranks are separate
# processes and do not have this problem.
# ---------------------------------------------------------------------------------------------
def _virtual_entry(fn_name: str, args: tuple, q) -> None:
    try:
        globals()[fn_name](*args)
        q.put(None)
    except BaseException:
        q.put(traceback.format_exc())


def run_virtual(fn_name: str, *args, timeout_s: float = 300.0) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    old = os.environ.get("CUDA_MODULE_LOADING")
    os.environ["CUDA_MODULE_LOADING"] = "EAGER"
    try:
        p = ctx.Process(target=_virtual_entry, args=(fn_name, tuple(args), q))
        p.start()
    finally:
        if old is None:
            del os.environ["CUDA_MODULE_LOADING"]
        else:
            os.environ["CUDA_MODULE_LOADING"] = old
    p.join(timeout_s)
    if p.is_alive():
        p.kill()
        raise TimeoutError(f"{fn_name}{args}: did not finish within {timeout_s:.0f} s")
    err = q.get() if not q.empty() else f"exit code {p.exitcode} (no report)"
    if err is not None:
        raise AssertionError(f"{fn_name}{args} failed:\n{err}")


def virtual_cases(kind: str, cases) -> None:
    fn = {"swap": virtual_swap_check, "sample": virtual_sample_check,
          "verify": virtual_verify_check}[kind]
    for c in cases:
        fn(*c)


def _streams(world):
    return [torch.cuda.Stream() for _ in range(world)]


def virtual_swap_check(world: int, dtname: str) -> None:
    dtype = DTYPES[dtname]
    dev = torch.device("cuda", torch.cuda.current_device())
    for V in (151936, 4099, 1000):
        for B in (1, 5, 64):
            comms = ops.dp.create_virtual_dp_comms(world, max_rows=64, vocab_size=V, dtype=dtype,
                                                   device=dev, timeout_ms=10_000)
            w = comms[0].shard_width
            full = full_logits(B, V, dtype, dev)
            xs = [shard_of(full, world, r, w) for r in range(world)]
            streams = _streams(world)
            views = []
            torch.cuda.synchronize()
            for r in range(world):
                with torch.cuda.stream(streams[r]):
                    views.append(ops.swap_vocab_to_batch(comms[r], xs[r], backend="cuda"))
            torch.cuda.synchronize()
            for r in range(world):
                comms[r].check()
                s, n = comms[r].row_range(B)
                assert same(views[r], full[s:s + n]), (world, dtname, V, B, r)


def virtual_sample_check(mode: str, world: int, B: int, dtname: str, V: int = 151936) -> None:
    outs, ref, comms = virtual_dp_sample(world, B, V, DTYPES[dtname], mode)
    for r, o in enumerate(outs):
        comms[r].check()
        assert torch.equal(o.tokens, ref.tokens), (mode, world, B, dtname, V, r)
        assert torch.equal(o.valid, ref.valid), r
        assert close(o.logprobs, ref.logprobs), r
        assert close(o.processed_logprobs, ref.processed_logprobs), r


def virtual_verify_check(mode: str) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    world, bs, nd, V = 3, 7, 3, 32000
    comms = ops.dp.create_virtual_dp_comms(world, max_rows=world * 3 * (nd + 1), vocab_size=V,
                                           dtype=torch.bfloat16, device=dev, slots=2)
    w = comms[0].shard_width
    tgt = full_logits(bs * (nd + 1), V, torch.bfloat16, dev, nan_row=False, seed=5)
    drf = full_logits(bs * nd, V, torch.bfloat16, dev, nan_row=False, seed=6)
    g = torch.Generator(device="cpu").manual_seed(3)
    ids = torch.randint(0, V, (bs, nd), generator=g).to(dev)
    ids[:, 0] = tgt.view(bs, nd + 1, V)[:, 0].float().argmax(-1)  # some accepted drafts
    seed = torch.arange(bs, device=dev) + 3
    offset = torch.zeros(bs, dtype=torch.int64, device=dev)
    temp = torch.full((bs,), 0.8, device=dev)
    dl = drf if mode == "probabilistic" else None
    ref = ops.verify_with_logprobs(tgt, ids, seed, offset, mode=mode, temperature=temp,
                                   draft_logits=None if dl is None else dl.view(bs, nd, V))
    streams = _streams(world)
    outs = []
    torch.cuda.synchronize()
    for r in range(world):
        with torch.cuda.stream(streams[r]):
            outs.append(ops.dp_verify(comms[r], shard_of(tgt, world, r, w), ids, seed, offset,
                                      draft_shard=None if dl is None else shard_of(dl, world, r, w),
                                      mode=mode, temperature=temp, logprobs=True, backend="cuda",
                                      validate=False))
    torch.cuda.synchronize()
    for o in outs:
        assert torch.equal(o.tokens, ref.tokens)
        assert torch.equal(o.num_accepted, ref.num_accepted)
        assert torch.equal(o.valid, ref.valid)
        assert close(o.logprobs, ref.logprobs)


def virtual_dead_peer_check() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    comms = ops.dp.create_virtual_dp_comms(2, max_rows=8, vocab_size=4096, dtype=torch.float32,
                                           device=dev, timeout_ms=200)
    x = torch.randn(8, comms[0].shard_width, device=dev)
    out = ops.dp_sample(comms[0], x, 1, 0, temperature=1.0, backend="cuda", validate=False)
    torch.cuda.synchronize()
    assert not out.valid.any(), "rows of a failed call must read as invalid"
    try:
        comms[0].check()
    except ops.CommError as e:
        assert "gave up" in str(e)
    else:
        raise AssertionError("no CommError")
    # poisoned: the next call returns at once instead of waiting again
    t = time.monotonic()
    ops.dp_sample(comms[0], x, 1, 0, temperature=1.0, backend="cuda", validate=False)
    torch.cuda.synchronize()
    assert time.monotonic() - t < 0.15



def sanitize_main() -> None:
    for world, B, V, dt in ((2, 5, 4099, torch.float32), (3, 7, 1000, torch.bfloat16),
                            (4, 16, 151936, torch.float16)):
        outs, ref, comms = virtual_dp_sample(world, B, V, dt, "topk_topp")
        for r, o in enumerate(outs):
            assert torch.equal(o.tokens, ref.tokens), (world, B, V, dt, r)
        for c in comms:
            c.check()
    print("dp sanitize workload: OK")


def dp_sanitize_worker(rank: int, world: int) -> None:
    """A few small real-rank calls of every DP kernel (for compute-sanitizer)."""
    dev = torch.device("cuda", rank)
    V = 4099
    comm = ops.create_dp_sampling_comm(max_rows=32, vocab_size=V, dtype=torch.bfloat16, slots=2)
    w = comm.shard_width
    for B in (1, 5, 24):
        full = full_logits(B, V, torch.bfloat16, dev)
        seed, offset, kw = sample_params(B, dev, "topk_topp")
        ref = ops.sample_with_logprobs(full, seed, offset, **kw)
        out = ops.dp_sample(comm, shard_of(full, world, rank, w), seed, offset, logprobs=True,
                            backend="cuda", **kw)
        assert torch.equal(out.tokens, ref.tokens), B
    bs, nd = 5, 3
    tgt = full_logits(bs * (nd + 1), V, torch.bfloat16, dev, nan_row=False, seed=5)
    drf = full_logits(bs * nd, V, torch.bfloat16, dev, nan_row=False, seed=6)
    ids = torch.randint(0, V, (bs, nd), generator=torch.Generator().manual_seed(1)).to(dev)
    seed, offset = torch.arange(bs, device=dev), torch.zeros(bs, dtype=torch.int64, device=dev)
    ref = ops.verify(tgt, ids, seed, offset, draft_logits=drf.view(bs, nd, V), temperature=0.7)
    out = ops.dp_verify(comm, shard_of(tgt, world, rank, w), ids, seed, offset,
                        draft_shard=shard_of(drf, world, rank, w), temperature=0.7, backend="cuda")
    assert torch.equal(out.tokens, ref.tokens)
    torch.cuda.synchronize()
    comm.check()


# ---------------------------------------------------------------------------------------------
# CPU: ahead-of-time compile of the Triton DP kernels for sm_90 (no GPU needed)
# ---------------------------------------------------------------------------------------------
def triton_aot_check() -> int:
    """Compiles both Triton kernels of triton/dp.py for sm_90 and greps their PTX. Returns
    triton_aot.NO_API (skip) when this triton's ahead-of-time API differs, 0 on success; raises on
    a failed check. Run with TRITON_INTERPRET unset."""
    import re

    import triton_aot

    from tokenspeed_kernel.triton import dp as tri
    flags = {"flag publish (atom.release.sys)": r"atom\.global\.sys\.release\.exch\.b64",
             "flag wait (ld.acquire.sys)": r"ld\.global\.sys\.acquire\.b64",
             "bounded wait (%globaltimer)": r"%globaltimer",
             "error record (atom.cas)": r"atom\.global[.a-z_]*\.cas",
             "header publish (atom.relaxed.sys exch)": r"atom\.global\.sys(\.relaxed)?\.exch\.b64"}
    common = {"PHASE": 7, "USE_TIMER": True, "MAX_SPINS": 1, "BLOCK": tri.BLOCK}
    swap_sig = {"x_ptr": "*i16", "ldx": "i32", "peer_recv_ptr": "*i64", "peer_flags_ptr": "*i64",
                "state_ptr": "*i64", "pitch": "i32", "shard": "i32", "rows": "i32",
                "rows_per_rank": "i32", "rank": "i32", "timeout_ns": "i64", "sig": "i32",
                "slot": "i32"}
    gather_sig = {"src_tab": "*i64", "out_tab": "*i64", "off_tab": "*i64", "ib_tab": "*i64",
                  "peer_res_ptr": "*i64", "peer_flags_ptr": "*i64", "state_ptr": "*i64",
                  "res_bytes": "i64", "items": "i32", "items_per_rank": "i32", "rank": "i32",
                  "timeout_ns": "i64", "sig": "i32"}
    cases = [("swap", tri._dp_swap_kernel, swap_sig,
              dict(common, W=2, ALIGNED=True, MAXR=tri.MAX_RANKS),
              {(i,): [["tt.divisibility", 16]] for i in range(7)},
              dict(flags, **{"16-byte push (st.global.v4)": r"st\.global\.v4",
                             "done counter (atom.acq_rel.gpu add)":
                                 r"atom\.global\.gpu\.acq_rel\.add"})),
             ("gather", tri._dp_gather_kernel, gather_sig, dict(common, W=4, NF=3), {},
              dict(flags, **{"L1-bypassing copy-out (ld.global.cg)": r"ld\.global\.cg"}))]

    def check():
        for name, fn, sig, const, attrs, checks in cases:
            ptx = triton_aot.compile_ptx(fn, sig, const, attrs, num_warps=tri.NUM_WARPS)
            for what, pat in checks.items():
                n = len(re.findall(pat, ptx))
                assert n > 0, f"{name}: no {what} in the PTX"
                print(f"  {name}: {what}: {n}")
            from comm_helpers import assert_uniform_polls
            assert_uniform_polls(ptx, name)
            print(f"triton-aot ok: {name}", flush=True)
    return triton_aot.run(check)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "triton-aot":
        sys.exit(triton_aot_check())
    if len(sys.argv) > 1 and sys.argv[1] == "sanitize":
        sanitize_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "sanitize-mp":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
        run_workers("dp_sanitize_worker", world, "nccl", timeout_s=600)
        print(f"dp sanitize-mp workload ({world} ranks): OK")
    else:
        print(__doc__)
