"""Reference speculative-decoding verify: plain PyTorch, the executable spec of ``ops.verify``.

Layout (ragged): request ``i`` has ``n_i = cu[i+1] - cu[i]`` draft tokens
``draft_token_ids[cu[i] : cu[i+1]]``; its target logits are rows ``cu[i] + i + j`` (j = 0..n_i,
position n_i is the bonus position) and its draft logits rows ``cu[i] + j`` (j < n_i).
The padded form of ``ops.verify`` is converted to this one before the reference runs.

Every row is processed like the sampler (``reference.sampling.process``): the processed logit
``y = fl32(fl32(z - zmax) * fl32(1/T))`` (0 at the max), then top-k -> top-p -> min-p give the
kept set ``K`` (``sampling.kept_mask``, keys on the raw logits). A greedy request (T = 0) keeps
only the max key (value descending, id ascending), i.e. it behaves as ``T = 1, top_k = 1``. The
draft rows use the same parameters as the target rows.

Probabilities are exact rationals of fixed-point masses (docs/VERIFY.md):

    e_i = [i in K] * mass_fixed(y_i)          (int64, trunc(soft_exp_neg(y_i) * 2**38))
    S   = sum_i e_i                          (exact int64, <= V * 2**38 <= 2**62)
    p_i = e^p_i / S_p,   q_i = e^q_i / S_q   (ngram mode: q = one-hot at the draft token)

Strict mode: position j's target token is ``sample(target row j, seed, offset + j)`` (stream 0);
accept while the draft equals it; emit the target token at the first mismatch (or position n_i).

Probabilistic mode, position j < n_i with draft token x:

* coin ``U = 2 * (philox(seed, offset, token = j, stream 1) >> 9) + 1`` (u = U / 2**24, odd U,
  never 0 or 1); accept iff ``U * e^q_x * S_p < 2**24 * e^p_x * S_q`` (exact 128-bit integers:
  u < p(x) / q(x)). A draft id outside [0, V) is never accepted.
* first rejection: resample from normalize(max(0, p - q)) by Gumbel-max over the support
  ``N_i = e^p_i * S_q - e^q_i * S_p > 0`` (exact) with score
  ``soft_ln(f32(f64(N_hi) * 2**62 + f64(N_lo))) + G(seed, offset + j, id i, stream 2)``, ties by
  the lowest id. If the support is empty (only when p == q and the draft token has p(x) = 0, i.e.
  a draft outside q's support), the weights are ``N_i = e^p_i`` (resample from p).
* all accepted: bonus token = ``sample(target row n_i, seed, offset + n_i)`` (stream 0).

A row with a NaN or +inf processed logit, or no finite one, is invalid: the walk stops at the
first position whose target row (or, with draft logits, draft row) is invalid, emits token 0 there
and reports ``valid = False``.

Logprobs of an emitted token at position j are computed on target row j: raw =
``log_softmax(z)[tok]``, processed = log of the processed target probability (as
``sampling.sample`` reports it; 0 for greedy). Slots after the last emitted token: token -1,
logprobs 0.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import prims
from . import sampling as ref_sampling

M31 = (1 << 31) - 1
M62 = (1 << 62) - 1
MODES = ("strict", "probabilistic", "ngram")


# ---------------------------------------------------------------------------------------------
# exact 128-bit helpers on int64 tensors (values as hi * 2**62 + lo, 0 <= lo < 2**62)
# ---------------------------------------------------------------------------------------------
def mul_wide(a: torch.Tensor, b: torch.Tensor):
    """Exact a * b for 0 <= a, b <= 2**62 as (hi, lo) with a*b = hi * 2**62 + lo."""
    a, b = torch.broadcast_tensors(a.to(torch.int64), b.to(torch.int64))
    a0, a1 = a & M31, a >> 31
    b0, b1 = b & M31, b >> 31
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    t = p00 + ((p01 & M31) << 31)
    c = t >> 62
    t = (t & M62) + ((p10 & M31) << 31)
    c = c + (t >> 62)
    lo = t & M62
    hi = p11 + (p01 >> 31) + (p10 >> 31) + c
    return hi, lo


def wide_lt(ah, al, bh, bl) -> torch.Tensor:
    return (ah < bh) | ((ah == bh) & (al < bl))


def wide_sub(ah, al, bh, bl):
    """(a - b) for a >= b."""
    lo = al - bl
    borrow = (lo < 0).to(torch.int64)
    return ah - bh - borrow, lo + (borrow << 62)


def wide_to_f32(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """f32(f64(hi) * 2**62 + f64(lo)): every step IEEE round-to-nearest (the mul is exact)."""
    d = hi.to(torch.float64) * float(2 ** 62) + lo.to(torch.float64)
    return d.to(torch.float32)


# ---------------------------------------------------------------------------------------------
# per-row processing
# ---------------------------------------------------------------------------------------------
def row_params(req: torch.Tensor, temperature, top_k, top_p, min_p):
    """Per-row (T, k, p, min_p) for rows owned by requests ``req``; greedy -> (1-temp, k=1)."""
    dev = req.device
    R = req.shape[0]

    def g(t, default, dtype):
        if t is None:
            return torch.full((R,), default, dtype=dtype, device=dev)
        return t.to(dev)[req].to(dtype)

    return (g(temperature, 1.0, torch.float32), g(top_k, 0, torch.int64),
            g(top_p, 1.0, torch.float32), g(min_p, 0.0, torch.float32))


def process_rows(z: torch.Tensor, T, k, p, mp):
    """Processed rows: (y, kept, e, S, invalid, greedy).

    y float32 [R, V] (``sampling.process``); kept bool [R, V]; e int64 masses on the kept set;
    S = sum e.
    """
    R, V = z.shape
    zf, y, _, greedy, invalid = ref_sampling.process(z, T)
    k = torch.where(greedy, torch.ones_like(k), k)
    p = torch.where(greedy, torch.ones_like(p), p)
    mp = torch.where(greedy, torch.zeros_like(mp), mp)
    if R == 0:
        z0 = torch.zeros((0,), dtype=torch.int64, device=z.device)
        return (y, torch.zeros_like(y, dtype=torch.bool),
                torch.zeros_like(y, dtype=torch.int64), z0, invalid, greedy)
    kept, _ = ref_sampling.kept_mask(zf, y, k, p, mp)
    e = torch.where(kept, prims.mass_fixed(y), torch.zeros((), dtype=torch.int64,
                                                             device=z.device))
    S = e.sum(1)
    return y, kept, e, S, invalid, greedy


def _layout(cu: torch.Tensor):
    cu = cu.to(torch.int64)
    bs = cu.shape[0] - 1
    n = cu[1:] - cu[:-1]
    dev = cu.device
    req_ids = torch.arange(bs, device=dev)
    t_start = cu[:-1] + req_ids
    req_t = torch.repeat_interleave(req_ids, n + 1)
    pos_t = torch.arange(req_t.shape[0], device=dev) - t_start[req_t]
    req_d = torch.repeat_interleave(req_ids, n)
    pos_d = torch.arange(req_d.shape[0], device=dev) - cu[:-1][req_d]
    return bs, n, t_start, req_t, pos_t, req_d, pos_d


def _first_failure(ok_flat, req_d, pos_d, n, bs, max_n):
    """Index of the first False of each request's ok list (n_i if none)."""
    dev = n.device
    okp = torch.zeros((bs, max(max_n, 1)), dtype=torch.bool, device=dev)
    if ok_flat.numel():
        inside = pos_d < okp.shape[1]      # positions past max_n: requests made invalid
        okp[req_d[inside], pos_d[inside]] = ok_flat[inside]
    col = torch.arange(okp.shape[1], device=dev)
    fail = ~okp & (col[None, :] < n[:, None])
    big = torch.full(okp.shape, 1 << 30, dtype=torch.int64, device=dev)
    first = torch.where(fail, col[None, :].expand_as(big), big)
    return torch.minimum(first.min(1).values, n)


