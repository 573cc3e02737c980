// Exact Gumbel-max sampling (torch-free): one cluster launch per call, or the split launch (two
// kernels, see launch_split) for small temperature / greedy batches. Contract: docs/DESIGN.md
// (randomness contract v2: scores fl32(y + G) with y = fl32(fl32(z - zmax) * fl32(1/T)) relative
// to the row max); spec: python/tokenspeed_kernel/reference/sampling.py.
//
// Grid: rows x cs CTAs of kThreads threads; the cs CTAs of a row form one thread-block cluster
// (cs = 1..16) and split the row into contiguous chunks. Cluster CTAs talk only by *pushing*
// into each other's shared memory and then meeting at a cluster barrier, so no CTA ever reads a
// peer's shared memory and any CTA may exit after its last barrier.
//
// Pass 1 (every row, one read of the logits): the CTA's max raw logit and its lowest id, the
// NaN / +inf flag, the raw (and for temperature-only rows the processed) log-sum-exp parts when
// logprobs are asked for, and by row mode:
//   PLAIN    (no filter), streamed: every element's approximate score h = z * (1/T) + G in
//            float64, the best and second-best per thread behind a conservative filter that skips
//            Philox and the exact noise for almost every element (see plain_vec). After the
//            cluster merge the winner is decided by the gap test (plain_gap_ok): a proven bound
//            on the difference between h and the contract's score fl32(y + G). Rare failures
//            (near-ties, |z / T| beyond ~1e10) run the exact pass.
//   PLAIN    resident (the chunk fits in shared memory): nothing; after the merge (zmax known)
//            the exact pass reads the chunk from shared memory with the max token's exact score
//            as the starting bar, so almost no element needs the exact noise.
//   PLAIN rows include min-p without top-k / top-p: the filter y >= L joins the exact pass, and
//            the streamed winner stands when it is kept (y >= L; logprobs: the exact pass).
//   CAND     (top-k with k <= kCandCap, or top-p without top-k): a bound th0 = the K-th
//            largest of the threads' maximum keys (key56 of the raw logit) over each thread's
//            first vectors, then every key >= th0 goes to a kCandBuf-key shared buffer; the CTA
//            selects its top K of the buffer (radix select) and pushes them to rank 0, which
//            selects the row's top K. A full buffer (dropped keys) is an overflow.
//   GENERIC  (top-k with k > kCandCap): nothing.
// Finish (rank 0) for CAND rows: the K candidates sorted by key (rank by counting), exact
// masses, top-p (top-p without top-k: the row's total mass S from one more pass), min-p, exact
// Gumbel over the kept candidates. Exact everywhere; falls back to the generic path when the
// candidates cannot hold the kept set (overflow; top-p / min-p kept sets that reach the K-th
// candidate and may still win).
// Generic path (all CTAs): cluster-wide radix selects over the row (8-bit digits of key56;
// counts for top-k, fixed-point masses for top-p), then the exact pass over the kept set.
// Exact pass: scores fl32(y + G) of the kept elements, a conservative filter against the
// thread's best exact score (or the max token's score), argmax with ties to the lowest id.
// Logits processing (Params::proc, sampling/processing.cuh): the kProc instantiations apply it
// in every read of the logits (for_each_vec through a ProcBody, the split launch's own loop, the
// token's logit for its logprob): z above is then the processed logit, except in the raw
// log-sum-exp that the raw logprobs use. Without processing the kernels are those of kProc =
// false, compiled exactly as before the processing existed.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/philox.cuh"
#include "common/device.cuh"
#include "common/param_flags.h"
#include "common/softmath.cuh"
#include "sampling/processing.cuh"

namespace tokenspeed_kernel::sampler {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kCandCap = 512;   // CAND rows: at most this many candidates (top-k fast path k)
constexpr int kCandBuf = 4096;  // CAND: a CTA's buffer of keys >= its bound (32 KB)
constexpr int kCandMinP = 256;  // candidates of min-p rows (their kept sets are small)
// CAND: the bound th0 comes from the chunk's head, its first max(kHeadElems, chunk / 4)
// elements (a multiple of 32), so that about K * chunk / head <= 4 K = 2048 keys are appended
// (K = 512 candidates; the buffer holds 4096)
constexpr int kHeadElems = 32768;
// rank 0's receive buffer per CTA of the cluster: K candidate keys, or a radix level's count,
// mass and min-key histograms (3 x 256)
constexpr int kCbufPerCta = 3 * 256 > kCandCap ? 3 * 256 : kCandCap;
constexpr int kMaxCluster = 16;
// F_WIDE_DEFER: rows a one-CTA-per-row launch may leave to the wider launch after it (one
// cluster each; the launch_wide comment says why)
constexpr int kWideSlots = 8;
constexpr int kUnroll = 4;  // 16-byte vectors in flight per thread and iteration
// A token whose y is below kDead never wins: y + G <= y + 16.6356 < -2.8144 < G_min = -2.8116
// <= the score of the max token (y = 0), which every filter keeps. Rounding is monotone.
constexpr float kDead = -19.5f;
constexpr float kGumbelHi = 16.64f;  // > max G = 16.6356
constexpr float kLog2e = 1.4426950408889634f;
constexpr double kLog2eD = 1.4426950408889634;
constexpr float kRel = 4.76837158203125e-07f;  // 2^-21: relative margin of the filters

// Flags shared with ops/sampling.py: the request bits F_TEMP .. F_LOGPROBS
// (common/param_flags.h), then F_FORCE_* / F_NO_RESIDENT: testing (every path against the
// reference); bits F_CS_SHIFT..+2: tuning, a forced cluster size 2^(v-1) (v = 0: the launcher's
// choice)
enum Flags : int {
  F_FORCE_GENERIC = 64,
  F_FORCE_EXACT = 128,
  F_NO_RESIDENT = 256,
  F_NO_SPLIT = 512,
  F_CS_SHIFT = 10,
  // launch-policy bits (ops/sampling.py _DEFAULT_LAUNCH_FLAGS sets the default ones):
  F_SCAND_PROC = 8192,     // calls with processing may take the split-candidates launch
  F_SCAND_BAND = 16384,    // its k-off rows: band masses (top-p), streamed gap test (temperature)
  F_SCAND_TOPP = 32768,    // top-p calls without a top-k tensor take it too (opt-in; implies BAND)
  F_SCAND_RESCAN = 65536,  // its k-off rows with fewer forwarded keys than K: rescan
  F_SCAND_DEFER = 131072,  // its rows left undecided go to a cluster launch after it
  F_SPLIT_WIDE = 262144,   // the split launch also for SMs / 4 < B <= SMs / 2 (no processing)
  F_WIDE_DEFER = 524288,   // one-CTA-per-row cluster launches: undecided rows to a wider launch
  F_HIST_TOPP = 1048576    // cluster launches (cs > 1): top-p rows without top-k take HIST
};
// The bits the op passes through from its caller (the request bits come from the tensors given);
// a new bit above must be added here, or the op drops it.
constexpr int kCallerFlags = F_LOGPROBS | F_FORCE_GENERIC | F_FORCE_EXACT | F_NO_RESIDENT |
                             F_NO_SPLIT | (7 << F_CS_SHIFT) | F_SCAND_PROC | F_SCAND_BAND |
                             F_SCAND_TOPP | F_SCAND_RESCAN | F_SCAND_DEFER | F_SPLIT_WIDE |
                             F_WIDE_DEFER | F_HIST_TOPP;
enum Mode : int { kGreedy = 0, kPlain = 1, kCand = 2, kGeneric = 3, kHist = 4 };

struct Params {
  const void* logits;
  int64_t stride;  // row stride, elements
  int rows, vocab, tpr;
  const float* temperature;
  const int* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seed;
  const int64_t* offset;
  int flags;
  int cs;         // CTAs (cluster size) per row
  int chunk;      // elements per CTA, multiple of 8
  int resident;   // chunk staged in shared memory
  int minp_cand;  // min-p-only rows take the CAND path (set when chunks stream)
  int split;      // split launch (see launch_split): CTAs per row of phase 1, else 0
  void* ws;       // split launch: Summary[rows * split] (phase 1 writes, 2 reads)
  void* tokens;
  int out64;
  bool* valid;
  float* lp;
  float* plp;
  unsigned int* stats;   // optional [4] counters (lab builds): exact plain passes, generic rows,
                         // chunks read again, band masses that needed the exact mass
  unsigned int* defer;   // F_SCAND_DEFER: [rows] flags, 1 = the row was left to the cluster
                         // launch after the split-candidates launch (launch_scand); the cluster
                         // kernel then samples only the flagged rows
  unsigned int* dq_out;  // F_WIDE_DEFER, the one-CTA-per-row launch: [1 + kWideSlots] a
                         // count, then the rows it left to the wider launch (launch_wide)
  const unsigned int* dq_in;  // that wider launch: the same queue; cluster j samples row j
  ProcParams proc;            // logits processing (sampling/processing.cuh); all null: none
};

// ------------------------------------------------------------------------------------------
// per-row parameters
// ------------------------------------------------------------------------------------------
struct Row {
  float inv_t, top_p, min_p, L;
  int k;  // effective top-k (V when off)
  int K;  // CAND: candidates wanted
  bool greedy, k_on, p_on, mp_on;
  uint64_t seed, offset;
  int mode;
};

__device__ __forceinline__ Row row_params(const Params& p, int row) {
  Row r;
  const int q = row / p.tpr;
  const float t = (p.flags & F_TEMP) ? p.temperature[q] : 1.0f;
  r.greedy = !(t > 0.0f);
  r.inv_t = inv_temperature(t);
  const int k = (p.flags & F_TOPK) ? p.top_k[q] : 0;
  r.top_p = (p.flags & F_TOPP) ? p.top_p[q] : 1.0f;
  r.min_p = (p.flags & F_MINP) ? p.min_p[q] : 0.0f;
  if (r.min_p > 1.0f) r.min_p = 1.0f;  // unvalidated min_p > 1: 1 (never an empty kept set)
  r.k_on = k > 0 && k < p.vocab;
  r.k = r.k_on ? k : p.vocab;
  r.p_on = r.top_p < 1.0f;
  r.mp_on = r.min_p > 0.0f;
  r.L = r.mp_on ? soft_ln(r.min_p) : -INFINITY;
  r.seed = uint64_t(p.seed[q]);
  r.offset = uint64_t(p.offset[q]) + uint64_t(row % p.tpr);
  r.K = 0;
  if (r.greedy) {
    r.mode = kGreedy;
  } else if (r.k_on) {
    r.mode = (r.k <= kCandCap && !(p.flags & F_FORCE_GENERIC)) ? kCand : kGeneric;
    r.K = r.k;
  } else if (r.p_on) {
    // top-p without top-k: on a cluster the bin search (HIST, hist_topp), else the candidates
    r.mode = (p.flags & F_FORCE_GENERIC)             ? kGeneric
             : (p.cs > 1 && (p.flags & F_HIST_TOPP)) ? kHist
                                                     : kCand;
    r.K = p.vocab < kCandCap ? p.vocab : kCandCap;
  } else if (r.mp_on && (p.flags & F_FORCE_GENERIC)) {
    r.mode = kGeneric;
  } else if (r.mp_on && p.minp_cand) {
    // streamed chunks: the candidates decide in one read, where the PLAIN path would read the
    // row again whenever the unfiltered winner is not kept
    r.mode = kCand;
    r.K = p.vocab < kCandMinP ? p.vocab : kCandMinP;
  } else {
    // min-p alone is a threshold on y (known once zmax is): the PLAIN path with the filter
    // y >= L (r.L = -inf when min-p is off)
    r.mode = kPlain;
  }
  return r;
}

// ------------------------------------------------------------------------------------------
// loads: 16-byte vectors of VEC elements as float
// ------------------------------------------------------------------------------------------
template <typename T>
struct VecOf {
  static constexpr int n = 16 / sizeof(T);
};

template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float (&z)[VecOf<T>::n]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int j = 0; j < VecOf<T>::n; ++j) z[j] = to_f(e[j]);
}

// Calls f(i, z) for each of this thread's 16-byte vectors of [c0, c1) (i = index of the first
// element, c0 a multiple of the vector width), elements outside [c0, c1) as -inf. Thread t owns
// vectors t, t + kThreads, ... of the chunk (the resident copy uses the same slots). The loop is
// warp-uniform: every lane of a warp calls f the same number of times (a lane past the end gets
// an all -inf vector), so f may use warp-wide votes and shuffles. With `store`, each loaded
// vector is also written to smem slot (vector index); `from_smem` reads the slots instead of
// global memory. Unaligned rows use scalar loads.
// Logits processing: f a ProcBody (below) also loads each vector's bitmask words together with
// the vector and hands the processed values to its body (the staged copy holds the raw
// vectors). Other functors compile exactly as without it (the hook is `if constexpr`).
template <typename F>
concept VecHook = requires(F& g) { g.shift(); };
template <typename T, typename F>
__device__ __forceinline__ void for_each_vec(const T* __restrict__ rowp, int c0, int c1,
                                             bool aligned, uint4* sdata, bool store, bool from_smem,
                                             F&& f) {
  constexpr int VEC = VecOf<T>::n;
  constexpr bool kHook = VecHook<std::remove_reference_t<F>>;
  const int nvec = (c1 - c0 + VEC - 1) / VEC;
  const int lane = threadIdx.x & 31;
  for (int w0 = threadIdx.x - lane; w0 < nvec; w0 += kThreads * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = w0 + lane + u * kThreads;
      const int i = c0 + v * VEC;
      raw[u] = make_uint4(0, 0, 0, 0);
      if (v < nvec) {
        if (from_smem) {
          raw[u] = sdata[v];
        } else if (aligned && i + VEC <= c1) {
          raw[u] = ldg_stream(reinterpret_cast<const uint4*>(rowp + i));
        } else {
          T* e = reinterpret_cast<T*>(&raw[u]);  // zero bits past c1 (masked below)
#pragma unroll
          for (int j = 0; j < VEC; ++j)
            if (i + j < c1) e[j] = rowp[i + j];
        }
        if (store) sdata[v] = raw[u];
      }
      if constexpr (kHook) f.prefetch(u, i, v < nvec);
    }
    if constexpr (kHook) f.loaded(c0 + (w0 + lane) * VEC, kThreads * VEC);
    // one copy of the body (code size: the small-batch path runs it once, from a cold
    // instruction cache); the loaded vectors shift down through registers
#pragma unroll 1
    for (int u = 0; u < kUnroll; ++u) {
      const int vw = w0 + u * kThreads;  // the warp's first vector of this step
      if (vw < nvec) {                   // warp-uniform
        const int v = vw + lane;
        const int i = c0 + v * VEC;
        float z[VEC];
        unpack<T>(raw[0], z);
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          if (v >= nvec || i + j >= c1) z[j] = -INFINITY;
        f(i, z);
      }
#pragma unroll
      for (int q = 0; q + 1 < kUnroll; ++q) raw[q] = raw[q + 1];
      if constexpr (kHook) f.shift();
    }
  }
}

// for_each_vec's processing hook: for each vector, fr(i, z) sees the raw values (the raw
// logprobs' sums), then f(i, z) the processed ones; the processing bits of the kUnroll vectors
// in flight (one word of each given mask per vector, packed: load_bits) are loaded with them,
// and once all are issued, the output counts they need (prefetch_count).
struct NoRaw {
  template <int VEC>
  __device__ __forceinline__ void operator()(int, const float (&)[VEC]) const {}
};
template <int VEC, typename F, typename FR>
struct ProcBody {
  const ProcParams& pp;
  const RowProc rp;
  const int c1;
  F& f;
  FR& fr;
  uint32_t bits[kUnroll];
  int cnt[kUnroll];
  __device__ __forceinline__ ProcBody(const ProcParams& pp_, RowProc rp_, int c1_, F& f_, FR& fr_)
      : pp(pp_), rp(rp_), c1(c1_), f(f_), fr(fr_) {}
  // vector u of the next step starts at element i (valid: i < c1; else padding)
  __device__ __forceinline__ void prefetch(int u, int i, bool valid) {
    bits[u] = valid ? load_bits<VEC>(pp, rp, i, c1) : kKeepAll;
  }
  // all vectors of the step issued (vector u starts at i0 + u * stride): their counts
  __device__ __forceinline__ void loaded(int i0, int stride) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      bits[u] = prefetch_count<VEC>(pp, rp, bits[u], i0 + u * stride, cnt[u]);
  }
  __device__ __forceinline__ void shift() {
#pragma unroll
    for (int q = 0; q + 1 < kUnroll; ++q) {
      bits[q] = bits[q + 1];
      cnt[q] = cnt[q + 1];
    }
  }
  __device__ __forceinline__ void operator()(int i, float (&z)[VEC]) {
    fr(i, z);
    proc_vec<VEC>(pp, rp, bits[0], i, z, cnt[0]);
    f(i, z);
  }
};
// for_each_vec over [c0, c1) with or without processing (f: the body on processed values; fr:
// the raw values, processing only)
template <bool kProc, typename T, typename F, typename FR = NoRaw>
__device__ __forceinline__ void for_each_pvec(const T* __restrict__ rowp, int c0, int c1,
                                              bool aligned, uint4* sdata, bool store,
                                              bool from_smem, const ProcParams& pp,
                                              const RowProc& rp, F&& f, FR&& fr = FR{}) {
  if constexpr (kProc) {
    for_each_vec<T>(rowp, c0, c1, aligned, sdata, store, from_smem,
                    ProcBody<VecOf<T>::n, std::remove_reference_t<F>, std::remove_reference_t<FR>>(
                        pp, rp, c1, f, fr));
  } else {
    for_each_vec<T>(rowp, c0, c1, aligned, sdata, store, from_smem, f);
  }
}

__device__ __forceinline__ uint32_t pick4(const uint32_t (&w)[4], int j) {
  return j == 0 ? w[0] : j == 1 ? w[1] : j == 2 ? w[2] : w[3];
}

// ------------------------------------------------------------------------------------------
// small helpers
// ------------------------------------------------------------------------------------------
// online (max, sum exp((v - max) * s)) accumulation; s = 1 (raw) or 1/T (processed)
struct Lse {
  float m = -INFINITY, s = 0.0f;
  __device__ __forceinline__ void add(float v, float scale) {
    if (v > m) {
      s = (m == -INFINITY) ? 1.0f : fmaf(s, __expf((m - v) * scale), 1.0f);
      m = v;
    } else if (v > -INFINITY) {
      s += (v == m) ? 1.0f : __expf((v - m) * scale);
    }
  }
  __device__ __forceinline__ void merge(float m2, float s2, float scale) {
    if (m2 > m) {
      s = (m == -INFINITY) ? s2 : fmaf(s, __expf((m - m2) * scale), s2);
      m = m2;
    } else if (m2 > -INFINITY) {
      s += (m2 == m) ? s2 : s2 * __expf((m2 - m) * scale);
    }
  }
};

template <typename V>
__device__ __forceinline__ V shfl_x(V v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}

// key56 of a raw logit, as 64-bit
__device__ __forceinline__ unsigned long long key_of(float z, int id) {
  return key56(key32(z), uint32_t(id));
}

// ------------------------------------------------------------------------------------------
// shared memory
// ------------------------------------------------------------------------------------------
// What each CTA pushes into every CTA of its cluster after pass 1.
struct Summary {
  float zmax;     // max raw logit of the chunk
  int zid;        // its lowest id (INT_MAX: none)
  unsigned bad;   // a NaN or +inf was seen
  unsigned ovf;   // CAND: the candidate buffer overflowed (keys were dropped)
  float lm, ls;   // raw logits: max, sum exp(z - lm)           (logprobs)
  float pm, ps;   // processed: max z, sum exp((z - pm) / T)    (logprobs, PLAIN)
  double h1, h2;  // PLAIN streamed: best / second-best approximate score
  float z1;       // raw logit of the best
  int w1;         // id of the best
  int ncand;      // CAND: candidates pushed to rank 0
  float zmin;     // min raw logit of the chunk (generic top-k window)
};

struct Smem {
  Summary summ[kMaxCluster];         // pushed by every CTA of the cluster (slot = its rank)
  unsigned long long red64[kWarps];  // block reductions
  unsigned long long red64b[kWarps];
  double redd[kWarps][2];
  float redf[kWarps][4];
  int redi[kWarps][2];
  unsigned long long bcast[8];                // block / cluster broadcasts
  unsigned int hist[256];                     // radix select counts
  unsigned long long hmass[256];              // radix select masses (generic top-p)
  unsigned long long hmin[256];               // radix select: smallest key of each bin
  unsigned long long cl_u64[kMaxCluster][2];  // per-CTA 64-bit values pushed to rank 0
  unsigned long long best[kMaxCluster];       // exact pass: per-CTA packed best, at rank 0
  float psum[kMaxCluster];                    // exact pass: per-CTA kept exp sums, at rank 0
  unsigned int counter;
  unsigned int bar_key;  // key32 of a CTA-wide bar (PLAIN streamed / exact pass)
  unsigned int ncb;      // CAND: keys appended to the CTA's candidate buffer
  Summary row;           // the cluster's summaries merged (warp 0 writes, all read)
};
// CAND finish (rank 0), in the CTA's candidate buffer (dead once its keys were pushed)
struct Fin {
  unsigned long long skey[kCandCap];
  unsigned long long sprefix[kCandCap];  // inclusive mass prefix in key order
  float sy[kCandCap];
};
static_assert(sizeof(Fin) <= size_t(kCandBuf) * 8, "Fin must fit the candidate buffer");

