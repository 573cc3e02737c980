// Exact Gumbel-max sampling kernels (torch-free). See docs/DESIGN.md and
// python/tokenspeed_kernel/reference/sampling.py (the spec). Launch sequence (sampling_ops.cu):
//
//   partial<pass 0>  grid (splits, rows): per split of a row: max key, NaN/+inf flag, lse parts;
//                    PLAIN rows: Gumbel winner (pruned, exact); TOPK rows (k <= kTopKCap): the
//                    split's top-k candidate keys.
//   [generic rows: top-p without top-k, min-p without top-k, k > kTopKCap]
//   generic_init     grid rows: m, phase, zeroed histograms
//   level x 10       grid (splits, rows): radix select (12+11+11+11+11 bits of the 56-bit key)
//                    by count (top-k) then by fixed-point mass (top-p); last CTA decides. A level
//                    with few active keys also lists them; its last CTA then finishes the phase
//                    over the list (later launches of the phase return at once).
//   partial<pass 1>  Gumbel winner over {key >= thr} and min-p, kept exp-sum for logprobs
//   finalize         grid rows: merge partials; TOPK rows: exact top-k of the candidates, top-p
//                    on their fixed-point mass, min-p, Gumbel; write token / valid / logprobs.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstddef>
#include <cstdint>

#include "common/philox.cuh"
#include "common/softmath.cuh"

namespace tokenspeed_kernel::sampling {

constexpr int kThreads = 256;
constexpr int kGroupsPerThread = 4;                           // 4-element groups per iteration
constexpr int kTile = kThreads * kGroupsPerThread * 4;        // elements per CTA iteration
constexpr int kTopKCap = 256;                                 // top-k fast path bound
constexpr int kCandCap = 8192;                                // per-CTA candidate buffer
constexpr int kMergeCap = 16384;                              // finalize merge buffer (keys)
constexpr int kHistBins = 4096;

enum RowMode : int { kGreedy = 0, kPlain = 1, kTopK = 2, kGeneric = 3 };
// F_THRESHOLDS: the kept-set thresholds only (launch_levels as called by the verify family):
// every row with top-k or top-p takes the radix path (no top-k candidate fast path), min-p is
// left to the caller.
// F_NO_LIST (tests): the radix levels never compact (Workspace::list unused).
// F_NO_EXCL (tests / A-B): level 0 of a top-p row histograms every key (no excluded bins).
// F_EXCL_TEST (tests): level 0 excludes the bins below y = -2 (z = zmax - 2 T) instead of the
// proven bound, so the boundary often falls among them and the redo path runs.
enum Flags : int { F_TEMP = 1, F_TOPK = 2, F_TOPP = 4, F_MINP = 8, F_LOGPROBS = 16,
                   F_GENERIC = 32, F_THRESHOLDS = 64, F_NO_LIST = 128, F_NO_EXCL = 256,
                   F_EXCL_TEST = 512 };

struct Params {
  const void* logits;
  int64_t row_stride;     // elements
  int rows, vocab, tpr;   // tokens per request
  const float* temperature;
  const int* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seed;
  const int64_t* offset;
  int flags;
  int splits, chunk;      // chunk: elements per split (multiple of 8)
  int row0;               // first row of this launch (grid.y <= 65535 rows per launch)
  // F_THRESHOLDS callers only (the verify family; null / 0 for sampling):
  const int32_t* row_req; // request of each row (instead of row / tpr); < 0: no thresholds
  const void* logits2;    // rows >= rows1 are rows (row - rows1) of logits2 (stride row_stride2)
  int64_t row_stride2;
  int rows1;
  int64_t* thr_out;       // [rows] key56 threshold of each row (0: no top-k / top-p)
};

struct Partial {
  unsigned long long max56;  // max key56 of x
  unsigned long long best;   // (key32(score) << 32) | ~id : larger is better
  float zmax, zsum;          // raw logits: max and sum exp(z - zmax) (logprobs only)
  float xsum;                // pass 0: sum exp(x - xmax_split); pass 1: kept sum exp(x - m)
  unsigned int invalid;
  unsigned int count;        // TOPK: candidates written
};

struct RowState {
  unsigned long long prefix, lower, target, thr;   // key56 of the raw logits z
  int phase, level, mode;
  unsigned int nact;             // keys active at this level (prefix and >= lower), if known
  unsigned int arrive, ncand;    // arrival counter; keys appended to the row's list
  float m, L;                    // m: the raw row max zmax (masses of y = centered(z, m, 1/T))
  int noexcl;                    // level 0 of top-p: redo without excluded bins (level_decide)
};

struct Workspace {
  Partial* part;                 // [rows][splits] pass 0
  Partial* part1;                // [rows][splits] pass 1 (generic)
  unsigned long long* cand;      // [rows][splits][kTopKCap]
  RowState* state;               // [rows]
  unsigned int* hcnt;            // [rows][kHistBins]
  unsigned long long* hmass;     // [rows][kHistBins]
  unsigned long long* list;      // [rows][list_cap] a level's active keys (null: no compaction)
  int list_cap;
};

// ------------------------------------------------------------------------------------------
// per-row parameters
// ------------------------------------------------------------------------------------------
struct RowParams {
  float inv_t, top_p, min_p;
  int k;
  bool greedy, k_on, p_on, mp_on;
  uint64_t seed, offset;
  int mode;
};

__device__ __forceinline__ RowParams row_params(const Params& p, int row) {
  RowParams r;
  int q = row / p.tpr;
  if (p.row_req != nullptr) {
    q = p.row_req[row];
    if (q < 0) {   // a row without thresholds (F_THRESHOLDS callers)
      r.inv_t = 1.0f; r.top_p = 1.0f; r.min_p = 0.0f; r.k = 0;
      r.greedy = false; r.k_on = false; r.p_on = false; r.mp_on = false;
      r.seed = 0; r.offset = 0; r.mode = kPlain;
      return r;
    }
  }
  float t = (p.flags & F_TEMP) ? p.temperature[q] : 1.0f;
  r.greedy = !(t > 0.0f);
  r.inv_t = inv_temperature(t);
  r.k = (p.flags & F_TOPK) ? p.top_k[q] : 0;
  r.top_p = (p.flags & F_TOPP) ? p.top_p[q] : 1.0f;
  r.min_p = (p.flags & F_MINP) ? p.min_p[q] : 0.0f;
  r.k_on = r.k > 0 && r.k < p.vocab;
  r.p_on = r.top_p < 1.0f;
  r.mp_on = r.min_p > 0.0f;
  r.seed = p.seed ? uint64_t(p.seed[q]) : 0;
  r.offset = p.offset ? uint64_t(p.offset[q]) + uint64_t(row % p.tpr) : 0;
  if (r.greedy) r.mode = kGreedy;
  else if (r.k_on && r.k <= kTopKCap && !(p.flags & F_THRESHOLDS)) r.mode = kTopK;
  else if (r.k_on || r.p_on || r.mp_on) r.mode = kGeneric;
  else r.mode = kPlain;
  return r;
}

// ------------------------------------------------------------------------------------------
// loads: 4 consecutive elements as float
// ------------------------------------------------------------------------------------------
template <typename T> struct Vec4;
template <> struct Vec4<float> { using type = float4; };
template <> struct Vec4<__half> { using type = uint2; };
template <> struct Vec4<__nv_bfloat16> { using type = uint2; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ void load4(const T* row, int i, int vocab, bool aligned, float (&z)[4]) {
  if (aligned && i + 4 <= vocab) {
    typename Vec4<T>::type v = __ldg(reinterpret_cast<const typename Vec4<T>::type*>(row + i));
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) z[j] = to_f(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) z[j] = (i + j < vocab) ? to_f(row[i + j]) : __int_as_float(0xff800000);
  }
}

// ------------------------------------------------------------------------------------------
// block reductions
// ------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
__device__ __forceinline__ float warp_max_f(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// online (max, sum exp(. - max)) pair merge
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  float nm = fmaxf(m, m2);
  if (nm == -INFINITY) { m = nm; s = 0.0f; return; }
  s = s * __expf(m - nm) + s2 * __expf(m2 - nm);
  m = nm;
}
__device__ __forceinline__ void warp_lse(float& m, float& s) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
}

