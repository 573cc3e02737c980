"""One probabilistic verify call (after a warm-up call) for Nsight Compute:

    ncu -k regex:verify_ --launch-skip 3 --launch-count 3 python bench/lab/tools/ncu_verify.py 16,3,151936,fp32
"""
import sys

import torch

from tokenspeed_kernel.bench.verify import Problem, ours_call

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
bs, n, V, dt = sys.argv[1].split(",")
pb = Problem(int(bs), int(n), int(V), DT[dt], torch.device("cuda"))
call = ours_call("cuda")
torch.cuda.synchronize()
for _ in range(2):
    call(pb, pb.tgt, pb.drf)
torch.cuda.synchronize()
