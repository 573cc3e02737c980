#!/usr/bin/env bash
# Builds a small, offline-installable FlashInfer bundle (sampling module only) for side-by-side
# benchmarks on a GPU machine that has no network. FlashInfer is a comparison baseline only:
# the library never imports it.
#
#   tools/flashinfer-bundle.sh [OUT_DIR]        (default: .bench-deps, keep it git-ignored)
#
# On the GPU machine:  mkdir -p /tmp/fi && tar xzf .bench-deps/flashinfer.tgz -C /tmp/fi
#                      export PYTHONPATH=/tmp/fi:$PYTHONPATH
#                      python3 -c "import flashinfer.sampling"   # first call JIT-compiles (~1-2 min)
# Tested with the GPU image's Python 3.12 / torch 2.11+cu130 / nvcc 13.0.
# Pass top_k / top_p as per-row tensors (what batched engines pass): that stays on the sampling
# module (JIT ~1 min). A scalar top_k <= 256 with V >= 65536 takes FlashInfer's top-k-first fast
# path, whose JIT module ("topk") took more than 15 minutes to compile there: budget for it, or
# build it once in a call of its own (the cache lives in ~/.cache/flashinfer while the machine
# stays warm).
set -euo pipefail
FI_VERSION=${FI_VERSION:-0.7.2.post1}
TVM_FFI_VERSION=${TVM_FFI_VERSION:-0.1.15.post2}
out=$(realpath -m "${1:-.bench-deps}")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" \
  "flashinfer-python==$FI_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION"
mkdir -p "$work/site"
for w in "$work"/whl/*.whl; do
  if command -v unzip >/dev/null; then unzip -q -o "$w" -d "$work/site"; else python3 -m zipfile -e "$w" "$work/site"; fi
done
fi="$work/site/flashinfer"
# keep only what the sampling JIT module needs
keep="$work/keep"; mkdir -p "$keep"
# sampling module + the radix top-k module that its top-k-first fast path uses (scalar top_k, V >= 65536)
for f in sampling.cu renorm.cu flashinfer_sampling_binding.cu sampling_utils.h tvm_ffi_utils.h \
         topk.cu cub_topk.cu flashinfer_topk_binding.cu flashinfer_fast_topk_clusters_binding.cu topk_transform_checks.h; do
  cp "$fi/data/csrc/$f" "$keep/"
done
rm -rf "$fi/data/csrc" "$fi/data/cutlass" "$fi/experimental" "$fi/fused_moe" "$fi/moe_ep" "$work/site/b12x"
mv "$keep" "$fi/data/csrc"
# the package __init__ imports every module (and their optional deps); sampling needs none of them
printf '# trimmed for sampling benchmarks\nfrom .version import __version__\n' > "$fi/__init__.py"
mkdir -p "$out"
tar czf "$out/flashinfer.tgz" -C "$work/site" .
echo "wrote $out/flashinfer.tgz ($(du -h "$out/flashinfer.tgz" | cut -f1)); FlashInfer $FI_VERSION"
