"""Exact Gumbel-max sampling from logits: greedy / temperature / top-k / top-p / min-p.

See docs/DESIGN.md for the randomness contract and the filter order; the executable spec is
``tokenspeed_kernel.reference.sampling``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import _common as C
from ..reference.logits_processing import Csr, LogitsInputs, TokenCounts  # noqa: F401 (public)

# flag bits shared with csrc/sampling/sampler.cuh (the sampler kernel)
F_TEMP, F_TOPK, F_TOPP, F_MINP, F_LOGPROBS = 1, 2, 4, 8, 16
# Testing only (tests/test_sampling_cuda.py): force the CUDA sampler's rare paths on every row so
# that tests can compare them with the reference: F_FORCE_GENERIC (exact cluster-wide radix
# thresholds instead of the candidate lists), F_FORCE_EXACT (the exact pass instead of the
# streamed gap test for temperature-only rows), F_NO_RESIDENT (never stage the row chunk in
# shared memory), F_NO_SPLIT (small batches take the cluster launch instead of the split launch
# (calls without filter tensors) or the split-candidates launch (calls with a top-k tensor)).
# Launch-policy bits of the split-candidates launch (small batches; docs/DESIGN.md):
# F_SCAND_PROC, calls with ``processing`` inputs may take it (its processing instantiation;
# without the bit they take the cluster launch); F_SCAND_BAND, its rows with top-k off (in a call
# with a top-k tensor) are decided from what phase 1 streamed: top-p rows bound their total mass
# from the chunks' float64 sums ("band masses"), temperature-only rows use the streamed gap test,
# instead of the finishing CTA reading the row again; F_SCAND_TOPP (opt-in, measured slower than
# the cluster launch): calls with top-p but no top-k tensor take it too (with band masses);
# F_SCAND_RESCAN: its rows with top-k off and fewer forwarded keys than their 512 candidates
# (B > 6 on 132 SMs) read again the chunks that may hold keys above the smallest forwarded key,
# for more candidates than the forwarded prefix (the kernel does it at >= 8 CTAs per row, B <= 16
# on 132 SMs; with fewer the rows mostly stay undecided); F_SCAND_DEFER: in calls with a top-p
# tensor and fewer than 8 CTAs per row, the rows its finishing CTA cannot decide from the
# candidates are sampled by a cluster launch that follows it (PDL), instead of by that CTA
# alone. F_SPLIT_WIDE: calls without filter tensors and without processing take the split launch
# (a few small CTAs per row and a merge kernel) also when SMs / 4 < B <= SMs / 2, instead of the
# cluster launch (clusters of 2 CTAs of 1024 threads per row there). F_WIDE_DEFER: in calls
# with a top-p tensor whose cluster launch gives each row one CTA (B > SMs / 2), up to 8 rows
# that CTA cannot decide from its candidates are sampled by a second launch of clusters that
# follows it (PDL), instead of by that CTA alone. F_HIST_TOPP: on the cluster launch with more
# than one CTA per row (B <= SMs / 2), rows with top-p and top-k off are decided by a histogram
# of their fixed-point masses over bins of y (three reads of the row, two from shared memory)
# instead of by 512 candidates. The tokens never depend on these bits.
# ``_CUDA_TEST_FLAGS`` (an OR of the bits above) and the levels' switches below are set through
# ``tokenspeed_kernel.testing.knobs`` (the one door).
F_FORCE_GENERIC, F_FORCE_EXACT, F_NO_RESIDENT, F_NO_SPLIT = 64, 128, 256, 512
F_SCAND_PROC, F_SCAND_BAND, F_SCAND_TOPP, F_SCAND_RESCAN = 8192, 16384, 32768, 65536
F_SCAND_DEFER, F_SPLIT_WIDE, F_WIDE_DEFER, F_HIST_TOPP = 131072, 262144, 524288, 1048576
_CUDA_TEST_FLAGS = 0
# The launch-policy bits every CUDA sampler call passes (ORed with _CUDA_TEST_FLAGS; the kernels
# obey the bits, the policy lives here; the ``sampler_launch_flags`` knob replaces it, e.g. 0 for
# the launches without them). Each measured faster on an H200 (docs/BENCHMARKS.md).
_DEFAULT_LAUNCH_FLAGS = (F_SCAND_PROC | F_SCAND_BAND | F_SCAND_RESCAN | F_SCAND_DEFER
                         | F_SPLIT_WIDE | F_WIDE_DEFER | F_HIST_TOPP)

# The radix levels of the verify family (csrc/sampling/sampling.cuh, launch_levels) keep their
# own testing flags (ops/verify.py passes them): F_NO_LIST never compacts a level's active keys
# into the row's list; F_NO_EXCL histograms every key at level 0 of a top-p row; F_EXCL_TEST
# excludes the bins below m - 2 so that the redo path runs. The thresholds must not change.
F_NO_LIST, F_NO_EXCL, F_EXCL_TEST = 128, 256, 512
_NO_LEVEL_LIST_FOR_TESTING = False
_NO_LEVEL_EXCL_FOR_TESTING = False
_LEVEL_EXCL_TEST_FOR_TESTING = False


# The raw op's trailing ``processing`` argument: [] (none) or these 16 entries, normalized
# (dtypes below, contiguous, on the logits' device; None = that input off). The CUDA adapter
# (csrc/sampling/sampling_ops.cu) and the Triton backend read them by position.
PROC_FIELDS = (
    "bias_indptr",         # 0  int64 [n + 1]
    "bias_ids",            # 1  int64 [nnz_b]
    "bias_values",         # 2  float32 [nnz_b]
    "repetition_penalty",  # 3  float32 [n]
    "frequency_penalty",   # 4  float32 [n]
    "presence_penalty",    # 5  float32 [n]
    "seen",                # 6  int32 [N, ceil(V / 32)]
    "output_counts",       # 7  int32 [N, V]
    "count_slots",         # 8  int64 [n] (given whenever a penalty is)
    "allowed_mask",        # 9  int32 [n, ceil(V / 32)]
    "banned_indptr",       # 10 int64 [n + 1]
    "banned_ids",          # 11 int64 [nnz_x]
    "min_tokens",          # 12 int64 [n]
    "num_output_tokens",   # 13 int64 [n] (iff min_tokens)
    "stop_indptr",         # 14 int64 [n + 1] (iff min_tokens)
    "stop_ids",            # 15 int64 [nnz_s]
)
_PROC_INDEX = {name: i for i, name in enumerate(PROC_FIELDS)}


class SampleOutput(NamedTuple):
    tokens: torch.Tensor   # [rows] int64 or int32
    valid: torch.Tensor    # [rows] bool: False for rows with NaN / +inf / no finite logit


class SampleLogprobsOutput(NamedTuple):
    tokens: torch.Tensor              # [rows]
    valid: torch.Tensor               # [rows] bool
    logprobs: torch.Tensor            # [rows] f32: log_softmax(raw logits)[token]
    processed_logprobs: torch.Tensor  # [rows] f32: log prob under the processed distribution
    top_ids: torch.Tensor             # [rows, top_n] int64: largest raw logits (ties: lowest id)
    top_logprobs: torch.Tensor        # [rows, top_n] f32: their raw logprobs


def _proc_int_tensor(t, name: str, shape: tuple, dev) -> torch.Tensor:
    """An integer tensor of ``shape`` on ``dev`` -> int64, contiguous (ArgumentTypeError /
    ValueError naming ``name``)."""
    if (isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.shape == shape
            and t.device == dev and t.is_contiguous()):
        return t   # already normalized (every eager call): skip formatting the messages below
    C.check_type(isinstance(t, torch.Tensor), name,
                 f"must be an integer tensor, got {type(t).__name__}")
    C.check(not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool,
            name, f"must be an integer tensor, got {t.dtype}")
    C.check(tuple(t.shape) == shape, name, f"must have shape {list(shape)}, got "
            f"{list(t.shape)}")
    C.check(t.device == dev, name, f"must be on {dev} (the logits' device), got {t.device}")
    return t.to(torch.int64).contiguous()


def _proc_csr(csr, name: str, n: int, dev, with_values: bool):
    """A ``Csr`` argument -> (indptr int64 [n + 1], ids int64 [nnz], values float32 | None)."""
    if not (isinstance(csr, tuple) and len(csr) == 3):
        C.check_type(False, name, f"must be a Csr(indptr, ids, values), got {type(csr).__name__}")
    if not isinstance(csr[1], torch.Tensor):
        C.check_type(False, f"{name}.ids", f"must be an integer tensor, got "
                     f"{type(csr[1]).__name__}")
    if csr[1].dim() != 1:
        C.check(False, f"{name}.ids", f"must be 1-D, got shape {list(csr[1].shape)}")
    nnz = csr[1].shape[0]
    indptr = _proc_int_tensor(csr[0], f"{name}.indptr", (n + 1,), dev)
    ids = _proc_int_tensor(csr[1], f"{name}.ids", (nnz,), dev)
    values = None
    if with_values:
        v = csr[2]
        if (isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.shape == (nnz,)
                and v.device == dev and v.is_contiguous()):
            return indptr, ids, v
        C.check_type(isinstance(v, torch.Tensor), f"{name}.values",
                     f"must be a floating tensor [{nnz}], got {type(v).__name__}")
        C.check(v.dtype.is_floating_point, f"{name}.values",
                f"must be a floating tensor, got {v.dtype}")
        C.check(tuple(v.shape) == (nnz,), f"{name}.values",
                f"must have shape [{nnz}] (one value per id), got {list(v.shape)}")
        C.check(v.device == dev, f"{name}.values", f"must be on {dev}, got {v.device}")
        values = v.to(torch.float32).contiguous()
    return indptr, ids, values


def _csr_value_checks(name: str, indptr, ids, n: int, V: int) -> list:
    """Device-side value checks of a CSR list: [(argument, message, bad)] (``_raise_bad``)."""
    nnz = ids.shape[0]
    checks = [(f"{name}.indptr", f"must start at 0, be non-decreasing and end at len(ids) = "
               f"{nnz}", (indptr[0] != 0) | (indptr.diff() < 0).any() | (indptr[-1] != nnz))]
    if nnz:
        checks.append((f"{name}.ids", f"must be in [0, {V})", ((ids < 0) | (ids >= V)).any()))
        # request of each entry (no host sync); duplicates within one request -> equal keys
        req = torch.searchsorted(indptr, torch.arange(nnz, device=ids.device), right=True) - 1
        key = req * V + ids
        checks.append((f"{name}.ids", "must be unique within each request",
                       (key.sort().values.diff() == 0).any()))
    return checks


def _raise_bad(checks) -> None:
    """One host sync for every value check: [(argument, message, device bool 'bad')]."""
    if checks:
        bad = torch.stack([c[2] for c in checks]).tolist()
        for (name, msg, _), b in zip(checks, bad):
            C.check(not b, name, msg)


def prepare_processing(processing, n: int, V: int, dev: torch.device, validate: bool) -> list:
    """``processing`` (a ``LogitsInputs`` or None) -> the raw op's list: ``[]`` (nothing to
    apply) or the 16 entries of ``PROC_FIELDS``, normalized (dtypes, contiguous; None = off).
    Shapes, dtypes, devices and the inputs' dependencies are always checked; values (one host
    sync) with ``validate`` outside tracing / graph capture. Errors name
    ``processing.<field>``."""
    if processing is None:
        return []
    C.check_type(isinstance(processing, LogitsInputs), "processing",
                 f"must be a LogitsInputs or None, got {type(processing).__name__}")
    if all(v is None for v in processing):
        return []
    out = [None] * len(PROC_FIELDS)
    checks = []
    value_checks = validate and not C.is_tracing() and n > 0
    W = (V + 31) // 32
    pi = processing
    if pi.logit_bias is not None:
        ip, ids, vals = _proc_csr(pi.logit_bias, "processing.logit_bias", n, dev, True)
        out[0], out[1], out[2] = ip, ids, vals
        if value_checks:
            checks += _csr_value_checks("processing.logit_bias", ip, ids, n, V)
            if vals.numel():
                checks.append(("processing.logit_bias.values", "must be finite",
                               ~torch.isfinite(vals).all()))
    pens = (("repetition_penalty", 3), ("frequency_penalty", 4), ("presence_penalty", 5))
    any_pen = False
    for name, i in pens:
        v = getattr(pi, name)
        if v is None:
            continue
        any_pen = True
        t = C.as_param(v, f"processing.{name}", n, torch.float32, dev)
        out[i] = t
        if value_checks:
            bad = ~torch.isfinite(t).all()
            msg = "must be finite"
            if name == "repetition_penalty":
                bad = bad | (t <= 0).any()
                msg = "must be finite and > 0 (1 = off)"
            checks.append((f"processing.{name}", msg, bad))
    if any_pen:
        C.check(pi.counts is not None, "processing.counts",
                "the repetition / frequency / presence penalties need the requests' "
                "TokenCounts (ops.new_token_counts)")
    if pi.counts is not None and any_pen:
        counts = pi.counts
        C.check_type(isinstance(counts, tuple) and len(counts) == 2
                     and all(isinstance(t, torch.Tensor) for t in counts), "processing.counts",
                     f"must be a TokenCounts (from ops.new_token_counts), got "
                     f"{type(counts).__name__}")
        seen, output = counts
        # (messages are formatted only when a check fails)
        if not (output.dim() == 2 and output.shape[1] == V and output.dtype == torch.int32
                and output.is_contiguous()):
            C.check(False, "processing.counts", f"output must be a contiguous [N, V = {V}] "
                    f"int32 tensor, got {list(output.shape)} {output.dtype}")
        N = output.shape[0]
        if not (seen.shape == (N, W) and seen.dtype == torch.int32 and seen.is_contiguous()):
            C.check(False, "processing.counts", f"seen must be a contiguous [{N}, {W}] int32 "
                    f"tensor (V = {V}), got {list(seen.shape)} {seen.dtype}")
        if not (seen.device == dev and output.device == dev):
            C.check(False, "processing.counts", f"must be on {dev} (the logits' device), got "
                    f"{seen.device} / {output.device}")
        out[6], out[7] = seen, output
        if pi.count_slots is not None:
            slots = _proc_int_tensor(pi.count_slots, "processing.count_slots", (n,), dev)
            if value_checks:
                checks.append(("processing.count_slots", f"must be in [0, {N}) (rows of counts)",
                               ((slots < 0) | (slots >= N)).any()))
        else:
            if n > N:
                C.check(False, "processing.counts", f"holds {N} slots but there are {n} "
                        f"requests: pass count_slots")
            slots = torch.arange(n, dtype=torch.int64, device=dev)
        out[8] = slots
    elif pi.count_slots is not None:
        _proc_int_tensor(pi.count_slots, "processing.count_slots", (n,), dev)
    if pi.allowed_mask is not None:
        m = pi.allowed_mask
        if not (isinstance(m, torch.Tensor) and m.dtype == torch.int32 and m.shape == (n, W)
                and m.device == dev and m.is_contiguous()):   # (else already normalized)
            C.check_type(isinstance(m, torch.Tensor), "processing.allowed_mask",
                         f"must be an int32 tensor [{n}, {W}], got {type(m).__name__}")
            C.check(not m.dtype.is_floating_point and not m.dtype.is_complex
                    and m.dtype != torch.bool, "processing.allowed_mask",
                    f"must be an int32 bitmask (xgrammar layout), got {m.dtype}")
            C.check(tuple(m.shape) == (n, W), "processing.allowed_mask",
                    f"must have shape [{n}, {W}] (ceil(V / 32) words per request), got "
                    f"{list(m.shape)}")
            C.check(m.device == dev, "processing.allowed_mask",
                    f"must be on {dev}, got {m.device}")
        out[9] = m.to(torch.int32).contiguous()   # other integer dtypes: the low 32 bits
    if pi.banned is not None:
        ip, ids, _ = _proc_csr(pi.banned, "processing.banned", n, dev, False)
        out[10], out[11] = ip, ids
        if value_checks:
            checks += _csr_value_checks("processing.banned", ip, ids, n, V)
    if pi.min_tokens is not None:
        C.check(pi.num_output_tokens is not None, "processing.num_output_tokens",
                "is required with min_tokens")
        C.check(pi.stop_ids is not None, "processing.stop_ids", "is required with min_tokens")
        out[12] = C.as_param(pi.min_tokens, "processing.min_tokens", n, torch.int64, dev)
        out[13] = C.as_param(pi.num_output_tokens, "processing.num_output_tokens", n,
                             torch.int64, dev)
        ip, ids, _ = _proc_csr(pi.stop_ids, "processing.stop_ids", n, dev, False)
        out[14], out[15] = ip, ids
        if value_checks:
            checks += _csr_value_checks("processing.stop_ids", ip, ids, n, V)
    if value_checks:
        _raise_bad(checks)
    if all(v is None for v in out):
        return []
    return out


def processing_inputs(proc: list) -> Optional[LogitsInputs]:
    """The raw op's list (``prepare_processing``) -> a ``LogitsInputs`` for the reference."""
    if not proc:
        return None
    g = dict(zip(PROC_FIELDS, proc))
    counts = None if g["seen"] is None else TokenCounts(g["seen"], g["output_counts"])
    return LogitsInputs(
        logit_bias=(None if g["bias_indptr"] is None
                    else Csr(g["bias_indptr"], g["bias_ids"], g["bias_values"])),
        repetition_penalty=g["repetition_penalty"], frequency_penalty=g["frequency_penalty"],
        presence_penalty=g["presence_penalty"], counts=counts,
        allowed_mask=g["allowed_mask"],
        banned=None if g["banned_indptr"] is None else Csr(g["banned_indptr"], g["banned_ids"]),
        min_tokens=g["min_tokens"], num_output_tokens=g["num_output_tokens"],
        stop_ids=None if g["stop_indptr"] is None else Csr(g["stop_indptr"], g["stop_ids"]),
        count_slots=g["count_slots"])