// kProc: a vector's raw values into the raw log-sum-exp (raw logprobs) and the raw NaN / +inf flag
template <int VEC>
__device__ __forceinline__ void raw_vec(Lse& raw, unsigned& bad, const float (&z)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    raw.add(z[j], 1.0f);
    bad |= z[j] < INFINITY ? 0u : 1u;
  }
}

// the neutral summary, and the merge of two (order-free up to the float sums of the logprobs)
__device__ __forceinline__ Summary summ_empty() {
  Summary u;
  u.zmax = -INFINITY;
  u.zid = 0x7fffffff;
  u.bad = 0;
  u.ovf = 0;
  u.ncand = 0;
  u.zmin = INFINITY;
  u.lm = -INFINITY;
  u.ls = 0.0f;
  u.pm = -INFINITY;
  u.ps = 0.0f;
  u.h1 = -INFINITY;
  u.h2 = -INFINITY;
  u.z1 = -INFINITY;
  u.w1 = 0x7fffffff;
  return u;
}
__device__ __forceinline__ void summ_merge(Summary& u, const Summary& v, bool lp, float inv_t);
// the 32 lanes' summaries merged (every lane gets the result)
__device__ __forceinline__ void warp_summ_merge(Summary& u, bool lp, float inv_t) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    Summary v;
    v.zmax = __shfl_xor_sync(0xffffffffu, u.zmax, o);
    v.zid = __shfl_xor_sync(0xffffffffu, u.zid, o);
    v.bad = __shfl_xor_sync(0xffffffffu, u.bad, o);
    v.ovf = __shfl_xor_sync(0xffffffffu, u.ovf, o);
    v.ncand = __shfl_xor_sync(0xffffffffu, u.ncand, o);
    v.zmin = __shfl_xor_sync(0xffffffffu, u.zmin, o);
    v.lm = __shfl_xor_sync(0xffffffffu, u.lm, o);
    v.ls = __shfl_xor_sync(0xffffffffu, u.ls, o);
    v.pm = __shfl_xor_sync(0xffffffffu, u.pm, o);
    v.ps = __shfl_xor_sync(0xffffffffu, u.ps, o);
    v.h1 = __shfl_xor_sync(0xffffffffu, u.h1, o);
    v.h2 = __shfl_xor_sync(0xffffffffu, u.h2, o);
    v.z1 = __shfl_xor_sync(0xffffffffu, u.z1, o);
    v.w1 = __shfl_xor_sync(0xffffffffu, u.w1, o);
    summ_merge(u, v, lp, inv_t);
  }
}
__device__ __forceinline__ void summ_merge(Summary& u, const Summary& v, bool lp, float inv_t) {
  if (v.zmax > u.zmax || (v.zmax == u.zmax && v.zid < u.zid)) {
    u.zmax = v.zmax;
    u.zid = v.zid;
  }
  u.bad |= v.bad;
  u.ovf |= v.ovf;
  u.ncand += v.ncand;
  u.zmin = fminf(u.zmin, v.zmin);
  if (lp) {
    Lse a{u.lm, u.ls}, b{u.pm, u.ps};
    a.merge(v.lm, v.ls, 1.0f);
    b.merge(v.pm, v.ps, inv_t);
    u.lm = a.m;
    u.ls = a.s;
    u.pm = b.m;
    u.ps = b.s;
  }
  // top-2 of the approximate scores (h2 bounds every score but the best's)
  if (v.h1 > u.h1 || (v.h1 == u.h1 && v.w1 < u.w1)) {
    u.h2 = fmax(u.h1, v.h2);
    u.h1 = v.h1;
    u.w1 = v.w1;
    u.z1 = v.z1;
  } else {
    u.h2 = fmax(u.h2, v.h1);
  }
}
// dynamic shared memory after Smem: cbuf [cs][kCbufPerCta] (rank 0 reads), the candidate buffer
// (FILT; reused as Fin by rank 0's finish), then the resident chunk (16-byte slots) when
// p.resident.

// ------------------------------------------------------------------------------------------
// block reductions (all threads call; results broadcast)
// ------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long v, Smem& s) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const unsigned long long w = shfl_x(v, o);
    v = w > v ? w : v;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) s.red64[warp] = v;
  __syncthreads();
  v = s.red64[lane];
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const unsigned long long w = shfl_x(v, o);
    v = w > v ? w : v;
  }
  return v;
}
// (max, min over nonzero) of u64 keys in one round
__device__ __forceinline__ void block_maxmin_u64(unsigned long long& mx, unsigned long long& mn,
                                                 Smem& s) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const unsigned long long a = shfl_x(mx, o), b = shfl_x(mn, o);
    mx = a > mx ? a : mx;
    mn = b < mn ? b : mn;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
    s.red64[warp] = mx;
    s.red64b[warp] = mn;
  }
  __syncthreads();
  mx = s.red64[lane];
  mn = s.red64b[lane];
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const unsigned long long a = shfl_x(mx, o), b = shfl_x(mn, o);
    mx = a > mx ? a : mx;
    mn = b < mn ? b : mn;
  }
}
// Block-wide reduction (every thread gets the result): wr(v) reduces v over the warp; lane 0 of
// each warp stores its value (put(w, v): warp w's shared-memory slot), then every warp reduces
// the 32 slots (get(lane)) the same way.
template <typename V, typename WarpReduce, typename Put, typename Get>
__device__ __forceinline__ V block_reduce(V v, WarpReduce wr, Put put, Get get) {
  wr(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) put(warp, v);
  __syncthreads();
  v = get(lane);
  wr(v);
  return v;
}
// Block-wide sums: one slot per warp (slot(w): a reference to warp w's shared-memory slot).
template <typename V, typename Slot>
__device__ __forceinline__ V block_sum_in(V v, Slot slot) {
  return block_reduce(
      v,
      [](V& x) {
#pragma unroll
        for (int o = 16; o; o >>= 1) x += shfl_x(x, o);
      },
      [&](int w, V x) { slot(w) = x; }, [&](int l) -> V { return slot(l); });
}
__device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v, Smem& s) {
  return block_sum_in(v, [&](int w) -> unsigned long long& { return s.red64[w]; });
}
__device__ __forceinline__ int block_sum_int(int v, Smem& s) {
  return block_sum_in(v, [&](int w) -> int& { return s.redi[w][0]; });
}
__device__ __forceinline__ float block_sum_f(float v, Smem& s) {
  return block_sum_in(v, [&](int w) -> float& { return s.redf[w][0]; });
}
__device__ __forceinline__ double block_sum_d(double v, Smem& s) {
  return block_sum_in(v, [&](int w) -> double& { return s.redd[w][0]; });
}
__device__ __forceinline__ void lse_warp(Lse& a, float scale) {
#pragma unroll
  for (int o = 16; o; o >>= 1) a.merge(shfl_x(a.m, o), shfl_x(a.s, o), scale);
}
__device__ __forceinline__ Lse block_lse(Lse a, float scale, Smem& s, int slot) {
  lse_warp(a, scale);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
    s.redf[warp][2 * slot] = a.m;
    s.redf[warp][2 * slot + 1] = a.s;
  }
  __syncthreads();
  Lse b;
  b.m = s.redf[lane][2 * slot];
  b.s = s.redf[lane][2 * slot + 1];
  lse_warp(b, scale);
  return b;
}
// (max z, lowest id) of the block
__device__ __forceinline__ void block_argmax(float& z, int& id, Smem& s) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const float z2 = shfl_x(z, o);
    const int i2 = shfl_x(id, o);
    if (z2 > z || (z2 == z && i2 < id)) {
      z = z2;
      id = i2;
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
    s.redf[warp][3] = z;
    s.redi[warp][1] = id;
  }
  __syncthreads();
  z = s.redf[lane][3];
  id = s.redi[lane][1];
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const float z2 = shfl_x(z, o);
    const int i2 = shfl_x(id, o);
    if (z2 > z || (z2 == z && i2 < id)) {
      z = z2;
      id = i2;
    }
  }
}

// ------------------------------------------------------------------------------------------
// radix select over register-resident keys (R per thread; 0 = empty)
// ------------------------------------------------------------------------------------------
// Returns t such that exactly min(K, n) of the block's nonzero keys are >= t (n = their count;
// t = the smallest key when n <= K; 0 when n == 0). Keys are unique (key56). All threads call.
template <int R>
__device__ unsigned long long block_select(const unsigned long long (&keys)[R], int K, Smem& s,
                                           int* n_out = nullptr) {
  const int tid = threadIdx.x;
  int cnt = 0;
  unsigned long long mx = 0, mn = ~0ull;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    if (keys[i]) {
      ++cnt;
      mx = keys[i] > mx ? keys[i] : mx;
      mn = keys[i] < mn ? keys[i] : mn;
    }
  }
  const int n = block_sum_int(cnt, s);
  if (n_out) *n_out = n;
  block_maxmin_u64(mx, mn, s);
  if (n <= K) return n ? mn : 0ull;
  // bits above the highest differing one are common to every key; the first digit is the 8 bits
  // from there down (so that it spreads the keys over the bins), then 8 bits at a time
  const int hb = 63 - __clzll(mx ^ mn);  // mx != mn since n > K >= 1
  int shift = hb - 7, width = 8;
  if (shift < 0) {
    width = hb + 1;
    shift = 0;
  }
  unsigned long long pmask = ~((2ull << hb) - 1);
  unsigned long long prefix = mx & pmask;
  int need = K;
  for (;;) {
    const unsigned dmask = (1u << width) - 1;
    if (tid < 256) s.hist[tid] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (keys[i] && (keys[i] & pmask) == prefix)
        atomicAdd(&s.hist[unsigned(keys[i] >> shift) & dmask], 1u);
    }
    __syncthreads();
    if (tid < 32) {
      // lane l owns digits 255 - 8l - j, j = 0..7 (descending)
      unsigned c[8], tot = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = s.hist[255 - 8 * tid - j];
        tot += c[j];
      }
      unsigned incl = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
        if (tid >= o) incl += v;
      }
      unsigned above = incl - tot;
      if (above < unsigned(need) && unsigned(need) <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (above < unsigned(need) && unsigned(need) <= above + c[j]) {
            s.bcast[0] = 255 - 8 * tid - j;
            s.bcast[1] = above;
            s.bcast[2] = c[j];
          }
          above += c[j];
        }
      }
    }
    __syncthreads();
    const unsigned long long d = s.bcast[0];
    const int above = int(s.bcast[1]), c = int(s.bcast[2]);
    __syncthreads();
    prefix |= d << shift;
    pmask |= (unsigned long long)dmask << shift;
    need -= above;
    if (c == need || shift == 0) break;  // the whole bin is selected (or a single key)
    if (shift >= 8) {
      shift -= 8;
    } else {
      width = shift;
      shift = 0;
    }
  }
  // the threshold: the smallest selected key of the boundary bin
  unsigned long long m2 = ~0ull;
#pragma unroll
  for (int i = 0; i < R; ++i)
    if (keys[i] && (keys[i] & pmask) == prefix && keys[i] < m2) m2 = keys[i];
  unsigned long long dummy = 0;
  block_maxmin_u64(dummy, m2, s);
  return m2;
}

// ------------------------------------------------------------------------------------------
// CAND: the CTA's buffer of candidate keys
// ------------------------------------------------------------------------------------------
// Appends the keys >= th of one vector of a lane (warp-convergent; warp-aggregated: one atomic
// per warp). th is a key with at least K elements of the CTA >= it (or 0), so every key of the
// CTA's top K is appended; appends past kCandBuf are dropped and counted (s.ncb > kCandBuf:
// overflow, the generic path takes over).
template <int VEC>
__device__ __forceinline__ void cand_append(Smem& s, unsigned long long* cand, int i0,
                                            const float (&z)[VEC], unsigned long long th) {
  const float thz = th ? key56_value(th) : -INFINITY;
  unsigned m = 0;
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    if (z[j] >= thz && z[j] > -INFINITY && key_of(z[j], i0 + j) >= th) m |= 1u << j;
  if (!__any_sync(0xffffffffu, m != 0)) return;
  const int lane = threadIdx.x & 31;
  const int c = __popc(m);
  int incl = c;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  unsigned base = 0;
  if (lane == 31) base = atomicAdd(&s.ncb, unsigned(incl));
  base = __shfl_sync(0xffffffffu, base, 31);
  unsigned pos = base + unsigned(incl - c);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if ((m >> j) & 1u) {
      if (pos < unsigned(kCandBuf)) cand[pos] = key_of(z[j], i0 + j);
      ++pos;
    }
  }
}

// ------------------------------------------------------------------------------------------
// PLAIN streamed: approximate scores, top-2 per thread
// ------------------------------------------------------------------------------------------
// h = fma(double(z), double(1/T), double(G)): z * (1/T) is exact in float64 (24 x 24 bits) and
// the add rounds once, |h - (z/T' + G)| <= 2^-53 |h| (T' = 1 / fl32(1/T)).
// The filter skips an element only when its exact h cannot exceed `bar` (a float <= the thread's
// second-best h): with x = fl32(z * (1/T)) and tau = fl32(x - bar), |tau - (z/T' - bar)| <=
// 2^-23 (|x| + |bar|) < mu = 2^-21 (|x| + |bar|) + 1e-6 (all roundings of tau + mu and of the
// scaling by log2 e included); the element's h < bar if G < bar - z/T', i.e. u < exp(-exp(.)),
// implied by 1 - u > exp(tau + mu) (exp(-a) >= 1 - a), tested with ex2.approx (relative error
// < 2^-21) raised by 2^-16. 1 - u = (2 ((~w) >> 9) + 1) 2^-24 is computed exactly. A group of 4
// elements whose largest x + 16.64 (> max G) is below bar skips Philox. NaN / inf values never
// pass a skip test (every comparison is false), so they reach the exact path.
// rare (an element that may enter the top 2): one out-of-line copy keeps the loop small; a free
// function of values, so that no caller state has to live in memory
__device__ __noinline__ double approx_score(float z, uint32_t w, double inv_t_d) {
  return fma(double(z), inv_t_d, double(gumbel_from_bits(w)));
}

__device__ __forceinline__ float ex2approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// true when the element's score cannot reach `bar` (see the derivation above)
__device__ __forceinline__ bool skip_elem(float x, float bar, float barc, uint32_t w) {
  const float mu = fmaf(fabsf(x), kRel, barc);
  const float e = ex2approx((x - bar + mu) * kLog2e) * 1.0000152587890625f;
  const float omu = __uint_as_float(0x3f800000u | ((~w) >> 9)) - 0.99999994039535522f;
  return omu > e;
}

struct PlainAcc {
  double h1 = -INFINITY, h2 = -INFINITY;
  float z1 = -INFINITY;
  int w1 = 0x7fffffff;
  float bar = -INFINITY;  // float <= h2 (-inf until two elements were evaluated)
  __device__ __forceinline__ void update(double h, float z, int id) {
    if (h > h1) {
      h2 = h1;
      h1 = h;
      z1 = z;
      w1 = id;
    } else if (h > h2) {
      h2 = h;
    }
    if (h2 > -INFINITY) bar = __double2float_rd(h2);
  }
};

// block top-2 of the threads' (h1, w1, z1, h2) into the CTA summary (all threads call)
__device__ __forceinline__ void block_top2(const PlainAcc& pa, Smem& s, Summary& mine) {
  const int tid = threadIdx.x;
  double h1 = pa.h1, h2 = pa.h2;
  float z1 = pa.z1;
  int w1 = pa.w1;
  auto merge2 = [&](double bh1, int bw1, float bz1, double bh2) {
    if (bh1 > h1 || (bh1 == h1 && bw1 < w1)) {
      h2 = fmax(h1, bh2);
      h1 = bh1;
      w1 = bw1;
      z1 = bz1;
    } else {
      h2 = fmax(h2, bh1);
    }
  };
#pragma unroll
  for (int o = 16; o; o >>= 1) merge2(shfl_x(h1, o), shfl_x(w1, o), shfl_x(z1, o), shfl_x(h2, o));
  const int warp = tid >> 5, lane = tid & 31;
  __syncthreads();
  if (lane == 0) {
    s.redd[warp][0] = h1;
    s.redd[warp][1] = h2;
    s.redf[warp][0] = z1;
    s.redi[warp][0] = w1;
  }
  __syncthreads();
  h1 = s.redd[lane][0];
  h2 = s.redd[lane][1];
  z1 = s.redf[lane][0];
  w1 = s.redi[lane][0];
#pragma unroll
  for (int o = 16; o; o >>= 1) merge2(shfl_x(h1, o), shfl_x(w1, o), shfl_x(z1, o), shfl_x(h2, o));
  mine.h1 = h1;
  mine.h2 = h2;
  mine.z1 = z1;
  mine.w1 = w1;
}

// One vector of a lane (warp-convergent). The filter uses the larger of the lane's bar and the
// CTA's (s.bar_key, below). Elements that pass are evaluated in rounds: each round every lane
// with a pending element evaluates one, so the warp pays for the exact noise once per round, not
// once per element slot. kProc: -inf values (masked tokens) are skipped outright (their h is -inf:
// they change nothing), so a mostly masked row costs no Philox.
// A warp raises the CTA bar to max(its second best h, its best h minus kBarMargin) (rounded
// down). An element is still skipped only when its h < the bar it was tested against, and every
// bar is <= the CTA's final s.bar_key or the thread's second best, so the CTA reports max(its
// second best, final s.bar_key) as the bound on every h but its best's (plain_best_h2): the gap
// test then passes whenever the real gap exceeds kBarMargin (>> its 3e-5 + 2^-52 (|h1| + |h2|)).
// The bar follows the CTA's best instead of the largest per-warp second best: a CPU model of
// randn * 4 rows at T = 0.8, one 1024-thread CTA per row, computes Philox for 43 % of the groups
// of 4 instead of 65 % at V = 151936 (bench/lab/tools/plain_filter_model.py); measured on an
// H100, temperature at B = 128 and 256 (fp32) 4.5 % faster (docs/PERF_LOG.md).
constexpr double kBarMargin = 1e-3;
template <int VEC, bool kProc = false>
__device__ __forceinline__ void plain_vec(PlainAcc& a, Smem& s, int i0, const float (&z)[VEC],
                                          float inv_t, double inv_t_d, uint64_t seed,
                                          uint64_t offset) {
  const float bar = fmaxf(a.bar, key32_to_float(s.bar_key));
  const float barc = fmaf(fabsf(bar), kRel, 1e-6f);
  bool any = false;
#pragma unroll
  for (int g = 0; g < VEC / 4; ++g) {
    float x[4], xm = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[j] = z[4 * g + j] * inv_t;
      xm = fmaxf(xm, x[j]);
    }
    unsigned pend = 0;
    uint32_t w[4] = {0, 0, 0, 0};
    const int ib = i0 + 4 * g;
    if ((!kProc || xm > -INFINITY) && !(fmaf(fabsf(xm), kRel, xm + kGumbelHi) < bar)) {
      const Philox4 r = philox_block(seed, offset, uint32_t(ib) >> 2, kStreamSample);
      w[0] = r.x;
      w[1] = r.y;
      w[2] = r.z;
      w[3] = r.w;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if ((!kProc || x[j] > -INFINITY) && !skip_elem(x[j], bar, barc, w[j])) pend |= 1u << j;
    }
    while (__any_sync(0xffffffffu, pend != 0)) {
      any = true;
      if (pend) {
        const int j = __ffs(pend) - 1;
        pend &= pend - 1;
        const float zg[4] = {z[4 * g], z[4 * g + 1], z[4 * g + 2], z[4 * g + 3]};
        const float zj = pick<4>(zg, j);
        a.update(approx_score(zj, pick4(w, j), inv_t_d), zj, ib + j);
      }
    }
  }
  if (__any_sync(0xffffffffu, any)) {
    // the warp's bar for the whole CTA: max(its second best h, its best h - kBarMargin)
    double h1 = a.h1, h2 = a.h2;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
      const double o1 = shfl_x(h1, o), o2 = shfl_x(h2, o);
      h2 = fmax(fmin(h1, o1), fmax(h2, o2));
      h1 = fmax(h1, o1);
    }
    const double b = fmax(h2, h1 - kBarMargin);
    if ((threadIdx.x & 31) == 0 && b > -INFINITY)
      atomicMax(&s.bar_key, key32(__double2float_rd(b)));
  }
}

