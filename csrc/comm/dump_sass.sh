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

# Per kernel: which SASS instructions carry the multicast stores. The multimem kernels are the
# instantiations all_gather_hidden_kernel<W, true> (mangled ...ILi<W>ELb1E...).
echo "== SASS ($out/all_gather_hidden.sass): multimem kernels vs unicast kernels"
awk '
  /Function :/ { fn=$3; mm = (fn ~ /Lb1E/) }
  /MULTIMEM|UBLKCP|STG.*\.MMA|STAS/ { if (mm) m[fn]++; else u[fn]++ }
  END {
    for (f in m) printf "  multimem kernel %s: %d multicast store instructions\n", f, m[f];
    for (f in u) printf "  UNEXPECTED multicast-looking instruction in unicast kernel %s: %d\n", f, u[f];
  }' "$out/all_gather_hidden.sass"
echo "-- first multicast-store lines of the W=2 multimem kernel:"
awk '/Function :/ { p = ($3 ~ /ILi2ELb1E/) } p' "$out/all_gather_hidden.sass" |
  grep -E 'MULTIMEM|STG|MEMBAR|FENCE|ST\.|LD\..*STRONG\.SYS|LDG.*SYS' | head -20 || true
echo "-- system-scope flag accesses (all kernels):"
grep -cE 'STRONG\.SYS|\.SYS' "$out/all_gather_hidden.sass" | sed 's/^/  lines with .SYS scope: /'
echo "files: $out/all_gather_hidden.{ptx,sass,nvdisasm,cubin}"
exit $status