def _finish(bs, max_n, n, f, tok_final, valid, draft_ids, cu, t_start, z_t, y_t, kept_t,
            greedy_t):
    """tokens [bs, max_n+1] (accepted drafts, the final token, then -1) and their logprobs."""
    dev = z_t.device
    W = max_n + 1
    V = z_t.shape[1]
    col = torch.arange(W, device=dev)
    if bs == 0:
        e = torch.zeros((0, W), dtype=torch.float32, device=dev)
        return torch.zeros((0, W), dtype=torch.int64, device=dev), e, e.clone()
    nd = max(draft_ids.shape[0] - 1, 0)
    draft_at = torch.zeros((bs, W), dtype=torch.int64, device=dev)
    if draft_ids.numel():
        draft_at = draft_ids[(cu[:-1, None] + col[None, :]).clamp(max=nd)]
    acc = col[None, :] < f[:, None]
    at = col[None, :] == f[:, None]
    tokens = torch.where(acc, draft_at, torch.full_like(draft_at, -1))
    tokens = torch.where(at, tok_final[:, None], tokens)
    rows = (t_start[:, None] + torch.minimum(col[None, :], n[:, None])).reshape(-1)
    tk = tokens.reshape(-1).clamp(0, V - 1)
    kept_exp = torch.where(kept_t, torch.exp(y_t), torch.zeros_like(y_t))
    lognorm = torch.log(kept_exp.sum(1))
    lse_raw = torch.logsumexp(z_t.to(torch.float32), dim=1)
    lp = (z_t.to(torch.float32)[rows, tk] - lse_raw[rows]).reshape(bs, W)
    plp = (y_t[rows, tk] - lognorm[rows]).reshape(bs, W)
    plp = torch.where(greedy_t[rows].reshape(bs, W), torch.zeros_like(plp), plp)
    emitted = acc | at
    zero = torch.zeros((), dtype=torch.float32, device=dev)
    lp = torch.where(emitted, lp, zero)
    plp = torch.where(emitted, plp, zero)
    bad = at & ~valid[:, None]
    nan = torch.full((), float("nan"), dtype=torch.float32, device=dev)
    return tokens, torch.where(bad, nan, lp), torch.where(bad, nan, plp)


