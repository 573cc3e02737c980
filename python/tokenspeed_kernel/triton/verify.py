"""Triton speculative verify (fallback backend; runs on the CPU under TRITON_INTERPRET=1).

Same decisions as ``reference.verify`` bit for bit (docs/VERIFY.md): every float op that decides
a token is an explicit IEEE float32 op from ``triton/prims.py`` (kernels are launched with
``enable_fp_fusion=False``, divisions use ``div_rn``); masses and the accept / residual tests are
exact integers.

Kernels (probabilistic / ngram); vocabulary splits combine through integer atomics, so the
results do not depend on the split count or the order programs run in:

1. ``_pass1``  grid (rows, splits): per split of every target and draft row, the raw max and its
   lowest id packed in one int64 key (``key32(z) << 31 | (2**31 - 1 - id)``), ``atomic_max``'d
   into the row; a NaN flag likewise.
2. ``_pass2``  grid (rows, splits): with the row max, the fixed-point mass sum S of the kept set
   (int64 ``atomic_add``: exact, order-free) and sum exp(z - zmax) for logprobs. The split is
   re-read (L2) rather than kept.
3. ``_walk``   grid (bs,): all positions of a request at once: accept coins, first failure,
   accepted tokens / logprobs, and the one final job (residual at the first rejection, or bonus).
4. ``_final``  grid (bs, splits): Gumbel candidates of the final job's row(s), packed like (1)
   and ``atomic_max``'d per request (residual and fallback separately).
5. ``_final_reduce`` grid (bs,): the winner, its token and logprobs.

Strict mode uses the sampler for the target tokens and ``_strict_accept`` (grid (bs,)).

Filters: temperature (and greedy), min-p, top-k and top-p. The top-k / top-p kept set of a row is
``key56 >= thr`` with ``thr`` found by ``_thresholds`` (exact bisection over the 56-bit key: ~113
passes over the row, from L2; correct but slow, only for rows with an active top-k / top-p).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .prims import (Const, centered, gumbel_from_bits, key32, key32_to_float, philox4x32_10,
                    soft_exp_neg, soft_ln, uniform_from_bits)

_LN_2POW38 = Const(26.33959286127792)   # 38 * ln 2 (logprobs only, not bit-exact)
GUMBEL_SPAN = Const(19.5)   # G in [-2.8116, 16.6356]: y < -span never wins Gumbel-max
DEFAULT_BLOCK = 1024      # elements per program iteration (tests lower it to exercise splits)
MAX_CPU_SPLITS = 4
MASS_CUT = -26.5          # mass_fixed(y) == 0 for every float32 y < -26.34 (checked exhaustively)
_MASS_CUT_C = Const(MASS_CUT)
# _final's block skip: a block is evaluated exactly only when an upper bound of some element's
# score reaches the program's best so far. Bounds: G = -ln(-ln u) <= -ln(1 - u) (-ln u >= 1 - u);
# ln(mass_fixed(y)) <= y + 38 ln 2; the residual's support w <= e^p S_q. 26.34 > 38 ln 2; the
# margin covers the approximate logs (tl.log) and the float32 roundings of the exact scores
# (|score| < 128, so their errors are below 1e-4).
_SKIP_LN2POW38 = Const(26.34)
_SKIP_MARGIN = Const(0.02)
_LAUNCH = {"enable_fp_fusion": False}


# ---------------------------------------------------------------------------------------------
# helpers on top of triton/prims.py
# ---------------------------------------------------------------------------------------------
@triton.jit
def _key(seed):
    s = seed.to(tl.int64)
    return s.to(tl.uint32), (s >> 32).to(tl.uint32)


@triton.jit
def _philox_word(seed, offset, token, stream: tl.constexpr):
    """u32 word of (seed, offset, token, stream) for a vector of tokens (scalar seed/offset)."""
    k0, k1 = _key(seed)
    o = offset.to(tl.int64)
    t = token.to(tl.uint32)
    z = t * 0
    x, y, w, v = philox4x32_10(t >> 2, o.to(tl.uint32) + z, (o >> 32).to(tl.uint32) + z,
                               z + stream, k0 + z, k1 + z)
    lane = t & 3
    return tl.where(lane == 0, x, tl.where(lane == 1, y, tl.where(lane == 2, w, v)))


@triton.jit
def _philox_block(seed, offset, base, stream: tl.constexpr, BLOCK: tl.constexpr):
    """Words of tokens base .. base+BLOCK-1 (base % 4 == 0): one Philox call per 4 tokens."""
    k0, k1 = _key(seed)
    o = offset.to(tl.int64)
    c0 = (base // 4 + tl.arange(0, BLOCK // 4)).to(tl.uint32)
    z = c0 * 0
    x, y, w, v = philox4x32_10(c0, o.to(tl.uint32) + z, (o >> 32).to(tl.uint32) + z,
                               z + stream, k0 + z, k1 + z)
    return tl.interleave(tl.interleave(x, w), tl.interleave(y, v))


@triton.jit
def _mass(y):
    """mass_fixed(y) with the exact shortcut: 0 for y < -26.5 (or NaN)."""
    e = (soft_exp_neg(y) * 274877906944.0).to(tl.int64)
    return tl.where(y >= -26.5, e, 0)


@triton.jit
def _pack(v, ids):
    """int64 key ordered by value, then lowest id: key32(v) << 31 | (2**31 - 1 - id)."""
    return (key32(v) << 31) | (0x7FFFFFFF - ids.to(tl.int64))


@triton.jit
def _unpack(k):
    return key32_to_float(k >> 31), (0x7FFFFFFF - (k & 0x7FFFFFFF)).to(tl.int32)


@triton.jit
def _mul_wide(a, b):
    """Exact a * b (0 <= a, b <= 2**62, int64) as (hi, lo): hi * 2**62 + lo."""
    a0 = a & 0x7FFFFFFF
    a1 = a >> 31
    b0 = b & 0x7FFFFFFF
    b1 = b >> 31
    p00 = a0 * b0
    p01 = a0 * b1
    p10 = a1 * b0
    p11 = a1 * b1
    t = p00 + ((p01 & 0x7FFFFFFF) << 31)
    c = t >> 62
    t = (t & 0x3FFFFFFFFFFFFFFF) + ((p10 & 0x7FFFFFFF) << 31)
    c = c + (t >> 62)
    lo = t & 0x3FFFFFFFFFFFFFFF
    hi = p11 + (p01 >> 31) + (p10 >> 31) + c
    return hi, lo


@triton.jit
def _wide_lt(ah, al, bh, bl):
    return (ah < bh) | ((ah == bh) & (al < bl))


@triton.jit
def _wide_to_f32(hi, lo):
    d = hi.to(tl.float64) * 4611686018427387904.0 + lo.to(tl.float64)
    return d.to(tl.float32)


@triton.jit
def _key56(x, ids):
    return (key32(x) << 24) | (0xFFFFFF - ids.to(tl.int64))


@triton.jit
def _kept(greedy, ids, arg, mp_on, y, L, z, thr, FILT: tl.constexpr):
    """The sampler's kept set: greedy -> the max key; else key56(z, id) >= thr (top-k / top-p,
    keys of the raw logits) and min-p (y >= soft_ln(min_p), y the processed logit)."""
    k = (mp_on == 0) | (y >= L)
    if FILT:
        k = k & (_key56(z, ids) >= thr)
    return tl.where(greedy, ids == arg, k)


@triton.jit
def _row_params(req, temp_ptr, minp_ptr):
    """(greedy, invT, min-p on, L = soft_ln(min_p)) for request ``req`` (scalar)."""
    t = tl.load(temp_ptr + req)
    greedy = (t > 0) == 0
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, t)))
    mp = tl.load(minp_ptr + req)
    mp = tl.where(mp > 1.0, 1.0, mp)   # unvalidated min_p > 1: 1 (a kept set never empty)
    mp_on = (mp > 0) & (greedy == 0)
    L = soft_ln(tl.where(mp_on, mp, 1.0))
    return greedy, inv_t, mp_on, L


# ---------------------------------------------------------------------------------------------
# statistics passes
# ---------------------------------------------------------------------------------------------
# chunk stays specialized: always a multiple of BLOCK (>= 16), so its divisibility never changes
# (no recompiles) and the loads at sp * chunk vectorize (16-byte loads)
@triton.jit(do_not_specialize=['R_t'])
def _pass1(tgt_ptr, drf_ptr, stride_t, stride_d, R_t, V, row_req_ptr, key_ptr, nan_ptr, chunk,
           BLOCK: tl.constexpr):
    row = tl.program_id(0)
    sp = tl.program_id(1)
    req = tl.load(row_req_ptr + row)
    if req >= 0:
        if row < R_t:
            base = tgt_ptr + row.to(tl.int64) * stride_t
        else:
            base = drf_ptr + (row - R_t).to(tl.int64) * stride_d
        acc = tl.full([BLOCK], float("-inf"), tl.float32)
        arg = tl.full([BLOCK], 2147483647, tl.int32)
        nan = tl.zeros([BLOCK], tl.int32)
        start = sp * chunk
        for off in range(start, start + chunk, BLOCK):
            ids = off + tl.arange(0, BLOCK)
            msk = ids < V
            z = tl.load(base + ids, mask=msk, other=float("-inf")).to(tl.float32)
            isn = z != z
            nan = nan | isn.to(tl.int32)
            z = tl.where(isn, float("-inf"), z)
            upd = z > acc
            arg = tl.where(upd, ids, arg)
            acc = tl.where(upd, z, acc)
        m = tl.max(acc, 0)
        a = tl.min(tl.where(acc == m, arg, 2147483647), 0)
        tl.atomic_max(key_ptr + row, _pack(m, a))
        tl.atomic_max(nan_ptr + row, tl.max(nan, 0))


@triton.jit(do_not_specialize=['R_t'])
def _pass2(tgt_ptr, drf_ptr, stride_t, stride_d, R_t, V, row_req_ptr, temp_ptr, minp_ptr,
           key_ptr, nan_ptr, thr_ptr, s_ptr, se_ptr, chunk, LOGPROBS: tl.constexpr,
           FILT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    sp = tl.program_id(1)
    req = tl.load(row_req_ptr + row)
    if req >= 0:
        if row < R_t:
            base = tgt_ptr + row.to(tl.int64) * stride_t
        else:
            base = drf_ptr + (row - R_t).to(tl.int64) * stride_d
        zmax, arg = _unpack(tl.load(key_ptr + row))
        nan = tl.load(nan_ptr + row)
        greedy, inv_t, mp_on, L = _row_params(req, temp_ptr, minp_ptr)
        bad = (nan != 0) | (zmax == float("inf")) | (zmax == float("-inf"))
        thr = tl.load(thr_ptr + row)
        S = tl.zeros([BLOCK], tl.int64)
        se = tl.zeros([BLOCK], tl.float32)
        start = sp * chunk
        if bad == 0:
            for off in range(start, start + chunk, BLOCK):
                ids = off + tl.arange(0, BLOCK)
                msk = ids < V
                z = tl.load(base + ids, mask=msk, other=float("-inf")).to(tl.float32)
                y = centered(z, zmax, inv_t)
                kept = _kept(greedy, ids, arg, mp_on, y, L, z, thr, FILT) & msk
                S += tl.where(kept, _mass(y), 0)
                if LOGPROBS:
                    se += tl.where(msk, tl.exp(z - zmax), 0.0)
            tl.atomic_add(s_ptr + row, tl.sum(S, 0))
            if LOGPROBS:
                tl.atomic_add(se_ptr + row, tl.sum(se, 0))


@triton.jit(do_not_specialize=['R_t'])
def _thresholds(tgt_ptr, drf_ptr, stride_t, stride_d, R_t, V, row_req_ptr, temp_ptr, minp_ptr,
                topk_ptr, topp_ptr, key_ptr, nan_ptr, thr_ptr, BLOCK: tl.constexpr):
    """Kept-set threshold of every row: kept = {key56(z, id) >= thr} (top-k, then top-p on the
    top-k mass; reference.sampling.kept_mask). Exact bisection over the 56-bit key space: 56
    counting passes (top-k) and 1 + 56 fixed-point mass passes (top-p). Slow (re-reads the row
    ~113 times, from L2) but exact; rows without an active top-k / top-p do nothing."""
    row = tl.program_id(0)
    req = tl.load(row_req_ptr + row)
    if req >= 0:
        if row < R_t:
            base = tgt_ptr + row.to(tl.int64) * stride_t
        else:
            base = drf_ptr + (row - R_t).to(tl.int64) * stride_d
        zmax, arg = _unpack(tl.load(key_ptr + row))
        nan = tl.load(nan_ptr + row)
        greedy, inv_t, mp_on, L = _row_params(req, temp_ptr, minp_ptr)
        bad = (nan != 0) | (zmax == float("inf")) | (zmax == float("-inf"))
        k = tl.load(topk_ptr + req).to(tl.int64)
        p = tl.load(topp_ptr + req)
        k_on = (k > 0) & (k < V) & (greedy == 0) & (bad == 0)
        p_on = (p < 1.0) & (greedy == 0) & (bad == 0)
        t_k = tl.zeros([], tl.int64)
        if k_on:
            lo = tl.zeros([], tl.int64)              # count(key >= lo) >= k
            hi = tl.zeros([], tl.int64) + (1 << 56)  # count(key >= hi) < k
            for _ in range(56):
                mid = (lo + hi) >> 1
                c = tl.zeros([BLOCK], tl.int64)
                for off in range(0, V, BLOCK):
                    ids = off + tl.arange(0, BLOCK)
                    msk = ids < V
                    z = tl.load(base + ids, mask=msk, other=0.0).to(tl.float32)
                    c += ((_key56(z, ids) >= mid) & msk).to(tl.int64)
                ge = tl.sum(c, 0) >= k
                lo = tl.where(ge, mid, lo)
                hi = tl.where(ge, hi, mid)
            t_k = lo
        thr = t_k
        if p_on:
            sk = tl.zeros([BLOCK], tl.int64)
            for off in range(0, V, BLOCK):
                ids = off + tl.arange(0, BLOCK)
                msk = ids < V
                z = tl.load(base + ids, mask=msk, other=0.0).to(tl.float32)
                sk += tl.where(msk & (_key56(z, ids) >= t_k), _mass(centered(z, zmax, inv_t)),
                               0)
            s_k = tl.sum(sk, 0)
            lim = tl.maximum((p.to(tl.float64) * s_k.to(tl.float64)).to(tl.int64), 1)
            lo = tl.zeros([], tl.int64) - 1          # G(lo) >= lim (or lo = -1)
            hi = tl.zeros([], tl.int64) + ((1 << 56) - 1)   # G(hi) < lim
            for _ in range(56):
                mid = (lo + hi) >> 1
                g = tl.zeros([BLOCK], tl.int64)
                for off in range(0, V, BLOCK):
                    ids = off + tl.arange(0, BLOCK)
                    msk = ids < V
                    z = tl.load(base + ids, mask=msk, other=0.0).to(tl.float32)
                    k56 = _key56(z, ids)
                    g += tl.where(msk & (k56 > mid) & (k56 >= t_k),
                                  _mass(centered(z, zmax, inv_t)), 0)
                below = tl.sum(g, 0) < lim
                hi = tl.where(below, mid, hi)
                lo = tl.where(below, lo, mid)
            thr = tl.maximum(t_k, hi)
        tl.store(thr_ptr + row, thr)


@triton.jit
def _row_stats(key_ptr, nan_ptr, s_ptr, se_ptr, rows, mask):
    """Vector of rows -> (zmax, arg, invalid, S, sumexp). Invalid: a NaN or +inf raw logit, or
    no finite one."""
    r = rows.to(tl.int64)
    zmax, arg = _unpack(tl.load(key_ptr + r, mask=mask, other=0))
    nan = tl.load(nan_ptr + r, mask=mask, other=0)
    bad = (nan != 0) | (zmax == float("inf")) | (zmax == float("-inf"))
    S = tl.load(s_ptr + r, mask=mask, other=0)
    se = tl.load(se_ptr + r, mask=mask, other=0.0)
    return zmax, arg, bad, S, se


# ---------------------------------------------------------------------------------------------
# walk: accept coins, first failure, job of the final token
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=['R_t', 'MAX_N', 'NIDS'])
def _walk(tgt_ptr, drf_ptr, stride_t, stride_d, R_t, V, ids_ptr, cu_ptr, seed_ptr, off_ptr,
          temp_ptr, minp_ptr, key_ptr, nan_ptr, thr_ptr, s_ptr, se_ptr,
          tok_ptr, acc_ptr, valid_ptr, lp_ptr, plp_ptr, jobi_ptr, jobf_ptr, MAX_N, NIDS,
          PADDED: tl.constexpr, NGRAM: tl.constexpr, LOGPROBS: tl.constexpr,
          FILT: tl.constexpr, BLOCK_N: tl.constexpr):
    i = tl.program_id(0)
    c0 = tl.load(cu_ptr + i)
    n64 = tl.load(cu_ptr + i + 1) - c0
    # a wrong bound (more drafts than MAX_N, or a negative count: unvalidated input, e.g. under
    # graph capture) makes the request invalid; nothing of it is read and every write stays
    # inside its output row (slot 0: token 0, num_accepted 0, valid False). Ragged: so does a
    # range outside the NIDS draft ids (its draft ids / rows would lie past the tensors)
    over = _bad_range(c0, n64, MAX_N, NIDS, PADDED)
    n = tl.where(over, 0, n64).to(tl.int32)
    j = tl.arange(0, BLOCK_N)
    W = MAX_N + 1
    if PADDED:
        tr = i.to(tl.int64) * W + j
        dr = i.to(tl.int64) * MAX_N + j
    else:
        tr = c0 + i + j
        dr = c0 + j
    in_t = (j <= n) & (over == 0)
    in_d = (j < n) & (over == 0)
    greedy, inv_t, mp_on, L = _row_params(i, temp_ptr, minp_ptr)
    zmax_t, arg_t, bad_t, S_t, se_t = _row_stats(key_ptr, nan_ptr, s_ptr, se_ptr, tr, in_t)
    x = tl.load(ids_ptr + dr, mask=in_d, other=0).to(tl.int64)
    xr = (x >= 0) & (x < V) & in_d
    xc = tl.where(xr, x, 0)
    z_tx = tl.load(tgt_ptr + tr * stride_t + xc, mask=in_d, other=0.0).to(tl.float32)
    thr_t = tl.load(thr_ptr + tr, mask=in_t, other=0)
    y_t = centered(z_tx, zmax_t, inv_t)
    kp = _kept(greedy, xc, arg_t, mp_on, y_t, L, z_tx, thr_t, FILT) & xr
    ep = tl.where(kp, _mass(y_t), 0)
    if NGRAM:
        eq = tl.full([BLOCK_N], 1, tl.int64)
        S_q = tl.full([BLOCK_N], 1, tl.int64)
        bad_q = j < 0
        zmax_q = tl.zeros([BLOCK_N], tl.float32)
        arg_q = tl.zeros([BLOCK_N], tl.int32)
        thr_q = tl.zeros([BLOCK_N], tl.int64)
    else:
        zmax_q, arg_q, bad_q, S_q, se_q = _row_stats(key_ptr, nan_ptr, s_ptr, se_ptr, R_t + dr,
                                                     in_d)
        z_qx = tl.load(drf_ptr + dr * stride_d + xc, mask=in_d, other=0.0).to(tl.float32)
        thr_q = tl.load(thr_ptr + R_t + dr, mask=in_d, other=0)
        y_q = centered(z_qx, zmax_q, inv_t)
        kq = _kept(greedy, xc, arg_q, mp_on, y_q, L, z_qx, thr_q, FILT) & xr
        eq = tl.where(kq, _mass(y_q), 0)
    seed = tl.load(seed_ptr + i)
    off = tl.load(off_ptr + i)
    U = ((_philox_word(seed, off, j, 1) >> 9) * 2 + 1).to(tl.int64)
    lh, ll = _mul_wide(U * eq, S_t)
    rh, rl = _mul_wide(ep << 24, S_q)
    ok = _wide_lt(lh, ll, rh, rl) & (bad_t == 0) & (bad_q == 0)
    f = tl.min(tl.where(in_d & (ok == 0), j, BLOCK_N), 0)
    f = tl.minimum(f, n)
    at = j == f
    bonus = f == n
    bad_f = tl.sum(tl.where(at, (bad_t | (bad_q & (bonus == 0))).to(tl.int32), 0), 0) != 0
    bad_f = bad_f | over
    # accepted drafts, -1 padding; final slot written by the final kernels (or 0 if invalid)
    outm = j < W
    tok = tl.where(j < f, x, -1)
    tok = tl.where(at & bad_f, 0, tok)
    tl.store(tok_ptr + i.to(tl.int64) * W + j, tok, mask=outm)
    tl.store(acc_ptr + i, f)
    tl.store(valid_ptr + i, (bad_f == 0))
    if LOGPROBS:
        lse = zmax_t + tl.log(tl.where(in_t, se_t, 1.0))
        lp = z_tx - lse
        plp = tl.where(greedy, 0.0,
                       y_t - (tl.log(tl.where(in_t, S_t, 1).to(tl.float32)) - _LN_2POW38))
        zero = tl.zeros([BLOCK_N], tl.float32)
        lp = tl.where(j < f, lp, zero)
        plp = tl.where(j < f, plp, zero)
        lp = tl.where(at & bad_f, float("nan"), lp)
        plp = tl.where(at & bad_f, float("nan"), plp)
        tl.store(lp_ptr + i.to(tl.int64) * W + j, lp, mask=outm)
        tl.store(plp_ptr + i.to(tl.int64) * W + j, plp, mask=outm)
        lse_f = tl.sum(tl.where(at, lse, 0.0), 0)
    else:
        lse_f = 0.0
    # job: mode (0 none, 1 residual, 2 bonus), position, S_t, S_q, arg_t, arg_q, draft id
    mode = tl.where(bad_f, 0, tl.where(bonus, 2, 1))
    ji = jobi_ptr + i.to(tl.int64) * 10
    tl.store(ji + 7, tl.sum(tl.where(at, thr_t, 0), 0))
    tl.store(ji + 8, tl.sum(tl.where(at, thr_q, 0), 0))
    tl.store(ji + 0, mode.to(tl.int64))
    tl.store(ji + 1, f.to(tl.int64))
    tl.store(ji + 2, tl.sum(tl.where(at, S_t, 0), 0))
    tl.store(ji + 3, tl.sum(tl.where(at, S_q, 0), 0))
    tl.store(ji + 4, tl.sum(tl.where(at, arg_t, 0), 0).to(tl.int64))
    tl.store(ji + 5, tl.sum(tl.where(at, arg_q, 0), 0).to(tl.int64))
    tl.store(ji + 6, tl.sum(tl.where(at & in_d, x, 0), 0))
    jf = jobf_ptr + i.to(tl.int64) * 4
    tl.store(jf + 0, tl.sum(tl.where(at, zmax_t, 0.0), 0))
    tl.store(jf + 1, tl.sum(tl.where(at, zmax_q, 0.0), 0))
    tl.store(jf + 2, lse_f)


# ---------------------------------------------------------------------------------------------
# final token: residual resample or bonus sample, split over the vocabulary
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=['MAX_N'])
def _final(tgt_ptr, drf_ptr, stride_t, stride_d, V, cu_ptr, seed_ptr, off_ptr, temp_ptr,
           minp_ptr, jobi_ptr, jobf_ptr, cand_ptr, MAX_N, chunk,
           PADDED: tl.constexpr, NGRAM: tl.constexpr, FILT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    sp = tl.program_id(1)
    ji = jobi_ptr + i.to(tl.int64) * 10
    mode = tl.load(ji + 0)
    if mode != 0:
        f = tl.load(ji + 1)
        thr_t = tl.load(ji + 7)
        thr_q = tl.load(ji + 8)
        S_t = tl.load(ji + 2)
        S_q = tl.load(ji + 3)
        arg_t = tl.load(ji + 4)
        arg_q = tl.load(ji + 5)
        xd = tl.load(ji + 6)
        zmax_t = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 0)
        zmax_q = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 1)
        c0 = tl.load(cu_ptr + i)
        if PADDED:
            tr = i.to(tl.int64) * (MAX_N + 1) + f
            dr = i.to(tl.int64) * MAX_N + f
        else:
            tr = c0 + i + f
            dr = c0 + f
        tbase = tgt_ptr + tr * stride_t
        dbase = drf_ptr + dr * stride_d
        greedy, inv_t, mp_on, L = _row_params(i, temp_ptr, minp_ptr)
        seed = tl.load(seed_ptr + i)
        offp = tl.load(off_ptr + i) + f
        best_s = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK], 2147483647, tl.int32)
        fb_s = tl.full([BLOCK], float("-inf"), tl.float32)
        fb_i = tl.full([BLOCK], 2147483647, tl.int32)
        start = sp * chunk
        if mode == 2:
            # bonus: the sampler's Gumbel-max over the kept set of y + G, offset + n, stream 0
            # (y < -19.5 never wins: the max token, always kept, scores G >= -2.8116)
            for off in range(start, start + chunk, BLOCK):
                ids = off + tl.arange(0, BLOCK)
                msk = ids < V
                z = tl.load(tbase + ids, mask=msk, other=float("-inf")).to(tl.float32)
                y = centered(z, zmax_t, inv_t)
                kept = _kept(greedy, ids, arg_t, mp_on, y, L, z, thr_t, FILT) & msk
                live = kept & (y >= -GUMBEL_SPAN)
                if tl.max(live.to(tl.int32), 0) != 0:
                    bits = _philox_block(seed, offp, off, 0, BLOCK)
                    # skip the exact noise when no element's bound reaches the best so far
                    gub = -tl.log(1.0 - uniform_from_bits(bits))
                    ub = tl.max(tl.where(live, y + gub, float("-inf")), 0) + _SKIP_MARGIN
                    if (ub >= tl.max(best_s, 0)) | (ub != ub):
                        g = gumbel_from_bits(bits)
                        s = tl.where(live, y + g, float("-inf"))
                        upd = s > best_s
                        best_i = tl.where(upd, ids, best_i)
                        best_s = tl.where(upd, s, best_s)
        else:
            # residual: support N_i = e^p_i S_q - e^q_i S_p > 0, stream 2 at offset + j;
            # score bounds (see _SKIP_MARGIN): residual ln N_i + G <= y_i + G_ub + c_res,
            # fallback ln e^p_i + G <= y_i + G_ub + c_fb
            c_fb = _SKIP_LN2POW38 + _SKIP_MARGIN
            c_res = c_fb + tl.log(tl.maximum(S_q, 1).to(tl.float32)) * 1.0001
            for off in range(start, start + chunk, BLOCK):
                ids = off + tl.arange(0, BLOCK)
                msk = ids < V
                zt = tl.load(tbase + ids, mask=msk, other=float("-inf")).to(tl.float32)
                yt = centered(zt, zmax_t, inv_t)
                kp = _kept(greedy, ids, arg_t, mp_on, yt, L, zt, thr_t, FILT) & msk
                live = kp & (yt >= _MASS_CUT_C)       # a superset of ep > 0
                if tl.max(live.to(tl.int32), 0) != 0:
                    bits = _philox_block(seed, offp, off, 2, BLOCK)
                    gub = -tl.log(1.0 - uniform_from_bits(bits))
                    ub = tl.max(tl.where(live, yt + gub, float("-inf")), 0)
                    if ((ub + c_res >= tl.max(best_s, 0)) | (ub + c_fb >= tl.max(fb_s, 0))
                            | (ub != ub)):
                        ep = tl.where(kp, _mass(yt), 0)
                        if NGRAM:
                            eq = (ids == xd).to(tl.int64)
                        else:
                            zq = tl.load(dbase + ids, mask=msk, other=float("-inf")).to(tl.float32)
                            yq = centered(zq, zmax_q, inv_t)
                            kq = _kept(greedy, ids, arg_q, mp_on, yq, L, zq, thr_q, FILT) & msk
                            eq = tl.where(kq, _mass(yq), 0)
                        ah, al = _mul_wide(ep, S_q)
                        bh, bl = _mul_wide(eq, S_t)
                        sup = _wide_lt(bh, bl, ah, al)
                        nl = al - bl
                        br = (nl < 0).to(tl.int64)
                        nh = ah - bh - br
                        nl = nl + (br << 62)
                        w = _wide_to_f32(tl.where(sup, nh, 0), tl.where(sup, nl, 1))
                        wf = _wide_to_f32(tl.zeros([BLOCK], tl.int64), tl.where(ep > 0, ep, 1))
                        g = gumbel_from_bits(bits)
                        s = tl.where(sup, soft_ln(w) + g, float("-inf"))
                        upd = s > best_s
                        best_i = tl.where(upd, ids, best_i)
                        best_s = tl.where(upd, s, best_s)
                        sf = tl.where(ep > 0, soft_ln(wf) + g, float("-inf"))
                        updf = sf > fb_s
                        fb_i = tl.where(updf, ids, fb_i)
                        fb_s = tl.where(updf, sf, fb_s)
        bs_ = tl.max(best_s, 0)
        bi = tl.min(tl.where((best_s == bs_) & (best_s > float("-inf")), best_i, 2147483647), 0)
        fs = tl.max(fb_s, 0)
        fi = tl.min(tl.where((fb_s == fs) & (fb_s > float("-inf")), fb_i, 2147483647), 0)
        o = i.to(tl.int64) * 2
        tl.atomic_max(cand_ptr + o, tl.where(bs_ > float("-inf"), _pack(bs_, bi), 0))
        tl.atomic_max(cand_ptr + o + 1, tl.where(fs > float("-inf"), _pack(fs, fi), 0))


@triton.jit(do_not_specialize=['MAX_N'])
def _final_reduce(tgt_ptr, stride_t, cu_ptr, temp_ptr, minp_ptr, jobi_ptr, jobf_ptr, cand_ptr,
                  tok_ptr, lp_ptr, plp_ptr, MAX_N, PADDED: tl.constexpr,
                  LOGPROBS: tl.constexpr):
    i = tl.program_id(0)
    ji = jobi_ptr + i.to(tl.int64) * 10
    mode = tl.load(ji + 0)
    if mode != 0:
        f = tl.load(ji + 1)
        kr = tl.load(cand_ptr + i.to(tl.int64) * 2)
        kf = tl.load(cand_ptr + i.to(tl.int64) * 2 + 1)
        _, tr_ = _unpack(kr)
        _, tf_ = _unpack(kf)
        tok = tl.where(kr != 0, tr_, tf_)
        W = MAX_N + 1
        inside = (f >= 0) & (f < W)      # always (the walk bounds f); never store outside
        tl.store(tok_ptr + i.to(tl.int64) * W + f, tok.to(tl.int64), mask=inside)
        if LOGPROBS:
            c0 = tl.load(cu_ptr + i)
            if PADDED:
                tr = i.to(tl.int64) * W + f
            else:
                tr = c0 + i + f
            greedy, inv_t, mp_on, L = _row_params(i, temp_ptr, minp_ptr)
            z = tl.load(tgt_ptr + tr * stride_t + tok).to(tl.float32)
            S_t = tl.load(ji + 2)
            zmax_t = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 0)
            lse = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 2)
            lp = z - lse
            y = centered(z, zmax_t, inv_t)
            plp = tl.where(greedy, 0.0, y - (tl.log(S_t.to(tl.float32)) - _LN_2POW38))
            tl.store(lp_ptr + i.to(tl.int64) * W + f, lp, mask=inside)
            tl.store(plp_ptr + i.to(tl.int64) * W + f, plp, mask=inside)


# ---------------------------------------------------------------------------------------------
# strict accept
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bad_range(c0, n64, MAX_N, NIDS, PADDED: tl.constexpr):
    """Whether request [c0, c0 + n64) of the drafts is out of bounds: more drafts than MAX_N, a
    negative count, or (ragged) a range outside [0, NIDS)."""
    bad = (n64 > MAX_N) | (n64 < 0)
    if not PADDED:
        bad = bad | (c0 < 0) | (c0 + n64 > NIDS)
    return bad


@triton.jit(do_not_specialize=['MAX_N', 'NIDS'])
def _strict_accept(row_tok_ptr, row_valid_ptr, row_lp_ptr, row_plp_ptr, ids_ptr, cu_ptr,
                   tok_ptr, acc_ptr, valid_ptr, lp_ptr, plp_ptr, MAX_N, NIDS, PADDED: tl.constexpr,
                   LOGPROBS: tl.constexpr, BLOCK_N: tl.constexpr):
    i = tl.program_id(0)
    c0 = tl.load(cu_ptr + i)
    n64 = tl.load(cu_ptr + i + 1) - c0
    over = _bad_range(c0, n64, MAX_N, NIDS, PADDED)   # a wrong bound: invalid (_walk)
    n = tl.where(over, 0, n64).to(tl.int32)
    j = tl.arange(0, BLOCK_N)
    W = MAX_N + 1
    if PADDED:
        tr = i.to(tl.int64) * W + j
        dr = i.to(tl.int64) * MAX_N + j
    else:
        tr = c0 + i + j
        dr = c0 + j
    in_t = (j <= n) & (over == 0)
    in_d = (j < n) & (over == 0)
    t = tl.load(row_tok_ptr + tr, mask=in_t, other=0).to(tl.int64)
    v = tl.load(row_valid_ptr + tr, mask=in_t, other=0) != 0
    x = tl.load(ids_ptr + dr, mask=in_d, other=0).to(tl.int64)
    ok = v & (x == t)
    f = tl.minimum(tl.min(tl.where(in_d & (ok == 0), j, BLOCK_N), 0), n)
    at = j == f
    tok = tl.where(j < f, x, -1)
    tok = tl.where(at, t, tok)
    outm = j < W
    tl.store(tok_ptr + i.to(tl.int64) * W + j, tok, mask=outm)
    tl.store(acc_ptr + i, f)
    vf = (tl.sum(tl.where(at, v.to(tl.int32), 0), 0) != 0) & (over == 0)
    tl.store(valid_ptr + i, vf.to(tl.int1))
    if LOGPROBS:
        lp = tl.load(row_lp_ptr + tr, mask=in_t, other=0.0)
        plp = tl.load(row_plp_ptr + tr, mask=in_t, other=0.0)
        lp = tl.where(j <= f, lp, 0.0)
        plp = tl.where(j <= f, plp, 0.0)
        lp = tl.where(at & over, float("nan"), lp)
        plp = tl.where(at & over, float("nan"), plp)
        tl.store(lp_ptr + i.to(tl.int64) * W + j, lp, mask=outm)
        tl.store(plp_ptr + i.to(tl.int64) * W + j, plp, mask=outm)


# ---------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------
def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _splits(rows: int, V: int, block: int, device) -> int:
    """Vocabulary splits per row: enough programs to fill the GPU, chunks of >= 4 blocks."""
    if device.type != "cuda":
        return min(MAX_CPU_SPLITS, _pow2(triton.cdiv(V, 4 * block)))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = max(1, (4 * sms) // max(rows, 1))
    return max(1, min(_pow2(want), _pow2(triton.cdiv(V, 4 * block)), 64))


@triton.jit(do_not_specialize=['R_t', 'R_d', 'bs', 'max_n', 'nlog'])
def _row_req_kernel(cu_ptr, out_ptr, R_t, R_d, bs, max_n, nlog, PADDED: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Request of every stats row (target rows, then draft rows); -1 for padding rows (and for
    rows before cu[0] when cu does not start at 0, as torch.searchsorted would)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = r < R_t + R_d
    is_t = r < R_t
    x = tl.where(is_t, r, r - R_t).to(tl.int64)
    if PADDED:
        W = max_n + 1
        Wd = tl.maximum(max_n, 1)
        i = tl.where(is_t, x // W, x // Wd)
        i = tl.minimum(i, bs - 1)
        j = tl.where(is_t, x % W, x % Wd)
        n = (tl.load(cu_ptr + i + 1, mask=m, other=0) - tl.load(cu_ptr + i, mask=m, other=0))
        req = tl.where(tl.where(is_t, j <= n, j < n), i, -1)
    else:
        # the largest i in [0, bs) with key(i) <= x: key(i) = cu[i] + i for target rows (their
        # first row), cu[i] for draft rows; empty requests share cu values and the search picks
        # the last one, whose range is the non-empty one containing the row
        lo = tl.zeros([BLOCK], tl.int64)
        hi = tl.zeros([BLOCK], tl.int64) + bs
        for _ in range(nlog):
            mid = (lo + hi) // 2
            key = tl.load(cu_ptr + mid, mask=m, other=0) + tl.where(is_t, mid, 0)
            go = key <= x
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        req = tl.where(tl.load(cu_ptr + 0) <= x, lo, -1)
    tl.store(out_ptr + r, req.to(tl.int32), mask=m)


def _row_req(R_t, R_d, cu, bs, max_n, padded, device):
    """Request of every stats row (target rows, then draft rows); -1 for padding rows: one
    launch (``_row_req_kernel``)."""
    rows = R_t + R_d
    out = torch.empty(max(rows, 1), dtype=torch.int32, device=device)
    if rows:
        blk = 1024 if device.type == "cuda" else 64
        _row_req_kernel[(triton.cdiv(rows, blk),)](cu, out, R_t, R_d, bs, max_n,
                                                  max(bs, 1).bit_length(), PADDED=padded,
                                                  BLOCK=blk)
    return out


def _scratch(rows: int, bs: int, device):
    """Every zero-initialized scratch array of ``verify_probabilistic`` in one allocation (one
    fill kernel): key, S, thr (int64 [rows]), nan (int32 [rows]), se (float32 [rows]), cand
    (int64 [2 bs]) and the default min-p (float32 [bs]). Each starts on a 16-byte boundary:
    Triton specializes pointer arguments on 16-byte alignment, so offsets that moved with the
    batch size (rows odd) compiled the kernels again for such batches."""
    n = max(rows, 1)
    R1 = (n + 1) // 2 * 2       # even: every array below starts at a multiple of 16 bytes
    zb = torch.zeros(5 * R1 + 2 * bs + (bs + 1) // 2 * 2, dtype=torch.int64, device=device)
    key, S, thr = zb[:n], zb[R1:R1 + n], zb[2 * R1:2 * R1 + n]
    nan = zb[3 * R1:4 * R1].view(torch.int32)[:n]
    se = zb[4 * R1:5 * R1].view(torch.float32)[:n]
    cand = zb[5 * R1:5 * R1 + 2 * bs]
    minp0 = zb[5 * R1 + 2 * bs:].view(torch.float32)[:bs]
    return key, S, thr, nan, se, cand, minp0


def verify_probabilistic(tgt, drf, ids, cu, seed, offset, temperature, min_p, max_n, padded,
                         ngram, tokens, num_accepted, valid, logprobs, processed_logprobs,
                         top_k=None, top_p=None, block: int = 0):
    """Writes tokens [bs, max_n+1], num_accepted [bs], valid [bs] (+ logprobs)."""
    dev = tgt.device
    bs = cu.shape[0] - 1
    if bs == 0:
        return
    R_t, V = tgt.shape
    R_d = 0 if ngram else drf.shape[0]
    drf_ = tgt if ngram else drf
    if drf_.dtype != tgt.dtype:
        # _pass1 / _pass2 / _thresholds select one row pointer for target and draft rows: mixed
        # element types do not compile for the GPU (the interpreter would not notice)
        raise ValueError(f"draft_logits dtype {drf_.dtype} differs from target_logits dtype "
                         f"{tgt.dtype}: the Triton verify kernels take one dtype for both")
    rows = R_t + R_d
    block = max(min(block or DEFAULT_BLOCK, _pow2(V)), 16)
    splits = _splits(rows, V, block, dev)
    chunk = triton.cdiv(triton.cdiv(V, splits), block) * block
    row_req = _row_req(R_t, R_d, cu, bs, max_n, padded, dev)
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    key, S, thr, nan, se, cand, minp0 = _scratch(rows, bs, dev)
    temp_ = temperature if temperature is not None else torch.ones(bs, dtype=f32, device=dev)
    minp_ = min_p if min_p is not None else minp0
    lp_on = logprobs is not None
    lp_ = logprobs if lp_on else se
    plp_ = processed_logprobs if lp_on else se
    st, sd = tgt.stride(0), drf_.stride(0)
    filt = top_k is not None or top_p is not None
    if rows:
        _pass1[(rows, splits)](tgt, drf_, st, sd, R_t, V, row_req, key, nan, chunk, BLOCK=block,
                               **_LAUNCH)
        if filt:
            k_ = top_k if top_k is not None else torch.zeros(bs, dtype=i32, device=dev)
            p_ = top_p if top_p is not None else torch.ones(bs, dtype=f32, device=dev)
            _thresholds[(rows,)](tgt, drf_, st, sd, R_t, V, row_req, temp_, minp_, k_, p_, key,
                                 nan, thr, BLOCK=block, **_LAUNCH)
        _pass2[(rows, splits)](tgt, drf_, st, sd, R_t, V, row_req, temp_, minp_, key, nan, thr,
                               S, se, chunk, LOGPROBS=lp_on, FILT=filt, BLOCK=block, **_LAUNCH)
    jobi = torch.empty(bs * 10, dtype=i64, device=dev)
    jobf = torch.empty(bs * 4, dtype=f32, device=dev)
    ids_ = ids if ids.numel() else torch.zeros(1, dtype=i64, device=dev)
    _walk[(bs,)](tgt, drf_, st, sd, R_t, V, ids_, cu, seed, offset, temp_, minp_, key, nan, thr,
                 S, se, tokens, num_accepted, valid, lp_, plp_, jobi, jobf, max_n, ids.numel(),
                 PADDED=padded,
                 NGRAM=ngram, LOGPROBS=lp_on, FILT=filt, BLOCK_N=_pow2(max_n + 1), **_LAUNCH)
    fsplits = _splits(bs, V, block, dev)
    fchunk = triton.cdiv(triton.cdiv(V, fsplits), block) * block
    _final[(bs, fsplits)](tgt, drf_, st, sd, V, cu, seed, offset, temp_, minp_, jobi, jobf, cand,
                          max_n, fchunk, PADDED=padded, NGRAM=ngram, FILT=filt, BLOCK=block,
                          **_LAUNCH)
    _final_reduce[(bs,)](tgt, st, cu, temp_, minp_, jobi, jobf, cand, tokens, lp_, plp_, max_n,
                         PADDED=padded, LOGPROBS=lp_on, **_LAUNCH)


def kept_thresholds(logits, temperature, top_k, top_p, block: int = 0):
    """Per-row kept-set threshold (int64 key56) of ``logits`` [R, V] with per-row parameters:
    kept = {key56(z, id) >= thr} (keys of the raw logits; before min-p). For tests of
    ``_thresholds``."""
    dev = logits.device
    R, V = logits.shape
    block = max(min(block or DEFAULT_BLOCK, _pow2(V)), 16)
    row_req = torch.arange(R, dtype=torch.int32, device=dev)
    key = torch.zeros(R, dtype=torch.int64, device=dev)
    nan = torch.zeros(R, dtype=torch.int32, device=dev)
    thr = torch.zeros(R, dtype=torch.int64, device=dev)
    minp = torch.zeros(R, dtype=torch.float32, device=dev)
    _pass1[(R, 1)](logits, logits, logits.stride(0), logits.stride(0), R, V, row_req, key, nan,
                   triton.cdiv(V, block) * block, BLOCK=block, **_LAUNCH)
    _thresholds[(R,)](logits, logits, logits.stride(0), logits.stride(0), R, V, row_req,
                      temperature, minp, top_k, top_p, key, nan, thr, BLOCK=block, **_LAUNCH)
    return thr


def strict_accept(row_tokens, row_valid, row_lp, row_plp, ids, cu, max_n, padded, tokens,
                  num_accepted, valid, logprobs, processed_logprobs):
    bs = cu.shape[0] - 1
    if bs == 0:
        return
    dev = row_tokens.device
    lp_on = logprobs is not None
    dummy = torch.zeros(1, dtype=torch.float32, device=dev)
    ids_ = ids if ids.numel() else torch.zeros(1, dtype=torch.int64, device=dev)
    _strict_accept[(bs,)](row_tokens, row_valid, row_lp if lp_on else dummy,
                          row_plp if lp_on else dummy, ids_, cu, tokens, num_accepted, valid,
                          logprobs if lp_on else dummy, processed_logprobs if lp_on else dummy,
                          max_n, ids.numel(), PADDED=padded, LOGPROBS=lp_on,
                          BLOCK_N=_pow2(max_n + 1))
