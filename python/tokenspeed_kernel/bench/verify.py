"""Speculative verify benchmark: ``python -m tokenspeed_kernel.bench verify [--quick]``.

Probabilistic chain verify from logits (temperature 0.8, drafts sampled from the draft
distribution), everything that turns logits into tokens counted:

* ``ours-cuda``    ``ops.verify(..., backend="cuda")`` (2 kernels: per-position stats + final);
* ``ours-triton``  ``ops.verify(..., backend="triton")``;
* ``reference``    the PyTorch spec (only bs = 1: it sorts every row; eager, it syncs);
* ``flashinfer``   ``softmax(target logits, T)`` + ``softmax(draft logits, T)`` +
                   ``chain_speculative_sampling(draft_probs, ids, target_probs)`` (when
                   ``import flashinfer.sampling`` works);
* ``read-once``    not a verify: one Triton kernel that reads the target and the draft logits
                   once (a max per 64 KiB chunk) -- what a single streaming pass over the same
                   bytes costs at this size, launch included, timed the same way. It shows how
                   close any one-pass kernel can get to the floor (bytes / bandwidth) at each
                   shape.

Grid: bs in {1, 16, 64, 256}, n in {1, 3, 5, 8}, V in {151936, 262144}, fp32 and bf16
(``--quick``: bs {1, 16, 64}, n = 3, V = 151936). Timing: ``bench.timing.measure`` (CUDA-graph
replay and eager, cold L2, median with p20/p80). Floor = one HBM read of the target and draft
logits (bs * (2n + 1) rows) at the bandwidth measured in the same run. Every provider is checked
before it is timed (ours: tokens identical to the reference on the first requests and CUDA ==
Triton; FlashInfer: shape/range and "q == p accepts everything"); a failing provider is reported,
never timed. ``ours-*+proc``: the same call with logits processing of the target rows
(``processing=``, ``bench.sampling.make_processing``'s inputs; checked against the reference with
the same inputs). Results: ``bench/results/<gpu>/verify.{csv,md,png}``.
"""
from __future__ import annotations

import functools
import sys
import time
from typing import Dict, List, Optional

import torch

from . import report, timing

BATCH = [1, 16, 64, 256]
NDRAFT = [1, 3, 5, 8]
VOCAB = [151936, 262144]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TEMP = 0.8
PROVIDERS = ["ours-cuda", "ours-triton", "ours-cuda+proc", "ours-triton+proc", "reference",
             "flashinfer", "read-once"]
