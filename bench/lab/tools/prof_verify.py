"""Per-kernel time breakdown of ops.verify (probabilistic, temperature only) with torch.profiler.

    python bench/lab/tools/prof_verify.py [bs,n,V,dtype ...]      e.g. 16,3,151936,fp32 256,8,151936,bf16
Prints, per config, the mean device time of every kernel launched by one call (10 calls).
PROF_BACKEND=triton profiles the Triton backend (default cuda).
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tokenspeed_kernel.bench.verify import Problem, ours_call

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
cfgs = sys.argv[1:] or ["16,3,151936,fp32", "256,8,151936,fp32", "1,3,151936,fp32",
                        "64,3,151936,bf16"]
for c in cfgs:
    bs, n, V, dt = c.split(",")
    pb = Problem(int(bs), int(n), int(V), DT[dt], torch.device("cuda"))
    call = ours_call(os.environ.get("PROF_BACKEND", "cuda"))
    for _ in range(3):
        call(pb, pb.tgt, pb.drf)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call(pb, pb.tgt, pb.drf)
        torch.cuda.synchronize()
    tot = 0.0
    lines = []
    for e in prof.key_averages():
        if e.device_type.name != "CUDA" and getattr(e, "self_device_time_total", 0) == 0:
            continue
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t <= 0:
            continue
        tot += t / 10
        lines.append((t / 10, e.count // 10, e.key[:90]))
    floor = pb.bytes / 4.3e6
    print(f"== {c}: sum of kernel time per call {tot:.1f} us (HBM floor {floor:.1f} us)")
    for t, k, name in sorted(lines, reverse=True):
        print(f"   {t:9.1f} us  x{k}  {name}")
    del pb
    torch.cuda.empty_cache()
