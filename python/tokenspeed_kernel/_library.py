"""Lazy loader of the compiled extension ``tokenspeed_kernel._C``.

The first ``load()`` imports it, which registers every ``torch.ops.tokenspeed_kernel.*`` op
(the one ``TORCH_LIBRARY`` lives in ``csrc/bindings.cpp``). A failure is remembered and re-raised,
quoting the original error, whenever a CUDA-only path is requested.
"""
from __future__ import annotations

import importlib
import os
from typing import Optional

_state = {"loaded": False, "error": None}


class ExtensionUnavailable(RuntimeError):
    pass


def _try_load() -> None:
    if _state["loaded"] or _state["error"] is not None:
        return
    if os.environ.get("TOKENSPEED_KERNEL_NO_EXT") == "1":
        _state["error"] = "disabled by TOKENSPEED_KERNEL_NO_EXT=1"
        return
    try:
        import torch  # noqa: F401  (the extension links against torch's libraries)
        importlib.import_module("tokenspeed_kernel._C")
        from .ops import _registration  # noqa: F401  (fakes + CPU reference kernels)
        _state["loaded"] = True
    except Exception as e:  # keep the original error for later
        _state["error"] = f"{type(e).__name__}: {e}"


def extension_available() -> bool:
    _try_load()
    return _state["loaded"]


def extension_error() -> Optional[str]:
    _try_load()
    return _state["error"]


def require(what: str):
    """Return torch.ops.tokenspeed_kernel or raise with the original load failure quoted."""
    _try_load()
    if not _state["loaded"]:
        raise ExtensionUnavailable(
            f"{what} needs the compiled extension tokenspeed_kernel._C, which failed to load: "
            f"{_state['error']}. Build it with `make build` (or `pip install --no-build-isolation "
            f"-e .` with a CUDA-enabled torch and nvcc), or pass backend='triton' / 'reference'.")
    import torch
    return torch.ops.tokenspeed_kernel
