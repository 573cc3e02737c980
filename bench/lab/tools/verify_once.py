"""Run ops.verify (CUDA, probabilistic, temperature only) on the bench's inputs, for external
profilers (ncu / compute-sanitizer):

    ncu --clock-control none -k regex:verify_ --launch-skip 12 --launch-count 4 \
        python bench/lab/tools/verify_once.py 256,3,151936,fp32 [calls]

3 warm-up calls, then `calls` (default 2) more, each followed by a synchronize.
"""
import sys

import torch

from tokenspeed_kernel.bench.verify import Problem, ours_call

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
bs, n, V, dt = sys.argv[1].split(",")
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 2
pb = Problem(int(bs), int(n), int(V), DT[dt], torch.device("cuda"))
call = ours_call("cuda")
for _ in range(3 + calls):
    out = call(pb, pb.tgt, pb.drf)
    torch.cuda.synchronize()
print("accepted mean", out.num_accepted.float().mean().item())
