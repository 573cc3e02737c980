"""CPU model of the split-candidates launch's forwarding for rows with K candidates (top-p rows
without top-k: K = 512): per CTA (chunk of the row, 1024 threads, 16-byte vectors of 4 fp32
elements, thread t owns vectors t, t + 1024, ...), each thread's two largest keys and the
largest it evicted; th = the jn-th largest of the threads' largest keys; forwarded = thread keys
>= th; incomplete = an evicted key >= th or more than FC forwarded. Finisher: t = K-th largest of
U; chunks with th > t or incomplete are read again (rescans); nU < K with offending chunks ->
generic. Keys here are the values (ties negligible for randn). CPU only:

    python bench/lab/tools/scand_forward_sim.py [K]      (default 512; 50 = top-k 50)
"""
import sys
import numpy as np
V = 151936
def sim(S, K, z):
    chunk = ((V + S - 1) // S + 7) // 8 * 8
    FC = min(4096 // S, 2048)
    jn = min(32, (2 * K + S - 1) // S + 4)
    U, ths, inc = [], [], []
    for q in range(S):
        c0, c1 = q * chunk, min(V, (q + 1) * chunk)
        seg = np.full(((c1 - c0 + 4095) // 4096) * 4096, -np.inf)
        seg[: c1 - c0] = z[c0:c1]
        # vectors of 4, thread t owns vector t + 1024 m: reshape to [m, 1024, 4]
        v = seg.reshape(-1, 1024, 4).transpose(1, 0, 2).reshape(1024, -1)
        srt = -np.sort(-v, axis=1)
        k1, k2 = srt[:, 0], srt[:, 1] if srt.shape[1] > 1 else np.full(1024, -np.inf)
        kd = srt[:, 2] if srt.shape[1] > 2 else np.full(1024, -np.inf)
        th = -np.sort(-k1)[jn - 1]
        fw = np.concatenate([k1[k1 >= th], k2[k2 >= th]])
        incomplete = (kd >= th).any() or len(fw) > FC
        U.append(fw[:FC]); ths.append(th); inc.append(incomplete)
    U = np.concatenate(U)
    nU = len(U)
    t = -np.sort(-U)[K - 1] if nU >= K else -np.inf
    off = sum(1 for q in range(S) if inc[q] or (ths[q] > t if nU >= K else True))
    return nU, off, off > 0 and nU < K
g = np.random.default_rng(0)
K = int(sys.argv[1]) if len(sys.argv) > 1 else 512
for S in (132, 66, 44, 33, 26, 22, 16, 8):
    res = [sim(S, K, (g.standard_normal(V) * 4).astype(np.float32)) for _ in range(20)]
    nU = np.mean([r[0] for r in res]); off = np.mean([r[1] for r in res]); gen = np.mean([r[2] for r in res])
    print(f"S={S:3d} (B={132 // S:2d}): |U| {nU:6.0f}, chunks read again {off:5.1f} of {S} ({off / S:.0%}), generic {gen:.0%}")