// the CTA's bound on every h but its best's, after its loop (every warp's last bar update is
// visible: call after a block barrier)
__device__ __forceinline__ double plain_best_h2(double h2, const Smem& s) {
  return fmax(h2, double(key32_to_float(s.bar_key)));
}

// Gap test: the approximate winner w1 is the contract's winner. For any j != w1 and D = (z -
// zmax) / T' (real): |y - D| <= 2^-23 |D|, |c - (y + G)| <= 2^-24 |c| (c = fl32(y + G)), so
// |c - (D + G)| <= 9.1e-6 when |D| <= 45 (|c| <= 62), and |c_w - (D_w + G_w)| <= 3.8e-6 when
// y_w >= -20. Tokens with D < -45 score below -28 < c_w (>= -22.9). With R = D + G + zmax / T',
// R_w - R_j >= h1 - h2 - 2^-53 (|h1| + |h2|), so c_w > c_j whenever
// h1 - h2 > 2^-52 (|h1| + |h2|) + 3e-5 (twice the 2^-53 term, ~2x the 1.3e-5 of the c terms).
// Skipped elements have R < bar <= h2, covered the same way.
__device__ __forceinline__ bool plain_gap_ok(double h1, double h2, float z1, float zmax,
                                             float inv_t) {
  if (!(h1 > -INFINITY) || !(h1 < INFINITY)) return false;
  if (!(centered(z1, zmax, inv_t) >= -20.0f)) return false;
  if (h2 == -INFINITY) return true;
  if (!(h2 < INFINITY)) return false;
  return h1 - h2 > 2.220446049250313e-16 * (fabs(h1) + fabs(h2)) + 3e-5;
}

// ------------------------------------------------------------------------------------------
// the exact pass: argmax of fl32(y + G) over the kept set {key >= thr, y >= L}
// ------------------------------------------------------------------------------------------
// bar: a float with score(winner) >= bar (the max token's exact score, or -inf). An element is
// skipped only when its exact score is provably < bar (same test as the PLAIN filter, with y in
// place of x: |y| <= 45 or y = -inf for anything that passes kDead).
struct ExactAcc {
  float best = -INFINITY;
  int id = 0x7fffffff;
  float psum = 0.0f;  // sum of exp(y) over the kept set (logprobs)
};

// rare path (an element that may beat the bar), out of line
__device__ __noinline__ float exact_score(float y, uint32_t w) {
  return fadd(y, gumbel_from_bits(w));
}

template <int VEC, bool kThr, bool kLp>
__device__ __forceinline__ void exact_step(ExactAcc& a, Smem& s, int i0, const float (&z)[VEC],
                                           float zmax, float inv_t, unsigned long long thr, float L,
                                           uint64_t seed, uint64_t offset) {
  // the bar: the max token's score, or the best exact score any warp of the CTA has seen
  const float bar = fmaxf(a.best, key32_to_float(s.bar_key));
  const float barc = fmaf(fabsf(bar), kRel, 1e-6f);
  bool any = false;
#pragma unroll
  for (int g = 0; g < VEC / 4; ++g) {
    float y[4], ym = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float zz = z[4 * g + j];
      float yy = centered(zz, zmax, inv_t);
      bool kept = zz > -INFINITY && yy >= L;
      if (kThr) kept = kept && key_of(zz, i0 + 4 * g + j) >= thr;
      yy = kept ? yy : -INFINITY;
      if (kLp && kept) a.psum += __expf(yy);
      y[j] = yy;
      ym = fmaxf(ym, yy);
    }
    const int ib = i0 + 4 * g;
    unsigned pend = 0;
    uint32_t w[4] = {0, 0, 0, 0};
    if (ym >= kDead && !(fmaf(fabsf(ym), kRel, ym + kGumbelHi) < bar)) {
      const Philox4 r = philox_block(seed, offset, uint32_t(ib) >> 2, kStreamSample);
      w[0] = r.x;
      w[1] = r.y;
      w[2] = r.z;
      w[3] = r.w;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (y[j] >= kDead && !skip_elem(y[j], bar, barc, w[j])) pend |= 1u << j;
    }
    while (__any_sync(0xffffffffu, pend != 0)) {
      any = true;
      if (pend) {
        const int j = __ffs(pend) - 1;
        pend &= pend - 1;
        const float c = exact_score(pick<4>(y, j), pick4(w, j));
        if (c > a.best || (c == a.best && ib + j < a.id)) {
          a.best = c;
          a.id = ib + j;
        }
      }
    }
  }
  if (__any_sync(0xffffffffu, any)) {
    float b = a.best;
#pragma unroll
    for (int o = 16; o; o >>= 1) b = fmaxf(b, shfl_x(b, o));
    if ((threadIdx.x & 31) == 0 && b > -INFINITY) atomicMax(&s.bar_key, key32(b));
  }
}

// ------------------------------------------------------------------------------------------
// cluster helpers
// ------------------------------------------------------------------------------------------
template <typename V>
__device__ __forceinline__ V* peer(V* p, int rank) {
  return cg::this_cluster().map_shared_rank(p, rank);
}
__device__ __forceinline__ void cluster_sync(int cs) {
  if (cs > 1)
    cg::this_cluster().sync();
  else
    __syncthreads();
}

// The exact pass over this CTA's chunk; rank 0 returns the row's (token, processed kept exp
// sum). Every CTA of the cluster calls it. kProc: over the processed logits (rp: the row's
// processing context).
template <typename T, bool kProc = false>
__device__ void exact_pass(const Params& p, const Row& r, Smem& s, const T* rowp, int c0, int c1,
                           bool aligned, uint4* sdata, float zmax, int zid, unsigned long long thr,
                           int& tok, float& psum, RowProc rp = {}) {
  constexpr int VEC = VecOf<T>::n;
  const int cs = p.cs;
  const int rank = cs > 1 ? int(cg::this_cluster().block_rank()) : 0;
  const bool lp = p.flags & F_LOGPROBS;
  // bar: the max token's exact score (it is kept by every filter)
  if (threadIdx.x == 0) {
    const float g = gumbel_from_bits(philox_word(r.seed, r.offset, uint32_t(zid), kStreamSample));
    s.bar_key = key32(g);
  }
  __syncthreads();
  ExactAcc a;
  const bool from_smem = p.resident;
  auto run = [&](auto thr_tag, auto lp_tag) {
    constexpr bool kThr = decltype(thr_tag)::value, kLp = decltype(lp_tag)::value;
    auto step = [&](int i, const float (&z)[VEC]) {
      exact_step<VEC, kThr, kLp>(a, s, i, z, zmax, r.inv_t, thr, r.L, r.seed, r.offset);
    };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, false, from_smem, p.proc, rp, step);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, sdata, false, from_smem, step);
  };
  if (thr) {
    if (lp)
      run(std::true_type{}, std::true_type{});
    else
      run(std::true_type{}, std::false_type{});
  } else {
    if (lp)
      run(std::false_type{}, std::true_type{});
    else
      run(std::false_type{}, std::false_type{});
  }
  // block argmax of (score, lowest id)
  unsigned long long b = a.best > -INFINITY ? pack_best(a.best, uint32_t(a.id)) : 0ull;
  b = block_max_u64(b, s);
  float ps = lp ? block_sum_f(a.psum, s) : 0.0f;
  if (threadIdx.x == 0) {
    if (cs > 1) {
      *peer(&s.best[rank], 0) = b;
      *peer(&s.psum[rank], 0) = ps;
    } else {
      s.best[0] = b;
      s.psum[0] = ps;
    }
  }
  cluster_sync(cs);
  if (rank == 0) {
    unsigned long long bb = 0;
    float pp = 0.0f;
    for (int q = 0; q < cs; ++q) {
      bb = s.best[q] > bb ? s.best[q] : bb;
      pp += s.psum[q];
    }
    tok = bb ? int(~uint32_t(bb)) : zid;
    psum = pp;
  }
}

// 64-bit add into shared memory with two native 32-bit atomics and a carry (a 64-bit shared
// atomicAdd is a compare-and-swap loop on sm_90, which collapses under contention)
__device__ __forceinline__ void smem_add_u64(unsigned long long* a, unsigned long long v) {
  unsigned int* w = reinterpret_cast<unsigned int*>(a);  // little-endian: w[0] low, w[1] high
  const unsigned int lo = unsigned(v), hi = unsigned(v >> 32);
  const unsigned int old = atomicAdd(w, lo);
  const unsigned int h = hi + (old + lo < old ? 1u : 0u);
  if (h) atomicAdd(w + 1, h);
}

// Cluster-wide radix select over the row: count mode (kMass = false): the key t with exactly
// `target` keys >= max(t, floor) among the row's non-NaN keys >= floor (target <= their count);
// mass mode: the key t of the first token in key order (keys >= floor) at which the cumulative
// fixed-point mass reaches `target` (1 <= target <= the total). Every key that can count lies in
// [lo, hi] (count mode: from the row's min to its max; mass mode: from the value below which
// the mass is provably 0), so the bits above their highest differing one are common and the
// first digit is the 8 bits from there down (an informative first level, spread over the bins).
// Every CTA calls; all return t. kProc: keys of the processed logits.
template <typename T, bool kMass, bool kProc = false>
__device__ unsigned long long cluster_select(const Params& p, const Row& r, Smem& s, const T* rowp,
                                             int c0, int c1, bool aligned, uint4* sdata, float zmax,
                                             unsigned long long lo, unsigned long long hi,
                                             unsigned long long floor, unsigned long long target,
                                             unsigned long long* cbuf, RowProc rp = {}) {
  constexpr int VEC = VecOf<T>::n;
  const int cs = p.cs;
  const int rank = cs > 1 ? int(cg::this_cluster().block_rank()) : 0;
  const int tid = threadIdx.x;
  lo = lo > floor ? lo : floor;
  if (hi <= lo) return hi;
  const int hb = 63 - __clzll(hi ^ lo);
  int shift = hb - 7, width = 8;
  if (shift < 0) {
    width = hb + 1;
    shift = 0;
  }
  unsigned long long pmask = ~((2ull << hb) - 1);
  unsigned long long prefix = hi & pmask;
  for (;;) {
    const unsigned dmask = (1u << width) - 1;
    if (tid < 256) {
      s.hist[tid] = 0;
      s.hmass[tid] = 0;
      s.hmin[tid] = ~0ull;
    }
    __syncthreads();
    auto body = [&](int i, const float (&z)[VEC]) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (i + j >= c1 || z[j] != z[j]) continue;
        const unsigned long long key = key_of(z[j], i + j);
        if (key < lo || (key & pmask) != prefix) continue;
        const unsigned d = unsigned(key >> shift) & dmask;
        if (kMass) {
          const int64_t e = mass_fixed_nonpos(centered(z[j], zmax, r.inv_t));
          if (!e) continue;
          smem_add_u64(&s.hmass[d], (unsigned long long)e);
        }
        atomicAdd(&s.hist[d], 1u);
        atomicMin(&s.hmin[d], key);
      }
    };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, false, p.resident, p.proc, rp, body);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, sdata, false, p.resident, body);
    __syncthreads();
    // push this CTA's histograms to rank 0 (cbuf [cs][3][256])
    if (tid < 256) {
      unsigned long long* dst = cs > 1 ? peer(cbuf, 0) : cbuf;
      dst[rank * kCbufPerCta + tid] = kMass ? s.hmass[tid] : (unsigned long long)s.hist[tid];
      dst[rank * kCbufPerCta + 256 + tid] = s.hist[tid];
      dst[rank * kCbufPerCta + 512 + tid] = s.hmin[tid];
    }
    cluster_sync(cs);
    if (rank == 0) {
      if (tid < 256) {
        unsigned long long v = 0, c = 0, m = ~0ull;
        for (int q = 0; q < cs; ++q) {
          v += cbuf[q * kCbufPerCta + tid];
          c += cbuf[q * kCbufPerCta + 256 + tid];
          const unsigned long long mq = cbuf[q * kCbufPerCta + 512 + tid];
          m = mq < m ? mq : m;
        }
        s.hmass[tid] = v;
        s.hist[tid] = unsigned(c);
        s.hmin[tid] = m;
      }
      __syncthreads();
      if (tid < 32) {
        unsigned long long c[8], tot = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          c[j] = s.hmass[255 - 8 * tid - j];
          tot += c[j];
        }
        unsigned long long incl = tot;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
          if (tid >= o) incl += v;
        }
        unsigned long long above = incl - tot;
        if (above < target && target <= incl) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (above < target && target <= above + c[j]) {
              const int d = 255 - 8 * tid - j;
              s.bcast[0] = d;
              s.bcast[1] = above;
              // the boundary is this bin's smallest key when the bin is a single token, or
              // (count mode) when every key of the bin is selected
              const bool done = s.hist[d] == 1 || (!kMass && c[j] == target - above);
              s.bcast[2] = done ? s.hmin[d] : 0ull;
            }
            above += c[j];
          }
        }
      }
      __syncthreads();
      if (tid < cs) {
        unsigned long long* dst = cs > 1 ? peer(&s.bcast[4], tid) : &s.bcast[4];
        dst[0] = s.bcast[0];
        dst[1] = s.bcast[1];
        dst[2] = s.bcast[2];
      }
    }
    cluster_sync(cs);
    const unsigned long long d = s.bcast[4], above = s.bcast[5], done = s.bcast[6];
    __syncthreads();
    if (done) return done;
    prefix |= d << shift;
    pmask |= (unsigned long long)dmask << shift;
    target -= above;
    if (shift == 0) break;
    if (shift >= 8) {
      shift -= 8;
    } else {
      width = shift;
      shift = 0;
    }
  }
  return prefix;
}

// Sum of the fixed-point masses of the row's keys >= floor (cluster-wide; every CTA gets it).
// kProc: of the processed logits.
template <typename T, bool kProc = false>
__device__ unsigned long long cluster_mass(const Params& p, const Row& r, Smem& s, const T* rowp,
                                           int c0, int c1, bool aligned, uint4* sdata, float zmax,
                                           unsigned long long floor, RowProc rp = {}) {
  constexpr int VEC = VecOf<T>::n;
  const int cs = p.cs;
  const int rank = cs > 1 ? int(cg::this_cluster().block_rank()) : 0;
  unsigned long long acc = 0;
  auto body = [&](int i, const float (&z)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float y = centered(z[j], zmax, r.inv_t);
      if (!(y >= -27.0f)) continue;  // mass_fixed(y) == 0 below -26.34
      if (floor && key_of(z[j], i + j) < floor) continue;
      acc += (unsigned long long)mass_fixed_nonpos(y);
    }
  };
  if constexpr (kProc)
    for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, false, p.resident, p.proc, rp, body);
  else
    for_each_vec<T>(rowp, c0, c1, aligned, sdata, false, p.resident, body);
  acc = block_sum_u64(acc, s);
  if (threadIdx.x < cs) {
    unsigned long long* dst = cs > 1 ? peer(&s.cl_u64[rank][0], int(threadIdx.x)) : &s.cl_u64[0][0];
    *dst = acc;
  }
  cluster_sync(cs);
  unsigned long long tot = 0;
  for (int q = 0; q < cs; ++q) tot += s.cl_u64[q][0];
  __syncthreads();
  return tot;
}

// Top-p rows without top-k on a cluster (cs > 1), ranks 1..cs-1: the fixed-point mass of this
// CTA's chunk plus its share of rank 0's chunk (read from global memory: rank 0's shared memory
// is never read by a peer), pushed into rank 0's cl_u64[rank][0]; then the cluster barrier that
// rank 0 meets after its select of the row's candidates (it sums the partials). Rank 0's own
// chunk is thus summed while rank 0 selects. Integer sums: the total is the one cluster_mass
// computes, bit for bit.
template <typename T, bool kProc = false>
__device__ void cluster_mass_peer(const Params& p, const Row& r, Smem& s, const T* rowp, int c0,
                                  int c1, bool aligned, uint4* sdata, float zmax, RowProc rp = {}) {
  constexpr int VEC = VecOf<T>::n;
  const int cs = p.cs;
  const int rank = int(cg::this_cluster().block_rank());
  unsigned long long acc = 0;
  auto body = [&](int i, const float (&z)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float y = centered(z[j], zmax, r.inv_t);
      if (!(y >= -27.0f)) continue;  // mass_fixed(y) == 0 below -26.34
      acc += (unsigned long long)mass_fixed_nonpos(y);
    }
  };
  // rank 0's chunk [0, e0) in cs - 1 shares of whole vectors
  const int e0 = min(p.vocab, p.chunk);
  const int nv0 = (e0 + VEC - 1) / VEC;
  const int per = (nv0 + cs - 2) / (cs - 1);
  const int a = min(e0, (rank - 1) * per * VEC), b = min(e0, rank * per * VEC);
  if constexpr (kProc) {
    for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, false, p.resident, p.proc, rp, body);
    if (a < b) for_each_pvec<true, T>(rowp, a, b, aligned, nullptr, false, false, p.proc, rp, body);
  } else {
    for_each_vec<T>(rowp, c0, c1, aligned, sdata, false, p.resident, body);
    if (a < b) for_each_vec<T>(rowp, a, b, aligned, nullptr, false, false, body);
  }
  acc = block_sum_u64(acc, s);
  if (threadIdx.x == 0) *peer(&s.cl_u64[rank][0], 0) = acc;
  cluster_sync(cs);
}

// ------------------------------------------------------------------------------------------
// outputs
// ------------------------------------------------------------------------------------------
// The (processed, with kProc) logit of token tok of a row.
template <bool kProc, typename T>
__device__ __forceinline__ float tok_logit(const Params& p, const RowProc& rp, const T* rowp,
                                           int tok) {
  const float z = to_f(rowp[tok]);
  if constexpr (kProc) return proc_one(p.proc, rp, tok, z);
  return z;
}

__device__ __forceinline__ void write_row(const Params& p, int row, int tok, bool ok, float lp,
                                          float plp) {
  if (p.out64)
    static_cast<int64_t*>(p.tokens)[row] = ok ? tok : 0;
  else
    static_cast<int32_t*>(p.tokens)[row] = ok ? tok : 0;
  p.valid[row] = ok;
  if (p.flags & F_LOGPROBS) {
    p.lp[row] = ok ? lp : __int_as_float(0x7fc00000);
    p.plp[row] = ok ? plp : __int_as_float(0x7fc00000);
  }
}

