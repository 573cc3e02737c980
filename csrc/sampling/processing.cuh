// Logits processing applied inside the sampler's reads of the logits (torch-free). Spec:
// python/tokenspeed_kernel/reference/logits_processing.py (`apply`); the Triton twin is
// triton/sampling.py (`_prep_masks`, `_process`). Per request q = row / tpr, on the raw float32
// logit z of token t, in this order, one IEEE float32 operation per step (no FMA contraction):
//
//   logit bias          z = fl(z + b)                           (t in q's bias list)
//   repetition penalty  z = z > 0 ? fl(z / r) : fl(z * r)       (t seen by q's count slot)
//   frequency penalty   z = fl(z - fl(f * fl32(c)))             (c = output count of t, c > 0)
//   presence penalty    z = fl(z - p)                           (idem)
//   masks               z = -inf where the keep bit of t is clear
//
// Nothing is materialized: proc_prep_kernel (one CTA per request, before the sampler) builds
// the request's keep words (allowed mask AND NOT banned ids AND NOT, while num_output_tokens <
// min_tokens, the stop ids; an allowed mask alone is read directly), its has-bias words and an
// open-addressing hash of its bias entries. A read of the logits then loads, per 16-byte vector
// of a thread (4 fp32 / 8 half elements, never straddling a 32-bit word), one word of each
// bitmask given (1/32 of the fp32 logits' bytes each), keeps the vector's bits of them packed in
// one register (load_bits), and reads a bias value (has-bias bit), the penalties and an output
// count (seen bit) only where a bit says they matter. Output tokens
// are always seen (the token-count ops keep it so), so counts are read only where the seen bit
// is set; the reference applies frequency / presence wherever the count is > 0: the same set.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/softmath.cuh"