__device__ __forceinline__ unsigned long long pack_best(float score, uint32_t id) {
  return (uint64_t(key32(score)) << 32) | uint64_t(~id);
}
__device__ __forceinline__ uint32_t best_id(unsigned long long b) { return ~uint32_t(b); }

// Radix selection of the k-th largest among n unique 56-bit keys in shared memory.
// Returns thr such that exactly k keys satisfy key >= thr. All threads of the block call it.
__device__ inline unsigned long long block_select_kth(const unsigned long long* keys, int n, int k,
                                               unsigned int* hist /*256*/, unsigned long long* sh) {
  unsigned long long prefix = 0, pmask = 0;
  int remaining = k;
  const int tid = threadIdx.x;
  for (int shift = 48; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    // warp-aggregated increments: keys share few digits, so plain atomics would serialize
    for (int base = 0; base < n; base += blockDim.x) {
      const int i = base + tid;
      unsigned long long key = i < n ? keys[i] : 0;
      const bool act = i < n && (key & pmask) == prefix;
      const unsigned d = unsigned((key >> shift) & 255);
      const unsigned grp = __match_any_sync(0xffffffffu, act ? d : 256u + (tid & 31));
      if (act && (tid & 31) == __ffs(grp) - 1) atomicAdd(&hist[d], unsigned(__popc(grp)));
    }
    __syncthreads();
    if (tid < 32) {
      // lane l owns digits [255 - 8l - 7, 255 - 8l], scanned from the top
      unsigned int c[8], tot = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) { c[j] = hist[255 - 8 * tid - j]; tot += c[j]; }
      unsigned int incl = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        unsigned int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (tid >= o) incl += v;
      }
      unsigned int above = incl - tot;
      if (above < (unsigned)remaining && (unsigned)remaining <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (above < (unsigned)remaining && (unsigned)remaining <= above + c[j]) {
            sh[0] = 255 - 8 * tid - j;
            sh[1] = above;
            sh[2] = c[j];
          }
          above += c[j];
        }
      }
    }
    __syncthreads();
    unsigned long long d = sh[0], above = sh[1], cnt = sh[2];
    __syncthreads();
    prefix |= d << shift;
    pmask |= 255ull << shift;
    remaining -= int(above);
    if (cnt == (unsigned long long)remaining) break;   // whole bucket kept: thr = bucket floor
  }
  return prefix;
}

// Compact keys >= thr of keys[0..n) into out (order unspecified); returns the count (block-wide).
__device__ inline int block_compact(const unsigned long long* keys, int n, unsigned long long thr,
                             unsigned long long* out, unsigned int* counter) {
  if (threadIdx.x == 0) *counter = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    unsigned long long key = keys[i];
    if (key >= thr) out[atomicAdd(counter, 1u)] = key;
  }
  __syncthreads();
  int c = int(*counter);
  __syncthreads();
  return c;
}

// ------------------------------------------------------------------------------------------
// pass 0 / pass 1 partial kernel
// ------------------------------------------------------------------------------------------
struct PartialSmem {   // the TOPK buffers come last: rows without top-k allocate only the head
  unsigned long long sh[4];
  unsigned int count, counter;
  unsigned long long thr;
  unsigned long long red_u64[kThreads / 32];
  unsigned long long red_best[kThreads / 32];
  float red_f[kThreads / 32][5];
  unsigned int red_inv[kThreads / 32];
  unsigned int hist[256];
  unsigned long long kept[kTopKCap];
  unsigned long long buf[kCandCap];
};

// Kinds of the partial pass (uniform per CTA: one CTA covers one row's split)
enum Kind : int { kKindStats = 0, kKindPlain = 1, kKindTopK = 2, kKindGenericFinal = 3 };

struct SplitAcc {            // per-thread running summary
  uint32_t kmax, kid, kmin;  // max key32 (+ its first id), min key32 (negative NaN detection)
  float zmax, zsum, xmax, xsum;
  float best_s;
  uint32_t best_i;
};

template <typename T, int kKind, bool kLp>
__device__ __forceinline__ void partial_loop(const Params& p, const RowParams& rp, PartialSmem& sm,
                                             const T* rowp, int begin, int end, bool aligned,
                                             unsigned long long thr, float m, float L,
                                             SplitAcc& a) {
  const int lane = threadIdx.x & 31;
  float warp_thr = -INFINITY;   // pruning threshold: some token of this warp scores >= it
  for (int base = begin; base < end; base += kTile) {
    float z[kGroupsPerThread][4];
#pragma unroll
    for (int g = 0; g < kGroupsPerThread; ++g) {
      const int i = base + (g * kThreads + threadIdx.x) * 4;
      if (i < end) load4<T>(rowp, i, end, aligned, z[g]);
      else { z[g][0] = z[g][1] = z[g][2] = z[g][3] = -INFINITY; }
    }
    const unsigned long long thr_now = kKind == kKindTopK ? sm.thr : thr;
    const uint32_t thr_hi = uint32_t(thr_now >> 24);
    bool want_append = false;
#pragma unroll
    for (int g = 0; g < kGroupsPerThread; ++g) {
      const int i0 = base + (g * kThreads + threadIdx.x) * 4;
      float x[4];
      float gmax = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // out-of-range slots hold -inf: they never win, append or count as invalid
        x[j] = fmul(z[g][j], rp.inv_t);
        const uint32_t k = key32(x[j]);
        if (k > a.kmax) { a.kmax = k; a.kid = uint32_t(i0 + j); }
        a.kmin = min(a.kmin, k);
        gmax = fmaxf(gmax, x[j]);
        if (kLp && kKind != kKindGenericFinal) {
          const float zz = z[g][j];
          if (zz > a.zmax) { a.zsum = a.zsum * __expf(a.zmax - zz) + 1.0f; a.zmax = zz; }
          else if (zz > -INFINITY) a.zsum += __expf(zz - a.zmax);
          if (kKind == kKindPlain) {
            if (x[j] > a.xmax) { a.xsum = a.xsum * __expf(a.xmax - x[j]) + 1.0f; a.xmax = x[j]; }
            else if (x[j] > -INFINITY) a.xsum += __expf(x[j] - a.xmax);
          }
        }
        if (kKind == kKindTopK) want_append |= k >= thr_hi;
      }
      if (kKind == kKindPlain || kKind == kKindGenericFinal) {
        bool kept[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          kept[j] = x[j] > -INFINITY;
          if (kKind == kKindGenericFinal) {
            kept[j] = kept[j] && key56(key32(x[j]), uint32_t(i0 + j)) >= thr &&
                      (!rp.mp_on || fsub(x[j], m) >= L);
            if (kLp && kept[j]) a.xsum += __expf(x[j] - m);
          }
        }
        // a token can only win if x + 16.75 >= warp_thr (the largest Gumbel of the grid is 16.64)
        const bool any = (kept[0] || kept[1] || kept[2] || kept[3]) && (gmax + 16.75f >= warp_thr);
        bool cand = false;
        if (any) {
          const Philox4 r = philox_block(rp.seed, rp.offset, uint32_t(i0 >> 2), kStreamSample);
          const uint32_t bits[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (!kept[j] || x[j] + 16.75f < warp_thr) continue;
            // conservative test of G(u) >= d  <=>  u >= exp(-exp(-d)); exact scores decide
            const float d = warp_thr - x[j] - 0.01f;
            const float thr_u = __expf(-__expf(-d)) - 1e-5f;
            if (uniform_from_bits(bits[j]) >= thr_u) {
              const float s = fadd(x[j], gumbel_from_bits(bits[j]));
              const uint32_t id = uint32_t(i0 + j);
              if (better(s, id, a.best_s, a.best_i)) { a.best_s = s; a.best_i = id; }
              cand = true;
            }
          }
        }
        if (__any_sync(0xffffffffu, cand)) warp_thr = fmaxf(warp_thr, warp_max_f(a.best_s));
      }
    }
    if (kKind == kKindTopK) {
      // appends are rare once the threshold has risen: one vote per warp, details only if needed
      if (__any_sync(0xffffffffu, want_append)) {
#pragma unroll
        for (int g = 0; g < kGroupsPerThread; ++g) {
          const int i0 = base + (g * kThreads + threadIdx.x) * 4;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const unsigned long long k56 = key56(key32(fmul(z[g][j], rp.inv_t)), uint32_t(i0 + j));
            const bool app = z[g][j] > -INFINITY && k56 >= thr_now;
            const unsigned mask = __ballot_sync(0xffffffffu, app);
            if (mask) {
              const unsigned leader = __ffs(mask) - 1;
              unsigned pos = 0;
              if (lane == int(leader)) pos = atomicAdd(&sm.count, unsigned(__popc(mask)));
              pos = __shfl_sync(0xffffffffu, pos, leader);
              if (app) sm.buf[pos + __popc(mask & ((1u << lane) - 1))] = k56;
            }
          }
        }
      }
      {
        __syncthreads();
        const int n = int(sm.count);
        __syncthreads();   // everyone has read count before it changes
        // refresh the threshold (keep the current top-k) once the buffer holds a few times k;
        // always before it could overflow in the next tile
        const int trigger = min(kCandCap - kTile, max(4 * rp.k, 1024));
        if (n > trigger) {
          const unsigned long long t = block_select_kth(sm.buf, n, rp.k, sm.hist, sm.sh);
          const int c = block_compact(sm.buf, n, t, sm.kept, &sm.counter);
          for (int i = threadIdx.x; i < c; i += blockDim.x) sm.buf[i] = sm.kept[i];
          if (threadIdx.x == 0) { sm.count = c; sm.thr = t; }
          __syncthreads();
        }
      }
    }
  }
}

