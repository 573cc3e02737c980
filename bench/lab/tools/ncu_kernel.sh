#!/usr/bin/env bash
# ncu (full set, SASS source) of the fourth launch of the kernels matching a regex in one
# prof_sampling.py config (PROF_ONCE=1: six calls, no torch profiler). Usage (device machine,
# repository root, $OUT set):
#   bash bench/lab/tools/ncu_kernel.sh <kernel regex> <prof_sampling config> <tag> [built tree = .] [launches = 1]
#   e.g. bash bench/lab/tools/ncu_kernel.sh _k3_finalize triton,min_p,1,151936,fp32 k3_minp
# Prints the main metrics and ncu_source_top.py's summary; $OUT/<tag>.details.txt keeps the
# details page (the report itself stays in /tmp: size).
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD; RX=$1; CFG=$2; TAG=$3; TREE=${4:-.}; NL=${5:-1}
PROF_ONCE=1 PYTHONPATH=$TREE/python:$ROOT/tests timeout 240 ncu --clock-control none --set full \
  --import-source yes -k "regex:$RX" --launch-skip 3 --launch-count $NL -f -o /tmp/nk_$TAG \
  python3 bench/lab/tools/prof_sampling.py $CFG > $OUT/ncu_$TAG.log 2>&1
echo "ncu $TAG rc=$?"; tail -1 $OUT/ncu_$TAG.log
ncu -i /tmp/nk_$TAG.ncu-rep --page details > $OUT/$TAG.details.txt 2>&1
ncu -i /tmp/nk_$TAG.ncu-rep --page source --csv --print-source sass > /tmp/nk_$TAG.source.csv 2>&1
echo "== $TAG ($CFG)"
grep -E "Context [0-9]|Duration|Registers Per|Achieved Occupancy|DRAM Throughput|Executed Ipc A|Compute \(SM\) Thr|L1/TEX Hit|L2 Hit|Block Size|Grid Size" $OUT/$TAG.details.txt | head -30
python3 bench/lab/tools/ncu_source_top.py /tmp/nk_$TAG.source.csv 20 100 2>&1 | head -32
