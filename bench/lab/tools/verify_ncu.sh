#!/usr/bin/env bash
# ncu of the verify kernels at one bench shape (bench/lab/tools/verify_once.py; 5 calls, the 5th profiled):
#   bench/lab/tools/verify_ncu.sh <bs,n,V,dtype> <kernel regex> <launch-skip> <launch-count> <out-prefix>
# Environment is passed through (e.g. TOKENSPEED_VERIFY_TUNING=1 TS_VERIFY_FS=74). Writes
# <out>.ncu-rep, <out>.details.txt (every section) and <out>.source.csv (per SASS instruction:
# stall samples, instructions executed; -lineinfo builds map them to source lines).
set -uo pipefail
shape=$1; kre=$2; skip=$3; count=$4; out=$5
ncu --clock-control none --set full --import-source yes -k "regex:$kre" --launch-skip "$skip" \
    --launch-count "$count" -f -o "$out" python3 bench/lab/tools/verify_once.py "$shape" 2 > "$out.log" 2>&1
echo "ncu rc=$?"; tail -3 "$out.log"
ncu -i "$out.ncu-rep" --page details > "$out.details.txt" 2>&1
ncu -i "$out.ncu-rep" --page source --csv --print-source sass > "$out.source.csv" 2>&1 ||
  ncu -i "$out.ncu-rep" --page source --csv > "$out.source.csv" 2>&1
wc -c "$out".*
