"""Host time of eager ops.sample calls (the bench's inputs and call), per backend: 300 calls
without a synchronize (us per call), then cProfile of 300 more (top functions by own and by
cumulative time). Needs a GPU.

    python bench/lab/tools/host_prof_sampling.py triton,temp,1 triton,top_k_top_p,1 cuda,temp,1
"""
import cProfile
import pstats
import sys
import time

import torch

from tokenspeed_kernel.bench.sampling import _ours_call, make_logits, make_params

dev = torch.device("cuda")
for cfg in sys.argv[1:]:
    backend, mode, B = cfg.split(",")
    B = int(B)
    x = make_logits(B, 151936, torch.float32, dev)
    P = make_params(mode, B, dev, V=151936)
    call = _ours_call(backend, proc=mode == "proc")
    for _ in range(20):
        call(x, P)
    torch.cuda.synchronize()
    n = 300
    t0 = time.perf_counter()
    for _ in range(n):
        call(x, P)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"== {cfg}: host {1e6 * (t1 - t0) / n:.1f} us/call (no sync)")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        call(x, P)
    pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(22)
    st.sort_stats("cumulative").print_stats(30)
