"""Testing and tuning knobs: the one door.

The kernels have rare paths (an exact fallback, a radix threshold path, a protocol variant) that
ordinary inputs seldom reach. Tests force them to compare every path with the reference, and A/B
benchmarks switch them to time the alternatives. Every such knob is listed in ``KNOBS`` and set
only through ``knobs()``, a context manager that validates the names and values and restores the
previous values on exit, also when the body raises::

    from tokenspeed_kernel import testing
    with testing.knobs(sampler_flags=testing.SAMPLER_FORCE_EXACT):
        out = ops.sample(logits, seed, offset, temperature=0.8, backend="cuda")

No knob changes a result: each one selects another path to the same tokens (the tests check
that). Knobs are process-global (not per thread or per stream) and are read when an op is
called, so a captured CUDA graph keeps the path that was set at capture time.

Environment variables read once at process start (not settable here):

* ``TOKENSPEED_KERNEL_NO_EXT=1``: do not load the compiled extension (pure Python / Triton).
* ``TOKENSPEED_VERIFY_TUNING=1`` enables the verify launch-policy overrides ``TS_VERIFY_FS``,
  ``TS_VERIFY_CS`` (forced split / cluster sizes), ``TS_VERIFY_NOSKIP`` (no position skipping)
  and ``TS_VERIFY_LISTSTATS`` (path counters); read by the CUDA extension (csrc/verify).
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Dict, Iterator, NamedTuple, Tuple


class Knob(NamedTuple):
    module: str           # where the value lives (read by that module's op wrappers)
    attr: str
    kind: Tuple[type, ...]
    doc: str


_S = "tokenspeed_kernel.ops.sampling"
_V = "tokenspeed_kernel.ops.verify"
_C = "tokenspeed_kernel.ops.comm"

# the CUDA sampler's testing bits, for ``sampler_flags`` (defined once, in ops/sampling.py:
# generic radix thresholds, the exact pass, no shared-memory staging, no split launches), and its
# launch-policy bits (``sampler_flags`` ORs them into the default, ``sampler_launch_flags``
# replaces the default): SAMPLER_SCAND_PROC, calls with processing may take the split-candidates
# launch; SAMPLER_SCAND_BAND, its top-k-off rows use band masses / the streamed gap test;
# SAMPLER_SCAND_RESCAN, its top-k-off rows with few forwarded keys read chunks again;
# SAMPLER_SCAND_DEFER, the rows its finishing CTA cannot decide go to a cluster launch after it;
# SAMPLER_SPLIT_WIDE, calls without filter tensors take the split launch up to SMs / 2 rows;
# SAMPLER_WIDE_DEFER, at one CTA per row (B > SMs / 2) with a top-p tensor, rows that CTA cannot
# decide from its candidates go to a launch of clusters after it; SAMPLER_HIST_TOPP, top-p rows
# without top-k on a cluster of CTAs are decided by a histogram of masses (these seven default);
# SAMPLER_SCAND_TOPP, calls with top-p but no top-k tensor take the
# split-candidates launch too (opt-in)
from .ops.sampling import (F_FORCE_EXACT as SAMPLER_FORCE_EXACT,  # noqa: E402
                           F_FORCE_GENERIC as SAMPLER_FORCE_GENERIC,
                           F_NO_RESIDENT as SAMPLER_NO_RESIDENT,
                           F_NO_SPLIT as SAMPLER_NO_SPLIT,
                           F_SCAND_PROC as SAMPLER_SCAND_PROC,
                           F_SCAND_BAND as SAMPLER_SCAND_BAND,
                           F_SCAND_TOPP as SAMPLER_SCAND_TOPP,
                           F_SCAND_RESCAN as SAMPLER_SCAND_RESCAN,
                           F_SCAND_DEFER as SAMPLER_SCAND_DEFER,
                           F_SPLIT_WIDE as SAMPLER_SPLIT_WIDE,
                           F_WIDE_DEFER as SAMPLER_WIDE_DEFER,
                           F_HIST_TOPP as SAMPLER_HIST_TOPP)
SAMPLER_CLUSTER_SHIFT = 10    # (v << 10), v = 1..5: a forced cluster size 2^(v - 1)

KNOBS: Dict[str, Knob] = {
    "sampler_flags": Knob(
        _S, "_CUDA_TEST_FLAGS", (int,),
        "OR of SAMPLER_* bits: force the CUDA sampler's rare paths, or opt into its launches "
        "that are not the default (SAMPLER_SCAND_TOPP) (ops.sample, dp_sample)"),
    "sampler_launch_flags": Knob(
        _S, "_DEFAULT_LAUNCH_FLAGS", (int,),
        "the CUDA sampler's default launch-policy bits (SAMPLER_SCAND_PROC | _BAND | _RESCAN | "
        "_DEFER, SAMPLER_SPLIT_WIDE, SAMPLER_WIDE_DEFER, SAMPLER_HIST_TOPP); 0 = the launches "
        "without them"),
    "levels_no_list": Knob(
        _S, "_NO_LEVEL_LIST_FOR_TESTING", (bool,),
        "radix levels (verify's thresholds): never compact a level's keys into the row's list"),
    "levels_no_excl": Knob(
        _S, "_NO_LEVEL_EXCL_FOR_TESTING", (bool,),
        "radix levels: histogram every key at level 0 of a top-p row"),
    "levels_excl_test": Knob(
        _S, "_LEVEL_EXCL_TEST_FOR_TESTING", (bool,),
        "radix levels: exclude the bins below m - 2 so that the redo path runs"),
    "verify_exact_coins": Knob(
        _V, "_EXACT_COINS_FOR_TESTING", (bool,),
        "verify: decide every acceptance coin with the exact sums"),
    "verify_exact_residual": Knob(
        _V, "_EXACT_RESIDUAL_FOR_TESTING", (bool,),
        "verify: sample every residual with the exact path"),
    "verify_bisect_thresholds": Knob(
        _V, "_BISECT_THRESHOLDS_FOR_TESTING", (bool,),
        "verify: top-k / top-p thresholds by bisection (the oracle) instead of radix levels"),
    "comm_unpipelined": Knob(
        _C, "_UNPIPELINED_FLAG_KERNEL_FOR_TESTING", (bool,),
        "all-gather: copy-out through the unpipelined flag kernel"),
    "comm_ll_variant": Knob(
        _C, "_LL_VARIANT_FOR_TESTING", (str, type(None)),
        "all-gather: force an LL packing (see ops/comm.py _LL_VARIANT_FLAGS), None = by size"),
}


def _target(name: str):
    if name not in KNOBS:
        raise ValueError(f"unknown knob {name!r}; known: {sorted(KNOBS)}")
    k = KNOBS[name]
    return importlib.import_module(k.module), k


def get(name: str) -> Any:
    """The current value of knob ``name``."""
    mod, k = _target(name)
    return getattr(mod, k.attr)


@contextlib.contextmanager
def knobs(**settings: Any) -> Iterator[None]:
    """Set the named knobs for the body of the ``with`` block, then restore them."""
    resolved = []
    for name, value in settings.items():
        mod, k = _target(name)
        if isinstance(value, bool) and bool not in k.kind:
            raise TypeError(f"knob {name}: expected {k.kind[0].__name__}, got bool")
        if not isinstance(value, k.kind):
            raise TypeError(f"knob {name}: expected {' or '.join(t.__name__ for t in k.kind)}, "
                            f"got {type(value).__name__}")
        resolved.append((mod, k.attr, value))
    old = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in resolved]
    try:
        for mod, attr, value in resolved:
            setattr(mod, attr, value)
        yield
    finally:
        for mod, attr, value in reversed(old):
            setattr(mod, attr, value)


def describe() -> str:
    """One line per knob: name, current value, what it does."""
    return "\n".join(f"{n}: {get(n)!r}  ({k.doc})" for n, k in KNOBS.items())


__all__ = ["KNOBS", "Knob", "knobs", "get", "describe", "SAMPLER_FORCE_GENERIC",
           "SAMPLER_FORCE_EXACT", "SAMPLER_NO_RESIDENT", "SAMPLER_NO_SPLIT",
           "SAMPLER_SCAND_PROC", "SAMPLER_SCAND_BAND", "SAMPLER_SCAND_TOPP",
           "SAMPLER_SCAND_RESCAN", "SAMPLER_SCAND_DEFER", "SAMPLER_SPLIT_WIDE",
           "SAMPLER_WIDE_DEFER", "SAMPLER_HIST_TOPP",
           "SAMPLER_CLUSTER_SHIFT"]
