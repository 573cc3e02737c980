// Bit-exact float32 math shared by every backend (see reference/prims.py, the spec).
// Every operation is an explicit round-to-nearest intrinsic: no FMA contraction, IEEE division.
#pragma once
#include <cstdint>

namespace tokenspeed_kernel {

#define TS_F(bits) __int_as_float(int(bits))

__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }

// u = (2*(bits>>9)+1) * 2^-24 : exact, in [2^-24, 1-2^-24]
__device__ __forceinline__ float uniform_from_bits(uint32_t bits) {
  return fmul(float(((bits >> 9) << 1) | 1u), 5.9604644775390625e-08f);
}

// musl logf, positive normal x only
__device__ __forceinline__ float soft_ln(float x) {
  uint32_t ix = uint32_t(__float_as_int(x)) + (0x3F800000u - 0x3F3504F3u);
  int k = int(ix >> 23) - 0x7F;
  ix = (ix & 0x007FFFFFu) + 0x3F3504F3u;
  float f = fsub(__int_as_float(int(ix)), 1.0f);
  float s = __fdiv_rn(f, fadd(f, 2.0f));
  float z = fmul(s, s);
  float w = fmul(z, z);
  float t1 = fmul(w, fadd(TS_F(0x3ECCCE13), fmul(w, TS_F(0x3E789E26))));
  float t2 = fmul(z, fadd(TS_F(0x3F2AAAAA), fmul(w, TS_F(0x3E91E9EE))));
  float R = fadd(t2, t1);
  float hfsq = fmul(fmul(0.5f, f), f);
  const float dk = fsub(__int_as_float(k + 0x4B400000), 12582912.0f);  // float(k), |k| < 2^22
  float r = fmul(s, fadd(hfsq, R));
  r = fadd(r, fmul(dk, TS_F(0x3717F7D1)));
  r = fsub(r, hfsq);
  r = fadd(r, f);
  r = fadd(r, fmul(dk, TS_F(0x3F317180)));
  return r;
}

// exp(y) = 2^k * exp(y - k ln 2) for k = kf = ki = floor(y / ln 2 + 0.5): Cody-Waite reduction
// and the polynomial of soft_exp_neg (and of mass_fixed_nonpos, which must match it bit for bit)
__device__ __forceinline__ float exp_reduced(float y, float kf, int ki) {
  const float hi = fsub(y, fmul(kf, TS_F(0x3F317200)));
  const float lo = fmul(kf, TS_F(0x35BFBE8E));
  const float r = fsub(hi, lo);
  float p = TS_F(0x39500D01);
  p = fadd(fmul(p, r), TS_F(0x3AB60B61));
  p = fadd(fmul(p, r), TS_F(0x3C088889));
  p = fadd(fmul(p, r), TS_F(0x3D2AAAAB));
  p = fadd(fmul(p, r), TS_F(0x3E2AAAAB));
  p = fadd(fmul(p, r), 0.5f);
  p = fadd(fmul(p, r), 1.0f);
  p = fadd(fmul(p, r), 1.0f);
  return fmul(p, __int_as_float((ki + 127) << 23));
}

// exp(y) for y <= 0; 0 for y < -64 (and -inf, NaN)
__device__ __forceinline__ float soft_exp_neg(float y) {
  if (!(y >= -64.0f)) return 0.0f;
  const float t = fadd(fmul(y, TS_F(0x3FB8AA3B)), 0.5f);
  float kf;
  int ki;
  if (y <= 0.0f) {
    // kf = floor(t) without the conversion pipe: for |t| < 2^22, t + 1.5 * 2^23 rounded down is
    // exactly floor(t) + 1.5 * 2^23 (an integer in [2^23, 2^24), where floats are the integers);
    // removing the constant is exact, and its bits minus those of 1.5 * 2^23 are int(kf).
    const float kr = __fadd_rd(t, 12582912.0f);
    kf = fsub(kr, 12582912.0f);
    ki = __float_as_int(kr) - 0x4B400000;
  } else {
    // outside the contract (y > 0): the original floorf / F2I form, so that every input keeps
    // its historical value bit for bit (tools/check_softmath.cu checks all 2^32 inputs)
    kf = floorf(t);
    ki = int(kf);
  }
  return exp_reduced(y, kf, ki);
}

// Gumbel noise G = -ln(-ln(u))
__device__ __forceinline__ float gumbel_from_bits(uint32_t bits) {
  float u = uniform_from_bits(bits);
  float e = -soft_ln(u);
  return -soft_ln(e);
}

// order-preserving key; -0.0 keys like +0.0
__device__ __forceinline__ uint32_t key32(float x) {
  uint32_t b = uint32_t(__float_as_int(x));
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key32_to_float(uint32_t k) {
  uint32_t b = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  return __int_as_float(int(b));
}
constexpr uint32_t kIdMask = (1u << 24) - 1;
constexpr int kMassFracBits = 38;
__device__ __forceinline__ uint64_t key56(uint32_t k32, uint32_t id) {
  return (uint64_t(k32) << 24) | uint64_t(kIdMask - id);
}
__device__ __forceinline__ uint32_t key56_id(uint64_t k) { return kIdMask - uint32_t(k & kIdMask); }
__device__ __forceinline__ float key56_value(uint64_t k) {
  return key32_to_float(uint32_t(k >> 24));
}

// trunc(soft_exp_neg(y) * 2^38)
__device__ __forceinline__ int64_t mass_fixed(float y) {
  return (int64_t)fmul(soft_exp_neg(y), 274877906944.0f);
}
// mass_fixed(y) for y <= 0, -inf and NaN (bit for bit: tools/check_softmath.cu), without
// branches: soft_exp_neg's y <= 0 path on max(y, -64), then 0 where y < -64 or NaN. Straight-line
// code, so a thread's independent elements interleave (the radix levels' scans).
__device__ __forceinline__ int64_t mass_fixed_nonpos(float y) {
  const bool zero = !(y >= -64.0f);
  const float yc = zero ? -64.0f : y;
  const float t = fadd(fmul(yc, TS_F(0x3FB8AA3B)), 0.5f);
  const float kr = __fadd_rd(t, 12582912.0f);
  const float kf = fsub(kr, 12582912.0f);
  const int ki = __float_as_int(kr) - 0x4B400000;
  const float e = exp_reduced(yc, kf, ki);
  return zero ? 0 : (int64_t)fmul(e, 274877906944.0f);
}
// P' = max(1, trunc(double(p) * double(S)))
__device__ __forceinline__ int64_t top_p_limit(float p, int64_t s) {
  int64_t lim = (int64_t)__dmul_rn((double)p, (double)s);
  return lim < 1 ? 1 : lim;
}
__device__ __forceinline__ float inv_temperature(float t) {
  return t > 0.0f ? __fdiv_rn(1.0f, t) : 1.0f;
}
// The processed logit y = fl(fl(z - zmax) * inv_t), 0 where z == zmax (reference
// prims.centered): relative to the row max, never NaN for inv_t = +inf (docs/DESIGN.md).
__device__ __forceinline__ float centered(float z, float zmax, float inv_t) {
  const float d = fsub(z, zmax);
  return d == 0.0f ? 0.0f : fmul(d, inv_t);
}

// exact Gumbel score of token id; "better" = larger score, then lower id
struct Scored {
  float score;
  uint32_t id;
};
__device__ __forceinline__ bool better(float s, uint32_t id, float bs, uint32_t bid) {
  return s > bs || (s == bs && id < bid);
}

}  // namespace tokenspeed_kernel