// ------------------------------------------------------------------------------------------
// CAND finish (rank 0): the row's candidates, sorted; returns the token, or -1 when the
// candidates cannot decide (the generic path must run). S_row: top-p without top-k: the row's
// total mass; psum: sum of exp(y) over the kept candidates (logprobs).
// ------------------------------------------------------------------------------------------
// kBand (the split-candidates launch's approximate top-p mass, rows with top-k off): the row's
// total mass S is only known to lie in [S_row, S_hi]; returns -2 when that matters, i.e. when a
// candidate's kept bit differs between P = top_p_limit(S_row) and top_p_limit(S_hi) (the
// caller then computes S exactly and calls again). Otherwise the decisions are those of every S
// in the interval, the exact one included.
template <bool kBand = false>
__device__ int cand_finish(const Row& r, Smem& s, Fin& f, int n, int vocab, float zmax,
                           unsigned long long S_row, bool lp, float& psum, float& ytok,
                           unsigned long long S_hi = 0) {
  const int tid = threadIdx.x;
  // skey[0..n) holds the candidates unsorted: rank by counting (kTpk threads per key)
  constexpr int kTpk = kThreads / kCandCap;
  static_assert(kTpk >= 1 && kTpk <= 32 && (kTpk & (kTpk - 1)) == 0, "threads per key");
  unsigned long long key = 0;
  int rk = 0;
  const int kk = tid / kTpk, part = tid % kTpk;
  if (kk < n) {
    key = f.skey[kk];
    for (int j = part; j < n; j += kTpk) rk += f.skey[j] > key;
  }
#pragma unroll
  for (int o = 1; o < kTpk; o <<= 1) rk += __shfl_xor_sync(0xffffffffu, rk, o);
  __syncthreads();
  if (kk < n && part == 0) f.sprefix[rk] = key;  // sprefix as scratch for the sorted keys
  __syncthreads();
  float y = -INFINITY;
  unsigned long long e = 0;
  if (tid < n) {
    key = f.sprefix[tid];
    y = centered(key56_value(key), zmax, r.inv_t);
    if (r.p_on) e = (unsigned long long)mass_fixed_nonpos(y);
  }
  __syncthreads();
  if (tid < n) {
    f.skey[tid] = key;
    f.sy[tid] = y;
  }
  // inclusive prefix of masses in key order (n <= kCandCap: warps 0..kCandCap / 32 - 1)
  unsigned long long incl = e;
  const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31 && warp < kCandCap / 32) s.red64[warp] = incl;
  __syncthreads();
  if (tid < n) {
    unsigned long long off = 0;
    for (int w = 0; w < warp; ++w) off += s.red64[w];
    f.sprefix[tid] = incl + off;
  }
  __syncthreads();
  // decisions
  const unsigned long long S = r.k_on ? (n ? f.sprefix[n - 1] : 0) : S_row;
  const int64_t P = r.p_on ? top_p_limit(r.top_p, int64_t(S)) : 0;
  bool kept = false;
  if (tid < n) {
    kept = y >= r.L && tid < r.k;
    if (r.p_on) kept = kept && int64_t(f.sprefix[tid] - e) < P;
  }
  if constexpr (kBand) {
    if (!r.k_on && r.p_on) {
      const int64_t P2 = top_p_limit(r.top_p, int64_t(S_hi));
      const int64_t before = tid < n ? int64_t(f.sprefix[tid] - e) : 0;
      if (__syncthreads_or(tid < n && y >= r.L && before >= P && before < P2)) return -2;
    }
  }
  // can the candidates decide? (only rows whose kept set is not bounded by top-k)
  if (!r.k_on && n > 0) {
    bool last_kept;
    {
      const float yl = f.sy[n - 1];
      bool kl = yl >= r.L;
      if (r.p_on) {
        const unsigned long long el = (unsigned long long)mass_fixed_nonpos(yl);
        kl = kl && int64_t(f.sprefix[n - 1] - el) < P;
      }
      last_kept = kl;
    }
    // the kept set may continue past the last candidate: undecided if such a token could win,
    // or if logprobs need its mass
    if (n >= r.K && r.K < vocab && last_kept && (f.sy[n - 1] >= kDead || lp)) return -1;
  }
  // Gumbel over the kept candidates
  float c = -INFINITY;
  int id = 0x7fffffff;
  if (kept) {
    id = int(key56_id(key));
    c = fadd(y, gumbel_from_bits(philox_word(r.seed, r.offset, uint32_t(id), kStreamSample)));
  }
  unsigned long long b = kept ? pack_best(c, uint32_t(id)) : 0ull;
  b = block_max_u64(b, s);
  psum = lp ? block_sum_f(kept ? expf(y) : 0.0f, s) : 0.0f;
  const int tok = int(~uint32_t(b));
  ytok = 0.0f;
  if (tid < n && kept && id == tok) s.bcast[3] = __float_as_uint(y);
  __syncthreads();
  ytok = __uint_as_float(unsigned(s.bcast[3]));
  return tok;
}

// ------------------------------------------------------------------------------------------
// HIST (rank 0 decides; every CTA of the cluster calls): top-p rows without top-k on a cluster
// (cs > 1, F_HIST_TOPP; min-p optional). The kept set is a prefix of the key order, and y is
// non-increasing along it, so the bins of y (bin b holds y in (-(b + 1) / 16, -b / 16]) are
// ordered like the keys. Level 0: every CTA adds each token's fixed-point mass e into its bin
// (y > -16: bins 0..255, one shared-memory histogram of masses and counts) and into the row's
// total S, and pushes its histogram to rank 0; rank 0 sums them and finds b*, the bin where the
// cumulative mass from the top reaches P = top_p_limit(S). Every token of a bin above b* is
// kept (the mass before it is < P), every token below it is not (the mass before it is >= P);
// b* itself is the boundary. (Is the crossing below y = -16: level 1, y in (-32, -16]; the mass
// is 0 below -26.34, so level 1 always finds it.) Then one pass: the tokens above b* (with
// y >= the min-p bound) are scored (Gumbel, y >= kDead only: no other can win) and summed
// (logprobs), the boundary bin's keys are pushed to rank 0, which ranks them (the mass before
// each: a count over the bin) and decides them with the same rule. Integer masses: every
// decision is the contract's. Boundary keys are not needed when the bin lies below kDead and
// no logprob needs their mass exactly (without min-p the kept mass is then P up to one token
// of mass < e^-19.5 relative to the max token's: 3.4e-9 relative). A boundary bin of more than
// hist_cap() tokens that is needed (near-flat rows) returns the row's S: the caller runs the
// generic path (S known). Returns 0 when the row was written (rank 0) / is done (the peers).
// Shared memory: the CTA's histogram in s.hmass / s.hist; rank 0 receives the histograms in
// cbuf (kCbufPerCta words per CTA: 256 masses, 256 counts, S), then the boundary keys (cbuf[0,
// cap)) and their masses (cbuf[cap, 2 cap)); the decision in every CTA's s.bcast[4..6].
// ------------------------------------------------------------------------------------------
constexpr int kHistBins = 256;
constexpr int kHistLevels = 2;
constexpr int kHistSlotS = kHistBins + kHistBins / 2;  // cbuf word of the CTA's mass sum
static_assert(kHistSlotS < kCbufPerCta, "a CTA's histogram must fit its cbuf slot");
constexpr unsigned long long kHistNext = 1ull << 32, kHistSkip = 1ull << 33,
                             kHistGeneric = 1ull << 34;
// global bin of y <= 0; kHistLevels * kHistBins for y <= -32 (mass 0, never kept) and -inf
__device__ __forceinline__ int hist_bin(float y) {
  return y > -32.0f ? int(fmul(y, -16.0f)) : kHistLevels * kHistBins;
}
__device__ __forceinline__ int hist_cap(int cs) {
  const int c = cs * kCbufPerCta / 2;
  return c < 2048 ? c : 2048;
}

template <typename T, bool kProc, typename RawLp>
__device__ unsigned long long hist_topp(const Params& p, const Row& r, Smem& s, const T* rowp,
                                        int row, int c0, int c1, bool aligned, uint4* sdata,
                                        float zmax, unsigned long long* cbuf, const RowProc& rp,
                                        RawLp raw_lp) {
  constexpr int VEC = VecOf<T>::n;
  const int cs = p.cs;
  const int rank = int(cg::this_cluster().block_rank());
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool lp = p.flags & F_LOGPROBS;
  const float inv_t = r.inv_t;
  const int cap = hist_cap(cs);
  unsigned long long* slot = peer(cbuf, 0) + rank * kCbufPerCta;  // this CTA's slot at rank 0
  unsigned long long S = 0, P = 0, above = 0;  // (rank 0) mass of the levels above this one
  unsigned long long code = kHistGeneric;
  for (int level = 0; level < kHistLevels; ++level) {
    if (tid < kHistBins) {
      s.hmass[tid] = 0;
      s.hist[tid] = 0;
    }
    __syncthreads();
    const int lo = level * kHistBins;
    unsigned long long acc = 0;
    auto body = [&](int, const float (&z)[VEC]) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float y = centered(z[j], zmax, inv_t);
        const int b = hist_bin(y) - lo;
        if (level == 0 || unsigned(b) < unsigned(kHistBins)) {
          const unsigned long long e = (unsigned long long)mass_fixed_nonpos(y);
          acc += e;
          if (unsigned(b) < unsigned(kHistBins)) {
            smem_add_u64(&s.hmass[b], e);
            atomicAdd(&s.hist[b], 1u);
          }
        }
      }
    };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, false, p.resident, p.proc, rp, body);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, sdata, false, p.resident, body);
    if (level == 0)
      acc = block_sum_u64(acc, s);  // (its barriers order the histogram too)
    else
      __syncthreads();
    if (tid < kHistBins) {
      slot[tid] = s.hmass[tid];
      reinterpret_cast<unsigned*>(slot + kHistBins)[tid] = s.hist[tid];
    }
    if (level == 0 && tid == 0) slot[kHistSlotS] = acc;
    cluster_sync(cs);
    if (rank == 0) {
      if (level == 0) {
        S = block_sum_u64(tid < cs ? cbuf[tid * kCbufPerCta + kHistSlotS] : 0ull, s);
        P = (unsigned long long)top_p_limit(r.top_p, int64_t(S));
      }
      unsigned long long m = 0;
      unsigned cnt = 0;
      if (tid < kHistBins) {
        for (int q = 0; q < cs; ++q) {
          m += cbuf[q * kCbufPerCta + tid];
          cnt += reinterpret_cast<const unsigned*>(cbuf + q * kCbufPerCta + kHistBins)[tid];
        }
      }
      // inclusive prefix of the bins' masses (bins 0..255: warps 0..7)
      unsigned long long incl = m;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (tid == 0) s.bcast[0] = ~0ull;
      __syncthreads();
      if (lane == 31 && warp < kHistBins / 32) s.red64[warp] = incl;
      __syncthreads();
      unsigned long long off = 0, tot = 0;
      for (int w = 0; w < kHistBins / 32; ++w) {
        off += w < warp ? s.red64[w] : 0ull;
        tot += s.red64[w];
      }
      incl += off + above;
      // the bin where the cumulative mass reaches P (one at most: it holds mass)
      if (tid < kHistBins && incl >= P && incl - m < P) {
        s.bcast[0] = unsigned(tid);
        s.bcast[1] = incl - m;
        s.bcast[2] = cnt;
      }
      __syncthreads();
      if (tid < cs) {
        unsigned long long c = kHistGeneric, mab = 0;
        if (s.bcast[0] != ~0ull) {
          const int bstar = lo + int(s.bcast[0]);
          mab = s.bcast[1];
          // the bin's upper edge -bstar / 16 below kDead: its tokens cannot win
          const bool dead = float(bstar) * 0.0625f > -kDead;
          const bool skip = dead && (!lp || !r.mp_on);
          if (skip || s.bcast[2] <= unsigned(cap)) c = unsigned(bstar) | (skip ? kHistSkip : 0ull);
        } else if (level + 1 < kHistLevels) {
          c = kHistNext;
        }
        unsigned long long* dst = peer(&s.bcast[4], tid);
        dst[0] = c;
        dst[1] = mab;
        dst[2] = S;
      }
      above += tot;
      if (tid == 0) s.counter = 0;
    }
    cluster_sync(cs);
    code = s.bcast[4];
    if (code != kHistNext) break;
  }
  if (code & kHistGeneric) return s.bcast[6];

  // the kept tokens above the boundary bin, and its keys to rank 0
  const int bstar = int(unsigned(code));
  const bool push = !(code & kHistSkip);
  unsigned* rctr = peer(&s.counter, 0);
  unsigned long long* rbuf = peer(cbuf, 0);
  unsigned long long best = 0, mk = 0;
  auto fin = [&](int i, const float (&z)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float y = centered(z[j], zmax, inv_t);
      const int b = hist_bin(y);
      if (b < bstar) {
        if (y >= r.L) {
          if (lp) mk += (unsigned long long)mass_fixed_nonpos(y);
          if (y >= kDead) {
            const uint32_t id = uint32_t(i + j);
            const float c =
                fadd(y, gumbel_from_bits(philox_word(r.seed, r.offset, id, kStreamSample)));
            const unsigned long long pb = pack_best(c, id);
            best = pb > best ? pb : best;
          }
        }
      } else if (b == bstar && push) {
        const unsigned pos = atomicAdd(rctr, 1u);
        if (pos < unsigned(cap)) rbuf[pos] = key_of(z[j], i + j);
      }
    }
  };
  if constexpr (kProc)
    for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, false, p.resident, p.proc, rp, fin);
  else
    for_each_vec<T>(rowp, c0, c1, aligned, sdata, false, p.resident, fin);
  best = block_max_u64(best, s);
  if (lp) mk = block_sum_u64(mk, s);
  if (tid == 0) {
    *peer(&s.best[rank], 0) = best;
    *peer(&s.cl_u64[rank][1], 0) = mk;
  }
  cluster_sync(cs);
  if (rank != 0) return 0;

  // rank 0: the boundary bin's tokens, decided by the mass before each in key order
  const int n = push ? min(int(s.counter), cap) : 0;
  const unsigned long long mab = s.bcast[5];
  for (int j = tid; j < n; j += kThreads) {
    const float y = centered(key56_value(cbuf[j]), zmax, inv_t);
    cbuf[cap + j] = (unsigned long long)mass_fixed_nonpos(y);
  }
  __syncthreads();
  best = 0;
  mk = 0;
  for (int j = tid; j < n; j += kThreads) {
    const unsigned long long key = cbuf[j], e = cbuf[cap + j];
    unsigned long long before = 0;
    for (int i = 0; i < n; ++i) before += cbuf[i] > key ? cbuf[cap + i] : 0ull;
    const float y = centered(key56_value(key), zmax, inv_t);
    if (mab + before < P && y >= r.L) {
      mk += e;
      if (y >= kDead) {
        const uint32_t id = key56_id(key);
        const float c = fadd(y, gumbel_from_bits(philox_word(r.seed, r.offset, id, kStreamSample)));
        const unsigned long long pb = pack_best(c, id);
        best = pb > best ? pb : best;
      }
    }
  }
  best = block_max_u64(best, s);
  if (lp) mk = block_sum_u64(mk, s);
  if (tid == 0) {
    for (int q = 0; q < cs; ++q) {
      best = s.best[q] > best ? s.best[q] : best;
      mk += s.cl_u64[q][1];
    }
    // (a skipped dead boundary without min-p: the kept mass is P, up to one token's mass)
    if (!push) mk = r.mp_on ? mk : P;
    const int tok = int(best_id(best));
    float plp = 0.0f;
    if (lp) {
      const float ytok = centered(tok_logit<kProc>(p, rp, rowp, tok), zmax, inv_t);
      plp = ytok - logf(float(double(mk) * 0x1p-38));
    }
    write_row(p, row, tok, true, raw_lp(tok), plp);
  }
  return 0;
}

