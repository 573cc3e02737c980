// Verify: small device helpers: loads, reductions, row parameters, row / slot addressing. Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/params.cuh"

namespace tokenspeed_kernel::verify {

// ------------------------------------------------------------------------------------------
// small helpers
// ------------------------------------------------------------------------------------------

// The VEC elements of one 16-byte vector (VEC * sizeof(T) == 16) as floats.
template <typename T, int VEC>
__device__ __forceinline__ void unpack_vec(const uint4 raw, float (&v)[VEC]) {
  static_assert(VEC * sizeof(T) == 16, "16-byte vectors");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // bf16 -> f32 is exact: the 16 bits are the top half of the float. One shift / mask per
    // element (extracting the high half first and then shifting cost two).
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
  } else {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = to_f<T>(e[k]);
  }
}
// VEC consecutive elements from a 16-byte aligned address (VEC * sizeof(T) == 16), or VEC == 1.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = to_f<T>(p[0]);
  } else {
    unpack_vec<T, VEC>(__ldg(reinterpret_cast<const uint4*>(p)), v);
  }
}

// Per-thread asynchronous copies (sm_80+): 16 bytes global -> shared, bypassing L1. A thread
// reads back only what it copied itself, so cp.async.wait_group alone orders the copy before
// the read (no barrier).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = __ldg(reinterpret_cast<const uint4*>(gmem));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Calls f(id, z) for every element of [start, end) owned by this thread, ids increasing per
// thread. start must be a multiple of VEC and the row 16-byte aligned when VEC > 1.
template <typename T, int VEC, typename F>
__device__ __forceinline__ void for_chunk(const T* row, int64_t start, int64_t end, F&& f) {
  constexpr int U = 4;
  const int64_t step = int64_t(kThreads) * VEC;
  int64_t idx = start + int64_t(threadIdx.x) * VEC;
  for (; idx + (U - 1) * step + VEC <= end; idx += U * step) {
    float v[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u) load_vec<T, VEC>(row + idx + u * step, v[u]);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k) f(idx + u * step + k, v[u][k]);
  }
  for (; idx < end; idx += step) {
    if (idx + VEC <= end) {
      float v[VEC];
      load_vec<T, VEC>(row + idx, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) f(idx + k, v[k]);
    } else {
      for (int k = 0; idx + k < end; ++k) f(idx + k, to_f<T>(row[idx + k]));
    }
  }
}

struct MaxArg {
  float v;
  int32_t id;
};
__device__ __forceinline__ MaxArg max_arg(MaxArg a, MaxArg b) {
  return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
}
struct Cand {  // Gumbel candidate: larger score, then lower id
  float s;
  int32_t id;
};
__device__ __forceinline__ Cand best_of(Cand a, Cand b) {
  return (b.s > a.s || (b.s == a.s && uint32_t(b.id) < uint32_t(a.id))) ? b : a;
}

__device__ __forceinline__ MaxArg warp_max_arg(MaxArg a) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    MaxArg b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.id, o)};
    a = max_arg(a, b);
  }
  return a;
}
__device__ __forceinline__ Cand warp_best(Cand a) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    Cand b{__shfl_xor_sync(0xffffffffu, a.s, o), __shfl_xor_sync(0xffffffffu, a.id, o)};
    a = best_of(a, b);
  }
  return a;
}

// Thread-block cluster abstraction: CLUSTER = false is a cluster of one CTA (any arch).
template <bool CLUSTER>
struct Grp {
  __device__ static unsigned rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (CLUSTER) return cooperative_groups::this_cluster().block_rank();
#endif
    return 0;
  }
  __device__ static unsigned size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (CLUSTER) return cooperative_groups::this_cluster().num_blocks();
#endif
    return 1;
  }
  __device__ static void sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (CLUSTER) {
      cooperative_groups::this_cluster().sync();
      return;
    }
#endif
    __syncthreads();
  }
  template <typename X>
  __device__ static X* map(X* p, unsigned r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (CLUSTER) return cooperative_groups::this_cluster().map_shared_rank(p, r);
#endif
    return p;
  }
};

