"""Benchmark of the TP all-gather along the hidden / vocab dimension (``ops.all_gather_hidden``).

Providers: ``p2p-cuda-ll`` and ``p2p-cuda-flag`` (the CUDA push kernel with its LL and flag
protocols forced, see ``ops.comm.cuda_protocol``), ``p2p-cuda-ll-pdl`` / ``p2p-cuda-flag-pdl``
(the same launched with ``enable_pdl=True``: programmatic dependent launch; in the timed graph
its N calls follow each other, so each call's launch overlaps the previous call -- the case of
an engine whose preceding kernel also triggers early), ``p2p-triton`` (the Triton push kernel),
``nccl+permute`` (``all_gather_into_tensor`` + permute, what the auto policy falls back to). The
markdown also shows what ``protocol="auto"`` picks at the default crossover
(``DEFAULT_LL_MAX_BYTES``) and NCCL's time divided by that pick's, plain and with PDL (both
protocols are timed at every size, so the table can be re-rendered for another crossover).
Grid: T in {1, 8, 32, 128, 512}; H in {7168 (hidden), 151936 (vocab)} bf16, and fp32 for the
vocab (logits). Even widths (H / W per rank).

Method (comm-specific; the single-GPU helper in bench/timing.py has no cross-rank alignment):

* every provider's output is checked bit-exact against ``torch.distributed.all_gather`` + cat on
  every rank before it is timed; a provider that fails (on any rank) is reported, never timed;
* a sample = one CUDA-graph replay of N back-to-back calls (N so that a sample is ~400 us,
  1..128: the skew between the ranks' starts is spread over N calls), preceded on the stream by
  a one-element NCCL all-reduce so that every rank's GPU starts the sample at (nearly) the same
  time; CUDA events around the replay; per-call time = event time / N. Eager samples (same N
  calls issued from Python) are reported separately;
* per sample the time is the MAX over ranks (a collective is as slow as its slowest rank);
  median and p20 / p80 over the samples;
* floor = incoming bytes per GPU / 450 GB/s (NVLink per direction), incoming bytes =
  T * H * elt * (W - 1) / W; ``% floor`` = floor / time;
* inputs are L2-warm (the sender's slice is tiny; each call writes its peers' memory).

Launch (>= 2 GPUs):

    python -m tokenspeed_kernel.bench comm [--quick] [--out DIR]     # spawns one process per GPU
    python -m tokenspeed_kernel.bench.comm [--nproc 2] [--quick]
    torchrun --nproc-per-node 2 -m tokenspeed_kernel.bench.comm [--quick]

Results: ``<out>/<gpu>/comm_all_gather_hidden.{csv,md,png}`` for 2 ranks,
``comm_all_gather_hidden_tp<N>.*`` for N ranks (``<out>`` defaults to the repository's
``bench/results``), with GPU name, torch / triton versions and git sha.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from . import report

NVLINK_GBPS = 450.0           # per direction per GPU (H100 / H200 NV18)
T_GRID = [1, 8, 32, 128, 512]
SHAPES = [("bf16", 7168), ("bf16", 151936), ("fp32", 151936)]
PROVIDERS = ["p2p-cuda-ll", "p2p-cuda-flag", "p2p-cuda-ll-pdl", "p2p-cuda-flag-pdl",
             "p2p-triton", "nccl+permute"]
# provider -> (backend, protocol, enable_pdl)
BACKEND_OF = {"p2p-cuda-ll": ("cuda", "ll", False), "p2p-cuda-flag": ("cuda", "flag", False),
              "p2p-cuda-ll-pdl": ("cuda", "ll", True), "p2p-cuda-flag-pdl": ("cuda", "flag", True),
              "p2p-triton": ("triton", "auto", False), "nccl+permute": ("nccl", "auto", False)}
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ESZ = {"bf16": 2, "fp16": 2, "fp32": 4}   # element bytes by the CSVs' dtype names
STEM = "comm_all_gather_hidden"
COLUMNS = ["gpu", "world", "dtype", "T", "H", "provider", "graph_us", "graph_p20", "graph_p80",
           "eager_us", "host_us", "calls", "samples", "num_blocks", "floor_us", "pct_floor",
           "gbps_in", "verified", "note", "torch", "triton", "cuda", "git_sha", "date"]


def stem_for(world: int) -> str:
    """File stem of a run's results: ``comm_all_gather_hidden`` for 2 ranks (the main table),
    ``comm_all_gather_hidden_tp<N>`` otherwise, so a 4- or 8-rank run never overwrites it."""
    return STEM if world == 2 else f"{STEM}_tp{world}"


# ---------------------------------------------------------------------------------------------
# environment / writers: the harness's shared ones (bench/report.py)
# ---------------------------------------------------------------------------------------------
def _env(device: torch.device) -> Dict[str, str]:
    return report.env_info(device)


def _write_csv(path: Path, rows: Sequence[Dict]) -> None:
    report.write_csv(path, rows, COLUMNS)


def _f(x, d=1) -> str:
    if x is None:
        return "–"
    return f"{x:.{d}f}" if abs(x) < 1000 else f"{x:.0f}"


def _markdown(rows: List[Dict], env: Dict[str, str], world: int, skipped: List[str]) -> str:
    lines = [f"# TP all-gather along hidden / vocab ({world} ranks)", "",
             f"GPU: **{env['gpu']}** x {world} · torch {env['torch']} (CUDA {env.get('cuda', '')})"
             f" · triton {env.get('triton', '')} · git {env['git_sha'][:12]} · {env['date']}", "",
             "CUDA-graph replay, median (p20–p80) per call in µs, max over ranks; floor = incoming "
             f"bytes / {NVLINK_GBPS:.0f} GB/s; % = floor / time. Every provider verified bit-exact "
             "against torch.distributed.all_gather before timing. Eager medians in the CSV. "
             "`auto picks`: the CUDA protocol `protocol=\"auto\"` chooses at the library's "
             f"default crossover (LL up to {_default_ll_max(world) // 1024} KiB of output); "
             "`NCCL ÷ auto`: NCCL + permute time / that protocol's time; `NCCL ÷ PDL`: the same "
             "over that protocol launched with programmatic dependent launch (`-pdl`: the "
             "graph's back-to-back calls overlap each other's launch).", ""]
    for dt, H in sorted({(r["dtype"], r["H"]) for r in rows}, key=lambda k: (k[1], k[0])):
        sub = [r for r in rows if r["dtype"] == dt and r["H"] == H]
        provs = [p for p in PROVIDERS if any(r["provider"] == p for r in sub)]
        auto_col = "p2p-cuda-ll" in provs and "p2p-cuda-flag" in provs and "nccl+permute" in provs
        pdl_col = ("p2p-cuda-ll-pdl" in provs and "p2p-cuda-flag-pdl" in provs
                   and "nccl+permute" in provs)
        lines += [f"## {dt}, H = {H} ({H // world} per rank)", "",
                  "| T | floor µs | " + " | ".join(f"{p} µs (%floor)" for p in provs)
                  + (" | auto picks | NCCL ÷ auto" if auto_col else "")
                  + (" | NCCL ÷ PDL" if pdl_col else "") + " |",
                  "|---|---|" + "---|" * len(provs) + ("---|---|" if auto_col else "")
                  + ("---|" if pdl_col else "")]
        for T in sorted({r["T"] for r in sub}):
            cells = []
            floor = None
            for p in provs:
                r = next((r for r in sub if r["T"] == T and r["provider"] == p), None)
                if r is None:
                    cells.append("–")
                    continue
                floor = r["floor_us"]
                if r["graph_us"] is None:
                    cells.append(r.get("note") or "–")
                else:
                    cells.append(f"{_f(r['graph_us'])} ({_f(r['graph_p20'])}–{_f(r['graph_p80'])}) "
                                 f"{_f(r['pct_floor'], 0)}%")
            pick = default_pick(world, T, H, ESZ.get(dt, 2))
            rn = next((r for r in sub if r["T"] == T and r["provider"] == "nccl+permute"), None)

            def over(prov):  # NCCL + permute time / prov's time at this T
                ra = next((r for r in sub if r["T"] == T and r["provider"] == prov), None)
                ok = ra and rn and ra.get("graph_us") and rn.get("graph_us")
                return f"{rn['graph_us'] / ra['graph_us']:.2f}×" if ok else "–"
            if auto_col:
                cells += [pick, over(f"p2p-cuda-{pick}")]
            if pdl_col:
                cells.append(over(f"p2p-cuda-{pick}-pdl"))
            lines.append(f"| {T} | {_f(floor, 2)} | " + " | ".join(cells) + " |")
        lines.append("")
    if skipped:
        lines += ["Skipped (time budget): " + ", ".join(skipped), ""]
    return "\n".join(lines)


def _default_ll_max(world: int) -> int:
    try:
        from ..ops.comm import default_ll_max_bytes
        return default_ll_max_bytes(world)
    except Exception:  # pragma: no cover
        return 0


def default_pick(world: int, T: int, H: int, esz: int) -> str:
    """The CUDA protocol that ``protocol="auto"`` picks at the library's default crossover
    (``default_ll_max_bytes(world)``) for T x H elements of esz bytes: "ll" or "flag". The bench
    communicators size their LL region for every shape, so their own auto would always say LL;
    the table, the bench's `auto` provider and tools/comm_scaling.py use this instead."""
    return "ll" if T * H * esz <= _default_ll_max(world) else "flag"