namespace tokenspeed_kernel::sampler {

// The processing inputs of one call (ops/sampling.py PROC_FIELDS, normalized by the adapter).
// All pointers null: no processing. Words are xgrammar's layout: token t is bit t & 31 of word
// t >> 5 of its request's (or slot's) row of `words` = ceil(V / 32) words.
struct ProcParams {
  const uint32_t* keep;            // [n][words] keep words (the allowed mask, or the prep's)
  const uint32_t* hasb;            // [n][words] has-bias words (prep); null: no bias
  const unsigned long long* btab;  // [2 nnz] bias hash (prep): request q owns slots
                                   // [2 b0, 2 b1) (b = its clamped CSR range), entries
                                   // (id << 32) | entry index, empty = ~0
  const int64_t* bias_indptr;      // [n + 1]
  const float* bias_values;        // [nnz]
  int64_t bias_nnz;
  const float* rep;       // [n] repetition penalty (null: off)
  const float* freq;      // [n] frequency penalty (null: off)
  const float* pres;      // [n] presence penalty (null: off)
  const uint32_t* seen;   // [N][words] seen bits of the count slots (null: no penalty)
  const int32_t* counts;  // [N][V] output counts
  const int64_t* slots;   // [n] count slot of each request
  int64_t nslots;         // N
  int vocab, words;
};

__host__ __device__ __forceinline__ bool proc_on(const ProcParams& pp) {
  return pp.keep != nullptr || pp.seen != nullptr || pp.hasb != nullptr;
}

// Per row: its request and count slot (-1: no penalties, or a slot outside [0, N): the
// request's penalties are skipped instead of reading out of bounds).
struct RowProc {
  int q = 0, slot = -1;
};

__device__ __forceinline__ RowProc row_proc(const ProcParams& pp, int q) {
  RowProc rp;
  rp.q = q;
  if (pp.seen != nullptr) {
    const int64_t s = pp.slots[q];
    rp.slot = (s >= 0 && s < pp.nslots) ? int(s) : -1;
  }
  return rp;
}

// The processing bits of VEC <= 8 consecutive elements i .. i + VEC - 1 (i % VEC == 0 and
// VEC | 32, or VEC == 1: one word of each bitmask covers them; i < c1 <= V): bit j = keep,
// bit 8 + j = seen, bit 16 + j = has bias, for element i + j. One word load per given mask;
// elements at or past c1 (padding) get no seen / bias bit. Without masks: keep all, nothing else.
constexpr uint32_t kKeepAll = 0xffu;
template <int VEC>
__device__ __forceinline__ uint32_t load_bits(const ProcParams& pp, const RowProc& rp, int i,
                                              int c1) {
  static_assert(VEC >= 1 && VEC <= 8, "vector width");
  constexpr uint32_t m = (1u << VEC) - 1u;
  const int sh = i & 31;
  const int64_t wi = i >> 5;
  const int nv = c1 - i;  // valid elements (>= 1)
  const uint32_t lim = nv >= VEC ? m : (1u << nv) - 1u;
  uint32_t b = kKeepAll;
  if (pp.keep != nullptr) b = (__ldg(pp.keep + int64_t(rp.q) * pp.words + wi) >> sh) & m;
  if (rp.slot >= 0) b |= ((__ldg(pp.seen + int64_t(rp.slot) * pp.words + wi) >> sh) & lim) << 8;
  if (pp.hasb != nullptr) b |= ((__ldg(pp.hasb + int64_t(rp.q) * pp.words + wi) >> sh) & lim) << 16;
  return b;
}

// Request q's CSR range [b0, b1), clamped into [0, nnz] (bad unvalidated offsets never read
// out of bounds).
__device__ __forceinline__ void csr_range(const int64_t* indptr, int64_t nnz, int q, int64_t& b0,
                                          int64_t& b1) {
  b0 = indptr[q];
  b1 = indptr[q + 1];
  b0 = b0 < 0 ? 0 : (b0 > nnz ? nnz : b0);
  b1 = b1 < b0 ? b0 : (b1 > nnz ? nnz : b1);
}

// the first probe of token id in a table of cap slots (Fibonacci hashing, no division)
__device__ __forceinline__ uint32_t bias_slot(int id, uint32_t cap) {
  return __umulhi(uint32_t(id) * 0x9E3779B1u, cap);
}
constexpr unsigned long long kBiasEmpty = ~0ull;

// The bias value of token id of request q (its has-bias bit is set); false if absent.
__device__ __forceinline__ bool bias_lookup(const ProcParams& pp, int q, int id, float& b) {
  int64_t b0, b1;
  csr_range(pp.bias_indptr, pp.bias_nnz, q, b0, b1);
  const uint32_t cap = uint32_t(2 * (b1 - b0));
  const unsigned long long* tab = pp.btab + 2 * b0;
  uint32_t s = bias_slot(id, cap);
  for (uint32_t n = 0; n < cap; ++n) {
    const unsigned long long e = __ldg(tab + s);
    if (uint32_t(e >> 32) == uint32_t(id)) {
      b = __ldg(pp.bias_values + uint32_t(e));
      return true;
    }
    if (e == kBiasEmpty) break;
    s = s + 1 == cap ? 0u : s + 1;
  }
  return false;
}

// Issues the load of the output count of the first seen element of the vector at i (bits:
// its load_bits) when frequency / presence penalties are on, and returns the bits with that
// element's offset + 1 in bits kPreShift.. (0: nothing prefetched); proc_vec then takes that
// element's count from `cnt`. Called for all vectors in flight right after their loads, so
// that the counts (a dependent, scattered read of the [N][V] table) are in flight together
// with the vectors instead of one after another in the bodies.
constexpr int kPreShift = 24;
template <int VEC>
__device__ __forceinline__ uint32_t prefetch_count(const ProcParams& pp, const RowProc& rp,
                                                   uint32_t bits, int i, int& cnt) {
  const uint32_t sn = (bits >> 8) & 0xffu;  // set only for rp.slot >= 0 and i + j < V
  if ((pp.freq != nullptr || pp.pres != nullptr) && sn != 0u) {
    const int j = __ffs(sn) - 1;
    cnt = __ldg(pp.counts + int64_t(rp.slot) * pp.vocab + (i + j));
    return bits | (uint32_t(j + 1) << kPreShift);
  }
  return bits;
}

// z[j] = x for a run-time j (a select chain: no local-memory array)
template <int VEC>
__device__ __forceinline__ void put(float (&z)[VEC], int j, float x) {
#pragma unroll
  for (int jj = 0; jj < VEC; ++jj) z[jj] = j == jj ? x : z[jj];
}
// z[j] for a run-time j (a select chain: no local-memory array)
template <int VEC>
__device__ __forceinline__ float pick(const float (&z)[VEC], int j) {
  float r = z[0];
#pragma unroll
  for (int jj = 1; jj < VEC; ++jj) r = j == jj ? z[jj] : r;
  return r;
}

// The processed logits of VEC consecutive raw values z of elements i .. i + VEC - 1, given
// their processing bits (load_bits; kKeepAll for padding; with prefetch_count's offset, `cnt`
// is that element's count). Exactly the reference's steps: bias, repetition, frequency,
// presence (one IEEE float32 operation each, no FMA), then the masks.
template <int VEC>
__device__ __forceinline__ void proc_vec(const ProcParams& pp, const RowProc& rp, uint32_t bits,
                                         int i, float (&z)[VEC], int cnt = 0) {
  const int pj = int((bits >> kPreShift) & 0xfu) - 1;  // prefetched count's element, or -1
  uint32_t hb = (bits >> 16) & 0xffu;
  while (hb) {  // logit bias (rare)
    const int j = __ffs(hb) - 1;
    hb &= hb - 1;
    float b;
    if (bias_lookup(pp, rp.q, i + j, b)) put<VEC>(z, j, fadd(pick<VEC>(z, j), b));
  }
  uint32_t sn = (bits >> 8) & 0xffu;
  while (sn) {  // penalties on the seen tokens (rare)
    const int j = __ffs(sn) - 1;
    sn &= sn - 1;
    float x = pick<VEC>(z, j);
    if (pp.rep != nullptr) {
      const float r = __ldg(pp.rep + rp.q);
      x = x > 0.0f ? __fdiv_rn(x, r) : fmul(x, r);
    }
    if (pp.freq != nullptr || pp.pres != nullptr) {
      const int c = j == pj ? cnt : __ldg(pp.counts + int64_t(rp.slot) * pp.vocab + (i + j));
      if (c > 0) {
        if (pp.freq != nullptr) x = fsub(x, fmul(__ldg(pp.freq + rp.q), __int2float_rn(c)));
        if (pp.pres != nullptr) x = fsub(x, __ldg(pp.pres + rp.q));
      }
    }
    put<VEC>(z, j, x);
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    if (!((bits >> j) & 1u)) z[j] = -INFINITY;
}

// The processed logit of token t (< V) with raw value z (the same operations as proc_vec).
__device__ __forceinline__ float proc_one(const ProcParams& pp, const RowProc& rp, int t, float z) {
  float v[1] = {z};
  proc_vec<1>(pp, rp, load_bits<1>(pp, rp, t, pp.vocab), t, v);
  return v[0];
}

// ------------------------------------------------------------------------------------------
// prep: one CTA per request, before the sampler (stream order)
// ------------------------------------------------------------------------------------------
struct ProcPrep {
  uint32_t* keep;             // [n][words] out (null: not built)
  const uint32_t* allowed;    // [n][words] (null: all allowed)
  const int64_t* ban_indptr;  // [n + 1] (null: none)
  const int64_t* ban_ids;
  int64_t ban_nnz;
  const int64_t* min_tokens;   // [n] (null: none)
  const int64_t* num_output;   // [n]
  const int64_t* stop_indptr;  // [n + 1]
  const int64_t* stop_ids;
  int64_t stop_nnz;
  uint32_t* hasb;              // [n][words] out (null: no bias)
  unsigned long long* btab;    // [2 bias_nnz] out
  const int64_t* bias_indptr;  // [n + 1]
  const int64_t* bias_ids;
  int64_t bias_nnz;
  int vocab, words;
};

constexpr int kPrepThreads = 256;

// clears (keep) the bits of request q's CSR ids in its word row; ids outside [0, V) skipped
__device__ __forceinline__ void prep_clear(uint32_t* row, const int64_t* indptr, const int64_t* ids,
                                           int64_t nnz, int q, int vocab) {
  int64_t e0, e1;
  csr_range(indptr, nnz, q, e0, e1);
  for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int64_t t = ids[e];
    if (t >= 0 && t < vocab) atomicAnd(row + (t >> 5), ~(1u << (t & 31)));
  }
}

__global__ void __launch_bounds__(kPrepThreads) proc_prep_kernel(const ProcPrep pp) {
  const int q = blockIdx.x;
  const int64_t row = int64_t(q) * pp.words;
  int64_t b0 = 0, b1 = 0;
  if (pp.hasb != nullptr) csr_range(pp.bias_indptr, pp.bias_nnz, q, b0, b1);
  for (int w = threadIdx.x; w < pp.words; w += blockDim.x) {
    if (pp.keep != nullptr) pp.keep[row + w] = pp.allowed != nullptr ? pp.allowed[row + w] : ~0u;
    if (pp.hasb != nullptr) pp.hasb[row + w] = 0u;
  }
  for (int64_t e = 2 * b0 + threadIdx.x; e < 2 * b1; e += blockDim.x) pp.btab[e] = kBiasEmpty;
  __syncthreads();  // the rows above are written before the bit updates below
  if (pp.keep != nullptr) {
    if (pp.ban_indptr != nullptr)
      prep_clear(pp.keep + row, pp.ban_indptr, pp.ban_ids, pp.ban_nnz, q, pp.vocab);
    if (pp.min_tokens != nullptr && pp.num_output[q] < pp.min_tokens[q])
      prep_clear(pp.keep + row, pp.stop_indptr, pp.stop_ids, pp.stop_nnz, q, pp.vocab);
  }
  if (pp.hasb != nullptr) {
    const uint32_t cap = uint32_t(2 * (b1 - b0));
    unsigned long long* tab = pp.btab + 2 * b0;
    for (int64_t e = b0 + threadIdx.x; e < b1; e += blockDim.x) {
      const int64_t t = pp.bias_ids[e];
      if (t < 0 || t >= pp.vocab) continue;
      atomicOr(pp.hasb + row + (t >> 5), 1u << (t & 31));
      // linear probing; a repeated id (unvalidated input) keeps its last entry, as the
      // reference's and the Triton kernels' bias of a repeated id
      const unsigned long long key = (uint64_t(t) << 32) | uint64_t(e);
      uint32_t s = bias_slot(int(t), cap);
      for (;;) {
        const unsigned long long old = atomicCAS(tab + s, kBiasEmpty, key);
        if (old == kBiasEmpty) break;
        if ((old >> 32) == uint64_t(t)) {
          atomicMax(tab + s, key);
          break;
        }
        s = s + 1 == cap ? 0u : s + 1;
      }
    }
  }
}

// Launches the prep (nothing to do when neither keep nor has-bias words are built).
inline cudaError_t launch_proc_prep(const ProcPrep& pp, int n, cudaStream_t stream) {
  if (n == 0 || (pp.keep == nullptr && pp.hasb == nullptr)) return cudaSuccess;
  proc_prep_kernel<<<n, kPrepThreads, 0, stream>>>(pp);
  return cudaGetLastError();
}

}  // namespace tokenspeed_kernel::sampler
