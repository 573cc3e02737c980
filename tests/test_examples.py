"""The scripts in examples/ run (tiny sizes, CPU: the reference backend) and print what they say.

Each example runs as a subprocess, as a user would run it. The two transformers examples are
skipped when transformers is not installed; their "not installed" message is tested either way.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name, *args, block_transformers=False):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"),
                                                      env.get("PYTHONPATH")]))
    path = str(EXAMPLES / name)
    if block_transformers:   # run it as if transformers were not installed
        cmd = [sys.executable, "-c", "import runpy, sys; sys.modules['transformers'] = None; "
               f"sys.argv = [{path!r}]; runpy.run_path({path!r}, run_name='__main__')"]
    else:
        cmd = [sys.executable, path, *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def check(p, expected):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert expected in p.stdout, p.stdout


def test_decode_loop():
    pytest.importorskip("transformers")
    p = run_example("decode_loop.py", "--batch", "3", "--steps", "3", "--vocab", "128")
    check(p, "replay with the same seeds: identical tokens")
    assert "request 2 (seed 1236" in p.stdout


def test_speculative_decoding():
    pytest.importorskip("transformers")
    p = run_example("speculative_decoding.py", "--batch", "2", "--num-draft", "2",
                    "--rounds", "2", "--vocab", "128")
    check(p, "probabilistic: acceptance rate ")
    assert "strict: acceptance rate " in p.stdout


@pytest.mark.parametrize("name", ["decode_loop.py", "speculative_decoding.py"])
def test_without_transformers_says_so(name):
    p = run_example(name, block_transformers=True)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert f"{name} needs transformers" in p.stderr, p.stderr


def test_tp_all_gather_and_dp_sampling():
    p = run_example("tp_all_gather_and_dp_sampling.py", "--world-size", "2", "--steps", "2",
                    "--batch", "6", "--vocab", "300")
    check(p, "all-gather + sample and dp_sample gave identical tokens on every rank")


# ---- the same scripts with --device cuda (the CUDA kernels; skipped without a GPU) ----
def _gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_decode_loop_cuda(backend):
    pytest.importorskip("transformers")
    if _gpus() < 1:
        pytest.skip("needs a GPU")
    p = run_example("decode_loop.py", "--device", "cuda", "--backend", backend)
    check(p, "replay with the same seeds: identical tokens")


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_speculative_decoding_cuda(backend):
    pytest.importorskip("transformers")
    if _gpus() < 1:
        pytest.skip("needs a GPU")
    p = run_example("speculative_decoding.py", "--device", "cuda", "--backend", backend)
    check(p, "probabilistic: acceptance rate ")
    assert "strict: acceptance rate " in p.stdout


def test_tp_all_gather_and_dp_sampling_cuda():
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    p = run_example("tp_all_gather_and_dp_sampling.py", "--device", "cuda", "--world-size", "2")
    check(p, "all-gather + sample and dp_sample gave identical tokens on every rank")
