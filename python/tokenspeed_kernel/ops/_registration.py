"""Fake (meta) kernels and CPU kernels of every torch.ops.tokenspeed_kernel op.

Imported once, right after the compiled extension registered the schemas. CPU kernels run the
plain-PyTorch reference, so torch.library.opcheck and torch.compile work on CPU tensors too.
Each family registers its own in ``ops/<family>.py: _register_library()``.
"""
from . import sampling

sampling._register_library()

try:  # families added later register the same way
    from . import verify
    verify._register_library()
except ImportError:
    pass
try:
    from . import comm
    comm._register_library()
except ImportError:
    pass
