#!/usr/bin/env bash
# `make build`: the package importable from this tree, with the CUDA extension when it can be built.
#   1. an editable, pure-Python install of the package (pip, once: seconds);
#   2. the extension compiled in place (python/tokenspeed_kernel/_C*.so) by ninja in a persistent
#      build directory (build/), so that only changed sources (headers included) recompile --
#      skipped outright when the .so is newer than every file under csrc/ and setup.py.
# The toolchain decides (a CUDA torch and nvcc, as in setup.py), not whether a GPU is visible;
# without it the build says so and the package runs its Triton + reference backends.
# Usage: tools/build.sh PYTHON       (FORCE=1 rebuilds the extension even if it looks up to date)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:?"usage: tools/build.sh PYTHON (empty: tools/env.sh could not set up the environment; see its [env] lines above)"}
root=$PWD
# a real toolkit directory over an nvcc wrapper on PATH (as setup.py does)
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi
if ! "$PY" -c "import sys, tokenspeed_kernel as t; sys.exit(0 if t.__file__.startswith('$root/python/') else 1)" 2>/dev/null; then
  echo "[build] editable install of the Python package (pure Python; the extension is step 2)"
  TOKENSPEED_KERNEL_NO_EXT=1 "$PY" -m pip install --no-build-isolation --no-deps -e . 2>&1 \
    | grep -v -E "^WARNING: Location|^ *(Preparing|Checking|Getting|Building|Created|Stored|Attempting|Found|Uninstalling|Successfully uninstalled)" || true
fi
why=$("$PY" - <<'PY'
import os
try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME
except Exception as e:
    print(f"torch is not importable ({e})"); raise SystemExit
home = os.environ.get("CUDA_HOME") or CUDA_HOME
if torch.version.cuda is None:
    print(f"torch {torch.__version__} is a CPU-only build")
elif not home or not os.path.exists(os.path.join(home, "bin", "nvcc")):
    print("nvcc not found (set CUDA_HOME)")
PY
)
if [ -n "$why" ]; then
  echo "[build] NOT building the CUDA extension: $why. Triton + reference backends only."
  exit 0
fi
so=$(ls python/tokenspeed_kernel/_C*.so 2>/dev/null | head -n1 || true)
if [ -z "${FORCE:-}" ] && [ -n "$so" ] && [ -z "$(find csrc setup.py -newer "$so" -type f 2>/dev/null | head -n1)" ]; then
  echo "[build] extension up to date ($so newer than csrc/ and setup.py)"
  exit 0
fi
echo "[build] compiling the CUDA extension with MAX_JOBS=${MAX_JOBS:-all cores} (incremental: build/; a full build takes minutes per source file on 2 cores)"
t0=$SECONDS
# --force: setuptools would otherwise skip the link step when only a header changed; ninja itself
# recompiles only the objects whose sources or headers changed.
"$PY" setup.py -q build_ext --inplace --force --build-temp build/ext || { echo "[build] FAILED"; exit 1; }
echo "[build] extension built in $((SECONDS - t0)) s"