def reference_sample(logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request,
                     proc: list):
    """The reference of the whole call: ``reference.sampling.sample(apply(logits, inputs))``
    for tokens, valid and processed logprobs; raw logprobs from the unprocessed logits."""
    from ..reference import sampling as ref
    inputs = processing_inputs(proc)
    if inputs is None:
        return ref.sample(logits, seed, offset, temperature, top_k, top_p, min_p,
                          tokens_per_request)
    from ..reference import logits_processing as lp_ref
    z = lp_ref.apply(logits, inputs, tokens_per_request)
    tok, valid, _, plp = ref.sample(z, seed, offset, temperature, top_k, top_p, min_p,
                                    tokens_per_request)
    raw = torch.log_softmax(logits.to(torch.float32), dim=1).gather(1, tok[:, None])[:, 0]
    raw = torch.where(valid, raw, torch.full_like(raw, float("nan")))
    return tok, valid, raw, plp


def _prepare(logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request,
             out_dtype, backend, validate, top_k_max, processing=None):
    """Checks the arguments; returns (SamplingParams, tokens_per_request, backend, flags,
    processing list)."""
    C.check_logits(logits)
    # (messages are formatted only when a check fails)
    if not (type(tokens_per_request) is int and tokens_per_request >= 1):   # bools refused
        tokens_per_request = C.check_int(tokens_per_request, "tokens_per_request", lo=1)
    rows, vocab = logits.shape
    if rows % tokens_per_request:
        C.check(False, "tokens_per_request",
                f"rows ({rows}) must be a multiple of tokens_per_request ({tokens_per_request})")
    if out_dtype not in (torch.int64, torch.int32):
        C.check(False, "out_dtype", f"must be torch.int64 or torch.int32, got {out_dtype}")
    n = rows // tokens_per_request
    params = C.sampling_params(n, logits.device, seed, offset, temperature, top_k, top_p, min_p)
    requested = backend
    backend = C.pick_backend(backend, logits.device, "sample")
    if validate and not C.is_tracing() and n > 0:
        params.check_values()
    if top_k_max is not None:
        C.check_int(top_k_max, "top_k_max", lo=1)
    proc = prepare_processing(processing, n, vocab, logits.device, validate)
    if proc and backend == "cuda" and not cuda_takes_processing():
        # an extension built from sources whose sample op predates the processing argument:
        # "auto" takes the Triton kernels for such calls, an explicit "cuda" is refused
        C.check(requested == "auto", "processing", "the loaded CUDA extension does not apply "
                "logits processing (built from older sources): rebuild it, or use "
                "backend='triton' (backend='auto' takes Triton for calls with processing "
                "inputs)")
        backend = C.pick_backend("triton", logits.device, "sample")
    return params, tokens_per_request, backend, param_flags(params), proc


