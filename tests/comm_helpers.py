"""Multi-process helpers of tests/test_comm.py (one process per rank; gloo on CPU, NCCL on GPU).

Also a small command line used by tools/gpu_comm.sh:

    python tests/comm_helpers.py sanitize [--world 2]   # a few small calls of every P2P kernel
    python tests/comm_helpers.py triton-sim            # CPU: Triton kernel, simulated ranks
"""
from __future__ import annotations

import faulthandler
import os
import socket
import sys
import time
import traceback
from pathlib import Path

try:
    import tokenspeed_kernel  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SEED = 1234


# ---------------------------------------------------------------------------------------------
# process plumbing
# ---------------------------------------------------------------------------------------------
def _progress(rank: int, what: str) -> None:
    """One line of a long multi-GPU worker's progress (rank 0; shown by pytest on failure)."""
    if rank == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {what}", flush=True)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _entry(rank: int, world: int, port: int, backend: str, fn_name: str, args: tuple) -> None:
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dump_s = float(os.environ.get(_DUMP_ENV, "0"))
    if dump_s > 0:  # a worker still running shortly before run_workers kills it: print its stack
        faulthandler.dump_traceback_later(dump_s, exit=False, file=sys.stderr)
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, **kw)
    try:
        if ":" in fn_name:  # "module:function" (a helper module of tests/, e.g. dp_helpers)
            import importlib
            mod, fn = fn_name.split(":")
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            getattr(importlib.import_module(mod), fn)(rank, world, *args)
        else:
            globals()[fn_name](rank, world, *args)
        if backend == "nccl":
            torch.cuda.synchronize()
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


_DUMP_ENV = "TS_TEST_WORKER_STACK_DUMP_S"


def run_workers(fn_name: str, world: int, backend: str, args: tuple = (),
                timeout_s: float = 600.0) -> None:
    """Run ``fn_name(rank, world, *args)`` in ``world`` spawned processes; raise on any failure.
    Kills the (own) children if they do not finish within ``timeout_s`` (a hang is a failure);
    a few seconds before that, each worker still running prints its Python stack to stderr
    (faulthandler), so a hang says where it is."""
    port = free_port()
    old = os.environ.get(_DUMP_ENV)
    os.environ[_DUMP_ENV] = str(max(1.0, timeout_s - min(15.0, timeout_s / 4)))
    try:  # (spawned children copy the environment at start)
        ctx = mp.start_processes(_entry, args=(world, port, backend, fn_name, tuple(args)),
                                 nprocs=world, join=False, start_method="spawn")
    finally:
        if old is None:
            os.environ.pop(_DUMP_ENV, None)
        else:
            os.environ[_DUMP_ENV] = old
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{fn_name}: workers did not finish within {timeout_s:.0f} s "
                               f"(deadlock or hang)")


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def int_view_dtype(dtype: torch.dtype) -> torch.dtype:
    return {2: torch.int16, 4: torch.int32}[torch.empty((), dtype=dtype).element_size()]


def make_slice(seed: int, src: int, rows: int, width: int, dtype: torch.dtype,
               device) -> torch.Tensor:
    """Deterministic random *bit patterns* (NaN payloads, -0.0, inf included) of rank src."""
    device = torch.device(device)
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + src * 7919 + rows * 131 + width) % (2**62))
    it = int_view_dtype(dtype)
    info = torch.iinfo(it)
    bits = torch.randint(info.min, info.max, (rows, width), dtype=torch.int64, generator=g,
                         device=device)
    return bits.to(it).view(dtype)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    it = int_view_dtype(got.dtype)
    g, w = got.contiguous().view(it), want.contiguous().view(it)
    if not torch.equal(g, w):
        bad = (g != w).nonzero()
        raise AssertionError(f"{what}: {bad.shape[0]} of {g.numel()} elements differ, first at "
                             f"{bad[0].tolist()}")


def uneven_widths(world: int, unit: int = 8, base: int = 0) -> list:
    return [base + unit * (1 + (3 * s) % 5) for s in range(world)]


# ---------------------------------------------------------------------------------------------
# CPU (gloo) workers
# ---------------------------------------------------------------------------------------------
def gloo_fallback_worker(rank: int, world: int) -> None:
    from tokenspeed_kernel import ops
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.reference import comm as ref

    cap = 130
    for dtype in oc.DTYPES:
        comm = oc.create_all_gather_comm(max_tokens=cap, max_total_width=256, dtype=dtype,
                                         device="cpu")
        assert not comm.p2p and not comm.multimem and comm.state is None, comm
        assert comm.world_size == world and comm.rank == rank
        assert oc.select_backend(comm, 1, 16) == "nccl"
        for widths in (None, uneven_widths(world)):
            ws = [24] * world if widths is None else widths
            for rows in (1, 7, 64, 128, cap):
                slices = [make_slice(SEED, s, rows, ws[s], dtype, "cpu") for s in range(world)]
                want = ref.all_gather_hidden(slices)
                x = slices[rank]
                for backend in ("auto", "nccl", "reference"):
                    y = ops.all_gather_hidden(comm, x, widths=widths, backend=backend)
                    assert_bits_equal(y, want, f"{dtype} T={rows} widths={ws} {backend}")
                # out-variant into a row-strided output (pitch H + 8): padding stays untouched
                H = sum(ws)
                big = torch.zeros((rows, H + 8), dtype=dtype)
                big[:, H:].fill_(3)
                out = big[:, :H]
                r = ops.all_gather_hidden_out(comm, x, out, widths=widths, backend="nccl")
                assert r is out
                assert_bits_equal(out, want, f"{dtype} strided out")
                assert bool((big[:, H:] == 3).all()), "wrote outside out"
                # row-strided input
                xbig = torch.zeros((rows, ws[rank] + 16), dtype=dtype)
                xbig[:, : ws[rank]] = x
                y = ops.all_gather_hidden(comm, xbig[:, : ws[rank]], widths=widths)
                assert_bits_equal(y, want, f"{dtype} strided x")
        # T == 0: no communication on any rank, empty result
        y = ops.all_gather_hidden(comm, torch.empty((0, 24), dtype=dtype))
        assert tuple(y.shape) == (0, 24 * world)
        # validation happens before any collective, so one rank may raise alone
        x = make_slice(SEED, rank, 3, 24, dtype, "cpu")
        bad = [24] * world
        bad[rank] = 32
        try:
            ops.all_gather_hidden(comm, x, widths=bad)
            raise AssertionError("widths[rank] != x.shape[1] accepted")
        except ValueError as e:
            assert str(e).startswith("widths:"), e
        comm.close()


