"""Triton speculative verify (fallback backend; runs on the CPU under TRITON_INTERPRET=1).

Same decisions as ``reference.verify`` bit for bit (docs/VERIFY.md): every float op that decides
a token is an explicit IEEE float32 op (kernels are compiled with ``enable_fp_fusion=False``,
divisions use ``div_rn``); masses and the accept / residual tests are exact integers.

Kernels (probabilistic / ngram):

1. ``_pass1``  grid (rows, splits): per vocabulary split of every target and draft row, the raw
   max, its lowest id and a NaN flag.
2. ``_pass2``  grid (rows, splits): with the row max, the fixed-point mass sum S of the kept set
   (and sum exp(z - zmax) for logprobs). The split is re-read (L2) rather than kept.
3. ``_walk``   grid (bs,): all positions of a request at once: accept coins, first failure,
   accepted tokens / logprobs, and the one final job (residual at the first rejection, or bonus).
4. ``_final``  grid (bs, splits): Gumbel candidates of the final job's row(s).
5. ``_final_reduce`` grid (bs,): winner, its token and logprobs.

Strict mode uses the sampler for the target tokens and ``_strict_accept`` (grid (bs,)).

Filters: temperature (and greedy) and min-p are supported; top-k and top-p in probabilistic /
ngram mode are not (the op layer raises ValueError naming the argument).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference import prims as P

# float32 constants of reference/prims.py (exactly representable: the literals are exact)
_LN2_HI_LOG = tl.constexpr(P._C["LN2_HI_LOG"])
_LN2_LO_LOG = tl.constexpr(P._C["LN2_LO_LOG"])
_LG1 = tl.constexpr(P._C["LG1"])
_LG2 = tl.constexpr(P._C["LG2"])
_LG3 = tl.constexpr(P._C["LG3"])
_LG4 = tl.constexpr(P._C["LG4"])
_LOG2E = tl.constexpr(P._C["LOG2E"])
_LN2_HI_EXP = tl.constexpr(P._C["LN2_HI_EXP"])
_LN2_LO_EXP = tl.constexpr(P._C["LN2_LO_EXP"])
_C7 = tl.constexpr(P._C["C7"])
_C6 = tl.constexpr(P._C["C6"])
_C5 = tl.constexpr(P._C["C5"])
_C4 = tl.constexpr(P._C["C4"])
_C3 = tl.constexpr(P._C["C3"])
_LN_2POW38 = tl.constexpr(26.33959286127792)   # 38 * ln 2 (logprobs only, not bit-exact)

MASS_CUT = -26.5          # mass_fixed(y) == 0 for every float32 y < -26.34 (checked exhaustively)
GUMBEL_SPAN = tl.constexpr(19.5)   # G in [-2.8116, 16.6356]: x < m - span never wins Gumbel-max
_LAUNCH = {"enable_fp_fusion": False}


# ---------------------------------------------------------------------------------------------
# bit-exact primitives (same op sequences as reference/prims.py)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 tensors."""
    for r in tl.static_range(10):
        if r > 0:
            k0 = k0 + 0x9E3779B9
            k1 = k1 + 0xBB67AE85
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        n0 = hi1 ^ c1 ^ k0
        n2 = hi0 ^ c3 ^ k1
        c0 = n0
        c1 = lo1
        c2 = n2
        c3 = lo0
    return c0, c1, c2, c3


@triton.jit
def _key(seed):
    s = seed.to(tl.uint64)
    return (s & 0xFFFFFFFF).to(tl.uint32), (s >> 32).to(tl.uint32)


