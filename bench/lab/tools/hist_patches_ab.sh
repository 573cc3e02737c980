#!/usr/bin/env bash
# A/B of the s18 HIST lab patches on one GPU (device tool), one call of ~8-9 minutes:
#
#   bash bench/lab/tools/hist_patches_ab.sh        (from the repository root; $OUT set)
#
# 1. copies the tree as it is to /tmp/base, applies bench/lab/patches/s18_hist_wide, s18_hist_skip,
#    s18_cs_any, s18_hist_band, s18_hist_stash (in that order) to the working tree, and builds
#    both in parallel (MAX_JOBS=8 each; build logs in $OUT);
# 2. graph-replay times (prof_sampling.py, warm L2, two rounds) of top-p without top-k in the
#    patched build with each lab bit: ",f4194304" F_HIST_SKIP, ",f16777216" F_HIST_BAND,
#    ",f33554432" F_HIST_STASH (testing flags, ORed), ",l<default | 8388608>" F_CS_ANY and
#    ",l<default | 2097152>" F_HIST_WIDE (launch-policy bits, replacing the default 2056192);
# 3. the default modes in both builds, two rounds interleaved (the patches must not slow the
#    kernels they leave alone: ptxas reports more spill stores in the FILT kernels with them,
#    808 -> 970 bytes for sample_kernel<float, true, false>);
# 4. hist_lab_check.py (tokens of every bit combination against the reference);
# 5. ncu (--set full) of the temperature kernels of the base build at B = 64 (split1_kernel)
#    and B = 256 (sample_kernel): where the time of the temperature cells goes.
# The default launch bits are read from the tree (ops.sampling._DEFAULT_LAUNCH_FLAGS) so that the
# ",l" values stay right if the default changes.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/hist_ab_logs}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/base && mkdir -p /tmp/base && cp -a csrc python setup.py pyproject.toml CMakeLists.txt tools /tmp/base/
for p in s18_hist_wide s18_hist_skip s18_cs_any s18_hist_band s18_hist_stash; do
  git apply bench/lab/patches/$p.patch || { echo "APPLY FAIL $p"; exit 1; }
done
t0=$(date +%s)
(cd /tmp/base && MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build_base.log 2>&1
 echo "base build rc=$? $(( $(date +%s) - t0 )) s") &
MAX_JOBS=8 python3 setup.py build_ext --inplace > $OUT/build.log 2>&1
echo "lab build rc=$? $(( $(date +%s) - t0 )) s"
wait
export PYTHONPATH=python:tests PYTHONUNBUFFERED=1
D=$(python3 -c "from tokenspeed_kernel.ops import sampling as S; print(S._DEFAULT_LAUNCH_FLAGS)")
W=$(( D | 2097152 )); A=$(( D | 8388608 ))
SKIP=4194304; BAND=16777216; SB=$(( SKIP | BAND )); STASH=33554432
C=""
for B in 1 4 16 64; do
  C="$C cuda,top_p,$B,151936,fp32 cuda,top_p,$B,151936,fp32,f$SKIP cuda,top_p,$B,151936,fp32,f$BAND cuda,top_p,$B,151936,fp32,f$SB"
done
C="$C cuda,top_p,16,151936,fp32,l$A cuda,top_p,16,151936,fp32,l$A,f$SB cuda,top_p,4,151936,fp32,l$A"
C="$C cuda,top_p,256,151936,fp32 cuda,top_p,256,151936,fp32,l$W cuda,top_p,256,151936,fp32,l$W,f$SKIP"
C="$C cuda,top_p,256,151936,fp32,l$W,f$STASH cuda,top_p,256,151936,fp32,l$W,f$(( STASH | SKIP ))"
C="$C cuda,top_p,256,151936,fp32,l$W,f$(( STASH | SB )) cuda,top_p,128,151936,fp32"
C="$C cuda,top_p,128,151936,fp32,l$W,f$(( STASH | SKIP )) cuda,top_p,128,151936,fp32,l$W,f$(( STASH | SB ))"
C="$C cuda,top_p_flat,1,151936,fp32 cuda,top_p_flat,1,151936,fp32,f$SB cuda,top_p_flat,16,151936,fp32"
C="$C cuda,top_p_flat,16,151936,fp32,f$SB cuda,top_p_flat,256,151936,fp32"
C="$C cuda,top_p_flat,256,151936,fp32,l$W,f$(( STASH | SKIP ))"
C="$C cuda,min_p,16,262144,fp32 cuda,min_p,16,262144,fp32,l$A cuda,top_p,16,151936,bf16"
C="$C cuda,top_p,16,151936,bf16,f$SB cuda,top_p,1,151936,bf16 cuda,top_p,1,151936,bf16,f$SB"
for r in 1 2; do
  timeout 200 python3 bench/lab/tools/prof_sampling.py $C 2>&1 | grep -E "^==|failed|Error" | sed "s/^/r$r /"
done
DEF="cuda,top_k,16,151936,fp32 cuda,top_k_top_p,1,151936,fp32 cuda,top_k_top_p,64,151936,fp32"
DEF="$DEF cuda,top_k_top_p,256,151936,fp32 cuda,min_p,16,151936,fp32 cuda,temp,256,151936,fp32"
DEF="$DEF cuda,proc,64,151936,fp32 cuda,top_p,16,151936,fp32 cuda,top_p,256,151936,fp32"
for r in 1 2; do
  timeout 60 python3 bench/lab/tools/prof_sampling.py $DEF 2>&1 | grep -E "^==" | sed "s/^/lab$r /"
  PYTHONPATH=/tmp/base/python:tests timeout 60 python3 bench/lab/tools/prof_sampling.py $DEF 2>&1 |
    grep -E "^==" | sed "s/^/base$r /"
done
timeout 120 python3 bench/lab/tools/hist_lab_check.py 2>&1 | tail -25
for cfg in "split1_kernel cuda,temp,64,151936,fp32" "sample_kernel cuda,temp,256,151936,fp32"; do
  set -- $cfg
  [ $(( $(date +%s) - t0 )) -gt 440 ] && { echo "skip ncu $2 (time)"; continue; }
  tag=$(echo "$2" | cut -d, -f2,3 | tr , _)
  PYTHONPATH=/tmp/base/python:tests PROF_ONCE=1 timeout 60 ncu --set full --import-source yes \
    -k "regex:$1" --launch-skip 3 --launch-count 1 -f -o $OUT/ncu_$tag \
    python3 bench/lab/tools/prof_sampling.py "$2" > $OUT/ncu_$tag.log 2>&1
  echo "ncu $2 rc=$?"
  ncu -i $OUT/ncu_$tag.ncu-rep --page details > $OUT/ncu_$tag.details.txt 2>&1
  grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Registers Per|Warp Cycles Per Issued" \
    $OUT/ncu_$tag.details.txt | head -20
  ncu -i $OUT/ncu_$tag.ncu-rep --page source --csv > $OUT/ncu_$tag.source.csv 2>/dev/null &&
    python3 bench/lab/tools/ncu_source_top.py $OUT/ncu_$tag.source.csv 2>&1 | head -30
  rm -f $OUT/ncu_$tag.ncu-rep
done
echo "total $(( $(date +%s) - t0 )) s"
