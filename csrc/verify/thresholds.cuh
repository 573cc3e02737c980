// Verify: kernel 0 (top-k / top-p only): kept-set thresholds of every target and draft row. Part
// of csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/resolve_kernel.cuh"

namespace tokenspeed_kernel::verify {

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
    active = j >= 0 && j <= req_drafts(p, i);  // (j < 0: a row before cu[0], unvalidated)
    return static_cast<const T*>(p.tgt) + r * p.stride_t;
  }
  const int64_t d = r - p.R_t;
  locate_draft_row(p, d, i, j);
  active = j >= 0 && j < req_drafts(p, i);
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
__global__ void __launch_bounds__(kThreads)
    verify_thr_max_kernel(const VerifyParams p, const int64_t row0, const int32_t chunk,
                          const int32_t splits, int32_t* row_req, sampling::Partial* part) {
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
  if (!on) return;  // uniform per row
  const int64_t start = int64_t(split) * chunk;
  const int64_t end = start + chunk < p.V ? start + chunk : int64_t(p.V);
  MaxArg acc{-INFINITY, INT32_MAX};
  bool bad = false;
  if (start < end)
    for_chunk<T, VEC>(row, start, end, [&](int64_t id, float z) {
      if (z != z || z == INFINITY)
        bad = true;
      else if (z > acc.v) {
        acc.v = z;
        acc.id = int32_t(id);
      }
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
    if (z != z)
      isnan_ = true;
    else if (z > acc.v) {
      acc.v = z;
      acc.id = int32_t(id);
    }
  });
  const MaxArg a = block_max_arg(acc, scratch);
  const bool nan = block_any(isnan_, scratch);
  const float zm = a.v;
  if (nan || zm == INFINITY || zm == -INFINITY) {  // invalid row: the walk stops there anyway
    if (threadIdx.x == 0) p.thr[r] = 0;
    return;
  }
  auto key_of = [&](int64_t id, float z) -> int64_t {  // keys of the raw logits
    return int64_t(key56(key32(z), uint32_t(id)));
  };
  int64_t t_k = 0;
  if (k_on) {
    int64_t lo = 0, hi = int64_t(1) << 56;  // count(key >= lo) >= k > count(key >= hi)
    for (int it = 0; it < 56; ++it) {
      const int64_t mid = (lo + hi) >> 1;
      long long c = 0;
      float unused = 0.0f;
      for_chunk<T, VEC>(row, 0, p.V, [&](int64_t id, float z) { c += key_of(id, z) >= mid; });
      block_sum2(c, unused, scratch);
      if (c >= k)
        lo = mid;
      else
        hi = mid;
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
    int64_t lo = -1, hi = (int64_t(1) << 56) - 1;  // G(lo) >= lim > G(hi)
    for (int it = 0; it < 56; ++it) {
      const int64_t mid = (lo + hi) >> 1;
      long long gsum = 0;
      for_chunk<T, VEC>(row, 0, p.V, [&](int64_t id, float z) {
        const int64_t kk = key_of(id, z);
        if (kk > mid && kk >= t_k) gsum += mass_at(ycen(z, zm, rp.inv_t));
      });
      block_sum2(gsum, unused, scratch);
      if (gsum < lim)
        hi = mid;
      else
        lo = mid;
    }
    thr = t_k > hi ? t_k : hi;
  }
  if (threadIdx.x == 0) p.thr[r] = thr;
}

}  // namespace tokenspeed_kernel::verify
