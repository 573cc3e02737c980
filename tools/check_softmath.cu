// Exhaustive device checks of the conversion-free float primitives:
//  * soft_exp_neg / soft_ln (csrc/common/softmath.cuh) equal their previous floorf / int->float
//    forms bit for bit, for every float32 input (all 2^32 bit patterns; soft_ln over the
//    positive normal floats, its domain);
//  * mass_fixed_nonpos == mass_fixed for every y <= 0, -inf and NaN (the branch-free form the
//    radix levels use);
//  * verify's gumbel_ub(bits) >= gumbel_from_bits(bits) for all 2^23 distinct noise values, and
//    equals the previous clz form (16.65 - 0.693 b) to within 1e-5 where d > 0.
//   nvcc -O3 -arch=sm_90a -I csrc tools/check_softmath.cu -o /tmp/check_softmath && /tmp/check_softmath
#include <cstdio>
#include <cstdint>

#include "common/softmath.cuh"
#include "verify/verify.cuh"

using namespace tokenspeed_kernel;

__device__ float old_exp_neg(float y) {
  if (!(y >= -64.0f)) return 0.0f;
  float kf = floorf(fadd(fmul(y, TS_F(0x3FB8AA3B)), 0.5f));
  float hi = fsub(y, fmul(kf, TS_F(0x3F317200)));
  float lo = fmul(kf, TS_F(0x35BFBE8E));
  float r = fsub(hi, lo);
  float p = TS_F(0x39500D01);
  p = fadd(fmul(p, r), TS_F(0x3AB60B61));
  p = fadd(fmul(p, r), TS_F(0x3C088889));
  p = fadd(fmul(p, r), TS_F(0x3D2AAAAB));
  p = fadd(fmul(p, r), TS_F(0x3E2AAAAB));
  p = fadd(fmul(p, r), 0.5f);
  p = fadd(fmul(p, r), 1.0f);
  p = fadd(fmul(p, r), 1.0f);
  float scale = __int_as_float((int(kf) + 127) << 23);
  return fmul(p, scale);
}
__device__ float old_ln(float x) {
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
  float dk = float(k);
  float r = fmul(s, fadd(hfsq, R));
  r = fadd(r, fmul(dk, TS_F(0x3717F7D1)));
  r = fsub(r, hfsq);
  r = fadd(r, f);
  r = fadd(r, fmul(dk, TS_F(0x3F317180)));
  return r;
}

__global__ void check(uint32_t hi_word, unsigned long long* bad_exp, unsigned long long* bad_ln,
                      unsigned long long* n_exp, unsigned long long* n_ln,
                      unsigned long long* bad_mass, unsigned long long* n_mass) {
  const uint32_t bits = (hi_word << 24) | (blockIdx.x * blockDim.x + threadIdx.x);
  const float x = __int_as_float(int(bits));
  unsigned be = 0, bl = 0, ne = 0, nl = 0, bm = 0, nm = 0;
  // soft_exp_neg: every input (callers pass x - max <= 0; the rest keeps its old value too)
  ++ne;
  be += __float_as_uint(soft_exp_neg(x)) != __float_as_uint(old_exp_neg(x));
  // mass_fixed_nonpos == mass_fixed on its domain: y <= 0 (both zeros), -inf, NaN
  if (!(x > 0.0f)) {
    ++nm;
    bm += mass_fixed_nonpos(x) != mass_fixed(x);
  }
  // soft_ln's domain: positive normal floats
  if (x >= 1.17549435e-38f && x <= 3.4028235e38f) {
    ++nl;
    bl += __float_as_uint(soft_ln(x)) != __float_as_uint(old_ln(x));
  }
  // warp-aggregated counts (one atomic per warp and counter)
  const unsigned r0 = __reduce_add_sync(0xffffffffu, unsigned(be));
  const unsigned r1 = __reduce_add_sync(0xffffffffu, unsigned(bl));
  const unsigned r2 = __reduce_add_sync(0xffffffffu, unsigned(ne));
  const unsigned r3 = __reduce_add_sync(0xffffffffu, unsigned(nl));
  const unsigned r4 = __reduce_add_sync(0xffffffffu, unsigned(bm));
  const unsigned r5 = __reduce_add_sync(0xffffffffu, unsigned(nm));
  if ((threadIdx.x & 31) == 0) {
    if (r4) atomicAdd(bad_mass, r4);
    if (r5) atomicAdd(n_mass, r5);
    if (r0) atomicAdd(bad_exp, r0);
    if (r1) atomicAdd(bad_ln, r1);
    if (r2) atomicAdd(n_exp, r2);
    if (r3) atomicAdd(n_ln, r3);
  }
}

__global__ void check_gumbel_ub(unsigned long long* bad_bound, unsigned long long* bad_old) {
  const uint32_t v = blockIdx.x * blockDim.x + threadIdx.x;   // bits >> 9, all 2^23 values
  if (v >= (1u << 23)) return;
  const uint32_t bits = v << 9;
  const float ub = verify::gumbel_ub(bits);
  const float g = gumbel_from_bits(bits);
  const uint32_t d = 0x7FFFFFu - v;
  const int b = 32 - __clz(int(d));
  const float old_ub = fsub(16.65f, fmul(float(b), 0.693f));
  if (!(g <= ub)) atomicAdd(bad_bound, 1ull);
  if (d > 0 && fabsf(ub - old_ub) > 1e-5f) atomicAdd(bad_old, 1ull);
}

int main() {
  unsigned long long* d;
  cudaMalloc(&d, 6 * sizeof(unsigned long long));
  cudaMemset(d, 0, 6 * sizeof(unsigned long long));
  for (uint32_t h = 0; h < 256; ++h)
    check<<<(1 << 24) / 256, 256>>>(h, d, d + 1, d + 2, d + 3, d + 4, d + 5);
  unsigned long long* g;
  cudaMalloc(&g, 2 * sizeof(unsigned long long));
  cudaMemset(g, 0, 2 * sizeof(unsigned long long));
  check_gumbel_ub<<<(1 << 23) / 256, 256>>>(g, g + 1);
  unsigned long long r[6], rg[2];
  cudaMemcpy(r, d, sizeof(r), cudaMemcpyDeviceToHost);
  cudaMemcpy(rg, g, sizeof(rg), cudaMemcpyDeviceToHost);
  const cudaError_t e = cudaGetLastError();
  printf("soft_exp_neg: %llu of %llu inputs differ; soft_ln: %llu of %llu inputs differ; "
         "mass_fixed_nonpos: %llu of %llu inputs differ from mass_fixed; "
         "gumbel_ub: %llu of 2^23 below the noise, %llu differ from the clz form (%s)\n",
         r[0], r[2], r[1], r[3], r[4], r[5], rg[0], rg[1], cudaGetErrorString(e));
  return (e == cudaSuccess && r[0] == 0 && r[1] == 0 && r[2] > 0 && r[3] > 0 && r[4] == 0 &&
          r[5] > 0 && rg[0] == 0 && rg[1] == 0) ? 0 : 1;
}