def residual_sample(ep, eq, Sp, Sq, seed, offset_pos):
    """Gumbel-max over normalize(max(0, p - q)) (fallback p when empty). Rows are positions:
    ep, eq int64 [R, V] masses, Sp, Sq int64 [R], seed int64 [R], offset_pos = offset + j [R]."""
    dev = ep.device
    R, V = ep.shape
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    ah, al = mul_wide(ep, Sq[:, None])
    bh, bl = mul_wide(eq, Sp[:, None])
    support = wide_lt(bh, bl, ah, al)
    nh, nl = wide_sub(ah, al, bh, bl)
    w_res = wide_to_f32(torch.where(support, nh, zero), torch.where(support, nl, zero))
    w_fb = wide_to_f32(torch.zeros_like(ep), ep)
    any_res = support.any(1, keepdim=True)
    keep = torch.where(any_res, support, ep > 0)
    w = torch.where(any_res, w_res, w_fb)
    ids = torch.arange(V, device=dev)
    g = prims.gumbel_from_bits(prims.philox_bits(seed[:, None], offset_pos[:, None], ids[None, :],
                                                 prims.STREAM_RESAMPLE))
    one = torch.ones((), dtype=torch.float32, device=dev)
    score = prims.soft_ln(torch.where(keep, w, one)) + g
    score = torch.where(keep, score, torch.full_like(score, float("-inf")))
    best = score.max(1, keepdim=True).values
    return torch.argmax((keep & (score == best)).to(torch.int8), dim=1)


def accept_decision(ep_x, eq_x, Sp, Sq, U):
    """u < p(x)/q(x) with u = U / 2**24, exactly: U * e^q_x * S_p < 2**24 * e^p_x * S_q."""
    lh, ll = mul_wide(U * eq_x, Sp)
    rh, rl = mul_wide(ep_x << 24, Sq)
    return wide_lt(lh, ll, rh, rl)


