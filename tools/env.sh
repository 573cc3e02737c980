#!/usr/bin/env bash
# Prints the python to use, setting it up first if needed (idempotent).
#  - a preinstalled CUDA torch (the GPU image: offline) -> that python3, no venv;
#  - otherwise a .venv with torch==2.14.1 (a CUDA build: the extension compiles without a GPU)
#    and the test/bench deps from the package registries (retried; transformers, for two
#    examples, is optional).
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
  # A dropped connection to the registry is retried (three attempts) before CI is failed for it.
  for attempt in 1 2 3; do
    if .venv/bin/python -m pip install -q "torch==2.14.1" numpy scipy pytest ninja matplotlib setuptools wheel >&2; then
      break
    fi
    if [ "$attempt" = 3 ]; then echo "[env] FAILED: pip could not install the test dependencies" >&2; exit 1; fi
    echo "[env] pip install failed (attempt $attempt of 3); retrying in 10 s" >&2; sleep 10
  done
  # Optional (only the two transformers examples use it; their tests skip without it).
  .venv/bin/python -m pip install -q transformers >&2 \
    || echo "[env] WARNING: transformers did not install; the transformers example tests will be skipped" >&2
fi
echo "$PWD/.venv/bin/python"
