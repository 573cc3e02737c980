#!/usr/bin/env bash
# Prints the python to use, setting it up first if needed (idempotent).
#  - a preinstalled CUDA torch (the GPU image: offline) -> that python3, no venv;
#  - otherwise a .venv with torch==2.14.1 (a CUDA build: the extension compiles without a GPU)
#    and the test/bench deps (transformers for the examples) from the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
sys_py=${PYTHON:-python3}
if [ -z "${TS_FORCE_VENV:-}" ] && "$sys_py" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  command -v "$sys_py"; exit 0
fi
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import torch, triton, pytest, scipy" 2>/dev/null; then
  echo "[env] creating .venv (torch 2.14.1 CUDA build, triton, pytest, scipy, ninja, matplotlib)" >&2
  "$sys_py" -m venv .venv >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2 || true
  .venv/bin/python -m pip install -q "torch==2.14.1" numpy scipy pytest ninja matplotlib setuptools wheel transformers >&2
fi
echo "$PWD/.venv/bin/python"
