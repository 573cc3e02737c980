"""DP sampling bench (multi-GPU): the vocab -> batch swap against NCCL ``all_to_all_single`` +
the permute an engine needs, and "vocab-sharded logits -> tokens on every rank" end to end:
``dp_sample`` against all-gather + ``ops.sample`` (our P2P all-gather, and NCCL's).

``python -m tokenspeed_kernel.bench dp [--nproc N] [--batch ...] [--vocab ...] [--dtype ...]``
(one process per GPU is spawned; under torchrun this process is one rank). Writes
``bench/results/<gpu>/dp_sampling_tp<N>.{csv,md,png}``. Method: CUDA-graph replay of N
back-to-back calls (each on its own input copy), ranks aligned by an all-reduce before every
sample, median (p20-p80) of the per-call time, max over ranks (bench/comm.py's timing).
Every end-to-end provider is checked against ops.sample on the full logits before timing.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import report
from .comm import _quant, run_ranks, time_provider

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
B_GRID = [1, 4, 16, 32, 64, 128, 256, 512]
VOCABS = [151936]
DTYPES = ["bf16", "fp32"]
PROVIDERS = ["swap-cuda", "swap-nccl", "dp-sample", "ag-sample", "nccl-ag-sample"]
# sampling parameters of the end-to-end rows: T = 0.8, top-k 50, top-p 0.9 (a common chat setting)
SAMPLE_KW = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}
COLUMNS = ["gpu", "world", "dtype", "V", "B", "provider", "graph_us", "graph_p20", "graph_p80",
           "eager_us", "host_us", "calls", "samples", "verified", "note", "torch", "triton",
           "cuda", "git_sha", "date"]


def stem_for(world: int) -> str:
    return f"dp_sampling_tp{world}"


def _f(x, d=1) -> str:
    return "–" if x is None else (f"{x:.{d}f}" if abs(x) < 1000 else f"{x:.0f}")


def crossovers(rows: List[Dict]) -> Dict[str, Optional[int]]:
    """Per (dtype, V): the smallest B from which dp-sample beats ag-sample at every larger
    measured B (None: never)."""
    out = {}
    for dt, V in sorted({(r["dtype"], r["V"]) for r in rows}):
        pts = {}
        for r in rows:
            if r["dtype"] == dt and r["V"] == V and r.get("graph_us"):
                pts.setdefault(r["B"], {})[r["provider"]] = r["graph_us"]
        bs = sorted(b for b, p in pts.items() if "dp-sample" in p and "ag-sample" in p)
        cross = None
        for b in reversed(bs):
            if pts[b]["dp-sample"] < pts[b]["ag-sample"]:
                cross = b
            else:
                break
        out[f"{dt}/V={V}"] = cross
    return out


def _markdown(rows: List[Dict], env: Dict[str, str], world: int, skipped: List[str]) -> str:
    lines = [f"# DP sampling ({world} ranks)", "",
             f"GPU: **{env['gpu']}** x {world} · torch {env['torch']} (CUDA {env.get('cuda', '')})"
             f" · triton {env.get('triton', '')} · git {env['git_sha'][:12]} · {env['date']}", "",
             "CUDA-graph replay, median (p20–p80) µs per call, max over ranks. `swap-cuda`: "
             "`swap_vocab_to_batch` (one-sided P2P push, this rank's rows as a view); "
             "`swap-nccl`: NCCL `all_to_all_single` + the permute into whole rows. End to end "
             "(vocab-sharded logits → the batch's tokens on every rank, T = 0.8, top-k 50, "
             "top-p 0.9): `dp-sample` = swap + sample B/W rows + results gather; `ag-sample` = "
             "our P2P all-gather of the logits + `ops.sample` of all B rows on every rank; "
             "`nccl-ag-sample` = NCCL all-gather + permute + `ops.sample`. Every end-to-end "
             "provider returned the tokens of `ops.sample` on the full logits before timing.", ""]
    for dt, V in sorted({(r["dtype"], r["V"]) for r in rows}):
        sub = [r for r in rows if r["dtype"] == dt and r["V"] == V]
        provs = [p for p in PROVIDERS if any(r["provider"] == p for r in sub)]
        lines += [f"## {dt}, V = {V}", "",
                  "| B | " + " | ".join(f"{p} µs" for p in provs)
                  + " | NCCL swap ÷ ours | ag-sample ÷ dp-sample |",
                  "|---|" + "---|" * len(provs) + "---|---|"]
        for B in sorted({r["B"] for r in sub}):
            get = {r["provider"]: r for r in sub if r["B"] == B}
            cells = []
            for p in provs:
                r = get.get(p)
                if r is None or r.get("graph_us") is None:
                    cells.append((r or {}).get("note") or "–")
                else:
                    cells.append(f"{_f(r['graph_us'])} ({_f(r['graph_p20'])}–{_f(r['graph_p80'])})")

            def ratio(a, b):
                ra, rb = get.get(a), get.get(b)
                ok = ra and rb and ra.get("graph_us") and rb.get("graph_us")
                return f"{ra['graph_us'] / rb['graph_us']:.2f}×" if ok else "–"
            lines.append(f"| {B} | " + " | ".join(cells) + f" | {ratio('swap-nccl', 'swap-cuda')}"
                         f" | {ratio('ag-sample', 'dp-sample')} |")
        lines.append("")
    cr = crossovers(rows)
    lines += ["Crossover (smallest B from which dp-sample beats ag-sample at every larger B): "
              + ", ".join(f"{k}: {v if v is not None else 'none'}" for k, v in cr.items()), ""]
    if skipped:
        lines += ["Skipped (time budget): " + ", ".join(skipped), ""]
    return "\n".join(lines)


def _plot(rows: List[Dict], path: Path, world: int) -> Optional[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"[bench dp] no plot: matplotlib unavailable ({e})", file=sys.stderr)
        return None
    keys = sorted({(r["dtype"], r["V"]) for r in rows})
    if not keys:
        return None
    fig, axes = plt.subplots(2, len(keys), figsize=(5 * len(keys), 8), squeeze=False)
    for j, (dt, V) in enumerate(keys):
        for i, group in enumerate((["swap-cuda", "swap-nccl"],
                                   ["dp-sample", "ag-sample", "nccl-ag-sample"])):
            ax = axes[i][j]
            for p in group:
                pts = sorted((r["B"], r["graph_us"]) for r in rows if r["dtype"] == dt
                             and r["V"] == V and r["provider"] == p and r.get("graph_us"))
                if pts:
                    ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=p)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("B (rows)")
            ax.set_ylabel("µs per call (graph replay, max over ranks)")
            ax.set_title(f"{'swap' if i == 0 else 'end to end'}: {dt}, V = {V}, {world} ranks")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _bench_rank(opts: Dict) -> int:
    import torch.distributed as dist

    from .. import ops
    from ..ops import comm as oc
    from ..ops import dp as D

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    say = (lambda *a: print("[bench dp]", *a, file=sys.stderr, flush=True)) if rank == 0 \
        else (lambda *a: None)
    env = report.env_info(device)
    align = torch.zeros(1, device=device)
    rows: List[Dict] = []
    skipped: List[str] = []
    failed = 0
    deadline = opts.get("deadline")
    bmax = max(opts["batch"])
    for dtname in opts["dtypes"]:
        dtype = DT[dtname]
        for V in opts["vocabs"]:
            comm = D.create_dp_sampling_comm(max_rows=bmax, vocab_size=V, dtype=dtype,
                                             dp_min_rows=0)
            w = comm.shard_width
            agc = oc.create_all_gather_comm(max_tokens=bmax, max_total_width=world * w,
                                            dtype=dtype)
            for B in opts["batch"]:
                stop = torch.tensor([1.0 if (deadline and time.monotonic() > deadline) else 0.0],
                                    device=device)
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if stop.item() > 0:
                    skipped.append(f"{dtname}/V={V}/B={B}")
                    continue
                g = torch.Generator(device="cpu").manual_seed(B * 7 + V)
                full = (torch.randn(B, world * w, generator=g) * 4).to(dtype).to(device)
                seed = torch.arange(B, device=device) + 1
                offset = torch.zeros(B, dtype=torch.int64, device=device)
                kw = {k: torch.full((B,), v, device=device,
                                    dtype=torch.int32 if k == "top_k" else torch.float32)
                      for k, v in SAMPLE_KW.items()}
                want = ops.sample(full[:, :V], seed, offset, **kw).tokens
                x0 = full[:, rank * w:(rank + 1) * w].contiguous()

                def ag_sample(xx, nccl=False):
                    if nccl:
                        allv = torch.empty((world, B, w), dtype=dtype, device=device)
                        oc._ag_single()(allv.view(world * B, w), xx, group=comm.group)
                        fl = allv.permute(1, 0, 2).reshape(B, world * w)
                    else:
                        fl = oc.all_gather_hidden(agc, xx)
                    return ops.sample(fl[:, :V], seed, offset, validate=False, **kw).tokens

                calls = {
                    "swap-cuda": lambda xx: D.swap_vocab_to_batch(comm, xx, backend="cuda"),
                    "swap-nccl": lambda xx: D.swap_vocab_to_batch(comm, xx, backend="nccl"),
                    "dp-sample": lambda xx: D.dp_sample(comm, xx, seed, offset, backend="cuda",
                                                        validate=False, **kw).tokens,
                    "ag-sample": lambda xx: ag_sample(xx),
                    "nccl-ag-sample": lambda xx: ag_sample(xx, nccl=True),
                }
                line = []
                for prov in opts["providers"]:
                    row = {"gpu": env["gpu"], "world": world, "dtype": dtname, "V": V, "B": B,
                           "provider": prov, "graph_us": None, "torch": env["torch"],
                           "triton": env.get("triton", ""), "cuda": env.get("cuda", ""),
                           "git_sha": env["git_sha"], "date": env["date"]}
                    fn = calls[prov]
                    ok = True
                    try:
                        r = fn(x0)
                        torch.cuda.synchronize(device)
                        if prov.startswith("swap"):
                            s, n = comm.row_range(B)
                            ok = torch.equal(r, full[s:s + n, :V])
                        else:
                            ok = torch.equal(r, want)
                    except Exception as e:
                        say(f"{prov} B={B}: error {type(e).__name__}: {e}")
                        ok = False
                    okt = torch.tensor([1.0 if ok else 0.0], device=device)
                    dist.all_reduce(okt, op=dist.ReduceOp.MIN)
                    if okt.item() < 1:
                        row.update(verified="FAILED", note="failed verification: not timed")
                        rows.append(row)
                        failed += 1
                        line.append(f"{prov}=FAILED")
                        continue
                    row["verified"] = "tokens = ops.sample" if not prov.startswith("swap") \
                        else "bit-exact rows"
                    n = max(2, min(32, int(3e6 // max(1, B * w * x0.element_size()))))
                    xs = [x0.clone() for _ in range(n)]
                    fns = [(lambda xx=xx: fn(xx)) for xx in xs]
                    try:
                        res = time_provider(fns, opts["reps"], device, align, graph=True)
                    except Exception as e:
                        row["note"] = f"timing failed: {type(e).__name__}: {str(e)[:80]}"
                        rows.append(row)
                        line.append(f"{prov}=timing-failed")
                        continue
                    gq, eq = _quant(res["graph"]), _quant(res["eager"])
                    row.update(graph_us=gq[0], graph_p20=gq[1], graph_p80=gq[2], eager_us=eq[0],
                               host_us=res["host"], calls=n, samples=opts["reps"])
                    rows.append(row)
                    line.append(f"{prov}={_f(gq[0])}")
                comm.check()
                say(f"{dtname} V={V} B={B}: graph us: " + " ".join(line))
            comm.close()
            agc.close()
            torch.cuda.empty_cache()
    if rank == 0:
        out_dir = report.results_dir(opts.get("out"), env["gpu_short"])
        stem = stem_for(world)
        report.write_csv(out_dir / f"{stem}.csv", rows, COLUMNS)
        md = _markdown(rows, env, world, skipped)
        (out_dir / f"{stem}.md").write_text(md)
        if not opts.get("no_plot"):
            _plot(rows, out_dir / f"{stem}.png", world)
        print(md)
        say(f"wrote {out_dir / stem}.csv/.md/.png")
    return 1 if failed else 0


def _options(args) -> Dict:
    import argparse
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--nproc", type=int, default=None)
    extra.add_argument("--providers", default=None)
    ex, _ = extra.parse_known_args(list(getattr(args, "extra", None) or []))

    def lst(s, conv=str):
        return None if not s else [conv(v) for v in str(s).split(",") if v.strip()]
    quick = bool(getattr(args, "quick", False))
    providers = lst(ex.providers) or PROVIDERS
    bad = [p for p in providers if p not in PROVIDERS]
    if bad:
        raise SystemExit(f"unknown providers {bad}; choose from {PROVIDERS}")
    deadline = getattr(args, "deadline", None)
    if deadline is None and getattr(args, "budget_s", None):
        deadline = time.monotonic() + float(args.budget_s)
    return {"batch": lst(getattr(args, "batch", None), int) or ([1, 16, 256] if quick else B_GRID),
            "vocabs": lst(getattr(args, "vocab", None), int) or VOCABS,
            "dtypes": lst(getattr(args, "dtype", None)) or DTYPES, "providers": providers,
            "reps": int(getattr(args, "reps", None) or (10 if quick else 25)),
            "out": getattr(args, "out", None), "no_plot": bool(getattr(args, "no_plot", False)),
            "deadline": deadline, "nproc": ex.nproc}


def run_dp_bench(args) -> int:
    """Entry point of ``python -m tokenspeed_kernel.bench dp``. Returns 0, 1 (a provider failed
    verification) or 2 (fewer than 2 GPUs)."""
    return run_ranks(_bench_rank, _options(args), "dp")
