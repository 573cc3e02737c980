"""Bisected the all-gather graph hang seen on 2x H100 at 06b8476 (comm_helpers.gpu_graph_worker
with 30 replays stuck in replay() / synchronize for > 80 s; its eager warm-up passed bit-exact).
Found with it: a Triton call followed by CUDA calls failed in graph replay; the Triton kernel's
per-thread header poll split its wait loop across warps (fixed in a67bdd3, triton/_spin.py).
Needs 2 GPUs and the compiled extension.
Each config runs the graph worker's step with a subset of backends, with / without the PDL chain,
with a short bounded wait (timeout_ms) so that a bounded-wait failure shows up as CommError in
seconds; a config that outlives its limit is an unbounded hang.

  PYTHONPATH=python:tests:bench/lab/tools python3 -u bench/lab/tools/diag_ag_graph.py   # all
  PYTHONPATH=python:tests:bench/lab/tools python3 -u bench/lab/tools/diag_ag_graph.py cuda:ll
"""
import sys
import time

import torch
import torch.distributed as dist

import comm_helpers as H


_SIDE = {}


def _snapshot(rank, comm, tag, t0):
    """Device state read on a side stream while the main stream may be stuck: seq / err / done
    words and, for blocks 0..3, the CUDA data flags, Triton flags and both header parities."""
    import threading
    from tokenspeed_kernel.ops import comm as oc
    dev = comm.state.device
    if rank not in _SIDE:
        _SIDE[rank] = torch.cuda.Stream(device=dev)
    side = _SIDE[rank]
    R = oc.READY_OFFSET
    words = comm.symm[:oc.FLAG_BYTES].view(torch.int64)
    ll0 = oc.FLAG_BYTES + comm.ll_off
    llr = comm.symm[ll0:ll0 + 2 * comm.ll_bytes].view(torch.int64)
    res = {}

    def grab():
        with torch.cuda.stream(side):
            st = comm.state.to("cpu", non_blocking=True)
            fl = words.to("cpu", non_blocking=True)
            ll = llr.to("cpu", non_blocking=True)
        side.synchronize()
        res["st"], res["fl"], res["ll"] = st, fl, ll

    th = threading.Thread(target=grab, daemon=True)
    th.start()
    th.join(5.0)
    if "st" not in res:
        print(f"[r{rank}] {tag}: side-stream snapshot did not finish in 5 s", flush=True)
        return
    st, fl = res["st"].tolist(), res["fl"].view(-1)
    w = comm.world_size
    lines = [f"[r{rank}] {tag} t={time.time() - t0:.1f}s state={st[:12]}"]
    for b in range(4):
        cu = [hex(int(fl[b * oc.MAX_RANKS + s_])) for s_ in range(w)]
        tr = [int(fl[oc.TRITON_FLAG_OFFSET + b * oc.MAX_RANKS + s_]) for s_ in range(w)]
        hd = [[hex(int(fl[oc.HEADER_OFFSET + par * R + b * oc.MAX_RANKS + s_]) & (2**64 - 1))
               for s_ in range(w)] for par in (0, 1)]
        lines.append(f"    b{b}: cuda={cu} triton={tr} hdr0={hd[0]} hdr1={hd[1]}")
    ll = res["ll"].view(2, -1, 2)  # [parity][16-byte unit][2 words]
    for par in (0, 1):
        nz = (ll[par] != 0).any(dim=1).nonzero().view(-1)
        first = [(int(u), hex(int(ll[par, u, 0]) & (2**64 - 1)), hex(int(ll[par, u, 1]) & (2**64 - 1)))
                 for u in nz[:3].tolist()]
        lines.append(f"    LL parity {par}: {nz.numel()} nonzero units; first {first}")
    print("\n".join(lines), flush=True)


def watch(rank, comm, tag, t0, stall_s=6.0, limit_s=20.0):
    """Waits for the current stream; after stall_s without completion, snapshots the device
    state (side stream) every few seconds; gives up (raises) after limit_s."""
    ev = torch.cuda.Event()
    ev.record()
    t1 = time.time()
    snaps = 0
    while not ev.query():
        time.sleep(0.002)
        el = time.time() - t1
        if el > stall_s * (snaps + 1):
            _snapshot(rank, comm, f"STALL at {tag} after {el:.1f}s", t0)
            snaps += 1
        if el > limit_s:
            raise RuntimeError(f"[r{rank}] stuck at {tag} for {el:.0f}s")
    if tag in ("init", "eager", "final"):
        _snapshot(rank, comm, tag, t0)