def verify(target_logits: torch.Tensor, draft_token_ids: torch.Tensor, cu_num_draft: torch.Tensor,
           seed: torch.Tensor, offset: torch.Tensor, draft_logits: Optional[torch.Tensor] = None,
           temperature=None, top_k=None, top_p=None, min_p=None, mode: str = "probabilistic",
           max_num_draft: Optional[int] = None):
    """Ragged verify. Returns (tokens [bs, max_n+1] int64, num_accepted [bs] int64,
    valid [bs] bool, logprobs [bs, max_n+1] f32, processed_logprobs [bs, max_n+1] f32)."""
    assert mode in MODES, mode
    dev = target_logits.device
    cu = cu_num_draft.to(dev).to(torch.int64)
    n_ids = draft_token_ids.numel()
    if cu.shape[0] > 1 and not (int(cu[0]) == 0 and int(cu[-1]) == n_ids
                                and bool((cu[1:] >= cu[:-1]).all())):
        # not a partition of the drafts (unvalidated input): request by request, those whose
        # range leaves [0, len(draft_token_ids)) or holds more than max_num_draft (or a
        # negative count) invalid, as in the device kernels
        return _verify_by_request(target_logits, draft_token_ids, cu, seed, offset,
                                  draft_logits, temperature, top_k, top_p, min_p, mode,
                                  max_num_draft)
    bs, n, t_start, req_t, pos_t, req_d, pos_d = _layout(cu)
    if max_num_draft is None:
        max_n = int(n.max().item()) if bs else 0
    else:
        max_n = int(max_num_draft)
    # a request with more drafts than max_n (a wrong bound) is invalid: token 0 at slot 0,
    # num_accepted 0, valid False (the Triton kernels do the same; ops.verify refuses it when
    # validating)
    over = n > max_n
    seed = seed.to(dev).to(torch.int64)
    offset = offset.to(dev).to(torch.int64)
    V = target_logits.shape[1]
    draft_ids = draft_token_ids.to(dev).to(torch.int64).reshape(-1)
    z_t = target_logits
    T_t, k_t, p_t, mp_t = row_params(req_t, temperature, top_k, top_p, min_p)
    y_t, kept_t, e_t, S_t, inv_t, greedy_t = process_rows(z_t, T_t, k_t, p_t, mp_t)
    row_d_t = t_start[req_d] + pos_d                  # target row of each draft position

    if mode == "strict":
        if req_t.numel():
            tok_rows, ok_rows, _, _ = ref_sampling.sample(z_t, seed[req_t], offset[req_t] + pos_t,
                                                          T_t, k_t, p_t, mp_t, 1)
        else:
            tok_rows = torch.zeros(0, dtype=torch.int64, device=dev)
            ok_rows = torch.zeros(0, dtype=torch.bool, device=dev)
        ok = ok_rows[row_d_t] & (draft_ids == tok_rows[row_d_t])
        f = torch.where(over, 0, _first_failure(ok, req_d, pos_d, n, bs, max_n))
        final_t = t_start + f
        tok_final = torch.where(over, 0, tok_rows[final_t])
        valid = ok_rows[final_t] & ~over
        tokens, lp, plp = _finish(bs, max_n, n, f, tok_final, valid, draft_ids, cu, t_start, z_t,
                                  y_t, kept_t, greedy_t)
        return tokens, f, valid, lp, plp

    # ---- probabilistic / ngram ----
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    in_range = (draft_ids >= 0) & (draft_ids < V)
    xc = draft_ids.clamp(0, V - 1)
    ep_x = torch.where(in_range, e_t[row_d_t].gather(1, xc[:, None])[:, 0], zero)
    Sp = S_t[row_d_t]
    if mode == "probabilistic":
        assert draft_logits is not None, "draft_logits required in probabilistic mode"
        T_d, k_d, p_d, mp_d = row_params(req_d, temperature, top_k, top_p, min_p)
        _, _, e_q, S_q, inv_q, _ = process_rows(draft_logits, T_d, k_d, p_d, mp_d)
        eq_x = torch.where(in_range, e_q.gather(1, xc[:, None])[:, 0], zero)
        Sq = S_q
    else:
        inv_q = torch.zeros_like(in_range)
        eq_x = torch.ones_like(ep_x)
        Sq = torch.ones_like(Sp)
    bits = prims.philox_bits(seed[req_d], offset[req_d], pos_d, prims.STREAM_ACCEPT)
    U = (bits >> 9) * 2 + 1
    accept = accept_decision(ep_x, eq_x, Sp, Sq, U)
    ok = accept & ~inv_t[row_d_t] & ~inv_q
    f = torch.where(over, 0, _first_failure(ok, req_d, pos_d, n, bs, max_n))

    final_t = t_start + f
    is_bonus = f == n
    final_d = (cu[:-1] + f).clamp(max=max(draft_ids.shape[0] - 1, 0))   # draft slot at f
    valid = ~inv_t[final_t] & ~over
    if inv_q.numel():
        valid = valid & (is_bonus | ~inv_q[final_d])
    tok_final = torch.zeros(bs, dtype=torch.int64, device=dev)

    bon = torch.nonzero(is_bonus & valid).flatten()
    if bon.numel():       # the foundation sampler on target row n_i at offset + n_i
        rows = final_t[bon]
        tb, _, _, _ = ref_sampling.sample(z_t[rows], seed[bon], offset[bon] + n[bon],
                                          T_t[rows], k_t[rows], p_t[rows], mp_t[rows], 1)
        tok_final[bon] = tb
    res = torch.nonzero(~is_bonus & valid).flatten()
    if res.numel():       # residual resample at the first rejection
        rows = final_t[res]
        if mode == "probabilistic":
            eq = e_q[final_d[res]]
            Sq_r = S_q[final_d[res]]
        else:
            ids = torch.arange(V, device=dev)
            eq = (ids[None, :] == draft_ids[final_d[res]][:, None]).to(torch.int64)
            Sq_r = torch.ones_like(S_t[rows])
        tok_final[res] = residual_sample(e_t[rows], eq, S_t[rows], Sq_r, seed[res],
                                         offset[res] + f[res])
    tokens, lp, plp = _finish(bs, max_n, n, f, tok_final, valid, draft_ids, cu, t_start, z_t, y_t,
                              kept_t, greedy_t)
    return tokens, f, valid, lp, plp