template <typename T, int kPass>
__global__ void __launch_bounds__(kThreads) partial_kernel(Params p, Workspace ws) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  PartialSmem& sm = *reinterpret_cast<PartialSmem*>(smem_raw);
  const int row = p.row0 + int(blockIdx.y), split = blockIdx.x;
  const RowParams rp = row_params(p, row);
  if (kPass == 1 && rp.mode != kGeneric) return;
  const int begin = split * p.chunk;
  const int end = min(begin + p.chunk, p.vocab);
  const T* rowp = reinterpret_cast<const T*>(p.logits) + int64_t(row) * p.row_stride;
  const bool aligned = (reinterpret_cast<uintptr_t>(rowp) % (4 * sizeof(T))) == 0;
  const bool want_lp = p.flags & F_LOGPROBS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  unsigned long long thr = 0;
  float m = 0.0f, L = -INFINITY;
  if (kPass == 1) {
    const RowState& st = ws.state[row];
    thr = st.thr;
    m = st.m;
    L = st.L;
  }
  const bool topk = (kPass == 0) && rp.mode == kTopK;
  if (topk && threadIdx.x == 0) { sm.count = 0; sm.thr = 0; }
  if (topk) __syncthreads();

  SplitAcc a;
  a.kmax = 0; a.kid = 0xffffffffu; a.kmin = 0xffffffffu;
  a.zmax = -INFINITY; a.zsum = 0.0f; a.xmax = -INFINITY; a.xsum = 0.0f;
  a.best_s = -INFINITY; a.best_i = 0xffffffffu;
#define TS_LOOP(K, LP) partial_loop<T, K, LP>(p, rp, sm, rowp, begin, end, aligned, thr, m, L, a)
  if (kPass == 1) { if (want_lp) TS_LOOP(kKindGenericFinal, true); else TS_LOOP(kKindGenericFinal, false); }
  else if (rp.mode == kPlain) { if (want_lp) TS_LOOP(kKindPlain, true); else TS_LOOP(kKindPlain, false); }
  else if (rp.mode == kTopK) { if (want_lp) TS_LOOP(kKindTopK, true); else TS_LOOP(kKindTopK, false); }
  else { if (want_lp) TS_LOOP(kKindStats, true); else TS_LOOP(kKindStats, false); }
#undef TS_LOOP

  // ---- block reduction of the split's summary ----
  const uint32_t kinf = key32(INFINITY), kninf = key32(-INFINITY);
  unsigned int invalid = (a.kmax >= kinf || a.kmin < kninf) ? 1u : 0u;   // NaN of either sign, +inf
  unsigned long long max56 = a.kid == 0xffffffffu ? 0ull : key56(a.kmax, a.kid);
  max56 = warp_max_u64(max56);
  unsigned long long bpack = (a.best_i == 0xffffffffu) ? 0ull : pack_best(a.best_s, a.best_i);
  bpack = warp_max_u64(bpack);
  invalid = __any_sync(0xffffffffu, invalid) ? 1u : 0u;
  if (want_lp) {
    warp_lse(a.zmax, a.zsum);
    if (kPass == 0) warp_lse(a.xmax, a.xsum); else a.xsum = warp_sum_f(a.xsum);
  }
  if (lane == 0) {
    sm.red_u64[warp] = max56; sm.red_best[warp] = bpack; sm.red_inv[warp] = invalid;
    sm.red_f[warp][0] = a.zmax; sm.red_f[warp][1] = a.zsum; sm.red_f[warp][2] = a.xmax;
    sm.red_f[warp][3] = a.xsum;
  }
  __syncthreads();
  if (topk) {
    int n = int(sm.count);
    unsigned long long* dst = ws.cand + (int64_t(row) * p.splits + split) * kTopKCap;
    if (n > rp.k) {
      const unsigned long long t = block_select_kth(sm.buf, n, rp.k, sm.hist, sm.sh);
      n = block_compact(sm.buf, n, t, sm.kept, &sm.counter);
      for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = sm.kept[i];
    } else {
      for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = sm.buf[i];
    }
    __syncthreads();
    if (threadIdx.x == 0) sm.count = n;
  }
  if (threadIdx.x == 0) {
    Partial out;
    out.max56 = 0; out.best = 0; out.invalid = 0;
    out.zmax = -INFINITY; out.zsum = 0.0f; out.xsum = 0.0f;
    float xm = -INFINITY;
    for (int w = 0; w < kThreads / 32; ++w) {
      out.max56 = sm.red_u64[w] > out.max56 ? sm.red_u64[w] : out.max56;
      out.best = sm.red_best[w] > out.best ? sm.red_best[w] : out.best;
      out.invalid |= sm.red_inv[w];
      if (want_lp) {
        lse_merge(out.zmax, out.zsum, sm.red_f[w][0], sm.red_f[w][1]);
        if (kPass == 0) lse_merge(xm, out.xsum, sm.red_f[w][2], sm.red_f[w][3]);
        else out.xsum += sm.red_f[w][3];
      }
    }
    if (kPass == 0 && want_lp && rp.mode == kPlain && xm > -INFINITY) {
      // rebase the processed sum to the split max (= value of max56)
      out.xsum = out.xsum * __expf(xm - key56_value(out.max56));
    }
    out.count = topk ? sm.count : 0;
    (kPass == 0 ? ws.part : ws.part1)[int64_t(row) * p.splits + split] = out;
  }
}

