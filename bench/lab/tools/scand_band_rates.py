"""How often would the split-candidates launch's band masses (opt-in F_SCAND_TOPP) need the exact
mass (cand_finish<kBand> returning -2: a candidate's prefix mass inside the band), and how often
is a top-p row undecided by its 512 candidates (-1: the finishing CTA's generic path)? The
reference's arithmetic on the CPU (no GPU needed), 300 rows per family: the bench's rows
(randn * 4) and a peaked family (40 boosted tokens over randn * 2).

    python bench/lab/tools/scand_band_rates.py [kBandRel]      (default 1.5e-5, as sampler.cuh)
"""
import sys
import numpy as np
import torch
sys.path.insert(0, "python")
from tokenspeed_kernel.reference import prims as P
V, K = 151936, 512
def rates(make, T, p, n=300, rel=float(sys.argv[1]) if len(sys.argv) > 1 else 1.5e-5, absu=8.0):
    amb = und = 0
    for i in range(n):
        z = make(i)
        zt = torch.tensor(z)
        zmax = zt.max()
        inv_t = torch.tensor(np.float32(1) / np.float32(T))
        y = P.centered(zt, zmax, inv_t)
        e = P.mass_fixed(y).to(torch.int64)
        S = int(e.sum())
        order = torch.argsort(zt, descending=True, stable=True)[:K]
        ec = e[order]
        before = torch.cumsum(ec, 0) - ec
        lo = int(np.floor(S * (1 - rel) - absu * V)); hi = int(np.ceil(S * (1 + rel) + absu * V))
        Plo = max(1, int(np.float64(np.float32(p)) * lo)); Phi = max(1, int(np.float64(np.float32(p)) * hi))
        if bool(((before >= Plo) & (before < Phi)).any()):
            amb += 1
        Pex = max(1, int(np.float64(np.float32(p)) * S))
        if bool(before[-1] < Pex):
            und += 1
    return amb / n, und / n
g = np.random.default_rng(0)
bench = lambda i: (g.standard_normal(V) * 4).astype(np.float32)
def peaked(i):
    z = (g.standard_normal(V) * 2).astype(np.float32)
    z[g.choice(V, 40, replace=False)] += g.uniform(6, 14, 40).astype(np.float32)
    return z
for name, mk, T, p in (("bench randn*4 T0.8 p0.9", bench, 0.8, 0.9),
                       ("bench randn*4 T1.0 p0.95", bench, 1.0, 0.95),
                       ("peaked T0.7 p0.9", peaked, 0.7, 0.9),
                       ("peaked T1.0 p0.95", peaked, 1.0, 0.95)):
    a, u = rates(mk, T, p)
    print(f"{name}: band needs the exact mass in {a:.1%} of rows; kept set past 512 candidates in {u:.1%}")
