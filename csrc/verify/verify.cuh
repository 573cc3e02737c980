// Speculative-decoding verify kernels (torch-free). Spec: python/tokenspeed_kernel/reference/verify.py,
// contract: docs/VERIFY.md. Every float op that decides a token is an explicit round-to-nearest
// intrinsic (softmath.cuh); masses, normalizers and the accept / residual tests are exact integers.
// Processed logits are relative to the raw row max (docs/DESIGN.md, randomness contract):
// y = fl(fl(z - zmax) * invT), 0 at the max (ycen below); keys (top-k / top-p order, greedy
// argmax) are of the raw logits z.
//
// Probabilistic / ngram mode (docs/VERIFY.md has the details):
//   1. verify_pos_kernel: cs CTAs (a thread-block cluster when cs > 1) per target row (=
//      position). Rows without min-p / top-k / top-p read the target and draft chunk once: raw
//      max, lowest id, NaN, approximate mass sums with a proven relative error bound
//      (coin_margin); the accept coin is decided from them when the bound leaves no doubt, else
//      marked kUnsure. Filtered rows take an exact two-pass path. Nothing [rows, V] is written.
//   Without logprobs (two-pass order):
//   2. verify_final_kernel, first pass: `splits` CTAs per request walk to the first position
//      without the accept bit; at a rejection whose sums are approximate they score the
//      residual max(0, p - q) with score intervals (the sums' bounds), and the last CTA decides
//      the token when the best lower end beats every other upper end. An undecided coin or
//      token puts the request on a list (rare).
//   3. verify_resolve_kernel / 4. verify_final_kernel, second pass: only the listed requests
//      (exact sums of the deciding rows, exact coins, then the exact final token), on a fixed
//      grid of one wave with each listed request split finely.
//   With logprobs (one-pass order): resolve kernel for every request (exact sums of the deciding
//   position), then the final kernel (mode 0) exactly.
// Strict mode: the foundation sampler samples every target row; verify_strict_kernel compares.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "common/philox.cuh"
#include "common/softmath.cuh"
#include "sampling/sampling.cuh"   // the radix select of the kept-set thresholds (launch_levels)

namespace tokenspeed_kernel::verify {

// kExactCoins (testing): every coin that needs the mass sums is decided by the exact path.
// kExactResidual (testing): every final token the first final pass decides from the approximate
// sums is sent to the exact path instead (after its scan), as an undecided one would be.
// kBisectThresholds (testing): top-k / top-p thresholds by the bisection kernel (the oracle)
// instead of the radix select.
// kListStats (tuning hook only, bench/lab/tools/verify_listed.py): count why requests are listed for the
// exact path in g_verify_list_stats.
// kNoLevelList (testing / A-B): the radix thresholds without the levels' compaction
// (sampling::F_NO_LIST).
// kNoLevelExcl / kLevelExclTest (testing / A-B): sampling::F_NO_EXCL / F_EXCL_TEST.
enum : uint32_t {
  kPadded = 1, kNgram = 2, kLogprobs = 4, kExactCoins = 8, kExactResidual = 16,
  kBisectThresholds = 32, kListStats = 64, kNoLevelList = 128, kNoLevelExcl = 256,
  kLevelExclTest = 512
};
// [0] kUnsure coin at the deciding position, [1] bounds too wide (or a testing flag),
// [2] score intervals that did not decide, [3] positions whose exact sums the resolve kernel (or
// the fused listed kernel) computed (per listed request), [4] positions the pos kernel skipped
// (position-major order). Written only with kListStats.
static __device__ unsigned int g_verify_list_stats[5];
// kUnsure: the approximate sums could not decide the coin (the resolve kernel does, exactly).
// kExactS: S_t / S_q are the exact fixed-point sums (else approximations, see verify_pos_kernel).
enum : uint32_t { kActive = 1, kAccept = 2, kBadT = 4, kBadQ = 8, kUnsure = 16, kExactS = 32 };

constexpr int kThreads = 256;
constexpr int kMaxCluster = 16;   // 8 (portable) where 16 cannot be scheduled
constexpr float kMassCut = -26.5f;      // mass_fixed(y) == 0 for all float32 y < -26.34
constexpr float kGumbelSpan = 19.5f;    // G in [-2.8116, 16.6356]: y < -19.45 never wins
constexpr float kLn2Pow38 = 26.33959286127792f;

// Per target row (position) statistics written by pass kernel, read by the final kernel.
struct PosStats {
  int64_t S_t, S_q;       // fixed-point mass sums of the kept sets (target, draft); exact iff
                          // status & kExactS, else within the coin's error bound
  int64_t e_p, e_q;       // exact masses of the draft token (target, draft)
  int64_t thr_t, thr_q;   // top-k / top-p kept-set thresholds (key56 of z; 0 = none)
  float zmax_t, zmax_q;   // raw row max (float32 logits; y = ycen(z, zmax, invT))
  float lse_t;            // raw log-sum-exp of the target row (logprobs only)
  float lp_x, plp_x;      // logprobs of the position's draft token (logprobs only)
  int32_t arg_t, arg_q;   // lowest id of the raw max (greedy rows)
  uint32_t status;        // kActive | kAccept | kBadT | kBadQ
};

struct VerifyParams {
  const void* tgt;
  const void* drf;
  int64_t stride_t, stride_d;
  int64_t R_t;
  int32_t V;
  int32_t bs, max_n;
  uint32_t flags;
  const int64_t* ids;
  const int64_t* cu;
  const int64_t* seed;
  const int64_t* offset;
  const float* temperature;  // nullable (= 1)
  const float* min_p;        // nullable (= 0)
  const int32_t* top_k;      // nullable (= off)
  const float* top_p;        // nullable (= off)
  int64_t* thr;              // [R_t + R_d] key56 thresholds, or null (no top-k / top-p)
  int64_t R_d;
  PosStats* pos;             // [R_t]
  void* tokens;              // [bs, max_n + 1] int32 / int64
  void* num_accepted;        // [bs]
  bool* valid;               // [bs]
  float* lp;                 // [bs, max_n + 1] or null
  float* plp;
  int32_t out64;
  int32_t chunk;             // pos kernel: vocabulary elements per CTA (multiple of 8)
  int32_t rsplits, rchunk;   // resolve kernel: CTAs per request, elements per CTA
  unsigned long long* cand;  // [bs] final-kernel candidate slots, zeroed by the pos kernel
  unsigned int* count;       // [bs] final-kernel arrival counters, zeroed by the pos kernel
  unsigned long long* racc;  // [2 max(R_t, bs)] resolve-kernel exact sums (S_t, S_q) per target
                             // row, zeroed likewise
  unsigned int* rcount;      // [bs] resolve-kernel arrival counters, zeroed likewise
  int32_t* flist;            // [bs] requests the first final pass sends to the exact path
  unsigned int* fcount;      // their number (zeroed by the pos kernel); flist null: one-pass
                             // order, the resolve kernel runs for every request
  int32_t* stop;             // [bs] or null: the pos kernel's position-major order with skips
                             // (zeroed by the launcher); stop[i] = W - d for the earliest
                             // position d of request i whose coin the pos kernel has decided as
                             // not accepted so far (0 = none yet)
};

// ------------------------------------------------------------------------------------------
// small helpers
// ------------------------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }

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
__device__ __forceinline__ long long warp_sum_i64(long long a) {
#pragma unroll
  for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  return a;
}
__device__ __forceinline__ float warp_sum_f(float a) {
#pragma unroll
  for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
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
__device__ __forceinline__ int64_t mass_at(float y) {
  return (y >= kMassCut) ? mass_fixed(y) : 0;
}
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
  const uint32_t d = (bits >> 9) ^ 0x7FFFFFu;   // = 2^23 - 1 - (bits >> 9)
  const float fd = __fsub_rn(__uint_as_float(d | 0x4B000000u), 8388608.0f);   // float(d)
  const uint32_t e = __float_as_uint(fd) >> 23;
  const float fe = __fsub_rn(__uint_as_float(e | 0x4B000000u), 8388608.0f);   // float(e)
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
  const float mp = p.min_p ? p.min_p[i] : 0.0f;
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
    if (p.cu[mid] + mid <= row) lo = mid; else hi = mid - 1;
  }
  i = lo;
  j = int(row - (p.cu[lo] + lo));
}
// Request of a draft row (slot) and its position (ragged: cu[i] <= d < cu[i + 1]).
__device__ __forceinline__ void locate_draft_row(const VerifyParams& p, int64_t d, int& i,
                                                 int& j) {
  if (p.flags & kPadded) {
    const int64_t W = p.max_n > 0 ? p.max_n : 1;
    i = int(d / W);
    j = int(d - int64_t(i) * W);
    return;
  }
  int lo = 0, hi = p.bs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.cu[mid] <= d) lo = mid; else hi = mid - 1;
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
  if (p.out64) static_cast<int64_t*>(p.tokens)[idx] = v;
  else static_cast<int32_t*>(p.tokens)[idx] = int32_t(v);
}
__device__ __forceinline__ void store_count(const VerifyParams& p, int i, int64_t v) {
  if (p.out64) static_cast<int64_t*>(p.num_accepted)[i] = v;
  else static_cast<int32_t*>(p.num_accepted)[i] = int32_t(v);
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
  if (l == 0) { s.f[w] = a.v; s.i[w] = a.id; }
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
  if (l == 0) { s.f[w] = a.s; s.i[w] = a.id; }
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
  if (l == 0) { s.l[w] = a; s.f[w] = b; }
  __syncthreads();
  a = 0;
  b = 0.0f;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) { a += s.l[k]; b += s.f[k]; }
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
  float s;   // processed: c = inv_t * log2(e)
  float sr;  // raw (logprobs): c = log2(e)
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
      for (int k = 0; k + w < K; k += 2 * w) t[k] = fmaxf(t[k], t[k + w]);   // NaN-ignoring
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
        if (v[u][k] == vm) id = idx + u * step + k;   // lowest id of the new max
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
  if (l == 0) { s.f[w] = a; s.l[w] = __float_as_int(b); }
  __syncthreads();
  a = 0.0f;
  b = 0.0f;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) { a += s.f[k]; b += __int_as_float(int(s.l[k])); }
}

// Vectors of each row in flight per thread on the pos kernel's fast path (online_chunk's U):
// fp32 4 (64 / 80 registers without / with clusters: 4 / 3 CTAs/SM); 16-bit types 2 (64
// registers, 4 CTAs/SM, pos_min_blocks; with 4 vectors they needed 120 registers, 2 CTAs/SM,
// measured slower at most shapes). coin_margin counts the online blocks from it.
template <typename T>
constexpr int pos_pu() { return sizeof(T) == 4 ? 4 : 2; }

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
  const double nt = double(chunk) / kThreads + 16.0;        // elements per thread, at most
  const double nb = nt / double(PU * VEC) + double(PU + VEC); // online blocks (rescales), at most
  const double d = 1.1920928955078125e-07 + 54.5 * u + 107.0 * u + (FF ? 360.0 * u : 0.0) +
                   (nb + 3.0) * 9.5367431640625e-07 + (2.0 * nb + 24.0) * u +
                   double(V) * 1e-11;
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
  return coin_from_bits(philox_word(uint64_t(p.seed[i]), uint64_t(p.offset[i]), uint32_t(j),
                                    kStreamAccept));
}