# Mismatched creation arguments (issue 33): (case, name in the error, per-rank overrides
# cycled over the ranks, substrings every rank's message must hold).
MISMATCH_CASES = [
    ("dtype", "dtype", [dict(dtype=torch.float32), dict(dtype=torch.bfloat16)],
     ["rank 0 torch.float32", "rank 1 torch.bfloat16"]),
    ("max_tokens", "max_tokens", [dict(max_tokens=4), dict(max_tokens=2)],
     ["rank 0 4", "rank 1 2"]),
    ("max_total_width", "max_total_width", [dict(max_total_width=64),
                                            dict(max_total_width=128)],
     ["rank 0 64", "rank 1 128"]),
    ("several", "dtype", [dict(dtype=torch.float16, max_tokens=8),
                          dict(dtype=torch.bfloat16, max_tokens=2)],
     ["rank 1 torch.bfloat16", "; max_tokens: rank 0 8, rank 1 2"]),
    ("timeout_ms", "timeout_ms", [dict(timeout_ms=1000), dict(timeout_ms=2000)], ["rank 1 2000"]),
    ("enable_view", "enable_view", [dict(enable_view=False), dict(enable_view=True)],
     ["rank 0 False", "rank 1 True"]),
    ("trap_on_timeout", "trap_on_timeout", [dict(), dict(trap_on_timeout=True)],
     ["rank 1 True"]),
    ("max_blocks", "max_blocks", [dict(max_blocks=None), dict(max_blocks=3)],
     ["rank 0 None", "rank 1 3"]),
    ("block_bytes", "block_bytes", [dict(), dict(block_bytes=8192)], ["rank 1 8192"]),
    ("p2p_max_bytes", "p2p_max_bytes", [dict(), dict(p2p_max_bytes=1)], ["rank 1 1"]),
    ("ll_max_bytes", "ll_max_bytes", [dict(ll_max_bytes=None), dict(ll_max_bytes=16)],
     ["rank 1 16"]),
    ("use_symmetric_memory", "use_symmetric_memory",
     [dict(), dict(use_symmetric_memory=False)], ["rank 0 True", "rank 1 False"]),
]


def gloo_mismatch_worker(rank: int, world: int) -> None:
    """Every case of MISMATCH_CASES: every rank raises, with the same message (naming the
    parameter and every rank's value), and nobody hangs; a rank whose own argument check fails
    raises that error while the others raise one naming it. Afterwards the group still works: a
    matching creation and a call succeed (no rank was left inside a collective)."""
    from tokenspeed_kernel import ops
    from tokenspeed_kernel.ops import comm as oc

    base = dict(max_tokens=4, max_total_width=64, dtype=torch.bfloat16, device="cpu")

    def raised(kw) -> str:
        try:
            oc.create_all_gather_comm(**{**base, **kw})
        except ValueError as e:
            return f"{type(e).__name__}: {e}"
        raise AssertionError(f"rank {rank}: {kw} accepted")

    for case, name, per_rank, parts in MISMATCH_CASES:
        msg = raised(per_rank[rank % len(per_rank)])
        msgs = [None] * world
        dist.all_gather_object(msgs, msg)
        assert all(m == msgs[0] for m in msgs), f"{case}: messages differ: {msgs}"
        assert msg.startswith(f"ValueError: {name}: create_all_gather_comm needs the same value "
                              f"on every rank"), f"{case}: {msg}"
        for p in parts:
            assert p in msg, f"{case}: {p!r} not in {msg!r}"
    # rank 1's own check fails (max_tokens=0); the others name it; nobody waits
    msg = raised(dict(max_tokens=0) if rank == 1 else {})
    if rank == 1:
        assert msg.startswith("ValueError: max_tokens: must be an int >= 1"), msg
    else:
        assert msg.startswith("ValueError: group: rank(s) [1] refused their "
                              "create_all_gather_comm arguments"), msg
    # a float on one rank: TypeError there
    msg = raised(dict(max_tokens=4.0) if rank == 0 else {})
    assert msg.startswith("ArgumentTypeError: max_tokens:" if rank == 0 else
                          "ValueError: group: rank(s) [0]"), msg
    # agree_config on its own, with strings and floats (as other communicators use it)
    try:
        oc.agree_config(dist.group.WORLD, None, [("mode", "ll" if rank == 0 else "flag"),
                                                 ("scale", 0.5)], "test_comm")
        raise AssertionError("agree_config accepted different strings")
    except ValueError as e:
        assert str(e).startswith("mode: test_comm needs the same value on every rank; got "
                                 "mode: rank 0 'll', rank 1 'flag'"), e
        assert "scale" not in str(e), e
    oc.agree_config(dist.group.WORLD, None, [("mode", "ll"), ("scale", 0.5)], "test_comm")
    # the group is healthy: a matching creation and a call
    comm = oc.create_all_gather_comm(**base)
    slices = [make_slice(SEED, s, 3, 16, torch.bfloat16, "cpu") for s in range(world)]
    assert_bits_equal(ops.all_gather_hidden(comm, slices[rank]), torch.cat(slices, 1),
                      "after the mismatches")


def attach_cpu_workspace(comm, enable_view=False):
    """Give a world-size-1 CPU communicator a (process-local) workspace laid out like the
    symmetric one, so the P2P code paths can run in the interpreter / under fake tensors
    (tests/test_comm.py, bench/lab/tools/host_overhead.py)."""
    from tokenspeed_kernel.ops import comm as oc
    nbuf = 3 if enable_view else 2
    comm.ll_off = nbuf * comm.buf_bytes
    comm.symm = torch.zeros(oc.FLAG_BYTES + nbuf * comm.buf_bytes + 2 * comm.ll_bytes,
                            dtype=torch.uint8)
    comm.peer_flags = [comm.symm.data_ptr()]
    comm.peer_data = [comm.symm.data_ptr() + oc.FLAG_BYTES]
    comm.peer_data_dev = torch.tensor(comm.peer_data, dtype=torch.int64)
    comm.peer_flags_dev = torch.tensor(comm.peer_flags, dtype=torch.int64)
    comm.state = torch.zeros(oc.STATE_WORDS, dtype=torch.int64)
    comm.p2p, comm.triton, comm.enable_view = True, True, enable_view
    return comm


# ---------------------------------------------------------------------------------------------
# GPU (NCCL) workers
# ---------------------------------------------------------------------------------------------
# the CUDA backend with each protocol forced, launched plainly and with PDL
CUDA_VARIANTS = ["cuda:ll", "cuda:flag", "cuda:ll+pdl", "cuda:flag+pdl"]


def bp(b: str) -> dict:
    """'cuda:ll' -> backend='cuda', protocol='ll'; 'cuda:flag+pdl' -> ... enable_pdl=True;
    'triton' -> backend='triton' (auto)."""
    b, plus, pdl = b.partition("+")
    name, _, proto = b.partition(":")
    kw = {"backend": name, "protocol": proto or "auto"}
    if plus:
        assert pdl == "pdl", b
        kw["enable_pdl"] = True
    return kw


def _gpu_backends(comm) -> list:
    b = ["triton", "nccl", "reference", "auto"]
    if comm.extension:
        b = CUDA_VARIANTS + ["cuda"] + b
    return b


