"""Shared test setup.

* Without a CUDA GPU the Triton paths run on the CPU through the interpreter: ``TRITON_INTERPRET=1``
  is set here, before anything imports ``triton`` (it is read when kernels are decorated).
* ``device`` fixture: ``cuda`` when a GPU is available, else ``cpu``.
* Markers: ``gpu`` (skipped without a CUDA GPU), ``multigpu(n)`` (skipped with fewer than n GPUs).
* ``draws(cpu_n, gpu_n)``: how many draws a statistical test takes on this machine.
* ``BACKENDS`` / ``skip_unless_backend(name)``: the backends a test is parametrized over;
  ``triton`` on CPU tensors needs the interpreter, ``cuda`` needs a GPU and the built extension.
"""
from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
N_GPUS = torch.cuda.device_count() if HAS_CUDA else 0
if not HAS_CUDA and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda") if HAS_CUDA else torch.device("cpu")

BACKENDS = ("reference", "triton", "cuda")


def backend_skip_reason(backend: str, device=DEVICE):
    """None when ``backend`` can run on ``device`` here, else why not."""
    device = torch.device(device)
    if backend == "reference":
        return None
    if backend == "triton":
        if device.type == "cuda":
            return None
        return None if INTERPRET else "triton on CPU tensors needs TRITON_INTERPRET=1"
    if backend == "cuda":
        if device.type != "cuda":
            return "cuda backend needs a CUDA GPU"
        import tokenspeed_kernel
        if not tokenspeed_kernel.extension_available():
            return f"extension unavailable: {tokenspeed_kernel.extension_error()}"
        return None
    raise ValueError(backend)


def skip_unless_backend(backend: str, device=DEVICE) -> None:
    reason = backend_skip_reason(backend, device)
    if reason is not None:
        pytest.skip(reason)


def draws(cpu_n: int, gpu_n: int) -> int:
    """Number of draws for a statistical test: ``gpu_n`` on a GPU, ``cpu_n`` on CPU runs."""
    return gpu_n if HAS_CUDA else cpu_n


requires_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    skip_unless_backend(request.param)
    return request.param


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "multigpu(n): needs n CUDA GPUs")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        mg = item.get_closest_marker("multigpu")
        if mg is not None:
            n = mg.args[0] if mg.args else mg.kwargs.get("n", 2)
            if N_GPUS < n:
                item.add_marker(pytest.mark.skip(reason=f"needs {n} CUDA GPUs, found {N_GPUS}"))


def sampler_path(flags):
    """The CUDA sampler's forced path for the body of a ``with``: ``flags`` an int (testing bits
    ORed into the default launch policy, the ``sampler_flags`` knob) or a pair (testing bits,
    launch-policy bits replacing the default: ``(0, 0)`` = the launches without the default
    split-candidates bits)."""
    from tokenspeed_kernel import testing
    if isinstance(flags, tuple):
        return testing.knobs(sampler_flags=flags[0], sampler_launch_flags=flags[1])
    return testing.knobs(sampler_flags=flags)
