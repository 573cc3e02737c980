"""Lab check of the s18_hist_band patch's bound (CPU, the reference's arithmetic): for every
float32 y in [-87, -16] tested (a dense sweep and the ends), the exact mass e = mass_fixed(y)
(trunc(soft_exp(y) 2^38)) and the approximate f = ex2.approx(fl32(y * fl32(log2 e))) 2^38, with
the hardware ex2.approx modelled as the exact 2^x times (1 +- 2^-22) (PTX ISA: max relative error
2^-22.5 for .ftz.f32 on sm_90; the model is the worst case of either sign), satisfy
    f (1 - 2^-16) - 1 <= e <= f (1 + 2^-16) + 1,
the per-token form of the band [tl (1 - 2^-16) - V - 1, tl (1 + 2^-16) + 2] on the tail's sum.
Prints the largest relative gap seen against the margin 2^-16.

    PYTHONPATH=python python3 bench/lab/tools/hist_band_bound.py
"""
import numpy as np
import torch

from tokenspeed_kernel.reference import prims

ys = np.concatenate([np.linspace(-87.0, -16.0, 4_000_001, dtype=np.float64),
                     np.array([-16.0, -16.000002, -87.0, -86.99999, -26.34, -26.35, -64.0, -63.9999])])
y32 = torch.tensor(ys.astype(np.float32))
y32 = y32[y32 <= -16.0]
e = prims.mass_fixed(y32).to(torch.float64)
x = (y32 * torch.tensor(1.4426950408889634, dtype=torch.float32)).to(torch.float64)  # fl32 product
ex = torch.exp2(x)
worst = 0.0
for sgn in (-1.0, 1.0):
    f = ex * (1.0 + sgn * 2.0 ** -22) * 2.0 ** 38
    lo_ok = (e >= f * (1 - 2.0 ** -16) - 1).all().item()
    hi_ok = (e <= f * (1 + 2.0 ** -16) + 1).all().item()
    rel = ((e - f).abs() - 1).clamp(min=0) / f.clamp(min=1e-300)
    worst = max(worst, rel.max().item())
    print(f"sign {sgn:+.0f}: lower bound holds {lo_ok}, upper bound holds {hi_ok}")
print(f"largest relative gap beyond the truncation: {worst:.3e} (margin 2^-16 = {2.0 ** -16:.3e}); "
      f"{y32.numel()} values of y")
