"""Environment capture, CSV / markdown writers and plots shared by every benchmark.

Results go to ``<out>/<gpu-short-name>/<bench>.{csv,md,png}``; ``<out>`` defaults to the
repository's ``bench/results`` (committed measurements). Every CSV row carries the GPU name,
torch / triton / CUDA / FlashInfer versions and the git sha (``git rev-parse HEAD`` when the tree
is a git checkout, else the ``TS_GIT_SHA`` environment variable, else ``unknown``).
"""
from __future__ import annotations

import csv
import datetime as _dt
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import torch

REPO_ROOT = Path(__file__).resolve().parents[3]


def repo_root() -> Path:
    return REPO_ROOT if (REPO_ROOT / "pyproject.toml").exists() else Path.cwd()


def git_sha() -> str:
    """$TS_GIT_SHA when set (the device machine's copy of the tree may carry a stale .git), else
    ``git rev-parse HEAD`` (+ ``-dirty`` if tracked files changed), else ``unknown``."""
    if os.environ.get("TS_GIT_SHA"):
        return os.environ["TS_GIT_SHA"]
    root = repo_root()
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        if sha.returncode == 0 and sha.stdout.strip():
            s = sha.stdout.strip()
            st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=root, capture_output=True, text=True, timeout=10)
            if st.returncode == 0 and st.stdout.strip():
                s += "-dirty"
            return s
    except Exception:
        pass
    return os.environ.get("TS_GIT_SHA", "unknown")


def gpu_short_name(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100'; else a sanitized name."""
    low = name.lower()
    for key in ("gb300", "gb200", "b300", "b200", "h200", "h100", "h800", "h20", "a100", "l40s",
                "l4", "a10g", "rtx 4090", "rtx 5090"):
        if key in low:
            return key.replace(" ", "")
    s = re.sub(r"[^a-z0-9]+", "-", low.replace("nvidia", "")).strip("-")
    return s or "gpu"


def flashinfer_version() -> str:
    try:
        import flashinfer  # noqa: F401
        return str(getattr(flashinfer, "__version__", "unknown"))
    except Exception:
        return ""


def triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except Exception:
        return ""


def env_info(device: Optional[torch.device] = None) -> Dict[str, str]:
    if device is not None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        short = gpu_short_name(gpu)
    else:
        gpu, short = "cpu", "cpu"
    return {
        "gpu": gpu,
        "gpu_short": short,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda or ""),
        "triton": triton_version(),
        "flashinfer": flashinfer_version(),
        "git_sha": git_sha(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def results_dir(out: Optional[str], gpu_short: str) -> Path:
    base = Path(out) if out else repo_root() / "bench" / "results"
    d = base / gpu_short
    d.mkdir(parents=True, exist_ok=True)
    return d


def fmt(x, digits: int = 1) -> str:
    if x is None or x == "":
        return ""
    if isinstance(x, float):
        if x != x:
            return "nan"
        if abs(x) >= 1000:
            return f"{x:.0f}"
        return f"{x:.{digits}f}"
    return str(x)


def write_csv(path: Path, rows: Sequence[Dict], columns: Sequence[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else
                            (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r[k]))
                        for k in columns})


def md_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def print_table(headers: Sequence[str], rows: Sequence[Sequence], file=None) -> None:
    """Plain fixed-width table for terminals."""
    import sys
    file = file or sys.stdout
    rows = [[str(c) for c in r] for r in rows]
    w = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w[i]) for i, h in enumerate(headers)), file=file)
    print("  ".join("-" * w[i] for i in range(len(headers))), file=file)
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)), file=file)


def env_header(env: Dict[str, str], extra: Optional[Dict[str, str]] = None) -> str:
    parts = [f"GPU: **{env['gpu']}**", f"torch {env['torch']} (CUDA {env['cuda'] or '-'})",
             f"triton {env['triton'] or '-'}",
             f"FlashInfer {env['flashinfer'] or 'not installed'}",
             f"git {env['git_sha'][:12]}", env["date"]]
    s = " · ".join(parts)
    if extra:
        s += "\n\n" + "\n".join(f"- {k}: {v}" for k, v in extra.items())
    return s


# ------------------------------------------------------------------------------------------
# sampling: markdown + plot
# ------------------------------------------------------------------------------------------
PROVIDER_ORDER = ["ours-cuda", "ours-triton", "ours-cuda+proc", "ours-triton+proc",
                  "torch-proc+ours-cuda", "torch-proc+ours-triton", "torch", "flashinfer",
                  "reference", "reference+proc"]