@triton.jit
def _philox_word(seed, offset, token, stream: tl.constexpr):
    """u32 word of (seed, offset, token, stream); token / seed / offset broadcast."""
    k0, k1 = _key(seed)
    o = offset.to(tl.uint64)
    t = token.to(tl.uint32)
    c1 = (o & 0xFFFFFFFF).to(tl.uint32)
    c2 = (o >> 32).to(tl.uint32)
    z = t * 0
    x, y, w, v = _philox(t >> 2, c1 + z, c2 + z, z + stream, k0 + z, k1 + z)
    lane = t & 3
    return tl.where(lane == 0, x, tl.where(lane == 1, y, tl.where(lane == 2, w, v)))


@triton.jit
def _philox_block(seed, offset, base, stream: tl.constexpr, BLOCK: tl.constexpr):
    """Words of tokens base .. base+BLOCK-1 (base % 4 == 0): one Philox call per 4 tokens."""
    k0, k1 = _key(seed)
    o = offset.to(tl.uint64)
    c0 = (base // 4 + tl.arange(0, BLOCK // 4)).to(tl.uint32)
    z = c0 * 0
    c1 = (o & 0xFFFFFFFF).to(tl.uint32) + z
    c2 = (o >> 32).to(tl.uint32) + z
    x, y, w, v = _philox(c0, c1, c2, z + stream, k0 + z, k1 + z)
    return tl.interleave(tl.interleave(x, w), tl.interleave(y, v))


@triton.jit
def _uniform(bits):
    return ((bits >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _soft_ln(x):
    ix = x.to(tl.uint32, bitcast=True) + 0x004AFB0D
    k = (ix >> 23).to(tl.int32) - 0x7F
    ix = (ix & 0x007FFFFF) + 0x3F3504F3
    xm = ix.to(tl.float32, bitcast=True)
    f = xm - 1.0
    s = tl.math.div_rn(f, f + 2.0)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * _LG4)
    t2 = z * (_LG1 + w * _LG3)
    R = t2 + t1
    hfsq = (0.5 * f) * f
    dk = k.to(tl.float32)
    r = s * (hfsq + R)
    r = r + dk * _LN2_LO_LOG
    r = r - hfsq
    r = r + f
    r = r + dk * _LN2_HI_LOG
    return r


@triton.jit
def _soft_exp_neg(y):
    live = y >= -64.0
    ys = tl.where(live, y, 0.0)
    kf = tl.floor(ys * _LOG2E + 0.5)
    hi = ys - kf * _LN2_HI_EXP
    lo = kf * _LN2_LO_EXP
    r = hi - lo
    p = r * _C7 + _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    scale = ((kf.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(live, p * scale, 0.0)


@triton.jit
def _mass(y):
    """mass_fixed(y) with the exact shortcut: 0 for y < -26.5 (or NaN)."""
    e = (_soft_exp_neg(y) * 274877906944.0).to(tl.int64)
    return tl.where(y >= -26.5, e, 0)


@triton.jit
def _gumbel(bits):
    u = _uniform(bits)
    return -_soft_ln(-_soft_ln(u))


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
def _row_params(req, temp_ptr, minp_ptr):
    """(greedy, invT, min-p on, L = soft_ln(min_p)) for request ``req`` (scalar)."""
    t = tl.load(temp_ptr + req)
    greedy = ~(t > 0)
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, t)))
    mp = tl.load(minp_ptr + req)
    mp_on = (mp > 0) & ~greedy
    L = _soft_ln(tl.where(mp_on, mp, 1.0))
    return greedy, inv_t, mp_on, L


# ---------------------------------------------------------------------------------------------
# statistics passes
# ---------------------------------------------------------------------------------------------
@triton.jit
def _pass1(tgt_ptr, drf_ptr, stride_t, stride_d, R_t, V, row_req_ptr, pz_ptr, pa_ptr, pn_ptr,
           SPLITS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
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
        start = sp * CHUNK
        for off in range(start, start + CHUNK, BLOCK):
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
        o = row.to(tl.int64) * SPLITS + sp
        tl.store(pz_ptr + o, m)
        tl.store(pa_ptr + o, a)
        tl.store(pn_ptr + o, tl.max(nan, 0))


@triton.jit
def _row_max(pz_ptr, pa_ptr, pn_ptr, row, SPLITS: tl.constexpr):
    s = tl.arange(0, SPLITS)
    o = row.to(tl.int64) * SPLITS + s
    pz = tl.load(pz_ptr + o)
    pa = tl.load(pa_ptr + o)
    pn = tl.load(pn_ptr + o)
    zmax = tl.max(pz, 0)
    arg = tl.min(tl.where(pz == zmax, pa, 2147483647), 0)
    return zmax, arg, tl.max(pn, 0)


@triton.jit
def _pass2(tgt_ptr, drf_ptr, stride_t, stride_d, R_t, V, row_req_ptr, temp_ptr, minp_ptr,
           pz_ptr, pa_ptr, pn_ptr, ps_ptr, pe_ptr, LOGPROBS: tl.constexpr, SPLITS: tl.constexpr, CHUNK: tl.constexpr,
           BLOCK: tl.constexpr):
    row = tl.program_id(0)
    sp = tl.program_id(1)
    req = tl.load(row_req_ptr + row)
    if req >= 0:
        if row < R_t:
            base = tgt_ptr + row.to(tl.int64) * stride_t
        else:
            base = drf_ptr + (row - R_t).to(tl.int64) * stride_d
        zmax, arg, nan = _row_max(pz_ptr, pa_ptr, pn_ptr, row, SPLITS)
        greedy, inv_t, mp_on, L = _row_params(req, temp_ptr, minp_ptr)
        m = zmax * inv_t
        bad = (nan != 0) | (m == float("inf")) | (m == float("-inf"))
        S = tl.zeros([BLOCK], tl.int64)
        se = tl.zeros([BLOCK], tl.float32)
        start = sp * CHUNK
        if bad == 0:
            for off in range(start, start + CHUNK, BLOCK):
                ids = off + tl.arange(0, BLOCK)
                msk = ids < V
                z = tl.load(base + ids, mask=msk, other=float("-inf")).to(tl.float32)
                y = z * inv_t - m
                kept = tl.where(greedy, ids == arg, (~mp_on) | (y >= L)) & msk
                S += tl.where(kept, _mass(y), 0)
                if LOGPROBS:
                    se += tl.where(msk, tl.exp(z - zmax), 0.0)
        o = row.to(tl.int64) * SPLITS + sp
        tl.store(ps_ptr + o, tl.sum(S, 0))
        tl.store(pe_ptr + o, tl.sum(se, 0))


@triton.jit
def _row_stats(pz_ptr, pa_ptr, pn_ptr, ps_ptr, pe_ptr, rows, inv_t, mask,
               SPLITS: tl.constexpr):
    """Vector of rows -> (zmax, m, arg, invalid, S, sumexp)."""
    s = tl.arange(0, SPLITS)
    o = rows.to(tl.int64)[:, None] * SPLITS + s[None, :]
    mk = mask[:, None]
    pz = tl.load(pz_ptr + o, mask=mk, other=0.0)
    pa = tl.load(pa_ptr + o, mask=mk, other=0)
    pn = tl.load(pn_ptr + o, mask=mk, other=0)
    ps = tl.load(ps_ptr + o, mask=mk, other=0)
    pe = tl.load(pe_ptr + o, mask=mk, other=0.0)
    zmax = tl.max(pz, 1)
    arg = tl.min(tl.where(pz == zmax[:, None], pa, 2147483647), 1)
    m = zmax * inv_t
    bad = (tl.max(pn, 1) != 0) | (m == float("inf")) | (m == float("-inf"))
    return zmax, m, arg, bad, tl.sum(ps, 1), tl.sum(pe, 1)


# ---------------------------------------------------------------------------------------------
# walk: accept coins, first failure, job of the final token
# ---------------------------------------------------------------------------------------------
@triton.jit
def _walk(tgt_ptr, drf_ptr, stride_t, stride_d, R_t, V, ids_ptr, cu_ptr, seed_ptr, off_ptr,
          temp_ptr, minp_ptr, pz_ptr, pa_ptr, pn_ptr, ps_ptr, pe_ptr,
          tok_ptr, acc_ptr, valid_ptr, lp_ptr, plp_ptr, jobi_ptr, jobf_ptr, MAX_N,
          PADDED: tl.constexpr, NGRAM: tl.constexpr, LOGPROBS: tl.constexpr, SPLITS: tl.constexpr,
          BLOCK_N: tl.constexpr):
    i = tl.program_id(0)
    c0 = tl.load(cu_ptr + i)
    n = (tl.load(cu_ptr + i + 1) - c0).to(tl.int32)
    j = tl.arange(0, BLOCK_N)
    W = MAX_N + 1
    if PADDED:
        tr = i.to(tl.int64) * W + j
        dr = i.to(tl.int64) * MAX_N + j
    else:
        tr = c0 + i + j
        dr = c0 + j
    in_t = j <= n
    in_d = j < n
    greedy, inv_t, mp_on, L = _row_params(i, temp_ptr, minp_ptr)
    zmax_t, m_t, arg_t, bad_t, S_t, se_t = _row_stats(pz_ptr, pa_ptr, pn_ptr, ps_ptr, pe_ptr, tr,
                                                      inv_t, in_t, SPLITS)
    x = tl.load(ids_ptr + dr, mask=in_d, other=0).to(tl.int64)
    xr = (x >= 0) & (x < V) & in_d
    xc = tl.where(xr, x, 0)
    z_tx = tl.load(tgt_ptr + tr * stride_t + xc, mask=in_d, other=0.0).to(tl.float32)
    y_t = z_tx * inv_t - m_t
    kp = tl.where(greedy, xc == arg_t, (~mp_on) | (y_t >= L)) & xr
    ep = tl.where(kp, _mass(y_t), 0)
    if NGRAM:
        eq = tl.full([BLOCK_N], 1, tl.int64)
        S_q = tl.full([BLOCK_N], 1, tl.int64)
        bad_q = j < 0
        m_q = tl.zeros([BLOCK_N], tl.float32)
        arg_q = tl.zeros([BLOCK_N], tl.int32)
    else:
        zmax_q, m_q, arg_q, bad_q, S_q, se_q = _row_stats(pz_ptr, pa_ptr, pn_ptr, ps_ptr, pe_ptr,
                                                          R_t + dr, inv_t, in_d, SPLITS)
        z_qx = tl.load(drf_ptr + dr * stride_d + xc, mask=in_d, other=0.0).to(tl.float32)
        y_q = z_qx * inv_t - m_q
        kq = tl.where(greedy, xc == arg_q, (~mp_on) | (y_q >= L)) & xr
        eq = tl.where(kq, _mass(y_q), 0)
    seed = tl.load(seed_ptr + i)
    off = tl.load(off_ptr + i)
    U = ((_philox_word(seed, off, j, 1) >> 9) * 2 + 1).to(tl.int64)
    lh, ll = _mul_wide(U * eq, S_t)
    rh, rl = _mul_wide(ep << 24, S_q)
    ok = _wide_lt(lh, ll, rh, rl) & ~bad_t & ~bad_q
    f = tl.min(tl.where(in_d & ~ok, j, BLOCK_N), 0)
    f = tl.minimum(f, n)
    at = j == f
    bonus = f == n
    bad_f = tl.sum(tl.where(at, (bad_t | (bad_q & ~bonus)).to(tl.int32), 0), 0) != 0
    # accepted drafts, -1 padding; final slot written by the final kernels (or 0 if invalid)
    outm = j < W
    tok = tl.where(j < f, x, -1)
    tok = tl.where(at & bad_f, 0, tok)
    tl.store(tok_ptr + i.to(tl.int64) * W + j, tok, mask=outm)
    tl.store(acc_ptr + i, f)
    tl.store(valid_ptr + i, (~bad_f).to(tl.int1))
    if LOGPROBS:
        lse = zmax_t + tl.log(se_t)
        lp = z_tx - lse
        plp = tl.where(greedy, 0.0, y_t - (tl.log(S_t.to(tl.float32)) - _LN_2POW38))
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
    ji = jobi_ptr + i.to(tl.int64) * 8
    tl.store(ji + 0, mode.to(tl.int64))
    tl.store(ji + 1, f.to(tl.int64))
    tl.store(ji + 2, tl.sum(tl.where(at, S_t, 0), 0))
    tl.store(ji + 3, tl.sum(tl.where(at, S_q, 0), 0))
    tl.store(ji + 4, tl.sum(tl.where(at, arg_t, 0), 0).to(tl.int64))
    tl.store(ji + 5, tl.sum(tl.where(at, arg_q, 0), 0).to(tl.int64))
    tl.store(ji + 6, tl.sum(tl.where(at & in_d, x, 0), 0))
    jf = jobf_ptr + i.to(tl.int64) * 4
    tl.store(jf + 0, tl.sum(tl.where(at, m_t, 0.0), 0))
    tl.store(jf + 1, tl.sum(tl.where(at, m_q, 0.0), 0))
    tl.store(jf + 2, lse_f)


# ---------------------------------------------------------------------------------------------
# final token: residual resample or bonus sample, split over the vocabulary
# ---------------------------------------------------------------------------------------------
@triton.jit
def _final(tgt_ptr, drf_ptr, stride_t, stride_d, V, cu_ptr, seed_ptr, off_ptr, temp_ptr,
           minp_ptr, jobi_ptr, jobf_ptr, cand_s_ptr, cand_i_ptr, MAX_N,
           PADDED: tl.constexpr, NGRAM: tl.constexpr, SPLITS: tl.constexpr, CHUNK: tl.constexpr,
           BLOCK: tl.constexpr):
    i = tl.program_id(0)
    sp = tl.program_id(1)
    ji = jobi_ptr + i.to(tl.int64) * 8
    mode = tl.load(ji + 0)
    if mode != 0:
        f = tl.load(ji + 1)
        S_t = tl.load(ji + 2)
        S_q = tl.load(ji + 3)
        arg_t = tl.load(ji + 4)
        arg_q = tl.load(ji + 5)
        xd = tl.load(ji + 6)
        m_t = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 0)
        m_q = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 1)
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
        start = sp * CHUNK
        if mode == 2:
            # bonus: the sampler's Gumbel-max over the kept set, offset + n, stream 0
            span = GUMBEL_SPAN + tl.abs(m_t) * 9.5367431640625e-07
            for off in range(start, start + CHUNK, BLOCK):
                ids = off + tl.arange(0, BLOCK)
                msk = ids < V
                z = tl.load(tbase + ids, mask=msk, other=float("-inf")).to(tl.float32)
                x = z * inv_t
                y = x - m_t
                kept = tl.where(greedy, ids == arg_t, (~mp_on) | (y >= L)) & msk
                live = kept & (y >= -span)
                if tl.max(live.to(tl.int32), 0) != 0:
                    g = _gumbel(_philox_block(seed, offp, off, 0, BLOCK))
                    s = tl.where(live, x + g, float("-inf"))
                    upd = s > best_s
                    best_i = tl.where(upd, ids, best_i)
                    best_s = tl.where(upd, s, best_s)
        else:
            # residual: support N_i = e^p_i S_q - e^q_i S_p > 0, stream 2 at offset + j
            for off in range(start, start + CHUNK, BLOCK):
                ids = off + tl.arange(0, BLOCK)
                msk = ids < V
                zt = tl.load(tbase + ids, mask=msk, other=float("-inf")).to(tl.float32)
                yt = zt * inv_t - m_t
                kp = tl.where(greedy, ids == arg_t, (~mp_on) | (yt >= L)) & msk
                ep = tl.where(kp, _mass(yt), 0)
                if tl.max(ep, 0) > 0:
                    if NGRAM:
                        eq = (ids == xd).to(tl.int64)
                    else:
                        zq = tl.load(dbase + ids, mask=msk, other=float("-inf")).to(tl.float32)
                        yq = zq * inv_t - m_q
                        kq = tl.where(greedy, ids == arg_q, (~mp_on) | (yq >= L)) & msk
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
                    g = _gumbel(_philox_block(seed, offp, off, 2, BLOCK))
                    s = tl.where(sup, _soft_ln(w) + g, float("-inf"))
                    upd = s > best_s
                    best_i = tl.where(upd, ids, best_i)
                    best_s = tl.where(upd, s, best_s)
                    sf = tl.where(ep > 0, _soft_ln(wf) + g, float("-inf"))
                    updf = sf > fb_s
                    fb_i = tl.where(updf, ids, fb_i)
                    fb_s = tl.where(updf, sf, fb_s)
        bs_ = tl.max(best_s, 0)
        bi = tl.min(tl.where((best_s == bs_) & (best_s > float("-inf")), best_i, 2147483647), 0)
        fs = tl.max(fb_s, 0)
        fi = tl.min(tl.where((fb_s == fs) & (fb_s > float("-inf")), fb_i, 2147483647), 0)
        o = (i.to(tl.int64) * SPLITS + sp) * 2
        tl.store(cand_s_ptr + o, bs_)
        tl.store(cand_i_ptr + o, bi)
        tl.store(cand_s_ptr + o + 1, fs)
        tl.store(cand_i_ptr + o + 1, fi)


