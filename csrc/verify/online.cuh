// Verify: approximate mass sums (one pass, online), their error bound, the accept coins. Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/device_common.cuh"

namespace tokenspeed_kernel::verify {

// ------------------------------------------------------------------------------------------
// approximate mass sums (one pass, online) and their error bound
// ------------------------------------------------------------------------------------------
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Per-thread online state of one row: raw max (lowest id), and s = sum 2^((z - ref) c) with
// ref = the running max (0 before the first finite max; only -inf / NaN were summed then).
// NaN anywhere makes s NaN (ex2(NaN) = NaN, sticky through sums and rescales).
// 16-bit logits (FF): a term's argument is fma(z, c, -rc) with rc = ref * c rounded up
// (online_rc; one FFMA instead of a subtract and a multiply) while |rc| <= kFfmaRcMax, else
// (z - ref) * c. The FFMA form's error is absolute, 2u |ref c| (rc's rounding), so it is used only
// where that is small (coin_margin counts 2u kFfmaRcMax): at |zmax / T| up to ~177, i.e. the
// usual logits and temperatures; beyond, the exact subtract-multiply form keeps the bound
// independent of the logits' magnitude (and an overflowing rc could give inf - inf = NaN, which
// would flag a valid row). fp32 logits always use (z - ref) * c.
struct Online {
  float mx;
  int32_t arg;
  float ref;
  float rc;   // ref * c rounded up, or NaN: use (z - ref) * c
  float rcl;  // fl(ref * log2(e)) (logprobs), same rule
  float s;    // processed: c = inv_t * log2(e)
  float sr;   // raw (logprobs): c = log2(e)
};
__device__ __forceinline__ void online_init(Online& o) {
  o.mx = -INFINITY;
  o.arg = INT32_MAX;
  o.ref = 0.0f;
  o.rc = 0.0f;
  o.rcl = 0.0f;
  o.s = 0.0f;
  o.sr = 0.0f;
}
// rc rounded up (c > 0): z <= ref gives z c <= ref c <= rc, so every argument fma(z, c, -rc) is
// <= 0 (ex2.approx is checked on [-126, 0]) and the max's own term is at most 1.
constexpr float kFfmaRcMax = 256.0f;
__device__ __forceinline__ float online_rc(float ref, float c) {
  const float r = __fmul_ru(ref, c);
  return fabsf(r) <= kFfmaRcMax ? r : NAN;
}
// U x K elements, element (u, k) has id idx + u * step + k (ids increase with (u, k)).
// The max is a tree and the terms are summed per u, then the U partial sums as a tree, then into
// the running sum: short dependency chains (a sequential chain of U * K float adds made the
// bf16 pos kernel latency-bound). Any summation order is covered by coin_margin's float-sum term.
template <int U, int K, bool LP, bool FF>
__device__ __forceinline__ void online_block(Online& o, const float (&v)[U][K], int64_t idx,
                                             int64_t step, float c) {
  float mu[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float t[K];
#pragma unroll
    for (int k = 0; k < K; ++k) t[k] = v[u][k];
#pragma unroll
    for (int w = 1; w < K; w *= 2)
#pragma unroll
      for (int k = 0; k + w < K; k += 2 * w) t[k] = fmaxf(t[k], t[k + w]);  // NaN-ignoring
    mu[u] = t[0];
  }
#pragma unroll
  for (int w = 1; w < U; w *= 2)
#pragma unroll
    for (int u = 0; u + w < U; u += 2 * w) mu[u] = fmaxf(mu[u], mu[u + w]);
  const float vm = mu[0];
  if (vm > o.mx) {
    int64_t id = 0;
#pragma unroll
    for (int u = U - 1; u >= 0; --u)
#pragma unroll
      for (int k = K - 1; k >= 0; --k)
        if (v[u][k] == vm) id = idx + u * step + k;  // lowest id of the new max
    if (o.mx > -INFINITY) {
      o.s *= ex2_approx((o.mx - vm) * c);
      if (LP) o.sr *= ex2_approx((o.mx - vm) * kLog2e);
    }
    o.mx = vm;
    o.arg = int32_t(id);
    o.ref = vm;
    if (FF) {
      o.rc = online_rc(vm, c);
      if (LP) o.rcl = online_rc(vm, kLog2e);
    }
  }
  float ps[U], pr[U];
  // FF (16-bit logits, where the pos kernel is issue-bound): the FFMA form unless an rc
  // overflowed (uniform per thread and block: a branch, not a select). fp32 rows are
  // memory-bound and keep the subtract-multiply form (and the register allocation it had).
  const bool ffma = FF && o.rc == o.rc && (!LP || o.rcl == o.rcl);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float t[K], r[K];
    if (ffma) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        t[k] = ex2_approx(__fmaf_rn(v[u][k], c, -o.rc));
        if (LP) r[k] = ex2_approx(__fmaf_rn(v[u][k], kLog2e, -o.rcl));
      }
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float d = v[u][k] - o.ref;
        t[k] = ex2_approx(d * c);
        if (LP) r[k] = ex2_approx(d * kLog2e);
      }
    }