// ------------------------------------------------------------------------------------------
// generic path: init + radix levels
// ------------------------------------------------------------------------------------------
__device__ __forceinline__ int level_shift(int level) { return level == 0 ? 44 : 44 - 11 * level; }
__device__ __forceinline__ int level_bits(int level) { return level == 0 ? 12 : 11; }

// Rows of an F_THRESHOLDS call may come from a second tensor (Params::logits2).
template <typename T>
__device__ __forceinline__ const T* row_logits(const Params& p, int row) {
  if (p.logits2 != nullptr && row >= p.rows1)
    return reinterpret_cast<const T*>(p.logits2) + int64_t(row - p.rows1) * p.row_stride2;
  return reinterpret_cast<const T*>(p.logits) + int64_t(row) * p.row_stride;
}

// The global histograms (Workspace::hcnt / hmass) merge the splits of a row; with one split per
// row the CTA decides from its shared-memory histogram and they are not allocated.
// The levels' keys are key56 of the raw logits z and their masses mass_fixed(y) of the processed
// logits y = centered(z, zmax, 1/T) (docs/DESIGN.md): pass 0's Partial::max56 must be the max
// key of z (its value is zmax, RowState::m).
// Rows whose logits are invalid (NaN, +inf, no finite value: pass 0's flag and max) get no
// threshold (phase 2, thr 0): their token is decided by the invalid-row rule, and a total mass
// of 0 would leave the boundary search without a bucket.
template <int kUnused = 0>
__global__ void generic_init_kernel(Params p, Workspace ws) {
  const int row = blockIdx.x;
  const RowParams rp = row_params(p, row);
  if (rp.mode != kGeneric) {
    if (p.thr_out != nullptr && threadIdx.x == 0) p.thr_out[row] = 0;
    return;
  }
  if (p.splits > 1)
    for (int i = threadIdx.x; i < kHistBins; i += blockDim.x) {
      ws.hcnt[int64_t(row) * kHistBins + i] = 0;
      ws.hmass[int64_t(row) * kHistBins + i] = 0;
    }
  unsigned long long mx = 0;
  unsigned int inv = 0;
  if (threadIdx.x < 32) {
    for (int s = threadIdx.x; s < p.splits; s += 32) {
      const Partial& pt = ws.part[int64_t(row) * p.splits + s];
      mx = pt.max56 > mx ? pt.max56 : mx;
      inv |= pt.invalid;
    }
    mx = warp_max_u64(mx);
    inv = __any_sync(0xffffffffu, inv != 0) ? 1u : 0u;
  }
  if (threadIdx.x == 0) {
    RowState st;
    st.m = key56_value(mx);
    st.L = rp.mp_on ? soft_ln(rp.min_p) : -INFINITY;
    st.prefix = 0; st.lower = 0; st.thr = 0; st.level = 0; st.arrive = 0; st.mode = kGeneric;
    st.nact = unsigned(p.vocab); st.ncand = 0;   // level 0: every key is active
    st.noexcl = 0;
    if (inv || !(st.m > -INFINITY)) { st.phase = 2; st.target = 0; }
    else if (rp.k_on) { st.phase = 0; st.target = uint64_t(rp.k); }
    else if (rp.p_on) { st.phase = 1; st.target = 0; }
    else { st.phase = 2; st.target = 0; }
    ws.state[row] = st;
    if (p.thr_out != nullptr && st.phase == 2) p.thr_out[row] = 0;
  }
}

struct LevelSmem {
  unsigned int cnt[kHistBins];
  unsigned long long mass[kHistBins];
  unsigned int last, ncand;
  unsigned long long sh[4];
  unsigned long long wsum[kThreads / 32];
  unsigned int wcnt[kThreads / 32];
  RowState st;
  unsigned long long q[kThreads / 32][64];   // level 0 with excluded bins: each warp's queue
};

// Exact 64-bit add to shared memory from two native 32-bit atomics (a 64-bit shared atomicAdd is
// a compare-and-swap loop on sm_90: ATOMS.CAST.SPIN.64). The low word's wrap-arounds are carried
// into the high word by the adder that caused them, so after a barrier the pair holds the exact
// sum (mod 2^64). Every access to *a between barriers must go through this function.
__device__ __forceinline__ void smem_add_u64(unsigned long long* a, unsigned long long v) {
  unsigned int* w = reinterpret_cast<unsigned int*>(a);   // little-endian: w[0] low, w[1] high
  const unsigned int lo = unsigned(v), hi = unsigned(v >> 32);
  const unsigned int old = atomicAdd(w, lo);
  const unsigned int h = hi + (old + lo < old ? 1u : 0u);
  if (h) atomicAdd(w + 1, h);
}