def target_probabilities(target_logits, cu_num_draft, temperature=None, top_k=None, top_p=None,
                         min_p=None) -> torch.Tensor:
    """Processed target distribution [rows, V] (float64) of every target row (for tests)."""
    cu = cu_num_draft.to(target_logits.device).to(torch.int64)
    _, n, _, req_t, _, _, _ = _layout(cu)
    T, k, p, mp = row_params(req_t, temperature, top_k, top_p, min_p)
    return ref_sampling.probabilities(target_logits, T, k, p, mp, 1)


def fixed_point_probabilities(logits, req, temperature=None, top_k=None, top_p=None, min_p=None):
    """p_i = e_i / S as float64 [rows, V]: the distribution verify's accept/resample use."""
    T, k, p, mp = row_params(req, temperature, top_k, top_p, min_p)
    _, _, e, S, _, _ = process_rows(logits, T, k, p, mp)
    return e.double() / S.double()[:, None]


def _verify_by_request(target_logits, draft_token_ids, cu, seed, offset, draft_logits,
                       temperature, top_k, top_p, min_p, mode, max_num_draft):
    """``verify`` of a ragged layout whose ranges are not a partition of the drafts (unvalidated
    input): each request whose range ``[cu[i], cu[i + 1])`` lies in ``[0, len(draft_token_ids))``
    with at most ``max_n`` drafts is verified alone (the result does not depend on the batch:
    the randomness contract); the others are invalid (token 0 in slot 0, -1 after it, 0
    accepted, NaN logprob)."""
    dev = target_logits.device
    bs = cu.shape[0] - 1
    ids = draft_token_ids.to(dev).to(torch.int64).reshape(-1)
    nids = ids.shape[0]
    c = cu.tolist()
    ok = [0 <= c[i] <= c[i + 1] <= nids for i in range(bs)]
    if max_num_draft is None:
        max_n = max([c[i + 1] - c[i] for i in range(bs) if ok[i]], default=0)
    else:
        max_n = int(max_num_draft)
    W = max_n + 1
    tokens = torch.full((bs, W), -1, dtype=torch.int64, device=dev)
    tokens[:, 0] = 0
    acc = torch.zeros(bs, dtype=torch.int64, device=dev)
    valid = torch.zeros(bs, dtype=torch.bool, device=dev)
    lp = torch.zeros((bs, W), dtype=torch.float32, device=dev)
    lp[:, 0] = float("nan")
    plp = lp.clone()

    def one(t, i):
        return None if t is None else t.to(dev)[i:i + 1]

    for i in range(bs):
        c0, c1 = c[i], c[i + 1]
        if not ok[i] or c1 - c0 > max_n:
            continue
        r = verify(target_logits[c0 + i:c1 + i + 1], ids[c0:c1],
                   torch.tensor([0, c1 - c0], device=dev), one(seed, i), one(offset, i),
                   None if draft_logits is None else draft_logits[c0:c1], one(temperature, i),
                   one(top_k, i), one(top_p, i), one(min_p, i), mode, max_n)
        tokens[i], acc[i], valid[i], lp[i], plp[i] = r[0][0], r[1][0], r[2][0], r[3][0], r[4][0]
    return tokens, acc, valid, lp, plp