MODE_ORDER = ["greedy", "temp", "top_k", "top_p", "top_k_top_p", "mixed", "min_p", "proc"]
MODE_LABEL = {"greedy": "greedy", "temp": "temperature 0.8", "top_k": "top-k 50",
              "top_p": "top-p 0.9", "top_k_top_p": "top-k 50 + top-p 0.9", "min_p": "min-p 0.1",
              "proc": "top-k 50 + top-p 0.9 + processing",
              "mixed": "top-k 50 + top-p 0.9 on even rows, off on odd rows (k = V, p = 1)"}
DTYPE_ORDER = ["fp32", "bf16", "fp16"]


def _cell(r: Optional[Dict]) -> str:
    if r is None:
        return "–"
    if r["status"] != "ok":
        return r["status"].split(":")[0]
    g, e = r.get("graph_us"), r.get("eager_us")
    if g is None:
        return f"({fmt(e)})" if e is not None else "–"
    return f"{fmt(g)} ({fmt(e)})" if e is not None else fmt(g)


def _ratio(x) -> str:
    return "" if x is None else f"{x:.2f}"


def ours_row(by: Dict[str, Dict], mode: str) -> Optional[Dict]:
    """The row that "ours" means in a table line: ours-cuda where it ran, else ours-triton; in
    mode "proc" the fused call with processing (ours-cuda+proc, else ours-triton+proc)."""
    sfx = "+proc" if mode == "proc" else ""
    r = by.get("ours-cuda" + sfx)
    return r if (r or {}).get("status") == "ok" else by.get("ours-triton" + sfx)


def ratio_of(mine: Optional[Dict], base: Optional[Dict]) -> Optional[float]:
    """time(mine) / time(base): graph replay when both have it, else eager when both have it
    (a baseline that cannot be captured is compared eager to eager), else None."""
    if not mine or not base or mine.get("status") != "ok" or base.get("status") != "ok":
        return None
    for k in ("graph_us", "eager_us"):
        a, b = mine.get(k), base.get(k)
        if a and b:
            return a / b
    return None


def torch_baseline(by: Dict[str, Dict], mode: str) -> Optional[Dict]:
    """The torch row "ours" is compared with: in mode "proc" the engines' way (torch processing
    passes + ours-cuda, else + ours-triton), else vLLM's torch path."""
    if mode == "proc":
        return by.get("torch-proc+ours-cuda") or by.get("torch-proc+ours-triton")
    return by.get("torch")


def table_ratios(by: Dict[str, Dict], mode: str):
    """(ours row, ours/FlashInfer, ours/torch) of one table line."""
    ours = ours_row(by, mode)
    return ours, ratio_of(ours, by.get("flashinfer")), ratio_of(ours, torch_baseline(by, mode))


