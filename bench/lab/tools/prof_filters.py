"""Per-kernel time breakdown of the top-k / top-p threshold path with torch.profiler.

    python bench/lab/tools/prof_filters.py [what,bs,n,V,dtype,mode[,nolist][,noexcl] ...]
        what: verify | sample      mode: top_p | top_k_top_p | temp
        nolist: with _NO_LEVEL_LIST_FOR_TESTING (the radix levels re-read every row: the A/B)
        noexcl: with _NO_LEVEL_EXCL_FOR_TESTING (level 0 of top-p rows histograms every key)
    e.g. verify,64,3,151936,fp32,top_p  sample,64,0,151936,bf16,top_p,nolist,noexcl

Prints, per config, the mean device time of every kernel launched by one call (10 calls),
grouped by kernel name (the 10 radix level launches of one call add up under level_kernel),
then every launch of one more call in order (which radix levels cost what).
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tokenspeed_kernel import ops
from tokenspeed_kernel.ops import sampling as osm
from tokenspeed_kernel.bench.verify import Problem
from tokenspeed_kernel.bench.verify_filters import filter_params, ours_call

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
cfgs = sys.argv[1:] or ["verify,64,3,151936,fp32,top_p", "verify,64,3,151936,bf16,top_k_top_p",
                        "verify,16,3,151936,fp32,top_p", "sample,64,0,151936,fp32,top_p"]
for c in cfgs:
    what, bs, n, V, dt, mode = c.split(",")[:6]
    knobs = c.split(",")[6:]
    osm._NO_LEVEL_LIST_FOR_TESTING = "nolist" in knobs
    osm._NO_LEVEL_EXCL_FOR_TESTING = "noexcl" in knobs
    bs, n, V = int(bs), int(n), int(V)
    dev = torch.device("cuda")
    if what == "verify":
        pb = Problem(bs, n, V, DT[dt], dev)
        pb.filt = filter_params(pb, mode)
        f = ours_call(mode, False)

        def call():
            return f(pb, pb.tgt, pb.drf)
    else:
        x = (torch.randn(bs, V, device=dev) * 3.0).to(DT[dt])
        seed = torch.arange(bs, device=dev, dtype=torch.int64)
        off = torch.zeros(bs, dtype=torch.int64, device=dev)
        kw = {"temperature": torch.full((bs,), 0.8, device=dev)}
        if "top_p" in mode:
            kw["top_p"] = torch.full((bs,), 0.9, device=dev)
        if "top_k" in mode:
            kw["top_k"] = torch.full((bs,), 50, device=dev, dtype=torch.int32)

        def call():
            return ops.sample(x, seed, off, backend="cuda", validate=False, **kw)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
    tot, lines = 0.0, []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t <= 0:
            continue
        tot += t / 10
        lines.append((t / 10, e.count // 10, e.key[:90]))
    print(f"== {c}: sum of kernel time per call {tot:.1f} us")
    for t, k, name in sorted(lines, reverse=True):
        print(f"   {t:9.1f} us  x{k}  {name}")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    seq = []
    for e in prof.events():
        t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0)
        if e.device_type.name == "CUDA" and t > 0:
            name = e.name.split("(")[0].split("::")[-1].split("<")[0]
            seq.append(f"{name}:{t:.0f}")
    print("   launches (us): " + " ".join(seq))