def strict_accept(row_tokens, row_valid, draft_token_ids, cu_num_draft, row_lp, row_plp,
                  max_num_draft: int, padded: bool):
    """Spec of the strict accept step over sampled target rows (any layout).

    Row of position j of request i: ragged ``cu[i] + i + j``, padded ``i * (max_n + 1) + j``;
    draft slot: ragged ``cu[i] + j``, padded ``i * max_n + j``. Accept while the row is valid and
    the draft equals the row's token; emit the row token at the first failure (or position n_i).
    """
    dev = row_tokens.device
    cu = cu_num_draft.to(torch.int64)
    bs = cu.shape[0] - 1
    W = max_num_draft + 1
    n = cu[1:] - cu[:-1]
    col = torch.arange(W, device=dev)
    i = torch.arange(bs, device=dev)[:, None]
    if padded:
        tr = i * W + col[None, :]
        dr = i * max(max_num_draft, 1) + col[None, :]
    else:
        tr = cu[:-1, None] + i + col[None, :]
        dr = cu[:-1, None] + col[None, :]
    in_t = col[None, :] <= n[:, None]
    in_d = col[None, :] < n[:, None]
    R = row_tokens.shape[0]
    trc = torch.where(in_t, tr, torch.zeros_like(tr)).clamp(max=max(R - 1, 0))
    ids = draft_token_ids.to(torch.int64).reshape(-1)
    drc = torch.where(in_d, dr, torch.zeros_like(dr)).clamp(max=max(ids.shape[0] - 1, 0))
    t = row_tokens.to(torch.int64)[trc] if R else torch.zeros_like(trc)
    v = row_valid[trc] if R else torch.zeros_like(trc, dtype=torch.bool)
    x = ids[drc] if ids.numel() else torch.zeros_like(drc)
    ok = v & (x == t)
    big = torch.full_like(tr, 1 << 30)
    f = torch.minimum(torch.where(in_d & ~ok, col[None, :].expand_as(tr), big).min(1).values, n)
    over = (n > max_num_draft) | (n < 0)     # a wrong bound: the request is invalid (verify)
    f = torch.where(over, 0, f)
    at = col[None, :] == f[:, None]
    tok = torch.where(col[None, :] < f[:, None], x, torch.full_like(x, -1))
    tok = torch.where(at, torch.where(over[:, None], 0, t), tok)
    valid = (v & at).any(1) & ~over
    zero = torch.zeros((bs, W), dtype=torch.float32, device=dev)
    if row_lp is not None:
        em = col[None, :] <= f[:, None]
        lp = torch.where(em, row_lp[trc], zero)
        plp = torch.where(em, row_plp[trc], zero)
        nan = torch.full((), float("nan"), device=dev)
        lp = torch.where(at & over[:, None], nan, lp)
        plp = torch.where(at & over[:, None], nan, plp)
    else:
        lp, plp = zero, zero.clone()
    return tok, f, valid, lp, plp
