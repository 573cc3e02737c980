"""Triton sampler: exact Gumbel-max over the temperature -> top-k -> top-p -> min-p kept set.

Same tokens as ``tokenspeed_kernel.reference.sampling.sample`` bit for bit (same Philox words,
same float32 op sequences from ``triton/prims.py``, same integer / fixed-point filter decisions);
runs on the GPU and on the CPU under ``TRITON_INTERPRET=1``. Kernels are launched with
``enable_fp_fusion=False`` (no FMA contraction).

Design (simple and exact; this is the fallback, not the fast path):

* a program handles ``ROWS`` rows (1 for large vocabularies on the GPU; several for small ones,
  and many under the interpreter, whose cost is per operation) in ``[ROWS, BLOCK]`` tiles: any V,
  any row stride, logits read natively as fp32 / bf16 / fp16;
* the total order (value descending, id ascending) is the row-local compact key
  ``key = key32(x) * V + (V - 1 - id)``: order-preserving and unique like key56, but its range
  is 2^32 * V instead of 2^56, which saves search passes;
* pass 1: max / min key per row (the max key gives the greedy token and the row max ``m``),
  the invalid flags (NaN, +inf, no finite logit) and, for logprobs, the raw max;
* every filter is a threshold on the key: top-k keeps ``key >= t_k``, ``t_k`` = the k-th
  largest key; top-p keeps ``key >= t_p``, ``t_p`` = the largest t whose fixed-point mass
  ``sum(mass_fixed(x - m) : key >= max(t, t_k))`` reaches ``max(1, trunc(p * S_K))`` -- the
  reference's "mass before the token < P'" rule on the sorted row. Both are found by an
  (NT+1)-ary search over the key range: each pass counts (or sums the mass of) the keys at NT
  thresholds at once (about 10-13 passes with NT = 16). All decisions are integer, hence
  identical to the reference's sort + cumsum;
* final pass: Gumbel argmax of ``x + G(seed, offset, id)`` (ties: lowest id) over ``key >= t``
  and the min-p condition ``x - m >= soft_ln(min_p)``, plus the log-sum-exps of the logprobs.

Greedy rows (T == 0) take the max key (lowest id among ties) and join no search. A program
searches only while one of its rows still needs it. No host sync: CUDA-graph safe.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from . import prims as P

NT = 16  # thresholds per search pass (17-ary search)


@triton.jit
def _load_tile(logits_ptr, row_off, rmask, stride_row, offs, V, inv_t):
    """[ROWS, BLOCK] tile: (mask, z = float32 logits, x = z * inv_t)."""
    mask = rmask[:, None] & (offs[None, :] < V)
    ptrs = logits_ptr + (row_off * stride_row)[:, None] + offs[None, :]
    z = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    return mask, z, z * inv_t[:, None]


@triton.jit
def _ge_stats(logits_ptr, row_off, rmask, stride_row, V, inv_t, m, floor_key, t,
              MASS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, NTHR: tl.constexpr):
    """For each row and threshold t[r, j]: the number (MASS=False) or the fixed-point mass
    (MASS=True) of the row's tokens with key >= max(t[r, j], floor_key[r]). [ROWS, NTHR]."""
    acc = tl.zeros([ROWS, NTHR], dtype=tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = rmask[:, None] & (offs[None, :] < V)
        ptrs = logits_ptr + (row_off * stride_row)[:, None] + offs[None, :]
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32) * inv_t[:, None]
        key = P.key32(x) * V + (V - 1 - offs)[None, :]
        key = tl.where(mask & (key >= floor_key[:, None]), key, -1)
        hit = key[:, :, None] >= t[:, None, :]
        if MASS:
            e = P.mass_fixed(x - m[:, None])
            acc += tl.sum(tl.where(hit, e[:, :, None], 0), axis=1)
        else:
            acc += tl.sum(hit.to(tl.int64), axis=1)
    return acc


@triton.jit
def _search(logits_ptr, row_off, rmask, stride_row, V, inv_t, m, floor_key, lo, hi, target,
            MASS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, NTHR: tl.constexpr):
    """Per row: the largest t in [lo, hi) with F(t) >= target, F the nonincreasing count / mass
    of ``_ge_stats``; requires F(lo) >= target > F(hi) where hi - lo > 1 (rows with
    hi - lo <= 1 are done and keep lo). (NTHR+1)-ary search; passes only while a row is open."""
    j1 = tl.arange(0, NTHR).to(tl.int64)[None, :] + 1
    while tl.max(hi - lo, axis=0) > 1:
        active = (hi - lo) > 1
        step = (hi - lo + NTHR) // (NTHR + 1)
        t = tl.minimum(lo[:, None] + j1 * step[:, None], hi[:, None])
        f = _ge_stats(logits_ptr, row_off, rmask, stride_row, V, inv_t, m, floor_key, t, MASS,
                      ROWS, BLOCK, NTHR)
        ok = f >= target[:, None]
        new_lo = tl.maximum(lo, tl.max(tl.where(ok, t, lo[:, None]), axis=1))
        new_hi = tl.minimum(hi, tl.min(tl.where(ok, hi[:, None], t), axis=1))
        lo = tl.where(active, new_lo, lo)
        hi = tl.where(active, new_hi, hi)
    return lo


