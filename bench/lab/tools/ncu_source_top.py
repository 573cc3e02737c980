"""Summarize an `ncu --page source --csv` export (SASS or CUDA view): total warp-stall samples,
their share per window of instructions / lines, and the top rows with their two main stall
reasons. Usage: python bench/lab/tools/ncu_source_top.py <source.csv> [top] [window]"""
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    win = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    rows = list(csv.reader(open(path, newline="")))
    kernels = [k for k, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    kernels.append(len(rows))
    for a, b in zip(kernels, kernels[1:]):
        name, h, body = rows[a][1], rows[a + 1], [r for r in rows[a + 2:b] if len(r) > 3]
        iS = h.index("Warp Stall Sampling (All Samples)")
        iE = h.index("Instructions Executed")
        f = lambda x, i: float(x[i] or 0) if x[i] not in ("", "-") else 0.0  # noqa: E731
        tot = sum(f(x, iS) for x in body) or 1.0
        print(f"== {name[:120]}\n   rows {len(body)} samples {tot:.0f} "
              f"warp-instructions {sum(f(x, iE) for x in body):.0f}")
        w = {}
        for k, x in enumerate(body):
            w[k // win] = w.get(k // win, 0) + f(x, iS)
        print("   windows (>= 2 %): " + ", ".join(f"{k * win}:{v / tot * 100:.1f}"
                                                  for k, v in sorted(w.items()) if v >= tot * .02))
        stalls = [c for c in h if c.startswith("stall_") and "Not Issued" not in c]
        best = sorted(range(len(body)), key=lambda k: -f(body[k], iS))[:top]
        for k in sorted(best):
            x = body[k]
            st = sorted(((f(x, h.index(c)), c[6:]) for c in stalls), reverse=True)[:2]
            print(f"   {k:5d} {x[1].strip()[:70]:70s} s={f(x, iS):6.0f} ({f(x, iS) / tot * 100:4.1f}%)"
                  f" ex={f(x, iE):8.0f} " + " ".join(f"{c}:{v:.0f}" for v, c in st))


if __name__ == "__main__":
    main()
