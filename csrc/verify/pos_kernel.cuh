// Verify: kernel 1: per-position statistics and accept coins (verify_pos_kernel). Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/online.cuh"

namespace tokenspeed_kernel::verify {

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
constexpr int pos_min_blocks() {
  return sizeof(T) == 2 ? 4 : (CLUSTER ? 3 : 4);
}
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
    j = int(vrow / p.bs);  // < W: the grid is bs * W rows
    i = int(vrow - int64_t(j) * p.bs);
    n = req_drafts(p, i);
    if (j > n) {  // padded layout: padding row; ragged: no such row (uniform over the cluster)
      if (rank == 0 && threadIdx.x == 0 && (p.flags & kPadded))
        p.pos[target_row(p, i, j)].status = 0;
      return;
    }
    row = target_row(p, i, j);
    if constexpr (CLUSTER) G::sync();  // every peer has started: its shared memory exists
    if (rank == 0 && threadIdx.x == 0) {
      const int s = *reinterpret_cast<volatile int*>(&p.stop[i]);
      const int k = s > 0 && int64_t(j) > W - s;
      if (k) {
        p.pos[row].status = 0;  // never read; not left stale either
        if (p.flags & kListStats) atomicAdd(&g_verify_list_stats[4], 1u);
      }
      for (unsigned q = 0; q < cs; ++q) *G::map(&sh_skip, q) = k;
    }
    G::sync();  // the decision is visible to every thread of every CTA of the cluster
    if (sh_skip) return;
  } else {
    row = vrow;
    if (row >= p.R_t) return;  // uniform over the cluster
    locate_target_row(p, row, i, j);
    n = req_drafts(p, i);
    // padding row of the padded layout; ragged, unvalidated cu: a row of no request (before
    // cu[0] + 0, or of an invalid request: n = -1) (uniform over the cluster)
    if (j > n || j < 0) {
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
  const bool fast =
      rp.greedy || (!rp.mp_on && thr_t == 0 && thr_q == 0 && c < INFINITY && rp.inv_t >= 0x1p-120f);
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
  long long S[2] = {0, 0};        // exact path
  double St_a = 0.0, Sq_a = 0.0;  // fast path: approximate S (units of 1, i.e. S / 2^38)
  float set = 0.0f;               // raw sum-exp relative to the raw max (logprobs)
  if (fast) {
    Online o[2];
    online_init(o[0]);
    online_init(o[1]);
    if (has_d) {
      if (logprobs)
        online_chunk<T, VEC, true, true, PU>(trow, drow, start, end, c, o[0], o[1]);
      else
        online_chunk<T, VEC, false, true, PU>(trow, drow, start, end, c, o[0], o[1]);
    } else {
      if (logprobs)
        online_chunk<T, VEC, true, false, PU>(trow, trow, start, end, c, o[0], o[1]);
      else
        online_chunk<T, VEC, false, false, PU>(trow, trow, start, end, c, o[0], o[1]);
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
                          ? double(online_rescale(mine.sr, mine.mx[r], g[r].v, kLog2e))
                          : 0.0;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
          acc += __shfl_xor_sync(0xffffffffu, acc, o);
          accr += __shfl_xor_sync(0xffffffffu, accr, o);
        }
        gnan[r] = acc != acc;  // NaN in the row (or +inf: then zmax is +inf, a bad row too)
        if (r == 0) {
          St_a = acc;
          set = float(accr);
        } else
          Sq_a = acc;
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
        if (z != z)
          isnan_ = true;
        else if (z > acc.v) {
          acc.v = z;
          acc.id = int32_t(id);
        }
      });
      a[r] = block_max_arg(acc, scratch);
      nan[r] = block_any(isnan_, scratch);
    }
    if (threadIdx.x == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        slot1.zmax[r] = a[r].v;
        slot1.arg[r] = a[r].id;
        slot1.nan[r] = nan[r];
      }
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
      for (int r = 0; r < 2; ++r) {
        slot2.S[r] = S[r];
        slot2.se[r] = se[r];
      }
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
    uint32_t status =
        kActive | (bad[0] ? kBadT : 0u) | (has_d && bad[1] ? kBadQ : 0u) | (exactS ? kExactS : 0u);
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
      const uint64_t U = coin_from_bits(coin_bits);  // coin_U(p, i, j)
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
        const double slack = 1e-12;  // double rounding of the products
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

}  // namespace tokenspeed_kernel::verify
