#!/usr/bin/env bash
# A/B of build variants of the CUDA verify kernels on one GPU (device tool):
#
#   VARIANTS="new: old:-DTS_FINAL_PIPE=0" SHAPES="256,1,151936,bf16 ..." ROUNDS=2 bench/lab/tools/verify_ab.sh
#
# Each variant "name:flags" is a copy of the tree built in parallel with NVCC_APPEND_FLAGS=flags
# (MAX_JOBS split between them; several flags joined by "_": "-DA=1_-DB=2"); "name=DIR:flags"
# takes csrc/ from DIR instead (e.g. an older commit's sources carried in a git-ignored folder). Then, ROUNDS times, every variant runs
# `bench/lab/tools/verify_sweep.py pick SHAPES` (per-kernel device times, back-to-back calls) in turn, so
# the spread between rounds of one variant shows the noise; then `bench/lab/tools/verify_tokens.py dump`
# per variant and `cmp` of every variant against the first (tokens must be identical).
# Output under $OUT (or ./verify_ab_logs): ab.csv (variant, round, sweep columns), logs.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOG=${OUT:-$ROOT/verify_ab_logs}
mkdir -p "$LOG"
VARIANTS=${VARIANTS:?"VARIANTS=\"name:flags ...\""}
SHAPES=${SHAPES:-"256,1,151936,bf16 256,3,151936,fp32 256,8,151936,bf16 64,3,151936,fp32 16,1,151936,bf16"}
ROUNDS=${ROUNDS:-2}
read -ra VS <<< "$VARIANTS"
jobs=$(( ${MAX_JOBS:-16} / ${#VS[@]} )); [ "$jobs" -lt 1 ] && jobs=1
export PYTHONUNBUFFERED=1
for v in "${VS[@]}"; do
  name=${v%%:*}; flags=${v#*:}; flags=${flags//_-/ -}; src=.
  case $name in *=*) src=${name#*=}; name=${name%%=*} ;; esac
  d=/tmp/ab_$name; rm -rf "$d"; mkdir -p "$d"
  cp -a csrc python setup.py pyproject.toml CMakeLists.txt tools "$d"/ && mkdir -p "$d/bench/lab" && cp -a bench/lab/tools "$d/bench/lab/"
  if [ "$src" != . ]; then rm -rf "$d/csrc"; cp -a "$src/csrc" "$d/csrc"; fi
  ( cd "$d" && NVCC_APPEND_FLAGS="$flags" MAX_JOBS=$jobs timeout 500 $PY setup.py build_ext --inplace \
      > "$LOG/build_$name.log" 2>&1; echo "[ab] build $name rc=$?" ) &
done
wait
echo "variant,round,bs,n,V,dtype,pos_cs,final_splits,pos_us,final1_us,resolve_us,final2_us,total_us,same_tokens" > "$LOG/ab.csv"
names=()
for v in "${VS[@]}"; do n=${v%%:*}; names+=("${n%%=*}"); done
for r in $(seq 1 "$ROUNDS"); do
  for name in "${names[@]}"; do
    PYTHONPATH=/tmp/ab_$name/python timeout 300 $PY bench/lab/tools/verify_sweep.py pick $SHAPES \
      > "$LOG/sweep_${name}_$r.log" 2>&1
    grep -E '^[0-9]' "$LOG/sweep_${name}_$r.log" | sed "s/^/$name,$r,/" >> "$LOG/ab.csv"
  done
done
first=""
for name in "${names[@]}"; do
  PYTHONPATH=/tmp/ab_$name/python timeout 300 $PY bench/lab/tools/verify_tokens.py dump "/tmp/tok_$name.pt" \
    > "$LOG/tok_$name.log" 2>&1
  if [ -z "$first" ]; then first=$name; continue; fi
  PYTHONPATH=/tmp/ab_$name/python $PY bench/lab/tools/verify_tokens.py cmp "/tmp/tok_$first.pt" "/tmp/tok_$name.pt" \
    > "$LOG/cmp_$name.log" 2>&1
  echo "[ab] tokens $name vs $first: rc=$? $(tail -n1 "$LOG/cmp_$name.log")"
done
# summary: final1 and total per shape and variant (mean over rounds)
$PY - "$LOG/ab.csv" <<'EOF'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
acc = collections.defaultdict(list)
for r in rows:
    acc[(r["bs"], r["n"], r["V"], r["dtype"], r["variant"])].append(r)
shapes = sorted({k[:4] for k in acc}, key=lambda k: (k[3], int(k[2]), int(k[1]), int(k[0])))
vs = list(dict.fromkeys(r["variant"] for r in rows))
print("shape," + ",".join(f"{v}_final1,{v}_total" for v in vs))
for s in shapes:
    cells = []
    for v in vs:
        rr = acc.get(s + (v,), [])
        f1 = [float(x["final1_us"]) for x in rr]
        tt = [float(x["total_us"]) for x in rr]
        cells.append("/".join(f"{x:.1f}" for x in f1) + "," + "/".join(f"{x:.1f}" for x in tt))
    print(":".join(s) + "," + ",".join(cells))
EOF
