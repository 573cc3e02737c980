"""Check csrc/common/softmath.cuh's conversion-free mass_fixed against its definition
mass_fixed_ref (trunc(soft_exp_neg(y) * 2^38)) for every float32 y in [-70, 0], -inf and NaN,
on the GPU (the kernels use mass_fixed; the reference implements mass_fixed_ref's formula).

    python tools/check_mass_fixed.py      (compiles a small extension with torch's load_inline)
Exit status 1 on any mismatch.
"""
import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

CUDA = r"""
#include <cstdint>
#include "common/softmath.cuh"
using namespace tokenspeed_kernel;
__global__ void k(uint32_t base, uint32_t n, unsigned long long* bad, uint32_t* first) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t mag = base + i;
  const float y = __int_as_float(int(mag | 0x80000000u));
  if (mass_fixed(y) != mass_fixed_ref(y)) {
    atomicAdd(bad, 1ull);
    atomicMin(first, mag);
  }
}
__global__ void ks(unsigned long long* bad) {
  const float v[3] = {-INFINITY, __int_as_float(0x7FC00000), __int_as_float(0xFFC00000)};
  for (int i = 0; i < 3; ++i) if (mass_fixed(v[i]) != mass_fixed_ref(v[i])) atomicAdd(bad, 1ull);
}
torch::Tensor run(int64_t hi_bits) {
  auto opt = torch::TensorOptions().device(torch::kCUDA);
  auto bad = torch::zeros({1}, opt.dtype(torch::kLong));
  auto first = torch::full({1}, -1, opt.dtype(torch::kInt));
  const uint32_t chunk = 1u << 28;
  for (uint64_t b = 0; b <= uint64_t(hi_bits); b += chunk) {
    const uint32_t n = uint32_t(std::min<uint64_t>(chunk, uint64_t(hi_bits) + 1 - b));
    k<<<(n + 255) / 256, 256>>>(uint32_t(b), n, (unsigned long long*)bad.data_ptr(),
                                (uint32_t*)first.data_ptr());
  }
  ks<<<1, 1>>>((unsigned long long*)bad.data_ptr());
  return torch::cat({bad, first.to(torch::kLong)});
}
"""


def main() -> int:
    if not torch.cuda.is_available():
        print("check_mass_fixed: needs a CUDA GPU")
        return 0
    mod = load_inline("ts_check_mass_fixed", cpp_sources="torch::Tensor run(int64_t hi_bits);",
                      cuda_sources=CUDA, functions=["run"],
                      extra_include_paths=[os.path.join(ROOT, "csrc")],
                      extra_cflags=["-std=c++20"], extra_cuda_cflags=["-O3", "-std=c++20"], verbose=False)
    hi = torch.tensor([70.0], dtype=torch.float32).view(torch.int32).item()
    bad, first = mod.run(hi).tolist()
    first_y = (-torch.tensor([first], dtype=torch.int32).view(torch.float32)).item() if bad else None
    print(f"mass_fixed vs mass_fixed_ref over {hi + 1} float32 values in [-70, 0] and -inf / NaN: "
          f"{bad} mismatches" + (f" (first at y = {first_y})" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
