#!/usr/bin/env bash
# Validation of the comm family (ops.all_gather_hidden) on a machine with >= 2 GPUs and the
# extension built:
#   1. tests     pytest tests/test_comm.py (CPU tests + the multi-GPU ones: bit-exact vs NCCL,
#                10000 CUDA-graph replays, interleaving with NCCL, timeouts, opcheck, the
#                multicast gate on this machine's environment)
#   2. memcheck  compute-sanitizer --tool memcheck on a small run of every P2P kernel
#   3. racecheck compute-sanitizer --tool racecheck on the same run
#   4. sass      csrc/comm/dump_sass.sh (PTX/SASS of the multimem kernel, grep summary) and the
#                same check on the shipped extension binary
#   5. bench     python -m tokenspeed_kernel.bench comm (P2P-CUDA / P2P-Triton / NCCL+permute)
# and prints a short summary. Logs go to $OUT/gpu_comm/ if OUT is set, else ./gpu_comm_logs/;
# benchmark results to $OUT/bench_results/<gpu>/ if OUT is set, else bench/results/<gpu>/.
#
#   tools/gpu_comm.sh                    # everything
#   STEPS="tests sass" tools/gpu_comm.sh # a subset (tests memcheck racecheck sass bench)
#   QUICK=1 tools/gpu_comm.sh            # bench --quick
#   BUILD=1 tools/gpu_comm.sh            # build the extension first if it does not load
# Under a 10-minute-per-command limit run it in two parts:
#   STEPS="tests sass" tools/gpu_comm.sh ; STEPS="memcheck racecheck bench" QUICK=1 tools/gpu_comm.sh
# Step time limits (s): TESTS_TIMEOUT=570 SAN_TIMEOUT=420 BENCH_TIMEOUT=570.
#
# Leaves the multicast-disabling variables (NCCL_NVLS_ENABLE / TORCH_SYMM_MEM_DISABLE_MULTICAST /
# NVSHMEM_DISABLE_NVLS) exactly as the machine set them; no step opts in to multicast.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$(tools/env.sh 2>/dev/null || command -v python3)}
STEPS=${STEPS:-"tests memcheck racecheck sass bench"}
if [ -n "${OUT:-}" ]; then LOG=$OUT/gpu_comm; RES=$OUT/bench_results; else LOG=$ROOT/gpu_comm_logs; RES=""; fi
mkdir -p "$LOG"
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
[ -z "${TS_GIT_SHA:-}" ] && TS_GIT_SHA=$(git rev-parse HEAD 2>/dev/null || echo unknown) && export TS_GIT_SHA

declare -A RC DUR
ORDER=()
run_step() {  # run_step <name> <timeout_s> <cmd...>
  local name=$1 tmo=$2; shift 2
  ORDER+=("$name")
  echo "== [$name] $*" | tee "$LOG/$name.log"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=30 "$tmo" "$@" >> "$LOG/$name.log" 2>&1
  RC[$name]=$?
  DUR[$name]=$((SECONDS - t0))
  tail -n 6 "$LOG/$name.log" | sed "s/^/   [$name] /"
}
want() { [[ " $STEPS " == *" $1 "* ]]; }

# ---- environment ----
{
  echo "date: $(date -u +%FT%TZ)  git: $TS_GIT_SHA  python: $PY"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 || true
  nvidia-smi topo -m 2>&1 | head -8 || true
  for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS; do
    echo "$v=${!v-<unset>}"
  done
  "$PY" - <<'EOF'
import torch, tokenspeed_kernel as t
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())
try:
    import triton; print("triton", triton.__version__)
except Exception as e:
    print("triton unavailable:", e)
print("extension:", t.extension_available() or t.extension_error())
from tokenspeed_kernel.ops import comm as oc
print("multicast disabled by env:", oc.multicast_disabled_by_env())
EOF
} 2>&1 | tee "$LOG/env.log"

if ! "$PY" -c "import tokenspeed_kernel as t, sys; sys.exit(0 if t.extension_available() else 1)" 2>/dev/null; then
  if [ "${BUILD:-0}" = 1 ]; then
    run_step build 1800 make build
  else
    echo "!! extension not loadable: the p2p-cuda paths are skipped (BUILD=1 builds it)" | tee -a "$LOG/env.log"
  fi
fi

NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
[ "$NGPU" -ge 2 ] || echo "!! fewer than 2 GPUs ($NGPU): multi-GPU tests will skip, bench will not run"