// ------------------------------------------------------------------------------------------
// kernel 1: per-position statistics and accept coins
// ------------------------------------------------------------------------------------------
// Rows without min-p / top-k / top-p (and greedy rows) take the fast path: one pass over the
// target and draft chunk (raw max, lowest id of the max, NaN, approximate sums with
// ex2.approx), then the coin is decided from the approximate sums when the error bound
// (coin_margin) leaves no doubt; otherwise it is marked kUnsure and verify_resolve_kernel decides
// it with the exact sums. Either way the decision is the exact one. Rows with filters take the
// exact path (two passes: max, then the exact fixed-point sums). PU: vectors of each row (target
// and draft) in flight per thread on the fast path; the launcher picks it per dtype.
// Resident CTAs per SM the register allocation is held to (measured, H200, see VERIFY.md):
// 16-bit logits 4 (64 registers); fp32 the occupancy ptxas gave it before these bounds existed
// (4 without clusters, 3 with; 64 / 80 registers, 74 then). An explicit minimum of 1 let ptxas
// take 87 / 91 registers for fp32 (2 CTAs/SM).
template <typename T, bool CLUSTER>
constexpr int pos_min_blocks() { return sizeof(T) == 2 ? 4 : (CLUSTER ? 3 : 4); }
template <typename T, int VEC, bool CLUSTER, int PU>
__global__ void __launch_bounds__(kThreads, (pos_min_blocks<T, CLUSTER>()))
    verify_pos_kernel(const VerifyParams p) {
  using G = Grp<CLUSTER>;
  __shared__ BlockScratch scratch;
  __shared__ Slot1 slot1;
  __shared__ Slot2 slot2;
  __shared__ SlotOn slot_on;
  __shared__ int sh_skip;
  const unsigned cs = G::size();
  const unsigned rank = G::rank();
  // the block's index in launch order (the row itself unless position-major, below)
  const int64_t vrow = int64_t(blockIdx.x / cs);
  // zero the final kernel's candidate slots / arrival counters (the final kernel runs after
  // this one on the same stream): replaces two memsets. Rows >= R_t exist only if R_t < bs.
  if (rank == 0 && threadIdx.x == 0 && vrow < p.bs && p.cand != nullptr) {
    p.cand[vrow] = 0ull;
    p.count[vrow] = 0u;
    p.rcount[vrow] = 0u;
  }
  // per target row (the position-major grid may have more blocks than racc has rows)
  if (rank == 0 && threadIdx.x == 0 && p.racc != nullptr &&
      vrow < (p.R_t > p.bs ? p.R_t : int64_t(p.bs))) {
    p.racc[2 * vrow] = 0ull;
    p.racc[2 * vrow + 1] = 0ull;
  }
  if (vrow == 0 && rank == 0 && threadIdx.x == 0 && p.fcount != nullptr) *p.fcount = 0u;
  int64_t row;
  int i, j, n;
  if (p.stop != nullptr) {
    // Position-major (a grid of bs * W rows of cs CTAs, more than one wave): row block b is
    // position j = b / bs of request i = b % bs, so the blocks of later positions start after
    // earlier positions' blocks have finished. A position after one whose coin this kernel
    // already decided as not accepted (rejected or bad: the walk stops there) is never read by
    // anyone: skip it, reading none of its logits. The decision is uniform over the cluster
    // (one read of stop[i], by rank 0's thread 0); a position is skipped only after a
    // rejection at an earlier position, so every position up to the first one without the
    // accept bit that is not kUnsure is computed, which is all that the walks (first_failed,
    // the resolve and final kernels, logprobs) read. Which positions are skipped depends on
    // timing; the tokens do not.
    const int64_t W = int64_t(p.max_n) + 1;
    j = int(vrow / p.bs);   // < W: the grid is bs * W rows
    i = int(vrow - int64_t(j) * p.bs);
    n = int(p.cu[i + 1] - p.cu[i]);
    if (j > n) {  // padded layout: padding row; ragged: no such row (uniform over the cluster)
      if (rank == 0 && threadIdx.x == 0 && (p.flags & kPadded))
        p.pos[target_row(p, i, j)].status = 0;
      return;
    }
    row = target_row(p, i, j);
    if constexpr (CLUSTER) G::sync();   // every peer has started: its shared memory exists
    if (rank == 0 && threadIdx.x == 0) {
      const int s = *reinterpret_cast<volatile int*>(&p.stop[i]);
      const int k = s > 0 && int64_t(j) > W - s;
      if (k) {
        p.pos[row].status = 0;   // never read; not left stale either
        if (p.flags & kListStats) atomicAdd(&g_verify_list_stats[4], 1u);
      }
      for (unsigned q = 0; q < cs; ++q) *G::map(&sh_skip, q) = k;
    }
    G::sync();   // the decision is visible to every thread of every CTA of the cluster
    if (sh_skip) return;
  } else {
    row = vrow;
    if (row >= p.R_t) return;  // uniform over the cluster
    locate_target_row(p, row, i, j);
    n = int(p.cu[i + 1] - p.cu[i]);
    if (j > n) {  // padding row of the padded layout (uniform over the cluster)
      if (rank == 0 && threadIdx.x == 0) p.pos[row].status = 0;
      return;
    }
  }
  const bool has_d = !(p.flags & kNgram) && j < n;
  const int64_t ds = draft_slot(p, i, j);
  const T* trow = static_cast<const T*>(p.tgt) + row * p.stride_t;
  const T* drow = has_d ? static_cast<const T*>(p.drf) + ds * p.stride_d : trow;
  const RowParams rp = row_params(p, i);
  const bool logprobs = p.flags & kLogprobs;
  const int64_t thr_t = p.thr ? p.thr[row] : 0;
  const int64_t thr_q = (p.thr && has_d) ? p.thr[p.R_t + ds] : 0;
  const int64_t start = int64_t(rank) * p.chunk;
  const int64_t end = start + p.chunk < p.V ? start + p.chunk : int64_t(p.V);
  // fast path: every element is kept (no min-p / top-k / top-p) or greedy (S = 2^38); the
  // online sums need a finite c = invT log2(e) and invT >= 2^-120 (coin_margin; T in
  // [~4.2e-39, ~1.3e36], else the exact path)
  const float c = rp.inv_t * kLog2e;
  const bool fast = rp.greedy || (!rp.mp_on && thr_t == 0 && thr_q == 0 && c < INFINITY &&
                                  rp.inv_t >= 0x1p-120f);
  // The coin's inputs (draft token, its logits, the accept word) are loaded by the thread that
  // decides the coin: the id now, the rest right after its loop, so that these dependent loads
  // overlap the reductions instead of following them.
  const bool coin_thread = rank == 0 && threadIdx.x == 0 && j < n;
  const int64_t xd = coin_thread ? p.ids[ds] : -1;
  const bool x_in = xd >= 0 && xd < p.V;
  float zt_x = 0.0f, zq_x = 0.0f;
  uint32_t coin_bits = 0;
  auto load_coin = [&]() {
    if (!coin_thread) return;
    if (x_in) {
      zt_x = to_f<T>(trow[xd]);
      if (has_d) zq_x = to_f<T>(drow[xd]);
    }
    coin_bits = philox_word(uint64_t(p.seed[i]), uint64_t(p.offset[i]), uint32_t(j), kStreamAccept);
  };

  MaxArg g[2] = {{-INFINITY, INT32_MAX}, {-INFINITY, INT32_MAX}};
  bool gnan[2] = {false, false};
  bool bad[2];
  long long S[2] = {0, 0};          // exact path
  double St_a = 0.0, Sq_a = 0.0;    // fast path: approximate S (units of 1, i.e. S / 2^38)
  float set = 0.0f;                 // raw sum-exp relative to the raw max (logprobs)
  if (fast) {
    Online o[2];
    online_init(o[0]);
    online_init(o[1]);
    if (has_d) {
      if (logprobs) online_chunk<T, VEC, true, true, PU>(trow, drow, start, end, c, o[0], o[1]);
      else online_chunk<T, VEC, false, true, PU>(trow, drow, start, end, c, o[0], o[1]);
    } else {
      if (logprobs) online_chunk<T, VEC, true, false, PU>(trow, trow, start, end, c, o[0], o[1]);
      else online_chunk<T, VEC, false, false, PU>(trow, trow, start, end, c, o[0], o[1]);
    }
    load_coin();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && !has_d) break;
      const MaxArg b = block_max_arg(MaxArg{o[r].mx, o[r].arg}, scratch);
      float s = online_rescale(o[r].s, o[r].mx, b.v, c);
      float sr = r == 0 && logprobs ? online_rescale(o[r].sr, o[r].mx, b.v, kLog2e) : 0.0f;
      block_sum_f2(s, sr, scratch);
      if (threadIdx.x == 0) {
        slot_on.mx[r] = b.v;
        slot_on.arg[r] = b.id;
        slot_on.s[r] = s;
        if (r == 0) slot_on.sr = sr;
      }
    }
    G::sync();
    if (rank == 0 && threadIdx.x < 32) {
      // warp 0 combines the cluster's partials, lane q reading CTA q's slot (in parallel)
      const unsigned q = threadIdx.x;
      SlotOn mine;
      if (q < cs) {
        const SlotOn* sl = G::map(&slot_on, q);
        mine = *sl;
      } else {
        mine.mx[0] = mine.mx[1] = -INFINITY;
        mine.arg[0] = mine.arg[1] = INT32_MAX;
        mine.s[0] = mine.s[1] = mine.sr = 0.0f;
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (r == 1 && !has_d) break;
        g[r] = warp_max_arg(MaxArg{mine.mx[r], mine.arg[r]});
        double acc = q < cs ? double(online_rescale(mine.s[r], mine.mx[r], g[r].v, c)) : 0.0;
        double accr = (r == 0 && logprobs && q < cs)
                          ? double(online_rescale(mine.sr, mine.mx[r], g[r].v, kLog2e)) : 0.0;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
          acc += __shfl_xor_sync(0xffffffffu, acc, o);
          accr += __shfl_xor_sync(0xffffffffu, accr, o);
        }
        gnan[r] = acc != acc;   // NaN in the row (or +inf: then zmax is +inf, a bad row too)
        if (r == 0) { St_a = acc; set = float(accr); }
        else Sq_a = acc;
      }
    }
  } else {
    // ---- exact path, pass 1: raw max, lowest id of the max, NaN ----
    MaxArg a[2] = {{-INFINITY, INT32_MAX}, {-INFINITY, INT32_MAX}};
    bool nan[2] = {false, false};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && !has_d) break;
      MaxArg acc{-INFINITY, INT32_MAX};
      bool isnan_ = false;
      for_chunk<T, VEC>(r ? drow : trow, start, end, [&](int64_t id, float z) {
        if (z != z) isnan_ = true;
        else if (z > acc.v) { acc.v = z; acc.id = int32_t(id); }
      });
      a[r] = block_max_arg(acc, scratch);
      nan[r] = block_any(isnan_, scratch);
    }
    if (threadIdx.x == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) { slot1.zmax[r] = a[r].v; slot1.arg[r] = a[r].id; slot1.nan[r] = nan[r]; }
    }
    G::sync();
    for (unsigned q = 0; q < cs; ++q) {
      const Slot1* s = G::map(&slot1, q);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        g[r] = max_arg(g[r], MaxArg{s->zmax[r], s->arg[r]});
        gnan[r] = gnan[r] || s->nan[r];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) bad[r] = gnan[r] || g[r].v == INFINITY || g[r].v == -INFINITY;
    // ---- exact path, pass 2 (L2): fixed-point mass of the kept set, raw sum-exp ----
    float se[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && !has_d) break;
      if (bad[r]) continue;
      long long s_acc = 0;
      float e_acc = 0.0f;
      const float zm = g[r].v;
      const int32_t arg = g[r].id;
      const int64_t th = r ? thr_q : thr_t;
      for_chunk<T, VEC>(r ? drow : trow, start, end, [&](int64_t id, float z) {
        const float y = ycen(z, zm, rp.inv_t);
        if (y >= kMassCut && kept_at(rp, id, arg, z, y, th)) s_acc += mass_fixed(y);
        if (logprobs) e_acc += __expf(z - zm);
      });
      block_sum2(s_acc, e_acc, scratch);
      S[r] = s_acc;
      se[r] = e_acc;
    }
    load_coin();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) { slot2.S[r] = S[r]; slot2.se[r] = se[r]; }
    }
    G::sync();
    if (rank == 0 && threadIdx.x == 0) {
      S[0] = S[1] = 0;
      for (unsigned q = 0; q < cs; ++q) {
        const Slot2* s = G::map(&slot2, q);
        S[0] += s->S[0];
        S[1] += s->S[1];
        set += s->se[0];
      }
    }
  }
  // every peer's shared memory has been read: only rank 0's thread 0 goes on
  G::sync();
  if (rank == 0 && threadIdx.x == 0) {
    // invalid: a NaN or +inf logit, or no finite one (the reference's rule, on the raw logits)
#pragma unroll
    for (int r = 0; r < 2; ++r) bad[r] = gnan[r] || g[r].v == INFINITY || g[r].v == -INFINITY;
    const bool exactS = !fast || rp.greedy;
    int64_t St, Sq;
    if (rp.greedy) {
      St = Sq = 1ll << kMassFracBits;
    } else if (fast) {
      St = (long long)(St_a * 274877906944.0);
      Sq = (long long)(Sq_a * 274877906944.0);
    } else {
      St = S[0];
      Sq = S[1];
    }
    if (p.flags & kNgram) Sq = 1;
    PosStats st;
    st.S_t = St;
    st.S_q = Sq;
    st.e_p = 0;
    st.e_q = 0;
    st.thr_t = thr_t;
    st.thr_q = thr_q;
    st.zmax_t = g[0].v;
    st.zmax_q = g[1].v;
    st.arg_t = g[0].id;
    st.arg_q = g[1].id;
    st.lse_t = g[0].v + logf(set);
    st.lp_x = 0.0f;
    st.plp_x = 0.0f;
    uint32_t status = kActive | (bad[0] ? kBadT : 0u) | (has_d && bad[1] ? kBadQ : 0u) |
                      (exactS ? kExactS : 0u);
    if (j < n && !bad[0] && !(has_d && bad[1])) {
      const int64_t x = xd;
      int64_t ep = 0, eq = (p.flags & kNgram) ? 1 : 0;
      if (x_in) {
        const float zt = zt_x;
        const float yt = ycen(zt, g[0].v, rp.inv_t);
        if (yt >= kMassCut && kept_at(rp, x, g[0].id, zt, yt, thr_t)) ep = mass_fixed(yt);
        if (has_d) {
          const float zq = zq_x;
          const float yq = ycen(zq, g[1].v, rp.inv_t);
          if (yq >= kMassCut && kept_at(rp, x, g[1].id, zq, yq, thr_q)) eq = mass_fixed(yq);
        }
        if (logprobs) {
          st.lp_x = zt - st.lse_t;
          st.plp_x = rp.greedy ? 0.0f : yt - (logf(float(St)) - kLn2Pow38);
        }
      } else {
        eq = 0;  // never accepted (ep = 0)
      }
      st.e_p = ep;
      st.e_q = eq;
      const uint64_t U = coin_from_bits(coin_bits);   // coin_U(p, i, j)
      if (ep == 0) {
        // p(x) = 0: never accepted (exact without the sums)
      } else if (eq == 0) {
        status |= kAccept;  // q(x) = 0 < p(x): always accepted
      } else if (exactS) {
        if (coin_exact(U, ep, eq, St, Sq)) status |= kAccept;
      } else if (p.flags & kExactCoins) {
        status |= kUnsure;
      } else {
        // S_t in [St_a / (1 + dt), St_a / (1 - dt)] * 2^38, same for S_q (ngram: S_q = 1 exactly)
        const bool ng = p.flags & kNgram;
        const double dt = coin_margin<T, VEC>(p.chunk, p.V);
        const double dq = ng ? 0.0 : coin_margin<T, VEC>(p.chunk, p.V);
        const double sq = ng ? 1.0 / 274877906944.0 : Sq_a;
        const double L = double(U) * double(eq) * St_a;
        const double R = 16777216.0 * double(ep) * sq;
        const double slack = 1e-12;   // double rounding of the products
        if (dt < 0.5 && dq < 0.5 &&
            L / (1.0 - dt) * (1.0 + slack) < R / (1.0 + dq) * (1.0 - slack)) {
          status |= kAccept;
        } else if (dt < 0.5 && dq < 0.5 &&
                   L / (1.0 + dt) * (1.0 - slack) > R / (1.0 - dq) * (1.0 + slack)) {
          // rejected
        } else {
          status |= kUnsure;
        }
      }
    }
    st.status = status;
    p.pos[row] = st;
    // position-major: a coin decided as not accepted (or a bad row) ends the request's walk
    // here; later positions' blocks that have not started yet skip their rows
    if (p.stop != nullptr && j < n && !(status & (kAccept | kUnsure)))
      atomicMax(&p.stop[i], p.max_n + 1 - j);
  }
}