#pragma unroll
    for (int w = 1; w < K; w *= 2)
#pragma unroll
      for (int k = 0; k + w < K; k += 2 * w) {
        t[k] += t[k + w];
        if (LP) r[k] += r[k + w];
      }
    ps[u] = t[0];
    if (LP) pr[u] = r[0];
  }
#pragma unroll
  for (int w = 1; w < U; w *= 2)
#pragma unroll
    for (int u = 0; u + w < U; u += 2 * w) {
      ps[u] += ps[u + w];
      if (LP) pr[u] += pr[u + w];
    }
  o.s += ps[0];
  if (LP) o.sr += pr[0];
}
// The target row (state ot, logprobs sum if LP) and, if TWO, the draft row (oq) of the same
// position over the same chunk, their loads interleaved: 2U vectors in flight per thread.
template <typename T, int VEC, bool LP, bool TWO, int U>
__device__ __forceinline__ void online_chunk(const T* row, const T* qrow, int64_t start,
                                             int64_t end, float c, Online& ot, Online& oq) {
  constexpr bool FF = sizeof(T) == 2;
  const int64_t step = int64_t(kThreads) * VEC;
  int64_t idx = start + int64_t(threadIdx.x) * VEC;
  for (; idx + (U - 1) * step + VEC <= end; idx += U * step) {
    float v[U][VEC], w[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load_vec<T, VEC>(row + idx + u * step, v[u]);
      if (TWO) load_vec<T, VEC>(qrow + idx + u * step, w[u]);
    }
    online_block<U, VEC, LP, FF>(ot, v, idx, step, c);
    if (TWO) online_block<U, VEC, false, FF>(oq, w, idx, step, c);
  }
  for (; idx < end; idx += step) {
    if (idx + VEC <= end) {
      float v[1][VEC];
      load_vec<T, VEC>(row + idx, v[0]);
      online_block<1, VEC, LP, FF>(ot, v, idx, step, c);
      if (TWO) {
        load_vec<T, VEC>(qrow + idx, v[0]);
        online_block<1, VEC, false, FF>(oq, v, idx, step, c);
      }
    } else {
      for (int k = 0; idx + k < end; ++k) {
        const float v[1][1] = {{to_f<T>(row[idx + k])}};
        online_block<1, 1, LP, FF>(ot, v, idx + k, step, c);
        if (TWO) {
          const float w[1][1] = {{to_f<T>(qrow[idx + k])}};
          online_block<1, 1, false, FF>(oq, w, idx + k, step, c);
        }
      }
    }
  }
}
// Rescale a partial sum from reference `from` to the (larger or equal) reference `to`.
__device__ __forceinline__ float online_rescale(float s, float from_mx, float to, float c) {
  return from_mx > -INFINITY ? s * ex2_approx((from_mx - to) * c) : s;
}
__device__ __forceinline__ void block_sum_f2(float& a, float& b, BlockScratch& s) {
  a = warp_sum_f(a);
  b = warp_sum_f(b);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) {
    s.f[w] = a;
    s.l[w] = __float_as_int(b);
  }
  __syncthreads();
  a = 0.0f;
  b = 0.0f;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) {
    a += s.f[k];
    b += __int_as_float(int(s.l[k]));
  }
}

// Vectors of each row in flight per thread on the pos kernel's fast path (online_chunk's U):
// fp32 4 (64 / 80 registers without / with clusters: 4 / 3 CTAs/SM); 16-bit types 2 (64
// registers, 4 CTAs/SM, pos_min_blocks; with 4 vectors they needed 120 registers, 2 CTAs/SM,
// measured slower at most shapes). coin_margin counts the online blocks from it.
template <typename T>
constexpr int pos_pu() {
  return sizeof(T) == 4 ? 4 : 2;
}

