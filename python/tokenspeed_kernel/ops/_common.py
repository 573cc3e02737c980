"""Shared helpers of the public ops: argument checks, backend choice, scalar broadcasting."""
from __future__ import annotations

import numbers
import warnings
from typing import NamedTuple, Optional, Union

import torch

from .. import _library

BACKENDS = ("auto", "cuda", "triton", "reference")
_warned = set()


def compiling() -> bool:
    """True while torch.compile traces: the Triton backends then launch through their custom ops
    (``ops/_triton_library.py``), which Dynamo does not trace into."""
    return torch.compiler.is_compiling()


def is_tracing() -> bool:
    """True under torch.compile tracing or CUDA-graph capture: skip host-syncing checks."""
    if torch.compiler.is_compiling():
        return True
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


class ArgumentTypeError(TypeError, ValueError):
    """A Python value of the wrong type for an argument (a float or a bool for an integer
    parameter, a string for a group, ...). A ``TypeError``, and a ``ValueError`` too, so that
    ``except ValueError`` still catches every argument error of ``ops.*``."""


def check(cond: bool, arg: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{arg}: {msg}")


def check_type(cond: bool, arg: str, msg: str) -> None:
    """Like ``check`` for a wrong Python type: raises ``ArgumentTypeError`` ("arg: msg")."""
    if not cond:
        raise ArgumentTypeError(f"{arg}: {msg}")


def is_int(v) -> bool:
    """A Python / numpy integer that is not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_int(v, arg: str, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """An integer argument: ``ArgumentTypeError`` unless an int (bools and floats are refused,
    never truncated), ``ValueError`` unless ``lo <= v <= hi`` (bounds that are not None)."""
    if not is_int(v):
        check_type(False, arg, f"must be an int, got {type(v).__name__} {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = (f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
        check(False, arg, f"must be an int {rng}, got {v}")
    return v


def check_backend(backend: str, arg: str = "backend") -> None:
    check(backend in BACKENDS, arg, f"must be one of {BACKENDS}, got {backend!r}")


def check_triton_device(device: torch.device) -> None:
    """The Triton backend runs on CUDA tensors, or on CPU tensors under the interpreter."""
    if device.type != "cuda":
        import os
        check(os.environ.get("TRITON_INTERPRET") == "1", "backend",
              "'triton' on CPU tensors needs TRITON_INTERPRET=1")


def pick_backend(backend: str, device: torch.device, op: str, arg: str = "backend") -> str:
    """'auto' -> cuda (extension) | triton (CUDA tensors, no extension: warns once) | reference.
    ``arg``: the argument's name in errors."""
    check_backend(backend, arg)
    if backend != "auto":
        if backend == "cuda":
            check(device.type == "cuda", arg, f"'cuda' needs CUDA tensors, got {device}")
            _library.require(f"tokenspeed_kernel.ops.{op}(backend='cuda')")
        if backend == "triton":
            check_triton_device(device)
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


# Integer parameters: the dtype they are passed to the kernels in, and what a Python int may be.
# seed / offset are 64-bit Philox words: ints in [-2**63, 2**64) (the upper half is taken as its
# two's-complement int64: the same 64 bits, the same key / counter). top_k saturates to the int32
# range: k <= 0 and k >= V both mean "off", so clamping any int (2**32 + 1, 2**40, ...) keeps
# its meaning; it never wraps.
_I64_LO, _I64_HI, _U64_END = -(1 << 63), (1 << 63) - 1, 1 << 64
_I32_LO, _I32_HI = -(1 << 31), (1 << 31) - 1
SATURATING_PARAMS = ("top_k",)


def _int_scalar(value, name: str, dtype: torch.dtype) -> int:
    v = int(value)
    if name in SATURATING_PARAMS:
        info = torch.iinfo(dtype)
        return min(max(v, info.min), info.max)
    if dtype == torch.int64:
        if not (_I64_LO <= v < _U64_END):
            check(False, name, f"must be a 64-bit integer in [-2**63, 2**64), got {v}")
        return v - _U64_END if v > _I64_HI else v
    info = torch.iinfo(dtype)
    if not (info.min <= v <= info.max):
        check(False, name, f"must be an integer in [{info.min}, {info.max}], got {v}")
    return v


def as_param(value, name: str, n: int, dtype: torch.dtype, device: torch.device,
             allow_none: bool = True) -> Optional[torch.Tensor]:
    """Per-request parameter: None, a Python scalar (broadcast; not CUDA-graph safe), or a
    1-D tensor of n values on ``device`` (converted to ``dtype`` if needed).

    Integer parameters (``dtype`` int32 / int64) take ints only: a bool, a float (1.5 *and*
    2.0) or any other Python value raises ``ArgumentTypeError`` naming the argument, never a
    truncated value. A Python int is range-checked before it is narrowed (``_int_scalar``);
    integer tensors of another dtype saturate (``SATURATING_PARAMS``) or are widened. Float
    parameters take ints and floats (not bools) and float tensors, rounded to float32 (a value
    beyond float32 becomes inf, which the value checks refuse)."""
    if value is None:
        check(allow_none, name, "is required")
        return None
    # Fast path (every eager call): a tensor that already is what we want. The checks below
    # would all pass for it; skipping them skips formatting their messages.
    if (isinstance(value, torch.Tensor) and value.dtype == dtype and value.dim() == 1
            and value.shape[0] == n and value.device == device and value.is_contiguous()):
        return value
    integer = not dtype.is_floating_point
    if not isinstance(value, torch.Tensor):
        if integer:
            if not is_int(value):
                check_type(False, name, f"must be an int or an integer tensor, got "
                           f"{type(value).__name__} {value!r}")
            return torch.full((n,), _int_scalar(value, name, dtype), dtype=dtype, device=device)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            check_type(False, name, f"must be a float or a floating tensor, got "
                       f"{type(value).__name__} {value!r}")
        try:
            v = float(value)
        except OverflowError:
            v = float("inf") if value > 0 else float("-inf")   # refused by the value checks
        return torch.full((n,), v, dtype=dtype, device=device)
    check(value.dim() == 1 and value.shape[0] == n, name,
          f"must have shape [{n}] (one value per request), got {tuple(value.shape)}")
    check(value.device == device, name, f"must be on {device}, got {value.device}")
    if not integer:
        check(value.dtype.is_floating_point, name, f"must be a floating tensor, got {value.dtype}")
    else:
        check(not value.dtype.is_floating_point and not value.dtype.is_complex
              and value.dtype != torch.bool, name,
              f"must be an integer tensor, got {value.dtype}")
    if value.dtype != dtype:
        if name in SATURATING_PARAMS and torch.iinfo(value.dtype).bits > torch.iinfo(dtype).bits:
            info = torch.iinfo(dtype)
            value = value.to(torch.int64).clamp(info.min, info.max)
        value = value.to(dtype)
    return value.contiguous()


_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_not_meta(t: torch.Tensor, name: str) -> None:
    check(t.device.type != "meta", name,
          "is a meta tensor (no data): pass CPU or CUDA tensors (under torch.compile the "
          "registered fake kernels handle fake tensors)")


def check_logits(logits, name: str = "logits") -> None:
    # Fast path: the same conditions as below, no message formatted.
    if (isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.dtype in _LOGIT_DTYPES
            and 1 <= logits.shape[1] <= (1 << 24)
            and (logits.stride(1) == 1 or logits.shape[1] == 1)
            and logits.device.type != "meta"):
        return
    check(isinstance(logits, torch.Tensor), name, "must be a torch.Tensor")
    check_not_meta(logits, name)
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


class SamplingParams(NamedTuple):
    """The per-request parameters of sampling / verify, normalized: device tensors of one
    length n (seed / offset int64, required; temperature / top_p / min_p float32 and top_k int32,
    or None = not given). The one object the Python layer passes around (``sampling_params``
    builds it from user arguments); unpacks like the tuple it replaces."""
    seed: torch.Tensor
    offset: torch.Tensor
    temperature: Optional[torch.Tensor]
    top_k: Optional[torch.Tensor]
    top_p: Optional[torch.Tensor]
    min_p: Optional[torch.Tensor]

    def slice(self, start: int, n: int) -> "SamplingParams":
        """Requests ``start .. start + n - 1`` (views, no copies)."""
        return SamplingParams(*(None if t is None else t[start:start + n] for t in self))

    def check_values(self) -> None:
        """Range checks of the values (one host sync); raises naming the first bad argument.
        Each interval check needs only the tensor's min and max (NaN propagates through
        ``aminmax`` and fails every comparison): one reduction per parameter and one transfer,
        the fewest device ops (each is a launch on the host's critical path in eager mode)."""
        given = [(name, t) for name, t in (("temperature", self.temperature),
                                           ("top_p", self.top_p), ("min_p", self.min_p))
                 if t is not None and t.numel()]
        if not given:
            return
        mm = torch.stack([v for _, t in given for v in torch.aminmax(t)]).tolist()
        for i, (name, _) in enumerate(given):
            in_range, msg = _PARAM_RANGES[name]
            check(in_range(mm[2 * i], mm[2 * i + 1]), name, msg)

    def filters(self) -> dict:
        """The given parameters as keyword arguments of ``ops.sample`` / ``ops.verify``."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    min_p=self.min_p)


def sampling_params(n: int, device: torch.device, seed, offset, temperature, top_k, top_p,
                    min_p) -> SamplingParams:
    """The per-request sampling parameters shared by sampling and verify, as device tensors
    (seed/offset int64 required; temperature/top_p/min_p float32, top_k int32, or None)."""
    return SamplingParams(as_param(seed, "seed", n, torch.int64, device, allow_none=False),
                          as_param(offset, "offset", n, torch.int64, device, allow_none=False),
                          as_param(temperature, "temperature", n, torch.float32, device),
                          as_param(top_k, "top_k", n, torch.int32, device),
                          as_param(top_p, "top_p", n, torch.float32, device),
                          as_param(min_p, "min_p", n, torch.float32, device))


_FLT_MAX = 3.4028234663852886e38
# per parameter: (are all values in range, given their min and max; message). NaN compares False.
_PARAM_RANGES = {
    "temperature": (lambda lo, hi: lo >= 0 and hi <= _FLT_MAX,
                    "must be finite and >= 0 (0 = greedy)"),
    "top_p": (lambda lo, hi: lo > 0 and hi <= 1, "must be in (0, 1] (1 = off)"),
    "min_p": (lambda lo, hi: lo >= 0 and hi <= 1, "must be in [0, 1] (0 = off)"),
}
