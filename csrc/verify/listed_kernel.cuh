// Verify: kernels 3 + 4 fused: the listed requests' exact path (sm_90 clusters). Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/final_kernel.cuh"

namespace tokenspeed_kernel::verify {

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
  const int n = req_drafts(p, i);
  const bool ngram = p.flags & kNgram;
  const RowParams rp = row_params(p, i);
  const int64_t start = int64_t(rank) * ws.chunk;
  const int64_t end = start + ws.chunk < p.V ? start + ws.chunk : int64_t(p.V);
  for (int f = block_first_failed(p, i, 0, n, sh_f); f < n;
       f = block_first_failed(p, i, f + 1, n, sh_f)) {
    const int64_t row = target_row(p, i, f);
    const PosStats ps = p.pos[row];
    if (ps.status & (kBadT | kBadQ | kExactS)) break;  // nothing to compute (uniform)
    long long St, Sq;
    position_masses<T, VEC>(p, rp, ps, i, f, row, start, end, rank == 0, St, Sq, scratch);
    if (threadIdx.x == 0) {
      sh_part[0] = St;
      sh_part[1] = Sq;
    }
    cl.sync();  // every CTA's partial sums are in its shared memory
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
    cl.sync();  // every CTA has read every partial (sh_part reusable); sh_S visible in the CTA
    const long long Sx = sh_S[0];
    const long long Qx = ngram ? 1 : sh_S[1];
    const bool acc = (ps.status & kUnsure) && coin_exact(coin_U(p, i, f), ps.e_p, ps.e_q, Sx, Qx);
    if (rank == 0 && threadIdx.x == 0) {
      p.pos[row].S_t = Sx;
      p.pos[row].S_q = Qx;
      p.pos[row].status = (ps.status & ~kUnsure) | kExactS | (acc ? kAccept : 0u);
    }
    if (!acc) break;  // uniform: every CTA decided the same
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
__global__ void __launch_bounds__(kThreads, 2)
    verify_listed_kernel(const VerifyParams p, const FinalWs ws) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const unsigned C = cl.num_blocks();
  const unsigned rank = cl.block_rank();
  const unsigned items = *reinterpret_cast<const volatile unsigned*>(p.fcount);
  for (unsigned it = blockIdx.x / C; it < items; it += gridDim.x / C) {
    const int i = p.flist[it];
    listed_sums<T, VEC>(p, ws, i, rank);
    final_one<T, VEC>(p, ws, i, int(rank));
    cl.sync();  // the next item reuses shared memory that other CTAs of the cluster may read
  }
}

}  // namespace tokenspeed_kernel::verify