# Whether the CUDA sampler kernels apply the ``processing`` inputs (csrc/sampling/processing.cuh:
# inside every read of the logits, same float32 values as the reference / Triton).
CUDA_PROCESSING = True


def cuda_takes_processing() -> bool:
    """Whether ``backend="cuda"`` applies ``processing``: the kernels do and the loaded
    extension's ``sample`` op takes the argument (False without the extension)."""
    from .. import _library
    return CUDA_PROCESSING and _library.extension_available() and _op_has_processing()


def param_flags(params: C.SamplingParams) -> int:
    """The sampler kernel's flag bits of the given parameters (and the testing flags)."""
    return ((F_TEMP if params.temperature is not None else 0)
            | (F_TOPK if params.top_k is not None else 0)
            | (F_TOPP if params.top_p is not None else 0)
            | (F_MINP if params.min_p is not None else 0)
            | _DEFAULT_LAUNCH_FLAGS | _CUDA_TEST_FLAGS)


def level_test_flags() -> int:
    """The radix levels' testing / A-B flags (the verify family's thresholds; ops/verify.py)."""
    return ((F_NO_LIST if _NO_LEVEL_LIST_FOR_TESTING else 0)
            | (F_NO_EXCL if _NO_LEVEL_EXCL_FOR_TESTING else 0)
            | (F_EXCL_TEST if _LEVEL_EXCL_TEST_FOR_TESTING else 0))