# ---- 1. tests ----
want tests && run_step tests "${TESTS_TIMEOUT:-570}" "$PY" -m pytest -q -ra tests/test_comm.py

# ---- 2./3. compute-sanitizer on a small run (2 ranks, every P2P kernel, few calls) ----
SAN=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/compute-sanitizer 2>/dev/null \
      || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
for tool in memcheck racecheck; do
  want $tool || continue
  if [ -z "$SAN" ]; then
    ORDER+=("$tool"); RC[$tool]=127; DUR[$tool]=0; echo "!! compute-sanitizer not found" | tee "$LOG/$tool.log"
    continue
  fi
  # instrument only our kernels (CUDA all_gather_hidden_kernel<...> and Triton
  # _all_gather_hidden_kernel): NCCL's kernels stay fast and out of the report
  filt=()
  if "$SAN" --help 2>/dev/null | grep -q -- '--kernel-name'; then
    filt=(--kernel-name kns=all_gather_hidden)
  elif "$SAN" --help 2>/dev/null | grep -q -- '--filter'; then
    filt=(--filter kns=all_gather_hidden)
  fi
  run_step $tool "${SAN_TIMEOUT:-420}" "$SAN" --tool $tool --target-processes all \
      --error-exitcode 99 --print-limit 50 "${filt[@]}" "$PY" tests/comm_helpers.py sanitize --world "$NGPU"
done

# ---- 4. PTX / SASS of the multimem kernel (standalone, torch-free) + the shipped binary ----
if want sass; then
  run_step sass 180 csrc/comm/dump_sass.sh "$LOG/sass"
  SO=$(ls python/tokenspeed_kernel/_C*.so 2>/dev/null | head -1)
  CUOBJ=$(command -v cuobjdump || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/cuobjdump 2>/dev/null || \
          echo "$("$PY" -c 'import os,triton;print(os.path.dirname(triton.__file__))' 2>/dev/null)/backends/nvidia/bin/cuobjdump")
  if [ -n "$SO" ] && [ -x "$CUOBJ" ]; then
    "$CUOBJ" -sass "$SO" 2>/dev/null | awk -v so="$SO" '
      /Function :/ { fn=$3; k = (fn ~ /all_gather_hidden(_pipe)?_kernel/) ? ((fn ~ /Lb1E/) ? "multimem" : "unicast") : "" }
      k != "" && /STG\.E\.128\.STRONG\.SYS/ { s[k]++ }
      k != "" && /Function :/ { n[k]++ }
      END { printf "shipped %s: %d multimem kernels (%d strong.sys 128-bit stores), %d unicast kernels (%d)\n",
            so, n["multimem"], s["multimem"], n["unicast"], s["unicast"] }' \
      | tee -a "$LOG/sass.log"
  fi
fi

# ---- 5. benchmark ----
if want bench && [ "$NGPU" -ge 2 ]; then
  run_step bench "${BENCH_TIMEOUT:-570}" "$PY" -m tokenspeed_kernel.bench comm ${QUICK:+--quick} \
      --budget-s "${BENCH_BUDGET:-420}" ${RES:+--out "$RES"}
fi

# ---- summary ----
echo
echo "================ gpu_comm summary ($(date -u +%FT%TZ), git ${TS_GIT_SHA:0:12}) ================"
fail=0
for s in "${ORDER[@]}"; do
  r=${RC[$s]}; [ "$r" = 0 ] && st=PASS || { st="FAIL(rc=$r)"; fail=1; }
  printf '  %-10s %-12s %5ss   %s\n' "$s" "$st" "${DUR[$s]}" "$LOG/$s.log"
done
[ -f "$LOG/tests.log" ] && grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)' "$LOG/tests.log" | tail -8 | sed 's/^/  tests: /'
for tool in memcheck racecheck; do
  [ -f "$LOG/$tool.log" ] && grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool.log" | sort | uniq -c | sed "s/^/  $tool: /"
done
[ -f "$LOG/sass.log" ] && grep -E 'multimem\.st\.relaxed|st\.release\.sys|ld\.acquire\.sys|globaltimer|shipped|FAILED' "$LOG/sass.log" | head -8 | sed 's/^/  sass: /'
if [ -f "$LOG/bench.log" ]; then
  grep -E '^\| (1|8|32|128|512) \|' "$LOG/bench.log" | head -15 | sed 's/^/  bench: /'
  grep -E 'wrote ' "$LOG/bench.log" | tail -1 | sed 's/^/  bench: /'
fi
exit $fail
