#!/usr/bin/env bash
# A second device call (~9 min, $OUT set, repository root) after s20_queue_call.sh on the same
# warm machine (reuses its /tmp/q_tree build; builds the tree there when it is gone):
#   bash bench/lab/tools/s21_call2.sh
# 1. ncu (ncu_kernel.sh) of the CUDA sampler kernel with / without processing at B = 256
#    (where the fused processing's ~1.8x goes) and of the Triton K3 of min-p and top-p at B = 1
#    (~14 us each in the torch profiler: a single program's serial chain?);
# 2. graph-replay times of the processing call against the same call without it, B = 64 / 256;
# 3. verify_prepass_ab.py: verify's processing pre-pass under launch overrides against a copy;
# 4. if time is left: the CUDA backend against the reference on random small cases
#    (fuzz_sampling.py / fuzz_verify.py; the Triton backend passed 6900 / 3000 such cases in the
#    interpreter), then the Triton greedy calls at B = 1 / 4 / 16, {"warps": 4} against the
#    default, twice.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD; OUT=${OUT:-$ROOT/queue_logs}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 )) s"; }
if ! ls /tmp/q_tree/python/tokenspeed_kernel/*.so > /dev/null 2>&1; then
  d=/tmp/q_tree; rm -rf $d; mkdir -p $d
  cp -a csrc python setup.py pyproject.toml CMakeLists.txt tools tests bench $d/
  (cd $d && MAX_JOBS=16 timeout 300 python3 setup.py build_ext --inplace > $OUT/build_tree.log 2>&1
   echo "build tree rc=$? $(el)")
fi
export PYTHONUNBUFFERED=1
K=bench/lab/tools/ncu_kernel.sh
echo "--- ncu $(el)"
bash $K sample_kernel cuda,top_k_top_p,256,151936,fp32 cuda_tktp256 /tmp/q_tree 2
bash $K sample_kernel cuda,proc,256,151936,fp32 cuda_proc256 /tmp/q_tree 2
bash $K _k3_finalize triton,min_p,1,151936,fp32 k3_minp1 /tmp/q_tree
bash $K _k3_finalize triton,top_p,1,151936,fp32 k3_topp1 /tmp/q_tree
echo "--- proc timings $(el)"
for r in 1 2; do
  PYTHONPATH=/tmp/q_tree/python:tests timeout 90 python3 bench/lab/tools/prof_sampling.py \
    cuda,top_k_top_p,64,151936,fp32 cuda,proc,64,151936,fp32 \
    cuda,top_k_top_p,256,151936,fp32 cuda,proc,256,151936,fp32 2>&1 | grep -vE "^\s*$" | sed "s/^/r$r /"
done
echo "--- verify processing pre-pass A/B $(el)"
left=$(( 540 - ($(date +%s) - t0) )); [ $left -gt 240 ] && left=240
if [ $left -ge 30 ]; then   # (timeout 0 would mean no limit)
  PYTHONPATH=/tmp/q_tree/python:tests timeout $left python3 bench/lab/tools/verify_prepass_ab.py \
    1,3 16,64,256 fp32,bf16 2>&1 | grep -E "^#|^==|rror"
else
  echo "skip the pre-pass A/B (time) $(el)"
fi
if [ $(( $(date +%s) - t0 )) -gt 440 ]; then echo "skip fuzz and triton warps (time) $(el)"; exit 0; fi
echo "--- CUDA backend fuzz against the reference $(el)"
PYTHONPATH=/tmp/q_tree/python:tests timeout 60 python3 bench/lab/tools/fuzz_sampling.py 600 11 \
  cuda cuda 2>&1 | grep -E "MISMATCH|DIFFERS|raised|^done" | head -20
PYTHONPATH=/tmp/q_tree/python:tests timeout 50 python3 bench/lab/tools/fuzz_verify.py 300 12 \
  cuda cuda 2>&1 | grep -E "MISMATCH|DIFFERS|raised|^done" | head -20
if [ $(( $(date +%s) - t0 )) -gt 480 ]; then echo "skip triton greedy warps (time) $(el)"; exit 0; fi
echo "--- triton greedy warps $(el)"
T=bench/lab/tools/triton_topp_tail.py
for r in 1 2; do
  for c in default '{"warps": 4}'; do
    if [ "$c" = default ]; then a=(); else a=(--config "$c"); fi
    PYTHONPATH=python timeout 120 python3 $T "$c" --mode greedy --batch 1,4,16 --seeds 3 "${a[@]}" 2>&1 \
      | grep -E "^==|rror" | sed "s/^/r$r /"
  done
done
echo "total $(el)"
