#!/usr/bin/env bash
# Device validation of the verify family (and the shared float primitives) on one GPU:
#   build     python setup.py build_ext --inplace (skipped if the extension loads and BUILD=0)
#   prims     tools/check_softmath.cu: exhaustive bit-identity of the conversion-free soft_exp_neg /
#             soft_ln and validity of gumbel_ub
#   tests     pytest tests/test_verify.py tests/test_verify_stats.py tests/test_sampling.py
#   prof      bench/lab/tools/prof_verify.py per-kernel times of a few shapes
#   bench     python -m tokenspeed_kernel.bench verify (FlashInfer from .bench-deps if carried)
#   sanitize  compute-sanitizer memcheck (all filter sets) and racecheck (case 0) of
#             tools/sanitize_verify.py --filters-only: the threshold path (radix levels)
#   filters   bench/lab/tools/prof_filters.py (per-launch times of the threshold path), then
#             python -m tokenspeed_kernel.bench verify-filters (FlashInfer as for bench)
# The three test files took more than 330 s on an H100 (session 19: test_sampling.py and
# test_verify.py + test_verify_stats.py fit in separate 600 s calls with the build).
# Logs go to $OUT (if set) else ./gpu_verify_logs/. STEPS picks a subset (default: all but bench).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
STEPS=${STEPS:-"build prims tests prof"}
LOG=${OUT:-$ROOT/gpu_verify_logs}
mkdir -p "$LOG"
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -z "${TS_GIT_SHA:-}" ] && TS_GIT_SHA=$(git rev-parse --short HEAD 2>/dev/null || echo unknown) && export TS_GIT_SHA
summary=()
step() {  # step <name> <timeout_s> <cmd...>
  local name=$1 tmo=$2; shift 2
  local t0=$SECONDS
  timeout "$tmo" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s")
  echo "[gpu_verify] $name rc=$rc ($((SECONDS - t0)) s)"; tail -n "${TAIL:-6}" "$LOG/$name.log"
}
for s in $STEPS; do
  case $s in
    build) step build 400 env MAX_JOBS=${MAX_JOBS:-16} $PY setup.py build_ext --inplace ;;
    prims) step prims 120 bash -c "nvcc -std=c++20 -O3 -arch=sm_90a -I csrc tools/check_softmath.cu -o /tmp/check_softmath && /tmp/check_softmath" ;;
    tests) step tests ${TESTS_TIMEOUT:-400} $PY -m pytest -q -x -ra ${TESTS:-tests/test_verify.py tests/test_verify_stats.py tests/test_sampling.py} ;;
    prof) step prof 120 $PY bench/lab/tools/prof_verify.py ${PROF:-1,1,151936,bf16 1,3,151936,fp32 16,1,151936,bf16 16,3,151936,fp32 64,5,151936,fp32 256,3,151936,fp32 256,8,151936,bf16} ;;
    bench)
      if [ -f .bench-deps/flashinfer.tgz ]; then mkdir -p /tmp/ts-fi && tar xzf .bench-deps/flashinfer.tgz -C /tmp/ts-fi; export PYTHONPATH=$PYTHONPATH:/tmp/ts-fi; fi
      step bench ${BENCH_TIMEOUT:-400} $PY -m tokenspeed_kernel.bench verify ${BENCH_ARGS:-} ;;
    sanitize)
      step memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 3 $PY tools/sanitize_verify.py --filters-only
      step racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 3 $PY tools/sanitize_verify.py 0 --filters-only ;;
    filters)
      step prof_filters 150 $PY bench/lab/tools/prof_filters.py
      if [ -f .bench-deps/flashinfer.tgz ]; then mkdir -p /tmp/ts-fi && tar xzf .bench-deps/flashinfer.tgz -C /tmp/ts-fi; export PYTHONPATH=$PYTHONPATH:/tmp/ts-fi; fi
      step bench_filters ${BENCH_TIMEOUT:-400} $PY -m tokenspeed_kernel.bench verify-filters ${BENCH_ARGS:-} ;;
  esac
done
printf '%s\n' "${summary[@]}"