// One radix level's decision over the row's histogram (sm.cnt / sm.mass, nb bins) and state
// sm.st: the boundary bucket, then the next state (written to sm.st by thread 0). Block-wide.
// excl_bin > 0 (level 0 of a top-p row, level_kernel): the bins below excl_bin were not
// histogrammed, their whole mass sits in bin 0; the decision stands only if the boundary bucket
// is >= excl_bin (the bins from there up are exact), else level 0 runs again in full.
__device__ inline void level_decide(LevelSmem& sm, const RowParams& rp, int nb,
                                    unsigned excl_bin = 0) {
  const int level = sm.st.level, phase = sm.st.phase;
  const int shift = level_shift(level);
  const unsigned long long prefix = sm.st.prefix, lower = sm.st.lower;
  unsigned long long target = sm.st.target;
  // the boundary search below always finds a bucket (valid rows: target <= the total count or
  // mass); zeroed anyway, so that a bucket index is never read uninitialized
  if (threadIdx.x == 0) { sm.sh[0] = 0; sm.sh[1] = 0; }
  __syncthreads();
  if (phase == 1 && level == 0) {
    // S = total mass of the eligible set (the top-k set, or the row): P' = max(1, trunc(p*S))
    unsigned long long s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += sm.mass[i];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sm.wsum[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long tot = 0;
      for (int w = 0; w < kThreads / 32; ++w) tot += sm.wsum[w];
      sm.sh[3] = (unsigned long long)top_p_limit(rp.top_p, int64_t(tot));
    }
    __syncthreads();
    target = sm.sh[3];
  }
  // parallel search from the top digit: the first bucket whose inclusive sum reaches target
  if (phase == 0)
    for (int i = threadIdx.x; i < nb; i += blockDim.x) sm.mass[i] = sm.cnt[i];
  __syncthreads();
  {
    const int seg = nb / kThreads, t = threadIdx.x;
    unsigned long long tot = 0;
    for (int j = 0; j < seg; ++j) tot += sm.mass[nb - 1 - (t * seg + j)];
    unsigned long long incl = tot;
    for (int o = 1; o < 32; o <<= 1) {
      unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
      if ((t & 31) >= o) incl += v;
    }
    if ((t & 31) == 31) sm.wsum[t >> 5] = incl;
    __syncthreads();
    unsigned long long wbase = 0;
    for (int w = 0; w < (t >> 5); ++w) wbase += sm.wsum[w];
    incl += wbase;
    unsigned long long a = incl - tot;
    if (a < target && target <= incl) {
      for (int j = 0; j < seg; ++j) {
        int dd = nb - 1 - (t * seg + j);
        unsigned long long v = sm.mass[dd];
        if (v > 0 && a + v >= target) { sm.sh[0] = dd; sm.sh[1] = a; break; }
        a += v;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int d = int(sm.sh[0]);
    unsigned long long above = sm.sh[1];
    unsigned long long np = prefix | (uint64_t(d) << shift);
    unsigned long long remaining = target - above;
    bool done = (level == 4) || (phase == 0 ? sm.cnt[d] == remaining : sm.cnt[d] == 1);
    RowState st = sm.st;
    st.arrive = 0;
    st.ncand = 0;
    if (unsigned(d) < excl_bin) {
      st.noexcl = 1;   // the boundary lies among the excluded bins: the same level 0, every key
    } else if (!done) {
      // the next level's active keys are exactly this bucket's (counted: key >= lower)
      st.prefix = np; st.level = level + 1; st.target = remaining; st.nact = sm.cnt[d];
    } else {
      // phase 1 counts only keys >= lower (the top-k threshold): a bucket it stops at early may
      // also hold keys below lower, so the kept set is key >= max(np, lower) (phase 0: lower 0)
      st.thr = np > lower ? np : lower;
      if (phase == 0 && rp.p_on) {
        // exactly k keys are >= np (unique keys): phase 1's level 0 has k active keys
        st.phase = 1; st.lower = np; st.prefix = 0; st.level = 0; st.target = 0;
        st.nact = unsigned(rp.k);
      } else {
        st.phase = 2;
      }
    }
    sm.st = st;
  }
  __syncthreads();
}

// The level scans' batch: U vectors of 4 per thread (elements b0 + (u * kThreads + tid) * 4,
// -inf past end), all loads issued before any is used.
template <typename T, int U>
__device__ __forceinline__ void load_batch(const T* rowp, int b0, int end, bool aligned,
                                           float (&z)[U][4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i0 = b0 + (u * kThreads + threadIdx.x) * 4;
    z[u][0] = z[u][1] = z[u][2] = z[u][3] = -INFINITY;
    if (i0 < end) load4<T>(rowp, i0, end, aligned, z[u]);
  }
}

// Level 0 of a top-p row without top-k: the keys of bins below excl_bin lie below the top-p
// boundary, so only their total mass matters (it goes to bin 0, level_decide). The cut is
// y < ln(1 - p) - ln(V) - 1, taken to the keys' z as z < zmax + (ln(1 - p) - ln(V) - 1) / invT
// (a bin below the cut's bin holds only z below that float; up to its rounding, by at most half
// an ulp of zmax, their y lie below the y cut): an excluded key's mass is then below
// 2^38 (1 - p) / (e V), all V of them hold less than (1 - p) 2^38 / e <= (1 - p) S / e < S - P'
// (the max key alone has mass 2^38 <= S; P' = trunc(p S)), so the boundary bucket is at or above
// the cut's bin. Nothing relies on that: level_decide checks it and has level 0 redone in full
// otherwise (the cut only has to be a good guess: a top-p row without top-k needs at most 5 of
// the 10 launches, 6 with the redo). 0 = no excluded bins. m: zmax; test: the cut at y = -2
// (forces redos).
__device__ __forceinline__ unsigned level0_excl_bin(float m, float inv_t, float top_p, int vocab,
                                                    bool test) {
  const float ycut = test ? -2.0f : logf(1.0f - top_p) - logf(float(vocab)) - 1.0f;
  const float cut = m + ycut / inv_t;   // inv_t = +inf: the cut at zmax (y = -inf below it)
  if (!(cut > -INFINITY)) return 0u;
  return key32(cut) >> 20;   // the level-0 digit (top 12 bits of key56 = of key32)
}

// Histogram cnt keys q[0..cnt) (cnt <= 32, warp-uniform) of one warp's level-0 queue: a warp
// match per 32 keys instead of one per 4 elements; on a list, append them (warp-aggregated).
__device__ __forceinline__ void level0_flush(LevelSmem& sm, const unsigned long long* q, int cnt,
                                             float m, float inv_t, unsigned long long* list,
                                             int list_cap, unsigned int* ncand) {
  const int lane = threadIdx.x & 31;
  const bool v = lane < cnt;
  const unsigned long long k = v ? q[lane] : 0ull;
  const unsigned d = unsigned(k >> 44);
  const unsigned grp = __match_any_sync(0xffffffffu, v ? d : 0x10000u + lane);
  if (v && lane == __ffs(grp) - 1) atomicAdd(&sm.cnt[d], unsigned(__popc(grp)));
  if (v) {   // key56_value gives back z (-0 as +0: the same y up to the sign of a zero)
    const int64_t e = mass_fixed_nonpos(centered(key56_value(k), m, inv_t));
    if (e) smem_add_u64(&sm.mass[d], (unsigned long long)e);
  }
  if (list != nullptr) {
    unsigned pos = 0;
    if (lane == 0) pos = atomicAdd(ncand, unsigned(cnt));
    pos = __shfl_sync(0xffffffffu, pos, 0) + unsigned(lane);
    if (v && pos < unsigned(list_cap)) list[pos] = k;
  }
}

// One radix level of every generic row: grid (splits, rows). Each CTA histograms its split's
// active keys (key >= lower, matching the prefix) by the level's digit, with counts (top-k
// phase 0) and fixed-point masses (top-p phase 1); the last CTA of the row merges (global
// histograms, splits > 1) and decides the boundary bucket (level_decide).
// Compaction: when the state says the level has at most list_cap active keys (nact: the bucket
// count of the previous level; k at the start of a top-p phase after top-k; V at level 0), the
// CTAs also append them to the row's list, and the last CTA, once the list holds every active
// key (ncand == nact), runs the phase's remaining levels itself over the list (same histograms,
// same decisions: the same thresholds), so the later launches find the row finished and return.
// Without it a top-p row reads the row 5 times, top-k + top-p up to 10.
template <typename T, int U>
__global__ void __launch_bounds__(kThreads, 4) level_kernel(Params p, Workspace ws) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  LevelSmem& sm = *reinterpret_cast<LevelSmem*>(smem_raw);
  const int row = p.row0 + int(blockIdx.y), split = blockIdx.x;
  RowState* stp = ws.state + row;
  const RowParams rp = row_params(p, row);
  if (rp.mode != kGeneric) return;
  const int phase = stp->phase;
  if (phase == 2) return;
  const int level = stp->level;
  const unsigned long long prefix = stp->prefix, lower = stp->lower;
  const unsigned int nact = stp->nact;
  const int shift = level_shift(level), bits = level_bits(level);
  const unsigned long long pmask = level == 0 ? 0ull : (~0ull << (shift + bits)) & ((1ull << 56) - 1);
  const float m = stp->m;   // zmax
  const int nb = 1 << bits;
  unsigned long long* list = (ws.list != nullptr && !(p.flags & F_NO_LIST))
                                 ? ws.list + int64_t(row) * ws.list_cap : nullptr;
  const bool compact = list != nullptr && nact <= unsigned(ws.list_cap);
  // level 0 of a top-p row without top-k: excluded bins (level0_excl_bin); their keys are only
  // summed (xacc), the others queue per warp (qn, warp-uniform) and are histogrammed 32 at a
  // time, and listed: if they fit the list, this level's last CTA finishes the phase over it
  const unsigned excl_bin =
      (phase == 1 && level == 0 && lower == 0 && !rp.k_on && !compact && !stp->noexcl &&
       !(p.flags & F_NO_EXCL))
          ? level0_excl_bin(m, rp.inv_t, rp.top_p, p.vocab, (p.flags & F_EXCL_TEST) != 0) : 0u;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) { sm.cnt[i] = 0; sm.mass[i] = 0; }
  __syncthreads();

  const int begin = split * p.chunk, end = min(begin + p.chunk, p.vocab);
  const T* rowp = row_logits<T>(p, row);
  const bool aligned = (reinterpret_cast<uintptr_t>(rowp) % (4 * sizeof(T))) == 0;
  const int lane = threadIdx.x & 31;
  // Float pretest of "active": key >= lower and key & pmask == prefix put key32(z) in
  // [lo56 >> 24, hi56 >> 24], and key32 is monotone (-0 as +0), so z lies in [xlo, xhi] (bounds
  // that are NaN patterns widen to -inf / +inf; rows with NaN never reach the levels). A superset
  // of the active keys; only elements that pass it build their 64-bit key and take the exact test.
  const unsigned long long lo56 = prefix > lower ? prefix : lower;
  const unsigned long long hi56 = prefix | (~pmask & ((1ull << 56) - 1));
  float xlo = key32_to_float(uint32_t(lo56 >> 24)), xhi = key32_to_float(uint32_t(hi56 >> 24));
  if (xlo != xlo) xlo = -INFINITY;
  if (xhi != xhi) xhi = INFINITY;
  if (excl_bin) {
    // Level 0 with excluded bins (every key is active: lower = 0, no prefix). A loop of its own,
    // so that the general scan below compiles as before. The 4 masses of a vector first,
    // branch-free (y <= 0, or -inf past end), so that their chains interleave.
    unsigned long long xacc = 0;
    int qn = 0;   // warp-uniform
    unsigned long long* wq = sm.q[threadIdx.x >> 5];
    for (int b0 = begin; b0 < end; b0 += kThreads * 4 * U) {
      float z[U][4];
      load_batch<T, U>(rowp, b0, end, aligned, z);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i0 = b0 + (u * kThreads + threadIdx.x) * 4;
        unsigned long long es[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          es[j] = (unsigned long long)mass_fixed_nonpos(centered(z[u][j], m, rp.inv_t));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool in = i0 + j < end;
          const uint32_t k32 = key32(z[u][j]);
          const bool cand = in && (k32 >> 20) >= excl_bin;
          if (in && !cand) xacc += es[j];
          const unsigned bal = __ballot_sync(0xffffffffu, cand);
          if (cand) wq[qn + __popc(bal & ((1u << lane) - 1u))] = key56(k32, uint32_t(i0 + j));
          qn += __popc(bal);
          if (qn >= 32) {
            __syncwarp();
            level0_flush(sm, wq + (qn - 32), 32, m, rp.inv_t, list, ws.list_cap, &stp->ncand);
            qn -= 32;
            __syncwarp();
          }
        }
      }
    }
    __syncwarp();
    if (qn) level0_flush(sm, wq, qn, m, rp.inv_t, list, ws.list_cap, &stp->ncand);
    for (int o = 16; o; o >>= 1) xacc += __shfl_xor_sync(0xffffffffu, xacc, o);
    if (lane == 0 && xacc) smem_add_u64(&sm.mass[0], xacc);
  } else {
  // U vectors of 4 per thread and iteration, all loaded before any is used (loads in flight)
  for (int b0 = begin; b0 < end; b0 += kThreads * 4 * U) {
    float z[U][4];
    load_batch<T, U>(rowp, b0, end, aligned, z);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i0 = b0 + (u * kThreads + threadIdx.x) * 4;
      bool pre = false;
#pragma unroll
      for (int j = 0; j < 4; ++j) pre |= z[u][j] >= xlo && z[u][j] <= xhi;
      // after level 0 (and in phase 1 after a top-k) few elements match the prefix: warps with
      // none skip the keys, the match and the atomics (the loop is uniform over the block)
      if (!__any_sync(0xffffffffu, pre)) continue;
      unsigned long long k[4];
      bool act[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        k[j] = key56(key32(z[u][j]), uint32_t(i0 + j));
        act[j] = (i0 + j < end) && k[j] >= lower && (k[j] & pmask) == prefix;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (!__any_sync(0xffffffffu, act[j])) continue;
        const unsigned d = unsigned((k[j] >> shift) & uint64_t(nb - 1));
        const unsigned grp = __match_any_sync(0xffffffffu, act[j] ? d : 0x10000u + lane);
        if (act[j] && lane == __ffs(grp) - 1) atomicAdd(&sm.cnt[d], unsigned(__popc(grp)));
        if (act[j] && phase == 1) {
          int64_t e = mass_fixed(centered(z[u][j], m, rp.inv_t));
          if (e) smem_add_u64(&sm.mass[d], (unsigned long long)e);
        }
        if (compact) {   // warp-aggregated append (positions past list_cap: counted, not written)
          const unsigned am = __ballot_sync(0xffffffffu, act[j]);
          const int leader = __ffs(am) - 1;
          unsigned pos = 0;
          if (lane == leader) pos = atomicAdd(&stp->ncand, unsigned(__popc(am)));
          pos = __shfl_sync(0xffffffffu, pos, leader) + __popc(am & ((1u << lane) - 1u));
          if (act[j] && pos < unsigned(ws.list_cap)) list[pos] = k[j];
        }
      }
    }
  }
  }   // scans
  __syncthreads();
  if (p.splits > 1) {
    unsigned int* gcnt = ws.hcnt + int64_t(row) * kHistBins;
    unsigned long long* gmass = ws.hmass + int64_t(row) * kHistBins;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
      if (sm.cnt[i]) atomicAdd(&gcnt[i], sm.cnt[i]);
      if (sm.mass[i]) atomicAdd(&gmass[i], sm.mass[i]);
    }
    __threadfence();   // also publishes this CTA's list entries
    __syncthreads();
    if (threadIdx.x == 0) sm.last = (atomicAdd(&stp->arrive, 1u) == unsigned(p.splits - 1));
    __syncthreads();
    if (!sm.last) return;
    __threadfence();
    // ---- last CTA of the row: decide the boundary bucket ----
    // load global histogram into shared (volatile-free: after the fence, use atomics-free loads)
