"""Logits processing of a verify's target rows (``ops.verify(..., processing=)``), Triton.

Writes the processed target logits, float32 ``[R_t, V]``, that the verify kernels then read in
place of the raw ones: one extra pass over the target rows (not fused into the verify kernels'
reads, unlike the sampler's processing). Row ``r`` of request ``q`` at position ``j`` is
processed as ``reference.logits_processing.apply_verify`` says, with the sampler's Triton
processing code (``triton/sampling.py``: ``_proc_ctx``, ``_process_x``, ``_mask_words``), so the
float operations are the sampler's and the reference's, one IEEE float32 operation per step:

* bias, banned ids, penalty values: request ``q``'s; the penalty counts: slot
  ``count_slots[q]``'s plus one per occurrence among the drafts ``d_0 .. d_{j-1}``;
* ``min_tokens``: the stop ids masked while ``num_output_tokens[q] + j < min_tokens[q]``;
* ``allowed_mask``: request ``q``'s row, or row ``r``'s when one mask per target row is given.

Kernels: ``_prep_rows`` grid (R_t,): row r's keep words (allowed, banned, active stop ids) and
has-bias words, scratch ``[R_t, ceil(V / 32)]`` int32 each; ``_process_rows`` grid (R_t, splits):
the processed row, and with logprobs each split's raw (max, exp-sum), which ``_lse_combine``
(grid (R_t,)) turns into the raw rows' log-sum-exp (the raw logprobs: no second read). A
padding row (padded layout, past the request's drafts) and a row of a request whose layout is
malformed (unvalidated input; that request is invalid in the verify kernels, which do not read
its rows) are copied unprocessed. Draft ids outside ``[0, V)`` never
match a token (not counted).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sampling import (NEG_INF, P_BIAS, P_KEEP, P_PEN, _lanes_update, _mask_words, _proc_ctx,
                       _process_x, _raw_store)
from .verify import _pow2, _row_req

_LAUNCH = {"enable_fp_fusion": False}
_PREP_BLOCK = 256


@triton.jit
def _row_layout(r, row_req_ptr, cu_ptr, MAX_N, NIDS, PADDED: tl.constexpr):
    """(request q, position j, index of the request's first draft, ok) of target row r; ok is
    False for a padding row or a request whose layout is malformed (the verify kernels' rules:
    ragged [cu[q], cu[q + 1]) inside [0, NIDS] with at most MAX_N drafts; padded 0 <= n <= MAX_N)."""
    q = tl.load(row_req_ptr + r).to(tl.int64)
    qq = tl.maximum(q, 0)
    c0 = tl.load(cu_ptr + qq)
    c1 = tl.load(cu_ptr + qq + 1)
    n = c1 - c0
    ok = (q >= 0) & (n >= 0) & (n <= MAX_N)
    if PADDED:
        j = r - qq * (MAX_N + 1)
        dbase = qq * MAX_N
    else:
        j = r - (c0 + qq)
        dbase = c0
        ok = ok & (c0 >= 0) & (c1 <= NIDS)
    ok = ok & (j >= 0) & (j <= n)
    return qq, j, dbase, ok


@triton.jit(do_not_specialize=["MAX_N", "NIDS", "nnz_x", "nnz_s", "nnz_b"])
def _prep_rows(keep_ptr, hasb_ptr, row_req_ptr, cu_ptr, allowed_ptr, ban_ip_ptr, ban_ids_ptr,
               min_ptr, nout_ptr, stop_ip_ptr, stop_ids_ptr, bias_ip_ptr, bias_ids_ptr, V, MAX_N,
               NIDS, nnz_x, nnz_s, nnz_b, PADDED: tl.constexpr, BUILD_KEEP: tl.constexpr,
               HAS_ALLOWED: tl.constexpr, ALLOWED_PER_ROW: tl.constexpr, HAS_BAN: tl.constexpr,
               HAS_STOP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """Program r: target row r's keep words (the allowed mask of its request or its own, or all
    ones; then its request's banned ids and, while num_output_tokens + j < min_tokens, its stop
    ids cleared) and has-bias words (its request's bias entries' bits)."""
    r = tl.program_id(0).to(tl.int64)
    q, j, _dbase, _ok = _row_layout(r, row_req_ptr, cu_ptr, MAX_N, NIDS, PADDED)
    W = (V + 31) // 32
    arow = q
    if ALLOWED_PER_ROW:
        arow = r
    _mask_words(keep_ptr + r * W, hasb_ptr + r * W, allowed_ptr + arow * W, q, j, ban_ip_ptr,
                ban_ids_ptr, min_ptr, nout_ptr, stop_ip_ptr, stop_ids_ptr, bias_ip_ptr,
                bias_ids_ptr, V, nnz_x, nnz_s, nnz_b, BUILD_KEEP, HAS_ALLOWED, HAS_BAN, HAS_STOP,
                HAS_BIAS, BLOCK)


@triton.jit(do_not_specialize=["MAX_N", "NIDS", "nnz_b", "nslots"])
def _process_rows(tgt_ptr, stride_t, out_ptr, V, row_req_ptr, cu_ptr, ids_ptr, bias_ip_ptr,
                  bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr, pres_ptr, seen_ptr, cnt_ptr,
                  slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots, MAX_N, NIDS, chunk, part_ptr,
                  PADDED: tl.constexpr, PROC: tl.constexpr, KEEP_PER_ROW: tl.constexpr,
                  BLOCK: tl.constexpr, RAW_LSE: tl.constexpr):
    """Program (r, s): split s of target row r, processed (float32) into out[r]; with
    ``RAW_LSE`` also the split's raw (unprocessed) max (NaN if any NaN) and exp-sum relative to
    it into ``part[r, s]`` (the raw logprobs' log-sum-exp, without another pass over the rows)."""
    r = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    q, j, dbase, ok = _row_layout(r, row_req_ptr, cu_ptr, MAX_N, NIDS, PADDED)
    pc = _proc_ctx(q, 1, V, bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr,
                   pres_ptr, seen_ptr, cnt_ptr, slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots,
                   PROC)
    b0, b1, rp, fp, pp, bids, bvals, hb_row, seen_row, cnt_row, keep_row, pok, W = pc
    if KEEP_PER_ROW:   # keep / has-bias words built per target row (_prep_rows)
        if P_BIAS & PROC:
            hb_row = hasb_ptr + r * W
        if P_KEEP & PROC:
            keep_row = keep_ptr + r * W
    pc = (b0, b1, rp, fp, pp, bids, bvals, hb_row, seen_row, cnt_row, keep_row, pok, W)
    npre = tl.where(ok, j, 0)
    src = tgt_ptr + r * stride_t
    dst = out_ptr + r * V
    lo = sp * chunk
    rm = tl.full([BLOCK], NEG_INF, tl.float32)
    rs = tl.zeros([BLOCK], tl.float32)
    for t0 in range(lo, tl.minimum(lo + chunk, V), BLOCK):
        offs = t0 + tl.arange(0, BLOCK)
        m = offs < V
        z = tl.load(src + offs, mask=m, other=0.0).to(tl.float32)
        if RAW_LSE:
            rm, _ri, rs, _s2 = _lanes_update(tl.where(m, z, NEG_INF), offs, rm, offs, rs, rs,
                                             1.0, True, False)
        if ok:
            ex = tl.zeros([BLOCK], tl.int32)
            if P_PEN & PROC:
                for k in range(0, npre):
                    d = tl.load(ids_ptr + dbase + k)
                    ex += (offs.to(tl.int64) == d).to(tl.int32)
            z = _process_x(z, offs, m, pc, ex, PROC, True, t0, True)
        tl.store(dst + offs, z, mask=m)
    if RAW_LSE:
        _raw_store(rm, rs, part_ptr, r * tl.num_programs(1) + sp, True, 1)


@triton.jit
def _lse_combine(part_ptr, lse_ptr, S, SP: tl.constexpr):
    """Program r: the log-sum-exp of target row r from its splits' (max, exp-sum) pairs, with
    ``torch.logsumexp``'s special values: NaN if the row holds a NaN, +inf if it holds a +inf
    (and no NaN), -inf if every value is -inf."""
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, SP)
    msk = j < S
    M = tl.load(part_ptr + (r * S + j) * 2, mask=msk, other=NEG_INF)
    Ssum = tl.load(part_ptr + (r * S + j) * 2 + 1, mask=msk, other=0.0)
    nan = tl.max((M != M).to(tl.int32), axis=0)
    Mr = tl.max(tl.where(M != M, NEG_INF, M), axis=0)
    tot = tl.sum(tl.where(M > NEG_INF, Ssum * tl.exp(M - Mr), 0.0), axis=0)
    lse = Mr + tl.log(tot)
    lse = tl.where(Mr == float("inf"), float("inf"), lse)
    lse = tl.where(Mr == NEG_INF, NEG_INF, lse)
    lse = tl.where(nan != 0, float("nan"), lse)
    tl.store(lse_ptr + r, lse)