// ------------------------------------------------------------------------------------------
// the kernel
// ------------------------------------------------------------------------------------------
// FILT = false: no row has a top-k / top-p filter (greedy / PLAIN rows only, min-p included);
// true: any mode. Two instantiations keep each one's registers to its own paths.
// kProc: logits processing (p.proc, processing.cuh) applied wherever the logits are read; z
// below is then the processed logit everywhere (order, max, filters, scores, processed
// logprobs) except in the raw log-sum-exp (raw logprobs) and the raw logit of the token. The
// NaN / +inf flag is that of the processed row; a NaN / +inf raw logit (at a masked position)
// only makes the raw logprob NaN (bit 1 of `bad`).
template <typename T, bool FILT, bool kProc = false>
__global__ void __launch_bounds__(kThreads, 1) sample_kernel(const Params p) {
  constexpr int VEC = VecOf<T>::n;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  unsigned long long* cbuf =
      reinterpret_cast<unsigned long long*>(smem_raw + ((sizeof(Smem) + 15) / 16) * 16);
  const int cs = p.cs;
  const int cbuf_n = cs * kCbufPerCta;
  unsigned long long* cand = cbuf + cbuf_n;  // [kCandBuf] (FILT)
  uint4* sdata = reinterpret_cast<uint4*>(cand + (FILT ? kCandBuf : 0));

  int row0 = blockIdx.x / cs;
  if (p.defer) {
    // after the split-candidates launch (launch_scand, PDL): only the rows it left undecided
    // (the same flag for every CTA of the cluster: all return before any cluster barrier)
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (!__ldcg(p.defer + row0)) return;
  }
  if (p.dq_in) {
    // after a one-CTA-per-row launch of this kernel (launch_wide, PDL): cluster j samples the
    // j-th row that launch queued, if any (every CTA of the cluster reads the same values)
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    const unsigned nq = min(__ldcg(p.dq_in), unsigned(kWideSlots));
    if (unsigned(row0) >= nq) return;
    row0 = int(__ldcg(p.dq_in + 1 + row0));
  }
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  // F_WIDE_DEFER: the wider launch after this one may start (its CTAs wait for this grid)
  if (p.dq_out) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int row = row0;
  const int rank = cs > 1 ? int(cg::this_cluster().block_rank()) : 0;
  const int tid = threadIdx.x;
  const Row r = row_params(p, row);
  RowProc rp;
  if constexpr (kProc) rp = row_proc(p.proc, row / p.tpr);
  const T* rowp = static_cast<const T*>(p.logits) + int64_t(row) * p.stride;
  const bool aligned = (reinterpret_cast<uintptr_t>(rowp) & 15) == 0;
  const int c0 = rank * p.chunk;
  const int c1 = min(p.vocab, c0 + p.chunk);
  const bool lp = p.flags & F_LOGPROBS;
  const bool resident = p.resident;
  const bool plain_stream = !FILT && r.mode == kPlain && !resident && !(p.flags & F_FORCE_EXACT);

  if (tid == 0) s.bar_key = key32(-INFINITY);
  // A CTA may write a peer's shared memory only once the peer has started (CUDA programming
  // guide, distributed shared memory): arrive here, wait before the first push (after pass 1),
  // so the wait costs nothing.
  if (cs > 1) cg::this_cluster().barrier_arrive();
  __syncthreads();
  // ---------------- pass 1 ----------------
  float zm = -INFINITY;
  int zi = 0x7fffffff;
  unsigned bad = 0;
  Lse raw, proc;
  float zlo = INFINITY;
  PlainAcc pa;
  const double inv_t_d = double(r.inv_t);
  auto common = [&](int i, const float (&z)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (z[j] > zm) {
        zm = z[j];
        zi = i + j;
      }
      bad |= z[j] < INFINITY ? 0u : 1u;  // NaN or +inf (padding is -inf)
      if (FILT && i + j < c1) zlo = fminf(zlo, z[j]);
    }
    if (lp) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (!kProc) raw.add(z[j], 1.0f);
        if (r.mode == kPlain) proc.add(z[j], r.inv_t);
      }
    }
  };
  // kProc: the raw values' sums (raw logprobs) and NaN / +inf flag, in the same passes
  unsigned rawbad = 0;
  auto rawf = [&](int, const float (&z)[VEC]) {
    if (lp) raw_vec<VEC>(raw, rawbad, z);
  };
  unsigned long long th0 = 0;
  if (FILT && r.mode == kCand) {
    // head (each thread's first kUnroll vectors): a bound th0 = the K-th largest of the threads'
    // two largest keys (K distinct elements are >= it; 0 when fewer than K keys were seen)
    const int head_end = min(c1, c0 + max(kHeadElems, ((c1 - c0) / 4 + 31) / 32 * 32));
    unsigned long long tkey = 0, tkey2 = 0;
    auto head = [&](int i, const float (&z)[VEC]) {
      common(i, z);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (z[j] > -INFINITY) {
          const unsigned long long k = key_of(z[j], i + j);
          if (k > tkey) {
            tkey2 = tkey;
            tkey = k;
          } else if (k > tkey2) {
            tkey2 = k;
          }
        }
      }
    };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, head_end, aligned, sdata, resident, false, p.proc, rp, head,
                             rawf);
    else
      for_each_vec<T>(rowp, c0, head_end, aligned, sdata, resident, false, head);
    unsigned long long keys1[2] = {tkey, tkey2};
    int nvalid = 0;
    th0 = block_select<2>(keys1, r.K, s, &nvalid);
    if (nvalid < r.K) th0 = 0;
    if (tid == 0) s.ncb = 0;
    __syncthreads();
    // the whole chunk (the head again, from L2 / shared memory): append the keys >= th0
    auto append = [&](int i, const float (&z)[VEC]) {
      if (i >= head_end) common(i, z);
      cand_append<VEC>(s, cand, i, z, th0);
    };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, resident && head_end < c1, false, p.proc,
                             rp, append, [&](int i, const float (&z)[VEC]) {
                               if (i >= head_end) rawf(i, z);
                             });
    else
      for_each_vec<T>(rowp, c0, c1, aligned, sdata, resident && head_end < c1, false, append);
  } else if (!FILT && plain_stream) {
    auto plain = [&](int i, const float (&z)[VEC]) {
      common(i, z);
      plain_vec<VEC, kProc>(pa, s, i, z, r.inv_t, inv_t_d, r.seed, r.offset);
    };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, false, false, p.proc, rp, plain, rawf);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, sdata, false, false, plain);
  } else {
    auto base = [&](int i, const float (&z)[VEC]) { common(i, z); };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, sdata, resident && r.mode != kGreedy, false,
                             p.proc, rp, base, rawf);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, sdata, resident && r.mode != kGreedy, false, base);
  }

  // ---------------- CTA summary ----------------
  block_argmax(zm, zi, s);
  if constexpr (kProc) {
    const int b = block_sum_int(int(bad) + int(rawbad << 16), s);
    bad = ((b & 0xffff) ? 1u : 0u) | ((b >> 16) ? 2u : 0u);
  } else {
    bad = block_sum_int(int(bad), s) ? 1u : 0u;
  }
  if (lp) {
    raw = block_lse(raw, 1.0f, s, 0);
    if (r.mode == kPlain) proc = block_lse(proc, r.inv_t, s, 1);
  }
  Summary mine{};
  mine.zmax = zm;
  mine.zid = zi;
  mine.bad = bad;
  mine.lm = raw.m;
  mine.ls = raw.s;
  mine.pm = proc.m;
  mine.ps = proc.s;
  mine.h1 = -INFINITY;
  mine.h2 = -INFINITY;
  mine.z1 = -INFINITY;
  mine.w1 = 0x7fffffff;
  if (!FILT && plain_stream) {
    block_top2(pa, s, mine);  // (its barriers: every warp's bar updates are done)
    mine.h2 = plain_best_h2(mine.h2, s);
  }
  if (FILT) {
    float zl = zlo;
#pragma unroll
    for (int o = 16; o; o >>= 1) zl = fminf(zl, shfl_x(zl, o));
    __syncthreads();
    if ((tid & 31) == 0) s.redf[tid >> 5][1] = zl;
    __syncthreads();
    zl = s.redf[tid & 31][1];
#pragma unroll
    for (int o = 16; o; o >>= 1) zl = fminf(zl, shfl_x(zl, o));
    mine.zmin = zl;
  }
  if (cs > 1) cg::this_cluster().barrier_wait();  // every peer has started (see the arrive)
  if (FILT && r.mode == kCand) {
    // this CTA's top K of its buffer, pushed to rank 0's cbuf[rank][*]
    __syncthreads();
    const unsigned nb = s.ncb;
    constexpr int RB = kCandBuf / kThreads;
    unsigned long long keys[RB];
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      const unsigned slot = unsigned(tid + i * kThreads);
      keys[i] = slot < nb && slot < unsigned(kCandBuf) ? cand[slot] : 0ull;
    }
    const unsigned long long t = block_select<RB>(keys, r.K, s);
    mine.ovf = nb > unsigned(kCandBuf) ? 1u : 0u;
    if (tid == 0) s.counter = 0;
    __syncthreads();
    unsigned long long* dst = cs > 1 ? peer(cbuf, 0) : cbuf;
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      if (t && keys[i] >= t) {
        const unsigned pos = atomicAdd(&s.counter, 1u);
        if (pos < unsigned(r.K)) dst[rank * kCandCap + pos] = keys[i];
      }
    }
    __syncthreads();
    mine.ncand = min(int(s.counter), r.K);
  }
  // push the summary into every CTA of the cluster
  if (tid < cs) {
    Summary* dst = cs > 1 ? peer(&s.summ[rank], tid) : &s.summ[0];
    *dst = mine;
  }
  cluster_sync(cs);  // B1

  // ---------------- row summary (identical in every CTA): warp 0 merges ----------------
  if (tid < 32) {
    Summary u = tid < cs ? s.summ[tid] : summ_empty();
    warp_summ_merge(u, lp, r.inv_t);
    if (tid == 0) s.row = u;
  }
  __syncthreads();
  const float zmax = s.row.zmax;
  const int zid = s.row.zid;
  const unsigned rbad = s.row.bad, rovf = s.row.ovf;
  const int ncand = s.row.ncand;
  Lse rraw{s.row.lm, s.row.ls}, rproc{s.row.pm, s.row.ps};
  const double h1 = s.row.h1, h2 = s.row.h2;
  const float z1 = s.row.z1;
  const int w1 = s.row.w1;
  const bool ok = (kProc ? !(rbad & 1u) : !rbad) && zmax > -INFINITY;
  auto raw_lp = [&](int tok) -> float {
    if (!lp) return 0.0f;
    if constexpr (kProc) {
      if (rbad & 2u) return __int_as_float(0x7fc00000);  // a NaN / +inf raw logit
    }
    const float zt = to_f(rowp[tok]);
    return (zt - rraw.m) - logf(rraw.s);  // not zt - (m + log s): exact at |z| ~ 1e30
  };
  if (!ok) {
    if (rank == 0 && tid == 0) write_row(p, row, 0, false, 0.0f, 0.0f);
    return;
  }
  if (r.mode == kGreedy) {
    if (rank == 0 && tid == 0) write_row(p, row, zid, true, raw_lp(zid), 0.0f);
    return;
  }
  // (min-p rows stream only through CAND (p.minp_cand); were one here, the unfiltered winner
  // would be the kept set's winner only when kept, and its logprob would need the exact pass)
  if (!FILT && plain_stream && plain_gap_ok(h1, h2, z1, zmax, r.inv_t) &&
      (!r.mp_on || (!lp && centered(z1, zmax, r.inv_t) >= r.L))) {
    if (rank == 0 && tid == 0) {
      float plp = 0.0f;
      if (lp) {
        // sum exp(y) = sum exp((z - pm) / T) * exp((pm - zmax) / T), pm == zmax
        plp = centered(z1, zmax, r.inv_t) - logf(rproc.s);
      }
      write_row(p, row, w1, true, raw_lp(w1), plp);
    }
    return;
  }
  if (r.mode == kPlain) {
    if (plain_stream && p.stats && rank == 0 && tid == 0) atomicAdd(&p.stats[0], 1u);
    int tok = 0;
    float ps = 0.0f;
    exact_pass<T, kProc>(p, r, s, rowp, c0, c1, aligned, sdata, zmax, zid, 0ull, tok, ps, rp);
    if (rank == 0 && tid == 0)
      write_row(p, row, tok, true, raw_lp(tok),
                centered(tok_logit<kProc>(p, rp, rowp, tok), zmax, r.inv_t) - logf(ps));
    return;
  }

  if constexpr (!FILT) return;
  // top-p rows without top-k that HIST or the candidates left undecided: the row's total mass
  // S, which the generic path's top-p select needs (the same integer sum over the same tokens),
  // 0: unknown
  unsigned long long S_known = 0;
  if (r.mode == kHist) {
    S_known =
        hist_topp<T, kProc>(p, r, s, rowp, row, c0, c1, aligned, sdata, zmax, cbuf, rp, raw_lp);
    if (!S_known) return;
  }
  // ---------------- CAND ----------------
  bool generic = r.mode == kGeneric || r.mode == kHist || (r.mode == kCand && rovf);
  if (r.mode == kCand && !rovf) {
    unsigned long long S_row = 0;
    // top-p without top-k: the row's total mass; on a cluster the peers sum it (rank 0's chunk
    // included) while rank 0 selects the row's candidates (cluster_mass_peer)
    const bool mass_overlap = !r.k_on && r.p_on && cs > 1;
    if (!r.k_on && r.p_on && !mass_overlap)
      S_row = cluster_mass<T, kProc>(p, r, s, rowp, c0, c1, aligned, sdata, zmax, 0ull, rp);
    if (mass_overlap && rank != 0)
      cluster_mass_peer<T, kProc>(p, r, s, rowp, c0, c1, aligned, sdata, zmax, rp);
    int need_generic = 0;
    Fin& fin = *reinterpret_cast<Fin*>(cand);
    if (rank == 0) {
      // the row's top K among the cs * K candidates
      int n = ncand;
      if (cs > 1) {
        constexpr int RR = kMaxCluster * kCandCap / kThreads;  // 8
        unsigned long long keys[RR];
        int q = 0;
#pragma unroll
        for (int i = 0; i < RR; ++i) {
          keys[i] = 0;
          const int slot = tid + i * kThreads;
          const int cq = slot / kCandCap, ci = slot % kCandCap;
          if (cq < cs && ci < s.summ[cq].ncand) keys[i] = cbuf[cq * kCandCap + ci];
        }
        (void)q;
        const unsigned long long t = block_select<RR>(keys, r.K, s);
        if (tid == 0) s.counter = 0;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RR; ++i) {
          if (t && keys[i] >= t) {
            const unsigned pos = atomicAdd(&s.counter, 1u);
            if (pos < unsigned(kCandCap)) fin.skey[pos] = keys[i];
          }
        }
        __syncthreads();
        n = min(int(s.counter), r.K);
      } else {
        if (tid < n) fin.skey[tid] = cbuf[tid];
        __syncthreads();
      }
      if (mass_overlap) {
        cluster_sync(cs);  // the peers' partial masses have arrived
        for (int q = 1; q < cs; ++q) S_row += s.cl_u64[q][0];
        __syncthreads();
      }
      float ps = 0.0f, ytok = 0.0f;
      const int tok = cand_finish(r, s, fin, n, p.vocab, zmax, S_row, lp, ps, ytok);
      if (tok < 0) {
        need_generic = 1;
      } else if (tid == 0) {
        write_row(p, row, tok, true, raw_lp(tok), ytok - logf(ps));
      }
      if (!r.k_on) {     // the peers wait for the decision (top bit), with the row's mass S_row
        if (tid < cs) {  // (< V 2^38 < 2^63; 0 without top-p)
          unsigned long long* dst = cs > 1 ? peer(&s.bcast[7], tid) : &s.bcast[7];
          *dst = need_generic ? (1ull << 63) | S_row : 0ull;
        }
      }
    }
    if (!r.k_on) {
      cluster_sync(cs);  // B2
      const unsigned long long b7 = s.bcast[7];
      need_generic = b7 != 0;
      S_known = r.p_on ? b7 & ~(1ull << 63) : 0ull;
    }
    if (!need_generic) return;
    generic = true;
  }
  if (!generic) return;
  if (p.dq_out) {
    // F_WIDE_DEFER (one CTA per row, cs == 1): the row goes to the wider launch after this one
    // while it has a free slot (launch_wide); otherwise this CTA samples it alone as below
    __syncthreads();
    if (tid == 0) {
      const unsigned pos = atomicAdd(p.dq_out, 1u);
      if (pos < unsigned(kWideSlots)) p.dq_out[1 + pos] = unsigned(row);
      s.counter = pos < unsigned(kWideSlots) ? 1u : 0u;
    }
    __syncthreads();
    if (s.counter) return;
  }

  // ---------------- generic: exact thresholds, then the exact pass ----------------
  if (p.stats && rank == 0 && tid == 0) atomicAdd(&p.stats[1], 1u);
  unsigned long long thr = 0;
  const unsigned long long khi = key56(key32(zmax), 0u);
  if (r.k_on) {
    const unsigned long long klo = key56(key32(s.row.zmin), uint32_t(p.vocab - 1));
    thr = cluster_select<T, false, kProc>(p, r, s, rowp, c0, c1, aligned, sdata, zmax, klo, khi,
                                          0ull, (unsigned long long)r.k, cbuf, rp);
  }
  if (r.p_on) {
    // (thr == 0 without top-k: the mass the candidate path summed, when it ran)
    const unsigned long long S =
        S_known && !r.k_on
            ? S_known
            : cluster_mass<T, kProc>(p, r, s, rowp, c0, c1, aligned, sdata, zmax, thr, rp);
    const unsigned long long P = (unsigned long long)top_p_limit(r.top_p, int64_t(S));
    // below zcut the mass is 0: y <= fl(fl(z - zmax) / T') < -26.9 < -26.34 (margins: 0.1 %)
    const double zcut = double(zmax) - 27.0 / double(r.inv_t) * 1.001 - fabs(double(zmax)) * 1e-6;
    const unsigned long long mlo = key56(key32(__double2float_rd(zcut)), uint32_t(p.vocab - 1));
    const unsigned long long tp = cluster_select<T, true, kProc>(
        p, r, s, rowp, c0, c1, aligned, sdata, zmax, mlo, khi, thr, P, cbuf, rp);
    thr = tp > thr ? tp : thr;
  }
  int tok = 0;
  float ps = 0.0f;
  exact_pass<T, kProc>(p, r, s, rowp, c0, c1, aligned, sdata, zmax, zid, thr, tok, ps, rp);
  if (rank == 0 && tid == 0)
    write_row(p, row, tok, true, raw_lp(tok),
              centered(tok_logit<kProc>(p, rp, rowp, tok), zmax, r.inv_t) - logf(ps));
}

// ------------------------------------------------------------------------------------------
// split launch (small batches of temperature / greedy rows; see launch_split)
// ------------------------------------------------------------------------------------------
// Phase 1 (split1_kernel, kSplitThreads threads): CTA (row, c) of p.split per row reads its
// chunk once and writes a SplitSum to p.ws: max raw logit and its lowest id, the NaN / +inf
// flag, log-sum-exp parts relative to the chunk max (logprobs), and for temperature rows the
// best approximate score h = fl32(fl32(z * t) + G) with its id and a bound on every other score
// of the chunk. Float32 throughout: the same pruning test and gap test as the Triton sampler's
// PLAIN rows (python/tokenspeed_kernel/triton/sampling.py, "Bound"), whose proof needs only that
// `beta` is the h of some token of the row (here the thread's running best):
//   an element is evaluated when u + 2^-19 >= exp2(-exp2(z t log2e - (beta - 0.03) log2e) log2e)
//   (flush-to-zero hardware exp2); a skipped element has h < beta - 0.02, so a thread that
//   skipped reports max(second best, best - 0.02) as its second best.
// Phase 2 (split2_kernel, one kThreads CTA per row, programmatic dependent launch): one warp
// merges the row's summaries; greedy rows take the max; temperature rows take the best h's token
// when A = |fl32(zmax t)| <= 2^14 and h_best - h_second > (A + 256) 2^-21; otherwise (near ties,
// huge |z t|, t = +inf, F_FORCE_EXACT) the whole CTA runs the exact pass over the row.
// Lean on purpose: at B = 1 the call is latency-bound (ncu: each warp's serial instruction
// chain, not bandwidth), so phase 1 uses small CTAs, one read and float32 scores.
// kProc (logits processing): z is the processed logit (max, flag, scores, processed sums); the
// raw sums are kept relative to the chunk's raw max (SplitSum::rm) for the raw logprobs, and a
// NaN / +inf raw logit sets bit 1 of `bad` (raw logprob NaN; bit 0: the processed row's flag).
constexpr int kSplitThreads = 256;
constexpr int kSplitWarps = kSplitThreads / 32;
constexpr float kPruneC = 0.03f, kPruneMargin = 0.02f, kPruneDelta = 1.9073486328125e-06f;  // 2^-19
constexpr float kGapAMax = 16384.0f, kGapAPad = 256.0f, kGapScale = 4.76837158203125e-07f;  // 2^-21

struct SplitSum {
  float zmax;    // max raw logit of the chunk (-inf: none)
  int zid;       // its lowest id
  float h1;      // best approximate score (temperature rows)
  int i1;        // its id
  float h2;      // >= every other score of the chunk (second best, or the skip bound)
  float z1;      // raw logit of the best
  float ls, ps;  // sum exp(z - zmax), sum exp((z - zmax) t)   (logprobs)
  unsigned bad;  // a NaN or +inf was seen
  unsigned rm;   // kProc + logprobs: the raw max (float bits; ls is relative to it), else 0
};

template <bool kProc = false>
__device__ __forceinline__ SplitSum split_empty() {
  SplitSum u;
  u.zmax = -INFINITY;
  u.zid = 0x7fffffff;
  u.h1 = -INFINITY;
  u.i1 = 0x7fffffff;
  u.h2 = -INFINITY;
  u.z1 = -INFINITY;
  u.ls = 0.0f;
  u.ps = 0.0f;
  u.bad = 0;
  u.rm = kProc ? __float_as_uint(-INFINITY) : 0u;
  return u;
}

// sum exp((m1 - m) * scale) with m = max(m1, m2) >= m1; 1 when m1 == m (also for scale = inf)
__device__ __forceinline__ float lse_factor(float m1, float m, float scale) {
  return m1 == m ? 1.0f : (m1 > -INFINITY ? __expf((m1 - m) * scale) : 0.0f);
}

// u <- u merged with v (order-free but for the float sums; ties: lowest id)
template <bool kProc = false>
__device__ __forceinline__ void split_merge(SplitSum& u, const SplitSum& v, bool lp, float inv_t) {
  if (lp) {
    const float m = fmaxf(u.zmax, v.zmax);
    if (m > -INFINITY) {
      if constexpr (!kProc)
        u.ls = u.ls * lse_factor(u.zmax, m, 1.0f) + v.ls * lse_factor(v.zmax, m, 1.0f);
      u.ps = u.ps * lse_factor(u.zmax, m, inv_t) + v.ps * lse_factor(v.zmax, m, inv_t);
    }
    if constexpr (kProc) {  // the raw sums, relative to the raw max
      const float um = __uint_as_float(u.rm), vm = __uint_as_float(v.rm);
      const float rm = fmaxf(um, vm);
      if (rm > -INFINITY) {
        u.ls = u.ls * lse_factor(um, rm, 1.0f) + v.ls * lse_factor(vm, rm, 1.0f);
        u.rm = __float_as_uint(rm);
      }
    }
  }
  if (v.zmax > u.zmax || (v.zmax == u.zmax && v.zid < u.zid)) {
    u.zmax = v.zmax;
    u.zid = v.zid;
  }
  u.bad |= v.bad;
  if (v.h1 > u.h1 || (v.h1 == u.h1 && v.i1 < u.i1)) {
    u.h2 = fmaxf(u.h1, v.h2);
    u.h1 = v.h1;
    u.i1 = v.i1;
    u.z1 = v.z1;
  } else {
    u.h2 = fmaxf(u.h2, v.h1);
  }
}

template <bool kProc = false>
__device__ __forceinline__ SplitSum split_shfl(const SplitSum& u, int o) {
  SplitSum v;
  v.zmax = shfl_x(u.zmax, o);
  v.zid = shfl_x(u.zid, o);
  v.h1 = shfl_x(u.h1, o);
  v.i1 = shfl_x(u.i1, o);
  v.h2 = shfl_x(u.h2, o);
  v.z1 = shfl_x(u.z1, o);
  v.ls = shfl_x(u.ls, o);
  v.ps = shfl_x(u.ps, o);
  v.bad = shfl_x(u.bad, o);
  v.rm = kProc ? shfl_x(u.rm, o) : 0u;
  return v;
}

template <bool kProc = false>
__device__ __forceinline__ void split_warp_merge_shfl(SplitSum& u, bool lp, float inv_t) {
#pragma unroll
  for (int o = 16; o; o >>= 1) split_merge<kProc>(u, split_shfl<kProc>(u, o), lp, inv_t);
}

// The same merge over the warp without logprobs (the sums, z1 and rm unused), by warp
// reductions (REDUX on sm_80+) instead of five rounds of ten shuffles: what the token needs is
// the largest zmax (lowest id on ties), the largest h1 (lowest id on ties), the largest of every
// other h1 and every h2 (a bound on every score but the winner's), and the flags. Every lane
// gets the result. The same values as the shuffle merge: maxima and minima of the same numbers
// (the one difference: a zmax of -0.0 comes back as +0.0, equal under every comparison made
// with it); h2 is the bound over all the summaries (the shuffle merge may drop a losing
// summary's h2 when it exceeds that summary's own h1: a pruning bound beta - 0.02, below the
// winner's h1 by more than the gap test's margin, so the decisions do not change).
enum class WarpRed { kMax, kMin, kOr };
template <WarpRed R>
__device__ __forceinline__ unsigned warp_red_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  if constexpr (R == WarpRed::kMax) return __reduce_max_sync(0xffffffffu, v);
  if constexpr (R == WarpRed::kMin) return __reduce_min_sync(0xffffffffu, v);
  if constexpr (R == WarpRed::kOr) return __reduce_or_sync(0xffffffffu, v);
#else
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const unsigned w = __shfl_xor_sync(0xffffffffu, v, o);
    v = R == WarpRed::kMax ? max(v, w) : (R == WarpRed::kMin ? min(v, w) : (v | w));
  }
  return v;
#endif
}
__device__ __forceinline__ void split_warp_merge_nolp(SplitSum& u) {
  const unsigned zk = warp_red_u32<WarpRed::kMax>(key32(u.zmax));
  const unsigned zi =
      warp_red_u32<WarpRed::kMin>(key32(u.zmax) == zk ? unsigned(u.zid) : 0xffffffffu);
  const unsigned hk = warp_red_u32<WarpRed::kMax>(key32(u.h1));
  const unsigned hi = warp_red_u32<WarpRed::kMin>(key32(u.h1) == hk ? unsigned(u.i1) : 0xffffffffu);
  const bool win = key32(u.h1) == hk && unsigned(u.i1) == hi;  // one lane, or only empty ones
  const unsigned h2k = warp_red_u32<WarpRed::kMax>(max(key32(u.h2), win ? 0u : key32(u.h1)));
  u.bad = warp_red_u32<WarpRed::kOr>(u.bad);
  u.zmax = key32_to_float(zk);
  u.zid = int(zi);
  u.h1 = key32_to_float(hk);
  u.i1 = int(hi);
  u.h2 = key32_to_float(h2k);
}

template <bool kProc = false>
__device__ __forceinline__ void split_warp_merge(SplitSum& u, bool lp, float inv_t) {
  if (lp)
    split_warp_merge_shfl<kProc>(u, lp, inv_t);
  else
    split_warp_merge_nolp(u);
}