@triton.jit
def _final_reduce(tgt_ptr, stride_t, cu_ptr, temp_ptr, minp_ptr, jobi_ptr, jobf_ptr, cand_s_ptr,
                  cand_i_ptr, tok_ptr, lp_ptr, plp_ptr, MAX_N, PADDED: tl.constexpr,
                  LOGPROBS: tl.constexpr,
                  SPLITS: tl.constexpr):
    i = tl.program_id(0)
    ji = jobi_ptr + i.to(tl.int64) * 8
    mode = tl.load(ji + 0)
    if mode != 0:
        f = tl.load(ji + 1)
        s = tl.arange(0, SPLITS)
        o = (i.to(tl.int64) * SPLITS + s) * 2
        cs = tl.load(cand_s_ptr + o)
        ci = tl.load(cand_i_ptr + o)
        fs = tl.load(cand_s_ptr + o + 1)
        fi = tl.load(cand_i_ptr + o + 1)
        b = tl.max(cs, 0)
        bi = tl.min(tl.where((cs == b) & (cs > float("-inf")), ci, 2147483647), 0)
        fb = tl.max(fs, 0)
        fbi = tl.min(tl.where((fs == fb) & (fs > float("-inf")), fi, 2147483647), 0)
        tok = tl.where(b > float("-inf"), bi, fbi)
        W = MAX_N + 1
        tl.store(tok_ptr + i.to(tl.int64) * W + f, tok.to(tl.int64))
        if LOGPROBS:
            c0 = tl.load(cu_ptr + i)
            if PADDED:
                tr = i.to(tl.int64) * W + f
            else:
                tr = c0 + i + f
            greedy, inv_t, mp_on, L = _row_params(i, temp_ptr, minp_ptr)
            z = tl.load(tgt_ptr + tr * stride_t + tok).to(tl.float32)
            S_t = tl.load(ji + 2)
            m_t = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 0)
            lse = tl.load(jobf_ptr + i.to(tl.int64) * 4 + 2)
            lp = z - lse
            plp = tl.where(greedy, 0.0,
                           (z * inv_t - m_t) - (tl.log(S_t.to(tl.float32)) - _LN_2POW38))
            tl.store(lp_ptr + i.to(tl.int64) * W + f, lp)
            tl.store(plp_ptr + i.to(tl.int64) * W + f, plp)


