"""Verify with top-k / top-p: ``python -m tokenspeed_kernel.bench verify-filters``.

Probabilistic chain verify from logits as in ``bench verify`` (same logits: target N(0, 3^2),
draft = target + N(0, 1), temperature 0.8), with the filters engines use applied to target and
draft rows alike, and the drafts sampled from the filtered draft distribution:

* ``temp``         temperature only (the reference point: no thresholds);
* ``top_p``        top-p 0.9;
* ``top_k_top_p``  top-k 50, then top-p 0.9 on the top-k mass.

Providers:

* ``ours-cuda``          ``ops.verify(..., backend="cuda")``: thresholds by the radix select
                         (the sampler's levels, several CTAs per row);
* ``ours-cuda-bisect``   the same call with the ``verify_bisect_thresholds`` knob (``tokenspeed_kernel.testing``): the bisection
                         kernel that computed the thresholds before (one CTA per row, ~113
                         passes over the row) -- the "before" of the radix change, same run;
* ``flashinfer``         ``softmax(T)`` of target and draft, ``top_k_renorm_probs`` /
                         ``top_p_renorm_probs`` on both (per-row tensors), then
                         ``chain_speculative_sampling`` (when ``import flashinfer.sampling``
                         works). FlashInfer's renormalization is its own (float) top-p rule, not
                         our fixed-point one: a timing baseline, checked for shape, range and
                         "q == p accepts every draft".

Grid: bs in {1, 16, 64}, n = 3, V = 151936, fp32 and bf16 (``--batch`` / ``--vocab`` /
``--dtype`` override). Timing, floor and checks as in ``bench verify`` (ours: tokens of the
first requests identical to the reference before timing). Results:
``bench/results/<gpu>/verify_filters.{csv,md,png}``.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch

from . import report
from .verify import (DTYPES, TEMP, Problem, _check_fi, _check_ours, _plot, _time,
                     bench_start, check_and_time, log, set_ratio, shape_summary)

MODES = {"temp": {}, "top_p": {"top_p": 0.9}, "top_k_top_p": {"top_k": 50, "top_p": 0.9}}
BATCH = [1, 16, 64]
NDRAFT = 3
VOCAB = [151936]
PROVIDERS = ["ours-cuda", "ours-cuda-bisect", "flashinfer"]
CSV_COLUMNS = [
    "gpu", "gpu_short", "torch", "cuda", "triton", "flashinfer", "git_sha", "date",
    "provider", "mode", "dtype", "V", "bs", "n", "status", "graph_us", "graph_p20", "graph_p80",
    "eager_us", "eager_p20", "eager_p80", "host_us", "floor_us", "pct_floor",
    "ratio_vs_bisect", "ratio_vs_flashinfer", "calls", "samples"]


def filter_params(pb: Problem, mode: str) -> Dict[str, torch.Tensor]:
    """Per-request filter tensors (temperature, top_k / top_p) of ``mode`` (a key of ``MODES``)."""
    dev = pb.tgt.device
    out = {"temperature": pb.T}
    for k, v in MODES[mode].items():
        out[k] = torch.full((pb.bs,), v, device=dev,
                            dtype=torch.int32 if k == "top_k" else torch.float32)
    return out


def ours_call(mode: str, bisect: bool):
    """``call(pb, tgt, drf)``: CUDA ``ops.verify`` with ``pb.filt`` (``filter_params``), the radix
    thresholds or (``bisect``) the bisection ones -- the callable the bench times."""
    from .. import ops, testing

    def call(pb: Problem, tgt, drf):
        with testing.knobs(verify_bisect_thresholds=bisect):
            return ops.verify(tgt, pb.ids, pb.seed, pb.offset, cu_num_draft=pb.cu,
                              draft_logits=drf, max_num_draft=pb.n, backend="cuda",
                              validate=False, **pb.filt)
    return call


def _fi(fs, mode: str):
    import inspect
    kk = MODES[mode].get("top_k")
    pp = MODES[mode].get("top_p")
    # explicit seed / offset where this FlashInfer takes them (as in bench verify)
    kw = ({"seed": 12345, "offset": 0}
          if "seed" in inspect.signature(fs.chain_speculative_sampling).parameters else {})

    def probs(logits, T):
        p = fs.softmax(logits, temperature=T)
        if kk is not None:
            p = fs.top_k_renorm_probs(p, torch.full((p.shape[0],), kk, device=p.device,
                                                    dtype=torch.int32))
        if pp is not None:
            p = fs.top_p_renorm_probs(p, torch.full((p.shape[0],), pp, device=p.device))
        return p

    def call(pb: Problem, tgt, drf, ids=None):
        tp = probs(tgt, pb.T_rows_t)
        dp = probs(drf, pb.T_rows_d)
        return fs.chain_speculative_sampling(dp.view(pb.bs, pb.n, pb.V),
                                             pb.ids_fi if ids is None else ids,
                                             tp.view(pb.bs, pb.n + 1, pb.V), **kw)
    return call


def _grid(args):
    def lst(s, conv):
        return [conv(x) for x in s.split(",")] if s else None
    bs = lst(getattr(args, "batch", None), int) or BATCH
    V = lst(getattr(args, "vocab", None), int) or VOCAB
    dts = lst(getattr(args, "dtype", None), str) or list(DTYPES)
    modes = list(MODES)
    for e in getattr(args, "extra", None) or []:
        if e.startswith("--modes="):
            modes = e.split("=", 1)[1].split(",")
    return bs, V, dts, modes


def run_verify_filters_bench(args) -> int:
    from ..ops import sampling as S
    start = bench_start(args, "verify-filters")
    if start is None:
        return 2
    t0, deadline, device, env, hbm = start
    from .. import _library
    avail: Dict[str, Optional[str]] = {}
    why_ext = None if _library.extension_available() else \
        f"extension not loaded ({_library.extension_error()})"
    avail["ours-cuda"] = avail["ours-cuda-bisect"] = why_ext
    fs = None
    try:
        import flashinfer.sampling as fs  # noqa: F811
        for f in ("chain_speculative_sampling", "top_k_renorm_probs", "top_p_renorm_probs"):
            if not hasattr(fs, f):
                raise ImportError(f"no {f}")
        avail["flashinfer"] = None
    except Exception as e:
        avail["flashinfer"] = f"not available ({type(e).__name__}: {str(e).splitlines()[0]})"
    bss, Vs, dts, modes = _grid(args)
    rows: List[Dict] = []
    stop = False
    for dt in dts:
        for V in Vs:
            for bs in bss:
                if time.monotonic() > deadline:
                    stop = True
                    break
                n = NDRAFT
                pb = Problem(bs, n, V, DTYPES[dt], device)
                if avail["flashinfer"] is None:
                    pb.T_rows_t = torch.full((bs * (n + 1),), TEMP, device=device)
                    pb.T_rows_d = torch.full((bs * n,), TEMP, device=device)
                    # contiguous: FlashInfer rejects the strided view
                    pb.tgt_as_draft = pb.tgt.view(bs, n + 1, V)[:, :n].reshape(
                        bs * n, V).contiguous()
                floor_us = pb.bytes / (hbm * 1e3)
                for mode in modes:
                    pb.filt = filter_params(pb, mode)
                    # drafts from the filtered draft distribution (what a drafter with the same
                    # parameters proposes; q == p check: the same for the target rows)
                    r = torch.arange(bs * n, device=device)
                    rowf = {a: t.repeat_interleave(n) for a, t in pb.filt.items()}
                    pb.ids = S.sample(pb.drf, r + 99991, torch.zeros_like(r), validate=False,
                                      **rowf).tokens
                    if avail["flashinfer"] is None:
                        pb.ids_fi = pb.ids.view(bs, n).to(torch.int32)
                        pb.ids_same = S.sample(pb.tgt_as_draft, r + 7, torch.zeros_like(r),
                                               validate=False, **rowf).tokens
                    calls = {"ours-cuda": ours_call(mode, False),
                             "ours-cuda-bisect": ours_call(mode, True),
                             "flashinfer": _fi(fs, mode) if fs is not None else None}
                    shape_rows = []
                    for prov in PROVIDERS:
                        row = dict(env, provider=prov, mode=mode, dtype=dt, V=V, bs=bs, n=n,
                                   floor_us=floor_us)
                        why = avail[prov]
                        if prov == "ours-cuda-bisect" and mode == "temp":
                            why = "same kernels as ours-cuda (no thresholds)"
                        c = calls[prov]
                        check_and_time(
                            row, why,
                            (lambda: _check_fi(pb, c)) if prov == "flashinfer" else
                            (lambda: _check_ours(pb, c, prov)),
                            lambda: _time(c, pb, args, device), pb.bytes)
                        rows.append(row)
                        shape_rows.append(row)
                    by = {r["provider"]: r for r in shape_rows if r.get("status") == "ok"}
                    c = by.get("ours-cuda")
                    if c:
                        set_ratio(c, "ratio_vs_bisect", by.get("ours-cuda-bisect"))
                        set_ratio(c, "ratio_vs_flashinfer", by.get("flashinfer"))
                    log(f"[verify-filters] {dt} V={V} n={n} bs={bs} {mode}: "
                        + shape_summary(shape_rows))
                pb = None   # frees the logits before empty_cache
                torch.cuda.empty_cache()
            if stop:
                break
        if stop:
            break
    if stop:
        log("[verify-filters] budget reached: remaining shapes skipped")
    _write(rows, env, hbm, args, avail)
    log(f"[verify-filters] done in {time.monotonic() - t0:.0f}s")
    return 0 if all(r["status"] == "ok" or not r["provider"].startswith("ours")
                    or r["status"].startswith("same kernels") for r in rows) else 1


def _cell(r) -> str:
    if r is None or r.get("status") != "ok":
        return "–"
    g, e = r.get("graph_us"), r.get("eager_us")
    return f"{report.fmt(g)} ({report.fmt(e)})" if g is not None else f"({report.fmt(e)})"


def _markdown(rows, env, hbm, avail) -> str:
    lines = ["# Verify with top-k / top-p", "", report.env_header(env), "",
             f"HBM read bandwidth measured in this run: **{hbm:.0f} GB/s**; floor = one read of "
             "the target and draft logits. Probabilistic chain verify, n = 3, temperature 0.8, "
             "the problems of `bench verify`. CUDA-graph replay, cold L2, median µs per call "
             "(eager in parentheses). ours-cuda-bisect = the thresholds' bisection kernel (the "
             "path before the radix select; now the tests' oracle), same run. FlashInfer = "
             "softmax + top_k_renorm_probs / top_p_renorm_probs of target and draft + "
             "chain_speculative_sampling (its own float top-p rule).", ""]
    for k, v in avail.items():
        if v:
            lines.append(f"- {k}: {v}")
    lines.append("")
    groups = list(dict.fromkeys((r["dtype"], r["V"]) for r in rows))
    for dt, V in groups:
        lines += [f"## {dt}, V = {V}, n = {NDRAFT}", ""]
        body = []
        for mode in dict.fromkeys(r["mode"] for r in rows):
            for bs in dict.fromkeys(r["bs"] for r in rows):
                by = {r["provider"]: r for r in rows
                      if (r["dtype"], r["V"], r["mode"], r["bs"]) == (dt, V, mode, bs)}
                if not by:
                    continue
                c = by.get("ours-cuda") or {}
                body.append([mode, bs, report.fmt(next(iter(by.values()))["floor_us"], 2)]
                            + [_cell(by.get(p)) for p in PROVIDERS]
                            + [report.fmt(c.get("pct_floor")),
                               report._ratio(c.get("ratio_vs_bisect")),
                               report._ratio(c.get("ratio_vs_flashinfer"))])
        lines.append(report.md_table(["filters", "bs", "floor µs"] + PROVIDERS
                                     + ["CUDA % of floor", "CUDA / bisect", "CUDA / FI"], body))
        lines.append("")
    return "\n".join(lines)


def _write(rows, env, hbm, args, avail) -> None:
    d = report.results_dir(getattr(args, "out", None), env["gpu_short"])
    report.write_csv(d / "verify_filters.csv", rows, CSV_COLUMNS)
    (d / "verify_filters.md").write_text(_markdown(rows, env, hbm, avail) + "\n")
    png = None if getattr(args, "no_plot", False) else _plot(
        rows, d, panel="mode", providers=PROVIDERS, fname="verify_filters.png")
    log(f"[verify-filters] wrote {d / 'verify_filters.csv'}, verify_filters.md"
        + (f", {png}" if png else ""))
    body = [[r["dtype"], r["mode"], r["bs"], r["provider"],
             report.fmt(r.get("graph_us")) if r.get("status") == "ok" else r["status"][:40],
             report.fmt(r.get("pct_floor"))] for r in rows]
    print("\nverify-filters: graph-replay us per call, cold L2")
    report.print_table(["dtype", "filters", "bs", "provider", "us", "% floor"], body)
