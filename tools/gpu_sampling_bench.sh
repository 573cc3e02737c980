#!/usr/bin/env bash
# Sampling benchmark on a GPU machine (the lent device machine, or any CUDA box).
#
#   tools/gpu_sampling_bench.sh [bench options]     e.g.  --quick
#                                                   or    --vocab 151936,262144 --dtype fp32
#
# * unpacks the FlashInfer bundle .bench-deps/flashinfer.tgz when present (built here with
#   tools/flashinfer-bundle.sh .bench-deps; .bench-deps is git-ignored, so carry it to
#   the device machine); FlashInfer's sampling module JIT-compiles on first use (~1-2 min, counted
#   in the time budget). Without the bundle the FlashInfer columns are simply absent.
# * builds nothing: ours-cuda needs the compiled extension already importable
#   (python/tokenspeed_kernel/_C*.so from `make build`), else it is reported unavailable and
#   ours-triton / torch / FlashInfer still run.
# * writes $OUT/<gpu>/sampling.{csv,md,png} (+ $OUT/sampling.log) when $OUT is set, else
#   bench/results/<gpu>/. Set TS_GIT_SHA when the tree has no .git (the device machine's copy).
# * time budget: --budget-s (default 420 s from start, headline shapes first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -f .bench-deps/flashinfer.tgz ]; then
  fi_dir=${FI_DIR:-/tmp/fi}
  if [ ! -d "$fi_dir/flashinfer" ]; then
    mkdir -p "$fi_dir" && tar xzf .bench-deps/flashinfer.tgz -C "$fi_dir"
  fi
  export PYTHONPATH="$fi_dir${PYTHONPATH:+:$PYTHONPATH}"
  echo "[gpu_sampling_bench] FlashInfer bundle unpacked in $fi_dir" >&2
else
  echo "[gpu_sampling_bench] no .bench-deps/flashinfer.tgz: running without FlashInfer" >&2
fi
export PYTHONPATH="$PWD/python:$PYTHONPATH"
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv,noheader 2>/dev/null | sed 's/^/[gpu_sampling_bench] /' >&2 || true
args=(sampling "$@")
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  args+=(--out "$OUT")
  "$PY" -m tokenspeed_kernel.bench "${args[@]}" 2> >(tee "$OUT/sampling.log" >&2)
else
  "$PY" -m tokenspeed_kernel.bench "${args[@]}"
fi
