// Verify: kernel 2: walk + final token, residual resample or bonus sample (verify_final_kernel).
// Part of csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/thresholds.cuh"

namespace tokenspeed_kernel::verify {

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
  return TS_FINAL_STAGES;  // build knob for A/Bs (static shared memory: <= ~44 KiB of stages)
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
                                          const uint32_t& lb, R&& refresh, B&& base_of, S&& slow,
                                          uint4* pipe) {
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
  int rs = 0;  // stage read at this iteration
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
      cp_async_commit();  // empty groups too: wait_group counts groups
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
    auto block_of = [&](int g) -> Philox4 {       // group g: vector g / (VEC / 4), its quad g % ..
      constexpr int QV = VEC >= 4 ? VEC / 4 : 1;  // groups per vector (used only if VEC % 4 == 0)
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
  unsigned long long* cand;  // [bs]
  unsigned int* count;       // [bs]
  float4* state;             // [bs * splits] per-CTA interval state (first pass), or null
  int32_t splits;
  int32_t chunk;  // elements per split (multiple of 8)
  int32_t mode;   // 0: after the resolve kernel (every sum it needs is exact);
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
  __shared__ unsigned sh_lb;  // key32 of a lower bound of the winner's score (pruning)
  __shared__ float sh_hi;
  __shared__ float2 sh_iv[kThreads];
  __shared__ __align__(16) uint4 sh_pipe[final_pipe_vectors<VEC>()];  // scan_rows' loads
  __shared__ long long sh_S2[2];
  const int n_req = req_drafts(p, i);
  const bool over = n_req < 0;  // a wrong bound: invalid request, none of its rows is read
  const int n = over ? 0 : n_req;
  const int W = p.max_n + 1;

  // ---- walk: first position whose accept bit is missing ----
  if (threadIdx.x < 32) {
    const int f = over ? 0 : first_failed(p, i, 0, n);
    if (threadIdx.x == 0) {
      sh_f = f;
      // best score of this request's finished CTAs so far (0 = none): a valid lower bound
      sh_lb = uint32_t(*reinterpret_cast<volatile unsigned long long*>(&ws.cand[i]) >> 32);
    }
  }
  __syncthreads();
  const int f = sh_f;
  const int64_t tr = target_row(p, i, f);
  const PosStats st = over ? PosStats{} : p.pos[tr];  // (an over request's rows may not exist)
  const bool bonus = f == n;
  const bool bad = over || (st.status & kBadT) || (!bonus && (st.status & kBadQ));
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
        if (logprobs) {
          p.lp[o] = j > f ? 0.0f : NAN;
          p.plp[o] = j > f ? 0.0f : NAN;
        }
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
  Cand best{-INFINITY, INT32_MAX};  // approx: by the lower ends of the score intervals
  // approx, per thread (shared memory: touched only by the rare exact scores, keeps registers
  // for the scan): upper end of best's interval, max upper end of the other scored tokens
  sh_iv[threadIdx.x] = make_float2(-INFINITY, -INFINITY);
  uint32_t blk = 0xffffffffu;
  Philox4 ph{0, 0, 0, 0};
  auto word = [&](int64_t id, uint32_t stream) -> uint32_t {
    const uint32_t b = uint32_t(id >> 2);
    if (b != blk) {
      blk = b;
      ph = philox_block(seed, offp, b, stream);
    }
    return (id & 3) == 0 ? ph.x : (id & 3) == 1 ? ph.y : (id & 3) == 2 ? ph.z : ph.w;
  };
  auto noise = [&](int64_t id, uint32_t stream) -> float {
    return gumbel_from_bits(word(id, stream));
  };
  // Exact pruning: `lb` is key32 of a lower bound of the winner's score -- the score of a token
  // that was actually scored exactly (by any thread of this CTA, by the probe, or by a finished
  // CTA of this request through ws.cand). A token whose score upper bound ub is < that score
  // has a strictly smaller score than the winner, so it is not the winner (ties included) and
  // its exact score need not be computed. The winner itself is never skipped.
  uint32_t lb = 0;  // 0 = no bound (key32 of every float is > 0)
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
    if (k > lb) {
      lb = k;
      atomicMax(&sh_lb, k);
    }
  };
  auto refresh = [&]() {  // lb = max(lb, the CTA's shared bound)
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
      if (!may_win(fadd(y, gumbel_ub(w)))) return;  // the shared bound may have risen
      const float s = fadd(y, gumbel_from_bits(w));
      best = best_of(best, Cand{s, int32_t(id)});
      publish(s);
    };
    if (threadIdx.x == 0) {  // probe: the row's argmax token (its score seeds the bound)
      const float bs = base_of(st.arg_t, to_f<T>(trow[st.arg_t]), 0.0f);
      if (bs > -INFINITY)
        slow(st.arg_t, philox_word(seed, offp, uint32_t(st.arg_t), kStreamSample));
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
      if (threadIdx.x == 0) {
        sh_S2[0] = Sq_lo;
        sh_S2[1] = St_hi;
      }  // read by the rare scores
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
        if (int32_t(id) == best.id) return;  // the probe's token scanned again
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
      const float ub = __fmaf_rn(yt, ubc_a, ubc_b);  // >= ubc_of(yt), see above
      return out ? -INFINITY : ub;
    };
    if (start < end) {
      if (ngram) {
        if (plain)
          scan_rows<T, VEC, false>(trow, trow, start, end, seed, offp, kStreamResample, lb, refresh,
                                   base_plain, slow, sh_pipe);
        else
          scan_rows<T, VEC, false>(trow, trow, start, end, seed, offp, kStreamResample, lb, refresh,
                                   base_of, slow, sh_pipe);
      } else {
        if (plain)
          scan_rows<T, VEC, true>(trow, drow, start, end, seed, offp, kStreamResample, lb, refresh,
                                  base_plain, slow, sh_pipe);
        else
          scan_rows<T, VEC, true>(trow, drow, start, end, seed, offp, kStreamResample, lb, refresh,
                                  base_of, slow, sh_pipe);
      }
    }
  }
  const Cand mine = best;
  best = block_best(best, scratch);
  float hx = -INFINITY;  // approx: max upper end over the CTA's scored tokens other than best
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
      ws.state[int64_t(i) * ws.splits + sp] = make_float4(__int_as_float(best.id), sh_hi, hx, 0.0f);
    __threadfence();
    sh_last = atomicAdd(&ws.count[i], 1u) == unsigned(ws.splits) - 1u;
  }
  __syncthreads();
  if (!sh_last) return;
  // ---- the last CTA of the request: winner, fallback, token, logprobs ----
  if (threadIdx.x == 0) {
    __threadfence();
    sh_key = atomicMax(&ws.cand[i], 0ull);  // atomic read of the final maximum
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
    const bool decided =
        key != 0ull && !(p.flags & kExactResidual) && key32_to_float(uint32_t(key >> 32)) > h;
    if (!decided) {
      if (threadIdx.x == 0) {
        ws.cand[i] = 0ull;  // the second pass starts afresh
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
      p.plp[o] =
          rp.greedy ? 0.0f : ycen(z, st.zmax_t, rp.inv_t) - (logf(float(st.S_t)) - kLn2Pow38);
    }
  }
}

// One item (request i, split sp) per CTA (mode 0 and 1); in the second pass (mode 2) the CTAs
// of a fixed grid stride over (request of p.flist, split) items.
#ifndef TS_FINAL_MINB
#define TS_FINAL_MINB 4
#endif
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads, TS_FINAL_MINB)
    verify_final_kernel(const VerifyParams p, const FinalWs ws) {
  const bool listed = ws.mode == 2;
  const unsigned S = unsigned(ws.splits);
  const unsigned items =
      listed ? *reinterpret_cast<const volatile unsigned*>(p.fcount) * S : gridDim.x;
  for (unsigned it = blockIdx.x; it < items; it += gridDim.x) {
    final_one<T, VEC>(p, ws, listed ? p.flist[it / S] : int(it / S), int(it % S));
    __syncthreads();  // shared memory reuse by the next item
  }
}

}  // namespace tokenspeed_kernel::verify
