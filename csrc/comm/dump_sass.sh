#!/usr/bin/env bash
# Dump the PTX and SASS of the all_gather_hidden kernels so the multimem path (and the system-scope
# release/acquire of the flags) can be checked by reading. Needs nvcc + cuobjdump/nvdisasm only
# (no GPU, no torch): all_gather_hidden.cuh is torch-free, so it is compiled on its own here.
#
#   csrc/comm/dump_sass.sh [outdir]        (default: $OUT/comm_sass or /tmp/comm_sass)
#   ARCH=sm_100a csrc/comm/dump_sass.sh    (another target; default sm_90a)
#
# Prints a grep summary and exits non-zero if an expected instruction is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${OUT:-/tmp}/comm_sass}
mkdir -p "$out"
cuda=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$cuda/bin/nvcc}
find_tool() {  # $1 = name: $CUDA_HOME/bin, PATH, then the copy bundled with triton
  local c
  for c in "$cuda/bin/$1" "$(command -v "$1" 2>/dev/null || true)" \
           "$(${PYTHON:-python3} -c 'import os, triton; print(os.path.dirname(triton.__file__))' \
              2>/dev/null)/backends/nvidia/bin/$1"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  echo "dump_sass.sh: $1 not found (set ${1^^}=/path/to/$1)" >&2; return 1
}
CUOBJDUMP=${CUOBJDUMP:-$(find_tool cuobjdump)}
NVDISASM=${NVDISASM:-$(find_tool nvdisasm)}
ARCH=${ARCH:-sm_90a}

cat > "$out/ag_dump.cu" <<'EOF'
#include "all_gather_hidden.cuh"
// Referencing the launcher instantiates every kernel (world buckets 1/2/4/8/16 x unicast/multimem).
cudaError_t ts_dump_launch(const tokenspeed_kernel::comm::AllGatherHiddenParams& p,
                           cudaStream_t s) {
  return tokenspeed_kernel::comm::launch_all_gather_hidden(p, s);
}
EOF
flags=(-std=c++17 -O3 -lineinfo -arch="$ARCH" -I"$here")
"$NVCC" "${flags[@]}" -ptx "$out/ag_dump.cu" -o "$out/all_gather_hidden.ptx"
"$NVCC" "${flags[@]}" -cubin "$out/ag_dump.cu" -o "$out/all_gather_hidden.cubin"
"$CUOBJDUMP" -sass "$out/all_gather_hidden.cubin" > "$out/all_gather_hidden.sass"
"$NVDISASM" -c -fun "" "$out/all_gather_hidden.cubin" > "$out/all_gather_hidden.nvdisasm" 2>/dev/null ||
  "$NVDISASM" -c "$out/all_gather_hidden.cubin" > "$out/all_gather_hidden.nvdisasm"

status=0
expect() {  # expect <file> <label> <pattern> : count matches, fail if none
  local n
  n=$(grep -cE "$3" "$1" || true)
  printf '  %-58s %5s\n' "$2" "$n"
  [ "$n" -gt 0 ] || status=1
}
echo "== PTX ($out/all_gather_hidden.ptx)"
expect "$out/all_gather_hidden.ptx" "multimem.st.relaxed.sys.global.v4.f32" 'multimem\.st\.relaxed\.sys\.global\.v4\.f32'
expect "$out/all_gather_hidden.ptx" "fence.proxy.alias" 'fence\.proxy\.alias'
expect "$out/all_gather_hidden.ptx" "st.release.sys.global.u64 (flag publish)" 'st\.release\.sys\.global\.u64'
expect "$out/all_gather_hidden.ptx" "ld.acquire.sys.global.u64 (flag wait)" 'ld\.acquire\.sys\.global\.u64'
expect "$out/all_gather_hidden.ptx" "%globaltimer (bounded wait)" '%globaltimer'
expect "$out/all_gather_hidden.ptx" "st.global.v4 (unicast 16-byte push)" 'st\.global\.v4\.(u32|b32|f32)'

# SASS has no separate multicast opcode on sm_90: multimem.st.relaxed.sys.v4 becomes a 128-bit
# STG.E.128.STRONG.SYS to the multicast address. So: the multimem kernels
# (all_gather_hidden_kernel<W, true>, mangled ...ILi<W>ELb1E...) must contain strong system-scope
# 128-bit stores and the unicast kernels (...Lb0E...) must not (their data stores are weak).
echo "== PTX: multimem.st per entry (must be 0 outside the multimem instantiations)"
awk '
  /^\.visible \.entry|^\.entry/ { fn=$3; sub(/\(.*/, "", fn); n[fn]=0
                                   kind[fn] = (fn ~ /Lb1E/) ? "multimem" : "other" }
  /multimem\.st/ { n[fn]++ }
  END { bad = 0
        for (f in n) { printf "  %-8s %-80s multimem.st=%d\n", kind[f], f, n[f]
                       if ((kind[f] == "other") != (n[f] == 0)) bad = 1 }
        exit bad }' "$out/all_gather_hidden.ptx" || { echo "  PTX check FAILED"; status=1; }
echo "== SASS ($out/all_gather_hidden.sass): 128-bit stores per kernel"
echo "   (ll = the LL protocol kernels, both packings: their packets are st.volatile.v2.u64 = STRONG.SYS by design)"
awk '
  /Function :/ { fn=$3; kind = (fn ~ /Lb1E/) ? "multimem" : ((fn ~ /_ll4?_kernel/) ? "ll" : "unicast"); k[fn]=kind }
  /STG\.E\.128\.STRONG\.SYS/ { strong[fn]++ }
  /STG\.E\.128 / { weak[fn]++ }
  END {
    bad = 0
    for (f in k) {
      printf "  %-8s %-80s strong.sys=%d weak=%d\n", k[f], f, strong[f], weak[f]
      if (k[f] == "multimem" && strong[f] == 0) bad = 1
      if (k[f] == "unicast" && strong[f] > 0) bad = 1
    }
    exit bad
  }' "$out/all_gather_hidden.sass" || { echo "  SASS check FAILED"; status=1; }
echo "== SASS: PDL -- every kernel waits (ACQBULK = griddepcontrol.wait) before any memory access"
echo "   (instructions before it are parameter arithmetic only: the LL kernels' first-batch index math)"
awk '
  /Function :/ { fn=$3; seen[fn]=0; n[fn]=0; mem[fn]=0 }
  /\/\*[0-9a-f]+\*\/ +[A-Z@]/ {
    if (!seen[fn]) {
      if ($0 ~ /ACQBULK/) seen[fn] = 1
      else { n[fn]++; if ($0 ~ /(LDG|STG|LDL|STL|LDS|STS|ATOM|RED|LD\.|ST\.)/) mem[fn]++ }
    }
  }
  END { bad = 0
        for (f in n) { printf "  %-80s before ACQBULK: %4d instructions, %d memory ops%s\n", f, n[f], mem[f], seen[f] ? "" : "  (no ACQBULK!)"
                       if (!seen[f] || mem[f] > 0) bad = 1 }
        exit bad }' "$out/all_gather_hidden.sass" || { echo "  PDL order check FAILED"; status=1; }
echo "-- the W=2 multimem kernel: flag publish / wait and multicast stores (read these):"
awk '/Function :/ { p = ($3 ~ /ILi2ELb1E/) } p' "$out/all_gather_hidden.sass" |
  grep -E 'STG\.E\.128|MEMBAR|FENCE|CCTL|STRONG\.SYS' | sed 's@ */\* 0x[0-9a-f]* \*/@@' | head -24 || true
echo "files: $out/all_gather_hidden.{ptx,sass,nvdisasm,cubin}"
exit $status