// Row-level exact arithmetic
// The processed logit y = centered(z, zmax, inv_t) (softmath.cuh, reference prims.centered) for
// z <= zmax (every non-NaN z of a row whose max is zmax), up to the sign of a zero y, in one
// FMNMX instead of a compare and a select: fl(fl(z - zmax) * inv_t) is <= 0 (or -0), and NaN only
// for z == zmax with inv_t = +inf, where centered gives 0 and fminf(NaN, 0) = 0. No decision sees
// the sign of a zero y (centered itself gives -0 where the product underflows): mass_fixed,
// soft_exp_neg and every comparison treat -0 as +0, and a score's key32 maps -0 to +0.
__device__ __forceinline__ float ycen(float z, float zmax, float inv_t) {
  return fminf(fmul(fsub(z, zmax), inv_t), 0.0f);
}
__device__ __forceinline__ int64_t mass_at(float y) { return (y >= kMassCut) ? mass_fixed(y) : 0; }
typedef unsigned __int128 u128;
__device__ __forceinline__ float wide_to_f32(u128 v) {
  // f32(f64(hi) * 2^62 + f64(lo)), hi/lo in base 2^62 (reference/verify.py wide_to_f32)
  const int64_t hi = int64_t(v >> 62);
  const int64_t lo = int64_t(v & ((u128(1) << 62) - 1));
  double d = __dadd_rn(__dmul_rn(__ll2double_rn(hi), 4611686018427387904.0), __ll2double_rn(lo));
  return __double2float_rn(d);
}

// Upper bound of gumbel_from_bits(bits) (16.6356 - ln(2d + 1) with d = 2^23 - 1 - (bits >> 9)),
// by the binade of d: for d in [2^(b-1), 2^b), G <= 16.6356 - b ln 2 < 16.65 - 0.693 b. With
// e = 126 + b the biased exponent of float(d) (exact: d < 2^23), the bound is 103.968 - 0.693 e
// (d = 0: e = 0, bound 103.97, valid and loose). Full-rate ops only (no FLO / I2F): float(d) and
// float(e) by the 2^23 magic number; one FFMA (a bound, not a token-deciding value: the slack
// 16.65 - 16.6356 dwarfs its rounding). Checked exhaustively against gumbel_from_bits for all
// 2^23 values by tools/check_softmath.cu.
__device__ __forceinline__ float gumbel_ub(uint32_t bits) {
  const uint32_t d = (bits >> 9) ^ 0x7FFFFFu;  // = 2^23 - 1 - (bits >> 9)
  const float fd = __fsub_rn(__uint_as_float(d | 0x4B000000u), 8388608.0f);  // float(d)
  const uint32_t e = __float_as_uint(fd) >> 23;
  const float fe = __fsub_rn(__uint_as_float(e | 0x4B000000u), 8388608.0f);  // float(e)
  return __fmaf_rn(-0.693f, fe, 103.968f);
}
// For 1 <= n <= a: soft_ln(wide_to_f32(n)) <= ln_ub(a). wide_to_f32 is monotone and
// f32(n) <= 2^bitlen(n) <= 2^bitlen(a), and soft_ln(x) <= bitlen * 0.6932 for every float
// x in [1, 2^bitlen] (checked exhaustively for bitlen <= 127; ln 2 = 0.693147).
__device__ __forceinline__ float ln_ub(u128 a) {
  const uint64_t hi = uint64_t(a >> 64), lo = uint64_t(a);
  const int bl = hi ? 128 - __clzll((long long)hi) : 64 - __clzll((long long)lo);
  return fmul(float(bl), 0.6932f);
}

struct RowParams {
  bool greedy, mp_on;
  float inv_t, L;
};
__device__ __forceinline__ RowParams row_params(const VerifyParams& p, int i) {
  RowParams r;
  const float t = p.temperature ? p.temperature[i] : 1.0f;
  r.greedy = !(t > 0.0f);
  r.inv_t = r.greedy ? 1.0f : __fdiv_rn(1.0f, t);
  float mp = p.min_p ? p.min_p[i] : 0.0f;
  if (mp > 1.0f) mp = 1.0f;  // unvalidated min_p > 1: 1 (never an empty kept set)
  r.mp_on = (mp > 0.0f) && !r.greedy;
  r.L = soft_ln(r.mp_on ? mp : 1.0f);
  return r;
}
// The sampler's kept set: greedy -> the max key; else min-p on y and key56(z, id) >= thr (top-k
// / top-p, keys of the raw logit z).
__device__ __forceinline__ bool kept_at(const RowParams& rp, int64_t id, int32_t arg, float z,
                                        float y, int64_t thr) {
  if (rp.greedy) return id == int64_t(arg);
  if (rp.mp_on && !(y >= rp.L)) return false;
  return thr == 0 || int64_t(key56(key32(z), uint32_t(id))) >= thr;
}

