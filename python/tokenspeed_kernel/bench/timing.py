"""The one timing helper of the benchmarks.

``measure(fns)`` times a list of N zero-argument callables, each reading its *own* copy of the
inputs, as one "sample" (N back-to-back calls) and reports the per-call time of

* **graph replay**: the N calls captured in one CUDA graph, replayed (what a decode loop sees);
* **eager**: the N calls issued from Python (includes the host cost of the op when the GPU is
  faster than the host).

Method (docs/BENCHMARKS.md says the same):

* warm-up: every callable runs once on a side stream before capture (JIT, handles, caches),
  then one untimed graph replay / eager sample;
* cold L2: before every sample the L2 is flushed by **reading** a 256 MiB buffer (>= 4x the
  L2 of an H100/H200, more if the device reports a larger L2). Reading leaves clean lines, so no
  write-back of a flush lands in the timed window (a memset flush, as in
  ``triton.testing.do_bench``, leaves the L2 full of dirty lines). Inside one sample each call
  reads a distinct input copy, so every call starts with its inputs outside L2; intermediates a
  call writes and re-reads itself may hit L2, as they would in a real decode step;
* input draws (optional ``prepare`` hook): before each sample (ahead of its flush, so outside
  the timed window) the caller may copy other inputs into the copies, e.g. the sampling bench
  rotates several random draws so that input-dependent slow paths are timed as often as they
  occur;
* graph samples: flush, a short spin kernel (so the host has submitted the replay before the GPU
  reaches the start event), start event, replay, end event. Eager samples: flush, synchronize,
  start event, the N calls, end event (the GPU idles while Python launches: host overhead counts);
* CUDA events; the per-call time of a sample is its event time / N; we report the median and the
  20th / 80th percentiles over the samples.

``host_overhead_us`` measures the CPU time of the Python call alone (no synchronize), and
``hbm_read_gbps`` the HBM read bandwidth (a large ``amax``) that the "% of floor" columns use.
"""
from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch

FLUSH_BYTES = 256 << 20          # bytes read between samples to evict L2
SPIN_CYCLES = 200_000            # ~100 us spin before a graph sample's start event
TARGET_SAMPLE_US = 300.0         # aim for samples of about this length (N calls)
MAX_CALLS = 32                   # N at most
MAX_COPY_BYTES = 1 << 30         # input copies of one measurement: at most this many bytes


@dataclass
class Timing:
    """Per-call times in microseconds (None when that method was not measured)."""
    graph_us: Optional[float] = None
    graph_p20: Optional[float] = None
    graph_p80: Optional[float] = None
    eager_us: Optional[float] = None
    eager_p20: Optional[float] = None
    eager_p80: Optional[float] = None
    host_us: Optional[float] = None
    calls: int = 0                 # N: calls per sample (distinct input copies)
    samples: int = 0               # samples per method
    graph_error: Optional[str] = None

    @property
    def best_us(self) -> Optional[float]:
        return self.graph_us if self.graph_us is not None else self.eager_us


