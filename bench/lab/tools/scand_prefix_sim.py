"""CPU model of the split-candidates launch's forwarding for top-k-off top-p rows (numpy):
per row of randn(V) * 4 at T = 0.8, top-p 0.9 (the lab's mixed_p rows), for S CTAs per row of
1024 lanes: the kept-set size, the complete prefix the finishing CTA decides from by default
(keys >= the largest chunk bound, the bound being each chunk's 32nd-largest lane maximum), and
the keys >= the smallest bound (about what the opt-in F_SCAND_RESCAN collects). Lanes take
elements i % 1024 of the chunk (the kernel's 16-byte vectors differ; same statistics).

    python bench/lab/tools/scand_prefix_sim.py        (12 rows per S, a few minutes)
"""
import numpy as np

rng = np.random.default_rng(1)
V, T, P, NT, K = 151936, 0.8, 0.9, 1024, 512
for S in (4, 8, 16):
    rows = []
    for _ in range(12):
        z = rng.standard_normal(V).astype(np.float32) * 4
        y = z / T
        e = np.exp(y - y.max())
        cm = np.cumsum(e[np.argsort(-y)]) / e.sum()
        kept = int(np.searchsorted(cm, P) + 1)
        chunk = ((V + S - 1) // S + 7) // 8 * 8
        jn = min(32, (2 * K + S - 1) // S + 4)
        ths = []
        for q in range(S):
            c = z[q * chunk:min(V, (q + 1) * chunk)]
            c = np.concatenate([c, np.full((-len(c)) % NT, -np.inf)]).reshape(-1, NT)
            ths.append(np.sort(c.max(axis=0))[::-1][jn - 1])
        rows.append((kept, int((z >= max(ths)).sum()), int((z >= min(ths)).sum())))
    a = np.array(rows)
    print(f"S = {S:2d}: kept median {np.median(a[:, 0]):.0f} max {a[:, 0].max()}; prefix median "
          f"{np.median(a[:, 1]):.0f} min {a[:, 1].min()}; keys >= smallest bound median "
          f"{np.median(a[:, 2]):.0f}; rows the prefix decides {np.mean(a[:, 0] < a[:, 1]):.2f}")