// ------------------------------------------------------------------------------------------
// kernel 1b: exact sums where they decide something
// ------------------------------------------------------------------------------------------
// First position of request i at or after j0 whose accept bit is missing (n: none). Warp-wide
// (every lane of the calling warp gets the answer): one status load per lane, then a ballot.
__device__ __forceinline__ int first_failed(const VerifyParams& p, int i, int j0, int n) {
  const int lane = int(threadIdx.x & 31u);
  for (int base = j0; base < n; base += 32) {
    const int j = base + lane;
    const bool fail = j < n && !(p.pos[target_row(p, i, j)].status & kAccept);
    const unsigned bal = __ballot_sync(0xffffffffu, fail);
    if (bal) return base + __ffs(int(bal)) - 1;
  }
  return n;
}

// Exact fixed-point mass sums of [start, end) of a fast row (every element kept; za / zb the
// rows' raw maxima): y < -64 (and -inf) gives 0 inside soft_exp_neg, and mass_fixed(y) = 0 for
// every y < -26.34, so no cut is needed. TWO: the target and the draft row of the same position
// in one loop (twice the loads in flight).
template <typename T, int VEC, bool TWO>
__device__ __forceinline__ void chunk_masses(const T* a, const T* b, int64_t start, int64_t end,
                                             float inv_t, float za, float zb, long long& sa,
                                             long long& sb) {
  constexpr int U = VEC >= 8 ? 2 : 4;   // 16 elements per row and iteration
  const int64_t step = int64_t(kThreads) * VEC;
  int64_t idx = start + int64_t(threadIdx.x) * VEC;
  for (; idx + (U - 1) * step + VEC <= end; idx += U * step) {
    float va[U][VEC], vb[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load_vec<T, VEC>(a + idx + u * step, va[u]);
      if (TWO) load_vec<T, VEC>(b + idx + u * step, vb[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        sa += mass_fixed(ycen(va[u][k], za, inv_t));
        if (TWO) sb += mass_fixed(ycen(vb[u][k], zb, inv_t));
      }
  }
  for (; idx < end; idx += step) {
#pragma unroll 1
    for (int k = 0; k < VEC && idx + k < end; ++k) {
      sa += mass_fixed(ycen(to_f<T>(a[idx + k]), za, inv_t));
      if (TWO) sb += mass_fixed(ycen(to_f<T>(b[idx + k]), zb, inv_t));
    }
  }
}
__device__ __forceinline__ void block_sum_i64x2(long long& a, long long& b, BlockScratch& s) {
  a = warp_sum_i64(a);
  b = warp_sum_i64(b);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) s.l[w] = a;
  __syncthreads();
  long long r = 0;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) r += s.l[k];
  __syncthreads();
  if (l == 0) s.l[w] = b;
  __syncthreads();
  b = 0;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) b += s.l[k];
  a = r;
}
// Block-wide exact sums of [start, end) of a fast position's target (and draft) row.
template <typename T, int VEC>
__device__ __forceinline__ void block_masses(const VerifyParams& p, const RowParams& rp,
                                             const PosStats& ps, const T* trow, const T* drow,
                                             bool ngram, int64_t start, int64_t end,
                                             long long& St, long long& Sq, BlockScratch& scratch) {
  St = 0;
  Sq = 0;
  if (ngram)
    chunk_masses<T, VEC, false>(trow, trow, start, end, rp.inv_t, ps.zmax_t, ps.zmax_q, St, Sq);
  else
    chunk_masses<T, VEC, true>(trow, drow, start, end, rp.inv_t, ps.zmax_t, ps.zmax_q, St, Sq);
  block_sum_i64x2(St, Sq, scratch);
}

// The first position >= j0 of request i without the accept bit, block-uniform: warp 0 asks
// (first_failed), every thread reads the answer from sh_f. The leading barrier lets callers
// reuse sh_f and their scratch across calls.
__device__ __forceinline__ int block_first_failed(const VerifyParams& p, int i, int j0, int n,
                                                  int& sh_f) {
  __syncthreads();
  if (threadIdx.x < 32) {
    const int g = first_failed(p, i, j0, n);
    if (threadIdx.x == 0) sh_f = g;
  }
  __syncthreads();
  return sh_f;
}
// This CTA's exact fixed-point sums over [start, end) of the target and draft rows of request
// i's position f (target row `row`); the block's totals in thread 0. `counted`: the CTA that
// counts the position in the list statistics (kListStats).
template <typename T, int VEC>
__device__ __forceinline__ void position_masses(const VerifyParams& p, const RowParams& rp,
                                                const PosStats& ps, int i, int f, int64_t row,
                                                int64_t start, int64_t end, bool counted,
                                                long long& St, long long& Sq,
                                                BlockScratch& scratch) {
  const bool ngram = p.flags & kNgram;
  const T* trow = static_cast<const T*>(p.tgt) + row * p.stride_t;
  const T* drow = ngram ? trow : static_cast<const T*>(p.drf) + draft_slot(p, i, f) * p.stride_d;
  St = 0;
  Sq = 0;
  if (start < end) block_masses<T, VEC>(p, rp, ps, trow, drow, ngram, start, end, St, Sq, scratch);
  if ((p.flags & kListStats) && counted && threadIdx.x == 0)
    atomicAdd(&g_verify_list_stats[3], 1u);
}

// p.rsplits CTAs per request, each a contiguous vocabulary chunk (no clusters: the partial sums
// meet in global 64-bit atomics, exact and order-free). Every CTA finds the positions whose exact
// sums the walk may need: the first position f without the accept bit and, while that position's
// coin is undecided (kUnsure: it may be accepted), the next position without the accept bit, and
// so on (positions that are bad or already exact stop the list; they need no sums). For each it
// adds its chunk's exact fixed-point sums of the target and draft rows into p.racc (per target
// row). The last CTA to arrive walks exactly: at each position it stores the exact S_t / S_q
// (the final kernel's residual needs them) and, if the coin was kUnsure, decides it exactly; an
// accept moves the walk on to sums that are already complete. (Before, an accepted kUnsure coin
// left the next position to the last CTA alone, whole rows at a time: 125 us at bs 256, n 5,
// fp32 on an H200.)
template <typename T, int VEC>
__device__ __forceinline__ void resolve_one(const VerifyParams& p, const int i, const int sp) {
  __shared__ BlockScratch scratch;
  __shared__ int sh_f;
  __shared__ int sh_last;
  __shared__ long long sh_S[2];
  const int n = int(p.cu[i + 1] - p.cu[i]);
  const bool ngram = p.flags & kNgram;
  const RowParams rp = row_params(p, i);
  const int64_t start = int64_t(sp) * p.rchunk;
  const int64_t end = start + p.rchunk < p.V ? start + p.rchunk : int64_t(p.V);
  bool any = false;   // uniform over the request's CTAs (same statuses, same walk)
  for (int f = block_first_failed(p, i, 0, n, sh_f); f < n;
       f = block_first_failed(p, i, f + 1, n, sh_f)) {
    const int64_t row = target_row(p, i, f);
    const PosStats ps = p.pos[row];
    if (ps.status & (kBadT | kBadQ | kExactS)) break;  // nothing to compute
    long long St, Sq;
    position_masses<T, VEC>(p, rp, ps, i, f, row, start, end, sp == 0, St, Sq, scratch);
    if (threadIdx.x == 0) {
      if (St) atomicAdd(&p.racc[2 * row], (unsigned long long)St);
      if (Sq) atomicAdd(&p.racc[2 * row + 1], (unsigned long long)Sq);
    }
    any = true;
    if (!(ps.status & kUnsure)) break;   // a decided rejection: the walk stops here
  }
  if (!any) return;   // bonus, bad or exact deciding position: no sums (uniform)
  if (threadIdx.x == 0) {
    __threadfence();
    sh_last = atomicAdd(&p.rcount[i], 1u) == unsigned(p.rsplits) - 1u;
  }
  __syncthreads();
  if (!sh_last) return;
  if (threadIdx.x == 0) __threadfence();
  for (int f = block_first_failed(p, i, 0, n, sh_f); f < n;
       f = block_first_failed(p, i, f + 1, n, sh_f)) {
    const int64_t row = target_row(p, i, f);
    const PosStats ps = p.pos[row];
    if (ps.status & (kBadT | kBadQ | kExactS)) return;
    if (threadIdx.x == 0) {
      sh_S[0] = (long long)atomicAdd(&p.racc[2 * row], 0ull);     // atomic reads of the totals
      sh_S[1] = (long long)atomicAdd(&p.racc[2 * row + 1], 0ull);
    }
    __syncthreads();
    const long long St = sh_S[0];
    const long long Sq = ngram ? 1 : sh_S[1];
    const bool acc = (ps.status & kUnsure) && coin_exact(coin_U(p, i, f), ps.e_p, ps.e_q, St, Sq);
    if (threadIdx.x == 0) {
      p.pos[row].S_t = St;
      p.pos[row].S_q = Sq;
      p.pos[row].status = (ps.status & ~kUnsure) | kExactS | (acc ? kAccept : 0u);
    }
    if (!acc) return;
  }
}

// One item (request i, split sp) per CTA; after a first final pass (p.flist set), the CTAs of a
// fixed grid stride over (listed request, split) items -- few requests, each split finely.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads, 3) verify_resolve_kernel(const VerifyParams p) {
  const unsigned S = unsigned(p.rsplits);
  const unsigned items =
      p.flist ? *reinterpret_cast<const volatile unsigned*>(p.fcount) * S : gridDim.x;
  for (unsigned it = blockIdx.x; it < items; it += gridDim.x) {
    resolve_one<T, VEC>(p, p.flist ? p.flist[it / S] : int(it / S), int(it % S));
    __syncthreads();   // shared memory reuse by the next item
  }
}

// ------------------------------------------------------------------------------------------
// kernel 0 (only with top-k / top-p): kept-set threshold of every target and draft row
// ------------------------------------------------------------------------------------------
// kept = {key56(z, id) >= thr}: top-k, then top-p on the top-k fixed-point mass
// (reference.sampling.kept_mask). Rows are numbered target rows [0, R_t), then draft rows;
// a row is active if the walk can reach its position (target j <= n_i, draft j < n_i).
template <typename T>
__device__ __forceinline__ const T* thr_row(const VerifyParams& p, int64_t r, int& i,
                                            bool& active) {
  int j;
  if (r < p.R_t) {
    locate_target_row(p, r, i, j);
    active = j <= int(p.cu[i + 1] - p.cu[i]);
    return static_cast<const T*>(p.tgt) + r * p.stride_t;
  }
  const int64_t d = r - p.R_t;
  locate_draft_row(p, d, i, j);
  active = j < int(p.cu[i + 1] - p.cu[i]);
  return static_cast<const T*>(p.drf) + d * p.stride_d;
}
struct ThrParams {
  int32_t k;
  float tp;
  bool k_on, p_on;
};
__device__ __forceinline__ ThrParams thr_params(const VerifyParams& p, int i, const RowParams& rp,
                                                bool active) {
  ThrParams t;
  t.k = (active && p.top_k) ? p.top_k[i] : 0;
  t.tp = (active && p.top_p) ? p.top_p[i] : 1.0f;
  t.k_on = !rp.greedy && t.k > 0 && t.k < p.V;
  t.p_on = !rp.greedy && t.tp < 1.0f;
  return t;
}

