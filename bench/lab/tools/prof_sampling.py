"""Per-kernel time breakdown of ops.sample with torch.profiler (eager, warm L2).

    python bench/lab/tools/prof_sampling.py [backend,mode,B,V,dtype ...]
        e.g. cuda,top_p,1,151936,fp32 triton,temp,1,151936,fp32 cuda,proc,64,151936,fp32
Modes are the bench's (greedy, temp, top_k, top_p, top_k_top_p, min_p, proc; proc = top-k +
top-p with the bench's processing inputs; mixed = even rows top-k 50 + top-p 0.9, odd rows off),
mixed_p (mixed with top-p 0.9 on the odd, top-k-off rows), top_p_flat (T = 1, top-p 0.95:
kept sets past the 512 candidates), top_p_one_flat (top-p with row 1 flat: one such row) and
min_p_flat (randn rows, T = 1, min-p 0.05: ~12k kept tokens per row). Prints, per config, the mean device time of every
kernel one call launches (20 calls) and the call's graph-replay time (mean of 200 back-to-back
replays, warm L2).
A config may end in ",f<flags>": the CUDA sampler's testing flags for its calls (e.g. ",f512" =
F_NO_SPLIT: small batches on the cluster launch), and ",l<flags>": its launch-policy bits instead
of the default (",l0": without F_SCAND_PROC / F_SCAND_BAND), to compare launches in one run.
PROF_ONCE=1: only six calls per config (for ncu: `--launch-skip 3 --launch-count 1` with a
`--kernel-name` filter profiles the fourth matching launch).
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tokenspeed_kernel import testing
from tokenspeed_kernel.bench.sampling import _ours_call, make_logits, make_params

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT = [f"{b},{m},{B},151936,fp32" for b in ("cuda", "triton")
           for m in ("temp", "top_k", "top_p", "min_p") for B in (1, 16)]
N = 20


def graph_us(fn, reps=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):      # back to back: the per-replay launch gap, not the event overhead
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def run(c):
    backend, mode, B, V, dt = c.split(",")[:5]
    B, V = int(B), int(V)
    dev = torch.device("cuda")
    x = make_logits(B, V, DT[dt], dev)
    P = make_params({"mixed_p": "mixed", "top_p_flat": "top_p", "top_p_one_flat": "top_p",
                     "min_p_flat": "min_p"}.get(mode, mode), B, dev, V=V)
    if mode == "mixed_p":   # the bench's mixed rows, the odd (top-k off) rows with top-p 0.9
        P.p[1::2] = 0.9
    if mode == "top_p_flat":   # kept sets of thousands of tokens on randn * 4 rows
        P.T.fill_(1.0)
        P.p.fill_(0.95)
    if mode == "min_p_flat":   # randn rows at T = 1, min-p 0.05: ~12k kept tokens per row
        x.mul_(0.25)
        P.T.fill_(1.0)
        P.mp.fill_(0.05)
    if mode == "top_p_one_flat":   # the bench's top-p rows, row 1 flat (one row past the 512)
        x[1] *= 0.02
    call = _ours_call(backend, proc=mode == "proc")
    for _ in range(3):
        call(x, P)
    torch.cuda.synchronize()
    if os.environ.get("PROF_ONCE"):    # for ncu: a few more calls, no torch profiler
        for _ in range(3):             # (ncu --launch-skip counts only the kernels it matches)
            call(x, P)
        torch.cuda.synchronize()
        return
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(N):
            call(x, P)
        torch.cuda.synchronize()
    tot, lines = 0.0, []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t <= 0:
            continue
        tot += t / N
        lines.append((t / N, e.count / N, e.key[:100]))
    try:
        g = graph_us(lambda: call(x, P))
    except Exception as ex:  # noqa: BLE001 - lab tool: report and go on
        g = float("nan")
        print(f"   graph failed: {type(ex).__name__}: {str(ex)[:120]}")
    print(f"== {c}: kernels {tot:.1f} us/call, graph replay (warm) {g:.1f} us", flush=True)
    for t, k, name in sorted(lines, reverse=True):
        print(f"   {t:8.1f} us  x{k:g}  {name}", flush=True)


for c in sys.argv[1:] or DEFAULT:
    rest = c.split(",")[5:]
    # the CUDA testing flags through the one door (tokenspeed_kernel.testing.knobs): ",f<bits>"
    # ORs bits into the default launch policy, ",l<bits>" replaces the policy (l0: without it)
    kn = {"sampler_flags": 0}
    for x in rest:
        kn[{"f": "sampler_flags", "l": "sampler_launch_flags"}[x[0]]] = int(x[1:])
    with testing.knobs(**kn):
        run(c)
    torch.cuda.empty_cache()   # run()'s tensors are gone
