#!/usr/bin/env bash
# One device call (~8-9 min, $OUT set, repository root) for the queued items 0, 2, 5 and 6 of
# bench/lab/README.md ("Queued for a GPU"):
#   bash bench/lab/tools/s20_queue_call.sh
# 1. builds the tree, the tree + patches/s20_split_minp.patch and the tree +
#    patches/s20_split_prefetch.patch in parallel (/tmp/q_<name>, MAX_JOBS=5 each);
# 2. the tree: the GPU sampling suite (tests/test_sampling_cuda.py), the torch.compile tests of
#    every backend (tests/test_triton_torch_compile.py: the Triton backends' custom ops, the CUDA
#    ops' fakes) and plain_bits_check.py 0 (the merged PLAIN bar and split merges had not been
#    on a GPU as one tree);
# 3. minp: split_minp_check.py, then graph-replay times of min-p with / without F_SPLIT_MINP;
# 4. prefetch: temperature / greedy at B = 1 / 4 / 16 / 64 against the tree, two rounds;
# 5. memcheck (--quick) of the tree's sampler, if time is left.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD; OUT=${OUT:-$ROOT/queue_logs}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 )) s"; }
for v in tree minp pf; do
  d=/tmp/q_$v; rm -rf $d; mkdir -p $d
  cp -a csrc python setup.py pyproject.toml CMakeLists.txt tools tests bench $d/
  case $v in
    minp) (cd $d && git apply $ROOT/bench/lab/patches/s20_split_minp.patch) || echo "APPLY FAIL $v";;
    pf) (cd $d && git apply $ROOT/bench/lab/patches/s20_split_prefetch.patch) || echo "APPLY FAIL $v";;
  esac
  (cd $d && MAX_JOBS=5 timeout 420 python3 setup.py build_ext --inplace > $OUT/build_$v.log 2>&1
   echo "build $v rc=$? $(el)") &
done
wait
export PYTHONUNBUFFERED=1
P=$ROOT/bench/lab/tools/prof_sampling.py
echo "--- tree: GPU sampling suite $(el)"
(cd /tmp/q_tree && PYTHONPATH=python:tests timeout 150 python3 -m pytest -q tests/test_sampling_cuda.py 2>&1 | tail -3)
(cd /tmp/q_tree && PYTHONPATH=python:tests timeout 150 python3 -m pytest -q tests/test_triton_torch_compile.py tests/test_random_cases.py 2>&1 | tail -3)
PYTHONPATH=/tmp/q_tree/python timeout 60 python3 bench/lab/tools/plain_bits_check.py 0 2>&1 | tail -3
echo "--- minp: tokens $(el)"
PYTHONPATH=/tmp/q_minp/python timeout 90 python3 bench/lab/tools/split_minp_check.py 2>&1 | tail -8
C=""; for B in 1 4 16 33; do C="$C cuda,min_p,$B,151936,fp32 cuda,min_p,$B,151936,fp32,f268435456"; done
C="$C cuda,min_p,1,151936,bf16 cuda,min_p,1,151936,bf16,f268435456 cuda,min_p,16,151936,bf16 cuda,min_p,16,151936,bf16,f268435456"
C="$C cuda,min_p_flat,1,151936,fp32 cuda,min_p_flat,1,151936,fp32,f268435456 cuda,min_p_flat,16,151936,fp32 cuda,min_p_flat,16,151936,fp32,f268435456"
for r in 1 2; do
  PYTHONPATH=/tmp/q_minp/python:tests timeout 60 python3 $P $C 2>&1 | grep -E "^==|rror" | sed "s/^/minp$r /"
done
echo "--- prefetch $(el)"
C=""; for B in 1 4 16 64; do C="$C cuda,temp,$B,151936,fp32 cuda,greedy,$B,151936,fp32"; done
for r in 1 2; do for v in tree pf; do
  PYTHONPATH=/tmp/q_$v/python:tests timeout 60 python3 $P $C 2>&1 | grep -E "^==|rror" | sed "s/^/$v$r /"
done; done
if [ $(( $(date +%s) - t0 )) -lt 470 ]; then
  echo "--- memcheck (tree) $(el)"
  (cd /tmp/q_tree && PYTHONPATH=python timeout $(( 560 - ($(date +%s) - t0) )) compute-sanitizer \
     --tool memcheck --error-exitcode 3 python3 tools/sanitize_sampling.py --quick > $OUT/memcheck.log 2>&1
   echo "memcheck rc=$?"; tail -3 $OUT/memcheck.log)
else
  echo "skip memcheck (time) $(el)"
fi
echo "total $(el)"