_OP_HAS_PROCESSING: Optional[bool] = None


def _op_has_processing() -> bool:
    """Whether the loaded extension's ``sample`` schema has the trailing ``processing``
    argument (an extension built from older sources does not)."""
    global _OP_HAS_PROCESSING
    if _OP_HAS_PROCESSING is None:
        schema = torch.ops.tokenspeed_kernel.sample.default._schema
        _OP_HAS_PROCESSING = any(a.name == "processing" for a in schema.arguments)
    return _OP_HAS_PROCESSING


def run_prepared(logits, params: C.SamplingParams, tokens_per_request, out_dtype, backend,
                 flags, want_logprobs, proc: Optional[list] = None):
    """Samples with already checked arguments (``_prepare``); (tokens, valid, lp, plp).
    ``proc``: the normalized processing list (``prepare_processing``; [] or None: none)."""
    rows = logits.shape[0]
    dev = logits.device
    seed, offset, temperature, top_k, top_p, min_p = params
    proc = proc or []
    if backend == "reference":
        tok, valid, lp, plp = reference_sample(logits, seed, offset, temperature, top_k, top_p,
                                               min_p, tokens_per_request, proc)
        return tok.to(out_dtype), valid, lp, plp
    if backend == "triton":
        if C.compiling():   # the launches are opaque to Dynamo: a custom op
            tok, valid, lp, plp = torch.ops.tokenspeed_kernel.triton_sample(
                logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request,
                want_logprobs, proc)
            if not want_logprobs:
                lp = plp = None
            return tok.to(out_dtype), valid, lp, plp
        from ..triton import sampling as tri
        tok, valid, lp, plp = tri.sample(logits, seed, offset, temperature, top_k, top_p, min_p,
                                         tokens_per_request, want_logprobs, proc)
        return tok.to(out_dtype), valid, lp, plp
    tokens = torch.empty(rows, dtype=out_dtype, device=dev)
    valid = torch.empty(rows, dtype=torch.bool, device=dev)
    lp = torch.empty(rows, dtype=torch.float32, device=dev) if want_logprobs else None
    plp = torch.empty(rows, dtype=torch.float32, device=dev) if want_logprobs else None
    args = (logits, temperature, top_k, top_p, min_p, seed, offset, tokens_per_request,
            flags | (F_LOGPROBS if want_logprobs else 0), tokens, valid, lp, plp)
    if _op_has_processing():
        torch.ops.tokenspeed_kernel.sample(*args, proc)
    else:
        C.check(not proc, "processing", "the loaded CUDA extension predates logits processing "
                "(its sample op has no processing argument): rebuild it, or use "
                "backend='triton'")
        torch.ops.tokenspeed_kernel.sample(*args)
    return tokens, valid, lp, plp


