"""Exact Gumbel-max sampling from logits: greedy / temperature / top-k / top-p / min-p.

See docs/DESIGN.md for the randomness contract and the filter order; the executable spec is
``tokenspeed_kernel.reference.sampling``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import _common as C

# flag bits shared with csrc/sampling/sampler.cuh (the sampler kernel)
F_TEMP, F_TOPK, F_TOPP, F_MINP, F_LOGPROBS = 1, 2, 4, 8, 16
# Testing only (tests/test_sampling_cuda.py): force the CUDA sampler's rare paths on every row so
# that tests can compare them with the reference: F_FORCE_GENERIC (exact cluster-wide radix
# thresholds instead of the candidate lists), F_FORCE_EXACT (the exact pass instead of the
# streamed gap test for temperature-only rows), F_NO_RESIDENT (never stage the row chunk in
# shared memory), F_NO_SPLIT (small temperature / greedy batches take the cluster launch instead
# of the split launch). The tokens must not change. ``_CUDA_TEST_FLAGS`` (an OR of them) and the
# levels' switches below are set through ``tokenspeed_kernel.testing.knobs`` (the one door).
F_FORCE_GENERIC, F_FORCE_EXACT, F_NO_RESIDENT, F_NO_SPLIT = 64, 128, 256, 512
_CUDA_TEST_FLAGS = 0

# The radix levels of the verify family (csrc/sampling/sampling.cuh, launch_levels) keep their
# own testing flags (ops/verify.py passes them): F_NO_LIST never compacts a level's active keys
# into the row's list; F_NO_EXCL histograms every key at level 0 of a top-p row; F_EXCL_TEST
# excludes the bins below m - 2 so that the redo path runs. The thresholds must not change.
F_NO_LIST, F_NO_EXCL, F_EXCL_TEST = 128, 256, 512
_NO_LEVEL_LIST_FOR_TESTING = False
_NO_LEVEL_EXCL_FOR_TESTING = False
_LEVEL_EXCL_TEST_FOR_TESTING = False


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


def _prepare(logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request,
             out_dtype, backend, validate, top_k_max):
    """Checks the arguments; returns (SamplingParams, tokens_per_request, backend, flags)."""
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
    backend = C.pick_backend(backend, logits.device, "sample")
    if validate and not C.is_tracing() and n > 0:
        params.check_values()
    if top_k_max is not None:
        C.check_int(top_k_max, "top_k_max", lo=1)
    return params, tokens_per_request, backend, param_flags(params)


def param_flags(params: C.SamplingParams) -> int:
    """The sampler kernel's flag bits of the given parameters (and the testing flags)."""
    return ((F_TEMP if params.temperature is not None else 0)
            | (F_TOPK if params.top_k is not None else 0)
            | (F_TOPP if params.top_p is not None else 0)
            | (F_MINP if params.min_p is not None else 0)
            | _CUDA_TEST_FLAGS)


def level_test_flags() -> int:
    """The radix levels' testing / A-B flags (the verify family's thresholds; ops/verify.py)."""
    return ((F_NO_LIST if _NO_LEVEL_LIST_FOR_TESTING else 0)
            | (F_NO_EXCL if _NO_LEVEL_EXCL_FOR_TESTING else 0)
            | (F_EXCL_TEST if _LEVEL_EXCL_TEST_FOR_TESTING else 0))


def run_prepared(logits, params: C.SamplingParams, tokens_per_request, out_dtype, backend,
                 flags, want_logprobs):
    """Samples with already checked arguments (``_prepare``); (tokens, valid, lp, plp)."""
    rows = logits.shape[0]
    dev = logits.device
    seed, offset, temperature, top_k, top_p, min_p = params
    if backend == "reference":
        from ..reference import sampling as ref
        tok, valid, lp, plp = ref.sample(logits, seed, offset, temperature, top_k, top_p, min_p,
                                         tokens_per_request)
        return tok.to(out_dtype), valid, lp, plp
    if backend == "triton":
        from ..triton import sampling as tri
        tok, valid, lp, plp = tri.sample(logits, seed, offset, temperature, top_k, top_p, min_p,
                                         tokens_per_request, want_logprobs)
        return tok.to(out_dtype), valid, lp, plp
    tokens = torch.empty(rows, dtype=out_dtype, device=dev)
    valid = torch.empty(rows, dtype=torch.bool, device=dev)
    lp = torch.empty(rows, dtype=torch.float32, device=dev) if want_logprobs else None
    plp = torch.empty(rows, dtype=torch.float32, device=dev) if want_logprobs else None
    torch.ops.tokenspeed_kernel.sample(
        logits, temperature, top_k, top_p, min_p, seed, offset, tokens_per_request,
        flags | (F_LOGPROBS if want_logprobs else 0), tokens, valid, lp, plp)
    return tokens, valid, lp, plp


def sample(logits: torch.Tensor, seed, offset, *, temperature=None, top_k=None, top_p=None,
           min_p=None, tokens_per_request: int = 1, out_dtype: torch.dtype = torch.int64,
           backend: str = "auto", validate: bool = True,
           top_k_max: Optional[int] = None) -> SampleOutput:
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

    Returns
    -------
    SampleOutput(tokens [rows], valid [rows] bool). Invalid rows (a NaN / +inf logit, or
    no finite logit) get token 0 and ``valid = False``; other rows are unaffected.

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
    """
    params, tokens_per_request, backend, flags = _prepare(
        logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request, out_dtype,
        backend, validate, top_k_max)
    tok, valid, _, _ = run_prepared(logits, params, tokens_per_request, out_dtype, backend, flags,
                                    False)
    return SampleOutput(tok, valid)


def sample_with_logprobs(logits: torch.Tensor, seed, offset, *, temperature=None, top_k=None,
                         top_p=None, min_p=None, tokens_per_request: int = 1, top_n: int = 0,
                         out_dtype: torch.dtype = torch.int64, backend: str = "auto",
                         validate: bool = True,
                         top_k_max: Optional[int] = None) -> SampleLogprobsOutput:
    """``sample`` plus logprobs of the sampled token (raw and processed) and the top-n raw ones.

    Same arguments and tokens as ``sample`` (same seeds give the same tokens). ``top_n >= 0``:
    the ``top_n`` first raw logits per row in the total order (value descending, id ascending)
    and their log_softmax values (computed in PyTorch over key56: extra passes over the row,
    only when ``top_n > 0``).
    Processed logprob of a greedy row is 0. Invalid rows: NaN logprobs.
    """
    C.check_logits(logits)
    top_n = C.check_int(top_n, "top_n", 0, logits.shape[-1])
    params, tokens_per_request, backend, flags = _prepare(
        logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request, out_dtype,
        backend, validate, top_k_max)
    tok, valid, lp, plp = run_prepared(logits, params, tokens_per_request, out_dtype, backend,
                                       flags, True)
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
              tokens, valid, logprobs, processed_logprobs):
        return None

    @L.impl("tokenspeed_kernel::sample", "CPU")
    def _cpu(logits, temperature, top_k, top_p, min_p, seed, offset, tokens_per_request, flags,
             tokens, valid, logprobs, processed_logprobs):
        from ..reference import sampling as ref
        tok, ok, lp, plp = ref.sample(logits, seed, offset, temperature, top_k, top_p, min_p,
                                      tokens_per_request)
        C.copy_outputs((tokens, valid, logprobs, processed_logprobs), (tok, ok, lp, plp))