// The default: the sampler's radix select (sampling::launch_levels: 12 + 4 x 11 bits of the
// key, by count for top-k, then by fixed-point mass for top-p; each level one pass over the
// filtered rows split over `splits` CTAs per row, the last CTA of a row deciding). This kernel
// is its pass 0: per (split, row) the max key56 of the raw logits z (the levels' keys; its value
// is the row max zmax that their masses mass_fixed(y) are relative to) and the invalid flag (NaN,
// +inf), and row_req[r] = the row's request, or -1 for rows without an active top-k / top-p
// (the levels skip them and write thr 0). Invalid rows (also those without a finite logit:
// max56 of -inf, generic_init) get thr 0 (the walk stops at them anyway).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) verify_thr_max_kernel(const VerifyParams p,
                                                                  const int64_t row0,
                                                                  const int32_t chunk,
                                                                  const int32_t splits,
                                                                  int32_t* row_req,
                                                                  sampling::Partial* part) {
  __shared__ BlockScratch scratch;
  const int64_t r = row0 + blockIdx.y;
  const int split = blockIdx.x;
  int i;
  bool active;
  const T* row = thr_row<T>(p, r, i, active);
  const RowParams rp = row_params(p, i);
  const ThrParams tp = thr_params(p, i, rp, active);
  const bool on = tp.k_on || tp.p_on;
  if (split == 0 && threadIdx.x == 0) row_req[r] = on ? i : -1;
  if (!on) return;   // uniform per row
  const int64_t start = int64_t(split) * chunk;
  const int64_t end = start + chunk < p.V ? start + chunk : int64_t(p.V);
  MaxArg acc{-INFINITY, INT32_MAX};
  bool bad = false;
  if (start < end)
    for_chunk<T, VEC>(row, start, end, [&](int64_t id, float z) {
      if (z != z || z == INFINITY) bad = true;
      else if (z > acc.v) { acc.v = z; acc.id = int32_t(id); }
    });
  const MaxArg a = block_max_arg(acc, scratch);
  const bool inv = block_any(bad, scratch);
  if (threadIdx.x == 0) {
    sampling::Partial o{};
    o.max56 = a.id == INT32_MAX ? 0ull : key56(key32(a.v), uint32_t(a.id));
    o.invalid = inv ? 1u : 0u;
    part[r * splits + split] = o;
  }
}

// Testing oracle (flags & kBisectThresholds): exact bisection over the 56-bit key space, one
// CTA per row: a max pass, 56 counting passes (top-k), 1 + 56 mass passes (top-p) over the row
// (~113 re-reads); rows without an active top-k / top-p exit at once. Tests compare the radix
// path's tokens and logprobs with it.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) verify_threshold_kernel(const VerifyParams p) {
  __shared__ BlockScratch scratch;
  const int64_t r = blockIdx.x;
  int i;
  bool active;
  const T* row = thr_row<T>(p, r, i, active);
  const RowParams rp = row_params(p, i);
  const ThrParams tpar = thr_params(p, i, rp, active);
  const int32_t k = tpar.k;
  const float tp = tpar.tp;
  const bool k_on = tpar.k_on, p_on = tpar.p_on;
  if (!k_on && !p_on) {
    if (threadIdx.x == 0) p.thr[r] = 0;
    return;
  }
  MaxArg acc{-INFINITY, INT32_MAX};
  bool isnan_ = false;
  for_chunk<T, VEC>(row, 0, p.V, [&](int64_t id, float z) {
    if (z != z) isnan_ = true;
    else if (z > acc.v) { acc.v = z; acc.id = int32_t(id); }
  });
  const MaxArg a = block_max_arg(acc, scratch);
  const bool nan = block_any(isnan_, scratch);
  const float zm = a.v;
  if (nan || zm == INFINITY || zm == -INFINITY) {  // invalid row: the walk stops there anyway
    if (threadIdx.x == 0) p.thr[r] = 0;
    return;
  }
  auto key_of = [&](int64_t id, float z) -> int64_t {   // keys of the raw logits
    return int64_t(key56(key32(z), uint32_t(id)));
  };
  int64_t t_k = 0;
  if (k_on) {
    int64_t lo = 0, hi = int64_t(1) << 56;   // count(key >= lo) >= k > count(key >= hi)
    for (int it = 0; it < 56; ++it) {
      const int64_t mid = (lo + hi) >> 1;
      long long c = 0;
      float unused = 0.0f;
      for_chunk<T, VEC>(row, 0, p.V, [&](int64_t id, float z) { c += key_of(id, z) >= mid; });
      block_sum2(c, unused, scratch);
      if (c >= k) lo = mid; else hi = mid;
    }
    t_k = lo;
  }
  int64_t thr = t_k;
  if (p_on) {
    long long sk = 0;
    float unused = 0.0f;
    for_chunk<T, VEC>(row, 0, p.V, [&](int64_t id, float z) {
      if (key_of(id, z) >= t_k) sk += mass_at(ycen(z, zm, rp.inv_t));
    });
    block_sum2(sk, unused, scratch);
    const int64_t lim = top_p_limit(tp, sk);
    int64_t lo = -1, hi = (int64_t(1) << 56) - 1;   // G(lo) >= lim > G(hi)
    for (int it = 0; it < 56; ++it) {
      const int64_t mid = (lo + hi) >> 1;
      long long gsum = 0;
      for_chunk<T, VEC>(row, 0, p.V, [&](int64_t id, float z) {
        const int64_t kk = key_of(id, z);
        if (kk > mid && kk >= t_k) gsum += mass_at(ycen(z, zm, rp.inv_t));
      });
      block_sum2(gsum, unused, scratch);
      if (gsum < lim) hi = mid; else lo = mid;
    }
    thr = t_k > hi ? t_k : hi;
  }
  if (threadIdx.x == 0) p.thr[r] = thr;
}

// ------------------------------------------------------------------------------------------
// kernel 2: walk + final token (residual resample or bonus sample)
// ------------------------------------------------------------------------------------------
// grid = bs * splits CTAs (no cluster): the final token's row is split over `splits` CTAs so a
// small batch still uses the whole GPU (the Gumbel scores are compute-heavy). Each CTA packs its
// best candidate as (key32(score) << 32) | (2^32 - 1 - id) (larger = higher score, then lower
// id) and atomicMax'es it into the request's slot; the last CTA to arrive (counter) writes the
// token and its logprobs. Slots and counters are zeroed by the pos kernel every call (no memset).
__device__ __forceinline__ unsigned long long pack_cand(Cand c) {
  if (!(c.s > -INFINITY)) return 0ull;
  return (static_cast<unsigned long long>(key32(c.s)) << 32) |
         static_cast<unsigned long long>(0xFFFFFFFFu - uint32_t(c.id));
}
__device__ __forceinline__ int64_t unpack_id(unsigned long long k) {
  return int64_t(0xFFFFFFFFu - uint32_t(k & 0xFFFFFFFFull));
}

// The final kernel's scan: vectors per row and iteration (U), and the depth of its load pipeline
// (ST stages of per-thread cp.async copies into shared memory, 0: plain loads; only for 16-byte
// vectors on sm_80+): three stages of 8 KiB for 16-bit logits, two of 16 KiB for fp32.
template <int VEC>
constexpr int final_u() {
#ifdef TS_FINAL_U
  return TS_FINAL_U;
#else
  return VEC >= 8 ? 1 : 2;
#endif
}
#ifndef TS_FINAL_PIPE
#define TS_FINAL_PIPE 1
#endif
template <int VEC>
constexpr int final_stages() {
  if (VEC == 1 || !TS_FINAL_PIPE) return 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return 0;
#endif
#ifdef TS_FINAL_STAGES
  return TS_FINAL_STAGES;   // build knob for A/Bs (static shared memory: <= ~44 KiB of stages)
#endif
  return 2 * final_u<VEC>() * kThreads * 16 <= 8192 ? 3 : 2;
}
template <int VEC>
constexpr int final_pipe_vectors() {
  return final_stages<VEC>() > 0 ? final_stages<VEC>() * 2 * final_u<VEC>() * kThreads : 1;
}

// The final kernel's scan. Per element, base_of(id, z, zq) gives the part of the score's upper
// bound that needs no noise (-inf: the element cannot win); with G <= gumbel_ub(w) <= 16.65 an
// element survives if key32(base + bound on G) >= lb. Per iteration (U vectors of VEC ids):
// (1) the constant bound, tested once on the iteration's largest base: if no element has
// fadd(base, 16.65) >= lb, no Philox block is
// generated (a warp skips them only when none of its lanes needs one: rare with flat logits,
// common with peaked ones); otherwise the blocks of all its groups of 4 ids are generated
// together (independent chains: instruction-level parallelism); (2) one test per group,
// fadd(max base, gumbel_ub(max word)) >= lb: gumbel_ub is non-decreasing in the word and fadd in
// both arguments, so it bounds every element's
// fadd(base_k, gumbel_ub(w_k)) -- a group failing it has no survivor (almost every group fails
// it: ~1e-5 of the elements survive); (3) only then each element with its own word; the
// survivors reach `slow(id, w)` (the exact score) from one call site outside the unrolled loop.
// The bases are evaluated for every element (the warp executes them anyway), so base_of should
// be branch-free. Pruning only skips tokens that cannot win: bench/lab/tools/verify_tokens.py compares the
// tokens with a build without any pruning (-DTS_FINAL_NOPRUNE).
template <typename T, int VEC, bool TWO, typename R, typename B, typename S>
__device__ __forceinline__ void scan_rows(const T* a, const T* b, int64_t start, int64_t end,
                                          uint64_t seed, uint64_t off, uint32_t stream,
                                          const uint32_t& lb, R&& refresh, B&& base_of,
                                          S&& slow, uint4* pipe) {
  constexpr int U = final_u<VEC>();
  constexpr int ST = final_stages<VEC>();
  const int64_t step = int64_t(kThreads) * VEC;
  int64_t idx = start + int64_t(threadIdx.x) * VEC;
  // groups of 4 ids in one iteration: all their blocks are generated together when any element
  // passes (independent chains: instruction-level parallelism)
  constexpr int NG = VEC % 4 == 0 ? U * VEC / 4 : 1;
  // iterations of the vector loop for this thread
  const int nit = idx + (U - 1) * step + VEC <= end
                      ? int((end - VEC - (U - 1) * step - idx) / (U * step)) + 1
                      : 0;
  // ST > 0: the loads run ST - 1 iterations ahead through per-thread cp.async copies into
  // shared memory (stage s, row r (0: a, 1: b), vector u at pipe[(s * 2 * U + r * U + u) *
  // kThreads + threadIdx.x]). The stage written at an iteration is the one read at the previous
  // iteration: its values were used by that iteration's bases, which precede this copy in
  // program order.
  int rs = 0;   // stage read at this iteration
  // copy the vectors of iteration it (= the current one + ahead) into stage s
  auto issue = [&](int it, int ahead, int s) {
    if constexpr (ST > 0) {
      if (it < nit) {
        const int64_t at = idx + int64_t(ahead * U) * step;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          cp_async16(pipe + (s * 2 * U + u) * kThreads + threadIdx.x, a + at + u * step);
          if (TWO)
            cp_async16(pipe + (s * 2 * U + U + u) * kThreads + threadIdx.x, b + at + u * step);
        }
      }
      cp_async_commit();   // empty groups too: wait_group counts groups
    }
  };