// Draft count of request i, or -1 when it is outside [0, max_n]: a wrong bound that reached the
// kernels unvalidated (validate=False, CUDA-graph capture). Such a request is invalid (token 0
// in slot 0, -1 after it, 0 accepted, valid false, NaN logprob) and no verify kernel reads its
// rows, so nothing is read or written outside the tensors whatever the counts say (the Triton
// kernels and the reference do the same).
__device__ __forceinline__ int req_drafts(const VerifyParams& p, int i) {
  const int64_t c0 = p.cu[i], n = p.cu[i + 1] - c0;
  if (n < 0 || n > int64_t(p.max_n)) return -1;
  // ragged: a range outside the draft ids (unvalidated cu) would read past the tensors
  if (!(p.flags & kPadded) && (c0 < 0 || c0 + n > p.nids)) return -1;
  return int(n);
}

// Request of a target row and its position (ragged: binary search over cu[i] + i).
__device__ __forceinline__ void locate_target_row(const VerifyParams& p, int64_t row, int& i,
                                                  int& j) {
  if (p.flags & kPadded) {
    const int64_t W = p.max_n + 1;
    i = int(row / W);
    j = int(row - int64_t(i) * W);
    return;
  }
  int lo = 0, hi = p.bs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.cu[mid] + mid <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  i = lo;
  j = int(row - (p.cu[lo] + lo));
}
// Request of a draft row (slot) and its position (ragged: cu[i] <= d < cu[i + 1]).
__device__ __forceinline__ void locate_draft_row(const VerifyParams& p, int64_t d, int& i, int& j) {
  if (p.flags & kPadded) {
    const int64_t W = p.max_n > 0 ? p.max_n : 1;
    i = int(d / W);
    j = int(d - int64_t(i) * W);
    return;
  }
  int lo = 0, hi = p.bs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.cu[mid] <= d)
      lo = mid;
    else
      hi = mid - 1;
  }
  i = lo;
  j = int(d - p.cu[lo]);
}
__device__ __forceinline__ int64_t target_row(const VerifyParams& p, int i, int j) {
  return (p.flags & kPadded) ? int64_t(i) * (p.max_n + 1) + j : p.cu[i] + i + j;
}
__device__ __forceinline__ int64_t draft_slot(const VerifyParams& p, int i, int j) {
  return (p.flags & kPadded) ? int64_t(i) * p.max_n + j : p.cu[i] + j;
}

__device__ __forceinline__ void store_tok(const VerifyParams& p, int64_t idx, int64_t v) {
  if (p.out64)
    static_cast<int64_t*>(p.tokens)[idx] = v;
  else
    static_cast<int32_t*>(p.tokens)[idx] = int32_t(v);
}
__device__ __forceinline__ void store_count(const VerifyParams& p, int i, int64_t v) {
  if (p.out64)
    static_cast<int64_t*>(p.num_accepted)[i] = v;
  else
    static_cast<int32_t*>(p.num_accepted)[i] = int32_t(v);
}

// Block reductions (kThreads threads); the result is valid in every thread.
struct BlockScratch {
  float f[kThreads / 32];
  int32_t i[kThreads / 32];
  long long l[kThreads / 32];
};
__device__ __forceinline__ MaxArg block_max_arg(MaxArg a, BlockScratch& s) {
  a = warp_max_arg(a);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) {
    s.f[w] = a.v;
    s.i[w] = a.id;
  }
  __syncthreads();
  MaxArg r{s.f[0], s.i[0]};
#pragma unroll
  for (int k = 1; k < kThreads / 32; ++k) r = max_arg(r, MaxArg{s.f[k], s.i[k]});
  return r;
}
__device__ __forceinline__ Cand block_best(Cand a, BlockScratch& s) {
  a = warp_best(a);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) {
    s.f[w] = a.s;
    s.i[w] = a.id;
  }
  __syncthreads();
  Cand r{s.f[0], s.i[0]};
#pragma unroll
  for (int k = 1; k < kThreads / 32; ++k) r = best_of(r, Cand{s.f[k], s.i[k]});
  return r;
}
__device__ __forceinline__ void block_sum2(long long& a, float& b, BlockScratch& s) {
  a = warp_sum_i64(a);
  b = warp_sum_f(b);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) {
    s.l[w] = a;
    s.f[w] = b;
  }
  __syncthreads();
  a = 0;
  b = 0.0f;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) {
    a += s.l[k];
    b += s.f[k];
  }
}
__device__ __forceinline__ bool block_any(bool a, BlockScratch& s) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  const bool wa = __any_sync(0xffffffffu, a);
  __syncthreads();
  if (l == 0) s.i[w] = wa;
  __syncthreads();
  bool r = false;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) r |= s.i[k] != 0;
  return r;
}

// What each CTA publishes to its cluster
struct Slot1 {
  float zmax[2];
  int32_t arg[2];
  int32_t nan[2];
};
struct Slot2 {
  long long S[2];
  float se[2];
};

}  // namespace tokenspeed_kernel::verify