def worker(rank, world, backends, chain, replays, timeout_ms, dtype_name, eager_only,
           allreduce=True, opts=None):
    opts = opts or {}
    chain_pdl = opts.get("chain_pdl", True)
    chain_protos = opts.get("chain_protos", ("ll", "flag"))
    from tokenspeed_kernel import ops
    from tokenspeed_kernel.ops import comm as oc
    dev = torch.device("cuda", rank)
    dtype = getattr(torch, dtype_name)
    ws = [3584] * world if dtype == torch.bfloat16 else H.uneven_widths(world, 8, 4096)
    comm = oc.create_all_gather_comm(max_tokens=16, max_total_width=sum(ws), dtype=dtype,
                                     ll_max_bytes=1 << 40, timeout_ms=timeout_ms)
    rows, Ht = 8, sum(ws)
    offs = [0]
    for v in ws:
        offs.append(offs[-1] + v)
    it = H.int_view_dtype(dtype)
    x = torch.zeros((rows, ws[rank]), dtype=dtype, device=dev)
    outs = {b: torch.zeros((rows, Ht), dtype=dtype, device=dev) for b in backends}
    counter = torch.zeros((), dtype=torch.int64, device=dev)
    mism = torch.zeros((), dtype=torch.int64, device=dev)
    red = torch.zeros(4, dtype=torch.float32, device=dev)
    idx = {s: torch.arange(rows * ws[s], device=dev, dtype=torch.int64).view(rows, ws[s])
           for s in range(world)}
    chain = chain and len(set(ws)) == 1
    y1 = torch.zeros((rows, Ht), dtype=dtype, device=dev)
    y2 = torch.zeros((rows, Ht), dtype=dtype, device=dev)
    nxt = (rank + 1) % world

    def step():
        x.view(it).copy_(H._gen_bits(idx[rank], counter, rank, it))
        for b in backends:
            ops.all_gather_hidden_out(comm, x, outs[b], widths=ws, **H.bp(b))
            if allreduce:
                red.fill_(1.0)
                dist.all_reduce(red, group=comm.group)
            o = outs[b].view(it)
            for s in range(world):
                mism.add_((o[:, offs[s]:offs[s + 1]] != H._gen_bits(idx[s], counter, s, it)).sum())
        if chain:
            for proto in chain_protos:
                ops.all_gather_hidden_out(comm, x, y1, protocol=proto, enable_pdl=chain_pdl)
                ops.all_gather_hidden_out(comm, y1[:, offs[nxt]:offs[nxt + 1]], y2,
                                          protocol=proto, enable_pdl=chain_pdl)
        counter.add_(1)

    t0 = time.time()
    watch(rank, comm, "init", t0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3 if not eager_only else replays):
            step()
    torch.cuda.current_stream().wait_stream(s)
    watch(rank, comm, "eager", t0)
    err = comm.error()
    print(f"[r{rank}] eager ok {time.time() - t0:.1f}s mism={int(mism.item())} err={err}",
          flush=True)
    if eager_only or err:
        comm.close()
        return
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    torch.cuda.synchronize()
    for k in range(replays):
        g.replay()
        if k < 3 or k % 10 == 9:
            watch(rank, comm, f"replay {k + 1}", t0)
    watch(rank, comm, "final", t0)
    print(f"[r{rank}] done mism={int(mism.item())} err={comm.error()} {time.time() - t0:.1f}s",
          flush=True)
    del g
    comm.close()


CONFIGS = {  # name: (backends, chain, dtype, eager_only[, allreduce])
    "all-bf16-no-nccl": (["cuda:ll", "cuda:flag", "cuda:ll+pdl", "cuda:flag+pdl", "triton"], True,
                         "bfloat16", False, False),
    "cuda:flag-no-nccl": (["cuda:flag"], False, "bfloat16", False, False),
    "cuda:ll": (["cuda:ll"], False, "bfloat16", False),
    "cuda:flag": (["cuda:flag"], False, "bfloat16", False),
    "cuda:ll+pdl": (["cuda:ll+pdl"], False, "bfloat16", False),
    "cuda:flag+pdl": (["cuda:flag+pdl"], False, "bfloat16", False),
    "triton": (["triton"], False, "bfloat16", False),
    "chain": ([], True, "bfloat16", False),
    "all-bf16": (["cuda:ll", "cuda:flag", "cuda:ll+pdl", "cuda:flag+pdl", "triton"], True,
                 "bfloat16", False),
    "all-fp32": (["cuda:ll", "cuda:flag", "cuda:ll+pdl", "cuda:flag+pdl", "triton"], False,
                 "float32", False),
    "triton+chain": (["triton"], True, "bfloat16", False, False),
    "ll+chain": (["cuda:ll"], True, "bfloat16", False, False),
    "flagpdl+chain": (["cuda:flag+pdl"], True, "bfloat16", False, False),
    "triton+chain-nopdl": (["triton"], True, "bfloat16", False, False, {"chain_pdl": False}),
    "triton+chainll": (["triton"], True, "bfloat16", False, False, {"chain_protos": ("ll",)}),
    "triton+chainflag": (["triton"], True, "bfloat16", False, False,
                         {"chain_protos": ("flag",)}),
    "all-bf16-no-nccl-nopdl": (["cuda:ll", "cuda:flag", "cuda:ll+pdl", "cuda:flag+pdl", "triton"],
                               True, "bfloat16", False, False, {"chain_pdl": False}),
    "all-bf16-eager": (["cuda:ll", "cuda:flag", "cuda:ll+pdl", "cuda:flag+pdl", "triton"], True,
                       "bfloat16", True),
}

if __name__ == "__main__":
    order = ["triton+chain", "ll+chain", "flagpdl+chain", "triton+chain-nopdl", "triton+chainll",
             "triton+chainflag", "all-bf16-no-nccl-nopdl", "all-bf16-no-nccl"]
    names = sys.argv[1:] or order
    for name in names:
        b, chain, dt, eager, *ar = CONFIGS[name]
        if len(ar) == 1:
            ar = ar + [None]
        t0 = time.time()
        try:
            H.run_workers("diag_ag_graph:worker", 2, "nccl",
                          args=(b, chain, 30, 3000, dt, eager, *ar), timeout_s=float(__import__('os').environ.get('DIAG_TIMEOUT', '40')))
            print(f"== {name}: finished {time.time() - t0:.1f}s", flush=True)
        except Exception as e:
            print(f"== {name}: FAILED {time.time() - t0:.1f}s: {str(e)[:300]}", flush=True)