def gpu_correctness_worker(rank: int, world: int, quick: bool = False) -> None:
    """Bit-exact against NCCL (dist.all_gather) for every backend, dtype, T and width layout."""
    from tokenspeed_kernel import ops, testing
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.reference import comm as ref

    dev = torch.device("cuda", rank)
    cap = 64 if quick else 512
    layouts = [("hidden", [3584] * world), ("uneven", uneven_widths(world, 8, 2048))]
    if not quick:
        layouts.append(("vocab", [151936 // world] * world if 151936 % (8 * world) == 0
                        else [75968] * world))
    max_w = max(sum(w) for _, w in layouts)
    rows_list = [1, 7, 64] if quick else [1, 7, 64, 128, cap]
    for dtype in oc.DTYPES:
        # LL region for every shape of the grid, so protocol="ll" is checked on all of them
        comm = oc.create_all_gather_comm(max_tokens=cap, max_total_width=max_w, dtype=dtype,
                                         ll_max_bytes=1 << 40)
        assert comm.p2p, f"rank {rank}: no P2P workspace: {comm.multimem_reason}"
        assert not comm.multimem and "not requested" in comm.multimem_reason
        for name, ws in layouts:
            even = len(set(ws)) == 1
            for rows in rows_list:
                _progress(rank, f"bit-exact {dtype} {name} T={rows}")
                slices = [make_slice(SEED, s, rows, ws[s], dtype, dev) for s in range(world)]
                want = ref.all_gather_hidden(slices)
                x = slices[rank]
                nccl_ref = ref.all_gather_hidden_dist(x, comm.group, ws)  # NCCL all_gather
                assert_bits_equal(nccl_ref, want, "NCCL reference vs local cat")
                for backend in _gpu_backends(comm):
                    y = ops.all_gather_hidden(comm, x, widths=None if even else ws,
                                              **bp(backend))
                    assert_bits_equal(y, nccl_ref, f"{dtype} {name} T={rows} {backend}")
                    # out-variant, row-strided output
                    H = sum(ws)
                    big = torch.zeros((rows, H + 64), dtype=dtype, device=dev)
                    out = big[:, :H]
                    ops.all_gather_hidden_out(comm, x, out, widths=ws, **bp(backend))
                    assert_bits_equal(out, nccl_ref, f"{dtype} {name} T={rows} {backend} out")
                    assert int((big[:, H:] != 0).sum()) == 0, "wrote outside out"
        comm.check()
        comm.close()
    # Multi-round chunks: the pipelined flag kernel moves each CTA's chunk in rounds of
    # 480 * 4 vectors (30 KiB); a 1- or 3-CTA grid and skewed widths give several rounds, and a
    # different round count per source (rank s holds 1024 * (1 + 4 s) columns).
    ws = skewed_widths(world)
    for max_blocks in (1, 3):
        for dtype in (torch.bfloat16, torch.float32):
            _progress(rank, f"bit-exact multi-round {dtype} blocks={max_blocks}")
            comm = oc.create_all_gather_comm(max_tokens=64, max_total_width=sum(ws), dtype=dtype,
                                             max_blocks=max_blocks)
            for rows in (1, 7, 64):
                slices = [make_slice(SEED + 1, s, rows, ws[s], dtype, dev) for s in range(world)]
                want = ref.all_gather_hidden(slices)
                for backend in (["cuda:flag", "cuda:flag-nopipe", "cuda:flag+pdl"]
                                if comm.extension else []) + ["triton"]:
                    name, _, knob = backend.partition("-")
                    with testing.knobs(comm_unpipelined=knob == "nopipe"):
                        for _ in range(2):  # both buffer parities
                            y = ops.all_gather_hidden(comm, slices[rank], widths=ws, **bp(name))
                            assert_bits_equal(y, want, f"{dtype} skewed T={rows} "
                                                       f"blocks={max_blocks} {backend}")
            comm.check()
            comm.close()
    # LL: the library's choice, the 6-byte-packet kernel (groups of 3 vectors, zero-padded) and
    # the 4-byte one (planes; side by side: the testing variant) on widths whose vector counts
    # are not multiples of 3, 1-, 3- and up-to-SM-count-CTA grids (256-byte blocks: CTAs with
    # empty chunks at small T), both parities, 3 calls
    # each (a consumed unit must be zero again before the parity's next call).
    ws = [16 * (1 + 2 * s) + 8 for s in range(world)]  # bf16: 3, 5, 7, ... vectors per row (+1)
    for max_blocks, block_bytes in ((1, oc.DEFAULT_BLOCK_BYTES), (3, 256), (None, 256)):
        for dtype in (torch.bfloat16, torch.float32):
            _progress(rank, f"bit-exact LL {dtype} blocks={max_blocks} block_bytes={block_bytes}")
            comm = oc.create_all_gather_comm(max_tokens=64, max_total_width=sum(ws), dtype=dtype,
                                             max_blocks=max_blocks, block_bytes=block_bytes,
                                             ll_max_bytes=1 << 40)
            if not comm.extension:
                comm.close()
                break
            for rows in (1, 2, 3, 7, 64):
                slices = [make_slice(SEED + 2, s, rows, ws[s], dtype, dev) for s in range(world)]
                want = ref.all_gather_hidden(slices)
                for variant in (None, "w6", "w4", "w4pair"):
                    with testing.knobs(comm_ll_variant=variant):
                        for i in range(3):
                            y = ops.all_gather_hidden(comm, slices[rank], widths=ws,
                                                      **bp("cuda:ll" + ("+pdl" if i else "")))
                            assert_bits_equal(y, want, f"{dtype} LL {variant} T={rows} "
                                                       f"blocks={max_blocks} call {i}")
            comm.check()
            comm.close()
    torch.cuda.synchronize()


def skewed_widths(world: int) -> list:
    return [1024 * (1 + 4 * s) for s in range(world)]


def _gen_bits(idx: torch.Tensor, counter: torch.Tensor, src: int, it: torch.dtype) -> torch.Tensor:
    """In-graph deterministic pattern of (call counter, source rank, element index)."""
    v = (idx * 2654435761 + counter * 40503 + (src + 1) * 977) % 2147483629
    v = (v ^ (v >> 13)) & (0xFFFF if it == torch.int16 else 0x7FFFFFFF)
    if it == torch.int16:
        v = v - 32768
    return v.to(it)


def gpu_graph_worker(rank: int, world: int, replays: int = 10000) -> None:
    """CUDA-graph capture + `replays` replays with inputs that change every replay (generated
    in-graph from a device counter), verified in-graph every replay and on the host at the end;
    the graph also interleaves NCCL collectives and both P2P backends."""
    from tokenspeed_kernel import ops
    from tokenspeed_kernel.ops import comm as oc

    dev = torch.device("cuda", rank)
    for dtype, ws in ((torch.bfloat16, [3584] * world), (torch.float32, uneven_widths(world, 8, 4096))):
        # LL region for the whole output (the widths grow with the world size)
        comm = oc.create_all_gather_comm(max_tokens=16, max_total_width=sum(ws), dtype=dtype,
                                         ll_max_bytes=1 << 40)
        rows, H, w = 8, sum(ws), ws[rank]
        offs = [0]
        for v in ws:
            offs.append(offs[-1] + v)
        it = int_view_dtype(dtype)
        backends = (CUDA_VARIANTS if comm.extension else []) + ["triton"]
        x = torch.zeros((rows, w), dtype=dtype, device=dev)
        outs = {b: torch.zeros((rows, H), dtype=dtype, device=dev) for b in backends}
        counter = torch.zeros((), dtype=torch.int64, device=dev)
        mism = torch.zeros((), dtype=torch.int64, device=dev)
        red = torch.zeros(4, dtype=torch.float32, device=dev)
        idx = {s: torch.arange(rows * ws[s], device=dev, dtype=torch.int64).view(rows, ws[s])
               for s in range(world)}

        # even widths: a chain of two PDL calls, the second gathering what the first received
        # (its x = the next rank's columns of the first output). The second kernel is scheduled
        # while the first runs; griddepcontrol.wait must hold its loads until the first ended.
        chain = comm.extension and len(set(ws)) == 1
        if chain:
            y1 = torch.zeros((rows, H), dtype=dtype, device=dev)
            y2 = torch.zeros((rows, H), dtype=dtype, device=dev)
            nxt = (rank + 1) % world

        def step():
            x.view(it).copy_(_gen_bits(idx[rank], counter, rank, it))
            for b in backends:
                ops.all_gather_hidden_out(comm, x, outs[b], widths=ws, **bp(b))
                red.fill_(1.0)
                dist.all_reduce(red, group=comm.group)   # NCCL collective in between
                o = outs[b].view(it)
                for s in range(world):
                    mism.add_((o[:, offs[s]:offs[s + 1]] != _gen_bits(idx[s], counter, s, it)).sum())
                mism.add_((red != float(world)).sum())
            if chain:
                for proto in ("ll", "flag"):
                    ops.all_gather_hidden_out(comm, x, y1, protocol=proto, enable_pdl=True)
                    ops.all_gather_hidden_out(comm, y1[:, offs[nxt]:offs[nxt + 1]], y2,
                                              protocol=proto, enable_pdl=True)
                    o = y2.view(it)
                    for s in range(world):
                        want = _gen_bits(idx[(s + 1) % world], counter, (s + 1) % world, it)
                        mism.add_((o[:, offs[s]:offs[s + 1]] != want).sum())
            counter.add_(1)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        assert int(mism.item()) == 0, f"eager warm-up mismatches: {int(mism.item())}"
        calls0 = comm.calls
        _progress(rank, f"graph {dtype}: eager warm-up ok, capturing, {replays} replays")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
        comm.check()
        assert int(mism.item()) == 0, f"{dtype}: {int(mism.item())} mismatching elements"
        assert int(counter.item()) == 3 + replays
        assert comm.calls == calls0 + replays * (len(backends) + (4 if chain else 0)), \
            (comm.calls, calls0)
        # host check of the last replay
        last = counter - 1
        for b in backends:
            for s_ in range(world):
                want = _gen_bits(idx[s_], last, s_, it)
                assert torch.equal(outs[b].view(it)[:, offs[s_]:offs[s_ + 1]], want)
        del g
        comm.close()


def gpu_interleave_worker(rank: int, world: int, iters: int = 300) -> None:
    """Back-to-back calls without host sync, mixed with NCCL collectives, switching backends
    between calls on one communicator, with random per-rank delays so ranks run ahead of each
    other; every result verified at the end."""
    import random

    from tokenspeed_kernel import ops
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.reference import comm as ref

    dev = torch.device("cuda", rank)
    ws = uneven_widths(world, 8, 1024)
    comm = oc.create_all_gather_comm(max_tokens=32, max_total_width=sum(ws), dtype=torch.bfloat16,
                                     enable_view=comm_view_ok(), ll_max_bytes=1 << 40)
    rng = random.Random(99)          # same sequence of choices on every rank
    delay = random.Random(1000 + rank)  # different delays per rank
    backends = (CUDA_VARIANTS if comm.extension else []) + ["triton", "nccl"]
    pending = []
    for i in range(iters):
        rows = rng.choice([1, 3, 8, 32])
        op = rng.choice(backends + ["allreduce", "allgather", "view"] if comm.extension else
                        backends + ["allreduce", "allgather"])
        if delay.random() < 0.3:
            torch.cuda._sleep(int(delay.random() * 200_000))
        if op in backends:
            x = make_slice(i, rank, rows, ws[rank], torch.bfloat16, dev)
            y = ops.all_gather_hidden(comm, x, widths=ws, **bp(op))
            pending.append((i, rows, "ag", y))
        elif op == "view":
            x = make_slice(i, rank, rows, ws[rank], torch.bfloat16, dev)
            v = ops.all_gather_hidden_view(comm, x, widths=ws)
            pending.append((i, rows, "ag", v.clone()))   # consume before the next view call
        elif op == "allreduce":
            t = torch.full((1024,), float(rank + i), device=dev)
            dist.all_reduce(t)
            pending.append((i, rows, "allreduce", t))
        else:
            t = torch.full((rows, 8), float(rank * 1000 + i), device=dev)
            o = torch.empty((world * rows, 8), device=dev)
            dist.all_gather_into_tensor(o, t)
            pending.append((i, rows, "allgather", o))
    torch.cuda.synchronize()
    comm.check()
    for i, rows, kind, got in pending:
        if kind == "ag":
            want = ref.all_gather_hidden(
                [make_slice(i, s, rows, ws[s], torch.bfloat16, dev) for s in range(world)])
            assert_bits_equal(got, want, f"call {i}")
        elif kind == "allreduce":
            assert torch.all(got == float(sum(range(world)) + world * i))
        else:
            want = torch.cat([torch.full((rows, 8), float(s * 1000 + i), device=dev)
                              for s in range(world)])
            assert torch.equal(got, want)
    comm.close()


def comm_view_ok() -> bool:
    from tokenspeed_kernel import _library
    return _library.extension_available()


def gpu_timeout_worker(rank: int, world: int) -> None:
    """Rank 0 calls, the others do not: rank 0's kernel must give up after timeout_ms and the
    communicator must report it (no hang). Checked for every P2P backend."""
    from tokenspeed_kernel import ops
    from tokenspeed_kernel.ops import comm as oc

    dev = torch.device("cuda", rank)
    backends = (CUDA_VARIANTS if comm_view_ok() else []) + ["triton"]
    for b in backends:
        comm = oc.create_all_gather_comm(max_tokens=8, max_total_width=1024,
                                         dtype=torch.bfloat16, timeout_ms=300)
        if rank == 0:
            x = torch.ones((4, 256), dtype=torch.bfloat16, device=dev)
            t0 = time.monotonic()
            ops.all_gather_hidden(comm, x, **bp(b))
            torch.cuda.synchronize()
            dt = time.monotonic() - t0
            err = comm.error()
            assert err is not None and "gave up" in err, err
            try:
                comm.check()
                raise AssertionError("check() did not raise")
            except oc.CommError:
                pass
            # poisoned: the next call returns at once instead of waiting again
            t1 = time.monotonic()
            ops.all_gather_hidden(comm, x, **bp(b))
            torch.cuda.synchronize()
            assert time.monotonic() - t1 < 5.0
            print(f"[timeout/{b}] rank 0 gave up after {dt:.2f} s: {err}", flush=True)
        dist.barrier()
        comm.close()


# Per-call mismatches (issue 33): (name, backend variant, LL packing knob, creation overrides,
# per-rank call arguments as a function of (rank, world) -> (rows, widths or None, variant)).
def _mm_widths(rank: int, world: int, w: int) -> list:
    """Rank r's widths list: its own width w, its next rank's w + 16 x (elements), others w."""
    ws = [w] * world
    ws[(rank + 1) % world] = w * 2
    return ws


MISMATCH_CALLS = [
    # (name, {creation overrides}, fn(rank, world) -> (rows, widths, backend variant, ll knob))
    ("flag T", {}, lambda r, W: (4 + r, None, "cuda:flag", None)),
    ("flag widths", {}, lambda r, W: (4, _mm_widths(r, W, 256), "cuda:flag", None)),
    ("flag+pdl T", {}, lambda r, W: (4 + r, None, "cuda:flag+pdl", None)),
    ("pipelined T", dict(max_blocks=1), lambda r, W: (8 + r, None, "cuda:flag", None)),
    ("pipelined widths", dict(max_blocks=1),
     lambda r, W: (8, _mm_widths(r, W, 4096), "cuda:flag", None)),
    ("ll4 T", {}, lambda r, W: (4 + r, None, "cuda:ll", "w4")),
    ("ll4 widths", {}, lambda r, W: (4, _mm_widths(r, W, 256), "cuda:ll", "w4")),
    ("ll6 T", {}, lambda r, W: (4 + r, None, "cuda:ll", "w6")),
    ("ll6 widths", {}, lambda r, W: (4, _mm_widths(r, W, 256), "cuda:ll", "w6")),
    ("ll T (4- vs 6-byte packets)", {}, lambda r, W: (1 + 299 * r, None, "cuda:ll", None)),
    ("triton T", {}, lambda r, W: (4 + r, None, "triton", None)),
    ("triton widths", {}, lambda r, W: (4, _mm_widths(r, W, 256), "triton", None)),
    ("view T", dict(enable_view=True), lambda r, W: (4 + r, None, "view", None)),
    ("view widths", dict(enable_view=True),
     lambda r, W: (4, _mm_widths(r, W, 256), "view", None)),
    ("protocol ll vs flag", {}, lambda r, W: (4, None, "cuda:ll" if r == 0 else "cuda:flag",
                                              None)),
    ("backend cuda vs triton", {}, lambda r, W: (4, None, "cuda:flag" if r == 0 else "triton",
                                                 None)),
    ("view vs copy-out", dict(enable_view=True),
     lambda r, W: (4, None, "view" if r == 0 else "cuda:flag", None)),
]


def gpu_mismatch_worker(rank: int, world: int, names=None) -> None:
    """Ranks that call with different T / widths / protocol / backend (MISMATCH_CALLS), after a
    matching warm-up call: every rank gets CommError naming the mismatch (not a timeout: the
    header words are compared within microseconds), within the bounded wait; nothing aborts;
    the output's (or the view's) columns of the peers keep the sentinel this rank pre-filled;
    the next call on the poisoned communicator returns at once; a new communicator works."""
    from tokenspeed_kernel import ops, testing
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.reference import comm as ref

    dev = torch.device("cuda", rank)
    dtype = torch.bfloat16
    it = int_view_dtype(dtype)
    SENT = 0x5A5A
    # compile / load every kernel first with the default (long) timeout: a Triton JIT compile
    # that ends seconds apart on the two ranks must not time out the short-timeout calls below
    warm = oc.create_all_gather_comm(max_tokens=16, max_total_width=4096 * world, dtype=dtype,
                                     enable_view=comm_view_ok(), ll_max_bytes=1 << 40)
    variants = ["triton"] + (["cuda:flag", "cuda:flag+pdl", "cuda:ll", "view"]
                             if comm_view_ok() else [])
    for var in variants:
        for knob in ((None, "w4", "w6") if var == "cuda:ll" else (None,)):
            xw = make_slice(SEED, rank, 2, 256, dtype, dev)
            with testing.knobs(comm_ll_variant=knob):
                if var == "view":
                    ops.all_gather_hidden_view(warm, xw)
                else:
                    ops.all_gather_hidden(warm, xw, **bp(var))
    torch.cuda.synchronize()
    warm.check()
    dist.barrier()
    warm.close()
    for name, create_kw, call in MISMATCH_CALLS:
        if names and name not in names:
            continue
        rows, widths, variant, knob = call(rank, world)
        if ("cuda" in variant or variant == "view") and not comm_view_ok():
            continue
        ws = widths or [256 if "pipelined" not in name else 4096] * world
        kw = dict(max_tokens=512, max_total_width=4 * 4096 * world, dtype=dtype,
                  timeout_ms=2000, ll_max_bytes=1 << 40)
        kw.update(create_kw)
        comm = oc.create_all_gather_comm(**kw)
        assert comm.p2p

        def run(c, x, out, ws_, var):
            if var == "view":
                return ops.all_gather_hidden_view(c, x, widths=ws_)
            ops.all_gather_hidden_out(c, x, out, widths=ws_, **bp(var))
            return out

        # matching warm-up calls of every variant involved, in the same order on every rank
        # (compiles / loads the kernels before the mismatched call)
        for var in sorted({call(r, world)[2] for r in range(world)}):
            wsm = [ws[rank]] * world
            xm = make_slice(SEED, rank, 2, ws[rank], dtype, dev)
            om = torch.empty((2, sum(wsm)), dtype=dtype, device=dev)
            with testing.knobs(comm_ll_variant=knob):
                y = run(comm, xm, om, wsm, var)
            torch.cuda.synchronize()
            want = ref.all_gather_hidden([make_slice(SEED, s, 2, ws[rank], dtype, dev)
                                          for s in range(world)])
            assert_bits_equal(y, want, f"{name}: warm-up")
        comm.check()
        dist.barrier()
        # the mismatched call
        offs = [0]
        for w in ws:
            offs.append(offs[-1] + w)
        x = make_slice(SEED + 1, rank, rows, ws[rank], dtype, dev)
        out = torch.full((rows, offs[-1]), SENT, dtype=torch.int16, device=dev).view(dtype)
        if variant == "view":
            start = oc.FLAG_BYTES + 2 * comm.buf_bytes
            comm.symm[start:start + 2 * rows * offs[-1]].view(torch.int16).fill_(SENT)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.monotonic()
        with testing.knobs(comm_ll_variant=knob):
            got = run(comm, x, out, widths, variant)
        torch.cuda.synchronize()
        dt = time.monotonic() - t0
        err = comm.error()
        assert err is not None, f"{name}: rank {rank}: no error"
        try:
            comm.check()
            raise AssertionError(f"{name}: check() did not raise")
        except oc.CommError:
            pass
        assert "different arguments" in err, f"{name}: rank {rank}: {err}"
        assert dt < 10.0, f"{name}: rank {rank} took {dt:.1f} s"
        g = got.contiguous().view(it) if variant != "view" else got.clone().view(it)
        for s in range(world):
            if s == rank:
                continue
            col = g[:, offs[s]:offs[s + 1]]
            assert bool((col == SENT).all()), \
                f"{name}: rank {rank}: columns of rank {s} were written after a mismatch"
        print(f"[mismatch/{name}] rank {rank}: CommError after {dt * 1e3:.1f} ms: {err}",
              flush=True)
        # poisoned: the next call returns at once
        t1 = time.monotonic()
        with testing.knobs(comm_ll_variant=knob):
            run(comm, x, out, widths, variant)
        torch.cuda.synchronize()
        assert time.monotonic() - t1 < 1.0, f"{name}: a poisoned call waited"
        dist.barrier()
        comm.close()
        # a new communicator works (every rank calls rank 0's variant: in the protocol / backend
        # cases the ranks' own variants differ)
        comm = oc.create_all_gather_comm(**kw)
        wsm = [ws[rank]] * world
        xm = make_slice(SEED + 2, rank, 3, ws[rank], dtype, dev)
        om = torch.empty((3, sum(wsm)), dtype=dtype, device=dev)
        with testing.knobs(comm_ll_variant=call(0, world)[3]):
            y = run(comm, xm, om, wsm, call(0, world)[2])
        torch.cuda.synchronize()
        comm.check()
        assert_bits_equal(y, ref.all_gather_hidden(
            [make_slice(SEED + 2, s, 3, ws[rank], dtype, dev) for s in range(world)]),
            f"{name}: a new communicator after the mismatch")
        dist.barrier()
        comm.close()


def gpu_opcheck_worker(rank: int, world: int) -> None:
    """torch.library.opcheck of the CUDA op on a one-rank group (the op is then a local copy)."""
    from tokenspeed_kernel import _library
    from tokenspeed_kernel.ops import comm as oc

    groups = [dist.new_group([r]) for r in range(world)]
    if not _library.extension_available():
        print("[opcheck] extension unavailable: skipped", flush=True)
        return
    comm = oc.create_all_gather_comm(groups[rank], max_tokens=8, max_total_width=512,
                                     dtype=torch.bfloat16)
    assert comm.p2p and comm.world_size == 1
    dev = torch.device("cuda", rank)
    x = make_slice(3, rank, 5, 256, torch.bfloat16, dev)
    out = torch.empty((5, 256), dtype=torch.bfloat16, device=dev)
    # (opcheck passes copies of the mutated workspace / state; the op addresses the workspace
    # through the peer tables, so the copies are harmless.) Both protocols.
    for flags, ll_off, ll_bytes in ((0, 0, 0), (oc.F_LL, comm.ll_off, comm.ll_bytes)):
        args = (x, out, comm.state, comm.symm, comm.peer_data, comm.peer_flags, 0, [0, 256],
                0, comm.buf_bytes, 1, flags, 10**9, ll_off, ll_bytes)
        torch.library.opcheck(torch.ops.tokenspeed_kernel.all_gather_hidden.default, args)
        out.zero_()
        torch.ops.tokenspeed_kernel.all_gather_hidden(*args)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), x.view(torch.int16)), flags
    comm.check()