#pragma unroll 8
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
      sm.cnt[i] = __ldcg(&gcnt[i]);
      sm.mass[i] = __ldcg(&gmass[i]);
    }
    for (int i = threadIdx.x; i < nb; i += blockDim.x) { gcnt[i] = 0; gmass[i] = 0; }
  }   // one split: the CTA's own histogram is the row's
  if (threadIdx.x == 0) {
    sm.st = *stp;   // fields other than arrive / ncand are not written during a launch
    sm.ncand = __ldcg(&stp->ncand);
  }
  __syncthreads();
  level_decide(sm, rp, nb, excl_bin);
  // the row's list holds every active key of this level (compact), or every key of the bins
  // >= excl_bin, among them the boundary bucket's (a redo leaves the level at 0: no loop):
  // the phase's later levels run here
  if (compact ? sm.ncand == nact
              : (excl_bin && list != nullptr && sm.ncand <= unsigned(ws.list_cap))) {
    const int n = int(sm.ncand);
    int lv = level;
    while (sm.st.phase == phase && sm.st.level == lv + 1) {
      lv = sm.st.level;
      const int sh2 = level_shift(lv), nb2 = 1 << level_bits(lv);
      const unsigned long long pre2 = sm.st.prefix, low2 = sm.st.lower;
      const unsigned long long pm2 = (~0ull << (sh2 + level_bits(lv))) & ((1ull << 56) - 1);
      for (int i = threadIdx.x; i < nb2; i += blockDim.x) { sm.cnt[i] = 0; sm.mass[i] = 0; }
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const unsigned long long k = __ldcg(list + i);
        if (k < low2 || (k & pm2) != pre2) continue;
        const unsigned d = unsigned((k >> sh2) & uint64_t(nb2 - 1));
        atomicAdd(&sm.cnt[d], 1u);
        if (phase == 1) {   // key56_value gives back z (-0 as +0: the same y)
          const int64_t e = mass_fixed(centered(key56_value(k), m, rp.inv_t));
          if (e) smem_add_u64(&sm.mass[d], (unsigned long long)e);
        }
      }
      __syncthreads();
      level_decide(sm, rp, nb2);
    }
  }
  if (threadIdx.x == 0) {
    RowState st = sm.st;
    st.arrive = 0;
    st.ncand = 0;
    *stp = st;
    if (st.phase == 2 && p.thr_out != nullptr) p.thr_out[row] = int64_t(st.thr);
    __threadfence();
  }
}