def _plot(rows: List[Dict], path: Path, world: int) -> Optional[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"[bench comm] no plot: matplotlib unavailable ({e})", file=sys.stderr)
        return None
    keys = sorted({(r["dtype"], r["H"]) for r in rows}, key=lambda k: (k[1], k[0]))
    if not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (dt, H) in zip(axes[0], keys):
        sub = [r for r in rows if r["dtype"] == dt and r["H"] == H and r["graph_us"] is not None]
        for p in PROVIDERS:
            pts = sorted((r["T"], r["graph_us"]) for r in sub if r["provider"] == p)
            if pts:
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=p)
        fl = sorted({(r["T"], r["floor_us"]) for r in sub})
        if fl:
            ax.plot([a for a, _ in fl], [b for _, b in fl], "k--", label="NVLink floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("µs per call (graph replay, max over ranks)")
        ax.set_title(f"{dt}, H = {H}, {world} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# timing across ranks
# ---------------------------------------------------------------------------------------------
def _quant(xs: Sequence[float]):
    s = sorted(xs)
    if not s:
        return None, None, None

    def q(p):
        pos = p * (len(s) - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return statistics.median(s), q(0.2), q(0.8)


def _max_over_ranks(vals: List[float], device) -> List[float]:
    import torch.distributed as dist
    t = torch.tensor(vals, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def bench_input(T: int, w: int, H: int, rank: int, dtype: torch.dtype, device):
    """Rank ``rank``'s ``[T, w]`` slice for the (T, H) point: reproducible random bit patterns
    (NaN payloads included), and the integer dtype to compare bits with."""
    gen = torch.Generator(device=device)
    gen.manual_seed(1000 * T + H + rank)
    it = torch.int16 if dtype != torch.float32 else torch.int32
    x = torch.randint(-30000, 30000, (T, w), generator=gen, device=device,
                      dtype=torch.int64).to(it).view(dtype)
    return x, it


def time_provider(fns, reps: int, device, align: torch.Tensor, graph: bool):
    """Per-call µs samples (max over ranks) of graph replays and of eager runs of ``fns``."""
    import torch.distributed as dist
    n = len(fns)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    res = {}

    def run_samples(run):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            dist.all_reduce(align)            # device-side alignment of the ranks
            starts[i].record()
            run()
            ends[i].record()
        torch.cuda.synchronize(device)
        local = [s.elapsed_time(e) * 1000.0 / n for s, e in zip(starts, ends)]
        return _max_over_ranks(local, device)

    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        g.replay()
        torch.cuda.synchronize(device)
        res["graph"] = run_samples(g.replay)
        del g
    res["eager"] = run_samples(lambda: [f() for f in fns])
    # host cost of one call (no sync): the Python op boundary
    torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for f in fns:
        f()
    host = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize(device)
    res["host"] = _max_over_ranks([host], device)[0]
    return res


# ---------------------------------------------------------------------------------------------
# the worker (one per rank)
# ---------------------------------------------------------------------------------------------
def _csv_list(s, conv=str):
    return None if not s else [conv(v) for v in str(s).split(",") if v.strip()]


def _bench_rank(opts: Dict) -> int:
    import torch.distributed as dist

    from ..ops import comm as oc
    from ..reference import comm as ref

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    say = (lambda *a: print("[bench comm]", *a, file=sys.stderr, flush=True)) if rank == 0 \
        else (lambda *a: None)
    t_grid = opts["tokens"]
    shapes = opts["shapes"]
    providers = opts["providers"]
    deadline = opts.get("deadline")
    align = torch.zeros(1, device=device)
    rows: List[Dict] = []
    skipped: List[str] = []
    failed = 0
    env = _env(device)
    for dtname in sorted({d for d, _ in shapes}, key=lambda d: ["bf16", "fp16", "fp32"].index(d)):
        dtype = DT[dtname]
        hs = [H for d, H in shapes if d == dtname]
        if any(H % (world * (16 // torch.empty((), dtype=dtype).element_size())) for H in hs):
            say(f"skip {dtname}: H not a multiple of {world} x 16 bytes")
            continue
        # LL region for every shape (so both protocols are measured everywhere)
        comm = oc.create_all_gather_comm(max_tokens=max(t_grid), max_total_width=max(hs),
                                         dtype=dtype, ll_max_bytes=1 << 40)
        if not comm.p2p:
            say(f"no P2P workspace ({comm.multimem_reason}): only nccl+permute is measured")
        for H in hs:
            w = H // world
            for T in t_grid:
                stop = torch.tensor([1.0 if (deadline and time.monotonic() > deadline) else 0.0],
                                    device=device)
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if stop.item() > 0:
                    skipped.append(f"{dtname}/H={H}/T={T}")
                    continue
                x, it = bench_input(T, w, H, rank, dtype, device)
                want = ref.all_gather_hidden_dist(x, comm.group)
                esz = x.element_size()
                bytes_in = T * H * esz * (world - 1) / world
                floor_us = bytes_in / (NVLINK_GBPS * 1e3)
                line = []
                for prov in providers:
                    backend, proto, pdl = BACKEND_OF[prov]
                    if proto == "auto" and backend == "cuda":
                        proto = default_pick(world, T, H, x.element_size())
                    row = {"gpu": env["gpu"], "world": world, "dtype": dtname, "T": T, "H": H,
                           "provider": prov, "floor_us": floor_us, "torch": env["torch"],
                           "triton": env.get("triton", ""), "cuda": env.get("cuda", ""),
                           "git_sha": env["git_sha"], "date": env["date"], "graph_us": None,
                           "num_blocks": oc._num_blocks(comm, T, [w] * world)
                           if backend != "nccl" else ""}
                    # availability is agreed at creation, so every rank takes the same branch
                    try:
                        oc.select_backend(comm, T, H, backend)
                        if pdl:
                            oc._pdl_flag(comm, True)   # sm_90+ only
                    except Exception as e:
                        row["note"] = f"unavailable: {str(e)[:80]}"
                        row["verified"] = "n/a"
                        rows.append(row)
                        line.append(f"{prov}=n/a")
                        continue
                    # ---- verify before timing (bit-exact, every rank) ----
                    outs = [torch.empty((T, H), dtype=dtype, device=device) for _ in range(2)]
                    ok = True
                    try:
                        for o in outs:
                            oc.all_gather_hidden_out(comm, x, o, backend=backend, protocol=proto,
                                                     enable_pdl=pdl)
                        torch.cuda.synchronize(device)
                        if comm.state is not None:
                            comm.check()
                        for o in outs:
                            ok = ok and torch.equal(o.view(it), want.view(it))
                    except Exception as e:
                        say(f"{prov} T={T} H={H} {dtname}: error {type(e).__name__}: {e}")
                        ok = False
                    okt = torch.tensor([1.0 if ok else 0.0], device=device)
                    dist.all_reduce(okt, op=dist.ReduceOp.MIN)
                    if okt.item() < 1:
                        row["verified"] = "FAILED"
                        row["note"] = "failed verification: not timed"
                        rows.append(row)
                        failed += 1
                        line.append(f"{prov}=FAILED")
                        continue
                    row["verified"] = "bit-exact"
                    # ---- time ----
                    # N calls per sample, ~400 us. The ranks presumably leave the aligning
                    # all-reduce some us apart, a skew that lands on a sample's first calls: with
                    # N <= 32 (until 6797ec7) the LL-PDL medians at T <= 32 moved by up to
                    # 0.85 us between runs whose LL kernels had identical SASS (COMM.md).
                    est = max(1.0, floor_us * 1.5 + 3.0)
                    n = max(1, min(128, int(400.0 / est)))
                    outs = [torch.empty((T, H), dtype=dtype, device=device) for _ in range(n)]
                    fns = [(lambda o=o, c=comm, xx=x, be=backend, pr=proto, pd=pdl:
                            oc.all_gather_hidden_out(c, xx, o, backend=be, protocol=pr,
                                                     enable_pdl=pd))
                           for o in outs]
                    reps = opts["reps"]
                    try:
                        res = time_provider(fns, reps, device, align, graph=not opts["eager_only"])
                    except Exception as e:
                        row["note"] = f"timing failed: {type(e).__name__}: {str(e)[:80]}"
                        rows.append(row)
                        line.append(f"{prov}=timing-failed")
                        continue
                    if comm.state is not None:
                        comm.check()
                    g = _quant(res.get("graph", []))
                    e = _quant(res["eager"])
                    row.update(graph_us=g[0], graph_p20=g[1], graph_p80=g[2], eager_us=e[0],
                               host_us=res["host"], calls=n, samples=reps)
                    best = g[0] if g[0] is not None else e[0]
                    row["pct_floor"] = 100.0 * floor_us / best if best else None
                    row["gbps_in"] = bytes_in / (best * 1e3) if best else None
                    rows.append(row)
                    line.append(f"{prov}={_f(g[0])}/{_f(e[0])}")
                say(f"{dtname} H={H} T={T}: floor {floor_us:.2f} us; graph/eager us: "
                    + " ".join(line))
        if comm.state is not None:
            comm.check()
        comm.close()
        torch.cuda.empty_cache()
    if rank == 0:
        out_dir = report.results_dir(opts.get("out"), env["gpu_short"])
        stem = stem_for(world)
        _write_csv(out_dir / f"{stem}.csv", rows)
        (out_dir / f"{stem}.md").write_text(_markdown(rows, env, world, skipped))
        png = None if opts.get("no_plot") else _plot(rows, out_dir / f"{stem}.png", world)
        print(_markdown(rows, env, world, skipped))
        say(f"wrote {out_dir / (stem + '.csv')}, .md" + (", .png" if png else ""))
    return 1 if failed else 0


def _spawn_entry(rank: int, world: int, port: int, fn, opts: Dict, rcs) -> None:
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    try:
        rcs[rank] = fn(opts)
    finally:
        dist.destroy_process_group()


def run_ranks(fn, opts: Dict, tag: str) -> int:
    """Runs ``fn(opts)`` (a module-level per-rank bench function returning 0 / 1) on every rank:
    under torchrun (RANK / WORLD_SIZE set) this process is one rank; otherwise one process per
    GPU is spawned (``opts["nproc"]``, default all visible GPUs) over NCCL. Returns the max rc
    over ranks, 1 when a rank raised, 2 with fewer than 2 GPUs. (The comm and dp benches.)"""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch.distributed as dist
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        torch.cuda.set_device(local)
        own = not dist.is_initialized()
        if own:
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        try:
            rc = fn(opts)
            t = torch.tensor([rc], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return int(t.item())
        finally:
            if own:
                dist.destroy_process_group()
    n = opts.get("nproc") or (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if n < 2 or n > torch.cuda.device_count():
        print(f"[bench {tag}] needs >= 2 GPUs (have {torch.cuda.device_count()}, asked {n})",
              file=sys.stderr)
        return 2
    import socket

    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rcs = mp.get_context("spawn").Manager().dict()
    try:
        mp.spawn(_spawn_entry, args=(n, port, fn, opts, rcs), nprocs=n, join=True)
    except Exception as e:  # a rank raised: its traceback is printed above
        print(f"[bench {tag}] a rank failed: {type(e).__name__}: {str(e)[-500:]}",
              file=sys.stderr)
        return 1
    return max([int(v) for v in rcs.values()] or [1])


def _options(args) -> Dict:
    """Options from the harness namespace (bench/__main__.py) or our own parser."""
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--nproc", type=int, default=None)
    extra.add_argument("--providers", default=None)
    extra.add_argument("--tokens", default=None)
    ex, _ = extra.parse_known_args(list(getattr(args, "extra", None) or []))
    quick = bool(getattr(args, "quick", False))
    tokens = (_csv_list(getattr(args, "batch", None), int) or _csv_list(ex.tokens, int)
              or ([1, 32, 512] if quick else T_GRID))
    dts = _csv_list(getattr(args, "dtype", None))
    hs = _csv_list(getattr(args, "vocab", None), int)
    shapes = [(d, H) for d, H in SHAPES if (dts is None or d in dts) and (hs is None or H in hs)]
    if hs is not None:   # explicit widths: every requested dtype (bf16 default)
        shapes = [(d, H) for d in (dts or ["bf16"]) for H in hs]
    providers = _csv_list(ex.providers or getattr(args, "providers", None)) or PROVIDERS
    bad = [p for p in providers if p not in BACKEND_OF]
    if bad:
        raise SystemExit(f"unknown providers {bad}; choose from {PROVIDERS}")
    reps = getattr(args, "reps", None) or (10 if quick else 30)
    deadline = getattr(args, "deadline", None)
    if deadline is None and getattr(args, "budget_s", None):
        deadline = time.monotonic() + float(args.budget_s)
    return {"tokens": tokens, "shapes": shapes, "providers": providers, "reps": int(reps),
            "out": getattr(args, "out", None), "no_plot": bool(getattr(args, "no_plot", False)),
            "eager_only": bool(getattr(args, "eager_only", False)),
            "deadline": deadline, "nproc": ex.nproc}


def run_comm_bench(args) -> int:
    """Entry point of ``python -m tokenspeed_kernel.bench comm`` (args: the harness namespace;
    see bench/__main__.py) and of ``python -m tokenspeed_kernel.bench.comm``. Under torchrun
    (RANK / WORLD_SIZE set) this process is one rank; otherwise one process per GPU is spawned
    (``--nproc N`` in the extra arguments, default all visible GPUs). Returns 0, 1 (a provider
    failed verification) or 2 (fewer than 2 GPUs)."""
    return run_ranks(_bench_rank, _options(args), "comm")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenspeed_kernel.bench.comm",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="results parent dir (default <repo>/bench/results)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--eager-only", action="store_true")
    p.add_argument("--batch", default=None, help="comma list of T (token counts)")
    p.add_argument("--vocab", default=None, help="comma list of H (total widths)")
    p.add_argument("--dtype", default=None, help="comma list of bf16,fp16,fp32")
    p.add_argument("--budget-s", type=float, default=None)
    args, extra = p.parse_known_args(argv)
    args.extra = extra
    args.deadline = None   # run_comm_bench derives it from --budget-s
    return run_comm_bench(args)


if __name__ == "__main__":
    sys.exit(main())
