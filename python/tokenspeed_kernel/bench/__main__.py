"""``python -m tokenspeed_kernel.bench {sampling,comm,dp,verify,verify-filters,all,smoke,render}``.

``render`` (CPU) merges sampling CSVs of one build measured in several calls (e.g. ``--dtype
fp32`` then ``--dtype bf16`` when one call cannot hold the grid) into one ``sampling.{csv,md,png}``.

``all`` (what ``make bench`` runs on a GPU) runs sampling, then verify, then comm, within one
time budget (``--budget-s``, default 420 s, headline shapes first). ``smoke`` (``make bench`` on a
CPU, with TRITON_INTERPRET=1) checks the reference / Triton / torch paths on tiny shapes.
Subcommand modules are imported lazily; a missing one is reported, not fatal, in ``all``.

The namespace handed to ``run_comm_bench(args)`` / ``run_verify_bench(args)`` carries: ``out``
(results parent dir or None: use ``report.results_dir(args.out, gpu_short)``), ``quick``,
``budget_s``, ``deadline`` (``time.monotonic()`` value to finish by, or None), ``reps``,
``no_plot``, ``warm_l2``, ``eager_only``, ``batch`` / ``vocab`` / ``dtype`` (comma lists or
None) and ``extra`` (unparsed arguments, for the module's own options).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

DEFAULT_BUDGET_S = 420.0      # `all` and `sampling`: well under the 8 min of a GPU call
RESERVE_S = {"verify": 90.0, "comm": 60.0}   # kept back from sampling's share in `all`


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None,
                   help="results parent dir (default: <repo>/bench/results); files go to "
                        "OUT/<gpu>/<bench>.{csv,md,png}")
    p.add_argument("--quick", action="store_true", help="small grid (a minute or two)")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"stop starting new shapes after this many seconds "
                        f"(default {DEFAULT_BUDGET_S:.0f}; smoke: 100)")
    p.add_argument("--reps", type=int, default=None,
                   help="samples per method (default: ~25 ms worth, 5..40)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--warm-l2", action="store_true",
                   help="do not flush L2 between samples (not comparable; for experiments)")
    p.add_argument("--eager-only", action="store_true", help="skip CUDA-graph replay")
    p.add_argument("--batch", default=None, help="comma list, e.g. 1,16,64")
    p.add_argument("--vocab", default=None, help="comma list, e.g. 151936,262144")
    p.add_argument("--dtype", default=None, help="comma list of fp32,bf16")


def _sampling_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default=None,
                   help="comma list of greedy,temp,top_k,top_p,top_k_top_p,min_p,proc,mixed")
    p.add_argument("--providers", default=None,
                   help="comma list of ours-cuda,ours-triton,torch,flashinfer")
    p.add_argument("--inputs", type=int, default=None,
                   help="input draws per shape, rotated through the timed samples (default 4; "
                        "fewer when they would exceed 1 GiB)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tokenspeed_kernel.bench",
                                description="tokenspeed-kernel benchmarks (docs/BENCHMARKS.md)")
    sub = p.add_subparsers(dest="cmd", required=True,
                           metavar="{sampling,comm,dp,verify,verify-filters,all,smoke,render}")
    s = sub.add_parser("sampling", help="sampling: ours vs torch / FlashInfer (GPU)")
    _common(s)
    _sampling_opts(s)
    s.add_argument("--cpu-dry-run", action="store_true", help=argparse.SUPPRESS)
    for name, h in (("comm", "TP communication (multi-GPU)"),
                    ("dp", "DP sampling: swap and dp_sample vs all-gather + sample (multi-GPU)"),
                    ("verify", "speculative verify (GPU)"),
                    ("verify-filters", "speculative verify with top-k / top-p (GPU)")):
        c = sub.add_parser(name, help=h)
        _common(c)
    a = sub.add_parser("all", help="sampling + verify + comm within one budget (GPU)")
    _common(a)
    _sampling_opts(a)
    sm = sub.add_parser("smoke", help="CPU check of the harness and backends (tiny shapes)")
    _common(sm)
    _sampling_opts(sm)
    r = sub.add_parser("render", help="merge sampling CSVs of one build into csv + md + png")
    r.add_argument("csvs", nargs="+", help="sampling.csv files (same git sha and GPU)")
    r.add_argument("--out", required=True, help="output directory (sampling.{csv,md,png})")
    r.add_argument("--note", action="append", default=[], help="extra bullet for the .md")
    r.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    return p


def _load(name: str, func: str):
    """The run function of bench/<name>.py, or (None, reason)."""
    try:
        mod = importlib.import_module(f"tokenspeed_kernel.bench.{name}")
    except ModuleNotFoundError as e:
        if e.name in (f"tokenspeed_kernel.bench.{name}",):
            return None, f"python/tokenspeed_kernel/bench/{name}.py does not exist yet"
        return None, f"importing bench/{name}.py failed: {type(e).__name__}: {e}"
    except Exception as e:
        return None, f"importing bench/{name}.py failed: {type(e).__name__}: {e}"
    fn = getattr(mod, func, None)
    if fn is None:
        return None, f"bench/{name}.py has no {func}(args)"
    return fn, None


def _run_module(name: str, func: str, args) -> int:
    fn, why = _load(name, func)
    if fn is None:
        print(f"[bench] {name} benchmark not available: {why}", file=sys.stderr, flush=True)
        return 2
    rc = fn(args)
    return int(rc or 0)


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.cmd in ("sampling", "smoke", "all"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    args.deadline = None
    if args.cmd == "render":
        from .report import render_sampling_csvs
        return render_sampling_csvs(args.csvs, args.out, args.note, plot=not args.no_plot)
    if args.cmd == "smoke":
        from .sampling import run_smoke
        return run_smoke(args)

    import torch
    if args.cmd == "sampling" and args.cpu_dry_run:   # development: the loop and reports on CPU
        from .sampling import run_sampling
        return run_sampling(args)
    if not torch.cuda.is_available():
        print(f"[bench] `{args.cmd}` needs a CUDA GPU; none here. GPU numbers need a GPU. "
              "On a CPU run `TRITON_INTERPRET=1 python -m tokenspeed_kernel.bench smoke`.",
              file=sys.stderr, flush=True)
        if args.cmd == "all":
            print("[bench] running the CPU smoke instead", file=sys.stderr, flush=True)
            from .sampling import run_smoke
            args.budget_s = None
            return run_smoke(args)
        return 2

    if args.cmd == "sampling":
        from .sampling import run_sampling
        return run_sampling(args)
    if args.cmd == "comm":
        return _run_module("comm", "run_comm_bench", args)
    if args.cmd == "dp":
        return _run_module("dp", "run_dp_bench", args)
    if args.cmd == "verify":
        return _run_module("verify", "run_verify_bench", args)
    if args.cmd == "verify-filters":
        return _run_module("verify_filters", "run_verify_filters_bench", args)

    # all: sampling, verify, comm inside one budget; headline work first
    t0 = time.monotonic()
    budget = args.budget_s or DEFAULT_BUDGET_S
    present = {n: _load(n, f)[0] is not None
               for n, f in (("verify", "run_verify_bench"), ("comm", "run_comm_bench"))}
    reserve = RESERVE_S["verify"] * present["verify"]
    if present["comm"] and torch.cuda.device_count() >= 2:
        reserve += RESERVE_S["comm"]
    rcs = []
    from .sampling import run_sampling
    args.deadline = t0 + max(budget - reserve, 0.5 * budget)
    print(f"[bench] all: budget {budget:.0f}s; sampling until +{args.deadline - t0:.0f}s",
          file=sys.stderr, flush=True)
    rcs.append(run_sampling(args))
    args.deadline = t0 + budget - (RESERVE_S["comm"] if present["comm"] and
                                   torch.cuda.device_count() >= 2 else 0.0)
    rcs.append(_run_module("verify", "run_verify_bench", args))
    args.deadline = t0 + budget
    rcs.append(_run_module("comm", "run_comm_bench", args))
    print(f"[bench] all finished in {time.monotonic() - t0:.0f}s "
          f"(sampling rc={rcs[0]}, verify rc={rcs[1]}, comm rc={rcs[2]})",
          file=sys.stderr, flush=True)
    # a missing module (rc 2) is reported above but does not fail `all`
    return max([rc for rc in rcs if rc != 2] or [0])


if __name__ == "__main__":
    sys.exit(main())
