#!/usr/bin/env bash
# Triton sampler at small batch (issue: the Triton backend against the seed project's
# single-launch kernels; temperature at B = 1 is the widest gap): graph-replay time of the
# temperature, min-p and greedy calls at B = 1 / 4 / 16 under launch-configuration overrides
# (triton_topp_tail.py's --config: chunks per row S1, tile BLOCK, warps of K1 / K3), tokens
# checked against the reference in every call. No build (Triton only); ~3-4 minutes on a GPU
# with the Triton compiles.
#
#   bash bench/lab/tools/triton_small_b_sweep.sh      (repository root, GPU)
#
# The default configuration (the first line of each group) is what the library runs
# (triton/sampling.py, _make_config: S1 = min(2 SMs / B, V / BLOCK), BLOCK 1024, 8 warps).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=python PYTHONUNBUFFERED=1
T=bench/lab/tools/triton_topp_tail.py
for mode in temp min_p greedy; do
  python3 $T default --mode $mode --batch 1,4,16 --seeds 3
  for c in '{"S1": 64}' '{"S1": 32}' '{"S1": 16}' '{"BLOCK": 2048}' '{"BLOCK": 2048, "S1": 32}' \
           '{"warps": 4}' '{"warps": 4, "S1": 64}' '{"warps_x": 4}'; do
    python3 $T "$c" --mode $mode --batch 1,4,16 --seeds 3 --config "$c"
  done
done 2>&1 | grep -E "^==|Error|error"