#pragma unroll
  for (int s = 0; s < (ST > 0 ? ST - 1 : 0); ++s) issue(s, s, s);
  for (int it = 0; it < nit; ++it, idx += U * step) {
    float va[U][VEC], vb[U][VEC];
    if constexpr (ST > 0) {
      issue(it + ST - 1, ST - 1, rs == 0 ? ST - 1 : rs - 1);
      cp_async_wait<(ST > 0 ? ST - 1 : 0)>();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        unpack_vec<T, VEC>(pipe[(rs * 2 * U + u) * kThreads + threadIdx.x], va[u]);
        if (TWO) unpack_vec<T, VEC>(pipe[(rs * 2 * U + U + u) * kThreads + threadIdx.x], vb[u]);
      }
      rs = rs + 1 == ST ? 0 : rs + 1;
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        load_vec<T, VEC>(a + idx + u * step, va[u]);
        if (TWO) load_vec<T, VEC>(b + idx + u * step, vb[u]);
      }
    }
    refresh();
    // lb as a float: key32(a) >= lb  <=>  a >= key32_to_float(lb) (key32 is an order isomorphism
    // of the non-NaN floats with -0 = +0). No bound (lb = 0): -FLT_MAX, which every finite base
    // plus a positive noise bound reaches and -inf (not in the support) does not. Bases are never
    // NaN.
    const float lbf = lb ? key32_to_float(lb) : -FLT_MAX;
    uint32_t surv = 0;
    float base[U * VEC];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        base[u * VEC + k] = base_of(idx + u * step + k, va[u][k], TWO ? vb[u][k] : 0.0f);
    auto block_of = [&](int g) -> Philox4 {   // group g: vector g / (VEC / 4), its quad g % ..
      constexpr int QV = VEC >= 4 ? VEC / 4 : 1;   // groups per vector (used only if VEC % 4 == 0)
      const uint32_t blk = uint32_t((idx + (g / QV) * step) >> 2) + uint32_t(g % QV);
      return philox_block(seed, off, blk, stream);
    };
    if constexpr (VEC % 4 == 0) {
      // Per group of 4 ids the largest base; G <= 16.65 for every word, so if even the largest
      // base of the iteration fails fadd(base, 16.65) >= lb no element can win, whatever its
      // noise, and no Philox block is generated (fadd is monotone: this one test equals the
      // per-element tests or-ed together).
      float mb[NG];
#pragma unroll
      for (int g = 0; g < NG; ++g)
        mb[g] = fmaxf(fmaxf(base[4 * g], base[4 * g + 1]), fmaxf(base[4 * g + 2], base[4 * g + 3]));
      float mall = mb[0];
#pragma unroll
      for (int g = 1; g < NG; ++g) mall = fmaxf(mall, mb[g]);
      if (fadd(mall, 16.65f) >= lbf) {
        Philox4 ph[NG];
#pragma unroll
        for (int g = 0; g < NG; ++g) ph[g] = block_of(g);
        // the group test, then each element of a group that passes it (an element passing its
        // own test also passes the constant one: gumbel_ub(w) <= 16.65)
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          const uint32_t mw = max(max(ph[g].x, ph[g].y), max(ph[g].z, ph[g].w));
          if (!(fadd(mb[g], gumbel_ub(mw)) >= lbf)) continue;
          const uint32_t w[4] = {ph[g].x, ph[g].y, ph[g].z, ph[g].w};
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (fadd(base[4 * g + k], gumbel_ub(w[k])) >= lbf) surv |= 1u << (4 * g + k);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < U * VEC; ++e) {
        // G <= 16.65 for every word: an element failing this cannot win, whatever its noise
        if (!(fadd(base[e], 16.65f) >= lbf)) continue;
        const int64_t id = idx + (e / VEC) * step + (e % VEC);
        const uint32_t w = philox_word(seed, off, uint32_t(id), stream);
        if (fadd(base[e], gumbel_ub(w)) >= lbf) surv |= 1u << e;
      }
    }
    while (surv) {
      const int e = __ffs(int(surv)) - 1;
      surv &= surv - 1;
      const int64_t id = idx + (e / VEC) * step + (e % VEC);
      slow(id, philox_word(seed, off, uint32_t(id), stream));
    }
  }
  for (; idx < end; idx += step) {
    refresh();
#pragma unroll 1
    for (int k = 0; k < VEC && idx + k < end; ++k) {
      const int64_t id = idx + k;
      const float bs = base_of(id, to_f<T>(a[id]), TWO ? to_f<T>(b[id]) : 0.0f);
      if (!(bs > -INFINITY) || key32(fadd(bs, 16.65f)) < lb) continue;
      const uint32_t wd = philox_word(seed, off, uint32_t(id), stream);
      if (key32(fadd(bs, gumbel_ub(wd))) >= lb) slow(id, wd);
    }
  }
}

struct FinalWs {
  unsigned long long* cand;   // [bs]
  unsigned int* count;        // [bs]
  float4* state;              // [bs * splits] per-CTA interval state (first pass), or null
  int32_t splits;
  int32_t chunk;              // elements per split (multiple of 8)
  int32_t mode;               // 0: after the resolve kernel (every sum it needs is exact);
                              // 1: first pass (approximate sums allowed); 2: second pass
};

// S from the pos kernel's approximate S~ = trunc(X), X = s * 2^38, |X - S| <= d S (coin_margin):
// S in [X / (1 + d), X / (1 - d)] with X in [S~, S~ + 1); widened for the double rounding.
__device__ __forceinline__ void s_interval(int64_t s, double d, int64_t& lo, int64_t& hi) {
  const double x = double(s);
  const double l = x / (1.0 + d) * (1.0 - 1e-12) - 2.0;
  const double h = (x + 1.0) / (1.0 - d) * (1.0 + 1e-12) + 2.0;
  lo = l < 1.0 ? int64_t(1) : int64_t(l);
  hi = int64_t(h);
}
// Widening of a score interval: covers any non-monotonicity of soft_ln (an ulp or two of a value
// below 90: ulp <= 7.7e-6) and the rounding of the subtraction / addition themselves.
constexpr float kIvPad = 4e-5f;

