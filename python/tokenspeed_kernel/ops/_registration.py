"""Fake (meta) kernels and CPU kernels of every torch.ops.tokenspeed_kernel op.

Imported once, right after the compiled extension registered the schemas. CPU kernels run the
plain-PyTorch reference, so torch.library.opcheck and torch.compile work on CPU tensors too.
Each family registers its own in ``ops/<family>.py: _register_library()``. (Modules are looked up
by full name: ``ops.verify`` is also the name of a function.) A family whose registration fails
(e.g. an extension built from older sources) is reported with a warning and does not take the
other families down.
"""
import importlib
import warnings

failed = {}
for _family in ("sampling", "verify", "comm", "dp"):
    try:
        _mod = importlib.import_module(f"tokenspeed_kernel.ops.{_family}")
    except ImportError:
        continue
    try:
        _mod._register_library()
    except Exception as e:  # noqa: BLE001
        failed[_family] = f"{type(e).__name__}: {e}"
        warnings.warn(f"tokenspeed_kernel: registering the {_family} ops failed ({failed[_family]});"
                      f" rebuild the extension", RuntimeWarning)