template <typename T, bool kProc = false>
__global__ void __launch_bounds__(kSplitThreads) split1_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  // phase 2 (launched with PDL) may be scheduled now; it waits for this grid's completion
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  constexpr int VEC = VecOf<T>::n;
  constexpr int U = 4;  // vectors in flight per thread
  __shared__ SplitSum red[kSplitWarps];
  __shared__ unsigned s_beta;  // key32 of the best h any thread of the CTA has evaluated
  if (threadIdx.x == 0) s_beta = key32(-INFINITY);
  __syncthreads();
  const int S = p.split;
  const int row = int(blockIdx.x) / S;
  const int c0 = (int(blockIdx.x) % S) * p.chunk;
  const int c1 = min(p.vocab, c0 + p.chunk);
  const int q = row / p.tpr;
  const float t = (p.flags & F_TEMP) ? p.temperature[q] : 1.0f;
  const bool greedy = !(t > 0.0f);
  const float inv_t = inv_temperature(t);
  const bool lp = p.flags & F_LOGPROBS;
  const bool stream = !greedy && !(p.flags & F_FORCE_EXACT);
  uint64_t seed = 0, offset = 0;
  if (stream) {
    seed = uint64_t(p.seed[q]);
    offset = uint64_t(p.offset[q]) + uint64_t(row % p.tpr);
  }
  const T* rowp = static_cast<const T*>(p.logits) + int64_t(row) * p.stride;
  const bool aligned = (reinterpret_cast<uintptr_t>(rowp) & 15) == 0;
  const float c1f = fmul(inv_t, kLog2e);
  SplitSum me = split_empty<kProc>();
  Lse raw, proc;
  bool pruned = false;
  float pbeta = -INFINITY;  // the largest beta an element was pruned against
  RowProc rp;
  if constexpr (kProc) rp = row_proc(p.proc, q);
  unsigned rawbad = 0;  // kProc: a NaN / +inf raw logit
  const int nvec = (c1 - c0 + VEC - 1) / VEC;
  for (int v0 = threadIdx.x; v0 < nvec; v0 += kSplitThreads * U) {
    uint4 buf[U];
    uint32_t pb[kProc ? U : 1];  // kProc: the vectors' processing bits (load_bits)
    int cn[kProc ? U : 1];       // kProc: their prefetched counts (prefetch_count)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * kSplitThreads;
      const int i = c0 + v * VEC;
      buf[u] = make_uint4(0, 0, 0, 0);
      if (v < nvec) {
        if (aligned && i + VEC <= c1) {
          buf[u] = ldg_stream(reinterpret_cast<const uint4*>(rowp + i));
        } else {
          T* e = reinterpret_cast<T*>(&buf[u]);
#pragma unroll
          for (int j = 0; j < VEC; ++j)
            if (i + j < c1) e[j] = rowp[i + j];
        }
      }
      if constexpr (kProc) pb[u] = v < nvec ? load_bits<VEC>(p.proc, rp, i, c1) : kKeepAll;
    }
    if constexpr (kProc) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        pb[u] = prefetch_count<VEC>(p.proc, rp, pb[u], c0 + (v0 + u * kSplitThreads) * VEC, cn[u]);
    }
#pragma unroll 1
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * kSplitThreads;
      if (v >= nvec) break;
      const int i = c0 + v * VEC;
      float z[VEC];
      unpack<T>(buf[0], z);
#pragma unroll
      for (int q2 = 0; q2 + 1 < U; ++q2) buf[q2] = buf[q2 + 1];
      if constexpr (kProc) {  // raw sums, then the processed values
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          if (i + j >= c1) z[j] = -INFINITY;
        if (lp) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            raw.add(z[j], 1.0f);
            rawbad |= z[j] < INFINITY ? 0u : 1u;
          }
        }
        proc_vec<VEC>(p.proc, rp, pb[0], i, z, cn[0]);
#pragma unroll
        for (int q2 = 0; q2 + 1 < U; ++q2) {
          pb[q2] = pb[q2 + 1];
          cn[q2] = cn[q2 + 1];
        }
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (i + j >= c1) z[j] = -INFINITY;
        if (z[j] > me.zmax) {
          me.zmax = z[j];
          me.zid = i + j;
        }
        me.bad |= z[j] < INFINITY ? 0u : 1u;
      }
      if (lp) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if constexpr (!kProc) raw.add(z[j], 1.0f);
          if (!greedy) proc.add(z[j], inv_t);
        }
      }
      bool live = true;  // kProc: a vector of masked (-inf) tokens needs no noise
      if constexpr (kProc) {
        live = false;
#pragma unroll
        for (int j = 0; j < VEC; ++j) live |= z[j] > -INFINITY;
      }
      if (stream && live) {
        // every element of the vector is tested against the same beta: the best h the thread
        // or any thread of the CTA has evaluated before this vector (the h of a token of the
        // row, which is all the bound needs); independent tests, then the updates. A group of
        // 4 whose largest fl32(z t) + 16.64 (> max G) is below beta - 0.02 skips Philox: its
        // h = fl32(fl32(z t) + G) are below it (rounding is monotone), like a pruned element's.
        const float beta = fmaxf(me.h1, key32_to_float(s_beta));
        const float bterm = fmul(fsub(beta, kPruneC), kLog2e);
        const float bcut = fsub(beta, kPruneMargin);
        uint32_t w[VEC];
        unsigned need = 0, cut = 0;
        bool pv = false;  // an element of this vector was pruned
#pragma unroll
        for (int g = 0; g < VEC / 4; ++g) {
          float am = fmul(z[4 * g], inv_t);
#pragma unroll
          for (int j = 1; j < 4; ++j) am = fmaxf(am, fmul(z[4 * g + j], inv_t));
          if (fadd(am, kGumbelHi) < bcut) {
            cut |= 1u << g;
            w[4 * g] = w[4 * g + 1] = w[4 * g + 2] = w[4 * g + 3] = 0;
            continue;
          }
          const Philox4 r = philox_block(seed, offset, uint32_t(i + 4 * g) >> 2, kStreamSample);
          w[4 * g] = r.x;
          w[4 * g + 1] = r.y;
          w[4 * g + 2] = r.z;
          w[4 * g + 3] = r.w;
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float x = z[j];
          if (x > -INFINITY) {
            if ((cut >> (j / 4)) & 1u) {
              pv = true;
            } else {
              const float th = ex2approx(fmul(ex2approx(fsub(fmul(x, c1f), bterm)), -kLog2e));
              if (fadd(uniform_from_bits(w[j]), kPruneDelta) >= th)
                need |= 1u << j;
              else
                pv = true;
            }
          }
        }
        if (pv) {
          pruned = true;
          pbeta = fmaxf(pbeta, beta);
        }
        if (need) {
          const float h0 = me.h1;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            if ((need >> j) & 1u) {
              const float h = fadd(fmul(z[j], inv_t), gumbel_from_bits(w[j]));
              if (h > me.h1) {
                me.h2 = me.h1;
                me.h1 = h;
                me.i1 = i + j;
                me.z1 = z[j];
              } else {
                me.h2 = fmaxf(me.h2, h);
              }
            }
          }
          if (me.h1 > h0) atomicMax(&s_beta, key32(me.h1));
        }
      }
    }
  }
  if (pruned) me.h2 = fmaxf(me.h2, fsub(pbeta, kPruneMargin));
  if (lp) {
    if constexpr (kProc) {
      me.ls = raw.s;
      me.rm = __float_as_uint(raw.m);
      me.bad |= rawbad ? 2u : 0u;
    } else {
      me.ls = raw.m == me.zmax ? raw.s : 0.0f;
    }
    me.ps = proc.m == me.zmax ? proc.s : 0.0f;
  }
  split_warp_merge<kProc>(me, lp, inv_t);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = me;
  __syncthreads();
  if (warp == 0) {
    SplitSum u = lane < kSplitWarps ? red[lane] : split_empty<kProc>();
    if (lp) {
#pragma unroll
      for (int o = kSplitWarps / 2; o; o >>= 1)
        split_merge<kProc>(u, split_shfl<kProc>(u, o), lp, inv_t);
    } else {
      split_warp_merge_nolp(u);
    }
    if (lane == 0) static_cast<SplitSum*>(p.ws)[blockIdx.x] = u;
  }
}

// Phase 2: one CTA per row; warp 0 merges the row's p.split summaries and decides (invalid row,
// greedy, the gap test); when that fails, or with F_FORCE_EXACT, the whole CTA runs the exact
// pass over the row. Launched with PDL: the row's parameters are read before
// griddepcontrol.wait (written before phase 1 started), the summaries after it.
template <typename T, bool kProc = false>
__global__ void __launch_bounds__(kThreads, 1) split2_kernel(const Params p) {
  __shared__ Smem s;
  const int row = blockIdx.x;
  const int S = p.split;
  const Row r = row_params(p, row);
  const bool lp = p.flags & F_LOGPROBS;
  const T* rowp = static_cast<const T*>(p.logits) + int64_t(row) * p.stride;
  RowProc rp;
  if constexpr (kProc) rp = row_proc(p.proc, row / p.tpr);
  // kProc: the raw logprob of token tok from the raw sums (NaN after a NaN / +inf raw logit)
  auto raw_lp = [&](int tok, unsigned bad, unsigned rm, float ls) -> float {
    if (bad & 2u) return __int_as_float(0x7fc00000);
    return (to_f(rowp[tok]) - __uint_as_float(rm)) - logf(ls);
  };
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  // thread j loads summary j (S <= kSplitMax < kThreads: one latency), then a block merge
  __shared__ SplitSum red[kWarps];
  {
    const SplitSum* ws = static_cast<const SplitSum*>(p.ws) + int64_t(row) * S;
    SplitSum u = split_empty<kProc>();
    for (int j = threadIdx.x; j < S; j += kThreads) split_merge<kProc>(u, ws[j], lp, r.inv_t);
    if (threadIdx.x < ((S + 31) & ~31)) {  // warps past the summaries hold nothing
      split_warp_merge<kProc>(u, lp, r.inv_t);
      if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = u;
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    SplitSum u = threadIdx.x < (S + 31) / 32 ? red[threadIdx.x] : split_empty<kProc>();
    split_warp_merge<kProc>(u, lp, r.inv_t);
    if (threadIdx.x == 0) {
      const bool ok = (kProc ? !(u.bad & 1u) : !u.bad) && u.zmax > -INFINITY;
      unsigned done = 1;
      if (!ok) {
        write_row(p, row, 0, false, 0.0f, 0.0f);
      } else if (r.mode == kGreedy) {
        // raw logprob of the max token: (zmax - zmax) - ln(sum exp(z - zmax))
        float lpv = 0.0f;
        if (lp) lpv = kProc ? raw_lp(u.zid, u.bad, u.rm, u.ls) : -logf(u.ls);
        write_row(p, row, u.zid, true, lpv, 0.0f);
      } else {
        const float A = fabsf(fmul(u.zmax, r.inv_t));
        if (!(p.flags & F_FORCE_EXACT) && A <= kGapAMax &&
            fsub(u.h1, u.h2) > fmul(fadd(A, kGapAPad), kGapScale)) {
          float lpv = 0.0f;
          if (lp) lpv = kProc ? raw_lp(u.i1, u.bad, u.rm, u.ls) : fsub(u.z1, u.zmax) - logf(u.ls);
          write_row(p, row, u.i1, true, lpv,
                    lp ? centered(u.z1, u.zmax, r.inv_t) - logf(u.ps) : 0.0f);
        } else {
          done = 0;
        }
      }
      s.row.zmax = u.zmax;
      s.row.zid = u.zid;
      s.row.ls = u.ls;
      if constexpr (kProc) {
        s.row.bad = u.bad;
        s.row.lm = __uint_as_float(u.rm);
      }
      s.counter = done;
    }
  }
  __syncthreads();
  if (s.counter) return;
  // rare: the exact pass over the whole row (the launcher set p.cs = 1, p.resident = 0)
  const bool aligned = (reinterpret_cast<uintptr_t>(rowp) & 15) == 0;
  const float zmax = s.row.zmax;
  const int zid = s.row.zid;
  const float ls = s.row.ls;
  if (p.stats && threadIdx.x == 0) atomicAdd(&p.stats[0], 1u);
  int tok = 0;
  float ps = 0.0f;
  exact_pass<T, kProc>(p, r, s, rowp, 0, p.vocab, aligned, nullptr, zmax, zid, 0ull, tok, ps, rp);
  if (threadIdx.x == 0) {
    const float zt = to_f(rowp[tok]);
    if constexpr (kProc) {
      write_row(p, row, tok, true,
                lp ? raw_lp(tok, s.row.bad, __float_as_uint(s.row.lm), ls) : 0.0f,
                centered(proc_one(p.proc, rp, tok, zt), zmax, r.inv_t) - logf(ps));
    } else {
      write_row(p, row, tok, true, lp ? (zt - zmax) - logf(ls) : 0.0f,
                centered(zt, zmax, r.inv_t) - logf(ps));
    }
  }
}

// ------------------------------------------------------------------------------------------
// split-candidates launch (small batches with a top-k tensor; see launch_scand)
// ------------------------------------------------------------------------------------------
// One launch, no cluster: each row is spread over S = p.split CTAs of kThreads threads (one per
// SM) that read their contiguous chunk once; the row's last CTA to arrive (a per-row arrival
// counter in the per-call workspace) finishes the row. Phase 1 (every CTA), in the one read:
// max raw logit and its lowest id, the NaN / +inf flag, the chunk's min (generic top-k window),
// the raw log-sum-exp parts (logprobs), and for CAND rows each lane's two largest keys (key56)
// and the largest key it evicted. The CTA's bound th = the j-th largest of its lanes' largest
// keys (j = min(32, ceil(2 K / S) + 4); 0 when fewer lanes hold a key): at least j keys of the
// chunk are >= th. The CTA forwards the lane keys >= th to the workspace (at most FC per CTA);
// every key of the chunk that is >= th is forwarded unless a lane evicted one (its third key
// is >= th) or the CTA had more than FC of them: then the CTA is flagged incomplete.
// Finish (the last CTA of the row, kThreads threads, the whole row to itself):
//   invalid / greedy rows from the merged summaries; temperature-only rows: the exact pass over
//   the row (one CTA); CAND rows: U = every forwarded key; t = the K-th largest key of U
//   (radix select). Any key of the row >= t that is missing from U lies in a chunk with
//   th > t or flagged incomplete ("offending"): those chunks are read again (L2) and their keys
//   >= t collected with U's other keys >= t; the K largest of them are the row's top K (the
//   same candidates as the cluster launch's CAND rows), finished by cand_finish (top-p without
//   top-k: the row's total mass from one pass over the row). Rows the candidates cannot decide
//   (kept set past the K-th candidate, k > kCandCap, fewer than K forwarded keys in a row
//   that dropped some, a candidate buffer overflow) take the generic path in the same CTA:
//   radix thresholds and the exact pass over the whole row.
// Same tokens as every other path (the contract fixes them; which CTA finishes is irrelevant).
// Workspace (one per call): [rows] arrival counters and [rows] F_SCAND_DEFER flags (zeroed by a
// memset before the launch), ScandSum[rows * S], then [rows * S * FC] forwarded keys.
constexpr int kScandMaxS = 256;  // CTAs per row, at most (the finisher's per-CTA tables)
// F_SCAND_RESCAN applies with at least this many CTAs per row: with fewer, the k-off rows' kept
// sets mostly run past the rescanned prefix too (measured on an H200, top-p 0.9 k-off rows at
// B = 24 / 32: 311 / 347 us with the rescan vs 293 / 330 without; at B = 16: 78 vs 286)
constexpr int kRescanMinS = 8;
// F_SCAND_DEFER applies below kRescanMinS CTAs per row (B > 16 on 132 SMs), where top-p rows with
// top-k off mostly run past the candidates: measured on an H200 (top-p 0.9 on the k-off rows of
// the bench's mixed calls) 119 / 143 us at B = 24 / 32 with the deferral vs 294 / 330 without.
// With more CTAs per row the follow-up launch costs more than it saves: +2.9 / +3.2 us per call
// for top-k + top-p at B = 1 / 16, where no row was deferred.
constexpr int kDeferMaxS = kRescanMinS - 1;
struct ScandSum {
  float zmax;
  int zid;
  float zmin;
  unsigned bad;
  float lm, ls;           // raw logits: max, sum exp(z - lm) (logprobs)
  unsigned long long th;  // forwarded keys: the chunk's keys >= th (unless incomplete)
  int n;                  // keys forwarded (may exceed FC: incomplete)
  unsigned incomplete;    // a lane evicted a key >= th, or n > FC
  double mass;            // band rows: sum of 2^((z - zmax) c) over the chunk (zmax: the chunk's)
};
static_assert(sizeof(ScandSum) == 48, "ScandSum: three 16-byte words");

// The 32 lanes' summaries u merged (every lane gets the result): max raw logit and its lowest
// id, min, NaN / +inf flag, raw log-sum-exp parts (lp); N_SUM: a statement adding the lanes'
// forwarded counts, or nothing. A macro, not a function: the kernel was GPU-tested compiled
// from this text in place (a by-reference helper schedules the merges differently).
#define TS_SCAND_WARP_MERGE(u, lp, N_SUM)                \
  do {                                                   \
    _Pragma("unroll") for (int o = 16; o; o >>= 1) {     \
      const float z2 = shfl_x(u.zmax, o);                \
      const int i2 = shfl_x(u.zid, o);                   \
      if (z2 > u.zmax || (z2 == u.zmax && i2 < u.zid)) { \
        u.zmax = z2;                                     \
        u.zid = i2;                                      \
      }                                                  \
      u.zmin = fminf(u.zmin, shfl_x(u.zmin, o));         \
      u.bad |= shfl_x(u.bad, o);                         \
      N_SUM                                              \
    }                                                    \
    if (lp) {                                            \
      Lse a{u.lm, u.ls};                                 \
      lse_warp(a, 1.0f);                                 \
      u.lm = a.m;                                        \
      u.ls = a.s;                                        \
    }                                                    \
  } while (0)

// Band masses (F_SCAND_BAND; rows with top-p on and top-k off): phase 1 sums 2^((z - m) c) over
// the chunk, c = inv_t log2(e), all in float64 (exp2: ~1 ulp of float64), relative to each
// thread's running max m (a new max rescales the sum), merged relative to the chunk max; the
// finishing CTA scales the chunks to the row max: S~ = sum over the row of exp((z - zmax) inv_t)
// to ~1e-14 relative. The contract's fixed-point mass S (2^38 units) lies within
// S~ 2^38 (1 +- kBandRel) +- kBandAbs V. Relative part: the contract's y = fl(fl(z - zmax) inv_t)
// (2 roundings, |y| <= 26.4 where e > 0: 3.2e-6) and soft_exp (<= 2 ulp: 2.4e-7), 3.5e-6 in all:
// kBandRel = 1.5e-5 is ~4x that. Absolute part: each truncation < 1 unit, each token with e = 0
// (y < -26.4) < 0.93 unit of S~: < 2 V; kBandAbs = 8 (4x). (tests/test_sampling.py
// test_scand_band_mass_bound_holds checks the bound with the reference's arithmetic on rows
// where the roundings cannot average out: the error stays below 0.03 of it.)
constexpr double kBandRel = 1.5e-5;
constexpr double kBandAbs = 8.0;
__device__ __forceinline__ double band_scale(double a, float z, float m, double c) {
  return z == -INFINITY ? 0.0 : a * exp2((double(z) - double(m)) * c);
}
// (max, sum relative to it) over the warp: every lane gets the result
__device__ __forceinline__ void band_warp_merge(float& m, double& a, double c) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const float m2 = shfl_x(m, o);
    const double a2 = shfl_x(a, o);
    const float mx = fmaxf(m, m2);
    a = band_scale(a, m, mx, c) + band_scale(a2, m2, mx, c);
    m = mx;
  }
}
// the same over the block; returns the sum relative to the block's max (every thread)
struct BandSum {
  float m;
  double a;
};
__device__ __forceinline__ double block_band_merge(float m, double a, double c, Smem& s) {
  return block_reduce(
             BandSum{m, a}, [&](BandSum& x) { band_warp_merge(x.m, x.a, c); },
             [&](int w, BandSum x) {
               s.redd[w][1] = x.a;
               s.redf[w][3] = x.m;
             },
             [&](int l) { return BandSum{s.redf[l][3], s.redd[l][1]}; })
      .a;
}

