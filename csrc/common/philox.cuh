// Philox4x32-10 (Random123) and the project's uniform mapping. Torch-free.
// Must match python/tokenspeed_kernel/reference/prims.py bit for bit.
#pragma once
#include <cstdint>

namespace tokenspeed_kernel {

enum : uint32_t { kStreamSample = 0, kStreamAccept = 1, kStreamResample = 2 };

struct Philox4 {
  uint32_t x, y, z, w;
};

__host__ __device__ __forceinline__ void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi,
                                                        uint32_t& lo) {
#ifdef __CUDA_ARCH__
  lo = a * b;
  hi = __umulhi(a, b);
#else
  uint64_t p = uint64_t(a) * uint64_t(b);
  lo = uint32_t(p);
  hi = uint32_t(p >> 32);
#endif
}

// counter = (c0, c1, c2, c3), key = (k0, k1)
__host__ __device__ __forceinline__ Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                          uint32_t c3, uint32_t k0, uint32_t k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return {c0, c1, c2, c3};
}

// The 4 words for tokens 4*blk .. 4*blk+3 of (seed, offset, stream).
__host__ __device__ __forceinline__ Philox4 philox_block(uint64_t seed, uint64_t offset,
                                                         uint32_t blk, uint32_t stream) {
  return philox4x32_10(blk, uint32_t(offset), uint32_t(offset >> 32), stream, uint32_t(seed),
                       uint32_t(seed >> 32));
}

__host__ __device__ __forceinline__ uint32_t philox_word(uint64_t seed, uint64_t offset,
                                                         uint32_t token, uint32_t stream) {
  Philox4 r = philox_block(seed, offset, token >> 2, stream);
  switch (token & 3) {
    case 0: return r.x;
    case 1: return r.y;
    case 2: return r.z;
    default: return r.w;
  }
}

}  // namespace tokenspeed_kernel
