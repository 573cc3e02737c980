"""Quick GPU check of the CUDA sampler: token identity vs the reference (run on the GPU) for every
mode and dtype, then a few CUDA-graph timings. Usage: python bench/lab/tools/gpu_smoke.py"""
import sys
import time

import torch

from tokenspeed_kernel import ops
from tokenspeed_kernel.reference import sampling as ref

torch.manual_seed(0)
dev = "cuda"
MODES = {
    "greedy": dict(temperature=0.0),
    "temp": dict(temperature=0.8),
    "topk50": dict(temperature=0.8, top_k=50),
    "topp0.9": dict(temperature=0.8, top_p=0.9),
    "topk50_topp0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
    "minp0.1": dict(temperature=0.8, min_p=0.1),
    "topk1000": dict(temperature=1.0, top_k=1000),
    "topk1000_topp0.5": dict(temperature=1.0, top_k=1000, top_p=0.5),
    "topk5_minp0.5": dict(temperature=1.0, top_k=5, min_p=0.5),
    "all": dict(temperature=0.7, top_k=100, top_p=0.8, min_p=0.05),
    "topk1": dict(temperature=1.0, top_k=1),
    "topk250": dict(temperature=1.0, top_k=250),
}


def params(B, mode):
    kw = {}
    for k, v in MODES[mode].items():
        dt = torch.int32 if k == "top_k" else torch.float32
        kw[k] = torch.full((B,), v, dtype=dt, device=dev)
    return kw


def check(B, V, dtype, mode, scale=3.0):
    logits = (torch.randn(B, V, device=dev) * scale).to(dtype)
    seed = torch.randint(0, 2**62, (B,), device=dev)
    offset = torch.randint(0, 2**40, (B,), device=dev)
    kw = params(B, mode)
    a = ops.sample_with_logprobs(logits, seed, offset, backend="cuda", **kw)
    t, v, lp, plp = ref.sample(logits, seed, offset, kw.get("temperature"), kw.get("top_k"),
                               kw.get("top_p"), kw.get("min_p"))
    mism = (a.tokens != t).sum().item()
    lperr = (a.logprobs - lp).abs().max().item()
    plperr = (a.processed_logprobs - plp).abs().max().item()
    ok = mism == 0 and bool(a.valid.all()) and lperr < 1e-3 and plperr < 1e-3
    print(f"{'OK ' if ok else 'BAD'} B={B:4d} V={V:6d} {str(dtype):15s} {mode:18s} mismatches={mism} "
          f"lp_err={lperr:.2e} plp_err={plperr:.2e}", flush=True)
    return ok


def timeit(B, V, dtype, mode, n=50):
    logits = (torch.randn(B, V, device=dev) * 3).to(dtype)
    seed = torch.arange(B, device=dev)
    offset = torch.zeros(B, dtype=torch.int64, device=dev)
    kw = params(B, mode)
    ops.sample(logits, seed, offset, backend="cuda", **kw)
    tkm = 256 if "topk" in mode else None
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        ops.sample(logits, seed, offset, backend="cuda", top_k_max=tkm, validate=False, **kw)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            ops.sample(logits, seed, offset, backend="cuda", top_k_max=tkm, validate=False, **kw)
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000 / n)
    ts.sort()
    floor = B * V * logits.element_size() / 4.3e12 * 1e6
    print(f"time B={B:4d} V={V} {str(dtype):15s} {mode:18s} {ts[2]:8.2f} us (floor {floor:.2f}, hot L2)",
          flush=True)


if __name__ == "__main__":
    allok = True
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for mode in [m for m in MODES if m not in ("topk1", "topk250")]:
            for B, V in ((1, 151936), (7, 32000), (64, 111), (33, 50000)):
                allok &= check(B, V, dtype, mode)
    # NaN row handling
    x = torch.randn(4, 1000, device=dev)
    x[1, 5] = float("nan"); x[2] = float("-inf"); x[3, 7] = float("inf")
    o = ops.sample(x, torch.arange(4, device=dev), torch.zeros(4, dtype=torch.int64, device=dev),
                   temperature=torch.full((4,), 0.8, device=dev), backend="cuda")
    print("nan rows valid:", o.valid.tolist(), "tokens:", o.tokens.tolist())
    allok &= o.valid.tolist() == [True, False, False, False]
    import os
    tmodes = os.environ.get("SMOKE_MODES", "temp,topk50_topp0.9,topp0.9,minp0.1,greedy").split(",")
    for mode in tmodes:
        for B in (1, 16, 64, 256):
            timeit(B, 151936, torch.float32, mode)
    print("SMOKE", "PASSED" if allok else "FAILED")
    sys.exit(0 if allok else 1)