// Relative error bound of the approximate sum: |S~ - S| <= delta * S, where S is the exact
// fixed-point sum (a row without min-p / top-k / top-p, so every element is kept) and
// S~ = s * 2^38 (s: the online sum above, normalized to the row's raw max zmax), for rows of T
// read in vectors of VEC by the pos kernel (PU = pos_pu<T>() vectors per online block) with
// chunk elements per CTA, a finite c = fl(invT * fl(log2 e)) and invT >= 2^-120 (the pos kernel
// sends other rows, T < ~4.2e-39 or T > ~1.3e36, to the exact path: then an element with
// A >= -26.5 has |z - zmax| <= 26.5 * 2^120, so no difference overflows, c is normal, and an
// element whose difference overflows has A < -256). Per element, with u = 2^-24 and
// A = (z - zmax) invT the real centered logit (invT the float 1/T), the exact term is
// mass_fixed(y) with y = fl(fl(z - zmax) invT), and the approximate one a product of ex2.approx
// results; both are compared with 2^38 e^A. An element has mass only if y >= -26.34, so
// |A| <= 26.4 (y = A (1 + e), |e| <= 2.01u, below); every term is counted relative to
// S >= 2^38 (the max's own mass, y = 0):
//  * soft_exp_neg vs e^y: <= 2^-23.2 relative (checked for every float32 y in [-27, -2^-24],
//    bench/lab/tools/check_verify_margin.py); budgeted 2^-23;
//  * y vs A: two roundings (a subnormal z - zmax is exact, a subnormal product is off by at most
//    2^-150), |y - A| <= (2u + u^2) |A| <= 52.8u: <= 54.5u relative. Independent of the logits'
//    magnitude: y is relative to the max;
//  * the online arguments: a term's own (z - ref) c and its rescales (ref - ref') c (in the
//    thread, the block and the cluster combine) are each a subtraction and a multiplication
//    (relative 2u + u^2), all <= 0 (ref never decreases, z <= ref), and they add up to
//    (z - zmax) c, so their rounding errors add up to <= (2u + u^2) |(z - zmax) c|; and c
//    differs from invT log2(e) by the roundings of log2(e) and of the product (relative
//    2u + u^2): <= 4.02u |A| log2(e) in log2 units, i.e. <= 107u relative (a subnormal product
//    is off by at most 2^-150);
//  * 16-bit rows (FF): a term's own argument taken as fma(z, c, -rc) with rc = ref c rounded up
//    (Online) is off by rc - ref c in [0, 2u |rc|] (plus one rounding instead of two, inside
//    the above), and |rc| <= kFfmaRcMax = 256 where that form is used (online_rc): <= 512.1u in
//    log2 units, <= 360u relative;
//  * ex2.approx.ftz: 2^-22.73 relative at most (measured for every float32 x in [-126, 0] on an
//    H200 by bench/lab/tools/check_verify_margin.py; budgeted 2^-20), one per term plus one per rescale on
//    its path: a thread rescales at most once per online block -- blocks of PU * VEC elements in
//    the main loop, then at most PU - 1 blocks of one vector and VEC - 1 single elements -- then
//    once in the block and once in the cluster combine: <= nb + 3 calls with
//    nb = nt / (PU VEC) + PU + VEC, nt = elements per thread (<= chunk / 256 + 16). Arguments
//    below -126 flush: only terms below the mass cut;
//  * float32 sums and products of positive terms: a term passes through <= 5 tree additions in
//    its block, <= nb additions into and nb rescales of the running sum, the block-level rescale,
//    5 + 8 additions of the block sum and the cluster-level rescale (then double sums): relative
//    <= (2 nb + 24) u;
//  * truncation to 2^-38 (massy elements) and elements without mass (y < -26.34: A < -26.33, so
//    2^38 e^A < 1.01 and the approximate term likewise): < 3.7e-12 of the max's mass per element,
//    budgeted V * 1e-11.
// The bound used is twice the sum of these (covering the step from relative-to-2^38 e^A to
// relative-to-S and the second-order terms).
template <typename T, int VEC>
__device__ __forceinline__ double coin_margin(int64_t chunk, int V) {
  constexpr bool FF = sizeof(T) == 2;
  constexpr int PU = pos_pu<T>();
  const double u = 5.9604644775390625e-08;
  const double nt = double(chunk) / kThreads + 16.0;           // elements per thread, at most
  const double nb = nt / double(PU * VEC) + double(PU + VEC);  // online blocks (rescales), at most
  const double d = 1.1920928955078125e-07 + 54.5 * u + 107.0 * u + (FF ? 360.0 * u : 0.0) +
                   (nb + 3.0) * 9.5367431640625e-07 + (2.0 * nb + 24.0) * u + double(V) * 1e-11;
  return 2.0 * d;
}

// What each CTA publishes to its cluster (fast path)
struct SlotOn {
  float mx[2];
  int32_t arg[2];
  float s[2];
  float sr;
};

// Exact accept test: u < p(x) / q(x)  <=>  U e_q S_p < 2^24 e_p S_q (128-bit).
__device__ __forceinline__ bool coin_exact(uint64_t U, int64_t ep, int64_t eq, int64_t St,
                                           int64_t Sq) {
  const u128 lhs = u128(U * uint64_t(eq)) * u128(uint64_t(St));
  const u128 rhs = u128(uint64_t(ep) << 24) * u128(uint64_t(Sq));
  return lhs < rhs;
}
__device__ __forceinline__ uint64_t coin_from_bits(uint32_t bits) {
  return (uint64_t(bits >> 9) << 1) | 1u;
}
__device__ __forceinline__ uint64_t coin_U(const VerifyParams& p, int i, int j) {
  return coin_from_bits(
      philox_word(uint64_t(p.seed[i]), uint64_t(p.offset[i]), uint32_t(j), kStreamAccept));
}

}  // namespace tokenspeed_kernel::verify