def quantiles(xs: Sequence[float]):
    """(median, p20, p80) with linear interpolation."""
    s = sorted(xs)
    if not s:
        return None, None, None

    def q(p):
        if len(s) == 1:
            return s[0]
        pos = p * (len(s) - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return statistics.median(s), q(0.2), q(0.8)


class L2Flusher:
    """Evicts L2 by reading a buffer several times its size (clean lines, no write-back)."""

    def __init__(self, device=None, nbytes: Optional[int] = None):
        device = torch.device(device or "cuda")
        l2 = 0
        try:
            l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
        except Exception:
            pass
        self.nbytes = int(nbytes or max(FLUSH_BYTES, 4 * l2))
        self.buf = torch.ones(self.nbytes // 4, dtype=torch.float32, device=device)
        self.out = torch.empty((), dtype=torch.float32, device=device)

    def flush(self) -> None:
        torch.amax(self.buf, dim=0, out=self.out)


_FLUSHERS = {}


def flusher(device=None) -> L2Flusher:
    key = str(torch.device(device or "cuda"))
    if key not in _FLUSHERS:
        _FLUSHERS[key] = L2Flusher(device)
    return _FLUSHERS[key]


def _spin() -> None:
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(SPIN_CYCLES)


def estimate_us(fn: Callable[[], Any], n: int = 3) -> float:
    """Rough eager per-call time (after one warm-up call): picks N and the sample count."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return max(s.elapsed_time(e) * 1000.0 / n, 0.5)


def pick_calls(est_us: float, bytes_per_copy: int, *, target_us: float = TARGET_SAMPLE_US,
               max_calls: int = MAX_CALLS, max_bytes: int = MAX_COPY_BYTES) -> int:
    """N calls per sample: enough to make a sample ~target_us long, within the copy budget."""
    n = int(math.ceil(target_us / max(est_us, 1e-3)))
    n = min(n, max_calls, max(1, max_bytes // max(bytes_per_copy, 1)))
    return max(1, n)


def _reps(sample_us: float, target_ms: float, min_reps: int, max_reps: int) -> int:
    per = sample_us + 150.0   # flush + spin + event overheads
    return int(min(max(min_reps, round(target_ms * 1000.0 / per)), max_reps))


def _timed(run: Callable[[], Any], n_calls: int, reps: int, *, cold_l2: bool, spin: bool,
           sync_first: bool, device, prepare: Optional[Callable[[], Any]] = None) -> List[float]:
    fl = flusher(device) if cold_l2 else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if prepare is not None:   # stream-ordered before the flush: outside the timed window
            prepare()
        if fl is not None:
            fl.flush()
        if sync_first:
            torch.cuda.synchronize()
        elif spin:
            _spin()
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / n_calls for s, e in zip(starts, ends)]


def measure(fns: Sequence[Callable[[], Any]], *, graph: bool = True, eager: bool = True,
            host: bool = True, cold_l2: bool = True, reps: Optional[int] = None,
            target_ms: float = 25.0, min_reps: int = 5, max_reps: int = 40,
            device=None, prepare: Optional[Callable[[int], Any]] = None) -> Timing:
    """Time ``fns`` (N callables, each on its own input copy) as described in the module doc.

    ``reps`` fixes the number of samples per method; otherwise it is chosen so that each method
    takes about ``target_ms`` (clamped to [min_reps, max_reps]). A graph that cannot be captured
    (an op that synchronizes, ...) is reported in ``graph_error`` and eager is still measured.
    ``prepare(i)``, when given, runs before the i-th timed sample (i = 0, 1, ... over both
    methods), ahead of its L2 flush: e.g. copying another input draw into the callables' copies.
    """
    fns = list(fns)
    n = len(fns)
    assert n >= 1
    device = device or torch.device("cuda", torch.cuda.current_device())
    t = Timing(calls=n)
    counter = itertools.count()
    prep = None if prepare is None else (lambda: prepare(next(counter)))

    # warm-up on a side stream (required before capture; also triggers lazy init / JIT)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize()

    def eager_run():
        for f in fns:
            f()

    if graph:
        g = None
        keep: List[Any] = []   # outputs of the captured calls (they live in the graph's pool)
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                keep.extend(f() for f in fns)
            g.replay()
            torch.cuda.synchronize()
            first = _timed(g.replay, n, 1, cold_l2=cold_l2, spin=True, sync_first=False,
                           device=device, prepare=prep)[0]
            r = reps or _reps(first * n, target_ms, min_reps, max_reps)
            xs = _timed(g.replay, n, r, cold_l2=cold_l2, spin=True, sync_first=False,
                        device=device, prepare=prep)
            t.graph_us, t.graph_p20, t.graph_p80 = quantiles(xs)
            t.samples = r
        except Exception as e:  # capture failed: report, keep going with eager
            t.graph_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        finally:
            del g, keep
    if eager:
        eager_run()
        torch.cuda.synchronize()
        first = _timed(eager_run, n, 1, cold_l2=cold_l2, spin=False, sync_first=True,
                       device=device, prepare=prep)[0]
        r = reps or _reps(first * n, target_ms, min_reps, max_reps)
        xs = _timed(eager_run, n, r, cold_l2=cold_l2, spin=False, sync_first=True, device=device,
                    prepare=prep)
        t.eager_us, t.eager_p20, t.eager_p80 = quantiles(xs)
        t.samples = max(t.samples, r)
    if host:
        t.host_us = host_overhead_us(fns[0])
    return t


def host_overhead_us(fn: Callable[[], Any], n: int = 20, sync=None) -> float:
    """Median CPU time (us) of one Python call of ``fn`` with no synchronize in the loop.

    The device queue is drained before and after; ``n`` is kept small so the launch queue never
    fills (a full queue would make a launch block and count GPU time as host time).
    """
    sync = sync or (torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None))
    fn()
    sync()
    xs = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        xs.append((time.perf_counter_ns() - t0) / 1000.0)
    sync()
    return statistics.median(xs)


def cpu_time_ms(fn: Callable[[], Any], n: int = 3) -> float:
    """Median wall time (ms) of ``fn`` on the CPU (smoke runs: not a performance number)."""
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(xs)


def hbm_read_gbps(device=None, gib: float = 1.0) -> float:
    """HBM read bandwidth (GB/s, 1e9) measured as ``x.amax()`` over a ``gib`` GiB fp32 tensor.

    Timed with ``measure`` (graph replay, cold L2: the tensor is 20x the L2 anyway). This is the
    denominator of every "% of floor" column: floor time = bytes read once / this bandwidth.
    """
    device = device or torch.device("cuda", torch.cuda.current_device())
    n = int(gib * (1 << 30)) // 4
    x = torch.empty(n, dtype=torch.float32, device=device).normal_()
    out = torch.empty((), dtype=torch.float32, device=device)
    t = measure([lambda: torch.amax(x, dim=0, out=out)], host=False, eager=False, min_reps=10,
                max_reps=20, device=device)
    us = t.best_us
    if us is None:  # graph failed: fall back to eager
        t = measure([lambda: torch.amax(x, dim=0, out=out)], host=False, graph=False,
                    min_reps=10, max_reps=20, device=device)
        us = t.eager_us
    return n * 4 / (us * 1e-6) / 1e9
