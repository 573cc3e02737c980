"""Tuning sweep of the CUDA all-gather push kernels on >= 2 GPUs (not part of the bench grid).

Times, with the bench's method (bench/comm.py: graph replay of N back-to-back calls, ranks
aligned by an NCCL all-reduce, max over ranks, every output checked bit-exact first), a list of
providers -- ``ll`` (the library's packing by size, ``ops.comm.ll_packing``), ``ll-w6`` /
``ll-w4`` / ``ll-w4pair`` (forced: 6-byte packets; 4-byte packets in planes; 4-byte packets with a
vector's units side by side, the first LL kernel), ``flag`` (what the library launches: the pipelined kernel above two rounds
per CTA), ``flag-nopipe`` (the testing knob: the unpipelined kernel), ``view``
(``all_gather_hidden_view``: no copy-out, so the push's own cost), and any of them with a
``-pdl`` suffix (launched with ``enable_pdl=True``; e.g. ``ll-w4-pdl``) -- for a list of
``block_bytes`` values (grid = ceil(slice bytes / block_bytes), capped by the SM count),
plus ``nccl`` (NCCL + permute, at the first block size) and a launch floor (N back-to-back
1-element kernels in one graph). Writes ``<out>/comm_sweep.csv`` and prints one line per shape.
Results used for the defaults: bench/results/h200/comm_sweep_*.csv (docs/COMM.md).

    python bench/lab/tools/comm_sweep.py --out DIR [--block-bytes 2048,4096,...] [--providers ll,flag,...]
                               [--shapes "bf16:151936:32,128;fp32:151936:128"] [--quick]
                               [--nproc 4]
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python"))

SHAPES = [("bf16", 7168, [1, 8, 32, 128, 512]), ("bf16", 151936, [1, 8, 32, 128]),
          ("fp32", 151936, [1, 32, 128])]
DT = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _worker(rank, world, port, opts, rcs):
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    try:
        _run(rank, world, opts)
        rcs[rank] = 0
    finally:
        dist.destroy_process_group()


def _run(rank, world, opts):
    import torch.distributed as dist
    from tokenspeed_kernel.bench.comm import NVLINK_GBPS, time_provider, bench_input
    from tokenspeed_kernel.ops import comm as oc
    from tokenspeed_kernel.reference import comm as ref
    dev = torch.device("cuda", rank)
    align = torch.zeros(1, device=dev)
    rows = []
    say = (lambda *a: print("[sweep]", *a, flush=True)) if rank == 0 else (lambda *a: None)
    # launch floor: N dependent 1-element kernels in one graph
    z = torch.zeros(1, device=dev)
    res = time_provider([lambda: z.add_(1)] * 32, opts["reps"], dev, align, graph=True)
    fl = sorted(res["graph"])[len(res["graph"]) // 2]
    say(f"launch floor (graph, 1-element add): {fl:.2f} us per kernel")
    rows.append(dict(dtype="-", H=0, T=0, block_bytes=0, provider="launch-floor", us=fl,
                     blocks=1))
    for dtname, H, ts in opts["shapes"]:
        dtype = DT[dtname]
        ts = [t for t in ts if not opts["quick"] or t in (1, 32, 128)]
        for bb in opts["block_bytes"]:
            comm = oc.create_all_gather_comm(max_tokens=max(ts), max_total_width=H, dtype=dtype,
                                             ll_max_bytes=1 << 40, block_bytes=bb,
                                             enable_view="view" in opts["providers"])
            w = H // world
            for T in ts:
                x, it = bench_input(T, w, H, rank, dtype, dev)
                want = ref.all_gather_hidden_dist(x, comm.group)
                provs = opts["providers"] + (
                    ["nccl"] if bb == opts["block_bytes"][0] else [])
                line = []
                for prov in provs:
                    if prov.split("-")[0] == "ll" and T * H * x.element_size() > 8 << 20:
                        continue
                    backend = "nccl" if prov == "nccl" else "cuda"
                    proto, _, knob = prov.partition("-")
                    proto = "auto" if prov == "nccl" else proto

                    def call(o, be=backend, pr=proto, kn=set(knob.split("-"))):
                        oc._UNPIPELINED_FLAG_KERNEL_FOR_TESTING = "nopipe" in kn
                        oc._LL_VARIANT_FOR_TESTING = next(
                            (v for v in ("w6", "w4", "w4pair") if v in kn), None)
                        try:
                            if pr == "view":  # no copy-out (copied here only for the check)
                                v = oc.all_gather_hidden_view(comm, x, enable_pdl="pdl" in kn)
                                if o is check_out:
                                    o.copy_(v)
                            else:
                                oc.all_gather_hidden_out(comm, x, o, backend=be, protocol=pr,
                                                         enable_pdl="pdl" in kn)
                        finally:
                            oc._UNPIPELINED_FLAG_KERNEL_FOR_TESTING = False
                            oc._LL_VARIANT_FOR_TESTING = None
                    o = check_out = torch.empty((T, H), dtype=dtype, device=dev)
                    call(o)
                    torch.cuda.synchronize()
                    ok = torch.equal(o.view(it), want.view(it))
                    okt = torch.tensor([1.0 if ok else 0.0], device=dev)
                    dist.all_reduce(okt, op=dist.ReduceOp.MIN)
                    if okt.item() < 1:
                        say(f"FAILED {prov} {dtname} H={H} T={T} bb={bb}")
                        rows.append(dict(dtype=dtname, H=H, T=T, block_bytes=bb, provider=prov,
                                         us="FAILED", blocks=""))
                        continue
                    floor = T * H * x.element_size() * (world - 1) / world / (NVLINK_GBPS * 1e3)
                    n = max(1, min(32, int(200.0 / max(1.0, floor * 2 + 8.0))))
                    outs = [torch.empty((T, H), dtype=dtype, device=dev) for _ in range(n)]
                    fns = [(lambda o=o: call(o)) for o in outs]
                    # the knob is read at capture time: capture inside the toggled state
                    r = time_provider(fns, opts["reps"], dev, align, graph=True)
                    med = sorted(r["graph"])[len(r["graph"]) // 2]
                    nb = oc._num_blocks(comm, T, [w] * world)
                    rows.append(dict(dtype=dtname, H=H, T=T, block_bytes=bb, provider=prov,
                                     us=round(med, 2), blocks=nb))
                    line.append(f"{prov}={med:.2f}")
                say(f"{dtname} H={H} T={T} bb={bb} blocks={oc._num_blocks(comm, T, [w] * world)}: "
                    + " ".join(line))
            comm.check()
            comm.close()
    if rank == 0:
        out = Path(opts["out"])
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "comm_sweep.csv", "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            wr.writeheader()
            wr.writerows(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="comm_sweep")
    ap.add_argument("--block-bytes", default="4096")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--providers", default="ll,flag,flag-nopipe")
    ap.add_argument("--shapes", default="", help="e.g. bf16:151936:32,128;fp32:151936:128")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks (GPUs of this host), default 2; e.g. 4 / 8 for the crossovers of "
                         "larger groups (DEFAULT_LL_MAX_BYTES_MULTI)")
    a = ap.parse_args()
    import torch.multiprocessing as mp
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    world = min(torch.cuda.device_count(), a.nproc)
    if world < 2:
        print("comm_sweep: needs >= 2 GPUs", file=sys.stderr)
        return 1
    opts = dict(out=a.out, block_bytes=[int(v) for v in a.block_bytes.split(",")],
                reps=a.reps, quick=a.quick, providers=a.providers.split(","),
                shapes=[(d, int(h), [int(t) for t in ts.split(",")])
                        for d, h, ts in (x.split(":") for x in a.shapes.split(";") if x)]
                or SHAPES)
    rcs = mp.Manager().dict()
    mp.spawn(_worker, args=(world, port, opts, rcs), nprocs=world, join=True)
    return 0 if all(rcs.get(r) == 0 for r in range(world)) else 1


if __name__ == "__main__":
    sys.exit(main())
