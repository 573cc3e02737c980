// Radix levels of the verify family's kept-set thresholds (torch-free). The sampler itself is
// csrc/sampling/sampler.cuh; these kernels are what verify (csrc/verify/verify.cuh) launches
// through launch_levels with F_THRESHOLDS, after its own pass that fills each row's Partial
// (max key, NaN / +inf flag):
//
//   generic_init     grid rows: zmax, phase, zeroed histograms
//   level x 10       grid (splits, rows): radix select (12+11+11+11+11 bits of the 56-bit key of
//                    the raw logit) by count (top-k) then by fixed-point mass of y (top-p); the
//                    last CTA of a row decides. A level with few active keys also lists them; its
//                    last CTA then finishes the phase over the list (later launches return).
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstddef>
#include <cstdint>

#include "common/philox.cuh"
#include "common/device.cuh"
#include "common/param_flags.h"
#include "common/softmath.cuh"

namespace tokenspeed_kernel::sampling {

constexpr int kThreads = 256;
constexpr int kGroupsPerThread = 4;                     // 4-element groups per iteration
constexpr int kTile = kThreads * kGroupsPerThread * 4;  // elements per CTA iteration
constexpr int kTopKCap = 256;                           // top-k fast path bound
constexpr int kCandCap = 8192;                          // per-CTA candidate buffer
constexpr int kMergeCap = 16384;                        // finalize merge buffer (keys)
constexpr int kHistBins = 4096;

enum RowMode : int { kGreedy = 0, kPlain = 1, kTopK = 2, kGeneric = 3 };
// F_THRESHOLDS: the kept-set thresholds only (launch_levels as called by the verify family):
// every row with top-k or top-p takes the radix path (no top-k candidate fast path), min-p is
// left to the caller.
// F_NO_LIST (tests): the radix levels never compact (Workspace::list unused).
// F_NO_EXCL (tests / A-B): level 0 of a top-p row histograms every key (no excluded bins).
// F_EXCL_TEST (tests): level 0 excludes the bins below y = -2 (z = zmax - 2 T) instead of the
// proven bound, so the boundary often falls among them and the redo path runs.
// (the request bits F_TEMP .. F_LOGPROBS: common/param_flags.h)
enum Flags : int {
  F_GENERIC = 32,
  F_THRESHOLDS = 64,
  F_NO_LIST = 128,
  F_NO_EXCL = 256,
  F_EXCL_TEST = 512
};

struct Params {
  const void* logits;
  int64_t row_stride;    // elements
  int rows, vocab, tpr;  // tokens per request
  const float* temperature;
  const int* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seed;
  const int64_t* offset;
  int flags;
  int splits, chunk;  // chunk: elements per split (multiple of 8)
  int row0;           // first row of this launch (grid.y <= 65535 rows per launch)
  // F_THRESHOLDS callers only (the verify family; null / 0 for sampling):
  const int32_t* row_req;  // request of each row (instead of row / tpr); < 0: no thresholds
  const void* logits2;     // rows >= rows1 are rows (row - rows1) of logits2 (stride row_stride2)
  int64_t row_stride2;
  int rows1;
  int64_t* thr_out;  // [rows] key56 threshold of each row (0: no top-k / top-p)
};

struct Partial {
  unsigned long long max56;  // max key56 of x
  unsigned long long best;   // (key32(score) << 32) | ~id : larger is better
  float zmax, zsum;          // raw logits: max and sum exp(z - zmax) (logprobs only)
  float xsum;                // pass 0: sum exp(x - xmax_split); pass 1: kept sum exp(x - m)
  unsigned int invalid;
  unsigned int count;  // TOPK: candidates written
};

struct RowState {
  unsigned long long prefix, lower, target, thr;  // key56 of the raw logits z
  int phase, level, mode;
  unsigned int nact;           // keys active at this level (prefix and >= lower), if known
  unsigned int arrive, ncand;  // arrival counter; keys appended to the row's list
  float m, L;                  // m: the raw row max zmax (masses of y = centered(z, m, 1/T))
  int noexcl;                  // level 0 of top-p: redo without excluded bins (level_decide)
};

struct Workspace {
  Partial* part;              // [rows][splits] pass 0
  Partial* part1;             // [rows][splits] pass 1 (generic)
  unsigned long long* cand;   // [rows][splits][kTopKCap]
  RowState* state;            // [rows]
  unsigned int* hcnt;         // [rows][kHistBins]
  unsigned long long* hmass;  // [rows][kHistBins]
  unsigned long long* list;   // [rows][list_cap] a level's active keys (null: no compaction)
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
    if (q < 0) {  // a row without thresholds (F_THRESHOLDS callers)
      r.inv_t = 1.0f;
      r.top_p = 1.0f;
      r.min_p = 0.0f;
      r.k = 0;
      r.greedy = false;
      r.k_on = false;
      r.p_on = false;
      r.mp_on = false;
      r.seed = 0;
      r.offset = 0;
      r.mode = kPlain;
      return r;
    }
  }
  float t = (p.flags & F_TEMP) ? p.temperature[q] : 1.0f;
  r.greedy = !(t > 0.0f);
  r.inv_t = inv_temperature(t);
  r.k = (p.flags & F_TOPK) ? p.top_k[q] : 0;
  r.top_p = (p.flags & F_TOPP) ? p.top_p[q] : 1.0f;
  r.min_p = (p.flags & F_MINP) ? p.min_p[q] : 0.0f;
  if (r.min_p > 1.0f) r.min_p = 1.0f;  // unvalidated min_p > 1: 1 (never an empty kept set)
  r.k_on = r.k > 0 && r.k < p.vocab;
  r.p_on = r.top_p < 1.0f;
  r.mp_on = r.min_p > 0.0f;
  r.seed = p.seed ? uint64_t(p.seed[q]) : 0;
  r.offset = p.offset ? uint64_t(p.offset[q]) + uint64_t(row % p.tpr) : 0;
  if (r.greedy)
    r.mode = kGreedy;
  else if (r.k_on && r.k <= kTopKCap && !(p.flags & F_THRESHOLDS))
    r.mode = kTopK;
  else if (r.k_on || r.p_on || r.mp_on)
    r.mode = kGeneric;
  else
    r.mode = kPlain;
  return r;
}