def sampling_markdown(rows: List[Dict], env: Dict[str, str], hbm_gbps: Optional[float],
                      notes: Sequence[str] = ()) -> str:
    lines = ["# Sampling benchmark", "", env_header(env), ""]
    if hbm_gbps:
        lines.append(f"HBM read bandwidth measured in this run (1 GiB `amax`): "
                     f"**{hbm_gbps:.0f} GB/s**; floor = bytes of logits / that.")
    lines += [
        "",
        "Cells: **CUDA-graph replay µs (eager µs)**, median per call, cold L2 "
        "(docs/BENCHMARKS.md). `FAILED` = wrong tokens (not timed), `ERROR` = raised. "
        "Ratios are time(ours) / time(baseline) on graph replay (eager to eager where the "
        "baseline cannot be captured): < 1 means ours is faster. \"ours\" = ours-cuda where it "
        "ran, else ours-triton; in the processing rows the fused call (ours-cuda+proc, else "
        "ours-triton+proc), and \"torch\" there = the engines' way (torch processing passes + "
        "our sampler). %floor = floor / ours.",
        ""]
    lines += [f"- {n}" for n in notes]
    lines.append("")
    provs = [p for p in PROVIDER_ORDER if any(r["provider"] == p for r in rows)]
    groups = sorted({(r["dtype"], r["V"]) for r in rows},
                    key=lambda k: (DTYPE_ORDER.index(k[0]) if k[0] in DTYPE_ORDER else 9, k[1]))
    for dt, V in groups:
        sub = [r for r in rows if r["dtype"] == dt and r["V"] == V]
        lines += [f"## {dt}, V = {V}", ""]
        headers = ["mode", "B", "floor µs"] + provs + ["ours/FI", "ours/torch", "%floor"]
        body = []
        keys = sorted({(r["mode"], r["B"]) for r in sub},
                      key=lambda k: (MODE_ORDER.index(k[0]) if k[0] in MODE_ORDER else 9, k[1]))
        for mode, B in keys:
            by = {r["provider"]: r for r in sub if r["mode"] == mode and r["B"] == B}
            ours, r_fi, r_torch = table_ratios(by, mode)
            floor = next((r.get("floor_us") for r in by.values() if r.get("floor_us")), None)
            body.append([MODE_LABEL.get(mode, mode), B, fmt(floor, 2)]
                        + [_cell(by.get(p)) for p in provs]
                        + [_ratio(r_fi), _ratio(r_torch), fmt((ours or {}).get("pct_floor"), 1)])
        lines += [md_table(headers, body), ""]
    # host overhead summary
    host = {}
    for r in rows:
        if r.get("host_us") is not None:
            host.setdefault((r["provider"], r["mode"]), []).append(r["host_us"])
    if host:
        import statistics
        modes = [m for m in MODE_ORDER if any(k[1] == m for k in host)]
        lines += ["## Host overhead per call", "",
                  "CPU time of one Python call, no synchronize (µs, median over the configurations "
                  "above). Eager time ≈ max(host, GPU) per call.", ""]
        body = []
        for p in provs:
            body.append([p] + [fmt(statistics.median(host[(p, m)]), 1) if (p, m) in host else "–"
                               for m in modes])
        lines += [md_table(["provider"] + [MODE_LABEL.get(m, m) for m in modes], body), ""]
    return "\n".join(lines)


