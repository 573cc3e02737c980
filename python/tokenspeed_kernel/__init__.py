"""tokenspeed-kernel: exact, fast sampling / verify / TP-comm kernels for LLM decode.

Importing never needs a GPU or the compiled extension: ``tokenspeed_kernel.ops`` picks a backend
per call (``"auto" | "cuda" | "triton" | "reference"``), and a CUDA-only call without the
extension raises an error that quotes the original load failure.
"""
from . import ops  # noqa: F401
from ._library import extension_available, extension_error  # noqa: F401

__version__ = "0.1.0"
__all__ = ["ops", "extension_available", "extension_error", "__version__"]