// ------------------------------------------------------------------------------------------
// loads: 4 consecutive elements as float
// ------------------------------------------------------------------------------------------
template <typename T>
struct Vec4;
template <>
struct Vec4<float> {
  using type = float4;
};
template <>
struct Vec4<__half> {
  using type = uint2;
};
template <>
struct Vec4<__nv_bfloat16> {
  using type = uint2;
};

template <typename T>
__device__ __forceinline__ void load4(const T* row, int i, int vocab, bool aligned, float (&z)[4]) {
  if (aligned && i + 4 <= vocab) {
    typename Vec4<T>::type v = __ldg(reinterpret_cast<const typename Vec4<T>::type*>(row + i));
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) z[j] = to_f(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      z[j] = (i + j < vocab) ? to_f(row[i + j]) : __int_as_float(0xff800000);
  }
}

// ------------------------------------------------------------------------------------------
// block reductions
// ------------------------------------------------------------------------------------------
// online (max, sum exp(. - max)) pair merge
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  float nm = fmaxf(m, m2);
  if (nm == -INFINITY) {
    m = nm;
    s = 0.0f;
    return;
  }
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
    st.prefix = 0;
    st.lower = 0;
    st.thr = 0;
    st.level = 0;
    st.arrive = 0;
    st.mode = kGeneric;
    st.nact = unsigned(p.vocab);
    st.ncand = 0;  // level 0: every key is active
    st.noexcl = 0;
    if (inv || !(st.m > -INFINITY)) {
      st.phase = 2;
      st.target = 0;
    } else if (rp.k_on) {
      st.phase = 0;
      st.target = uint64_t(rp.k);
    } else if (rp.p_on) {
      st.phase = 1;
      st.target = 0;
    } else {
      st.phase = 2;
      st.target = 0;
    }
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
  unsigned long long q[kThreads / 32][64];  // level 0 with excluded bins: each warp's queue
};