def sampling_plots(rows: List[Dict], out_dir: Path, stem: str = "sampling") -> List[Path]:
    """One PNG per dtype: a grid of (mode rows x vocab columns), graph µs vs B, log-log.

    The first dtype (fp32 when present) is ``<stem>.png``; others ``<stem>_<dtype>.png``.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover
        print(f"[report] matplotlib unavailable ({e}); no plot", flush=True)
        return []
    ok = [r for r in rows if r["status"] == "ok" and (r.get("graph_us") or r.get("eager_us"))]
    dtypes = [d for d in DTYPE_ORDER if any(r["dtype"] == d for r in ok)]
    paths = []
    # every provider its own colour / line (the processing row's providers included, so no
    # default-cycle colour repeats a fixed one)
    styles = {"ours-cuda": ("tab:red", "-"), "ours-triton": ("tab:orange", "-"),
              "ours-cuda+proc": ("tab:red", "--"), "ours-triton+proc": ("tab:orange", "--"),
              "torch-proc+ours-cuda": ("tab:purple", ":"),
              "torch-proc+ours-triton": ("tab:brown", ":"), "torch": ("tab:blue", "-"),
              "flashinfer": ("tab:green", "-"), "reference": ("tab:gray", "-"),
              "reference+proc": ("tab:gray", "--")}
    for i, dt in enumerate(dtypes):
        sub = [r for r in ok if r["dtype"] == dt]
        modes = [m for m in MODE_ORDER if any(r["mode"] == m for r in sub)]
        vocabs = sorted({r["V"] for r in sub})
        fig, axes = plt.subplots(len(modes), len(vocabs), squeeze=False,
                                 figsize=(3.4 * len(vocabs) + 0.5, 2.5 * len(modes) + 0.8))
        for a, mode in enumerate(modes):
            for b, V in enumerate(vocabs):
                ax = axes[a][b]
                cell = [r for r in sub if r["mode"] == mode and r["V"] == V]
                for p in PROVIDER_ORDER:
                    pts = sorted((r["B"], r.get("graph_us") or r.get("eager_us"))
                                 for r in cell if r["provider"] == p)
                    if pts:
                        color, ls = styles.get(p, (None, "-"))
                        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3,
                                ls=ls, color=color, label=p)
                fl = sorted({(r["B"], r["floor_us"]) for r in cell if r.get("floor_us")})
                if fl:
                    ax.plot([x for x, _ in fl], [y for _, y in fl], "k--", lw=0.8,
                            label="HBM floor")
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                bs = sorted({r["B"] for r in cell})
                if bs:
                    ax.set_xticks(bs)
                    ax.set_xticklabels([str(x) for x in bs])
                ax.grid(True, which="both", lw=0.3, alpha=0.5)
                if a == 0:
                    ax.set_title(f"V = {V}", fontsize=9)
                if b == 0:
                    ax.set_ylabel(f"{textwrap.fill(MODE_LABEL.get(mode, mode), 26)}\nµs / call",
                                  fontsize=8)
                if a == len(modes) - 1:
                    ax.set_xlabel("batch B", fontsize=8)
                ax.tick_params(labelsize=7)
        handles, labels = [], []
        for ax in axes.flat:
            for h, l in zip(*ax.get_legend_handles_labels()):
                if l not in labels:
                    handles.append(h)
                    labels.append(l)
        gpu = ok[0].get("gpu", "") if ok else ""
        # title and legend sized to the figure's width (one vocabulary column is narrow):
        # wrapped title lines, as many legend columns as fit, the axes below both
        w, h = fig.get_figwidth(), fig.get_figheight()
        title = f"sampling, {dt} logits: µs per call (CUDA-graph replay, cold L2) — {gpu}"
        title = textwrap.fill(title, width=max(30, int(w * 13)))
        t_lines = title.count("\n") + 1
        ncol = max(1, min(len(labels), int(w // 1.7)))
        l_rows = -(-len(labels) // ncol)
        fig.suptitle(title, fontsize=10, y=1.0 - 0.1 / h, va="top")
        fig.legend(handles, labels, loc="upper center", ncol=ncol, fontsize=8, frameon=False,
                   bbox_to_anchor=(0.5, 1.0 - (0.16 + 0.2 * t_lines) / h))
        top = 1.0 - (0.2 + 0.2 * t_lines + 0.19 * l_rows) / h
        fig.tight_layout(rect=(0, 0, 1, top))
        path = out_dir / (f"{stem}.png" if i == 0 else f"{stem}_{dt}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


_TEXT_COLUMNS = ("gpu", "gpu_short", "torch", "cuda", "triton", "flashinfer", "git_sha", "date",
                 "provider", "impl", "mode", "dtype", "status", "note")
_INT_COLUMNS = ("B", "V", "calls", "samples", "inputs", "bytes")


def read_sampling_csv(path) -> List[Dict]:
    """Rows of a sampling.csv with the types the bench wrote (ints, floats, None for empty)."""
    import csv
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k, v in list(r.items()):
                if v is None or v == "":
                    r[k] = None
                elif k in _INT_COLUMNS:
                    r[k] = int(float(v))
                elif k not in _TEXT_COLUMNS:
                    try:
                        r[k] = float(v)
                    except ValueError:
                        pass
            rows.append(r)
    return rows


def render_sampling_csvs(paths: Sequence[str], out: str, notes: Sequence[str] = (),
                         plot: bool = True) -> int:
    """Merge sampling CSVs of ONE build on ONE GPU (refused otherwise) into out/sampling.*."""
    from .sampling import CSV_COLUMNS, default_notes
    rows: List[Dict] = []
    for p in paths:
        rows += read_sampling_csv(p)
    if not rows:
        print("[render] no rows", file=sys.stderr)
        return 2
    for col in ("git_sha", "gpu"):
        vals = sorted({str(r.get(col)) for r in rows})
        if len(vals) > 1:
            print(f"[render] refusing to merge rows of different {col}: {vals}", file=sys.stderr)
            return 2
    first = min(rows, key=lambda r: str(r.get("date")))
    env = {k: first.get(k) or "" for k in ("gpu", "gpu_short", "torch", "cuda", "triton",
                                            "flashinfer", "git_sha", "date")}
    hbm = first.get("hbm_gbps")
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    allnotes = list(default_notes()) + [
        f"Merged from {len(paths)} runs of the same build (dates "
        f"{min(str(r.get('date')) for r in rows)} to {max(str(r.get('date')) for r in rows)}; "
        "the header shows the first); each row's floor uses its own run's HBM bandwidth."]
    allnotes += list(notes)
    write_csv(d / "sampling.csv", rows, CSV_COLUMNS)
    (d / "sampling.md").write_text(sampling_markdown(rows, env, hbm, allnotes) + "\n")
    pngs = sampling_plots(rows, d, "sampling") if plot else []
    print(f"[render] wrote {d / 'sampling.csv'}, sampling.md"
          + "".join(f", {p.name}" for p in pngs))
    return 0