template <typename T, int VEC>
__device__ __forceinline__ void final_one(const VerifyParams& p, const FinalWs& ws, const int i,
                                          const int sp) {
  __shared__ BlockScratch scratch;
  __shared__ int sh_f;
  __shared__ int sh_last;
  __shared__ unsigned long long sh_key;
  __shared__ unsigned sh_lb;   // key32 of a lower bound of the winner's score (pruning)
  __shared__ float sh_hi;
  __shared__ float2 sh_iv[kThreads];
  __shared__ __align__(16) uint4 sh_pipe[final_pipe_vectors<VEC>()];   // scan_rows' loads
  __shared__ long long sh_S2[2];
  const int n = int(p.cu[i + 1] - p.cu[i]);
  const int W = p.max_n + 1;

  // ---- walk: first position whose accept bit is missing ----
  if (threadIdx.x < 32) {
    const int f = first_failed(p, i, 0, n);
    if (threadIdx.x == 0) {
      sh_f = f;
      // best score of this request's finished CTAs so far (0 = none): a valid lower bound
      sh_lb = uint32_t(*reinterpret_cast<volatile unsigned long long*>(&ws.cand[i]) >> 32);
    }
  }
  __syncthreads();
  const int f = sh_f;
  const int64_t tr = target_row(p, i, f);
  const PosStats st = p.pos[tr];
  const bool bonus = f == n;
  const bool bad = (st.status & kBadT) || (!bonus && (st.status & kBadQ));
  const bool logprobs = p.flags & kLogprobs;
  const bool ngram = p.flags & kNgram;
  // First pass: a rejection whose sums are approximate is scored with score intervals (approx);
  // an undecided coin at f (kUnsure), or bounds too wide to be useful, go to the exact path at
  // once (uniform over the request's CTAs, before anything is written or counted).
  bool approx = false;
  double dt = 0.0, dq = 0.0;
  if (ws.mode == 1 && !bonus && !bad) {
    bool send = st.status & kUnsure;
    if (!send && !(st.status & kExactS)) {
      approx = true;
      dt = coin_margin<T, VEC>(p.chunk, p.V);
      dq = ngram ? 0.0 : coin_margin<T, VEC>(p.chunk, p.V);
      send = dt >= 0.25 || dq >= 0.25 || logprobs || (p.flags & kExactCoins);
    }
    if (send) {
      if (sp == 0 && threadIdx.x == 0) {
        p.flist[atomicAdd(p.fcount, 1u)] = i;
        if (p.flags & kListStats)
          atomicAdd(&g_verify_list_stats[(st.status & kUnsure) ? 0 : 1], 1u);
      }
      return;
    }
  }
  if (sp == 0) {
    for (int j = threadIdx.x; j < W; j += kThreads) {
      const int64_t o = int64_t(i) * W + j;
      if (j < f) {
        store_tok(p, o, p.ids[draft_slot(p, i, j)]);
        if (logprobs) {
          const PosStats& sj = p.pos[target_row(p, i, j)];
          p.lp[o] = sj.lp_x;
          p.plp[o] = sj.plp_x;
        }
      } else if (j > f || bad) {
        store_tok(p, o, j > f ? -1 : 0);
        if (logprobs) { p.lp[o] = j > f ? 0.0f : NAN; p.plp[o] = j > f ? 0.0f : NAN; }
      }
    }
    if (threadIdx.x == 0) {
      store_count(p, i, f);
      p.valid[i] = !bad;
    }
  }
  if (bad) return;  // uniform over the request's CTAs: nobody touches its slot / counter

  const RowParams rp = row_params(p, i);
  const T* trow = static_cast<const T*>(p.tgt) + tr * p.stride_t;
  const int64_t ds = draft_slot(p, i, f);
  const T* drow = (!bonus && !ngram) ? static_cast<const T*>(p.drf) + ds * p.stride_d : trow;
  const int64_t xd = (!bonus) ? p.ids[ds] : -1;
  const uint64_t seed = uint64_t(p.seed[i]);
  const uint64_t offp = uint64_t(p.offset[i] + f);
  const int64_t start = int64_t(sp) * ws.chunk;
  const int64_t end = start + ws.chunk < p.V ? start + ws.chunk : int64_t(p.V);
  Cand best{-INFINITY, INT32_MAX};   // approx: by the lower ends of the score intervals
  // approx, per thread (shared memory: touched only by the rare exact scores, keeps registers
  // for the scan): upper end of best's interval, max upper end of the other scored tokens
  sh_iv[threadIdx.x] = make_float2(-INFINITY, -INFINITY);
  uint32_t blk = 0xffffffffu;
  Philox4 ph{0, 0, 0, 0};
  auto word = [&](int64_t id, uint32_t stream) -> uint32_t {
    const uint32_t b = uint32_t(id >> 2);
    if (b != blk) { blk = b; ph = philox_block(seed, offp, b, stream); }
    return (id & 3) == 0 ? ph.x : (id & 3) == 1 ? ph.y : (id & 3) == 2 ? ph.z : ph.w;
  };
  auto noise = [&](int64_t id, uint32_t stream) -> float { return gumbel_from_bits(word(id, stream)); };
  // Exact pruning: `lb` is key32 of a lower bound of the winner's score -- the score of a token
  // that was actually scored exactly (by any thread of this CTA, by the probe, or by a finished
  // CTA of this request through ws.cand). A token whose score upper bound ub is < that score
  // has a strictly smaller score than the winner, so it is not the winner (ties included) and
  // its exact score need not be computed. The winner itself is never skipped.
  uint32_t lb = 0;   // 0 = no bound (key32 of every float is > 0)
#ifdef TS_FINAL_NOPRUNE
  // test build: no pruning at all, every element of the support is scored exactly (the oracle
  // that bench/lab/tools/verify_tokens.py compares the pruned kernel against)
  auto may_win = [&](float) -> bool { return true; };
  auto publish = [&](float) {};
  auto refresh = [&]() {};
#else
  auto may_win = [&](float ub) -> bool {
    const uint32_t s = *reinterpret_cast<volatile unsigned*>(&sh_lb);
    lb = s > lb ? s : lb;
    return key32(ub) >= lb;
  };
  auto publish = [&](float s) {
    const uint32_t k = key32(s);
    if (k > lb) { lb = k; atomicMax(&sh_lb, k); }
  };
  auto refresh = [&]() {   // lb = max(lb, the CTA's shared bound)
    const uint32_t s = *reinterpret_cast<volatile unsigned*>(&sh_lb);
    lb = s > lb ? s : lb;
  };
#endif

  if (bonus) {
    // the sampler: argmax over the kept set of fl(y + G(seed, offset + n, id, stream 0)). A token
    // with y < -kGumbelSpan cannot win: the max token (arg_t, y = 0, kept by every filter) scores
    // G >= -2.8116, and fl(y + G) <= fl(-19.5 + 16.6356) < -2.86 (fadd is monotone).
    // bound without the noise: y (G <= gumbel_ub(w); fadd is monotone); -inf: not kept
    auto base_of = [&](int64_t id, float z, float) -> float {
      const float y = ycen(z, st.zmax_t, rp.inv_t);
      return (y >= -kGumbelSpan && kept_at(rp, id, st.arg_t, z, y, st.thr_t)) ? y : -INFINITY;
    };
    auto slow = [&](int64_t id, uint32_t w) {
      const float y = ycen(to_f<T>(trow[id]), st.zmax_t, rp.inv_t);
      if (!may_win(fadd(y, gumbel_ub(w)))) return;   // the shared bound may have risen
      const float s = fadd(y, gumbel_from_bits(w));
      best = best_of(best, Cand{s, int32_t(id)});
      publish(s);
    };
    if (threadIdx.x == 0) {  // probe: the row's argmax token (its score seeds the bound)
      const float bs = base_of(st.arg_t, to_f<T>(trow[st.arg_t]), 0.0f);
      if (bs > -INFINITY) slow(st.arg_t, philox_word(seed, offp, uint32_t(st.arg_t), kStreamSample));
    }
    __syncthreads();
    // rows without min-p / top-k / top-p (and not greedy): every element is kept, so the same
    // bound without the kept-set test, branch-free
    const bool plain = !rp.greedy && !rp.mp_on && st.thr_t == 0;
    auto base_plain = [&](int64_t, float z, float) -> float {
      const float y = ycen(z, st.zmax_t, rp.inv_t);
      return (y >= -kGumbelSpan) ? y : -INFINITY;
    };
    if (start < end) {
      if (plain)
        scan_rows<T, VEC, false>(trow, trow, start, end, seed, offp, kStreamSample, lb, refresh,
                                 base_plain, slow, sh_pipe);
      else
        scan_rows<T, VEC, false>(trow, trow, start, end, seed, offp, kStreamSample, lb, refresh,
                                 base_of, slow, sh_pipe);
    }
  } else {
    // residual: N_i = e^p_i S_q - e^q_i S_p > 0, score soft_ln(f32(N_i)) + G(offset + f, stream 2)
    // approx: S_t in [St_lo, St_hi], S_q in [Sq_lo, Sq_hi], so N_i in
    // [e^p Sq_lo - e^q St_hi, e^p Sq_hi - e^q St_lo]; exact: the intervals are points.
    int64_t St_lo = st.S_t, St_hi = st.S_t, Sq_lo = st.S_q, Sq_hi = st.S_q;
    if (approx) {
      s_interval(st.S_t, dt, St_lo, St_hi);
      if (!ngram) s_interval(st.S_q, dq, Sq_lo, Sq_hi);
      if (threadIdx.x == 0) { sh_S2[0] = Sq_lo; sh_S2[1] = St_hi; }   // read by the rare scores
    }
    const u128 Sq = u128(uint64_t(Sq_hi)), Sp = u128(uint64_t(St_lo));
    const float bl_sq = float(39 + (64 - __clzll((long long)Sq_hi))) + 0.01f;
    // an upper bound of ln S_q - ln S_t (float; ~1e-5 absolute error at most, covered by the
    // 1e-4 margin below)
    const float dS = fsub(logf(float(Sq_hi)), logf(float(St_lo)));
    // Bounds before the mass and the noise. ep <= 2^(38 + yt log2 e) (1 + 2^-23)
    // (soft_exp_neg's error), so bitlen(A) <= 39 + bitlen(S_q) + yt log2 e + 1e-6 and
    // ln_ub(A) <= ubc (fmul / fadd are monotone; the 0.01 covers their rounding).
    auto ubc_of = [&](float yt) { return fmul(fadd(fmul(yt, kLog2e), bl_sq), 0.6932f); };
    // One FFMA bounding ubc_of from above for every yt in [kMassCut, 0] (the scan's bases; yt <= 0
    // since zmax_t is the max of the same row): with C = 0.6932f, L = kLog2e, |yt L| <= 38.3 and
    // bl_sq <= 103.01, the three roundings of ubc_of add at most 2^-24 (38.3 C + 103.01 C + 72)
    // < 1.1e-5 to C (L yt + bl_sq), and the FFMA's rounding takes at most 2^-24 * 72 < 4.3e-6
    // from ubc_a yt + ubc_b; ubc_a <= C L (yt <= 0) and ubc_b >= C bl_sq + 3e-5 cover both.
    const float ubc_a = __double2float_rd(double(0.6932f) * double(kLog2e));
    const float ubc_b = __double2float_ru(double(0.6932f) * double(bl_sq) + 3e-5);
    // bound without the noise: ubc(yt) >= ln_ub(A); -inf: not in the residual's support
    auto base_of = [&](int64_t id, float z, float zq) -> float {
      const float yt = ycen(z, st.zmax_t, rp.inv_t);
      if (!(yt >= kMassCut) || !kept_at(rp, id, st.arg_t, z, yt, st.thr_t)) return -INFINITY;
      if (!ngram) {
        // Not in the residual's support when p(id) <= q(id) by a clear margin: with
        // yq >= -12, eq >= 2^38 e^yq (1 - 2^-23) - 1 >= 2^38 e^yq (1 - 1e-6), so
        // yt + ln S_q - ln S_t < yq - 1e-4 implies ep S_q < eq S_t, i.e. N <= 0.
        const float yq = ycen(zq, st.zmax_q, rp.inv_t);
        if (yq >= -12.0f && fadd(yt, dS) < fsub(yq, 1e-4f) &&
            kept_at(rp, id, st.arg_q, zq, yq, st.thr_q))
          return -INFINITY;
      }
      return ubc_of(yt);
    };
    auto slow = [&](int64_t id, uint32_t w) {
      const float yt = ycen(to_f<T>(trow[id]), st.zmax_t, rp.inv_t);
      // 1 <= N <= A, so soft_ln(f32(N)) <= ln_ub(A) <= ubc; G <= gumbel_ub(w)
      if (!may_win(fadd(ubc_of(yt), gumbel_ub(w)))) return;
      const int64_t ep = mass_fixed(yt);
      if (ep == 0) return;
      const u128 A = u128(uint64_t(ep)) * Sq;
      int64_t eq;
      if (ngram) {
        eq = (id == xd) ? 1 : 0;
      } else {
        const float zq = to_f<T>(drow[id]);
        const float yq = ycen(zq, st.zmax_q, rp.inv_t);
        eq = (yq >= kMassCut && kept_at(rp, id, st.arg_q, zq, yq, st.thr_q)) ? mass_fixed(yq) : 0;
      }
      const u128 B = u128(uint64_t(eq)) * Sp;
      if (A > B) {
        const float g = gumbel_from_bits(w);
        const float s = fadd(soft_ln(wide_to_f32(A - B)), g);
        if (!approx) {
          best = best_of(best, Cand{s, int32_t(id)});
          publish(s);
          return;
        }
        // approx: A - B is the upper end of N; the score lies in [lo, hi]
        const u128 A2 = u128(uint64_t(ep)) * u128(uint64_t(sh_S2[0]));
        const u128 B2 = u128(uint64_t(eq)) * u128(uint64_t(sh_S2[1]));
        const float lo = A2 > B2 ? fsub(fadd(soft_ln(wide_to_f32(A2 - B2)), g), kIvPad) : -INFINITY;
        const float hi = fadd(s, kIvPad);
        if (int32_t(id) == best.id) return;   // the probe's token scanned again
        float2 iv = sh_iv[threadIdx.x];
        if (lo > best.s || (lo == best.s && uint32_t(id) < uint32_t(best.id))) {
          iv.y = fmaxf(iv.y, iv.x);
          best = Cand{lo, int32_t(id)};
          iv.x = hi;
        } else {
          iv.y = fmaxf(iv.y, hi);
        }
        sh_iv[threadIdx.x] = iv;
        if (lo > -INFINITY) publish(lo);
      }
    };
    if (threadIdx.x == 0) {  // probe: the target row's argmax token
      const int64_t a = st.arg_t;
      const float bs = base_of(a, to_f<T>(trow[a]), ngram ? 0.0f : to_f<T>(drow[a]));
      if (bs > -INFINITY) slow(a, philox_word(seed, offp, uint32_t(a), kStreamResample));
    }
    __syncthreads();
    // rows without min-p / top-k / top-p (and not greedy) keep every element: the same bound
    // without the kept-set tests (base_of's kept_at calls are all true there)
    const bool plain = !rp.greedy && !rp.mp_on && st.thr_t == 0 && st.thr_q == 0;
    // (base_of's tests written without branches -- the warp evaluates every element anyway, and
    // early returns cost a divergence region per element -- with the one-FFMA bound above, which
    // is >= base_of's ubc_of)
    auto base_plain = [&](int64_t, float z, float zq) -> float {
      const float yt = ycen(z, st.zmax_t, rp.inv_t);
      bool out = !(yt >= kMassCut);
      if (!ngram) {
        const float yq = ycen(zq, st.zmax_q, rp.inv_t);
        out = out | ((yq >= -12.0f) & (fadd(yt, dS) < fsub(yq, 1e-4f)));
      }
      const float ub = __fmaf_rn(yt, ubc_a, ubc_b);   // >= ubc_of(yt), see above
      return out ? -INFINITY : ub;
    };
    if (start < end) {
      if (ngram) {
        if (plain)
          scan_rows<T, VEC, false>(trow, trow, start, end, seed, offp, kStreamResample, lb,
                                   refresh, base_plain, slow, sh_pipe);
        else
          scan_rows<T, VEC, false>(trow, trow, start, end, seed, offp, kStreamResample, lb,
                                   refresh, base_of, slow, sh_pipe);
      } else {
        if (plain)
          scan_rows<T, VEC, true>(trow, drow, start, end, seed, offp, kStreamResample, lb,
                                  refresh, base_plain, slow, sh_pipe);
        else
          scan_rows<T, VEC, true>(trow, drow, start, end, seed, offp, kStreamResample, lb,
                                  refresh, base_of, slow, sh_pipe);
      }
    }
  }
  const Cand mine = best;
  best = block_best(best, scratch);
  float hx = -INFINITY;   // approx: max upper end over the CTA's scored tokens other than best
  if (approx) {
    const float2 iv = sh_iv[threadIdx.x];
    const float t = fmaxf(iv.y, mine.id == best.id ? -INFINITY : iv.x);
    hx = block_max_arg(MaxArg{t, 0}, scratch).v;
    // best's upper end: from the thread that holds it (several may, all with the same value)
    if (mine.id == best.id && mine.s == best.s) sh_hi = iv.x;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const unsigned long long k = pack_cand(best);
    if (k) atomicMax(&ws.cand[i], k);
    if (approx)
      ws.state[int64_t(i) * ws.splits + sp] =
          make_float4(__int_as_float(best.id), sh_hi, hx, 0.0f);
    __threadfence();
    sh_last = atomicAdd(&ws.count[i], 1u) == unsigned(ws.splits) - 1u;
  }
  __syncthreads();
  if (!sh_last) return;
  // ---- the last CTA of the request: winner, fallback, token, logprobs ----
  if (threadIdx.x == 0) {
    __threadfence();
    sh_key = atomicMax(&ws.cand[i], 0ull);   // atomic read of the final maximum
  }
  __syncthreads();
  unsigned long long key = sh_key;
  if (approx) {
    // The token with the largest lower end W wins exactly if every other scored token's upper
    // end is below W's lower end (tokens never scored were pruned with an upper bound < lb <=
    // W's lower end). Otherwise the exact path decides (resolve kernel, second pass).
    const int32_t wid = int32_t(unpack_id(key));
    float h = -INFINITY;
    for (int c = threadIdx.x; c < ws.splits; c += kThreads) {
      const float4 q = __ldcg(&ws.state[int64_t(i) * ws.splits + c]);
      h = fmaxf(h, q.z);
      if (__float_as_int(q.x) != wid) h = fmaxf(h, q.y);
    }
    h = block_max_arg(MaxArg{h, 0}, scratch).v;
    const bool decided = key != 0ull && !(p.flags & kExactResidual) &&
                         key32_to_float(uint32_t(key >> 32)) > h;
    if (!decided) {
      if (threadIdx.x == 0) {
        ws.cand[i] = 0ull;   // the second pass starts afresh
        ws.count[i] = 0u;
        p.flist[atomicAdd(p.fcount, 1u)] = i;
        if (p.flags & kListStats) atomicAdd(&g_verify_list_stats[2], 1u);
      }
      return;
    }
  }
  if (!bonus && key == 0) {
    // empty residual (p == q and p(x) = 0): resample from p, weights e^p_i, same noise. Rare
    // (a draft outside its own distribution's support): this CTA scans the whole row.
    Cand fb{-INFINITY, INT32_MAX};
    blk = 0xffffffffu;
    for_chunk<T, VEC>(trow, 0, p.V, [&](int64_t id, float z) {
      const float yt = ycen(z, st.zmax_t, rp.inv_t);
      if (!(yt >= kMassCut) || !kept_at(rp, id, st.arg_t, z, yt, st.thr_t)) return;
      const int64_t ep = mass_fixed(yt);
      if (ep == 0) return;
      const float s = fadd(soft_ln(wide_to_f32(u128(uint64_t(ep)))), noise(id, kStreamResample));
      fb = best_of(fb, Cand{s, int32_t(id)});
    });
    fb = block_best(fb, scratch);
    key = pack_cand(fb);
  }
  if (threadIdx.x == 0) {
    const int64_t tok = unpack_id(key);
    const int64_t o = int64_t(i) * W + f;
    store_tok(p, o, tok);
    if (logprobs) {
      const float z = to_f<T>(trow[tok]);
      p.lp[o] = z - st.lse_t;
      p.plp[o] = rp.greedy ? 0.0f
                           : ycen(z, st.zmax_t, rp.inv_t) - (logf(float(st.S_t)) - kLn2Pow38);
    }
  }
}

// One item (request i, split sp) per CTA (mode 0 and 1); in the second pass (mode 2) the CTAs
// of a fixed grid stride over (request of p.flist, split) items.
#ifndef TS_FINAL_MINB
#define TS_FINAL_MINB 4
#endif
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads, TS_FINAL_MINB) verify_final_kernel(const VerifyParams p,
                                                                const FinalWs ws) {
  const bool listed = ws.mode == 2;
  const unsigned S = unsigned(ws.splits);
  const unsigned items =
      listed ? *reinterpret_cast<const volatile unsigned*>(p.fcount) * S : gridDim.x;
  for (unsigned it = blockIdx.x; it < items; it += gridDim.x) {
    final_one<T, VEC>(p, ws, listed ? p.flist[it / S] : int(it / S), int(it % S));
    __syncthreads();   // shared memory reuse by the next item
  }
}