// Exact 64-bit add to shared memory from two native 32-bit atomics (a 64-bit shared atomicAdd is
// a compare-and-swap loop on sm_90: ATOMS.CAST.SPIN.64). The low word's wrap-arounds are carried
// into the high word by the adder that caused them, so after a barrier the pair holds the exact
// sum (mod 2^64). Every access to *a between barriers must go through this function.
__device__ __forceinline__ void smem_add_u64(unsigned long long* a, unsigned long long v) {
  unsigned int* w = reinterpret_cast<unsigned int*>(a);  // little-endian: w[0] low, w[1] high
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
  if (threadIdx.x == 0) {
    sm.sh[0] = 0;
    sm.sh[1] = 0;
  }
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
        if (v > 0 && a + v >= target) {
          sm.sh[0] = dd;
          sm.sh[1] = a;
          break;
        }
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
      st.noexcl = 1;  // the boundary lies among the excluded bins: the same level 0, every key
    } else if (!done) {
      // the next level's active keys are exactly this bucket's (counted: key >= lower)
      st.prefix = np;
      st.level = level + 1;
      st.target = remaining;
      st.nact = sm.cnt[d];
    } else {
      // phase 1 counts only keys >= lower (the top-k threshold): a bucket it stops at early may
      // also hold keys below lower, so the kept set is key >= max(np, lower) (phase 0: lower 0)
      st.thr = np > lower ? np : lower;
      if (phase == 0 && rp.p_on) {
        // exactly k keys are >= np (unique keys): phase 1's level 0 has k active keys
        st.phase = 1;
        st.lower = np;
        st.prefix = 0;
        st.level = 0;
        st.target = 0;
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
  const float cut = m + ycut / inv_t;  // inv_t = +inf: the cut at zmax (y = -inf below it)
  if (!(cut > -INFINITY)) return 0u;
  return key32(cut) >> 20;  // the level-0 digit (top 12 bits of key56 = of key32)
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
  if (v) {  // key56_value gives back z (-0 as +0: the same y up to the sign of a zero)
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
  const unsigned long long pmask =
      level == 0 ? 0ull : (~0ull << (shift + bits)) & ((1ull << 56) - 1);
  const float m = stp->m;  // zmax
  const int nb = 1 << bits;
  unsigned long long* list = (ws.list != nullptr && !(p.flags & F_NO_LIST))
                                 ? ws.list + int64_t(row) * ws.list_cap
                                 : nullptr;
  const bool compact = list != nullptr && nact <= unsigned(ws.list_cap);
  // level 0 of a top-p row without top-k: excluded bins (level0_excl_bin); their keys are only
  // summed (xacc), the others queue per warp (qn, warp-uniform) and are histogrammed 32 at a
  // time, and listed: if they fit the list, this level's last CTA finishes the phase over it
  const unsigned excl_bin =
      (phase == 1 && level == 0 && lower == 0 && !rp.k_on && !compact && !stp->noexcl &&
       !(p.flags & F_NO_EXCL))
          ? level0_excl_bin(m, rp.inv_t, rp.top_p, p.vocab, (p.flags & F_EXCL_TEST) != 0)
          : 0u;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    sm.cnt[i] = 0;
    sm.mass[i] = 0;
  }
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
    int qn = 0;  // warp-uniform
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
          if (compact) {  // warp-aggregated append (positions past list_cap: counted, not written)
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
  }  // scans
  __syncthreads();
  if (p.splits > 1) {
    unsigned int* gcnt = ws.hcnt + int64_t(row) * kHistBins;
    unsigned long long* gmass = ws.hmass + int64_t(row) * kHistBins;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
      if (sm.cnt[i]) atomicAdd(&gcnt[i], sm.cnt[i]);
      if (sm.mass[i]) atomicAdd(&gmass[i], sm.mass[i]);
    }
    __threadfence();  // also publishes this CTA's list entries
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
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
      gcnt[i] = 0;
      gmass[i] = 0;
    }
  }  // one split: the CTA's own histogram is the row's
  if (threadIdx.x == 0) {
    sm.st = *stp;  // fields other than arrive / ncand are not written during a launch
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
      for (int i = threadIdx.x; i < nb2; i += blockDim.x) {
        sm.cnt[i] = 0;
        sm.mass[i] = 0;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const unsigned long long k = __ldcg(list + i);
        if (k < low2 || (k & pm2) != pre2) continue;
        const unsigned d = unsigned((k >> sh2) & uint64_t(nb2 - 1));
        atomicAdd(&sm.cnt[d], 1u);
        if (phase == 1) {  // key56_value gives back z (-0 as +0: the same y)
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
// host launcher
// ------------------------------------------------------------------------------------------
inline size_t level_smem() { return sizeof(LevelSmem); }

// splits per row: enough CTAs to fill the GPU, chunks of >= 2048 elements, and the TOPK merge
// buffer (splits * kTopKCap) must fit kMergeCap.
inline int choose_splits(int rows, int vocab, int num_sms) {
  int target = 4 * num_sms;  // CTAs of kThreads
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
  static bool attr_set = false;  // per template instance (process-wide; attribute is per function)
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
  const int64_t hist =
      splits > 1 ? ws_align(rows * kHistBins * 4) + ws_align(rows * kHistBins * 8) : 0;
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

}  // namespace tokenspeed_kernel::sampling
