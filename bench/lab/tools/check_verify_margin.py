"""Measure the two accuracy facts the CUDA verify kernel's coin margin relies on
(csrc/verify/online.cuh, coin_margin):

* soft_exp_neg(y) vs exp(y): max relative error over every float32 y in [-27, -2^-24]
  (CPU, ~20 s; the margin budgets 2^-23);
* ex2.approx.ftz.f32 (the PTX instruction the fast path sums with) vs 2^x: max relative error
  over every float32 x in [-126, 0] (GPU only, through Triton inline PTX; the margin budgets
  2^-20 per call).

Exit status 1 if a measured error exceeds its budget.  Usage: python bench/lab/tools/check_verify_margin.py
"""
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
from tokenspeed_kernel.reference.prims import soft_exp_neg  # noqa: E402

BUDGET_SOFT_EXP = 2.0 ** -23
BUDGET_EX2 = 2.0 ** -20


def f32_bits(x: float) -> int:
    return torch.tensor([x], dtype=torch.float32).view(torch.int32).item()


def check_soft_exp() -> float:
    t0 = time.time()
    worst, wy = 0.0, None
    lo, hi = f32_bits(2.0 ** -24), f32_bits(27.0)
    step = 1 << 24
    for b in range(lo, hi + 1, step):
        y = -torch.arange(b, min(b + step, hi + 1), dtype=torch.int32).view(torch.float32)
        ex = torch.exp(y.double())
        r = ((soft_exp_neg(y).double() - ex) / ex).abs()
        m, k = r.max(0)
        if m.item() > worst:
            worst, wy = m.item(), y[k].item()
    print(f"soft_exp_neg: max relative error {worst:.3e} = 2^{math.log2(worst):.2f} at y = {wy} "
          f"(budget 2^{math.log2(BUDGET_SOFT_EXP):.0f}; {time.time() - t0:.0f} s)")
    return worst


def check_ex2() -> dict:
    import triton
    import triton.language as tl

    @triton.jit
    def k(out, base, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        off = pid * BLOCK + tl.arange(0, BLOCK)
        m = off < n
        bits = (base + off).to(tl.int32) | -2147483648          # sign bit: x <= 0
        x = bits.to(tl.float32, bitcast=True)
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
        ref = tl.math.exp2(x.to(tl.float64))
        r = tl.abs(y.to(tl.float64) - ref) / ref
        r = tl.where(m, r, 0.0)
        tl.store(out + pid, tl.max(r, 0))

    res = {}
    for lim in (40.0, 126.0):
        n_all = f32_bits(lim) + 1
        BLOCK = 4096
        chunk = 1 << 28
        worst = 0.0
        for base in range(0, n_all, chunk):
            n = min(chunk, n_all - base)
            out = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float64, device="cuda")
            k[(out.numel(),)](out, base, n, BLOCK=BLOCK)
            worst = max(worst, out.max().item())
        res[lim] = worst
        print(f"ex2.approx.ftz.f32 on {torch.cuda.get_device_name()}: max relative error over "
              f"x in [-{lim:g}, 0]: {worst:.3e} = 2^{math.log2(worst):.2f} "
              f"(budget 2^{math.log2(BUDGET_EX2):.0f})")
    return res


def main() -> int:
    ok = check_soft_exp() <= BUDGET_SOFT_EXP
    if torch.cuda.is_available():
        ok = check_ex2()[126.0] <= BUDGET_EX2 and ok
    else:
        print("ex2.approx.ftz.f32: no CUDA GPU here, not measured")
    print("OK" if ok else "FAILED: an error exceeds its budget")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
