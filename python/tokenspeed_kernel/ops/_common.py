"""Shared helpers of the public ops: argument checks, backend choice, scalar broadcasting."""
from __future__ import annotations

import warnings
from typing import Optional, Union

import torch

from .. import _library

BACKENDS = ("auto", "cuda", "triton", "reference")
_warned = set()


def is_tracing() -> bool:
    """True under torch.compile tracing or CUDA-graph capture: skip host-syncing checks."""
    if torch.compiler.is_compiling():
        return True
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def check(cond: bool, arg: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{arg}: {msg}")


def check_backend(backend: str) -> None:
    check(backend in BACKENDS, "backend", f"must be one of {BACKENDS}, got {backend!r}")


def pick_backend(backend: str, device: torch.device, op: str) -> str:
    """'auto' -> cuda (extension) | triton (CUDA tensors, no extension: warns once) | reference."""
    check_backend(backend)
    if backend != "auto":
        if backend == "cuda":
            check(device.type == "cuda", "backend", f"'cuda' needs CUDA tensors, got {device}")
            _library.require(f"tokenspeed_kernel.ops.{op}(backend='cuda')")
        if backend == "triton" and device.type != "cuda":
            import os
            check(os.environ.get("TRITON_INTERPRET") == "1", "backend",
                  "'triton' on CPU tensors needs TRITON_INTERPRET=1")
        return backend
    if device.type == "cuda":
        if _library.extension_available():
            return "cuda"
        if op not in _warned:
            _warned.add(op)
            warnings.warn(f"tokenspeed_kernel.ops.{op}: compiled extension unavailable "
                          f"({_library.extension_error()}); using the Triton backend",
                          RuntimeWarning, stacklevel=3)
        return "triton"
    return "reference"


def as_param(value, name: str, n: int, dtype: torch.dtype, device: torch.device,
             allow_none: bool = True) -> Optional[torch.Tensor]:
    """Per-request parameter: None, a Python scalar (broadcast; not CUDA-graph safe), or a
    1-D tensor of n values on ``device`` (converted to ``dtype`` if needed)."""
    if value is None:
        check(allow_none, name, "is required")
        return None
    # Fast path (every eager call): a tensor that already is what we want. The checks below
    # would all pass for it; skipping them skips formatting their messages.
    if (isinstance(value, torch.Tensor) and value.dtype == dtype and value.dim() == 1
            and value.shape[0] == n and value.device == device and value.is_contiguous()):
        return value
    if isinstance(value, (bool,)):
        raise ValueError(f"{name}: must be a number or a tensor, got bool")
    if isinstance(value, (int, float)):
        return torch.full((n,), value, dtype=dtype, device=device)
    check(isinstance(value, torch.Tensor), name, f"must be a tensor or a number, got {type(value)}")
    check(value.dim() == 1 and value.shape[0] == n, name,
          f"must have shape [{n}] (one value per request), got {tuple(value.shape)}")
    check(value.device == device, name, f"must be on {device}, got {value.device}")
    if dtype.is_floating_point:
        check(value.dtype.is_floating_point, name, f"must be a floating tensor, got {value.dtype}")
    else:
        check(not value.dtype.is_floating_point and value.dtype != torch.bool, name,
              f"must be an integer tensor, got {value.dtype}")
    if value.dtype != dtype:
        value = value.to(dtype)
    return value.contiguous()


_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_logits(logits, name: str = "logits") -> None:
    # Fast path: the same conditions as below, no message formatted.
    if (isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.dtype in _LOGIT_DTYPES
            and 1 <= logits.shape[1] <= (1 << 24)
            and (logits.stride(1) == 1 or logits.shape[1] == 1)):
        return
    check(isinstance(logits, torch.Tensor), name, "must be a torch.Tensor")
    check(logits.dim() == 2, name, f"must be 2-D [rows, vocab], got shape {tuple(logits.shape)}")
    check(logits.dtype in _LOGIT_DTYPES, name,
          f"dtype must be float32, bfloat16 or float16, got {logits.dtype}")
    check(logits.shape[1] >= 1, name, "vocab dimension must be >= 1")
    check(logits.stride(1) == 1 or logits.shape[1] == 1, name,
          f"last dimension must be contiguous (stride 1), got strides {logits.stride()}")
    check(logits.shape[1] <= (1 << 24), name, "vocab size must be <= 2**24")


IntOrTensor = Union[int, torch.Tensor]
FloatOrTensor = Union[float, torch.Tensor]


def copy_outputs(dsts, srcs) -> None:
    """Copy a reference kernel's results into an out-variant op's outputs (CPU kernels);
    optional outputs that are None are skipped."""
    for dst, src in zip(dsts, srcs):
        if dst is not None:
            dst.copy_(src)


def sampling_params(n: int, device: torch.device, seed, offset, temperature, top_k, top_p,
                    min_p):
    """The per-request sampling parameters shared by sampling and verify, as device tensors
    (seed/offset int64 required; temperature/top_p/min_p float32, top_k int32, or None)."""
    return (as_param(seed, "seed", n, torch.int64, device, allow_none=False),
            as_param(offset, "offset", n, torch.int64, device, allow_none=False),
            as_param(temperature, "temperature", n, torch.float32, device),
            as_param(top_k, "top_k", n, torch.int32, device),
            as_param(top_p, "top_p", n, torch.float32, device),
            as_param(min_p, "min_p", n, torch.float32, device))


def param_range_checks(temperature, top_p, min_p):
    """[(argument, message, device bool 'some value is out of range')] for the given params;
    the caller reads them (with anything else it needs) in one host sync."""
    checks = []
    if temperature is not None:
        checks.append(("temperature", "must be finite and >= 0 (0 = greedy)",
                       (~(torch.isfinite(temperature) & (temperature >= 0))).any()))
    if top_p is not None:
        checks.append(("top_p", "must be in (0, 1] (1 = off)", (~((top_p > 0) & (top_p <= 1))).any()))
    if min_p is not None:
        checks.append(("min_p", "must be in [0, 1] (0 = off)",
                       (~((min_p >= 0) & (min_p <= 1))).any()))
    return checks


def raise_failed_checks(checks, bad_flags) -> None:
    for (name, msg, _), bad in zip(checks, bad_flags):
        check(not bad, name, msg)