# +proc: the same call with logits processing of the target rows (bench.sampling's engine-like
# inputs: bias, penalties, a grammar mask, banned ids, min_tokens; ops.verify(processing=))
CSV_COLUMNS = [
    "gpu", "gpu_short", "torch", "cuda", "triton", "flashinfer", "git_sha", "date",
    "provider", "impl", "dtype", "V", "bs", "n", "status", "graph_us", "graph_p20", "graph_p80",
    "eager_us", "eager_p20", "eager_p80", "host_us", "floor_us", "pct_floor", "gbps",
    "ratio_vs_flashinfer", "ratio_vs_read_once", "accept_rate", "calls", "samples"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Problem:
    """Inputs of one shape: target logits [bs*(n+1), V], draft logits [bs*n, V] (target + noise),
    drafts sampled from the processed draft distribution."""

    def __init__(self, bs: int, n: int, V: int, dtype: torch.dtype, device, seed: int = 0):
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        self.bs, self.n, self.V, self.dtype = bs, n, V, dtype
        tgt = torch.randn(bs, n + 1, V, generator=g, device=device) * 3.0
        drf = tgt[:, :n] + torch.randn(bs, n, V, generator=g, device=device) * 1.0
        self.tgt = tgt.reshape(bs * (n + 1), V).to(dtype)
        self.drf = drf.reshape(bs * n, V).to(dtype)
        del tgt, drf
        self.T = torch.full((bs,), TEMP, device=device)
        self.seed = torch.arange(bs, device=device, dtype=torch.int64) * 7919 + 1
        self.offset = torch.full((bs,), 1000, device=device, dtype=torch.int64)
        self.cu = torch.arange(bs + 1, device=device, dtype=torch.int64) * n
        from ..ops import sampling as S
        rows = torch.arange(bs * n, device=device)
        s = S.sample(self.drf, rows + 99991, torch.zeros_like(rows),
                     temperature=torch.full((bs * n,), TEMP, device=device), validate=False)
        self.ids = s.tokens
        self.bytes = (self.tgt.numel() + self.drf.numel()) * self.tgt.element_size()

    def inputs(self):
        return (self.tgt, self.drf)


def row_us(r: Dict) -> Optional[float]:
    """A result row's time: graph replay, else eager (None if neither was measured)."""
    return r.get("graph_us") or r.get("eager_us")


def set_ratio(r: Dict, key: str, other: Optional[Dict]) -> None:
    """r[key] = r's time / other's time (None when either is missing)."""
    mine, theirs = row_us(r), other and row_us(other)
    r[key] = mine / theirs if (mine and theirs) else None


def shape_summary(rows: List[Dict]) -> str:
    """One progress line's worth: each provider's time, or the start of its status."""
    return ", ".join(f"{r['provider']} " + (f"{row_us(r):.1f}us" if r.get("status") == "ok"
                                            else r["status"][:40]) for r in rows)


def ours_call(backend: str, proc: bool = False):
    """``call(pb, tgt, drf)``: ``ops.verify`` on a :class:`Problem` with ``backend`` (probabilistic,
    temperature only, no value checks; with ``proc`` the processing inputs ``proc_inputs(pb)``)
    -- the callable the bench times; public for lab scripts."""
    from .. import ops

    def call(pb: Problem, tgt, drf):
        return ops.verify(tgt, pb.ids, pb.seed, pb.offset, cu_num_draft=pb.cu, draft_logits=drf,
                          temperature=pb.T, max_num_draft=pb.n, backend=backend, validate=False,
                          processing=proc_inputs(pb) if proc else None)
    return call


def proc_inputs(pb: Problem):
    """The engine-like processing inputs of ``pb``'s requests (``bench.sampling.make_processing``,
    made once per problem)."""
    if getattr(pb, "proc", None) is None:
        from .sampling import make_processing
        pb.proc = make_processing(pb.bs, pb.V, pb.tgt.device)[0]
    return pb.proc


def _first_requests(inp, k: int):
    """The processing inputs of the first k requests (for a small reference call)."""
    from ..reference import logits_processing as LP

    def csr(c):
        e = int(c.indptr[k])
        return LP.Csr(c.indptr[:k + 1], c.ids[:e], None if c.values is None else c.values[:e])

    return LP.map_requests(inp, lambda x: x[:k], csr)


def _fi_call(fs):
    import inspect
    params = inspect.signature(fs.chain_speculative_sampling).parameters

    def call(pb: Problem, tgt, drf, ids=None):
        tp = fs.softmax(tgt, temperature=pb.T_rows_t)
        dp = fs.softmax(drf, temperature=pb.T_rows_d)
        kw = {}
        if "seed" in params:
            kw = {"seed": pb.seed_fi, "offset": pb.offset_fi}
        return fs.chain_speculative_sampling(dp.view(pb.bs, pb.n, pb.V),
                                             pb.ids_fi if ids is None else ids,
                                             tp.view(pb.bs, pb.n + 1, pb.V), **kw)
    return call


_READ_ONCE = None


def _read_once_call():
    """The ``read-once`` provider (see the module doc): a max over every 64 KiB chunk of the
    target and the draft logits (flat, contiguous), one launch, one program per chunk."""
    global _READ_ONCE
    if _READ_ONCE is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _read_once(t_ptr, d_ptr, out_ptr, nt, nd, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            ct = tl.cdiv(nt, BLOCK)
            if pid < ct:
                offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(t_ptr + offs, mask=offs < nt, other=float("-inf"))
            else:
                offs = (pid - ct).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(d_ptr + offs, mask=offs < nd, other=float("-inf"))
            tl.store(out_ptr + pid, tl.max(x.to(tl.float32), 0))

        def call(pb: Problem, tgt, drf):
            block = 65536 // tgt.element_size()
            nt, nd = tgt.numel(), drf.numel()
            grid = triton.cdiv(nt, block) + triton.cdiv(nd, block)
            out = getattr(pb, "_ro_out", None)
            if out is None or out.numel() < grid:
                out = pb._ro_out = torch.empty(grid, dtype=torch.float32, device=tgt.device)
            _read_once[(grid,)](tgt, drf, out, nt, nd, BLOCK=block, num_warps=8)
            return out
        _READ_ONCE = call
    return _READ_ONCE


def _check_read_once(pb: Problem, call) -> Optional[str]:
    out = call(pb, pb.tgt, pb.drf)
    want = torch.maximum(pb.tgt.float().amax(), pb.drf.float().amax())
    if not torch.equal(out.amax(), want):
        return "read-once: max differs from torch.amax"
    return None


def _check_ours(pb: Problem, call, name) -> Optional[str]:
    """Tokens of the first requests identical to the reference (batch invariance makes a small
    reference call enough). The sampling parameters: ``pb.filt`` if set (bench verify-filters),
    else the temperature."""
    from .. import ops
    out = call(pb, pb.tgt, pb.drf)
    k = min(pb.bs, 2)
    filt = getattr(pb, "filt", None) or {"temperature": pb.T}
    proc = _first_requests(proc_inputs(pb), k) if name.endswith("+proc") else None
    ref = ops.verify(pb.tgt[:k * (pb.n + 1)], pb.ids[:k * pb.n], pb.seed[:k], pb.offset[:k],
                     cu_num_draft=pb.cu[:k + 1], draft_logits=pb.drf[:k * pb.n],
                     max_num_draft=pb.n, backend="reference", processing=proc,
                     **{a: t[:k] for a, t in filt.items()})
    if not torch.equal(out.tokens[:k], ref.tokens) or not torch.equal(out.num_accepted[:k],
                                                                      ref.num_accepted):
        return f"{name}: tokens differ from the reference"
    if not bool(out.valid.all()):
        return f"{name}: invalid rows"
    return None


def _check_fi(pb: Problem, call) -> Optional[str]:
    out = call(pb, pb.tgt, pb.drf)
    tok = out[0] if isinstance(out, (tuple, list)) else out
    if tuple(tok.shape) != (pb.bs, pb.n + 1):
        return f"flashinfer: output shape {tuple(tok.shape)}"
    if bool(((tok < -1) | (tok >= pb.V)).any()) or bool((tok[:, 0] < 0).any()):
        return "flashinfer: tokens out of range"
    # q == p: every draft sampled from p is accepted
    tok2 = call(pb, pb.tgt, pb.tgt_as_draft, pb.ids_same.view(pb.bs, pb.n).to(torch.int32))
    tok2 = tok2[0] if isinstance(tok2, (tuple, list)) else tok2
    if bool((tok2[:, :pb.n] != pb.ids_same.view(pb.bs, pb.n)).any()):
        return "flashinfer: q == p does not accept every draft"
    return None


def _time(call, pb: Problem, args, device) -> timing.Timing:
    est = timing.estimate_us(functools.partial(call, pb, pb.tgt, pb.drf))
    n = timing.pick_calls(est, pb.bytes)
    pool = [(pb.tgt, pb.drf)]
    while len(pool) < n:
        pool.append((pb.tgt.clone(), pb.drf.clone()))
    fns = [functools.partial(call, pb, t, d) for t, d in pool]
    return timing.measure(fns, reps=getattr(args, "reps", None),
                          cold_l2=not getattr(args, "warm_l2", False),
                          graph=not getattr(args, "eager_only", False), device=device)


def check_and_time(row: Dict, why: Optional[str], check, timer, nbytes: int) -> bool:
    """One provider at one shape: unless ``why`` (a reason not to run it) is set, ``check()``
    (None, or why the provider's output is wrong: it is then not timed), then ``timer()`` (a
    ``timing.Timing``); fills ``row`` (status, times, % of ``row["floor_us"]``, GB/s). True if
    timed. Timing errors give status ``FAILED: ...``."""
    if why is None:
        try:
            why = check()
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            torch.cuda.synchronize()
    if why is not None:
        row["status"] = why
        return False
    try:
        t = timer()
    except Exception as e:  # noqa: BLE001
        row["status"] = f"FAILED: {type(e).__name__}: {str(e)[:120]}"
        return False
    best = t.best_us
    row.update(status="ok", graph_us=t.graph_us, graph_p20=t.graph_p20, graph_p80=t.graph_p80,
               eager_us=t.eager_us, eager_p20=t.eager_p20, eager_p80=t.eager_p80,
               host_us=t.host_us, calls=t.calls, samples=t.samples,
               pct_floor=100.0 * row["floor_us"] / best if best else None,
               gbps=nbytes / (best * 1e3) if best else None)
    if t.graph_error:
        row["impl"] = f"graph failed: {t.graph_error[:80]}"
    return True


def _grid(args):
    def lst(s, conv):
        return [conv(x) for x in s.split(",")] if s else None
    quick = bool(getattr(args, "quick", False))
    bs = lst(getattr(args, "batch", None), int) or ([1, 16, 64] if quick else BATCH)
    V = lst(getattr(args, "vocab", None), int) or ([151936] if quick else VOCAB)
    dts = lst(getattr(args, "dtype", None), str) or (["fp32", "bf16"] if quick else
                                                     list(DTYPES))
    ns = [3] if quick else NDRAFT
    for e in getattr(args, "extra", None) or []:
        if e.startswith("--ndraft="):
            ns = [int(x) for x in e.split("=", 1)[1].split(",")]
    return bs, ns, V, dts


def bench_start(args, tag: str):
    """(t0, deadline, device, env, hbm GB/s) of a GPU bench run, or None without a GPU."""
    if not torch.cuda.is_available():
        log(f"[{tag}] needs a CUDA GPU")
        return None
    t0 = time.monotonic()
    deadline = getattr(args, "deadline", None) or (t0 + float(getattr(args, "budget_s", None)
                                                              or 230.0))
    device = torch.device("cuda", torch.cuda.current_device())
    env = report.env_info(device)
    hbm = timing.hbm_read_gbps(device)
    log(f"[{tag}] {env['gpu']}: HBM read {hbm:.0f} GB/s; budget {deadline - t0:.0f}s")
    return t0, deadline, device, env, hbm


def run_verify_bench(args) -> int:
    start = bench_start(args, "verify")
    if start is None:
        return 2
    t0, deadline, device, env, hbm = start
    avail: Dict[str, Optional[str]] = {}
    from .. import _library
    avail["ours-cuda"] = None if _library.extension_available() else \
        f"extension not loaded ({_library.extension_error()})"
    try:
        from ..triton import verify as _tv  # noqa: F401
        avail["ours-triton"] = None
    except Exception as e:
        avail["ours-triton"] = f"{type(e).__name__}: {e}"
    avail["reference"] = None
    fs = None
    try:
        import flashinfer.sampling as fs  # noqa: F811
        if not hasattr(fs, "chain_speculative_sampling"):
            raise ImportError("no chain_speculative_sampling")
        avail["flashinfer"] = None
    except Exception as e:
        avail["flashinfer"] = f"not available ({type(e).__name__}: {str(e).splitlines()[0]})"
    ro = None
    try:
        ro = _read_once_call()
        avail["read-once"] = None
    except Exception as e:
        avail["read-once"] = f"not available ({type(e).__name__}: {str(e).splitlines()[0]})"
    avail["ours-cuda+proc"], avail["ours-triton+proc"] = avail["ours-cuda"], avail["ours-triton"]
    calls = {"ours-cuda": ours_call("cuda"), "ours-triton": ours_call("triton"),
             "ours-cuda+proc": ours_call("cuda", proc=True),
             "ours-triton+proc": ours_call("triton", proc=True),
             "reference": ours_call("reference"), "flashinfer": _fi_call(fs) if fs else None,
             "read-once": ro}
    bss, ns, Vs, dts = _grid(args)
    rows: List[Dict] = []
    stop = False
    for dt in dts:
        for V in Vs:
            for n in ns:
                for bs in bss:
                    if time.monotonic() > deadline:
                        stop = True
                        break
                    pb = Problem(bs, n, V, DTYPES[dt], device)
                    if avail["flashinfer"] is None:
                        pb.T_rows_t = torch.full((bs * (n + 1),), TEMP, device=device)
                        pb.T_rows_d = torch.full((bs * n,), TEMP, device=device)
                        pb.ids_fi = pb.ids.view(bs, n).to(torch.int32)
                        pb.seed_fi = 12345
                        pb.offset_fi = 0
                        # contiguous: at n = 1 the reshape is a strided view (FlashInfer
                        # rejects it)
                        pb.tgt_as_draft = pb.tgt.view(bs, n + 1, V)[:, :n].reshape(
                            bs * n, V).contiguous()
                        from ..ops import sampling as S
                        r = torch.arange(bs * n, device=device)
                        pb.ids_same = S.sample(pb.tgt_as_draft, r + 7, torch.zeros_like(r),
                                               temperature=torch.full((bs * n,), TEMP,
                                                                      device=device),
                                               validate=False).tokens
                    floor_us = pb.bytes / (hbm * 1e3)
                    shape_rows = []
                    for prov in PROVIDERS:
                        row = dict(env, provider=prov, dtype=dt, V=V, bs=bs, n=n,
                                   floor_us=floor_us, impl="")
                        why = avail[prov]
                        if prov == "reference" and bs > 1:
                            why = "skipped (sorts every row; bs = 1 only)"
                        c = calls[prov]
                        check = {"flashinfer": lambda: _check_fi(pb, c),
                                 "read-once": lambda: _check_read_once(pb, c)}.get(
                                     prov, lambda: _check_ours(pb, c, prov))
                        if prov == "reference":
                            def timer():
                                ms = timing.cpu_time_ms(functools.partial(c, pb, pb.tgt, pb.drf),
                                                        n=2)
                                return timing.Timing(eager_us=ms * 1e3, calls=1, samples=2)
                        else:
                            def timer():
                                return _time(c, pb, args, device)
                        if check_and_time(row, why, check, timer, pb.bytes) and \
                                prov == "ours-cuda":
                            o = c(pb, pb.tgt, pb.drf)
                            row["accept_rate"] = float(o.num_accepted.float().mean()) / n
                        rows.append(row)
                        if not row["status"].startswith("FAILED"):
                            shape_rows.append(row)
                    fi = next((r for r in shape_rows if r["provider"] == "flashinfer"
                               and r.get("status") == "ok"), None)
                    ro_row = next((r for r in shape_rows if r["provider"] == "read-once"
                                   and r.get("status") == "ok"), None)
                    for r in shape_rows:
                        if r.get("status") != "ok" or r["provider"] in ("flashinfer",
                                                                        "read-once"):
                            continue
                        if fi:
                            set_ratio(r, "ratio_vs_flashinfer", fi)
                        if ro_row:
                            set_ratio(r, "ratio_vs_read_once", ro_row)
                    c = next((r for r in shape_rows if r["provider"] == "ours-cuda"), {})
                    log(f"[verify] {dt} V={V} n={n} bs={bs}: " + shape_summary(shape_rows)
                        + (f" (floor {floor_us:.1f}us)" if c else ""))
                    pb = None   # frees the logits before empty_cache
                    torch.cuda.empty_cache()
                if stop:
                    break
            if stop:
                break
        if stop:
            break
    if stop:
        log("[verify] budget reached: remaining shapes skipped")
    _write(rows, env, hbm, args, avail)
    log(f"[verify] done in {time.monotonic() - t0:.0f}s")
    return 0 if all(r["status"] == "ok" or not r["provider"].startswith("ours")
                    for r in rows) else 1


def _markdown(rows, env, hbm, avail) -> str:
    lines = ["# Speculative verify benchmark", "", report.env_header(env), "",
             f"HBM read bandwidth measured in this run: **{hbm:.0f} GB/s**. Floor = one read of "
             "the target ((n + 1) rows per request) and draft (n rows) logits at that bandwidth.",
             "", "Probabilistic chain verify from logits, temperature 0.8, drafts sampled from the "
             "draft distribution (draft logits = target + N(0, 1) noise). CUDA-graph replay, cold "
             "L2, median µs per call (eager in parentheses); FlashInfer = 2 softmax + "
             "chain_speculative_sampling. read-once = one Triton kernel that only reads the same "
             "target and draft bytes once (no verify): the cost of a single streaming pass at "
             "this size, launch included, timed the same way.", ""]
    for k, v in avail.items():
        if v:
            lines.append(f"- {k}: {v}")
    lines.append("")
    provs = [p for p in PROVIDERS if any(r["provider"] == p and r.get("status") == "ok"
                                         for r in rows)]
    groups = list(dict.fromkeys((r["dtype"], r["V"]) for r in rows))
    for dt, V in groups:
        lines += [f"## {dt}, V = {V}", ""]
        keys = list(dict.fromkeys((r["n"], r["bs"]) for r in rows
                                  if (r["dtype"], r["V"]) == (dt, V)))
        body = []
        for n, bs in keys:
            by = {r["provider"]: r for r in rows
                  if (r["dtype"], r["V"], r["n"], r["bs"]) == (dt, V, n, bs)}
            c = by.get("ours-cuda") or {}
            floor = next(iter(by.values()))["floor_us"]
            cells = []
            for p in provs:
                r = by.get(p)
                if r is None or r.get("status") != "ok":
                    cells.append("–")
                    continue
                g, e = r.get("graph_us"), r.get("eager_us")
                cells.append(f"{report.fmt(g)} ({report.fmt(e)})" if g is not None else
                             f"({report.fmt(e)})")
            ro = by.get("read-once") or {}
            body.append([n, bs, report.fmt(floor, 2)] + cells
                        + [report.fmt(c.get("pct_floor")),
                           report.fmt(ro.get("pct_floor") if ro.get("status") == "ok" else None),
                           report._ratio(c.get("ratio_vs_flashinfer")),
                           report._ratio(c.get("ratio_vs_read_once")),
                           report.fmt(c.get("accept_rate"), 2)])
        lines.append(report.md_table(["n", "bs", "floor µs"] + provs
                                     + ["CUDA % of floor", "read-once % of floor", "CUDA / FI",
                                        "CUDA / read-once", "accept rate"], body))
        lines.append("")
    return "\n".join(lines)


def _plot(rows, d, panel: str = "n", providers=None, fname: str = "verify.png") -> Optional[str]:
    """Time vs batch, one panel per (dtype, V) row and value of ``panel`` (column)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    providers = providers or PROVIDERS
    groups = list(dict.fromkeys((r["dtype"], r["V"]) for r in rows))
    if not groups:
        return None
    ns = list(dict.fromkeys(r[panel] for r in rows))
    if panel == "n":
        ns.sort()
    fig, axes = plt.subplots(len(groups), len(ns), figsize=(4 * len(ns), 3.2 * len(groups)),
                             squeeze=False)
    for gi, (dt, V) in enumerate(groups):
        for ni, n in enumerate(ns):
            ax = axes[gi][ni]
            for ci, p in enumerate(providers + ["floor"]):
                pts = []
                for r in rows:
                    if (r["dtype"], r["V"], r[panel]) != (dt, V, n):
                        continue
                    if p == "floor" and r["provider"] == "ours-cuda":
                        pts.append((r["bs"], r["floor_us"]))
                    elif r["provider"] == p and r.get("status") == "ok":
                        pts.append((r["bs"], row_us(r)))
                if pts:
                    pts.sort()
                    style = {"floor": "--", "read-once": ":"}.get(p, "-")
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p,
                            linestyle=style, color=f"C{ci}")   # one color per provider
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{dt} V={V} {panel}={n}", fontsize=9)
            ax.set_xlabel("batch")
            ax.set_ylabel("µs")
            ax.grid(True, alpha=0.3)
    handles = {}
    for ax in axes.flat:   # every provider that appears in some panel
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    axes[0][0].legend(list(handles.values()), list(handles), fontsize=7)
    fig.tight_layout()
    path = d / fname
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _write(rows, env, hbm, args, avail) -> None:
    d = report.results_dir(getattr(args, "out", None), env["gpu_short"])
    report.write_csv(d / "verify.csv", rows, CSV_COLUMNS)
    (d / "verify.md").write_text(_markdown(rows, env, hbm, avail) + "\n")
    png = None if getattr(args, "no_plot", False) else _plot(rows, d)
    log(f"[verify] wrote {d / 'verify.csv'}, verify.md" + (f", {png}" if png else ""))
    # short stdout table (the tail of a remote run)
    body = []
    for r in rows:
        if r["provider"] == "ours-cuda":
            fi = next((x for x in rows if x["provider"] == "flashinfer" and x["status"] == "ok"
                       and (x["dtype"], x["V"], x["n"], x["bs"]) == (r["dtype"], r["V"], r["n"],
                                                                     r["bs"])), {})
            tr = next((x for x in rows if x["provider"] == "ours-triton" and x["status"] == "ok"
                       and (x["dtype"], x["V"], x["n"], x["bs"]) == (r["dtype"], r["V"], r["n"],
                                                                     r["bs"])), {})
            ro = next((x for x in rows if x["provider"] == "read-once" and x["status"] == "ok"
                       and (x["dtype"], x["V"], x["n"], x["bs"]) == (r["dtype"], r["V"], r["n"],
                                                                     r["bs"])), {})
            body.append([r["dtype"], r["V"], r["n"], r["bs"], report.fmt(r.get("floor_us"), 2),
                         report.fmt(r.get("graph_us")) if r.get("status") == "ok"
                         else r.get("status", "")[:30],
                         report.fmt(tr.get("graph_us")), report.fmt(fi.get("graph_us")),
                         report.fmt(r.get("pct_floor")), report.fmt(ro.get("graph_us")),
                         report.fmt(ro.get("pct_floor"))])
    print("\nverify: graph-replay us per call, cold L2")
    report.print_table(["dtype", "V", "n", "bs", "floor", "ours-cuda", "ours-triton",
                        "flashinfer", "% floor", "read-once", "ro % floor"], body)