@triton.jit
def _sample_kernel(logits_ptr, stride_row, n_rows, V, tokens_per_request,
                   seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
                   tok_ptr, valid_ptr, lp_ptr, plp_ptr,
                   HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
                   HAS_MINP: tl.constexpr, WANT_LP: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK: tl.constexpr, NTHR: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    rows = tl.where(rmask, rows, 0)
    row_off = rows.to(tl.int64)
    q = rows // tokens_per_request
    seed = tl.load(seed_ptr + q).to(tl.int64)
    offset = tl.load(offset_ptr + q).to(tl.int64) + (rows % tokens_per_request)
    if HAS_T:
        temp = tl.load(temp_ptr + q).to(tl.float32)
    else:
        temp = tl.full([ROWS], 1.0, tl.float32)
    if HAS_K:
        k = tl.load(topk_ptr + q).to(tl.int64)
    else:
        k = tl.full([ROWS], 0, tl.int64)
    if HAS_P:
        p = tl.load(topp_ptr + q).to(tl.float32)
    else:
        p = tl.full([ROWS], 1.0, tl.float32)
    if HAS_MINP:
        mp = tl.load(minp_ptr + q).to(tl.float32)
    else:
        mp = tl.full([ROWS], 0.0, tl.float32)
    inv_t = P.inv_temperature(temp)

    # ---- pass 1: key range, invalid flags, raw max ------------------------------------------
    maxkey = tl.full([ROWS], -1, tl.int64)
    minkey = tl.full([ROWS], 1 << 62, tl.int64)
    bad = tl.zeros([ROWS], tl.int32)
    anyfin = tl.zeros([ROWS], tl.int32)
    zmax = tl.full([ROWS], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask, z, x = _load_tile(logits_ptr, row_off, rmask, stride_row, offs, V, inv_t)
        key = P.key32(x) * V + (V - 1 - offs)[None, :]
        maxkey = tl.maximum(maxkey, tl.max(tl.where(mask, key, -1), axis=1))
        minkey = tl.minimum(minkey, tl.min(tl.where(mask, key, 1 << 62), axis=1))
        b = mask & ((x != x) | (x == float("inf")))
        bad = tl.maximum(bad, tl.max(b.to(tl.int32), axis=1))
        fin = mask & (x > float("-inf"))
        anyfin = tl.maximum(anyfin, tl.max(fin.to(tl.int32), axis=1))
        if WANT_LP:
            zmax = tl.maximum(zmax, tl.max(tl.where(mask, z, float("-inf")), axis=1))

    valid = rmask & (bad == 0) & (anyfin != 0)
    sampled = valid & (temp > 0.0)
    m = P.key32_to_float(maxkey // V)    # row max (+0.0 for -0.0: same decisions)
    greedy_tok = V - 1 - maxkey % V      # max key = max value, lowest id

    # ---- top-k threshold: the k-th largest key ------------------------------------------------
    k_on = sampled & (k > 0) & (k < V)
    thr = _search(logits_ptr, row_off, rmask, stride_row, V, inv_t, m, minkey,
                  minkey, tl.where(k_on, maxkey + 1, minkey + 1), k,
                  False, ROWS, BLOCK, NTHR)

    # ---- top-p threshold on the top-k set ------------------------------------------------------
    p_on = sampled & (p < 1.0)
    if tl.max(p_on.to(tl.int32), axis=0) > 0:
        s_k = tl.max(_ge_stats(logits_ptr, row_off, rmask, stride_row, V, inv_t, m, thr,
                               thr[:, None] + tl.zeros([ROWS, NTHR], tl.int64),
                               True, ROWS, BLOCK, NTHR), axis=1)
        lim = P.top_p_limit(p, s_k)
        thr = _search(logits_ptr, row_off, rmask, stride_row, V, inv_t, m, thr,
                      thr, tl.where(p_on, maxkey + 1, thr + 1), lim,
                      True, ROWS, BLOCK, NTHR)

    # ---- min-p bound: x - m >= soft_ln(min_p); off: -inf keeps every token ---------------------
    mp_on = sampled & (mp > 0.0)
    lmin = tl.where(mp_on, P.soft_ln(tl.where(mp_on, mp, 1.0)), float("-inf"))

    # ---- final pass: Gumbel argmax over the kept set (+ logprob sums) --------------------------
    any_sampled = tl.max(sampled.to(tl.int32), axis=0) > 0
    n_final = tl.where(any_sampled, V, 0)
    if WANT_LP:
        n_final = V
    best = tl.full([ROWS], float("-inf"), tl.float32)
    best_id = tl.zeros([ROWS], tl.int32)
    kept_sum = tl.zeros([ROWS], tl.float32)
    raw_sum = tl.zeros([ROWS], tl.float32)
    for start in range(0, n_final, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask, z, x = _load_tile(logits_ptr, row_off, rmask, stride_row, offs, V, inv_t)
        key = P.key32(x) * V + (V - 1 - offs)[None, :]
        kept = mask & (key >= thr[:, None]) & (x - m[:, None] >= lmin[:, None])
        if any_sampled:
            bits = P.philox_word(seed[:, None], offset[:, None], offs[None, :], P.STREAM_SAMPLE)
            score = tl.where(kept, x + P.gumbel_from_bits(bits), float("-inf"))
        else:
            score = tl.where(kept, x, float("-inf"))
        bmax = tl.max(score, axis=1)
        bid = tl.min(tl.where(kept & (score == bmax[:, None]), offs[None, :], V), axis=1)
        upd = bmax > best
        best_id = tl.where(upd, bid, best_id)
        best = tl.where(upd, bmax, best)
        if WANT_LP:
            kept_sum += tl.sum(tl.where(kept, tl.exp(x - m[:, None]), 0.0), axis=1)
            raw_sum += tl.sum(tl.where(mask, tl.exp(z - zmax[:, None]), 0.0), axis=1)

    tok = tl.where(sampled, best_id.to(tl.int64), greedy_tok)
    tok = tl.where(valid, tok, 0)
    if WANT_LP:
        z_tok = tl.load(logits_ptr + row_off * stride_row + tok, mask=valid, other=0.0)
        z_tok = z_tok.to(tl.float32)
        lp = z_tok - zmax - tl.log(tl.where(valid, raw_sum, 1.0))
        plp = z_tok * inv_t - m - tl.log(tl.where(sampled, kept_sum, 1.0))
        plp = tl.where(sampled, plp, 0.0)
        tl.store(lp_ptr + rows, tl.where(valid, lp, float("nan")), mask=rmask)
        tl.store(plp_ptr + rows, tl.where(valid, plp, float("nan")), mask=rmask)
    tl.store(tok_ptr + rows, tok, mask=rmask)
    tl.store(valid_ptr + rows, valid.to(tl.uint8), mask=rmask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _launch_config(rows: int, V: int):
    """(ROWS, BLOCK, num_warps). GPU: 512-element tiles, 8 warps (no register spills at sm_90
    with NT = 16; ROWS > 1 only for V < 512). Interpreter: its cost is per operation and per
    jit-function call rather than per element, so tiles of up to 16384 elements, 256 rows."""
    if _interpreting():
        tile, max_rows = 16384, 256
    else:
        tile, max_rows = 512, 8
    block = max(16, min(tile, triton.next_power_of_2(V)))
    rows_per = max(1, min(tile // block, triton.next_power_of_2(rows), max_rows))
    return rows_per, block, (8 if rows_per * block >= 512 else 4)


def sample(logits: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor,
           temperature: Optional[torch.Tensor] = None, top_k: Optional[torch.Tensor] = None,
           top_p: Optional[torch.Tensor] = None, min_p: Optional[torch.Tensor] = None,
           tokens_per_request: int = 1, want_logprobs: bool = False):
    """Triton backend of ``ops.sample``. Arguments as ``reference.sampling.sample`` (already
    validated by ``ops``: per-request tensors on the logits' device, or None).

    Returns (tokens int64 [rows], valid bool [rows], logprob f32 [rows] | None,
    processed_logprob f32 [rows] | None). Stateless and CUDA-graph safe (no host sync).
    """
    rows, V = logits.shape
    dev = logits.device
    tokens = torch.empty(rows, dtype=torch.int64, device=dev)
    valid = torch.empty(rows, dtype=torch.uint8, device=dev)
    lp = torch.empty(rows, dtype=torch.float32, device=dev) if want_logprobs else None
    plp = torch.empty(rows, dtype=torch.float32, device=dev) if want_logprobs else None
    if rows == 0:
        return tokens, valid.view(torch.bool), lp, plp
    rows_per, block, warps = _launch_config(rows, V)
    dummy = seed
    _sample_kernel[(triton.cdiv(rows, rows_per),)](
        logits, logits.stride(0), rows, V, tokens_per_request,
        seed, offset,
        temperature if temperature is not None else dummy,
        top_k if top_k is not None else dummy,
        top_p if top_p is not None else dummy,
        min_p if min_p is not None else dummy,
        tokens, valid,
        lp if lp is not None else tokens, plp if plp is not None else tokens,
        HAS_T=temperature is not None, HAS_K=top_k is not None, HAS_P=top_p is not None,
        HAS_MINP=min_p is not None, WANT_LP=want_logprobs,
        ROWS=rows_per, BLOCK=block, NTHR=NT,
        num_warps=warps, enable_fp_fusion=False)
    return tokens, valid.view(torch.bool), lp, plp
