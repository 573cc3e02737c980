// Verify: kernel 1b: exact sums where they decide something (verify_resolve_kernel). Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/pos_kernel.cuh"

namespace tokenspeed_kernel::verify {

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
  constexpr int U = VEC >= 8 ? 2 : 4;  // 16 elements per row and iteration
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
                                             bool ngram, int64_t start, int64_t end, long long& St,
                                             long long& Sq, BlockScratch& scratch) {
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
  if ((p.flags & kListStats) && counted && threadIdx.x == 0) atomicAdd(&g_verify_list_stats[3], 1u);
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
  const int n = req_drafts(p, i);
  const bool ngram = p.flags & kNgram;
  const RowParams rp = row_params(p, i);
  const int64_t start = int64_t(sp) * p.rchunk;
  const int64_t end = start + p.rchunk < p.V ? start + p.rchunk : int64_t(p.V);
  bool any = false;  // uniform over the request's CTAs (same statuses, same walk)
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
    if (!(ps.status & kUnsure)) break;  // a decided rejection: the walk stops here
  }
  if (!any) return;  // bonus, bad or exact deciding position: no sums (uniform)
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
      sh_S[0] = (long long)atomicAdd(&p.racc[2 * row], 0ull);  // atomic reads of the totals
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
    __syncthreads();  // shared memory reuse by the next item
  }
}

}  // namespace tokenspeed_kernel::verify