def process_target(tgt: torch.Tensor, proc: list, allowed_per_row: bool, ids: torch.Tensor,
                   cu: torch.Tensor, max_n: int, padded: bool, block: int = 0, splits: int = 0,
                   num_warps: int = 0, raw_lse: bool = False):
    """The processed target rows, float32 ``[R_t, V]`` (module docstring). ``proc``: the
    normalized 16-entry list of ``ops.sampling.PROC_FIELDS`` for the ``bs`` requests, except
    that ``allowed_mask`` has ``R_t`` rows when ``allowed_per_row``. Graph-safe (no host sync).
    ``block`` / ``splits`` (programs per row) / ``num_warps`` of ``_process_rows``: 0 = the
    default policy (overrides: tests and the lab's A/B runs; the values are the same).
    ``raw_lse``: returns ``(rows, lse)`` with ``lse [R_t]`` float32 the log-sum-exp of each
    unprocessed target row (as ``torch.logsumexp`` of its float32 values, to float32 rounding;
    the raw logprobs), computed in the same pass."""
    R_t, V = tgt.shape
    dev = tgt.device
    out = torch.empty((R_t, V), dtype=torch.float32, device=dev)
    if R_t == 0 or V == 0:
        if raw_lse:
            return out, torch.full((R_t,), float("-inf"), dtype=torch.float32, device=dev)
        return out
    bs = cu.shape[0] - 1
    (bias_ip, bias_ids, bias_val, rep, freq, pres, seen, outc, slots, allowed, ban_ip, ban_ids,
     min_t, n_out, stop_ip, stop_ids) = proc
    dummy = cu
    row_req = _row_req(R_t, 0, cu, bs, max_n, padded, dev)
    W = (V + 31) // 32
    PROC = P_BIAS.value if bias_ip is not None else 0
    if seen is not None:   # an absent penalty is its neutral value (as the sampler)
        PROC |= P_PEN.value
        rep = rep if rep is not None else torch.ones(bs, dtype=torch.float32, device=dev)
        freq = freq if freq is not None else torch.zeros(bs, dtype=torch.float32, device=dev)
        pres = pres if pres is not None else torch.zeros(bs, dtype=torch.float32, device=dev)
    has_ban, has_stop = ban_ip is not None, min_t is not None
    build_keep = has_ban or has_stop or (allowed is not None and not allowed_per_row)
    if allowed is not None or build_keep:
        PROC |= P_KEEP.value
    nnz = [0 if t is None else t.shape[0] for t in (ban_ids, stop_ids, bias_ids)]
    nids = ids.numel()
    ids_ = ids if nids else torch.zeros(1, dtype=torch.int64, device=dev)
    keep, hasb = dummy, dummy
    keep_per_row = build_keep or bias_ip is not None
    if keep_per_row:
        if build_keep:
            keep = torch.empty(R_t, W, dtype=torch.int32, device=dev)
        elif allowed is not None:
            keep = allowed   # one mask per target row, read directly
        if bias_ip is not None:
            hasb = torch.empty(R_t, W, dtype=torch.int32, device=dev)

        def d(t):
            return t if t is not None else dummy
        _prep_rows[(R_t,)](keep, hasb, row_req, cu, d(allowed), d(ban_ip), d(ban_ids), d(min_t),
                           d(n_out), d(stop_ip), d(stop_ids), d(bias_ip), d(bias_ids), V, max_n,
                           nids, nnz[0], nnz[1], nnz[2], PADDED=padded, BUILD_KEEP=build_keep,
                           HAS_ALLOWED=allowed is not None, ALLOWED_PER_ROW=allowed_per_row,
                           HAS_BAN=has_ban, HAS_STOP=has_stop, HAS_BIAS=bias_ip is not None,
                           BLOCK=_PREP_BLOCK)
    elif allowed is not None:
        keep = allowed   # per row; read directly (KEEP_PER_ROW below)
        keep_per_row = True
    block = max(min(block or 1024, _pow2(V)), 16)
    if splits > 0:
        splits = min(splits, triton.cdiv(V, block))
    elif dev.type == "cuda":
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        splits = max(1, min(_pow2(max(1, (4 * sms) // R_t)), triton.cdiv(V, 4 * block), 64))
    else:
        splits = min(4, triton.cdiv(V, 4 * block))
    chunk = triton.cdiv(triton.cdiv(V, splits), block) * block
    splits = triton.cdiv(V, chunk)

    def d(t):
        return t if t is not None else dummy
    part = torch.empty((R_t, splits, 2), dtype=torch.float32, device=dev) if raw_lse else out
    _process_rows[(R_t, splits)](tgt, tgt.stride(0), out, V, row_req, cu, ids_, d(bias_ip),
                                 d(bias_ids), d(bias_val), d(rep), d(freq), d(pres), d(seen),
                                 d(outc), d(slots), keep, hasb, nnz[2],
                                 0 if seen is None else seen.shape[0], max_n, nids, chunk, part,
                                 PADDED=padded, PROC=PROC, KEEP_PER_ROW=keep_per_row,
                                 BLOCK=block, RAW_LSE=raw_lse, **_LAUNCH,
                                 **({"num_warps": num_warps} if num_warps else {}))
    if not raw_lse:
        return out
    lse = torch.empty(R_t, dtype=torch.float32, device=dev)
    # (SP: a power of two >= 16 covering every split count of this V and block: one compile)
    _lse_combine[(R_t,)](part, lse, splits, SP=max(16, _pow2(triton.cdiv(V, block))),
                         **_LAUNCH)
    return out, lse