def sample(logits: torch.Tensor, seed, offset, *, temperature=None, top_k=None, top_p=None,
           min_p=None, tokens_per_request: int = 1, out_dtype: torch.dtype = torch.int64,
           backend: str = "auto", validate: bool = True,
           top_k_max: Optional[int] = None,
           processing: Optional[LogitsInputs] = None) -> SampleOutput:
    """Sample one token per row of ``logits`` exactly, by Gumbel-max over the kept set.

    Parameters
    ----------
    logits : Tensor [rows, V], float32 / bfloat16 / float16, last dim contiguous (any row
        stride). Read natively, never copied to fp32. Not modified.
    seed, offset : int64 [n] (n = rows // tokens_per_request) or Python ints (64-bit: in
        ``[-2**63, 2**64)``; floats and bools raise TypeError). Row r uses request
        ``q = r // tokens_per_request`` and Philox offset ``offset[q] + r % tokens_per_request``.
    temperature : float32 [n] or float or None (= 1). 0 = greedy argmax (ties: lowest id);
        ``0 < T < ~2.9e-39`` is the ``T -> 0`` limit (uniform over the tied maxima).
    top_k : int [n] or int or None. ``k <= 0`` or ``k >= V`` = off, at any size (values beyond
        int32 saturate, never wrap); any k up to V.
    top_p : float32 [n] or float or None. In (0, 1]; 1 = off. Applied to the top-k mass.
    min_p : float32 [n] or float or None. In [0, 1]; 0 = off. Relative to the max probability.
    tokens_per_request : rows per request (speculative verify samples several positions).
    out_dtype : torch.int64 or torch.int32.
    backend : "auto" | "cuda" | "triton" | "reference".
    validate : range-check parameter values (one host sync; skipped under CUDA-graph capture and
        torch.compile).
    top_k_max : accepted for compatibility (a positive int); no backend needs it: the CUDA
        kernel picks each row's path on the device (one launch, any k).
    processing : ``LogitsInputs`` or None. What engines apply before sampling, per request
        (every field optional): logit bias (``Csr`` of ids + float32 values), repetition /
        frequency / presence penalties (``[n]``, with ``counts``: a ``TokenCounts`` kept by
        ``ops.admit_requests`` / ``ops.add_output_tokens``; request q reads row
        ``count_slots[q]``, default q), an allowed-token bitmask (``[n, ceil(V / 32)]`` int32,
        xgrammar layout), banned ids (``Csr``) and ``min_tokens`` (with ``num_output_tokens``
        and ``stop_ids``: stop ids are masked while the output is shorter). Applied in that
        order, bit-exactly as ``reference.logits_processing.apply``, inside the CUDA and Triton
        kernels' reads of the logits (nothing is materialized; a small per-request prep kernel
        builds bitmask words when banned / stop ids or a bias are given); then the filters
        above run on the processed row. The NaN policy applies to the processed row (a NaN logit at a masked position is
        harmless; a row the masks empty is invalid). Read only, never modified.

    Returns
    -------
    SampleOutput(tokens [rows], valid [rows] bool). Invalid rows (a NaN / +inf logit, or
    no finite logit, after processing) get token 0 and ``valid = False``; other rows are
    unaffected.

    Randomness: Philox4x32-10, key = seed, counter = (id >> 2, offset, stream 0); stateless, so
    the call is CUDA-graph safe (seed/offset are device tensors) and the token is the same on every
    backend, batch layout and eager/graph replay. Increment ``offset`` yourself between steps.
    Scores are ``fl32(y + G)`` with ``y = (z - max z) / T`` relative to the row max, so the
    distribution is exact at any logit magnitude and temperature (docs/DESIGN.md).

    Example
    -------
    >>> out = sample(logits, seed=torch.tensor([7]), offset=torch.tensor([0]),
    ...              temperature=torch.tensor([0.8]), top_k=torch.tensor([50]),
    ...              top_p=torch.tensor([0.9]))
    >>> out.tokens
    >>> counts = new_token_counts(max_requests=1, vocab_size=logits.shape[1], device="cuda")
    >>> proc = LogitsInputs(repetition_penalty=torch.tensor([1.1], device="cuda"),
    ...                     counts=counts, banned=Csr(torch.tensor([0, 1], device="cuda"),
    ...                                               torch.tensor([13], device="cuda")))
    >>> out = sample(logits, seed, offset, temperature=0.8, processing=proc)
    """
    params, tokens_per_request, backend, flags, proc = _prepare(
        logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request, out_dtype,
        backend, validate, top_k_max, processing)
    tok, valid, _, _ = run_prepared(logits, params, tokens_per_request, out_dtype, backend, flags,
                                    False, proc)
    return SampleOutput(tok, valid)


