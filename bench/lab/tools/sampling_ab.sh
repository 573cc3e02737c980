#!/usr/bin/env bash
# A/B of source variants of the CUDA sampler on one GPU (device tool), in one call:
#
#   VARIANTS="base sort=bench/lab/patches/s13_cand_sort.patch \
#             both=bench/lab/patches/s13_cand_sort.patch+bench/lab/patches/s13_select_barriers.patch" \
#   CONFIGS="cuda,top_p,1,151936,fp32 cuda,top_k,1,151936,fp32" ROUNDS=2 bench/lab/tools/sampling_ab.sh
#
# Each variant "name" (the tree as it is) or "name=P1+P2" (the tree with those patches applied,
# `git apply`) is copied to /tmp/sab_<name> and built there, all in parallel (MAX_JOBS split
# between them: the build's wall time is that of its largest source file, so two or three
# variants cost about one build). Then, ROUNDS times, every variant runs
# `bench/lab/tools/prof_sampling.py CONFIGS` (warm-L2 graph replay per config) in turn, so the
# spread between rounds of one variant shows the noise; then each variant samples a fixed set of
# calls (every mode, B = 1 / 4 / 16 / 24 / 64, fp32 and bf16) and its tokens are compared with
# the first variant's (they must be identical: same contract).
# Output under $OUT (or ./sampling_ab_logs): ab.txt (variant, round, config, us), build logs,
# summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOG=${OUT:-$ROOT/sampling_ab_logs}
mkdir -p "$LOG"
VARIANTS=${VARIANTS:?"VARIANTS=\"name name=patch+patch ...\""}
CONFIGS=${CONFIGS:-"cuda,top_p,1,151936,fp32 cuda,top_p,16,151936,fp32 cuda,top_k,1,151936,fp32 cuda,top_k,16,151936,fp32 cuda,top_k_top_p,1,151936,fp32 cuda,mixed_p,16,151936,fp32 cuda,proc,16,151936,fp32"}
ROUNDS=${ROUNDS:-2}
read -ra VS <<< "$VARIANTS"
jobs=$(( ${MAX_JOBS:-16} / ${#VS[@]} )); [ "$jobs" -lt 1 ] && jobs=1
export PYTHONUNBUFFERED=1
names=()
for v in "${VS[@]}"; do
  name=${v%%=*}; patches=""; [ "$v" != "$name" ] && patches=${v#*=}
  names+=("$name")
  d=/tmp/sab_$name; rm -rf "$d"; mkdir -p "$d"
  cp -a csrc python setup.py pyproject.toml CMakeLists.txt tools "$d"/
  mkdir -p "$d/bench/lab" && cp -a bench/lab/tools "$d/bench/lab/"
  ok=1
  for pf in ${patches//+/ }; do
    (cd "$d" && git apply "$ROOT/$pf" 2>&1) || { echo "[ab] $name: $pf does not apply"; ok=0; }
  done
  [ "$ok" = 1 ] || continue
  ( cd "$d" && MAX_JOBS=$jobs timeout 500 $PY setup.py build_ext --inplace > "$LOG/build_$name.log" 2>&1
    echo "[ab] build $name rc=$?" ) &
done
wait
: > "$LOG/ab.txt"
for r in $(seq 1 "$ROUNDS"); do
  for name in "${names[@]}"; do
    PYTHONPATH=/tmp/sab_$name/python timeout 300 $PY bench/lab/tools/prof_sampling.py $CONFIGS 2>&1 |
      grep "^==" | sed "s/^== /$name,$r,/" >> "$LOG/ab.txt"
  done
done
for name in "${names[@]}"; do
  PYTHONPATH=/tmp/sab_$name/python timeout 300 $PY - "$LOG/tok_$name.pt" <<'EOF' > "$LOG/tok_$name.log" 2>&1
import sys
import torch
from tokenspeed_kernel import ops
out = {}
dev = torch.device("cuda")
for dt in (torch.float32, torch.bfloat16):
    for B in (1, 4, 16, 24, 64):
        g = torch.Generator(device=dev).manual_seed(B)
        x = (torch.randn(B, 151936, generator=g, device=dev) * 4).to(dt)
        full = lambda v, d=torch.float32: torch.full((B,), v, dtype=d, device=dev)  # noqa: E731
        modes = {"temp": dict(temperature=full(0.8)),
                 "top_k": dict(temperature=full(0.8), top_k=full(50, torch.int32)),
                 "top_p": dict(temperature=full(0.8), top_p=full(0.9)),
                 "top_k_top_p": dict(temperature=full(0.8), top_k=full(50, torch.int32),
                                     top_p=full(0.9)),
                 "min_p": dict(temperature=full(0.8), min_p=full(0.1)),
                 "flat_p": dict(temperature=full(1.0), top_p=full(0.95))}
        for m, kw in modes.items():
            r = ops.sample(x, torch.arange(B, device=dev), torch.zeros(B, dtype=torch.int64,
                           device=dev), backend="cuda", **kw)
            out[(str(dt), B, m)] = r.tokens.cpu()
torch.save(out, sys.argv[1])
print("calls", len(out))
EOF
done
first=${names[0]}
for name in "${names[@]:1}"; do
  $PY - "$LOG/tok_$first.pt" "$LOG/tok_$name.pt" <<'EOF'
import sys
import torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
bad = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
print(f"[ab] tokens {sys.argv[2]} vs {sys.argv[1]}: {len(a) - len(bad)} of {len(a)} calls equal"
      + (f"; differ: {bad[:5]}" if bad else ""))
EOF
done
# summary: graph-replay us per config and variant (each round)
$PY - "$LOG/ab.txt" <<'EOF'
import collections
import re
import sys
acc = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"([^,]+),(\d+),(.*): kernels .* graph replay \(warm\) ([0-9.]+) us", line)
    if m:
        acc[(m.group(3), m.group(1))].append(float(m.group(4)))
configs = list(dict.fromkeys(c for c, _ in acc))
variants = list(dict.fromkeys(v for _, v in acc))
print("config | " + " | ".join(variants))
for c in configs:
    print(c + " | " + " | ".join("/".join(f"{x:.1f}" for x in acc.get((c, v), [])) for v in variants))
EOF