// plain rows (F_SCAND_BAND): a CTA's record in its forwarded-key slots (FC >= 16 keys: 128 bytes)
struct ScandPlain {
  double h1, h2;  // the chunk's best / second-best approximate score (PLAIN streamed)
  float z1;       // the best's (processed) logit
  int w1;         // its id
  float pm, ps;   // processed: max z, sum exp((z - pm) / T) (logprobs)
  __device__ __forceinline__ void unpack(PlainAcc& a, Lse& l) const {
    a.h1 = h1;
    a.h2 = h2;
    a.z1 = z1;
    a.w1 = w1;
    l.m = pm;
    l.s = ps;
  }
};
static_assert(sizeof(ScandPlain) == 32, "ScandPlain: 32 bytes");

__host__ __device__ __forceinline__ int scand_fc(int S) {
  const int fc = kCandBuf / S;
  return fc < 2048 ? fc : 2048;
}
// the rows' arrival counters, then their F_SCAND_DEFER flags (zeroed by one memset per call)
__host__ __device__ __forceinline__ size_t scand_ctr_bytes(int rows) {
  return (size_t(rows) * 8 + 255) / 256 * 256;
}

// descending bitonic sort of one u64 per lane across the warp
__device__ __forceinline__ unsigned long long warp_sort_desc(unsigned long long v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const unsigned long long o = shfl_x(v, j);
      const bool keep_max = ((lane & j) == 0) == ((lane & k) == 0 || k == 32);
      v = keep_max ? (o > v ? o : v) : (o < v ? o : v);
    }
  }
  return v;
}

template <typename T, bool kProc = false>
__global__ void __launch_bounds__(kThreads, 1) scand_kernel(const Params p) {
  constexpr int VEC = VecOf<T>::n;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  unsigned long long* cbuf =
      reinterpret_cast<unsigned long long*>(smem_raw + ((sizeof(Smem) + 15) / 16) * 16);
  unsigned long long* cand = cbuf + kCbufPerCta;  // [kCandBuf]
  __shared__ ScandSum wsum[kWarps];

  const int S = p.split;
  const int FC = scand_fc(S);
  const int row = int(blockIdx.x) / S, me = int(blockIdx.x) % S;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const Row r = row_params(p, row);
  RowProc rp;
  if constexpr (kProc) rp = row_proc(p.proc, row / p.tpr);
  const T* rowp = static_cast<const T*>(p.logits) + int64_t(row) * p.stride;
  const bool aligned = (reinterpret_cast<uintptr_t>(rowp) & 15) == 0;
  const int c0 = me * p.chunk;
  const int c1 = min(p.vocab, c0 + p.chunk);
  const bool lp = p.flags & F_LOGPROBS;
  const bool cand_row = r.mode == kCand;
  // band masses (F_SCAND_BAND, top-p rows with top-k off; kBandRel above), and streamed
  // temperature-only rows (F_SCAND_BAND: the cluster kernel's PLAIN gap test, each CTA's top-2
  // approximate scores in its forwarded-key slots, ScandPlain). (Functions, evaluated where
  // used, so that nothing of theirs stays live across the other rows' loop.)
  auto band = [&]() {
    return cand_row && !r.k_on && r.p_on && (p.flags & (F_SCAND_BAND | F_SCAND_TOPP)) &&
           r.inv_t < INFINITY;
  };
  auto plain = [&]() {
    return r.mode == kPlain && (p.flags & (F_SCAND_BAND | F_SCAND_TOPP)) &&
           !(p.flags & F_FORCE_EXACT);
  };
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  // F_SCAND_DEFER: the cluster launch after this one (PDL) may start; its CTAs wait for this
  // grid to complete (griddepcontrol.wait) before they read the flags
  if (p.defer) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  unsigned* ctr = static_cast<unsigned*>(p.ws);
  ScandSum* sums =
      reinterpret_cast<ScandSum*>(static_cast<unsigned char*>(p.ws) + scand_ctr_bytes(p.rows));
  unsigned long long* fkeys = reinterpret_cast<unsigned long long*>(sums + int64_t(p.rows) * S);

  // ---------------- phase 1: one read of the chunk ----------------
  float zm = -INFINITY, zlo = INFINITY;
  int zi = 0x7fffffff;
  unsigned bad = 0;
  Lse raw;
  unsigned long long k1 = 0, k2 = 0, kd = 0;  // the lane's two largest keys, largest evicted
  auto common = [&](int i, const float (&z)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (z[j] > zm) {
        zm = z[j];
        zi = i + j;
      }
      bad |= z[j] < INFINITY ? 0u : 1u;
      if (i + j < c1) zlo = fminf(zlo, z[j]);
      if constexpr (!kProc) {
        if (lp) raw.add(z[j], 1.0f);
      }
    }
  };
  auto body = [&](int i, const float (&z)[VEC]) {
    common(i, z);
    if (cand_row) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (z[j] > -INFINITY) {
          const unsigned long long k = key_of(z[j], i + j);
          if (k > k2) {
            kd = k2 > kd ? k2 : kd;
            if (k > k1) {
              k2 = k1;
              k1 = k;
            } else {
              k2 = k;
            }
          } else {
            kd = k > kd ? k : kd;
          }
        }
      }
    }
  };
  // kProc: z above is the processed logit; the raw values' sums (raw logprobs) and NaN / +inf
  // flag (bit 1 of bad) come from the same read
  unsigned rawbad = 0;
  auto rawf = [&](int, const float (&z)[VEC]) {
    if (lp) raw_vec<VEC>(raw, rawbad, z);
  };
  // Band and plain rows run loops of their own (the same body plus their sums), and their state
  // lives in their branches, so that the other rows' loop keeps its registers.
  double cta_mass;  // band rows: the chunk's mass relative to its max (every thread), else 0
  if (band()) {
    const double bc64 = double(r.inv_t) * kLog2eD;
    float bm = -INFINITY;  // the thread's running max, and the sum relative to it
    double bacc = 0.0;
    auto body_band = [&](int i, const float (&z)[VEC]) {
      body(i, z);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float v = z[j];
        if (v > bm) {
          bacc = bm == -INFINITY ? 1.0 : fma(bacc, exp2((double(bm) - double(v)) * bc64), 1.0);
          bm = v;
        } else if (v > -INFINITY) {
          bacc += exp2((double(v) - double(bm)) * bc64);
        }
      }
    };
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, nullptr, false, false, p.proc, rp, body_band,
                             rawf);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, nullptr, false, false, body_band);
    cta_mass = block_band_merge(bm, bacc, bc64, s);  // (relative to the chunk's max: its zmax)
  } else if (plain()) {
    PlainAcc pa;  // the thread's top-2 approximate scores, processed exp sums
    Lse proc;
    const double inv_t_d = double(r.inv_t);
    auto body_plain = [&](int i, const float (&z)[VEC]) {
      common(i, z);  // (plain rows keep no keys)
      plain_vec<VEC, kProc>(pa, s, i, z, r.inv_t, inv_t_d, r.seed, r.offset);
      if (lp) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) proc.add(z[j], r.inv_t);
      }
    };
    if (tid == 0) s.bar_key = key32(-INFINITY);
    __syncthreads();
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, nullptr, false, false, p.proc, rp, body_plain,
                             rawf);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, nullptr, false, false, body_plain);
    // the CTA's top 2 and processed sums, into its slots (tid 0: before its fence and arrival)
    Summary t2;
    block_top2(pa, s, t2);
    t2.h2 = plain_best_h2(t2.h2, s);
    const Lse pl = lp ? block_lse(proc, r.inv_t, s, 1) : Lse{};
    if (tid == 0)
      *reinterpret_cast<ScandPlain*>(fkeys + int64_t(blockIdx.x) * FC) =
          ScandPlain{t2.h1, t2.h2, t2.z1, t2.w1, pl.m, pl.s};
    cta_mass = 0.0;
  } else {
    if constexpr (kProc)
      for_each_pvec<true, T>(rowp, c0, c1, aligned, nullptr, false, false, p.proc, rp, body, rawf);
    else
      for_each_vec<T>(rowp, c0, c1, aligned, nullptr, false, false, body);
    cta_mass = 0.0;
  }

  // the CTA's summary: warp merges, then warp 0
  {
    ScandSum u;
    u.zmax = zm;
    u.zid = zi;
    u.zmin = zlo;
    u.bad = kProc ? (bad | (rawbad << 1)) : bad;
    u.lm = raw.m;
    u.ls = raw.s;
    u.mass = cta_mass;
    TS_SCAND_WARP_MERGE(u, lp, );
    if (lane == 0) wsum[warp] = u;
  }
  unsigned long long th = 0;
  if (cand_row) {
    // the j-th largest of the lanes' largest keys: each warp sorts its 32, warp 0 merges
    const unsigned long long sorted = warp_sort_desc(k1);
    cand[warp * 32 + lane] = sorted;
    if (tid == 0) s.ncb = 0;
    __syncthreads();
    if (warp == 0) {
      int jn = (2 * r.K + S - 1) / S + 4;
      jn = jn < 32 ? jn : 32;
      int idx = 0;
      unsigned long long head = cand[lane * 32];
      unsigned long long m = 0;
      int it = 0;
      for (; it < jn; ++it) {
        m = head;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
          const unsigned long long w = shfl_x(m, o);
          m = w > m ? w : m;
        }
        if (m == 0) break;
        if (head == m) {
          ++idx;
          head = idx < 32 ? cand[lane * 32 + idx] : 0ull;
        }
      }
      if (lane == 0) s.bcast[0] = it == jn ? m : 0ull;
    }
    __syncthreads();
    th = s.bcast[0];
    // forward the lane keys >= th (warp-aggregated slots)
    const bool f1 = k1 && k1 >= th, f2 = k2 && k2 >= th;
    const int c = int(f1) + int(f2);
    int incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    unsigned base = 0;
    if (lane == 31 && incl) base = atomicAdd(&s.ncb, unsigned(incl));
    base = __shfl_sync(0xffffffffu, base, 31);
    unsigned pos = base + unsigned(incl - c);
    unsigned long long* dst = fkeys + int64_t(blockIdx.x) * FC;
    if (f1) {
      if (pos < unsigned(FC)) dst[pos] = k1;
      ++pos;
    }
    if (f2 && pos < unsigned(FC)) dst[pos] = k2;
    if (f1 || f2) __threadfence();  // the forwarded keys, before the arrival below
  }
  const int evicted = __syncthreads_or(cand_row && kd && kd >= th);
  if (warp == 0) {
    ScandSum u = wsum[lane];
    TS_SCAND_WARP_MERGE(u, lp, );
    if (lane == 0) {
      u.th = th;
      u.n = cand_row ? int(s.ncb) : 0;
      u.incomplete = (evicted || u.n > FC) ? 1u : 0u;
      sums[blockIdx.x] = u;
      __threadfence();
      const unsigned old = atomicAdd(&ctr[row], 1u);
      s.counter = old == unsigned(S - 1) ? 1u : 0u;
    }
  }
  __syncthreads();
  if (!s.counter) return;
  __threadfence();

  // ---------------- finish: the row's last CTA ----------------
  // per-CTA tables (in cbuf until the generic path needs it): th[S], n | incomplete << 32
  unsigned long long* tab_th = cbuf;
  unsigned long long* tab_n = cbuf + kScandMaxS;
  // every thread: summary tid (tid < S) into the tables, and its U slots (masked below, once
  // the counts are known: the loads overlap)
  constexpr int RU = kCandBuf / kThreads;
  unsigned long long keys[RU];
  if (cand_row) {
#pragma unroll
    for (int i = 0; i < RU; ++i) {
      const int g = tid + i * kThreads;
      keys[i] = g < S * FC ? __ldcg(fkeys + int64_t(row) * S * FC + g) : 0ull;
    }
  }
  float band_z = -INFINITY;  // band rows: chunk tid's max and mass relative to it
  double band_m = 0.0;
  {
    ScandSum u;
    u.zmax = -INFINITY;
    u.zid = 0x7fffffff;
    u.zmin = INFINITY;
    u.bad = 0;
    u.lm = -INFINITY;
    u.ls = 0.0f;
    u.n = 0;
    if (tid < S) {
      const int4* src = reinterpret_cast<const int4*>(sums + int64_t(row) * S + tid);
      int4 w[3];
#pragma unroll
      for (int h = 0; h < 3; ++h) w[h] = __ldcg(src + h);
      memcpy(&u, w, sizeof(u));
      u.n = u.n < FC ? u.n : FC;
      band_z = u.zmax;
      band_m = u.mass;
      tab_th[tid] = u.th;
      tab_n[tid] = (unsigned long long)u.n | ((unsigned long long)u.incomplete << 32);
    }
    if (tid < ((S + 31) & ~31)) {  // warps past the summaries hold nothing
      TS_SCAND_WARP_MERGE(u, lp, u.n += shfl_x(u.n, o););
      if (lane == 0) wsum[warp] = u;
    }
    __syncthreads();
    if (warp == 0) {
      const int nw = (S + 31) / 32;
      if (lane < nw) {
        u = wsum[lane];
      } else {
        u.zmax = -INFINITY;
        u.zid = 0x7fffffff;
        u.zmin = INFINITY;
        u.bad = 0;
        u.lm = -INFINITY;
        u.ls = 0.0f;
        u.n = 0;
      }
      TS_SCAND_WARP_MERGE(u, lp, u.n += shfl_x(u.n, o););
      if (lane == 0) {
        s.row.zmax = u.zmax;
        s.row.zid = u.zid;
        s.row.zmin = u.zmin;
        s.row.bad = u.bad;
        s.row.lm = u.lm;
        s.row.ls = u.ls;
        s.row.ncand = u.n;
      }
    }
  }
  __syncthreads();
  const float zmax = s.row.zmax;
  const int zid = s.row.zid;
  const unsigned rbad = s.row.bad;
  const bool ok = (kProc ? !(rbad & 1u) : !rbad) && zmax > -INFINITY;
  const float rlm = s.row.lm, rls = s.row.ls;
  auto raw_lp = [&](int tok) -> float {
    if (!lp) return 0.0f;
    if constexpr (kProc) {
      if (rbad & 2u) return __int_as_float(0x7fc00000);  // a NaN / +inf raw logit
    }
    return (to_f(rowp[tok]) - rlm) - logf(rls);
  };
  if (!ok) {
    if (tid == 0) write_row(p, row, 0, false, 0.0f, 0.0f);
    return;
  }
  if (r.mode == kGreedy) {
    if (tid == 0) write_row(p, row, zid, true, raw_lp(zid), 0.0f);
    return;
  }
  // the whole row in this CTA: p with one CTA per row (a copy only on the paths that read the
  // row again)
  auto whole = [&]() {
    Params pf = p;
    pf.cs = 1;
    pf.resident = 0;
    pf.split = 0;
    return pf;
  };
  if (r.mode == kPlain) {
    if (plain()) {
      // the chunks' records merged: the gap test of the cluster kernel's streamed PLAIN rows
      PlainAcc q;
      Lse pq;
      if (tid < S) {
        // (8-byte loads: a slot is 8 FC bytes, FC not always even)
        const unsigned long long* src = fkeys + (int64_t(row) * S + tid) * FC;
        unsigned long long w[4];
#pragma unroll
        for (int h = 0; h < 4; ++h) w[h] = __ldcg(src + h);
        ScandPlain rec;
        memcpy(&rec, w, sizeof(rec));
        rec.unpack(q, pq);
      }
      Summary t2;
      block_top2(q, s, t2);
      const Lse pl = lp ? block_lse(pq, r.inv_t, s, 1) : Lse{};
      if (plain_gap_ok(t2.h1, t2.h2, t2.z1, zmax, r.inv_t)) {
        // (pl.m == zmax: sum exp(y) over the row = pl.s)
        if (tid == 0)
          write_row(p, row, t2.w1, true, raw_lp(t2.w1),
                    lp ? centered(t2.z1, zmax, r.inv_t) - logf(pl.s) : 0.0f);
        return;
      }
    }
    if (p.stats && tid == 0) atomicAdd(&p.stats[0], 1u);
    int tok = 0;
    float ps = 0.0f;
    exact_pass<T, kProc>(whole(), r, s, rowp, 0, p.vocab, aligned, nullptr, zmax, zid, 0ull, tok,
                         ps, rp);
    if (tid == 0)
      write_row(p, row, tok, true, raw_lp(tok),
                centered(tok_logit<kProc>(p, rp, rowp, tok), zmax, r.inv_t) - logf(ps));
    return;
  }
  bool generic = r.mode == kGeneric;
  if (!generic) {
    // U: every forwarded key (S * FC <= kCandBuf slots: RU per thread, loaded above)
#pragma unroll
    for (int i = 0; i < RU; ++i) {
      const int g = tid + i * kThreads;
      const int q = g / FC, j = g - q * FC;
      if (!(q < S && j < int(unsigned(tab_n[q])))) keys[i] = 0;
    }
    int nU = 0;
    const unsigned long long t = block_select<RU>(keys, r.K, s, &nU);
    // rows with top-k off and fewer forwarded keys than K (t: the smallest forwarded key), with
    // F_SCAND_RESCAN at S >= kRescanMinS: the chunks that may hold keys >= t are read again
    // (below), and the row's keys >= t are its top K, or when fewer a complete prefix (Kp)
    const bool rescan = nU < r.K && t && !r.k_on && (p.flags & F_SCAND_RESCAN) && S >= kRescanMinS;
    // offending chunks: keys >= t may be missing from U
    const int noff = __syncthreads_count(
        tid < S &&
        ((tab_n[tid] >> 32) || (nU < r.K && !rescan ? tab_th[tid] != 0 : tab_th[tid] > t)));
    Fin& fin = *reinterpret_cast<Fin*>(cand);
    // the keys[] >= th (th > 0) into fin.skey (the first kCandCap); returns their count
    auto collect = [&](unsigned long long th) -> int {
      if (tid == 0) s.counter = 0;
      __syncthreads();
#pragma unroll
      for (int i = 0; i < RU; ++i) {
        if (th && keys[i] >= th) {
          const unsigned pos = atomicAdd(&s.counter, 1u);
          if (pos < unsigned(kCandCap)) fin.skey[pos] = keys[i];
        }
      }
      __syncthreads();
      return int(s.counter);
    };
    int n = 0, Kp = 0;  // Kp > 0: the candidates are a complete prefix of Kp keys (below)
    if (noff == 0) {
      n = min(collect(t), r.K);
      // (rescan: U holds every key >= t; not the whole row when a chunk has a bound)
      if (rescan && n < r.K && __syncthreads_or(tid < S && tab_th[tid] != 0)) Kp = n;
    } else if (!rescan && (nU < r.K || !t)) {
      // fewer forwarded keys than K (few CTAs per row: rows with top-k off have K = kCandCap).
      // For such a row with no incomplete chunk, the keys >= the largest chunk bound tq are
      // all forwarded: a complete prefix of the row (every chunk's keys >= its bound are). The
      // candidates decide when the kept set ends inside it (cand_finish with K = n: undecided
      // otherwise, then the generic path).
      generic = true;
      if (!r.k_on) {
        const int ninc = __syncthreads_count(tid < S && (tab_n[tid] >> 32));
        const unsigned long long tq = block_max_u64(tid < S ? tab_th[tid] : 0ull, s);
        const int c = ninc == 0 && tq ? collect(tq) : r.K;
        if (c < r.K) {
          n = Kp = c;
          generic = false;
        }
      }
    } else {
      // collect the keys >= t: U's from the complete chunks, the offending chunks read again
      if (p.stats && tid == 0) atomicAdd(&p.stats[2], unsigned(noff));
      if (tid == 0) s.ncb = 0;
      __syncthreads();
#pragma unroll
      for (int i = 0; i < RU; ++i) {
        const int g = tid + i * kThreads;
        const int q = g / FC;
        if (keys[i] >= t && keys[i] && !((tab_n[q] >> 32) || tab_th[q] > t)) {
          const unsigned pos = atomicAdd(&s.ncb, 1u);
          if (pos < unsigned(kCandBuf)) cand[pos] = keys[i];
        }
      }
      for (int q = 0; q < S; ++q) {
        if (!((tab_n[q] >> 32) || tab_th[q] > t)) continue;
        const int q0 = q * p.chunk, q1 = min(p.vocab, q0 + p.chunk);
        for_each_pvec<kProc, T>(
            rowp, q0, q1, aligned, nullptr, false, false, p.proc, rp,
            [&](int i, const float (&z)[VEC]) { cand_append<VEC>(s, cand, i, z, t); });
      }
      __syncthreads();
      const unsigned nb = s.ncb;
      if (nb > unsigned(kCandBuf)) {
        generic = true;
      } else {
#pragma unroll
        for (int i = 0; i < RU; ++i) {
          const unsigned slot = unsigned(tid + i * kThreads);
          keys[i] = slot < nb ? cand[slot] : 0ull;
        }
        n = min(collect(block_select<RU>(keys, r.K, s)), r.K);
        if (rescan && n < r.K) Kp = n;  // the row's keys >= t, fewer than K: a prefix
      }
    }
    if (!generic) {
      unsigned long long S_row = 0, S_hi = 0;
      bool banded = false;
      if (!r.k_on && r.p_on && band()) {
        // the row's mass from the chunks' band masses: S_row <= S <= S_hi (kBandRel)
        const double bc64 = double(r.inv_t) * kLog2eD;
        const double Sx =
            block_sum_d(tid < S ? band_scale(band_m, band_z, zmax, bc64) : 0.0, s) * 274877906944.0;
        const double slack = Sx * kBandRel + kBandAbs * double(p.vocab);
        if (Sx >= 274877906944.0 && Sx < 4.0e18) {
          const double lo = floor(Sx - slack);
          S_row = lo > 274877906944.0 ? (unsigned long long)lo : 274877906944ull;  // S >= 2^38
          S_hi = (unsigned long long)ceil(Sx + slack);
          banded = true;
        }
      }
      if (!r.k_on && r.p_on && !banded)
        S_row = cluster_mass<T, kProc>(whole(), r, s, rowp, 0, p.vocab, aligned, nullptr, zmax,
                                       0ull, rp);
      float ps = 0.0f, ytok = 0.0f;
      Row rf = r;
      if (Kp) rf.K = Kp;
      int tok = banded ? cand_finish<true>(rf, s, fin, n, p.vocab, zmax, S_row, lp, ps, ytok, S_hi)
                       : cand_finish(rf, s, fin, n, p.vocab, zmax, S_row, lp, ps, ytok);
      if (tok == -2) {  // a prefix mass within the band: the exact mass (one pass), then again
        if (p.stats && tid == 0) atomicAdd(&p.stats[3], 1u);
        S_row = cluster_mass<T, kProc>(whole(), r, s, rowp, 0, p.vocab, aligned, nullptr, zmax,
                                       0ull, rp);
        tok = cand_finish(rf, s, fin, n, p.vocab, zmax, S_row, lp, ps, ytok);
      }
      if (tok >= 0) {
        if (tid == 0) write_row(p, row, tok, true, raw_lp(tok), ytok - logf(ps));
        return;
      }
      generic = true;
    }
  }
  // ---------------- generic: exact thresholds, then the exact pass (this CTA alone) ----------
  if (p.stats && tid == 0) atomicAdd(&p.stats[1], 1u);
  if (p.defer) {
    // F_SCAND_DEFER: the cluster launch that follows this one samples the row (its CTAs share
    // the row's passes) instead of this CTA alone
    if (tid == 0) p.defer[row] = 1u;
    return;
  }
  const Params pf = whole();
  unsigned long long thr = 0;
  const unsigned long long khi = key56(key32(zmax), 0u);
  if (r.k_on) {
    const unsigned long long klo = key56(key32(s.row.zmin), uint32_t(p.vocab - 1));
    thr = cluster_select<T, false, kProc>(pf, r, s, rowp, 0, p.vocab, aligned, nullptr, zmax, klo,
                                          khi, 0ull, (unsigned long long)r.k, cbuf, rp);
  }
  if (r.p_on) {
    const unsigned long long Sm =
        cluster_mass<T, kProc>(pf, r, s, rowp, 0, p.vocab, aligned, nullptr, zmax, thr, rp);
    const unsigned long long P = (unsigned long long)top_p_limit(r.top_p, int64_t(Sm));
    const double zcut = double(zmax) - 27.0 / double(r.inv_t) * 1.001 - fabs(double(zmax)) * 1e-6;
    const unsigned long long mlo = key56(key32(__double2float_rd(zcut)), uint32_t(p.vocab - 1));
    const unsigned long long tp = cluster_select<T, true, kProc>(
        pf, r, s, rowp, 0, p.vocab, aligned, nullptr, zmax, mlo, khi, thr, P, cbuf, rp);
    thr = tp > thr ? tp : thr;
  }
  int tok = 0;
  float ps = 0.0f;
  exact_pass<T, kProc>(pf, r, s, rowp, 0, p.vocab, aligned, nullptr, zmax, zid, thr, tok, ps, rp);
  if (tid == 0)
    write_row(p, row, tok, true, raw_lp(tok),
              centered(tok_logit<kProc>(p, rp, rowp, tok), zmax, r.inv_t) - logf(ps));
}
#undef TS_SCAND_WARP_MERGE

