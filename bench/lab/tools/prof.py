"""One configuration for ncu: python bench/lab/tools/prof.py MODE B [V] [dtype]"""
import sys
import torch
from tokenspeed_kernel import ops
sys.path.insert(0, "bench/lab/tools")
from gpu_smoke import params  # noqa: E402

mode, B = sys.argv[1], int(sys.argv[2])
V = int(sys.argv[3]) if len(sys.argv) > 3 else 151936
dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[4] if len(sys.argv) > 4 else "fp32"]
x = (torch.randn(B, V, device="cuda") * 4).to(dt)
kw = params(B, mode)
seed = torch.arange(B, device="cuda"); off = torch.zeros(B, dtype=torch.int64, device="cuda")
for _ in range(3):
    ops.sample(x, seed, off, backend="cuda", validate=False, top_k_max=256 if "topk" in mode else None, **kw)
torch.cuda.synchronize()