def gpu_sanitize_worker(rank: int, world: int) -> None:
    """A few small calls of every P2P kernel (for compute-sanitizer)."""
    from tokenspeed_kernel import ops, testing
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.reference import comm as ref

    dev = torch.device("cuda", rank)
    ws = uneven_widths(world, 8, 64)
    comm = oc.create_all_gather_comm(max_tokens=8, max_total_width=sum(ws), dtype=torch.bfloat16,
                                     enable_view=comm_view_ok(), ll_max_bytes=1 << 40)
    backends = (CUDA_VARIANTS if comm.extension else []) + ["triton"]
    for i in range(3):
        slices = [make_slice(i, s, 7, ws[s], torch.bfloat16, dev) for s in range(world)]
        want = ref.all_gather_hidden(slices)
        for b in backends:
            assert_bits_equal(ops.all_gather_hidden(comm, slices[rank], widths=ws, **bp(b)),
                              want, f"sanitize {b}")
        if comm.extension:
            assert_bits_equal(ops.all_gather_hidden_view(comm, slices[rank], widths=ws).clone(),
                              want, "sanitize view")
            for variant in ("w6", "w4"):  # both LL packings, whatever the size picks
                with testing.knobs(comm_ll_variant=variant):
                    assert_bits_equal(ops.all_gather_hidden(comm, slices[rank], widths=ws,
                                                            **bp("cuda:ll")),
                                      want, f"sanitize ll {variant}")
    torch.cuda.synchronize()
    comm.check()
    comm.close()
    if comm_view_ok():  # (extension loaded) the pipelined flag kernel over several rounds, uneven round counts
        ws = skewed_widths(world)
        comm = oc.create_all_gather_comm(max_tokens=8, max_total_width=sum(ws),
                                         dtype=torch.bfloat16, max_blocks=1)
        for i in range(2):
            slices = [make_slice(i, s, 7, ws[s], torch.bfloat16, dev) for s in range(world)]
            assert_bits_equal(ops.all_gather_hidden(comm, slices[rank], widths=ws,
                                                    **bp("cuda:flag")),
                              ref.all_gather_hidden(slices), "sanitize rounds")
        torch.cuda.synchronize()
        comm.check()
        comm.close()


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernel under TRITON_INTERPRET=1 with W simulated ranks in one process
# ---------------------------------------------------------------------------------------------
def triton_simulation() -> None:
    """Runs every simulated rank's phase 1 (push + publish), then every phase 2 (wait + copy-out
    + advance); checks results, the device call counter, the buffer parity and the timeout path.
    Must run with TRITON_INTERPRET=1 set before triton is imported."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.triton import comm as tc

    def setup(W, rows, widths, dtype):
        esz = torch.empty((), dtype=dtype).element_size()
        vec = 16 // esz
        H = sum(widths)
        buf_bytes = -(-rows * H * esz // 256) * 256
        symm = [torch.zeros(oc.FLAG_BYTES + 2 * buf_bytes, dtype=torch.uint8) for _ in range(W)]
        state = [torch.zeros(oc.STATE_WORDS, dtype=torch.int64) for _ in range(W)]
        pdata = torch.tensor([s.data_ptr() + oc.FLAG_BYTES for s in symm], dtype=torch.int64)
        pflags = torch.tensor([s.data_ptr() for s in symm], dtype=torch.int64)
        offs = [0]
        for w in widths:
            offs.append(offs[-1] + w)
        offs_vec = torch.tensor([o // vec for o in offs], dtype=torch.int32)
        return symm, state, pdata, pflags, offs_vec, buf_bytes, H

    cases = [(2, 1, [8, 8], torch.bfloat16, 1), (2, 3, [8, 16], torch.bfloat16, 2),
             (2, 2, [1024, 1032], torch.float32, 3), (4, 5, [16, 8, 24, 8], torch.float16, 4),
             (3, 4, [2048, 8, 1032], torch.bfloat16, 5), (8, 2, [8] * 8, torch.float32, 2)]
    for W, rows, widths, dtype, G in cases:
        symm, state, pdata, pflags, offs_vec, buf_bytes, H = setup(W, rows, widths, dtype)
        esz = torch.empty((), dtype=dtype).element_size()
        offs = [0]
        for w in widths:
            offs.append(offs[-1] + w)
        sig = oc.all_gather_signature(oc.SIG_ALL_GATHER_TRITON, 0, esz, rows, G, offs)
        for k in range(4):
            xs = [make_slice(k, s, rows, widths[s], dtype, "cpu") for s in range(W)]
            outs = [torch.empty((rows, H), dtype=dtype) for _ in range(W)]
            for phase in (1, 2):
                for r in range(W):
                    tc.all_gather_hidden(xs[r], outs[r], pdata, pflags, state[r], offs_vec, r,
                                         buf_bytes, G, 0, phase=phase, max_spins=8, sig=sig)
            want = torch.cat(xs, 1)
            for r in range(W):
                assert_bits_equal(outs[r], want, f"sim W={W} {widths} call {k} rank {r}")
                assert state[r][oc.STATE_SEQ].item() == k + 1
                assert state[r][oc.STATE_ERR].item() == 0
                assert state[r][oc.STATE_DONE].item() == 0
                # call k+1 (epoch) wrote buffer (k+1) & 1
                data = symm[r][oc.FLAG_BYTES:].view(torch.uint8)
                buf = data[((k + 1) & 1) * buf_bytes:][: rows * H * esz].view(dtype).view(rows, H)
                assert_bits_equal(buf, want, "parity buffer")
                flags = symm[r][: oc.FLAG_BYTES].view(torch.int64).view(5, oc.MAX_BLOCKS,
                                                                           oc.MAX_RANKS)
                assert bool((flags[2, :G, :W] == k + 1).all())   # the Triton region
                assert bool((flags[2, G:] == 0).all()) and bool((flags[2, :, W:] == 0).all())
                assert bool((flags[:2] == 0).all())              # CUDA data / ready untouched
                # the call's header [(k + 1) & 1][b][s] from every rank (int64 bits)
                hdr = flags[3 + ((k + 1) & 1)]
                hw = oc.header_word(k + 1, sig)
                hw -= (1 << 64) if hw >= (1 << 63) else 0
                assert bool((hdr[:G, :W] == hw).all()), "headers"
                assert bool((hdr[G:] == 0).all()) and bool((hdr[:, W:] == 0).all())
        print(f"triton-sim ok: W={W} T={rows} widths={widths} {dtype} G={G}", flush=True)

    # timeout: rank 1 never pushes; rank 0 gives up, records the error, and is poisoned
    W, rows, widths, dtype, G = 2, 2, [8, 8], torch.bfloat16, 2
    symm, state, pdata, pflags, offs_vec, buf_bytes, H = setup(W, rows, widths, dtype)
    x = make_slice(0, 0, rows, 8, dtype, "cpu")
    out = torch.zeros((rows, H), dtype=dtype)
    tc.all_gather_hidden(x, out, pdata, pflags, state[0], offs_vec, 0, buf_bytes, G, 0,
                         phase=3, max_spins=4)
    st = state[0].tolist()
    assert st[oc.STATE_ERR] == oc.ERR_TIMEOUT_DATA and st[oc.STATE_ERR_SRC] == 1, st
    assert st[oc.STATE_ERR_EPOCH] == 1, st
    assert bool((out.view(torch.int16) == 0).all()), "copied out after a timeout"
    flags1 = symm[1][: oc.FLAG_BYTES].view(torch.int64)
    before = flags1.clone()
    tc.all_gather_hidden(x, out, pdata, pflags, state[0], offs_vec, 0, buf_bytes, G, 0,
                         phase=3, max_spins=4)
    assert torch.equal(flags1, before), "a poisoned communicator still signalled"
    print("triton-sim ok: timeout path", flush=True)
    triton_simulation_mismatch()


def triton_simulation_mismatch() -> None:
    """Simulated ranks that call with different arguments (T; widths; the number of programs):
    every rank records ERR_MISMATCH (not a timeout) naming the other rank and both signatures,
    copies nothing out (the output keeps its sentinel), and is poisoned."""
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.triton import comm as tc

    dtype, esz, vec = torch.bfloat16, 2, 8
    cap_rows, cap_h = 4, 64
    cases = [("T", [2, 3], [[16, 16], [16, 16]], [2, 2]),
             ("widths", [2, 2], [[16, 32], [32, 16]], [1, 1]),
             ("grid", [2, 2], [[16, 16], [16, 16]], [2, 1])]
    for name, rows_r, widths_r, g_r in cases:
        buf_bytes = cap_rows * cap_h * esz
        symm = [torch.zeros(oc.FLAG_BYTES + 2 * buf_bytes, dtype=torch.uint8) for _ in range(2)]
        state = [torch.zeros(oc.STATE_WORDS, dtype=torch.int64) for _ in range(2)]
        pdata = torch.tensor([s.data_ptr() + oc.FLAG_BYTES for s in symm], dtype=torch.int64)
        pflags = torch.tensor([s.data_ptr() for s in symm], dtype=torch.int64)
        args, outs, sigs = [], [], []
        for r in range(2):
            ws, rows, G = widths_r[r], rows_r[r], g_r[r]
            offs = [0, ws[0], ws[0] + ws[1]]
            sig = oc.all_gather_signature(oc.SIG_ALL_GATHER_TRITON, 0, esz, rows, G, offs)
            sigs.append(sig)
            x = make_slice(9, r, rows, ws[r], dtype, "cpu")
            out = torch.full((rows, offs[-1]), 7.0, dtype=dtype)   # sentinel
            offs_vec = torch.tensor([o // vec for o in offs], dtype=torch.int32)
            args.append((x, out, offs_vec, G, sig))
            outs.append(out)
        assert sigs[0] != sigs[1], name
        for phase in (1, 2):
            for r in range(2):
                x, out, offs_vec, G, sig = args[r]
                tc.all_gather_hidden(x, out, pdata, pflags, state[r], offs_vec, r, buf_bytes, G,
                                     0, phase=phase, max_spins=8, sig=sig)
        for r in range(2):
            st = state[r].tolist()
            assert st[oc.STATE_ERR] == oc.ERR_MISMATCH, (name, r, st)
            assert st[oc.STATE_ERR_SRC] == 1 - r and st[oc.STATE_ERR_EPOCH] == 1, (name, r, st)
            assert st[oc.STATE_ERR_SIG] == sigs[r] and st[oc.STATE_ERR_PEER_SIG] == sigs[1 - r]
            assert st[oc.STATE_ERR_ROWS] == rows_r[r]
            assert st[oc.STATE_ERR_WIDTH] * vec == widths_r[r][r]
            assert st[oc.STATE_ERR_TOTAL] * vec == sum(widths_r[r])
            assert st[oc.STATE_ERR_VARIANT] == oc.SIG_ALL_GATHER_TRITON << 16
            assert bool((outs[r] == 7.0).all()), f"{name}: rank {r} copied out after a mismatch"
            msg = oc.format_comm_error(st, r, 2000, esz)
            assert "different arguments" in msg and f"rank {1 - r} joined call 1" in msg, msg
            assert f"T={rows_r[r]}" in msg and "backend 'triton'" in msg, msg
            # poisoned: the next call signals nothing
            before = symm[1 - r][: oc.FLAG_BYTES].clone()
            x, out, offs_vec, G, sig = args[r]
            tc.all_gather_hidden(x, out, pdata, pflags, state[r], offs_vec, r, buf_bytes, G, 0,
                                 phase=3, max_spins=4, sig=sig)
            assert torch.equal(symm[1 - r][: oc.FLAG_BYTES], before), name
        print(f"triton-sim ok: mismatch ({name})", flush=True)


# ---------------------------------------------------------------------------------------------
# CPU: ahead-of-time compile of the Triton kernel for sm_90 (no GPU needed)
# ---------------------------------------------------------------------------------------------
def triton_aot_check() -> int:
    """Compiles the Triton kernel for sm_90 and greps its PTX. Returns 5 (skip) when this
    triton's ahead-of-time API differs, 0 on success; raises on a failed check."""
    import re

    assert os.environ.get("TRITON_INTERPRET") != "1", "run with the interpreter off"
    import triton

    from tokenspeed_kernel.triton import comm as tc
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        print(f"triton {triton.__version__}: no ahead-of-time compile API ({e})")
        return 5
    for dtype, world in (("bf16", 2), ("fp32", 4)):
        sig = {"x_ptr": f"*{dtype}", "ldx": "i32", "out_ptr": f"*{dtype}", "ldo": "i32",
               "peer_data_ptr": "*i64", "peer_flags_ptr": "*i64", "state_ptr": "*i64",
               "offs_ptr": "*i32", "rows": "i32", "row_vec": "i32", "buf_vec": "i64",
               "rank": "i32", "timeout_ns": "i64", "sig": "i32", "W": "constexpr",
               "VEC": "constexpr", "BLOCK": "constexpr", "MAXR": "constexpr",
               "FLAG_OFF": "constexpr", "HDR_OFF": "constexpr", "HDR_PAR": "constexpr",
               "PHASE": "constexpr", "USE_TIMER": "constexpr", "MAX_SPINS": "constexpr"}
        const = {"W": world, "VEC": 8 if dtype == "bf16" else 4, "BLOCK": tc.BLOCK,
                 "MAXR": tc.MAX_RANKS, "FLAG_OFF": tc.FLAG_OFFSET, "HDR_OFF": tc.HEADER_OFFSET,
                 "HDR_PAR": tc.HEADER_PARITY, "PHASE": 3, "USE_TIMER": True, "MAX_SPINS": 1}
        attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 7, 9)}
        try:
            src = ASTSource(fn=tc._all_gather_hidden_kernel, signature=sig, constexprs=const,
                            attrs=attrs)
        except TypeError as e:
            print(f"triton {triton.__version__}: ahead-of-time compile API differs ({e})")
            return 5
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        ptx = k.asm["ptx"]
        checks = {
            "16-byte push (st.global.v4)": r"st\.global\.v4\.b32",
            "16-byte L1-bypassing copy-out (ld.global.cg.v4)": r"ld\.global\.cg\.v4\.b32",
            "flag publish (atom.release.sys)": r"atom\.global\.sys\.release\.exch\.b64",
            "flag wait (ld.acquire.sys)": r"ld\.global\.sys\.acquire\.b64",
            "bounded wait (%globaltimer)": r"%globaltimer",
            "header publish (atom.relaxed.sys)": r"atom\.global\.sys(\.relaxed)?\.exch\.b64",
            "header poll (ld.relaxed.sys)": r"ld\.global\.sys\.relaxed\.b64",
        }
        for what, pat in checks.items():
            n = len(re.findall(pat, ptx))
            assert n > 0, f"{dtype} W={world}: no {what} in the PTX"
            print(f"  {dtype} W={world}: {what}: {n}")
        assert_uniform_polls(ptx, f"{dtype} W={world}")
        print(f"triton-aot ok: {dtype} W={world}", flush=True)
    return 0


