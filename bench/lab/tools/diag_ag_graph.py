"""Bisects the all-gather graph hang seen on 2x H100 at 06b8476 (docs/COMM.md, open defect:
comm_helpers.gpu_graph_worker with 30 replays stuck in replay() / synchronize for > 80 s; its
eager warm-up passed bit-exact). Needs 2 GPUs and the compiled extension.
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


def worker(rank, world, backends, chain, replays, timeout_ms, dtype_name, eager_only,
           allreduce=True):
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
            for proto in ("ll", "flag"):
                ops.all_gather_hidden_out(comm, x, y1, protocol=proto, enable_pdl=True)
                ops.all_gather_hidden_out(comm, y1[:, offs[nxt]:offs[nxt + 1]], y2,
                                          protocol=proto, enable_pdl=True)
        counter.add_(1)

    t0 = time.time()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3 if not eager_only else replays):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
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
        if k % 10 == 9:
            torch.cuda.synchronize()
            print(f"[r{rank}] replay {k + 1} ok {time.time() - t0:.1f}s err={comm.error()}",
                  flush=True)
    torch.cuda.synchronize()
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
    "all-bf16-eager": (["cuda:ll", "cuda:flag", "cuda:ll+pdl", "cuda:flag+pdl", "triton"], True,
                       "bfloat16", True),
}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CONFIGS)
    for name in names:
        b, chain, dt, eager, *ar = CONFIGS[name]
        t0 = time.time()
        try:
            H.run_workers("diag_ag_graph:worker", 2, "nccl",
                          args=(b, chain, 30, 3000, dt, eager, *ar), timeout_s=45)
            print(f"== {name}: finished {time.time() - t0:.1f}s", flush=True)
        except Exception as e:
            print(f"== {name}: FAILED {time.time() - t0:.1f}s: {str(e)[:300]}", flush=True)