def sample_with_logprobs(logits: torch.Tensor, seed, offset, *, temperature=None, top_k=None,
                         top_p=None, min_p=None, tokens_per_request: int = 1, top_n: int = 0,
                         out_dtype: torch.dtype = torch.int64, backend: str = "auto",
                         validate: bool = True,
                         top_k_max: Optional[int] = None,
                         processing: Optional[LogitsInputs] = None) -> SampleLogprobsOutput:
    """``sample`` plus logprobs of the sampled token (raw and processed) and the top-n raw ones.

    Same arguments and tokens as ``sample`` (same seeds give the same tokens). With
    ``processing``, ``logprobs`` / ``top_logprobs`` stay those of the unprocessed (raw) row and
    ``processed_logprobs`` are under the processed distribution. ``top_n >= 0``:
    the ``top_n`` first raw logits per row in the total order (value descending, id ascending)
    and their log_softmax values (computed in PyTorch over key56: extra passes over the row,
    only when ``top_n > 0``).
    Processed logprob of a greedy row is 0. Invalid rows: NaN logprobs.
    """
    C.check_logits(logits)
    top_n = C.check_int(top_n, "top_n", 0, logits.shape[-1])
    params, tokens_per_request, backend, flags, proc = _prepare(
        logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request, out_dtype,
        backend, validate, top_k_max, processing)
    tok, valid, lp, plp = run_prepared(logits, params, tokens_per_request, out_dtype, backend,
                                       flags, True, proc)
    rows = logits.shape[0]
    if top_n > 0:
        # the total order (value descending, id ascending) through the unique 56-bit key
        from ..reference import prims
        vocab = torch.arange(logits.shape[1], device=logits.device)
        ids = prims.key56(logits.float(), vocab[None, :]).topk(top_n, dim=1).indices
        # raw logprob = z - lse(z); lse recovered from the sampled token's logprob
        lse = logits.gather(1, tok.to(torch.int64)[:, None]).float()[:, 0] - lp
        top_lp = logits.gather(1, ids).float() - lse[:, None]
    else:
        ids = torch.empty((rows, 0), dtype=torch.int64, device=logits.device)
        top_lp = torch.empty((rows, 0), dtype=torch.float32, device=logits.device)
    return SampleLogprobsOutput(tok, valid, lp, plp, ids, top_lp)


def _register_library() -> None:
    """Fake kernel (out-variant: nothing to allocate) and the CPU kernel (reference)."""
    import torch.library as L

    @L.register_fake("tokenspeed_kernel::sample")
    def _fake(logits, temperature, top_k, top_p, min_p, seed, offset, tokens_per_request, flags,
              tokens, valid, logprobs, processed_logprobs, processing=None):
        return None

    @L.impl("tokenspeed_kernel::sample", "CPU")
    def _cpu(logits, temperature, top_k, top_p, min_p, seed, offset, tokens_per_request, flags,
             tokens, valid, logprobs, processed_logprobs, processing=None):
        tok, ok, lp, plp = reference_sample(logits, seed, offset, temperature, top_k, top_p,
                                            min_p, tokens_per_request, list(processing or []))
        C.copy_outputs((tokens, valid, logprobs, processed_logprobs), (tok, ok, lp, plp))