// ------------------------------------------------------------------------------------------
// finalize: one CTA per row
// ------------------------------------------------------------------------------------------
struct FinalSmem {     // TOPK buffers last (see PartialSmem)
  unsigned long long sh[4];
  unsigned int counter;
  unsigned long long red[kThreads / 32];
  float redf[kThreads / 32];
  unsigned int hist[256];
  unsigned long long kept[kTopKCap];
  long long mass[kTopKCap];
  unsigned long long buf[kMergeCap];
};

template <typename T, typename TokT>
__global__ void __launch_bounds__(kThreads) finalize_kernel(Params p, Workspace ws, TokT* tokens,
                                                           bool* valid, float* logprobs,
                                                           float* plogprobs) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  FinalSmem& sm = *reinterpret_cast<FinalSmem*>(smem_raw);
  const int row = blockIdx.x;
  const RowParams rp = row_params(p, row);
  const bool want_lp = p.flags & F_LOGPROBS;
  const Partial* part = ws.part + int64_t(row) * p.splits;
  // merge split summaries: warp 0, one split per lane (independent loads in flight)
  __shared__ unsigned long long s_max56, s_best;
  __shared__ unsigned int s_invalid;
  __shared__ float s_zmax, s_zsum, s_xsum;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const bool generic_row = rp.mode == kGeneric;
    const Partial* p1 = ws.part1 + int64_t(row) * p.splits;
    unsigned long long mx = 0, bb = 0;
    unsigned int inv = 0;
    float zm = -INFINITY, zs = 0.0f, xm = -INFINITY, xs = 0.0f;
    for (int s = lane; s < p.splits; s += 32) {
      const Partial q = part[s];
      mx = q.max56 > mx ? q.max56 : mx;
      inv |= q.invalid;
      if (want_lp) lse_merge(zm, zs, q.zmax, q.zsum);
      if (!generic_row) {
        bb = q.best > bb ? q.best : bb;
        if (want_lp && rp.mode == kPlain && q.max56) lse_merge(xm, xs, key56_value(q.max56), q.xsum);
      } else if (p.flags & F_GENERIC) {
        const Partial q1 = p1[s];
        bb = q1.best > bb ? q1.best : bb;
        xs += q1.xsum;
      }
    }
    mx = warp_max_u64(mx);
    bb = warp_max_u64(bb);
    inv = __any_sync(0xffffffffu, inv) ? 1u : 0u;
    if (want_lp) {
      warp_lse(zm, zs);
      if (generic_row) xs = warp_sum_f(xs);
      else if (rp.mode == kPlain) { warp_lse(xm, xs); xs = xs * __expf(xm - key56_value(mx)); }
    }
    // the caller promised no generic rows (top_k_max) but this row needs it: cannot sample exactly
    if (generic_row && !(p.flags & F_GENERIC)) inv = 1;
    if (lane == 0) {
      s_max56 = mx; s_best = bb; s_invalid = inv; s_zmax = zm; s_zsum = zs; s_xsum = xs;
    }
  }
  __syncthreads();
  const float m = key56_value(s_max56);
  uint32_t tok = 0;
  float kept_sum = s_xsum;   // sum over kept of exp(x - m)
  if (rp.mode == kTopK) {
    // gather candidates of all splits (splits <= kMergeCap / kTopKCap = 64)
    if (threadIdx.x < 32) {   // exclusive prefix of the split counts (splits <= 64)
      unsigned int c0 = threadIdx.x < p.splits ? part[threadIdx.x].count : 0u;
      unsigned int c1 = threadIdx.x + 32 < p.splits ? part[threadIdx.x + 32].count : 0u;
      unsigned int i0 = c0, i1 = c1;
      for (int o = 1; o < 32; o <<= 1) {
        unsigned int v0 = __shfl_up_sync(0xffffffffu, i0, o), v1 = __shfl_up_sync(0xffffffffu, i1, o);
        if (int(threadIdx.x) >= o) { i0 += v0; i1 += v1; }
      }
      const unsigned int t0 = __shfl_sync(0xffffffffu, i0, 31);
      sm.hist[threadIdx.x] = i0 - c0;
      sm.hist[threadIdx.x + 32] = t0 + i1 - c1;
      if (threadIdx.x == 31) sm.counter = t0 + i1;
    }
    __syncthreads();
    {
      // flat copy: every thread has several independent loads in flight
      const int total = int(sm.counter);
      const unsigned long long* cand = ws.cand + int64_t(row) * p.splits * kTopKCap;
#pragma unroll 4
      for (int f = threadIdx.x; f < total; f += kThreads) {
        int lo = 0, hi = p.splits - 1;          // split s with hist[s] <= f < hist[s+1]
        while (lo < hi) {
          const int mid = (lo + hi + 1) >> 1;
          if (int(sm.hist[mid]) <= f) lo = mid; else hi = mid - 1;
        }
        sm.buf[f] = cand[int64_t(lo) * kTopKCap + (f - int(sm.hist[lo]))];
      }
    }
    __syncthreads();
    int n = int(sm.counter);
    int k = rp.k < n ? rp.k : n;
    __syncthreads();
    if (n > k) {
      unsigned long long t = block_select_kth(sm.buf, n, k, sm.hist, sm.sh);
      n = block_compact(sm.buf, n, t, sm.kept, &sm.counter);
    } else {
      for (int i = threadIdx.x; i < n; i += blockDim.x) sm.kept[i] = sm.buf[i];
      __syncthreads();
    }
    // sort kept keys descending (bitonic over the next power of two >= n, padding with 0)
    int np2 = 1;
    while (np2 < n) np2 <<= 1;
    for (int i = threadIdx.x; i < kTopKCap; i += blockDim.x) if (i >= n) sm.kept[i] = 0;
    __syncthreads();
    for (int size = 2; size <= np2; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        int i = threadIdx.x;
        if (i < np2) {
          int j = i ^ stride;
          if (j > i) {
            unsigned long long a = sm.kept[i], b = sm.kept[j];
            bool desc = (i & size) == 0;
            if (desc ? (a < b) : (a > b)) { sm.kept[i] = b; sm.kept[j] = a; }
          }
        }
        __syncthreads();
      }
    }
    // fixed-point masses, exclusive prefix (n <= 256: one warp, 8 per lane)
    if (threadIdx.x < 32) {
      long long e[8], tot = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x * 8 + j;
        e[j] = i < n ? mass_fixed(fsub(key56_value(sm.kept[i]), m)) : 0;
        tot += e[j];
      }
      long long incl = tot;
      for (int o = 1; o < 32; o <<= 1) {
        long long v = __shfl_up_sync(0xffffffffu, incl, o);
        if (threadIdx.x >= o) incl += v;
      }
      long long total = __shfl_sync(0xffffffffu, incl, 31);
      long long lim = rp.p_on ? top_p_limit(rp.top_p, total) : 0;
      long long before = incl - tot;
      float L = rp.mp_on ? soft_ln(rp.min_p) : -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x * 8 + j;
        bool keep = i < n;
        if (rp.p_on) keep = keep && before < lim;
        if (rp.mp_on && keep) keep = fsub(key56_value(sm.kept[i]), m) >= L;
        sm.mass[i] = keep ? 1 : 0;
        before += e[j];
      }
    }
    __syncthreads();
    // Gumbel over the kept candidates
    float bs = -INFINITY, ks = 0.0f;
    uint32_t bi = 0xffffffffu;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (!sm.mass[i]) continue;
      uint32_t id = key56_id(sm.kept[i]);
      float x = key56_value(sm.kept[i]);
      float s = fadd(x, gumbel_from_bits(philox_word(rp.seed, rp.offset, id, kStreamSample)));
      if (better(s, id, bs, bi)) { bs = s; bi = id; }
      if (want_lp) ks += __expf(x - m);
    }
    unsigned long long pk = bi == 0xffffffffu ? 0ull : pack_best(bs, bi);
    pk = warp_max_u64(pk);
    ks = warp_sum_f(ks);
    if ((threadIdx.x & 31) == 0) { sm.red[threadIdx.x >> 5] = pk; sm.redf[threadIdx.x >> 5] = ks; }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long b = 0;
      float t = 0.0f;
      for (int w = 0; w < kThreads / 32; ++w) { b = sm.red[w] > b ? sm.red[w] : b; t += sm.redf[w]; }
      sm.sh[1] = b;
      sm.redf[0] = t;
    }
    __syncthreads();
    tok = best_id(sm.sh[1]);
    kept_sum = sm.redf[0];
  } else if (rp.mode == kGreedy) {
    tok = key56_id(s_max56);
  } else {
    tok = best_id(s_best);
  }
  if (threadIdx.x == 0) {
    bool ok = !s_invalid && s_max56 >= (uint64_t(key32(-INFINITY)) << 24) + (1ull << 24) &&
              tok < uint32_t(p.vocab);
    // (max key above that of -inf: at least one finite logit)
    if (!ok) tok = 0;
    tokens[row] = TokT(tok);
    valid[row] = ok;
    if (want_lp) {
      if (ok) {
        const T* rowp = reinterpret_cast<const T*>(p.logits) + int64_t(row) * p.row_stride;
        float z = to_f(rowp[tok]);
        logprobs[row] = z - (s_zmax + logf(s_zsum));
        float x = fmul(z, rp.inv_t);
        plogprobs[row] = rp.mode == kGreedy ? 0.0f : (x - m) - logf(kept_sum);
      } else {
        logprobs[row] = NAN;
        plogprobs[row] = NAN;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// host launcher
// ------------------------------------------------------------------------------------------
inline size_t partial_smem(bool topk) {
  return topk ? sizeof(PartialSmem) : offsetof(PartialSmem, hist);
}
inline size_t level_smem() { return sizeof(LevelSmem); }
inline size_t final_smem(bool topk) { return topk ? sizeof(FinalSmem) : offsetof(FinalSmem, hist); }

// splits per row: enough CTAs to fill the GPU, chunks of >= 2048 elements, and the TOPK merge
// buffer (splits * kTopKCap) must fit kMergeCap.
inline int choose_splits(int rows, int vocab, int num_sms) {
  int target = 4 * num_sms;   // CTAs of kThreads
  int by_rows = (target + rows - 1) / rows;
  int by_vocab = (vocab + 2047) / 2048;
  int s = by_rows < by_vocab ? by_rows : by_vocab;
  int cap = kMergeCap / kTopKCap;
  if (s > cap) s = cap;
  return s < 1 ? 1 : s;
}

// Kernels with a (split, row) grid run in launches of at most 65535 rows (grid.y limit).
template <typename F>
inline void for_row_blocks(const Params& p, F&& launch) {
  for (int r0 = 0; r0 < p.rows; r0 += 65535) {
    Params q = p;
    q.row0 = r0;
    launch(q, dim3(p.splits, min(65535, p.rows - r0)));
  }
}

// generic_init + the 10 radix levels (needs pass 0's Partial::max56 / invalid in ws.part).
// Vectors of 4 per thread per iteration of the level scan (one vector took 1.02-1.11x the
// levels' time in an A/B on an H100, docs/VERIFY.md).
constexpr int kLevelU = 4;

template <typename T>
cudaError_t launch_levels(const Params& p, const Workspace& ws, cudaStream_t stream) {
  static bool attr_set = false;   // per template instance (process-wide; attribute is per function)
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(
        level_kernel<T, kLevelU>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(level_smem()));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  generic_init_kernel<<<p.rows, 256, 0, stream>>>(p, ws);
  for (int l = 0; l < 10; ++l)
    for_row_blocks(p, [&](const Params& q, dim3 grid) {
      level_kernel<T, kLevelU><<<grid, kThreads, level_smem(), stream>>>(q, ws);
    });
  return cudaGetLastError();
}

// Workspace of the radix levels, shared by the sampler and the verify family: the row states,
// the split-merging histograms (splits > 1) and the compaction lists (level_kernel).
// List capacity: up to 4096 keys (32 KiB) per row, at most 64 MiB for the call; 0 (no
// compaction) where that leaves fewer than 256 keys per row (more than 32768 rows).
inline int level_list_cap(int64_t rows) {
  int64_t cap = 4096;
  while (cap >= 256 && rows * cap * 8 > (int64_t(64) << 20)) cap >>= 1;
  return cap >= 256 ? int(cap) : 0;
}
inline int64_t ws_align(int64_t b) { return (b + 255) / 256 * 256; }
inline int64_t level_ws_bytes(int64_t rows, int splits) {
  const int64_t hist = splits > 1 ? ws_align(rows * kHistBins * 4) + ws_align(rows * kHistBins * 8)
                                  : 0;
  return ws_align(rows * int64_t(sizeof(RowState))) + hist +
         ws_align(rows * int64_t(level_list_cap(rows)) * 8);
}
// Carves level_ws_bytes(rows, splits) bytes at base (256-byte aligned) into ws.
inline void level_ws_carve(uint8_t* base, int64_t rows, int splits, Workspace& ws) {
  ws.state = reinterpret_cast<RowState*>(base);
  base += ws_align(rows * int64_t(sizeof(RowState)));
  ws.hcnt = nullptr;
  ws.hmass = nullptr;
  if (splits > 1) {
    ws.hcnt = reinterpret_cast<unsigned int*>(base);
    base += ws_align(rows * kHistBins * 4);
    ws.hmass = reinterpret_cast<unsigned long long*>(base);
    base += ws_align(rows * kHistBins * 8);
  }
  ws.list_cap = level_list_cap(rows);
  ws.list = ws.list_cap > 0 ? reinterpret_cast<unsigned long long*>(base) : nullptr;
}

template <typename T, typename TokT>
cudaError_t launch_sample(Params p, Workspace ws, TokT* tokens, bool* valid, float* logprobs,
                          float* plogprobs, cudaStream_t stream) {
  static bool attr_set = false;   // per template instance (process-wide; attribute is per function)
  if (!attr_set) {
    cudaError_t e;
    if ((e = cudaFuncSetAttribute(partial_kernel<T, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(partial_smem(true)))) != cudaSuccess) return e;
    if ((e = cudaFuncSetAttribute(partial_kernel<T, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(partial_smem(true)))) != cudaSuccess) return e;
    if ((e = cudaFuncSetAttribute(finalize_kernel<T, TokT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(final_smem(true)))) != cudaSuccess) return e;
    attr_set = true;
  }
  const bool topk = p.flags & F_TOPK;
  for_row_blocks(p, [&](const Params& q, dim3 grid) {
    partial_kernel<T, 0><<<grid, kThreads, partial_smem(topk), stream>>>(q, ws);
  });
  if (p.flags & F_GENERIC) {
    const cudaError_t e = launch_levels<T>(p, ws, stream);
    if (e != cudaSuccess) return e;
    for_row_blocks(p, [&](const Params& q, dim3 grid) {
      partial_kernel<T, 1><<<grid, kThreads, partial_smem(false), stream>>>(q, ws);
    });
  }
  finalize_kernel<T, TokT><<<p.rows, kThreads, final_smem(topk), stream>>>(p, ws, tokens, valid,
                                                                      logprobs, plogprobs);
  return cudaGetLastError();
}

}  // namespace tokenspeed_kernel::sampling
