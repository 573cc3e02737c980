"""CPU model of the CUDA cluster kernel's PLAIN streamed filter (plain_vec): how often a group of
4 elements needs Philox (its largest x + 16.64 reaches the thread's bar) and how many elements
pass the per-element test, for three ways to raise the CTA-wide bar:

* cur:  the largest per-warp second-best score (the kernel as it is);
* top2: also min(the warp's best, the largest warp best published before) (a second shared key);
* best: also the warp's best minus 1e-3 (patches/s19_plain_best.patch; the CTA then reports its
  final bar as the bound on the other scores).

Rows are randn * 4 at T = 0.8 (the bench's), one CTA of `threads` threads per row; thread t takes
4-element vectors t, t + threads, ...; the warps run in lockstep (one vector per thread per step,
the CTA bar updated after each step from the warps that evaluated something), the scores in
float64 with the exact Gumbel noise of uniform words. Prints the fractions averaged over seeds.

`--split S,...`: the split launch's phase 1 instead (split1_kernel: S CTAs of 256 threads per
row, each pruning against beta = the best h its CTA has seen, margin 0.02), with beta from the
CTA alone (as it is) or also from every CTA of the row (patches/s19_split_rowbar.patch; the
row's best after the previous step, all CTAs in lockstep).

    python bench/lab/tools/plain_filter_model.py [--vocab 151936,262144] [--threads 1024]
    python bench/lab/tools/plain_filter_model.py --vocab 151936 --split 8,16,33
"""
import argparse
import math

import torch


def _row(V, seed, scale=4.0, T=0.8):
    """x = z / T of a randn * scale row, the uniforms u = (2k + 1) 2^-24 and G = -ln(-ln u)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(V, generator=g, dtype=torch.float64) * scale / T
    u = (torch.randint(0, 2 ** 23, (V,), generator=g).double() * 2 + 1) * 2 ** -24
    return x, u, -torch.log(-torch.log(u))


def run(V, nthreads, mode, seed=0, margin=1e-3):
    x, u, G = _row(V, seed)
    steps = ((V + 3) // 4 + nthreads - 1) // nthreads

    def pad(t, v):
        o = torch.full((steps * nthreads * 4,), v, dtype=torch.float64)
        o[:V] = t
        return o.view(steps, nthreads, 4)
    xv, Gv, uv = pad(x, -math.inf), pad(G, 0.0), pad(u, 0.5)
    ninf = torch.tensor(-math.inf, dtype=torch.float64)
    h1 = torch.full((nthreads,), -math.inf, dtype=torch.float64)
    h2 = h1.clone()
    bar_cta, top1 = -math.inf, -math.inf
    pub = torch.full((nthreads // 32,), -math.inf, dtype=torch.float64)
    philox = passed = 0
    for k in range(steps):
        bar = torch.maximum(h2, torch.tensor(bar_cta, dtype=torch.float64))
        xk = xv[k]
        grp = ~(xk.max(1).values + 16.64 < bar)
        philox += int(grp.sum())
        ok = grp[:, None] & ~((1 - uv[k]) > torch.exp(xk - bar[:, None])) & (xk > -math.inf)
        passed += int(ok.sum())
        h = torch.where(ok, xk + Gv[k], ninf)
        for j in range(4):
            gt = h[:, j] > h1
            h2 = torch.where(gt, h1, torch.maximum(h2, h[:, j]))
            h1 = torch.where(gt, h[:, j], h1)
        top = torch.cat([h1.view(-1, 32), h2.view(-1, 32)], 1).topk(2, dim=1).values
        for w in torch.nonzero(ok.view(-1, 32, 4).any(2).any(1)).flatten().tolist():
            wb, ws = float(top[w, 0]), float(top[w, 1])
            bar_cta = max(bar_cta, ws)
            if mode == "best":
                bar_cta = max(bar_cta, wb - margin)
            elif mode == "top2" and wb > pub[w]:
                old, top1, pub[w] = top1, max(top1, wb), wb
                if old > -math.inf:
                    bar_cta = max(bar_cta, min(old, wb))
    return philox / (steps * nthreads), passed / V


def split_run(V, S, share, seed=0, nthreads=256, margin=0.02):
    x, u, G = _row(V, seed)
    chunk = ((V + S - 1) // S + 7) // 8 * 8
    steps = ((chunk + 3) // 4 + nthreads - 1) // nthreads
    X = torch.full((S, steps * nthreads * 4), -math.inf, dtype=torch.float64)
    GG, U = torch.zeros_like(X), torch.full_like(X, 0.5)
    for c in range(S):
        a, b = c * chunk, min(V, (c + 1) * chunk)
        X[c, :b - a], GG[c, :b - a], U[c, :b - a] = x[a:b], G[a:b], u[a:b]
    X, GG, U = (t.view(S, steps, nthreads, 4) for t in (X, GG, U))
    best = torch.full((S, nthreads), -math.inf, dtype=torch.float64)
    cta = torch.full((S,), -math.inf, dtype=torch.float64)
    row = torch.tensor(-math.inf, dtype=torch.float64)
    philox = 0
    for k in range(steps):
        beta = torch.maximum(best, cta[:, None])
        if share:
            beta = torch.maximum(beta, row)
        xk = X[:, k]
        grp = ~(xk.max(2).values + 16.64 < beta - margin)
        philox += int(grp.sum())
        ok = (grp[..., None] & (U[:, k] + 2 ** -19 >= torch.exp(-torch.exp(xk - (beta[..., None]
                                                                                - 0.03))))
              & (xk > -math.inf))
        h = torch.where(ok, xk + GG[:, k], torch.tensor(-math.inf, dtype=torch.float64))
        best = torch.maximum(best, h.max(2).values)
        cta = torch.maximum(cta, best.max(1).values)
        row = cta.max()
    return philox / (S * steps * nthreads)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="151936,262144")
    ap.add_argument("--threads", type=int, default=1024)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--split", default=None)
    a = ap.parse_args()
    if a.split:
        for V in (int(v) for v in a.vocab.split(",")):
            for S in (int(v) for v in a.split.split(",")):
                r = [[split_run(V, S, sh, sd) for sd in range(a.seeds)] for sh in (False, True)]
                print(f"V {V} split S {S}: groups with Philox {sum(r[0]) / len(r[0]):.3f} (CTA "
                      f"beta), {sum(r[1]) / len(r[1]):.3f} (row beta)")
        return
    for V in (int(v) for v in a.vocab.split(",")):
        for mode in ("cur", "top2", "best"):
            r = [run(V, a.threads, mode, s) for s in range(a.seeds)]
            print(f"V {V} threads {a.threads} {mode}: groups with Philox "
                  f"{sum(p for p, _ in r) / len(r):.3f}, elements evaluated "
                  f"{sum(e for _, e in r) / len(r):.4f}")


if __name__ == "__main__":
    main()