// ------------------------------------------------------------------------------------------
// kernels 3 + 4 fused (two-pass order, sm_90 clusters): the listed requests' exact path
// ------------------------------------------------------------------------------------------
// One thread-block cluster of C CTAs per listed request (the clusters stride over the list), each
// CTA a vocabulary chunk (ws.chunk). Phase 1, per position the walk needs (the first without the
// accept bit, then the next while a kUnsure coin turns out accepted): the chunk's exact
// fixed-point sums (as verify_resolve_kernel), combined through distributed shared memory into
// the exact S_t / S_q in every CTA; every CTA decides the coin exactly (same inputs, same
// decision) and CTA 0 stores the exact statistics in p.pos. Phase 2: the same CTAs score the
// final token exactly over the same chunks (final_one, mode 2). One launch instead of two, and
// the sums meet in the cluster instead of global atomics and an arrival counter.
template <typename T, int VEC>
__device__ __forceinline__ void listed_sums(const VerifyParams& p, const FinalWs& ws, const int i,
                                            const unsigned rank) {
  namespace cg = cooperative_groups;
  __shared__ BlockScratch scratch;
  __shared__ int sh_f;
  __shared__ long long sh_part[2];
  __shared__ long long sh_S[2];
  cg::cluster_group cl = cg::this_cluster();
  const unsigned C = cl.num_blocks();
  const int n = int(p.cu[i + 1] - p.cu[i]);
  const bool ngram = p.flags & kNgram;
  const RowParams rp = row_params(p, i);
  const int64_t start = int64_t(rank) * ws.chunk;
  const int64_t end = start + ws.chunk < p.V ? start + ws.chunk : int64_t(p.V);
  for (int f = block_first_failed(p, i, 0, n, sh_f); f < n;
       f = block_first_failed(p, i, f + 1, n, sh_f)) {
    const int64_t row = target_row(p, i, f);
    const PosStats ps = p.pos[row];
    if (ps.status & (kBadT | kBadQ | kExactS)) break;   // nothing to compute (uniform)
    long long St, Sq;
    position_masses<T, VEC>(p, rp, ps, i, f, row, start, end, rank == 0, St, Sq, scratch);
    if (threadIdx.x == 0) {
      sh_part[0] = St;
      sh_part[1] = Sq;
    }
    cl.sync();   // every CTA's partial sums are in its shared memory
    if (threadIdx.x == 0) {
      long long a = 0, b = 0;
      for (unsigned r = 0; r < C; ++r) {
        const long long* q = cl.map_shared_rank(sh_part, r);
        a += q[0];
        b += q[1];
      }
      sh_S[0] = a;
      sh_S[1] = b;
    }
    cl.sync();   // every CTA has read every partial (sh_part reusable); sh_S visible in the CTA
    const long long Sx = sh_S[0];
    const long long Qx = ngram ? 1 : sh_S[1];
    const bool acc = (ps.status & kUnsure) && coin_exact(coin_U(p, i, f), ps.e_p, ps.e_q, Sx, Qx);
    if (rank == 0 && threadIdx.x == 0) {
      p.pos[row].S_t = Sx;
      p.pos[row].S_q = Qx;
      p.pos[row].status = (ps.status & ~kUnsure) | kExactS | (acc ? kAccept : 0u);
    }
    if (!acc) break;   // uniform: every CTA decided the same
  }
  // CTA 0's statistics reach the other CTAs' final scan: release (fence, then the cluster
  // barrier's release), acquire (the barrier, then a fence in every thread before its loads)
  if (rank == 0 && threadIdx.x == 0) __threadfence();
  cl.sync();
  __threadfence();
}
// Used at bs <= TS_LISTED_FUSED_MAX_BS only. On an H200 (bench/results/h200/verify_ab_listed.csv)
// the fused launch costs 1.1-1.6 us when nothing is listed where the two launches cost 3.4-5.0 us,
// but 28-35 us for one listed request where the two take 20-29 us: a cluster (at most 16 SMs)
// scans the two rows that the resolve / second-pass grids spread over ~74 SMs. Something is
// listed in 14 of 24 calls at bs 256 (bench/lab/tools/verify_listed.py, 6 offsets at each of 4 shapes), in
// 0 and 2 of 6 at two bs-64 shapes (there the expected gain is about nil: at 19ac3ab, fused up
// to bs 64, the table's bf16 V 262144 n 3 bs 64 problem had a listed request and took 1.11x the
// time), and the probability scales with bs, so the fused launch is used up to bs 32.
#ifndef TS_LISTED_FUSED
#define TS_LISTED_FUSED 1
#endif
#ifndef TS_LISTED_FUSED_MAX_BS
#define TS_LISTED_FUSED_MAX_BS 32
#endif
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads, 2) verify_listed_kernel(const VerifyParams p,
                                                                    const FinalWs ws) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const unsigned C = cl.num_blocks();
  const unsigned rank = cl.block_rank();
  const unsigned items = *reinterpret_cast<const volatile unsigned*>(p.fcount);
  for (unsigned it = blockIdx.x / C; it < items; it += gridDim.x / C) {
    const int i = p.flist[it];
    listed_sums<T, VEC>(p, ws, i, rank);
    final_one<T, VEC>(p, ws, i, int(rank));
    cl.sync();   // the next item reuses shared memory that other CTAs of the cluster may read
  }
}

// ------------------------------------------------------------------------------------------
// strict accept: one warp per request
// ------------------------------------------------------------------------------------------
struct StrictParams {
  const int64_t* row_tokens;
  const bool* row_valid;
  const float* row_lp;   // nullable
  const float* row_plp;
  const int64_t* ids;
  const int64_t* cu;
  int32_t bs, max_n;
  uint32_t flags;
  void* tokens;
  void* num_accepted;
  bool* valid;
  float* lp;
  float* plp;
  int32_t out64;
};

__global__ void __launch_bounds__(128) verify_strict_kernel(const StrictParams p) {
  const int i = int(blockIdx.x) * 4 + int(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= p.bs) return;
  const bool padded = p.flags & kPadded;
  const int n = int(p.cu[i + 1] - p.cu[i]);
  const int W = p.max_n + 1;
  auto trow = [&](int j) -> int64_t { return padded ? int64_t(i) * W + j : p.cu[i] + i + j; };
  auto dslot = [&](int j) -> int64_t { return padded ? int64_t(i) * p.max_n + j : p.cu[i] + j; };
  int f = n;
  for (int base = 0; base < n; base += 32) {
    const int j = base + lane;
    bool fail = false;
    if (j < n) {
      const int64_t r = trow(j);
      fail = !p.row_valid[r] || p.row_tokens[r] != p.ids[dslot(j)];
    }
    const unsigned bal = __ballot_sync(0xffffffffu, fail);
    if (bal) { f = base + __ffs(bal) - 1; break; }
  }
  const int64_t rf = trow(f);
  for (int j = lane; j < W; j += 32) {
    const int64_t o = int64_t(i) * W + j;
    const int64_t tok = j < f ? p.ids[dslot(j)] : (j == f ? p.row_tokens[rf] : -1);
    if (p.out64) static_cast<int64_t*>(p.tokens)[o] = tok;
    else static_cast<int32_t*>(p.tokens)[o] = int32_t(tok);
    if (p.lp) {
      p.lp[o] = j <= f ? p.row_lp[trow(j)] : 0.0f;
      p.plp[o] = j <= f ? p.row_plp[trow(j)] : 0.0f;
    }
  }
  if (lane == 0) {
    if (p.out64) static_cast<int64_t*>(p.num_accepted)[i] = f;
    else static_cast<int32_t*>(p.num_accepted)[i] = f;
    p.valid[i] = p.row_valid[rf];
  }
}

// ------------------------------------------------------------------------------------------
// launchers
// ------------------------------------------------------------------------------------------
// Launch configuration of `blocks` CTAs of kThreads threads, in clusters of cs (cs > 1; attr is
// the storage for the cluster attribute) or without clusters (cs <= 1).
inline cudaLaunchConfig_t launch_config(int64_t blocks, unsigned cs, cudaStream_t stream,
                                        cudaLaunchAttribute (&attr)[1]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  if (cs > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cs;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cfg;
}
template <typename Kernel>
inline cudaError_t launch_maybe_cluster(Kernel kernel, bool cluster, unsigned cs, int64_t blocks,
                                        cudaStream_t stream, const VerifyParams& p) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(blocks, cluster ? cs : 1u, stream, attr);
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// A host-side query about a kernel (occupancy, cluster size), computed once per (device,
// kernel): function attributes such as the non-portable cluster size are set per device, and
// devices of one process may differ. Each call site has its own cache and lock: F is the call
// site's lambda, whose type is its own in every instance of the calling template.
template <typename Kernel, typename F>
inline int cached_per_device(Kernel kernel, F&& compute) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, reinterpret_cast<const void*>(kernel));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int v = compute();
  cache.emplace(key, v);
  return v;
}

// Resident CTAs per SM of a kernel (kThreads threads, static shared memory only).
template <typename Kernel>
inline int resident_per_sm(Kernel kernel) {
  return cached_per_device(kernel, [&]() {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0) != cudaSuccess ||
        n < 1) {
      (void)cudaGetLastError();
      n = 1;
    }
    return n;
  });
}

// Clusters of cs CTAs (kThreads threads each) of a kernel that can be resident at once
// (cudaOccupancyMaxActiveClusters; cs >= 2); 0 if the query fails. Uncached: the callers below
// cache.
template <typename Kernel>
inline int active_clusters(Kernel kernel, unsigned cs) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(cs, cs, nullptr, attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 0) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  return clusters;
}

// CTAs of a cluster kernel resident at once in clusters of CS: active_clusters x CS (0 if the
// query fails). CS = 16 needs the non-portable attribute (max_cluster sets it).
template <int CS, typename Kernel>
inline int cluster_capacity(Kernel kernel) {
  return cached_per_device(kernel, [&]() { return active_clusters(kernel, CS) * CS; });
}

// Largest cluster size (16, non-portable, or the portable 8) that the device can schedule for a
// kernel of kThreads threads. Setting the non-portable attribute is harmless where 16 is refused
// (then 8 is used).
template <typename Kernel>
inline int max_cluster(Kernel kernel) {
  return cached_per_device(kernel, [&]() {
    int best = 8;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
            cudaSuccess &&
        active_clusters(kernel, unsigned(kMaxCluster)) >= 1)
      best = kMaxCluster;
    (void)cudaGetLastError();
    return best;
  });
}

// CTAs per unit (row or request) splitting a V-element row into chunks: minimizes the estimated
// time waves(units * s) * (V / s + kSplitOverhead), i.e. prefers a split that fills whole waves of
// resident CTAs (a partial second wave costs as much as a full one), with chunks of at least
// min_chunk elements (s = 1 always allowed). kSplitOverhead: a CTA's fixed cost (launch, the walk,
// reductions) in element-equivalents.
constexpr int64_t kSplitOverhead = 4096;
inline int pick_splits(int64_t units, int64_t V, int64_t resident, int max_splits,
                       int64_t min_chunk) {
  if (resident < 1) resident = 1;
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const int64_t chunk = (V + s - 1) / s;
    if (s > 1 && chunk < min_chunk) break;
    const int64_t waves = (units * s + resident - 1) / resident;
    const double cost = double(waves) * double(chunk + kSplitOverhead);
    if (s == 1 || cost < best_cost * 0.999) { best = s; best_cost = cost; }
  }
  return best;
}

// Pos-kernel CTAs per row (the cluster size), a power of two <= max_cs: minimizes
// waves(rows * s) * (chunk bytes + kPosCtaBytes), where a wave is what can be resident at once:
// res[0] CTAs of the one-CTA-per-row kernel, res[log2 s] CTAs of the cluster kernel in clusters
// of s (cluster_capacity: clusters must fit in a GPC, so fewer than CTAs/SM x SMs -- on an H200
// at 4 CTAs/SM 528 / 496 / 496 / 448 for s = 2 / 4 / 8 / 16). kPosCtaBytes is a CTA's fixed
// cost (row lookups, reductions, cluster syncs, the coin) in bytes streamed, fitted to sweeps
// of every power of two on an H200 (bench/lab/tools/verify_sweep.py pos). At the 30 shapes of
// bench/results/h200/verify_sweep_pos.csv the size it picks (computed from the capacities that
// bench/lab/tools/verify_occupancy.cu prints) is the fastest swept size at 27 and within 4.9 % of it at
// all (the sweep's own "pick" rows differ from the same size's rows by up to 6 %: noise between
// two measurements). Without the cluster capacity (waves of CTAs/SM x SMs) it picked clusters
// of 16 for bs 16, n 1, bf16 once the 16-bit kernel reached 4 CTAs/SM: 17.2 vs 14.0 us.
constexpr int64_t kPosCtaBytes = 65536;
inline int pick_pos_splits(int64_t rows, int64_t V, int elem_bytes, const int64_t (&res)[5],
                           int max_cs) {
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1, l = 0; s <= max_cs && l < 5; s *= 2, ++l) {
    const int64_t chunk = (V + s - 1) / s;
    if (s > 1 && chunk < 4096) break;
    const int64_t r = std::max<int64_t>(1, res[l]);
    const int64_t waves = (rows * s + r - 1) / r;
    const double cost = double(waves) * double(chunk * elem_bytes + kPosCtaBytes);
    if (s == 1 || cost < best_cost * 0.999) { best = s; best_cost = cost; }
  }
  return best;
}

