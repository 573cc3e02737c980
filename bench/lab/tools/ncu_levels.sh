#!/usr/bin/env bash
# ncu of the sampler's radix level kernels (top-p 0.9, T 0.8, N(0, 3^2) logits, V 151936, without
# the levels' compaction so that all five levels scan the rows): builds, runs two calls, profiles
# the five scanning level launches of the second. Usage (device machine, $OUT set):
#   bash bench/lab/tools/ncu_levels.sh [dtype=bf16] [rows=448]
# Writes $OUT/lv.details.txt and $OUT/lv.source.csv; prints the main metrics and
# bench/lab/tools/ncu_source_top.py's summary.
set -uo pipefail
cd "$(dirname "$0")/../../.."
DT=${1:-bf16}; ROWS=${2:-448}
MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
export PYTHONPATH=python
cat > /tmp/one.py <<'PY'
import sys, torch
from tokenspeed_kernel import ops
from tokenspeed_kernel.ops import sampling as osm
osm._NO_LEVEL_LIST_FOR_TESTING = True
dt = torch.bfloat16 if sys.argv[1] == "bf16" else torch.float32
R = int(sys.argv[2])
x = (torch.randn(R, 151936, device="cuda") * 3.0).to(dt)
seed = torch.arange(R, device="cuda"); off = torch.zeros(R, dtype=torch.int64, device="cuda")
kw = dict(temperature=torch.full((R,), 0.8, device="cuda"), top_p=torch.full((R,), 0.9, device="cuda"))
for _ in range(2):
    ops.sample(x, seed, off, backend="cuda", validate=False, **kw)
torch.cuda.synchronize()
PY
ncu --clock-control none --set full --import-source yes -k "regex:level_kernel" --launch-skip 10 \
    --launch-count 5 -f -o $OUT/lv python3 /tmp/one.py $DT $ROWS > $OUT/ncu.log 2>&1
echo "ncu rc=$?"; tail -2 $OUT/ncu.log
ncu -i $OUT/lv.ncu-rep --page details > $OUT/lv.details.txt 2>&1
ncu -i $OUT/lv.ncu-rep --page source --csv --print-source sass > $OUT/lv.source.csv 2>&1
grep -E "Duration|Registers Per|Achieved Occupancy|DRAM Throughput|Issued Warp|Compute \(SM\)" $OUT/lv.details.txt
python3 bench/lab/tools/ncu_source_top.py $OUT/lv.source.csv 12 50 2>&1 | head -90
rm -f $OUT/lv.ncu-rep
