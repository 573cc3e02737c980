"""Random small cases through every available backend against the reference: the lab's fuzzers
(bench/lab/tools/fuzz_sampling.py, fuzz_verify.py) with a fixed seed and a few dozen cases, so
that CI keeps them working and covers their mix of edge inputs (V from 1, half types, ties,
+-inf / NaN entries and rows, magnitudes to 1e30, T to 1e-30, k beyond V, top-p 1e-6, min-p 1,
tokens_per_request 2, processing inputs, logprobs; verify in three modes with 0-4 drafts), and
that a row or request run alone gives what it got in its batch. The Triton backend runs in the
interpreter on the CPU; on a GPU the CUDA backend runs instead, on CUDA tensors. Longer runs: the
scripts themselves (bench/lab/README.md)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from conftest import DEVICE, backend_skip_reason

TOOLS = Path(__file__).resolve().parents[1] / "bench" / "lab" / "tools"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _load(name):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _backends():
    """The CUDA backend where it runs, else Triton (on a GPU the random dtypes and filter
    combinations would compile dozens of Triton variants; the Triton kernels' identity with the
    CUDA ones is tested elsewhere)."""
    for b in ("cuda", "triton"):
        if backend_skip_reason(b) is None:
            return [b]
    pytest.skip("no backend besides the reference here")


@pytest.mark.parametrize("seed", [1, 2])
def test_random_sampling_cases_match_the_reference(seed, capsys):
    bad = _load("fuzz_sampling").main(60, seed, _backends(), DEVICE)
    assert bad == 0, capsys.readouterr().out[-4000:]


def test_random_verify_cases_match_the_reference(capsys):
    bad = _load("fuzz_verify").main(40, 3, _backends(), DEVICE)
    assert bad == 0, capsys.readouterr().out[-4000:]