def assert_uniform_polls(ptx: str, what: str) -> None:
    """The spin loops of the P2P Triton kernels read every polled word (flags, headers, the
    error and call words) in one thread and broadcast it (triton/_spin.py): no per-thread
    ``ld.volatile`` poll, and every relaxed / acquire load of global memory is predicated (the
    scalar-atomic lowering: one thread loads, st.shared + bar.sync + ld.shared)."""
    import re
    assert not re.search(r"ld\.volatile", ptx), f"{what}: a per-thread ld.volatile poll in the PTX"
    for line in ptx.splitlines():
        if re.search(r"ld\.global\.(sys|gpu)\.(relaxed|acquire)", line):
            assert line.strip().startswith("@%p"), \
                f"{what}: an unpredicated (per-thread) poll in the PTX: {line.strip()}"
    print(f"  {what}: every poll is one thread's, broadcast", flush=True)


# ---------------------------------------------------------------------------------------------
if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["sanitize", "triton-sim", "triton-aot", "correctness"])
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    if a.what == "triton-sim":
        triton_simulation()
    elif a.what == "triton-aot":
        sys.exit(triton_aot_check())
    elif a.what == "sanitize":
        run_workers("gpu_sanitize_worker", a.world, "nccl", timeout_s=1200)
        print("sanitize run: ok")
    else:
        run_workers("gpu_correctness_worker", a.world, "nccl", args=(True,))
        print("correctness (quick): ok")
