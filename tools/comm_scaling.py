"""How the all-gather's P2P push scales with the group size: renders one markdown table and one
plot from bench CSVs of the same host at different world sizes (``python -m
tokenspeed_kernel.bench comm --nproc N``) and, optionally, the raw transfer rates of
``bench/lab/tools/p2p_ceiling.cu`` on the same machine kind (its CSV output with the
``# N GPUs, R-byte rows, T=..`` headers). Not part of the library.

    python tools/comm_scaling.py --out bench/results/h200/comm_scaling \\
        bench/results/h200/comm_all_gather_hidden_tp2_x4host.csv \\
        bench/results/h200/comm_all_gather_hidden_tp4.csv \\
        --ceiling bench/lab/h200/comm_p2p_ceiling_tp4.csv

Per shape and world size: floor (incoming bytes per rank / 450 GB/s, the bench's), the flag
protocol and what ``auto`` picks (LL or flag at the library default), NCCL + permute, their ratio,
and where measured the raw SM push (``push2``, every GPU sending, the fastest configuration over
the file's runs) with the flag protocol's share of it.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from tokenspeed_kernel.bench.comm import ESZ, default_pick  # noqa: E402  (CPU import)


def read_bench(paths: List[str]) -> Tuple[Dict[Tuple, Dict[str, float]], Dict[int, Tuple]]:
    """(world, dtype, H, T) -> {provider: graph µs, 'floor': floor µs}, and per world the
    (gpu, git sha, date) of its run."""
    out: Dict[Tuple, Dict] = defaultdict(dict)
    meta = {}
    for p in paths:
        for r in csv.DictReader(open(p)):
            if not r.get("graph_us"):
                continue
            k = (int(r["world"]), r["dtype"], int(r["H"]), int(r["T"]))
            out[k][r["provider"]] = float(r["graph_us"])
            out[k]["floor"] = float(r["floor_us"])
            meta[int(r["world"])] = (r["gpu"], r["git_sha"][:7], r["date"][:10])
    return out, meta


def read_ceiling(path: Optional[str]) -> Dict[Tuple, float]:
    """(world, row bytes, T) -> the fastest checked push2 µs with every GPU sending, over every
    block of the file (a repeat appended with its own headers counts too)."""
    best: Dict[Tuple, float] = {}
    if not path:
        return best
    cur = None
    for line in open(path):
        m = re.match(r"# (\d+) GPUs, (\d+)-byte rows, T=(\d+)", line)
        if m:
            cur = tuple(int(v) for v in m.groups())
            continue
        f = line.strip().split(",")
        if cur and len(f) == 8 and f[0] == "push2" and int(f[1]) == cur[0] and f[7] == "1":
            best[cur] = min(best.get(cur, 1e30), float(f[5]))
    return best


def auto_of(world: int, dtype: str, H: int, T: int,
            provs: Dict[str, float]) -> Tuple[str, Optional[float]]:
    proto = default_pick(world, T, H, ESZ[dtype])
    return proto, provs.get(f"p2p-cuda-{proto}")


def _us(v: Optional[float]) -> str:
    return "–" if v is None else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")


def _pct(floor: float, t: Optional[float]) -> str:
    return "–" if not t else f"{100 * floor / t:.0f} %"


def render(bench, meta, ceil) -> Tuple[str, List[Dict]]:
    worlds = sorted({k[0] for k in bench})
    shapes = sorted({k[1:3] for k in bench}, key=lambda s: (s[0] != "bf16", s[1]))
    gpu = next(iter(meta.values()))[0]
    lines = ["# All-gather scaling with the group size (same host)", "",
             f"GPU: **{gpu}**; runs: " + "; ".join(
                 f"{w} ranks at {meta[w][1]} ({meta[w][2]})" for w in worlds), "",
             "CUDA-graph replay medians in µs (the bench's method, max over ranks). floor = "
             "incoming bytes per rank ((tp − 1) / tp of the output) / 450 GB/s. flag = the P2P "
             "push with flags; auto = what `protocol=\"auto\"` picks at the library default (ll or flag); "
             "raw push = `bench/lab/tools/p2p_ceiling.cu` `push2` (each GPU loads its slice once "
             "and stores it to every peer and its own output, all GPUs at once, no flags), fastest "
             "configuration over the ceiling file's runs, which are separate calls (see that "
             "file's header lines); flag ÷ raw = the protocol's share of the raw rate.", ""]
    rows = []
    for dt, H in shapes:
        lines += [f"## {dt}, H = {H}", "",
                  "| T | tp | floor µs | flag µs (% floor) | auto µs (pick) | NCCL + permute µs "
                  "| NCCL ÷ auto | raw push µs (% floor) | flag ÷ raw |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for T in sorted({k[3] for k in bench if k[1:3] == (dt, H)}):
            for w in worlds:
                b = bench.get((w, dt, H, T))
                if not b:
                    continue
                fl, flag, nccl = b["floor"], b.get("p2p-cuda-flag"), b.get("nccl+permute")
                pick, au = auto_of(w, dt, H, T, b)
                raw = ceil.get((w, H * ESZ[dt], T))
                rows.append(dict(dtype=dt, H=H, T=T, world=w, floor=fl, flag=flag, auto=au,
                                 pick=pick, nccl=nccl, raw=raw))
                lines.append(
                    f"| {T} | {w} | {fl:.2f} | {_us(flag)} ({_pct(fl, flag)}) | {_us(au)} "
                    f"({pick}) | {_us(nccl)} | "
                    + (f"{nccl / au:.2f}×" if nccl and au else "–") + " | "
                    + (f"{raw:.1f} ({_pct(fl, raw)}) | " if raw else "– | ")
                    + (f"{raw / flag:.2f} |" if raw and flag else "– |"))
        lines.append("")
    return "\n".join(lines), rows


def plot(rows: List[Dict], path: Path) -> Optional[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    shapes = sorted({(r["dtype"], r["H"]) for r in rows}, key=lambda s: (s[0] != "bf16", s[1]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, (dt, H) in zip(axes[0], shapes):
        for w, ls, mk in zip(sorted({r["world"] for r in rows}), ["-", "--", ":", "-."], "^vDP"):
            rs = sorted((r for r in rows if (r["dtype"], r["H"], r["world"]) == (dt, H, w)),
                        key=lambda r: r["T"])
            for key, m, col, name in (("flag", "o", "C0", "flag"),
                                      ("nccl", "s", "C1", "NCCL + permute")):
                pts = [(r["T"], 100 * r["floor"] / r[key]) for r in rs if r[key]]
                if pts:
                    ax.plot(*zip(*pts), m + ls, color=col, label=f"{name}, tp {w}")
            raw = [(r["T"], 100 * r["floor"] / r["raw"]) for r in rs if r["raw"]]
            if raw:
                ax.plot(*zip(*raw), mk, color="C2", ms=9, label=f"raw push, tp {w}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("% of NVLink floor")
        ax.set_ylim(0, 100)
        ax.set_title(f"{dt}, H = {H}")
        ax.grid(alpha=0.3)
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csvs", nargs="+", help="bench comm CSVs of one host, any world sizes")
    ap.add_argument("--ceiling", default=None, help="bench/lab/tools/p2p_ceiling.cu output (CSV)")
    ap.add_argument("--out", required=True, help="output stem: writes <out>.md and <out>.png")
    a = ap.parse_args()
    bench, meta = read_bench(a.csvs)
    md, rows = render(bench, meta, read_ceiling(a.ceiling))
    Path(a.out + ".md").write_text(md + "\n")
    png = plot(rows, Path(a.out + ".png"))
    print(md)
    print(f"wrote {a.out}.md" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