// Tuning hook for bench/lab/tools/verify_sweep.py: with TOKENSPEED_VERIFY_TUNING set (read once), the
// launcher takes the pos kernel's cluster size from TS_VERIFY_CS and the final kernel's splits
// from TS_VERIFY_FS (read per call) when they are positive. Off by default; never needed.
inline bool tuning_enabled() {
  static const bool on = getenv("TOKENSPEED_VERIFY_TUNING") != nullptr;
  return on;
}

// Final-kernel CTAs per request (the launcher and the workspace sizing both use it).
template <typename T>
inline int verify_final_splits(int64_t bs, int64_t V, int sms, bool vec_ok) {
  constexpr int VEC = 16 / sizeof(T);
  const int occ = vec_ok ? resident_per_sm(verify_final_kernel<T, VEC>)
                         : resident_per_sm(verify_final_kernel<T, 1>);
  if (tuning_enabled()) {
    const char* f = getenv("TS_VERIFY_FS");
    if (f != nullptr && atoi(f) > 0)
      return std::max(1, std::min<int>(atoi(f), int((V + 2047) / 2048)));
  }
  return pick_splits(bs, V, int64_t(occ) * sms, 128, 2048);
}

// sms: the device's SM count; clusters: thread-block clusters available (sm_90+); ws.cand /
// ws.count (final kernel), p.rcount (resolve kernel) and p.flist must hold bs entries, p.racc
// 2 max(R_t, bs) (zeroed by the pos kernel, which therefore always runs with at least bs row
// blocks);
// ws.splits from verify_final_splits, ws.state bs * ws.splits entries (when p.flist is set);
// vec_ok: rows 16-byte aligned.
//
// Order: pos, then either (p.flist null, or logprobs) resolve + final over every request, or
// final (first pass: tokens decided from the approximate sums where their error bounds leave no
// doubt) + resolve + final (second pass) over the requests the first pass listed -- usually none
// or a few, so those two run on a fixed grid of one wave with each listed request split finely.
// Workspace of the radix thresholds (p.thr set, kBisectThresholds clear): sized by
// verify_thr_ws_bytes, carved by verify_thr_ws.
struct ThrWs {
  sampling::Workspace ws;   // part [rows * splits], then the levels' (sampling::level_ws_carve)
  int32_t* row_req;         // [rows]
  int32_t splits, chunk;
};
inline void verify_thr_split(int64_t rows, int V, int sms, int32_t& splits, int32_t& chunk) {
  const int s = sampling::choose_splits(int(std::min<int64_t>(rows, 1 << 30)), V, sms);
  const int64_t c = ((int64_t(V) + s - 1) / s + 7) / 8 * 8;
  chunk = int32_t(c);
  splits = int32_t((V + c - 1) / c);
}
inline int64_t verify_thr_ws_bytes(int64_t rows, int splits) {
  using sampling::ws_align;
  return ws_align(rows * splits * int64_t(sizeof(sampling::Partial))) + ws_align(rows * 4) +
         sampling::level_ws_bytes(rows, splits);
}
inline ThrWs verify_thr_ws(uint8_t* base, int64_t rows, int32_t splits, int32_t chunk) {
  using sampling::ws_align;
  ThrWs t{};
  t.splits = splits;
  t.chunk = chunk;
  t.ws.part = reinterpret_cast<sampling::Partial*>(base);
  base += ws_align(rows * splits * int64_t(sizeof(sampling::Partial)));
  t.row_req = reinterpret_cast<int32_t*>(base);
  base += ws_align(rows * 4);
  sampling::level_ws_carve(base, rows, splits, t.ws);   // state, histograms, lists
  return t;
}

// Kept-set thresholds of every target and draft row into p.thr: the radix select (pass 0 here,
// then the sampler's init and levels), or the bisection oracle (kBisectThresholds).
template <typename T, int VEC>
inline cudaError_t launch_verify_thresholds(const VerifyParams& p, const ThrWs& tw,
                                            cudaStream_t stream) {
  const int64_t rows = p.R_t + p.R_d;
  if (p.flags & kBisectThresholds) {
    verify_threshold_kernel<T, VEC><<<unsigned(rows), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
    const dim3 grid(unsigned(tw.splits), unsigned(std::min<int64_t>(65535, rows - r0)));
    verify_thr_max_kernel<T, VEC><<<grid, kThreads, 0, stream>>>(p, r0, tw.chunk, tw.splits,
                                                                  tw.row_req, tw.ws.part);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  sampling::Params sp{};
  sp.logits = p.tgt;
  sp.row_stride = p.stride_t;
  sp.logits2 = p.R_d > 0 ? p.drf : nullptr;
  sp.row_stride2 = p.stride_d;
  sp.rows1 = int(p.R_t);
  sp.rows = int(rows);
  sp.vocab = p.V;
  sp.tpr = 1;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.flags = sampling::F_THRESHOLDS | (p.temperature ? sampling::F_TEMP : 0) |
             (p.top_k ? sampling::F_TOPK : 0) | (p.top_p ? sampling::F_TOPP : 0) |
             ((p.flags & kNoLevelList) ? sampling::F_NO_LIST : 0) |
             ((p.flags & kNoLevelExcl) ? sampling::F_NO_EXCL : 0) |
             ((p.flags & kLevelExclTest) ? sampling::F_EXCL_TEST : 0);
  sp.splits = tw.splits;
  sp.chunk = tw.chunk;
  sp.row_req = tw.row_req;
  sp.thr_out = p.thr;
  return sampling::launch_levels<T>(sp, tw.ws, stream);
}

template <typename T, int VEC>
inline cudaError_t launch_verify_probabilistic_v(VerifyParams p, int sms, bool clusters,
                                                 FinalWs ws, const ThrWs& tw,
                                                 cudaStream_t stream) {
  auto chunk_of = [&](int c) {
    const int64_t per = (int64_t(p.V) + c - 1) / c;
    return int32_t((per + 7) / 8 * 8);
  };
  const bool two_pass = p.flist != nullptr && ws.state != nullptr && !(p.flags & kLogprobs);
  if (!two_pass) { p.flist = nullptr; p.fcount = nullptr; }
  cudaError_t e;
  if (p.thr != nullptr && p.R_t + p.R_d > 0) {
    e = launch_verify_thresholds<T, VEC>(p, tw, stream);
    if (e != cudaSuccess) return e;
  }
  // 1. statistics: cs_pos CTAs (a cluster) per row
  {
    const int64_t rows = p.R_t > p.bs ? p.R_t : int64_t(p.bs);
    constexpr int PU = pos_pu<T>();   // vectors per row in flight (coin_margin counts on it)
    auto k1 = verify_pos_kernel<T, VEC, false, PU>;
    auto kc = verify_pos_kernel<T, VEC, true, PU>;
    const int cs_max = clusters ? max_cluster(kc) : 1;   // (sets the non-portable attribute)
    const int64_t occc = int64_t(resident_per_sm(kc)) * sms;
    auto cap = [&](int64_t c) { return c > 0 ? c : occc; };   // query failed: CTAs/SM x SMs
    const int64_t res[5] = {int64_t(resident_per_sm(k1)) * sms,
                            cs_max >= 2 ? cap(cluster_capacity<2>(kc)) : 0,
                            cs_max >= 4 ? cap(cluster_capacity<4>(kc)) : 0,
                            cs_max >= 8 ? cap(cluster_capacity<8>(kc)) : 0,
                            cs_max >= 16 ? cap(cluster_capacity<16>(kc)) : 0};
    int cs_pos = pick_pos_splits(rows, p.V, int(sizeof(T)), res, cs_max);
    if (tuning_enabled()) {
      const char* f = getenv("TS_VERIFY_CS");
      if (f != nullptr && atoi(f) > 0) cs_pos = std::min(atoi(f), cs_max);
    }
    VerifyParams pp = p;
    pp.chunk = chunk_of(cs_pos);
    // Position-major order with skips (verify_pos_kernel): only where the grid leaves blocks
    // for a later wave (else every position runs at once and none can be skipped), and the
    // bs * W grid has no more than a quarter of empty rows (ragged).
    const int64_t vgrid = int64_t(p.bs) * (int64_t(p.max_n) + 1);
    int l = 0;   // res[] index of the size: log2 (a forced size is rounded down)
    while (l < 4 && (2 << l) <= cs_pos) ++l;
    bool pm = p.stop != nullptr && rows * cs_pos > res[l] && vgrid >= rows &&
              vgrid <= rows + rows / 4;
    if (tuning_enabled() && getenv("TS_VERIFY_NOSKIP") != nullptr) pm = false;
    if (pm) {
      e = cudaMemsetAsync(pp.stop, 0, size_t(p.bs) * sizeof(int32_t), stream);
      if (e != cudaSuccess) return e;
    } else {
      pp.stop = nullptr;
    }
    const int64_t grows = pm ? vgrid : rows;
    e = cs_pos > 1 ? launch_maybe_cluster(kc, true, cs_pos, grows * cs_pos, stream, pp)
                   : launch_maybe_cluster(k1, false, 1, grows, stream, pp);
    if (e != cudaSuccess) return e;
    p.chunk = pp.chunk;
    p.stop = nullptr;   // the later kernels do not use it
  }
  const int64_t res_r = int64_t(resident_per_sm(verify_resolve_kernel<T, VEC>)) * sms;
  const int64_t res_f = int64_t(resident_per_sm(verify_final_kernel<T, VEC>)) * sms;
  if (!two_pass) {
    // 2. exact sums of every request's deciding position, 3. the final token
    p.rsplits = pick_splits(p.bs, p.V, res_r, 128, 2048);
    p.rchunk = chunk_of(p.rsplits);
    verify_resolve_kernel<T, VEC><<<unsigned(int64_t(p.bs) * p.rsplits), kThreads, 0, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    ws.chunk = chunk_of(ws.splits);
    ws.mode = 0;
    verify_final_kernel<T, VEC><<<unsigned(int64_t(p.bs) * ws.splits), kThreads, 0, stream>>>(p, ws);
    return cudaGetLastError();
  }
  // 2. first final pass over every request
  ws.chunk = chunk_of(ws.splits);
  ws.mode = 1;
  verify_final_kernel<T, VEC><<<unsigned(int64_t(p.bs) * ws.splits), kThreads, 0, stream>>>(p, ws);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  // 3 + 4 fused (sm_90): one cluster per listed request, as large as can be scheduled
  if (TS_LISTED_FUSED && clusters && p.bs <= TS_LISTED_FUSED_MAX_BS) {
    auto kl = verify_listed_kernel<T, VEC>;
    const int cs = max_cluster(kl);   // (sets the non-portable attribute)
    const int cap = cs >= 16 ? cluster_capacity<16>(kl) : cluster_capacity<8>(kl);
    const int64_t nclusters = std::max<int64_t>(1, std::min<int64_t>(p.bs, cap / cs));
    ws.splits = cs;
    ws.chunk = chunk_of(cs);
    ws.mode = 2;
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = launch_config(nclusters * cs, unsigned(cs), stream, attr);
    return cudaLaunchKernelEx(&cfg, kl, p, ws);
  }
  // 3. exact sums, 4. second final pass: listed requests, split as if each were alone
  p.rsplits = pick_splits(1, p.V, res_r, 128, 2048);
  p.rchunk = chunk_of(p.rsplits);
  const int64_t gr = std::min<int64_t>(int64_t(p.bs) * p.rsplits, res_r);
  verify_resolve_kernel<T, VEC><<<unsigned(gr), kThreads, 0, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  ws.splits = pick_splits(1, p.V, res_f, 128, 2048);
  ws.chunk = chunk_of(ws.splits);
  ws.mode = 2;
  const int64_t gf = std::min<int64_t>(int64_t(p.bs) * ws.splits, res_f);
  verify_final_kernel<T, VEC><<<unsigned(gf), kThreads, 0, stream>>>(p, ws);
  return cudaGetLastError();
}
// tw: the radix thresholds' workspace (used when p.thr is set and kBisectThresholds is clear).
template <typename T>
inline cudaError_t launch_verify_probabilistic(VerifyParams p, int sms, bool clusters, FinalWs ws,
                                               const ThrWs& tw, bool vec_ok,
                                               cudaStream_t stream) {
  if (p.bs == 0) return cudaSuccess;
  p.cand = ws.cand;
  p.count = ws.count;
  if (ws.splits < 1) ws.splits = verify_final_splits<T>(p.bs, p.V, sms, vec_ok);
  constexpr int VEC = 16 / sizeof(T);
  return vec_ok ? launch_verify_probabilistic_v<T, VEC>(p, sms, clusters, ws, tw, stream)
                : launch_verify_probabilistic_v<T, 1>(p, sms, clusters, ws, tw, stream);
}

inline cudaError_t launch_verify_strict(const StrictParams& p, cudaStream_t stream) {
  if (p.bs == 0) return cudaSuccess;
  const unsigned blocks = unsigned((p.bs + 3) / 4);
  verify_strict_kernel<<<blocks, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tokenspeed_kernel::verify