# ---------------------------------------------------------------------------------------------
# strict accept
# ---------------------------------------------------------------------------------------------
@triton.jit
def _strict_accept(row_tok_ptr, row_valid_ptr, row_lp_ptr, row_plp_ptr, ids_ptr, cu_ptr,
                   tok_ptr, acc_ptr, valid_ptr, lp_ptr, plp_ptr, MAX_N, PADDED: tl.constexpr,
                   LOGPROBS: tl.constexpr, BLOCK_N: tl.constexpr):
    i = tl.program_id(0)
    c0 = tl.load(cu_ptr + i)
    n = (tl.load(cu_ptr + i + 1) - c0).to(tl.int32)
    j = tl.arange(0, BLOCK_N)
    W = MAX_N + 1
    if PADDED:
        tr = i.to(tl.int64) * W + j
        dr = i.to(tl.int64) * MAX_N + j
    else:
        tr = c0 + i + j
        dr = c0 + j
    in_t = j <= n
    in_d = j < n
    t = tl.load(row_tok_ptr + tr, mask=in_t, other=0).to(tl.int64)
    v = tl.load(row_valid_ptr + tr, mask=in_t, other=0) != 0
    x = tl.load(ids_ptr + dr, mask=in_d, other=0).to(tl.int64)
    ok = v & (x == t)
    f = tl.minimum(tl.min(tl.where(in_d & ~ok, j, BLOCK_N), 0), n)
    at = j == f
    tok = tl.where(j < f, x, -1)
    tok = tl.where(at, t, tok)
    outm = j < W
    tl.store(tok_ptr + i.to(tl.int64) * W + j, tok, mask=outm)
    tl.store(acc_ptr + i, f)
    vf = tl.sum(tl.where(at, v.to(tl.int32), 0), 0) != 0
    tl.store(valid_ptr + i, vf.to(tl.int1))
    if LOGPROBS:
        lp = tl.load(row_lp_ptr + tr, mask=in_t, other=0.0)
        plp = tl.load(row_plp_ptr + tr, mask=in_t, other=0.0)
        lp = tl.where(j <= f, lp, 0.0)
        plp = tl.where(j <= f, plp, 0.0)
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
        return min(4, _pow2(triton.cdiv(V, 4 * block)))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = max(1, (4 * sms) // max(rows, 1))
    return max(1, min(_pow2(want), _pow2(triton.cdiv(V, 4 * block)), 64))


def _row_req(R_t, R_d, cu, bs, max_n, padded, device):
    """Request of every stats row (target rows, then draft rows); -1 for padding rows."""
    cu = cu.to(torch.int64)
    n = cu[1:] - cu[:-1]
    if padded:
        W = max_n + 1
        r = torch.arange(R_t, device=device)
        i = r // W
        jt = r % W
        rt = torch.where(jt <= n[i], i, torch.full_like(i, -1))
        if R_d:
            r = torch.arange(R_d, device=device)
            i = r // max(max_n, 1)
            jd = r % max(max_n, 1)
            rd = torch.where(jd < n[i], i, torch.full_like(i, -1))
        else:
            rd = torch.zeros(0, dtype=torch.int64, device=device)
    else:
        t_start = cu[:-1] + torch.arange(bs, device=device)
        rt = torch.searchsorted(t_start, torch.arange(R_t, device=device), right=True) - 1
        rd = torch.searchsorted(cu[:-1], torch.arange(R_d, device=device), right=True) - 1
        if R_d:
            # empty requests share cu values: searchsorted(right) picks the last one, whose
            # range is the non-empty one containing the row (cu[i] <= r < cu[i+1])
            pass
    return torch.cat([rt, rd]).to(torch.int32)


def verify_probabilistic(tgt, drf, ids, cu, seed, offset, temperature, min_p, max_n, padded,
                         ngram, tokens, num_accepted, valid, logprobs, processed_logprobs,
                         block: int = 1024):
    """Writes tokens [bs, max_n+1], num_accepted [bs], valid [bs] (+ logprobs)."""
    dev = tgt.device
    bs = cu.shape[0] - 1
    if bs == 0:
        return
    R_t, V = tgt.shape
    R_d = 0 if ngram else drf.shape[0]
    drf_ = tgt if ngram else drf
    rows = R_t + R_d
    block = min(block, _pow2(V))
    block = max(block, 16)
    splits = _splits(rows, V, block, dev)
    chunk = triton.cdiv(triton.cdiv(V, splits), block) * block
    row_req = _row_req(R_t, R_d, cu, bs, max_n, padded, dev)
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    pz = torch.empty(rows * splits, dtype=f32, device=dev)
    pa = torch.empty(rows * splits, dtype=i32, device=dev)
    pn = torch.empty(rows * splits, dtype=i32, device=dev)
    ps = torch.empty(rows * splits, dtype=i64, device=dev)
    pe = torch.empty(rows * splits, dtype=f32, device=dev)
    temp_ = temperature if temperature is not None else torch.ones(bs, dtype=f32, device=dev)
    minp_ = min_p if min_p is not None else torch.zeros(bs, dtype=f32, device=dev)
    lp_on = logprobs is not None
    lp_ = logprobs if lp_on else pz
    plp_ = processed_logprobs if lp_on else pz
    st, sd = tgt.stride(0), drf_.stride(0)
    if rows:
        _pass1[(rows, splits)](tgt, drf_, st, sd, R_t, V, row_req, pz, pa, pn, SPLITS=splits,
                               CHUNK=chunk, BLOCK=block, **_LAUNCH)
        _pass2[(rows, splits)](tgt, drf_, st, sd, R_t, V, row_req, temp_, minp_, pz, pa, pn, ps,
                               pe, LOGPROBS=lp_on, SPLITS=splits,
                               CHUNK=chunk, BLOCK=block, **_LAUNCH)
    jobi = torch.empty(bs * 8, dtype=i64, device=dev)
    jobf = torch.empty(bs * 4, dtype=f32, device=dev)
    ids_ = ids if ids.numel() else torch.zeros(1, dtype=i64, device=dev)
    _walk[(bs,)](tgt, drf_, st, sd, R_t, V, ids_, cu, seed, offset, temp_, minp_, pz, pa, pn, ps,
                 pe, tokens, num_accepted, valid, lp_, plp_, jobi, jobf, max_n, PADDED=padded,
                 NGRAM=ngram, LOGPROBS=lp_on, SPLITS=splits,
                 BLOCK_N=_pow2(max_n + 1), **_LAUNCH)
    fsplits = _splits(bs, V, block, dev)
    fchunk = triton.cdiv(triton.cdiv(V, fsplits), block) * block
    cs = torch.empty(bs * fsplits * 2, dtype=f32, device=dev)
    ci = torch.empty(bs * fsplits * 2, dtype=i32, device=dev)
    _final[(bs, fsplits)](tgt, drf_, st, sd, V, cu, seed, offset, temp_, minp_, jobi, jobf, cs,
                          ci, max_n, PADDED=padded, NGRAM=ngram,
                          SPLITS=fsplits, CHUNK=fchunk, BLOCK=block, **_LAUNCH)
    _final_reduce[(bs,)](tgt, st, cu, temp_, minp_, jobi, jobf, cs, ci, tokens, lp_, plp_, max_n,
                         PADDED=padded, LOGPROBS=lp_on,
                         SPLITS=fsplits, **_LAUNCH)


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
                          max_n, PADDED=padded, LOGPROBS=lp_on, BLOCK_N=_pow2(max_n + 1))