// ------------------------------------------------------------------------------------------
// host side
// ------------------------------------------------------------------------------------------
inline size_t smem_fixed_bytes(int cs, bool filt = true) {
  return ((sizeof(Smem) + 15) / 16) * 16 + size_t(cs) * kCbufPerCta * 8 +
         (filt ? size_t(kCandBuf) * 8 : 0);
}

struct DeviceInfo {
  int sms = 0, max_smem = 0, max_cs = 1;
  bool pdl = false;
};

template <typename Kernel>
inline DeviceInfo device_info(Kernel kernel) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, DeviceInfo> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, reinterpret_cast<const void*>(kernel));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  DeviceInfo d;
  cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&d.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  // the dynamic budget: the opt-in maximum less the kernel's static shared memory (asking for
  // more is an invalid value)
  cudaFuncAttributes fa = {};
  if (cudaFuncGetAttributes(&fa, kernel) == cudaSuccess)
    d.max_smem -= int(fa.sharedSizeBytes) < d.max_smem ? int(fa.sharedSizeBytes) : d.max_smem;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, d.max_smem);
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  d.max_cs = 1;
  if (major >= 9) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    d.max_cs = kMaxCluster;
    d.pdl = true;
  }
  (void)cudaGetLastError();
  cache.emplace(key, d);
  return d;
}

// Clusters of cs CTAs with `smem` bytes of dynamic shared memory each that can be resident at
// once (cudaOccupancyMaxActiveClusters; cached per device, kernel, cs and smem); 0: none.
template <typename Kernel>
inline int active_clusters(Kernel kernel, int cs, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), cs, smem);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(cs, 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cs;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  cache.emplace(key, n);
  return n;
}

// Split launch (small batches of temperature / greedy rows): phase 1 spreads each row over S
// small CTAs (no cluster), which write their summaries to a workspace; phase 2 (one CTA per row,
// launched with programmatic dependent launch so that its launch overlaps phase 1) merges them
// and finishes the row: the gap test, or the exact pass over the whole row when it fails. It
// replaces the cluster launch, whose row gets at most 16 SMs, when B <= SMs / 4 and no filter
// (top-k / top-p / min-p) tensor is given (with F_SPLIT_WIDE up to B = SMs / 2: see
// split_ctas).
// split_ctas() is S (0: no split launch): one vector per
// thread at least, at most kSplitCtasPerSm CTAs per SM in all. The caller provides p.ws,
// split_ws_bytes() bytes, ordered on `stream` (one per call: nothing persists between calls, so
// concurrent calls on other streams cannot interfere).
constexpr int kSplitCtasPerSm = 4;  // phase-1 CTAs per SM, at most (all rows together)
constexpr int kSplitMax = 256;      // phase-1 CTAs per row, at most
template <typename T>
int split_ctas(const Params& p) {
  if (p.rows == 0 || (p.flags & (F_TOPK | F_TOPP | F_MINP | F_FORCE_GENERIC | F_NO_SPLIT)) ||
      ((p.flags >> F_CS_SHIFT) & 7))
    return 0;
  const DeviceInfo d = device_info(sample_kernel<T, false>);
  if (!d.pdl) return 0;
  // B > SMs / 4: with F_SPLIT_WIDE, calls without processing up to SMs / 2 rows (beyond, the
  // cluster launch is faster for temperature rows, slower for greedy ones; the host cannot tell
  // them apart without reading the temperatures: docs/BENCHMARKS.md)
  if (int64_t(p.rows) * 4 > d.sms &&
      (!(p.flags & F_SPLIT_WIDE) || proc_on(p.proc) || int64_t(p.rows) * 2 > d.sms))
    return 0;
  int S = d.sms * kSplitCtasPerSm / p.rows;
  S = S < kSplitMax ? S : kSplitMax;
  const int by_vocab = p.vocab / (kSplitThreads * VecOf<T>::n);
  S = S < by_vocab ? S : by_vocab;
  return S >= 2 ? S : 0;
}
inline size_t split_ws_bytes(const Params& p, int S) {
  return sizeof(SplitSum) * size_t(p.rows) * S;
}

template <typename T, bool kProc>
cudaError_t launch_split(Params p, cudaStream_t stream, int S) {
  p.cs = 1;
  p.split = S;
  p.resident = 0;
  p.minp_cand = 0;
  p.chunk = int(((int64_t(p.vocab) + S - 1) / S + 7) / 8 * 8);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(int64_t(p.rows) * S), 1, 1);
  cfg.blockDim = dim3(kSplitThreads, 1, 1);
  cfg.stream = stream;
  cudaError_t err = cudaLaunchKernelEx(&cfg, split1_kernel<T, kProc>, p);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = dim3(unsigned(p.rows), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, split2_kernel<T, kProc>, p);
}

// Split-candidates launch (scand_kernel): calls with a top-k tensor (top-p / min-p may come
// with it) when B <= SMs / kScandRowsPer: S = SMs / B CTAs per row (one per SM), at least 1024
// elements each; 0: not taken (F_NO_SPLIT / F_FORCE_GENERIC / a forced cluster size, or
// processing inputs without F_SCAND_PROC). With the opt-in F_SCAND_TOPP also calls with a
// top-p tensor and no top-k tensor, when S >= 22 (S * 24 >= kCandCap; B <= 6 on 132 SMs), with
// band masses for their rows.
// By default top-p or min-p without a top-k tensor stays on the cluster launch: there the total
// top-p mass and the min-p exact pass are spread over the cluster's CTAs (measured faster on an
// H200 than this launch, band masses included: top-p 0.9 at B = 1 46 vs 49 us, flat rows whose
// kept set passes the 512 candidates 86 vs 300 us).
// The caller provides p.ws, scand_ws_bytes() bytes, ordered on `stream` (one per call).
constexpr int kScandRowsPer = 4;
template <typename T>
int scand_ctas(const Params& p) {
  const bool proc = proc_on(p.proc);
  const bool topp = (p.flags & F_TOPP) && (p.flags & F_SCAND_TOPP);
  if (p.rows == 0 || (proc && !(p.flags & F_SCAND_PROC)) || !((p.flags & F_TOPK) || topp) ||
      (p.flags & (F_FORCE_GENERIC | F_NO_SPLIT)) || ((p.flags >> F_CS_SHIFT) & 7))
    return 0;
  // (device_info also raises the kernel's dynamic shared memory limit: the instantiation that
  // launch_scand will launch)
  const DeviceInfo d = proc ? device_info(scand_kernel<T, true>) : device_info(scand_kernel<T>);
  if (int64_t(p.rows) * kScandRowsPer > d.sms) return 0;
  int S = d.sms / p.rows;
  S = S < kScandMaxS ? S : kScandMaxS;
  S = S < p.vocab / 1024 ? S : p.vocab / 1024;
  // top-p without a top-k tensor (F_SCAND_TOPP): its rows' K = kCandCap candidates need enough
  // forwarded keys per CTA (>= min(32, ...)): a CPU model of the forwarding on randn rows
  // (bench/lab/tools/scand_forward_sim.py) reads 0-2 % of the chunks again at S >= 22, 82 % at
  // S = 16, and goes generic at S = 8
  if (!(p.flags & F_TOPK) && S * 24 < kCandCap) return 0;
  return S >= 2 ? S : 0;
}
inline size_t scand_ws_bytes(const Params& p, int S) {
  return scand_ctr_bytes(p.rows) + (sizeof(ScandSum) + 8 * size_t(scand_fc(S))) * p.rows * S;
}

template <typename T, bool kProc>
cudaError_t launch_cluster(Params p, cudaStream_t stream, int cs_override, bool pdl,
                           int grid_rows = 0);

// With F_SCAND_DEFER, S <= kDeferMaxS and a top-p tensor, the rows the finishing CTA cannot
// decide from the candidates (top-p rows with top-k off whose kept set runs past them, k >
// kCandCap, ...) are flagged in the workspace (p.defer) instead of being sampled by that one CTA
// (the generic path: the row read several times by one CTA); a cluster launch follows (PDL)
// whose clusters sample the flagged rows and return at once for the others. Otherwise the
// finishing CTA samples them (without a top-p tensor only rows with k > kCandCap or a min-p
// window past the candidates can be left undecided: not worth the follow-up launch's cost).
template <typename T, bool kProc>
cudaError_t launch_scand(Params p, cudaStream_t stream, int S) {
  p.cs = 1;
  p.split = S;
  p.resident = 0;
  p.minp_cand = 1;
  p.chunk = int(((int64_t(p.vocab) + S - 1) / S + 7) / 8 * 8);
  const bool defer = (p.flags & F_SCAND_DEFER) && (p.flags & F_TOPP) && S <= kDeferMaxS;
  p.defer = defer ? static_cast<unsigned*>(p.ws) + p.rows : nullptr;
  cudaError_t err = cudaMemsetAsync(p.ws, 0, scand_ctr_bytes(p.rows), stream);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(int64_t(p.rows) * S), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem_fixed_bytes(1, true);
  cfg.stream = stream;
  err = cudaLaunchKernelEx(&cfg, scand_kernel<T, kProc>, p);
  if (err != cudaSuccess || !p.defer) return err;
  return launch_cluster<T, kProc>(p, stream, 0, true);
}

// Wide deferral (F_WIDE_DEFER): calls with a top-p tensor whose cluster launch gives each row
// one CTA (B > SMs / 2; the launcher's pick_cs) and no split launch. A row that CTA cannot
// decide from its candidates (a top-p kept set past the 512 candidates, k > 512, a candidate
// buffer overflow) would take the generic path in that CTA alone: radix thresholds over the
// row, each level a read of the whole row by one SM with fixed-point masses for every element,
// hundreds of us, and the call waits for it (at V = 262144, T = 0.8, top-p 0.9 on randn * 4
// rows, ~0.5 % of rows have kept sets past 512 tokens, so most calls of 256 rows hold one).
// Instead the CTA appends the row to a queue of kWideSlots slots in the workspace (a count,
// then the rows; one memset zeroes the count per call) and returns, and a second launch of the
// same kernel follows with programmatic dependent launch: kWideSlots clusters of the size that
// pick_cs gives kWideSlots rows (16 CTAs on an H200), cluster j waiting for the first grid
// (griddepcontrol.wait) and then sampling the queue's j-th row, if any, from the start (the
// contract fixes the token, whichever launch samples it). Rows past the slots take the generic
// path in their CTA, as without the bit. The second launch costs its launch and the CTAs'
// wait when nothing was queued. Returns whether the call takes this launch pair; callers ask
// only when neither split launch applies (split_ctas / scand_ctas are 0), as launch_kernels does.
template <typename T>
bool wide_defer_ok(const Params& p) {
  if (p.rows == 0 || !(p.flags & F_WIDE_DEFER) || !(p.flags & F_TOPP) ||
      (p.flags & (F_FORCE_GENERIC | F_NO_SPLIT)) || ((p.flags >> F_CS_SHIFT) & 7))
    return false;
  const DeviceInfo d = device_info(sample_kernel<T, true>);
  return d.pdl && int64_t(p.rows) * 2 > d.sms;  // pick_cs: one CTA per row
}
constexpr size_t kWideWsBytes = 256;  // >= (1 + kWideSlots) * 4

template <typename T, bool kProc>
cudaError_t launch_wide(Params p, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(p.ws, 0, kWideWsBytes, stream);
  if (err != cudaSuccess) return err;
  Params a = p;
  a.dq_out = static_cast<unsigned*>(p.ws);
  err = launch_cluster<T, kProc>(a, stream, 0, false);
  if (err != cudaSuccess) return err;
  Params b = p;
  b.dq_in = static_cast<const unsigned*>(p.ws);
  return launch_cluster<T, kProc>(b, stream, 0, true, kWideSlots);
}

// Fills p.cs / p.chunk / p.resident (cs_override > 0 forces the cluster size) and launches:
// the split launch when p.ws is set and split_ctas(p) > 0, else one (cluster) launch. kProc:
// the kernels that apply p.proc (the same launch policy; the caller ran launch_proc_prep).
template <typename T, bool kProc>
cudaError_t launch_kernels(Params p, cudaStream_t stream, int cs_override) {
  if (p.rows == 0) return cudaSuccess;
  p.defer = nullptr;
  p.dq_out = nullptr;
  p.dq_in = nullptr;
  if (p.ws && cs_override == 0) {
    const int S = split_ctas<T>(p);
    if (S) return launch_split<T, kProc>(p, stream, S);
    const int S2 = scand_ctas<T>(p);
    if (S2) return launch_scand<T, kProc>(p, stream, S2);
    if (wide_defer_ok<T>(p)) return launch_wide<T, kProc>(p, stream);
  }
  return launch_cluster<T, kProc>(p, stream, cs_override, false);
}

// The cluster launch (p.defer set: after launch_scand, with PDL; p.dq_in set: the second launch
// of launch_wide, grid_rows clusters; see there). grid_rows = 0: one cluster per row.
template <typename T, bool kProc>
cudaError_t launch_cluster(Params p, cudaStream_t stream, int cs_override, bool pdl,
                           int grid_rows) {
  p.split = 0;
  const int grows = grid_rows > 0 ? grid_rows : p.rows;
  // min-p alone runs on the PLAIN path (the kernel without the candidate machinery) when the
  // chunks are staged in shared memory, on the CAND path when they stream
  bool filt = p.flags & (F_TOPK | F_TOPP | F_FORCE_GENERIC);
  auto kernel = filt ? sample_kernel<T, true, kProc> : sample_kernel<T, false, kProc>;
  DeviceInfo d = device_info(kernel);
  constexpr int VEC = VecOf<T>::n;
  // CTAs per row (cluster size): the largest cs whose clusters all run in one wave (measured on
  // an H100: B = 16 rows take 28.7 us with clusters of 4 and 36.3 us with clusters of 8, which
  // do not all fit at once), at most one CTA per ~2048 elements; cs = 1 when rows fill the GPU.
  auto chunk_of = [&](int c) { return ((int64_t(p.vocab) + c - 1) / c + 7) / 8 * 8; };
  auto res_bytes_of = [&](int c) { return size_t((chunk_of(c) + VEC - 1) / VEC) * 16; };
  auto resident_ok = [&](int c) {
    return !(p.flags & F_NO_RESIDENT) && c > 1 &&
           smem_fixed_bytes(c, filt) + res_bytes_of(c) <= size_t(d.max_smem) &&
           res_bytes_of(c) <= (160u << 10);
  };
  const int forced = (p.flags >> F_CS_SHIFT) & 7;
  if (cs_override == 0 && forced) cs_override = 1 << (forced - 1);
  auto pick_cs = [&]() {
    int cs = 1;
    if (cs_override > 0) {
      cs = cs_override < d.max_cs ? cs_override : d.max_cs;
    } else if (int64_t(grows) * 2 <= d.sms) {
      for (int c = d.max_cs; c >= 2; c >>= 1) {
        if (chunk_of(c) < 2048) continue;
        const size_t smem = smem_fixed_bytes(c, filt) + (resident_ok(c) ? res_bytes_of(c) : 0);
        if (int64_t(active_clusters(kernel, c, smem)) >= grows) {
          cs = c;
          break;
        }
      }
    }
    while (cs > 1 && (cs - 1) * chunk_of(cs) >= p.vocab) cs >>= 1;
    return cs;
  };
  int cs = pick_cs();
  if (!filt && (p.flags & F_MINP) && !resident_ok(cs)) {
    filt = true;
    kernel = sample_kernel<T, true, kProc>;
    d = device_info(kernel);
    cs = pick_cs();
  }
  const int64_t chunk = chunk_of(cs);
  p.cs = cs;
  p.chunk = int(chunk);
  const size_t fixed = smem_fixed_bytes(cs, filt);
  const size_t res_bytes = res_bytes_of(cs);
  p.resident = resident_ok(cs);
  p.minp_cand = !p.resident;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2];
  unsigned na = 0;
  cfg.gridDim = dim3(unsigned(int64_t(grows) * cs), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = fixed + (p.resident ? res_bytes : 0);
  cfg.stream = stream;
  if (cs > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = cs;
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  if (pdl) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = na ? attr : nullptr;
  cfg.numAttrs = na;
  cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p);
  if (err != cudaSuccess && cs > 1) {
    // a cluster this large could not be scheduled here (shared GPU, MPS, ...): half the size
    (void)cudaGetLastError();
    return launch_cluster<T, kProc>(p, stream, cs / 2, pdl, grid_rows);
  }
  return err;
}

template <typename T>
cudaError_t launch(const Params& p, cudaStream_t stream, int cs_override = 0) {
  return proc_on(p.proc) ? launch_kernels<T, true>(p, stream, cs_override)
                         : launch_kernels<T, false>(p, stream, cs_override);
}

}  // namespace tokenspeed_kernel::sampler
