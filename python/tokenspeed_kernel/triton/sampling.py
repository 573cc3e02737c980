"""Triton sampler: exact Gumbel-max over the temperature -> top-k -> top-p -> min-p kept set.

Same tokens as ``tokenspeed_kernel.reference.sampling.sample`` bit for bit (contract "v2",
docs/DESIGN.md): the same Philox words, the same float32 op sequences (``triton/prims.py``;
every kernel is launched with ``enable_fp_fusion=False``) and the same integer / fixed-point
filter decisions. Faster arithmetic is used only to *skip* work or to *pick* a winner where a
proven bound shows that the exact rule gives the same token; everything else is exact. Runs on
the GPU and on the CPU under ``TRITON_INTERPRET=1``. Stateless, no host sync, CUDA-graph safe
(grids depend only on shapes and on which parameters are given), no workspace zeroing, and no
recompilation on parameter values or batch size (constexprs: which parameters are given,
logprobs on/off, tile sizes; the one exception: top-p without top-k has a second K1 variant for
batches with one chunk per row, below).

Notation per row: z = raw logits (float32), zmax = max z, t = fl32(1/T), y = centered(z, zmax,
t) (<= 0), G = Gumbel noise of (seed, offset, id), score s = fl32(y + G); order = key56(z, id)
descending (value descending, id ascending).

Three launches (the second only when top_p is given)::

  K1 partial   grid (rows, S1)  one streaming pass over a chunk of the row (S1 chunks per row)
  K2 mass      grid (rows, S2)  top-p rows without top-k only: exact sum of mass_fixed(y)
  K3 finalize  grid (rows,)     merges the chunks, decides, writes token / valid / logprobs

S1 and S2 are chosen on the host from the batch size and the SM count so that small batches
still fill the GPU (B = 1: one 1024-element chunk per program); when top_k / top_p are given
S1 <= 8 (their candidates are merged and sorted in K3). Loops are software-pipelined
(``num_stages``), tiles of 1024 elements (2048 lanes for TOPR, 16 warps), 16-byte loads.

Per row the mode is decided on the device from the row's parameters (all kernels agree):

* GREEDY (T == 0) and every row: K1 keeps per lane (element position of the tile) the running
  max of z (NaN-sticky: a NaN marks the row invalid) with its lowest id, and with logprobs an
  online log-sum-exp of z (and of y for PLAIN rows). Invalid rows (NaN, +inf or no finite z)
  and the greedy token come from these alone. Per element: ~4 operations.
* PLAIN (temperature only): per element K1 computes the Philox word (one Philox4x32-10 call per
  4 tokens, lanes interleaved), u = uniform(word) and the pruning test
  ``u + 2^-19 >= exp(-exp(z t - beta + 0.03))`` (two flush-to-zero hardware exp2) against
  beta, the best h of the chunk so far (~40 operations per element in all). Only a tile with a
  passing element evaluates G = gumbel_from_bits exactly for its elements and the approximate
  score h = fl32(a + G), a = fl32(z * t); per lane the best h (with id) and the second best are
  kept. Random rows evaluate ~H(n) + 0.03 n of the n tiles of a chunk. K3 merges the chunks'
  best / second-best h and takes the best h's token when ``A = |fl32(zmax * t)| <= 2^14`` and
  ``h_best - h_second > 2E = (A + 256) * 2^-21``.
  **Bound.** With u = 2^-24 and Y = (z - zmax) t real, for every token with |Y| <= 64:
  |y - Y| <= (2u + u^2)|Y|, |a - z t| <= u(A + |Y|), and the roundings of s = fl(y + G) and
  h = fl(a + G) add u(|Y| + 16.7) and u(A + |Y| + 16.7) (G is the same float32 in both); so
  |s - (h - zmax t)| <= u(2A + 5|Y| + 34) + O(u^2 A) <= E. Tokens with Y < -64 have
  s < -47 < s(max token) >= -2.82 and h - zmax t < -47 + 2uA < h(max token) - zmax t, so they
  are neither the exact winner nor the h-argmax. Hence h_best - h_second > 2E makes the
  h-argmax the unique exact argmax (strictly larger s than every other token). Pruned tokens
  have h < beta - 0.02 <= h_best - 0.02, so a chunk that pruned reports max(second best,
  beta - 0.02) as its second best; 0.02 > 2E for A <= 2^14. The test is conservative there: G
  is increasing in u (checked over all 2^23 values of u; the float32 G is within 5.4e-7 of
  -ln(-ln u)), so u < exp(-exp(-D)) means G < D; the two exp2 (relative error ~2^-22 each,
  PTX ISA) move the threshold by < 2^-21 < 2^-19 (|d exp(-exp(-D))/dD| <= 1/e); the float32
  rounding of D (z t log2e - beta log2e) and of h adds < 0.008 for |a|, |beta| <= A + 64
  (tokens farther below cannot reach beta - 0.02), inside the 0.01 slack. A row that fails the
  test (a near tie: ~1e-4 of random rows; |z t| > 2^14; t = +inf) is decided by K3's exact
  pass (below).
* WINDOW (min-p without top-k / top-p): kept <=> y >= L = soft_ln(min_p) implies
  z >= zmax - W with W = fl(|L| / t) (1 + 2^-16) (|y| >= |z - zmax| t (1 - u)^2). K1 keeps the
  running max m of the chunk (tile max first) and appends every finite z >= m - W - |m| 2^-20
  (<= the real m - W after rounding) to the chunk's candidate slot (>= 64 entries; cumsum
  compaction); the slot then holds every token of the chunk with z >= zmax - W. K3 skips the
  chunks whose max has y < L (none of their tokens is kept), compacts the other slots (prefix
  sums of their counts, NC entries at a time), filters them exactly (y >= L with the true
  zmax) and draws the Gumbel-max over them. A slot that overflows sends the row to the exact
  pass when its chunk's max is kept. Per element: ~12 operations, no Philox.
* TOPR (top-k and / or top-p, any min-p): K1 keeps per lane of a 2048-lane tile the 4 largest
  keys (value, id) it has seen (insertion network, ~22 operations per element; a lane sees ids
  in increasing order, so strict float ``>`` gives the key order). Every token of the chunk
  missing from the lanes' union has a key below tau = max over lanes of the lane's 4th key, so
  the union's keys >= tau are an exact prefix of the chunk's order (~2.2 L^(3/4) keys for L
  lanes on random rows). With 4 to 7 (with 8) chunks per row, super-lanes of 2 (of 8) lanes
  first keep the top 4 of their lanes' keys (``tl.topk`` on [lanes / f, 4 f]): fewer keys per
  chunk. The width sets the tail: a row whose nucleus runs past P takes the extension below
  (one program: such calls measured 0.6-1.7 ms on an H200), and P ends early when one
  (super-)lane holds 4 of the row's top few hundred keys, which gets likelier with more
  elements per lane. With 2 chunks, super-lanes of 2
  (~74 elements each) sent 0.3-1.4 % of top-p 0.9 rows (T = 0.8, randn * 4, V = 151936) past
  P, with 4 chunks super-lanes of 8 (~148 elements) 2-4 %: most calls of 17-66 rows waited for
  one such row. Plain lanes with 2 chunks and super-lanes of 2 with 4 (~37 elements) make P
  longer (median ~1000 keys, often past KCAP: K3 then caps it, below) and
  such rows rare (1 of 768 rows measured; a CPU simulation: 1 of 2560 rows with 2 chunks, 0 of
  1024 with 4); 8 chunks (B <= 16) keep super-lanes of 8 (~74 elements: 0.2 % in the
  simulation, none of 128 rows measured). Top-p without top-k with one chunk per row (S1 = 1:
  batches of at least ~SMs / 2 rows) keeps the 5 largest keys per lane instead (``DEPTH_P``): the prefix
  grows from a median ~670 to ~1210 keys on ``randn * 4`` rows at V = 151936 (a CPU
  simulation; rows whose nucleus runs past it: 0.4 % at 4 keys, none of 1536 at 5), so the
  extension below is rarely needed (one A/B run on an H100, fp32, T = 0.8, top-p 0.9, 4 inputs:
  B = 256 278 us with 5 keys vs 590 us with 4, where 1 of the 1024 rows took the extension);
  with several chunks per row the super-lanes' ``tl.topk`` of 5 would cost more than it saves
  (same run, B = 64, S1 = 2: 167 vs 99 us), so they keep 4.
  K1 writes the keys >= tau to the chunk's slot (2048 / S1 entries; when more, a binary search
  on the key raises tau until exactly the slot's worth remain: ``_cap_threshold``, still an
  exact prefix). K3 takes P = {slot keys >= max tau} (an exact prefix of the row's order, ~660
  keys for one chunk of 151936), compacts it into KCAP = 1024 entries (more: the same search
  keeps exactly KCAP) and sorts them, then computes
  fixed-point masses, S_K (top-k on: over P; top-k off: K2's exact row sum), the top-p / min-p
  prefix and the Gumbel-max over the kept prefix. The decision is exact when the kept prefix
  provably ends inside P: P holds every finite token, or top-k is on with k <= |P|, or the last
  entry of P is not kept, or P's mass already reaches the top-p limit (the last two with S_K
  known). Otherwise (k > |P|, top-p kept sets longer than P: flat rows) K3 runs the extension
  below; DIRECT rows (k > KCAP) go to the exact pass.
* Extension (K3, TOPR rows whose kept prefix runs past P; ``_topr_extend``). Every row key
  >= lastP (P's last key) is in P, so only the keys below lastP are searched, by value first.
  Let F(t) = (count, fixed-point mass) of the finite tokens with key56 in [t, lastP) (integer
  sums: exact, order-independent) and the target "reached" when |P| + count >= k (top-k on,
  with or without top-p: S_K needs the k-th key) or mass(P) + mass >= lim (top-p only, lim =
  ``top_p_limit(p, S)`` from K2's exact S). One pass (``_ext_stats``) computes F at 16
  thresholds: 15 value thresholds "z >= v" (key32(v) << 24) whose y spread quadratically from
  y(lastP) down to min(-27, y(lastP) - 1) (mass_fixed = 0 below y = -26.4; the spacing only
  sets the cost, never the result), then key 0 (the whole rest of the row). The largest reached threshold lo and the smallest unreached one hi
  bracket the boundary: every token in [hi, lastP) is kept by top-k / top-p (F(hi) does not
  reach the target: rank < k, resp. mass before it < lim), no token below lo is (rank >= k,
  resp. mass before it >= mass(P) + F(lo) >= lim). While the keys to collect (top-p only /
  top-k only: [lo, hi); top-k + top-p: [lo, lastP)) exceed KCAP, further passes refine the
  bracket with 16 thresholds uniform in key56 (equal values split by id): each pass shrinks
  it 17-fold, so <= 14 passes reach a one-key bracket, which always fits (top-k + top-p:
  count(hi) + 1 <= k - |P| < KCAP); NREF = 16 passes are allowed, beyond them (test
  overrides only) the extension gives up. Then one pass
  (``_ext_collect``) streams [hi, lastP) (all kept up to min-p: exact Gumbel-max with the
  exact pass's tile skips, bar = P's best score, and exp-sum) and compacts the keys of [lo, hi)
  into the row's candidate buffer (free by then); K3 sorts them (key56: P's order), continues
  the rank (|P| + count(hi)) and the mass prefix (mass(P) + mass(hi)); with top-k + top-p
  S_K = mass(P) + the masses of the collected keys of rank < k (every finite token below them
  has rank >= k, the -inf ones mass 0), lim = top_p_limit(p, S_K), and P's kept set is
  recomputed with it. The token is the exact Gumbel-max over P's kept entries, the stream and
  the kept collected keys (ties -> lowest id). Top-k with fewer than k finite tokens: nothing
  reached, every finite token below P is in the top-k set (streamed, resp. collected). Cost:
  2 passes over the row + one per refinement (typically 0-1 at KCAP = 1024) instead of the
  exact pass's ~14 (top-p) to ~26 (top-k + top-p) passes; the count / mass pass keeps
  [BLOCK_R = 256, 16] per-lane integer sums (no per-tile reductions). K3's row loops (the
  extension and the exact pass) are not software-pipelined (``NSTAGE_X = 1``): on an H200 a
  call whose one row took the extension took 586 us with one stage against 1524 us with three
  (B = 64; 900 against 1724 at B = 256), the calls without such a row the same.
* Exact pass (K3, one program per row, the rare path: DIRECT rows, PLAIN near ties, WINDOW slot
  overflows, an extension that gives up): compact key key32(z) * V + (V-1-id);
  (NT+1)-ary threshold searches (16 thresholds per pass over the row) for top-k (count) and
  top-p (fixed-point mass over the top-k set), then one Gumbel pass over the kept keys with
  exact scores; tiles whose kept max y + 16.7 is below the best score skip Philox, and tiles
  where no kept token passes the pruning test above (exact frame, slack 0.01) skip G. A
  single program per row: slow (~0.5 ms for a plain row, several ms with top-p searches at
  V = 151936), so the fast paths are sized to keep it rare.

Logprobs: raw = z_tok - zmax - ln(sum exp(z - zmax)) from K1's per-lane online sums; processed
= y_tok - ln(sum over the kept set of exp(y)) from K1's sums (PLAIN), the kept candidates (K3)
or the exact pass; greedy rows 0; invalid rows NaN (float sums: ~1e-6 relative, not bitwise).

Logits processing (``processing=``; spec ``reference/logits_processing.py``): z above is then the
processed logit, computed wherever a kernel reads the logits (``_zload``: K1's four modes, K2,
the exact pass's searches and Gumbel pass, the extension's count / mass and collection passes,
K3's read of the token's logit), never materialized. ``_prep_masks`` (one launch, one program per
request) first builds the request's keep words (allowed mask AND NOT banned AND NOT active stop
ids; an allowed mask alone is read directly) and has-bias words; a read then loads the words per
element, scans the request's bias entries only in tiles with a has-bias bit, reads the seen bit
(repetition) and the output count only where it is set (frequency / presence), and applies the
steps as single IEEE float32 operations (``div_rn``; no FMA). K1 also keeps the raw logits'
running max / exp-sum per lane (raw logprobs stay over the unprocessed row). The constexpr
``PROC`` (bits P_BIAS, P_PEN: all three penalties, absent ones neutral, P_KEEP) gates all of it:
``PROC = 0`` compiles the kernels exactly as without processing.

Under ``TRITON_INTERPRET=1`` (cost per operation) tiles are as large as the row (up to 4096 /
256 elements), every row is one chunk, and sorts are rank-based (the bitonic networks' many
small reductions are slow there); ``_TEST_CONFIG`` overrides tile sizes, caps and chunk counts
so that tests reach every path on small rows, and its ``stats`` key makes K3 report the path
each row took.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from . import prims as P
from .launch import launch
from .prims import Const

# row modes
GREEDY = Const(0)
PLAIN = Const(1)
WINDOW = Const(2)
TOPR = Const(3)
DIRECT = Const(4)

# PLAIN pruning / gap test (module docstring: "Bound")
PRUNE_C = Const(0.03)          # margin 0.02 + slack 0.01 subtracted from beta
PRUNE_MARGIN = Const(0.02)     # pruned tokens: h < beta - PRUNE_MARGIN
PRUNE_DELTA = Const(2.0 ** -19)   # > the two hardware exp2 errors in the threshold
GAP_A_MAX = Const(16384.0)
GAP_A_PAD = Const(256.0)
GAP_SCALE = Const(2.0 ** -21)  # 2E = (A + 256) * 2^-21
G_MAX_PAD = Const(16.7)        # > max G = 16.6356 (+ rounding), exact-pass tile skip
EXT_FLOOR_Y = Const(27.0)      # TOPR extension: initial thresholds down to y = -27
BIG_ID = Const(2147483647)
NEG_INF = Const(float("-inf"))
LOG2E = Const(1.4426950408889634)

# logits processing (``processing=``): the constexpr PROC is an OR of these (0: none, and the
# kernels compile exactly as without processing)
P_BIAS = Const(1)    # logit bias (has-bias bitmask words + the request's CSR entries)
P_REP = Const(2)     # repetition penalty (seen bitmask)
P_FREQ = Const(4)    # frequency penalty (output counts, read where the seen bit is set)
P_PRES = Const(8)    # presence penalty (idem)
P_KEEP = Const(16)   # keep bitmask: allowed AND NOT banned AND NOT active stop ids
P_PEN = Const(14)    # any penalty: the request's count slot is read

NPF = Const(5)   # float partials per (row, chunk): max z, h1, h2, raw sum, proc sum
NPI = Const(4)   # int partials: argmax id, h1 id, flags (1 nan, 2 overflow), count
NT = 16                 # thresholds per exact-pass search pass


# ---------------------------------------------------------------------------------------------
# shared device helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _row_setup(row, V, tpr, seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
               HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
               HAS_MINP: tl.constexpr, KCAP: tl.constexpr):
    """Row r -> request q = r // tpr; Philox offset offset[q] + r % tpr; the row's mode."""
    q = row // tpr
    seed = tl.load(seed_ptr + q).to(tl.int64)
    offset = tl.load(offset_ptr + q).to(tl.int64) + (row - q * tpr)
    if HAS_T:
        temp = tl.load(temp_ptr + q).to(tl.float32)
    else:
        temp = tl.full([], 1.0, tl.float32)
    sampled = temp > 0.0
    inv_t = P.inv_temperature(temp)
    if HAS_K:
        k = tl.load(topk_ptr + q).to(tl.int64)
    else:
        k = tl.full([], 0, tl.int64)
    k_on = sampled & (k > 0) & (k < V)
    if HAS_P:
        p = tl.load(topp_ptr + q).to(tl.float32)
    else:
        p = tl.full([], 1.0, tl.float32)
    p_on = sampled & (p < 1.0)
    if HAS_MINP:
        mp = tl.load(minp_ptr + q).to(tl.float32)
        mp = tl.where(mp > 1.0, 1.0, mp)   # unvalidated min_p > 1: 1 (a kept set never empty)
    else:
        mp = tl.full([], 0.0, tl.float32)
    mp_on = sampled & (mp > 0.0)
    L = tl.where(mp_on, P.soft_ln(tl.where(mp_on, mp, 1.0)), NEG_INF)
    mode = tl.where(sampled, PLAIN, GREEDY)
    mode = tl.where(mp_on, WINDOW, mode)
    mode = tl.where(k_on | p_on, TOPR, mode)
    mode = tl.where(k_on & (k > KCAP), DIRECT, mode)
    return seed, offset, inv_t, k_on, k, p_on, p, mp_on, L, mode


@triton.jit
def _philox_tile(start, seed, offset, BLOCK: tl.constexpr):
    """Philox words of tokens start .. start + BLOCK - 1 (start % 4 == 0): one Philox4x32-10
    call per 4 tokens, the 4 output lanes interleaved back into token order."""
    cnt = ((start // 4) + tl.arange(0, BLOCK // 4)).to(tl.uint32)
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    o0 = offset.to(tl.uint32)
    o1 = (offset >> 32).to(tl.uint32)
    c3 = tl.full([], P.STREAM_SAMPLE, tl.uint32)
    r0, r1, r2, r3 = P.philox4x32_10(cnt, o0, o1, c3, k0, k1)
    return tl.interleave(tl.interleave(r0, r2), tl.interleave(r1, r3))


@triton.jit
def _lanes_update(z, offs, zm, zi, sl, s2l, inv_t, WANT_LP: tl.constexpr,
                  WANT_PROC: tl.constexpr):
    """Per-lane running max (NaN-sticky: a NaN marks the row invalid) with its lowest id, and
    online exp-sums for the logprobs."""
    up = z > zm
    if WANT_LP:
        fin = z > NEG_INF
        d = z - zm
        e = tl.where(fin, tl.exp(-tl.abs(d)), 0.0)
        sl = tl.where(up, sl * e + 1.0, sl + e)
        if WANT_PROC:
            e2 = tl.where(d == 0.0, 1.0, tl.exp(-(tl.abs(d) * inv_t)))
            e2 = tl.where(fin, e2, 0.0)
            s2l = tl.where(up, s2l * e2 + 1.0, s2l + e2)
    zi = tl.where(up, offs, zi)
    zm = tl.maximum(zm, z, propagate_nan=tl.PropagateNan.ALL)
    return zm, zi, sl, s2l


@triton.jit
def _lanes_store(zm, zi, sl, s2l, inv_t, pf_ptr, pi_ptr, pidx, flags_extra, count,
                 WANT_LP: tl.constexpr):
    """Chunk summary of the per-lane state: max z, its lowest id, flags, exp-sums."""
    nan = tl.max((zm != zm).to(tl.int32), axis=0)
    M = tl.max(zm, axis=0)
    Mi = tl.min(tl.where(zm == M, zi, BIG_ID), axis=0)
    tl.store(pf_ptr + pidx * NPF + 0, M)
    tl.store(pi_ptr + pidx * NPI + 0, Mi)
    tl.store(pi_ptr + pidx * NPI + 2, nan | flags_extra)
    tl.store(pi_ptr + pidx * NPI + 3, count)
    if WANT_LP:
        live = zm > NEG_INF
        S = tl.sum(tl.where(live, sl * tl.exp(zm - M), 0.0), axis=0)
        S2 = tl.sum(tl.where(live, s2l * tl.exp(P.centered(zm, M, inv_t)), 0.0), axis=0)
        tl.store(pf_ptr + pidx * NPF + 3, S)
        tl.store(pf_ptr + pidx * NPF + 4, S2)


@triton.jit
def _top_sorted(keys, K: tl.constexpr, USE_RANK: tl.constexpr):
    """The K largest of ``keys`` along the last axis (int64, distinct where >= 0, -1 = empty),
    descending, padded with -1. GPU: ``tl.topk`` (bitonic). Interpreter: ranks by an all-pairs
    comparison (the bitonic network's many small reductions are slow there) up to 1024 keys
    (the comparison matrix's size limit); same result."""
    if USE_RANK and keys.shape[0] <= 1024:
        rank = tl.sum((keys[None, :] > keys[:, None]).to(tl.int32), axis=1)
        r = tl.arange(0, K)
        hit = (rank[None, :] == r[:, None]) & (keys[None, :] >= 0)
        return tl.max(tl.where(hit, keys[None, :], -1), axis=1)
    else:
        return tl.topk(keys, K)


@triton.jit
def _sort_desc(keys, USE_RANK: tl.constexpr):
    """``keys`` sorted descending (as ``_top_sorted`` with K = all)."""
    if USE_RANK:
        return _top_sorted(keys, keys.shape[0], True)
    else:
        return tl.sort(keys, descending=True)


@triton.jit
def _top4_rows(keys, USE_RANK: tl.constexpr):
    """Per row of keys [G, n]: its 4 largest (as ``_top_sorted``) -> [G, 4]."""
    if USE_RANK:
        rank = tl.sum((keys[:, None, :] > keys[:, :, None]).to(tl.int32), axis=2)
        r = tl.arange(0, 4)
        hit = (rank[:, None, :] == r[None, :, None]) & (keys[:, None, :] >= 0)
        return tl.max(tl.where(hit, keys[:, None, :], -1), axis=2)
    else:
        return tl.topk(keys, 4)


@triton.jit
def _ex2(x, FAST: tl.constexpr):
    """2^x for the pruning test only (any error is inside its slack): the flush-to-zero
    hardware approximation on the GPU, tl.exp2 in the interpreter."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp2(x)

# ---------------------------------------------------------------------------------------------
# logits processing, applied where the kernels read the logits (module docstring)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _proc_ctx(row, tpr, V, bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr,
              pres_ptr, seen_ptr, cnt_ptr, slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots,
              PROC: tl.constexpr):
    """Per-row processing context (request q = row // tpr): its bias entries [b0, b1), its
    penalties, and the rows of its bitmask words / counts (penalty state: slot count_slots[q]).
    Unvalidated inputs never read out of bounds (the CUDA kernels' rules): [b0, b1) is clamped
    into [0, nnz_b], and a slot outside [0, nslots) turns the request's penalties off (pok)."""
    q = (row // tpr).to(tl.int64)
    W = (V + 31) // 32
    b0 = tl.full([], 0, tl.int64)
    b1 = tl.full([], 0, tl.int64)
    r = tl.full([], 1.0, tl.float32)
    f = tl.full([], 0.0, tl.float32)
    pp = tl.full([], 0.0, tl.float32)
    hb_row = hasb_ptr
    seen_row = seen_ptr
    cnt_row = cnt_ptr
    keep_row = keep_ptr
    pok = tl.full([], 0, tl.int1)
    if P_BIAS & PROC:
        b0, b1 = P.csr_range(bias_ip_ptr, q, nnz_b)
        hb_row = hasb_ptr + q * W
    if P_PEN & PROC:
        slot, pok = P.slot_in(slots_ptr, q, nslots)
        seen_row = seen_ptr + slot * W
        cnt_row = cnt_ptr + slot * V
        if P_REP & PROC:
            r = tl.load(rep_ptr + q).to(tl.float32)
        if P_FREQ & PROC:
            f = tl.load(freq_ptr + q).to(tl.float32)
        if P_PRES & PROC:
            pp = tl.load(pres_ptr + q).to(tl.float32)
    if P_KEEP & PROC:
        keep_row = keep_ptr + q * W
    return (b0, b1, r, f, pp, bias_ids_ptr, bias_val_ptr, hb_row, seen_row, cnt_row, keep_row,
            pok, W)


@triton.jit
def _bit(words_row, offs, m):
    """Bit ``offs & 31`` of word ``offs >> 5`` (xgrammar layout), False where not ``m``."""
    w = tl.load(words_row + (offs >> 5), mask=m, other=0)
    return m & (((w >> (offs & 31)) & 1) != 0)


@triton.jit
def _bit_tile(words_row, start, m, W):
    """``_bit`` for a tile ``offs = start + arange(BLOCK)`` with ``start % 32 == 0`` and
    ``BLOCK % 32 == 0``: one load per word (``BLOCK / 32`` words, contiguous) instead of one
    gather per element, expanded to the elements through a ``[BLOCK / 32, 32]`` view."""
    BLOCK: tl.constexpr = m.shape[0]
    wi = (start >> 5) + tl.arange(0, BLOCK // 32)
    w = tl.load(words_row + wi, mask=wi < W, other=0)
    b = tl.reshape((w[:, None] >> tl.arange(0, 32)[None, :]) & 1, [BLOCK])
    return m & (b != 0)


@triton.jit
def _bits(words_row, offs, start, m, W, TILE: tl.constexpr):
    """``_bit_tile`` for tiles (``TILE``, a block of at least 32 elements), else ``_bit``."""
    if TILE and (offs.shape[0] % 32 == 0):
        return _bit_tile(words_row, start, m, W)
    else:
        return _bit(words_row, offs, m)


@triton.jit
def _process(z, offs, m, pc, PROC: tl.constexpr):
    """The processed logits of the raw float32 ``z`` at ids ``offs`` (lanes with ``m`` False
    are don't-care): bias, repetition, frequency, presence, masks, one IEEE float32 operation
    per step (no FMA: the kernels run with ``enable_fp_fusion=False``; IEEE division), exactly
    ``reference.logits_processing.apply``. Reads the bitmask words per element (1/32 of the
    logits' bytes) and the counts / bias entries only where a bit says they matter."""
    return _process_x(z, offs, m, pc, 0, PROC, False, 0, False)


@triton.jit
def _process_x(z, offs, m, pc, ex, PROC: tl.constexpr, EXTRA: tl.constexpr, start,
               TILE: tl.constexpr):
    """``_process`` with, when ``EXTRA``, ``ex`` more output-token occurrences per lane (int32;
    verify: the drafts before the position, ``reference.logits_processing.apply_verify``): those
    ids count as seen and their counts grow by ``ex``. Without ``EXTRA`` the same operations as
    before it existed (the sampler's kernels). ``TILE``: ``offs = start + arange(BLOCK)`` with
    ``start`` a multiple of the block, so the bitmask words of blocks of at least 32 elements are
    read once per 32 elements (``_bit_tile``); the same values."""
    b0, b1, r, f, pp, bids, bvals, hb_row, seen_row, cnt_row, keep_row, pok, W = pc
    if P_BIAS & PROC:
        hb = _bits(hb_row, offs, start, m, W, TILE)
        if tl.max(hb.to(tl.int32), axis=0) > 0:
            bv = tl.zeros(z.shape, tl.float32)
            for e in range(b0, b1):
                bv = tl.where(offs == tl.load(bids + e), tl.load(bvals + e), bv)
            z = tl.where(hb, z + bv, z)
    if P_PEN & PROC:
        sb = _bits(seen_row, offs, start, m & pok, W, TILE)
        sn = sb
        if EXTRA:
            sn = sb | ((ex > 0) & m & pok)
        if P_REP & PROC:
            z = tl.where(sn, tl.where(z > 0.0, tl.math.div_rn(z, r), z * r), z)
        if (P_FREQ | P_PRES) & PROC:
            # output tokens are always seen (the token-count ops keep it so): gather the
            # counts only there
            c = tl.load(cnt_row + offs, mask=sb, other=0)
            if EXTRA:
                c = c + tl.where(m & pok, ex, 0)
            hit = c > 0
            if P_FREQ & PROC:
                z = tl.where(hit, z - f * c.to(tl.float32), z)
            if P_PRES & PROC:
                z = tl.where(hit, z - pp, z)
    if P_KEEP & PROC:
        z = tl.where(_bits(keep_row, offs, start, m, W, TILE), z, NEG_INF)
    return z


@triton.jit
def _zload(row_ptr, start, offs, m, pc, PROC: tl.constexpr):
    """The (processed, when PROC) float32 logits of the tile ``offs = start + arange(BLOCK)``
    (``start`` a multiple of 32); -inf where not ``m``."""
    z = tl.load(row_ptr + offs, mask=m, other=NEG_INF).to(tl.float32)
    if PROC != 0:
        z = _process_x(z, offs, m, pc, 0, PROC, False, start, True)
    return z


@triton.jit
def _zload_raw(row_ptr, start, offs, m, pc, rm, rs, WANT_LP: tl.constexpr, PROC: tl.constexpr):
    """K1's read of the tile ``offs = start + arange(BLOCK)`` (``start`` a multiple of 32):
    (processed z, and with processing + logprobs the raw logits' per-lane running max /
    exp-sum, NaN-sticky, for the raw logprobs)."""
    z = tl.load(row_ptr + offs, mask=m, other=NEG_INF).to(tl.float32)
    if PROC != 0:
        if WANT_LP:
            rm, _ri, rs, _s2 = _lanes_update(z, offs, rm, offs, rs, rs, 1.0, True, False)
        z = _process_x(z, offs, m, pc, 0, PROC, False, start, True)
    return z, rm, rs


@triton.jit
def _raw_store(rm, rs, pr_ptr, pidx, WANT_LP: tl.constexpr, PROC: tl.constexpr):
    """Chunk summary of the raw logits (processing + logprobs only): max (NaN if any), exp-sum."""
    if PROC != 0:
        if WANT_LP:
            nan = tl.max((rm != rm).to(tl.int32), axis=0)
            M = tl.max(rm, axis=0)
            S = tl.sum(tl.where(rm > NEG_INF, rs * tl.exp(rm - M), 0.0), axis=0)
            tl.store(pr_ptr + pidx * 2, tl.where(nan != 0, float("nan"), M))
            tl.store(pr_ptr + pidx * 2 + 1, S)


@triton.jit(do_not_specialize=["nnz_x", "nnz_s", "nnz_b"])
def _prep_masks(keep_ptr, hasb_ptr, allowed_ptr, ban_ip_ptr, ban_ids_ptr, min_ptr, nout_ptr,
                stop_ip_ptr, stop_ids_ptr, bias_ip_ptr, bias_ids_ptr, V, nnz_x, nnz_s, nnz_b,
                BUILD_KEEP: tl.constexpr, HAS_ALLOWED: tl.constexpr, HAS_BAN: tl.constexpr,
                HAS_STOP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """Program q: request q's keep words (allowed mask or all ones, then the banned ids and,
    while num_output_tokens < min_tokens, the stop ids cleared) and has-bias words (the bias
    entries' bits). Scratch of the call, one row per request."""
    q = tl.program_id(0).to(tl.int64)
    W = (V + 31) // 32
    _mask_words(keep_ptr + q * W, hasb_ptr + q * W, allowed_ptr + q * W, q, 0, ban_ip_ptr,
                ban_ids_ptr, min_ptr, nout_ptr, stop_ip_ptr, stop_ids_ptr, bias_ip_ptr,
                bias_ids_ptr, V, nnz_x, nnz_s, nnz_b, BUILD_KEEP, HAS_ALLOWED, HAS_BAN, HAS_STOP,
                HAS_BIAS, BLOCK)


@triton.jit
def _mask_words(keep_row, hb_row, allowed_row, q, ahead, ban_ip_ptr, ban_ids_ptr, min_ptr,
                nout_ptr, stop_ip_ptr, stop_ids_ptr, bias_ip_ptr, bias_ids_ptr, V, nnz_x, nnz_s,
                nnz_b, BUILD_KEEP: tl.constexpr, HAS_ALLOWED: tl.constexpr, HAS_BAN: tl.constexpr,
                HAS_STOP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """One row of keep words (``allowed_row`` or all ones, then request q's banned ids and,
    while num_output_tokens + ``ahead`` < min_tokens, its stop ids cleared) and has-bias words
    (request q's bias entries' bits). ``ahead``: 0 for the sampler, the position for verify."""
    W = (V + 31) // 32
    for w0 in range(0, W, BLOCK):
        ww = w0 + tl.arange(0, BLOCK)
        wm = ww < W
        if BUILD_KEEP:
            if HAS_ALLOWED:
                a = tl.load(allowed_row + ww, mask=wm, other=0)
            else:
                a = tl.full([BLOCK], -1, tl.int32)
            tl.store(keep_row + ww, a, mask=wm)
        if HAS_BIAS:
            tl.store(hb_row + ww, tl.zeros([BLOCK], tl.int32), mask=wm)
    tl.debug_barrier()   # the words above are written before the bit updates below
    if BUILD_KEEP:
        if HAS_BAN:
            _csr_bits(keep_row, ban_ip_ptr, ban_ids_ptr, q, V, nnz_x, False, BLOCK)
        if HAS_STOP:
            if tl.load(nout_ptr + q) + ahead < tl.load(min_ptr + q):
                _csr_bits(keep_row, stop_ip_ptr, stop_ids_ptr, q, V, nnz_s, False, BLOCK)
    if HAS_BIAS:
        _csr_bits(hb_row, bias_ip_ptr, bias_ids_ptr, q, V, nnz_b, True, BLOCK)


@triton.jit
def _csr_bits(row, ip_ptr, ids_ptr, q, V, nnz, SET: tl.constexpr, BLOCK: tl.constexpr):
    """Sets (SET) or clears the bits of request q's CSR ids in its word row (atomic: ids may
    share a word); ids outside [0, V) are skipped, the range is clamped into [0, nnz]."""
    e0, e1 = P.csr_range(ip_ptr, q, nnz)
    for b in range(e0, e1, BLOCK):
        e = b + tl.arange(0, BLOCK)
        em = e < e1
        t = tl.load(ids_ptr + e, mask=em, other=0).to(tl.int64)
        ok = em & (t >= 0) & (t < V)
        t = tl.where(ok, t, 0)
        bit = (tl.full([BLOCK], 1, tl.int64) << (t & 31)).to(tl.int32)
        if SET:
            tl.atomic_or(row + (t >> 5), bit, mask=ok, sem="relaxed")
        else:
            tl.atomic_and(row + (t >> 5), ~bit, mask=ok, sem="relaxed")


# ---------------------------------------------------------------------------------------------
# K1: one pass over a chunk of a row
# ---------------------------------------------------------------------------------------------
@triton.jit
def _k1_base(row_ptr, lo, hi, inv_t, pf_ptr, pi_ptr, pidx, pc, pr_ptr, WANT_LP: tl.constexpr,
             BLOCK: tl.constexpr, NSTAGE: tl.constexpr, PROC: tl.constexpr):
    zm = tl.full([BLOCK], NEG_INF, tl.float32)
    zi = tl.zeros([BLOCK], tl.int32)
    sl = tl.zeros([BLOCK], tl.float32)
    s2l = tl.zeros([BLOCK], tl.float32)
    rm = tl.full([BLOCK], NEG_INF, tl.float32)   # raw max / exp-sum (processing + logprobs)
    rs = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(lo, hi, BLOCK, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK)
        z, rm, rs = _zload_raw(row_ptr, start, offs, offs < hi, pc, rm, rs, WANT_LP, PROC)
        zm, zi, sl, s2l = _lanes_update(z, offs, zm, zi, sl, s2l, inv_t, WANT_LP,
                                              False)
    _raw_store(rm, rs, pr_ptr, pidx, WANT_LP, PROC)
    _lanes_store(zm, zi, sl, s2l, inv_t, pf_ptr, pi_ptr, pidx, 0, 0, WANT_LP)


@triton.jit
def _k1_plain(row_ptr, lo, hi, inv_t, seed, offset, pf_ptr, pi_ptr, pidx, pc, pr_ptr,
              WANT_LP: tl.constexpr, BLOCK: tl.constexpr, NSTAGE: tl.constexpr,
              FAST: tl.constexpr, PROC: tl.constexpr):
    zm = tl.full([BLOCK], NEG_INF, tl.float32)
    zi = tl.zeros([BLOCK], tl.int32)
    sl = tl.zeros([BLOCK], tl.float32)
    s2l = tl.zeros([BLOCK], tl.float32)
    rm = tl.full([BLOCK], NEG_INF, tl.float32)   # raw max / exp-sum (processing + logprobs)
    rs = tl.zeros([BLOCK], tl.float32)
    h1 = tl.full([BLOCK], NEG_INF, tl.float32)
    h2 = tl.full([BLOCK], NEG_INF, tl.float32)
    i1 = tl.zeros([BLOCK], tl.int32)
    beta = tl.full([], NEG_INF, tl.float32)
    pruned = tl.full([], 0, tl.int32)
    c1 = inv_t * LOG2E
    for start in tl.range(lo, hi, BLOCK, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK)
        m = offs < hi
        z, rm, rs = _zload_raw(row_ptr, start, offs, m, pc, rm, rs, WANT_LP, PROC)
        zm, zi, sl, s2l = _lanes_update(z, offs, zm, zi, sl, s2l, inv_t, WANT_LP,
                                              True)
        bits = _philox_tile(start, seed, offset, BLOCK)
        u = P.uniform_from_bits(bits)
        # conservative test: can fl(a + G) reach beta - PRUNE_MARGIN?  (G increasing in u)
        # u >= exp(-exp(a - beta + PRUNE_C)) - delta, exps as 2^x (errors: module docstring)
        th = _ex2(_ex2(z * c1 - (beta - PRUNE_C) * LOG2E, FAST) * (-LOG2E), FAST)
        need = m & (z > NEG_INF) & (u + PRUNE_DELTA >= th)
        if tl.max(need.to(tl.int32), axis=0) > 0:
            h = tl.where(m, z * inv_t + P.gumbel_from_bits(bits), NEG_INF)
            gt = h > h1
            h2 = tl.where(gt, h1, tl.maximum(h2, h))
            i1 = tl.where(gt, offs, i1)
            h1 = tl.where(gt, h, h1)
            beta = tl.maximum(beta, tl.max(h, axis=0))
        else:
            pruned = pruned | 1
    hb = tl.max(h1, axis=0)
    ib = tl.min(tl.where(h1 == hb, i1, BIG_ID), axis=0)
    hs = tl.max(tl.where((h1 == hb) & (i1 == ib), h2, h1), axis=0)
    hs = tl.where(pruned != 0, tl.maximum(hs, beta - PRUNE_MARGIN), hs)
    tl.store(pf_ptr + pidx * NPF + 1, hb)
    tl.store(pf_ptr + pidx * NPF + 2, hs)
    tl.store(pi_ptr + pidx * NPI + 1, ib)
    _raw_store(rm, rs, pr_ptr, pidx, WANT_LP, PROC)
    _lanes_store(zm, zi, sl, s2l, inv_t, pf_ptr, pi_ptr, pidx, 0, 0, WANT_LP)


@triton.jit
def _k1_window(row_ptr, lo, hi, inv_t, L, cbase, slot, pf_ptr, pi_ptr, pidx, pc, pr_ptr,
               WANT_LP: tl.constexpr, BLOCK: tl.constexpr, NSTAGE: tl.constexpr,
               PROC: tl.constexpr):
    zm = tl.full([BLOCK], NEG_INF, tl.float32)
    zi = tl.zeros([BLOCK], tl.int32)
    sl = tl.zeros([BLOCK], tl.float32)
    s2l = tl.zeros([BLOCK], tl.float32)
    rm = tl.full([BLOCK], NEG_INF, tl.float32)   # raw max / exp-sum (processing + logprobs)
    rs = tl.zeros([BLOCK], tl.float32)
    # kept => z >= zmax - W (module docstring); W inflated by 2^-16 for the roundings
    W = (-L / inv_t) * (1.0 + 2.0 ** -16)
    mrun = tl.full([], NEG_INF, tl.float32)
    c = tl.full([], 0, tl.int32)
    ovf = tl.full([], 0, tl.int32)
    for start in tl.range(lo, hi, BLOCK, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK)
        m = offs < hi
        z, rm, rs = _zload_raw(row_ptr, start, offs, m, pc, rm, rs, WANT_LP, PROC)
        zm, zi, sl, s2l = _lanes_update(z, offs, zm, zi, sl, s2l, inv_t, WANT_LP,
                                              False)
        mrun = tl.maximum(mrun, tl.max(z, axis=0))
        thr = (mrun - W) - tl.abs(mrun) * (2.0 ** -20)
        cand = m & (z >= thr) & (z > NEG_INF)
        n = tl.sum(cand.to(tl.int32), axis=0)
        if n > 0:
            if c + n <= slot:
                pos = c + tl.cumsum(cand.to(tl.int32), axis=0) - 1
                tl.store(cbase + pos, P.key56(z, offs), mask=cand)
                c += n
            else:
                ovf = ovf | 2
    _raw_store(rm, rs, pr_ptr, pidx, WANT_LP, PROC)
    _lanes_store(zm, zi, sl, s2l, inv_t, pf_ptr, pi_ptr, pidx, ovf, c, WANT_LP)


@triton.jit
def _k1_topr(row_ptr, lo, hi, inv_t, cbase, slot, S1, pf_ptr, pi_ptr, pk_ptr, pidx, pc, pr_ptr,
             WANT_LP: tl.constexpr, BLOCK_T: tl.constexpr, KSLOT: tl.constexpr,
             USE_RANK: tl.constexpr, NSTAGE: tl.constexpr, DEPTH: tl.constexpr,
             PROC: tl.constexpr):
    zm = tl.full([BLOCK_T], NEG_INF, tl.float32)
    zi = tl.zeros([BLOCK_T], tl.int32)
    sl = tl.zeros([BLOCK_T], tl.float32)
    s2l = tl.zeros([BLOCK_T], tl.float32)
    rm = tl.full([BLOCK_T], NEG_INF, tl.float32)   # raw max / exp-sum (processing + logprobs)
    rs = tl.zeros([BLOCK_T], tl.float32)
    # per lane: the 4 (DEPTH 5: 5) largest keys seen, v0 >= v1 >= v2 >= v3 (>= v4) (ids i0..i4)
    v0 = tl.full([BLOCK_T], NEG_INF, tl.float32)
    v1 = tl.full([BLOCK_T], NEG_INF, tl.float32)
    v2 = tl.full([BLOCK_T], NEG_INF, tl.float32)
    v3 = tl.full([BLOCK_T], NEG_INF, tl.float32)
    i0 = tl.zeros([BLOCK_T], tl.int32)
    i1 = tl.zeros([BLOCK_T], tl.int32)
    i2 = tl.zeros([BLOCK_T], tl.int32)
    i3 = tl.zeros([BLOCK_T], tl.int32)
    v4 = tl.full([BLOCK_T], NEG_INF, tl.float32)   # DEPTH 5 only
    i4 = tl.zeros([BLOCK_T], tl.int32)
    for start in tl.range(lo, hi, BLOCK_T, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK_T)
        z, rm, rs = _zload_raw(row_ptr, start, offs, offs < hi, pc, rm, rs, WANT_LP, PROC)
        zm, zi, sl, s2l = _lanes_update(z, offs, zm, zi, sl, s2l, inv_t, WANT_LP,
                                              False)
        c0 = z > v0
        c1 = z > v1
        c2 = z > v2
        c3 = z > v3
        if DEPTH == 5:
            c4 = z > v4
            v4 = tl.where(c3, v3, tl.where(c4, z, v4))
            i4 = tl.where(c3, i3, tl.where(c4, offs, i4))
        v3 = tl.where(c2, v2, tl.where(c3, z, v3))
        i3 = tl.where(c2, i2, tl.where(c3, offs, i3))
        v2 = tl.where(c1, v1, tl.where(c2, z, v2))
        i2 = tl.where(c1, i1, tl.where(c2, offs, i2))
        v1 = tl.where(c0, v0, tl.where(c1, z, v1))
        i1 = tl.where(c0, i0, tl.where(c1, offs, i1))
        v0 = tl.where(c0, z, v0)
        i0 = tl.where(c0, offs, i0)
    # keys [lanes, 4] (-1: no finite value); with 4 to 7 chunks super-lanes of 2 lanes, with 8
    # or more super-lanes of 8, first (module docstring: the lane width sets how often a row's
    # nucleus runs past the prefix)
    keys = tl.reshape(tl.join(tl.join(_k56(v0, i0), _k56(v1, i1)),
                              tl.join(_k56(v2, i2), _k56(v3, i3))), [BLOCK_T, 4])
    if DEPTH == 5:   # (the host picks it with one chunk per row; the write is exact for any)
        neg = tl.full([BLOCK_T], -1, tl.int64)
        k4 = _k56(v4, i4)
        k5 = tl.reshape(tl.join(keys, tl.reshape(tl.join(tl.join(k4, neg), tl.join(neg, neg)),
                                                 [BLOCK_T, 4])), [8 * BLOCK_T])
        n, tau = _topr_write(k5, tl.max(k4, axis=0), cbase, slot)
    elif S1 >= 8:
        k8 = _top4_rows(tl.reshape(keys, [BLOCK_T // 8, 32]), USE_RANK)
        n, tau = _topr_emit(k8, BLOCK_T // 8, cbase, slot)
    elif S1 >= 4:
        k2 = _top4_rows(tl.reshape(keys, [BLOCK_T // 2, 8]), USE_RANK)
        n, tau = _topr_emit(k2, BLOCK_T // 2, cbase, slot)
    else:
        n, tau = _topr_emit(keys, BLOCK_T, cbase, slot)
    tl.store(pk_ptr + pidx, tau)
    _raw_store(rm, rs, pr_ptr, pidx, WANT_LP, PROC)
    _lanes_store(zm, zi, sl, s2l, inv_t, pf_ptr, pi_ptr, pidx, 0, n, WANT_LP)


@triton.jit
def _k56(v, i):
    return tl.where(v > NEG_INF, P.key56(v, i), -1)


@triton.jit
def _topr_emit(keys, G: tl.constexpr, cbase, slot):
    """keys [G, 4]: each lane's 4 largest keys (-1: none). Every key of the chunk missing from
    them is below tau = max over lanes of the lane's 4th key (-1: the lanes hold every finite
    value), so the keys >= tau are an exact prefix of the chunk's order: write them (when more
    than ``slot``, tau is raised first: ``_topr_write``). Returns (count, tau)."""
    tau = tl.max(tl.min(keys, axis=1), axis=0)
    return _topr_write(tl.reshape(keys, [4 * G]), tau, cbase, slot)


@triton.jit
def _cap_threshold(keys, tau, cap):
    """For int64 keys (distinct where >= 0, -1 = empty) of which more than ``cap`` are >= tau:
    a t > tau with exactly ``cap`` keys >= t (t in (key_(cap+1), key_cap], the cap-th and
    (cap+1)-th largest keys), and that count. A binary search instead of sorting (one block
    reduction per halving): first on the value part of the key (key >> 24, the float's ordered
    bits: about as many steps as bits in which the bounds differ, ~25 for randn rows), then, only
    when the boundary falls among tokens of one value (ties), on the id part of that value's
    keys (24 more). Every key >= t is in ``keys`` whenever every key >= tau is, so the keys >= t
    are still an exact prefix of the order."""
    ok = keys >= 0
    v = keys >> 24
    lo = tau.to(tl.int64) >> 24                       # count(v >= lo) > cap
    hi = (tl.max(keys, axis=0).to(tl.int64) >> 24) + 1  # count(v >= hi) == 0
    lo, hi = _bisect_count(v, ok, lo, hi, cap)
    t = hi << 24                                      # count(>= t) <= cap < count(>= lo << 24)
    n = tl.sum(((keys >= t) & ok).to(tl.int32), axis=0)
    if n < cap:   # the boundary is among the keys of value lo: search their id part
        # (from max(lo << 24, tau), whose count is > cap); distinct keys: the count drops by at
        # most one per step, so count(>= hi) == cap at the end
        lo2, t = _bisect_count(keys, ok, tl.maximum(lo << 24, tau.to(tl.int64)), t, cap)
        n = tl.sum(((keys >= t) & ok).to(tl.int32), axis=0)
    return t, n


@triton.jit
def _bisect_count(v, ok, lo, hi, cap):
    """Given count(v >= lo) > cap >= count(v >= hi) over the lanes ``ok``: the same with
    hi = lo + 1 (one block reduction per halving)."""
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        c = tl.sum(((v >= mid) & ok).to(tl.int32), axis=0)
        over = c > cap
        lo = tl.where(over, mid, lo)
        hi = tl.where(over, hi, mid)
    return lo, hi


@triton.jit
def _topr_write(flat, tau, cbase, slot):
    """Writes the keys of ``flat`` that are >= tau (an exact prefix of the chunk's order) to
    the slot; when more than ``slot``, tau is first raised so that ``slot`` of them remain
    (``_cap_threshold``). Returns (count, tau)."""
    ge = (flat >= tau) & (flat >= 0)
    n = tl.sum(ge.to(tl.int32), axis=0)
    tau = tau.to(tl.int64)
    if n > slot:
        tau, n = _cap_threshold(flat, tau, slot)
        ge = (flat >= tau) & (flat >= 0)
    pos = tl.cumsum(ge.to(tl.int32), axis=0) - 1
    tl.store(cbase + pos, flat, mask=ge)
    return n, tau


@triton.jit(do_not_specialize=["n_rows", "S1", "slot_t", "slot_w", "NW", "tpr", "nnz_b",
                               "nslots"])
def _k1_partial(logits_ptr, stride_row, n_rows, V, chunk, S1, slot_t, slot_w, NW, tpr,
                seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
                pf_ptr, pi_ptr, pk_ptr, cand_ptr,
                bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr, pres_ptr, seen_ptr, cnt_ptr,
                slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots, pr_ptr,
                HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
                HAS_MINP: tl.constexpr, WANT_LP: tl.constexpr,
                BLOCK: tl.constexpr, BLOCK_T: tl.constexpr, KCAP: tl.constexpr,
                KSLOT: tl.constexpr, USE_RANK: tl.constexpr, NSTAGE: tl.constexpr,
                FAST: tl.constexpr, DEPTH: tl.constexpr, PROC: tl.constexpr):
    row = tl.program_id(0)
    s = tl.program_id(1)
    seed, offset, inv_t, k_on, k, p_on, p, mp_on, L, mode = _row_setup(
        row, V, tpr, seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
        HAS_T, HAS_K, HAS_P, HAS_MINP, KCAP)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    lo = s * chunk
    hi = tl.minimum(lo + chunk, V)
    pidx = row.to(tl.int64) * S1 + s
    cand_row = cand_ptr + row.to(tl.int64) * NW
    pc = _proc_ctx(row, tpr, V, bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr,
                   pres_ptr, seen_ptr, cnt_ptr, slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots, PROC)
    if mode == PLAIN:
        _k1_plain(row_ptr, lo, hi, inv_t, seed, offset, pf_ptr, pi_ptr, pidx, pc, pr_ptr,
                  WANT_LP, BLOCK, NSTAGE, FAST, PROC)
    if HAS_MINP:
        if mode == WINDOW:
            _k1_window(row_ptr, lo, hi, inv_t, L, cand_row + s * slot_w, slot_w, pf_ptr,
                       pi_ptr, pidx, pc, pr_ptr, WANT_LP, BLOCK, NSTAGE, PROC)
    if HAS_K or HAS_P:
        if mode == TOPR:
            _k1_topr(row_ptr, lo, hi, inv_t, cand_row + s * slot_t, slot_t, S1, pf_ptr,
                     pi_ptr, pk_ptr, pidx, pc, pr_ptr, WANT_LP, BLOCK_T, KSLOT, USE_RANK,
                     NSTAGE, DEPTH, PROC)
    if (mode == GREEDY) | (mode == DIRECT):
        _k1_base(row_ptr, lo, hi, inv_t, pf_ptr, pi_ptr, pidx, pc, pr_ptr, WANT_LP, BLOCK,
                 NSTAGE, PROC)


# ---------------------------------------------------------------------------------------------
# K2: exact total mass (top-p rows without top-k)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _row_max(pf_ptr, pi_ptr, row, S1, SMAX: tl.constexpr):
    """(zmax, lowest id of zmax, valid) of a row from its K1 chunk summaries."""
    sidx = tl.arange(0, SMAX)
    sm = sidx < S1
    pidx = row.to(tl.int64) * S1 + sidx
    Ms = tl.load(pf_ptr + pidx * NPF, mask=sm, other=NEG_INF)
    Mis = tl.load(pi_ptr + pidx * NPI, mask=sm, other=BIG_ID)
    fl = tl.load(pi_ptr + pidx * NPI + 2, mask=sm, other=0)
    zmax = tl.max(Ms, axis=0)
    amax = tl.min(tl.where(Ms == zmax, Mis, BIG_ID), axis=0)
    nan = tl.max(fl & 1, axis=0)
    valid = (nan == 0) & (zmax > NEG_INF) & (zmax < float("inf"))
    return zmax, amax, valid, Ms, fl, sidx, sm, pidx


@triton.jit(do_not_specialize=["n_rows", "S1", "S2", "tpr", "nnz_b", "nslots"])
def _k2_mass(logits_ptr, stride_row, n_rows, V, chunk2, S1, S2, tpr,
             seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
             pf_ptr, pi_ptr, mass_ptr,
             bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr, pres_ptr, seen_ptr, cnt_ptr,
             slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots, pr_ptr,
             HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
             HAS_MINP: tl.constexpr, BLOCK: tl.constexpr, KCAP: tl.constexpr,
             SMAX: tl.constexpr, NSTAGE: tl.constexpr, PROC: tl.constexpr):
    row = tl.program_id(0)
    s = tl.program_id(1)
    seed, offset, inv_t, k_on, k, p_on, p, mp_on, L, mode = _row_setup(
        row, V, tpr, seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
        HAS_T, HAS_K, HAS_P, HAS_MINP, KCAP)
    zmax, amax, valid, Ms, fl, sidx, sm, pidx = _row_max(pf_ptr, pi_ptr, row, S1, SMAX)
    tot = tl.full([], 0, tl.int64)
    if (mode == TOPR) & p_on & (k_on == 0) & valid:
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row
        pc = _proc_ctx(row, tpr, V, bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr,
                       pres_ptr, seen_ptr, cnt_ptr, slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots, PROC)
        lo = s * chunk2
        hi = tl.minimum(lo + chunk2, V)
        acc = tl.zeros([BLOCK], tl.int64)
        for start in tl.range(lo, hi, BLOCK, num_stages=NSTAGE):
            offs = start + tl.arange(0, BLOCK)
            z = _zload(row_ptr, start, offs, offs < hi, pc, PROC)
            acc += P.mass_fixed(P.centered(z, zmax, inv_t))
        tot = tl.sum(acc, axis=0)
    tl.store(mass_ptr + row.to(tl.int64) * S2 + s, tot)


# ---------------------------------------------------------------------------------------------
# K3: finalize (+ the exact pass)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _winner(kept, y, ids, seed, offset):
    """Exact Gumbel-max over a candidate tile: (token, its exact score, sum of exp(y) over
    kept); no kept token: (BIG_ID, -inf, 0)."""
    bits = P.philox_word(seed, offset, ids, P.STREAM_SAMPLE)
    sc = tl.where(kept, y + P.gumbel_from_bits(bits), NEG_INF)
    best = tl.max(sc, axis=0)
    tok = tl.min(tl.where(kept & (sc == best), ids, BIG_ID), axis=0)
    ksum = tl.sum(tl.where(kept, tl.exp(y), 0.0), axis=0)
    return tok, best, ksum


@triton.jit
def _better(b1, t1, b2, t2):
    """Merge of two (score, token) winners: larger score, ties -> lowest id."""
    upd = (b2 > b1) | ((b2 == b1) & (t2 < t1))
    return tl.where(upd, b2, b1), tl.where(upd, t2, t1)


@triton.jit
def _ge_stats(row_ptr, V, zmax, inv_t, floor_key, t, pc, MASS: tl.constexpr,
              BLOCK: tl.constexpr, NTHR: tl.constexpr, NSTAGE: tl.constexpr,
              PROC: tl.constexpr):
    """For each threshold t[j]: the number (MASS=False) or the fixed-point mass (MASS=True) of
    the row's tokens with compact key >= max(t[j], floor_key). [NTHR] int64."""
    acc = tl.zeros([NTHR], dtype=tl.int64)
    for start in tl.range(0, V, BLOCK, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        z = _zload(row_ptr, start, offs, m, pc, PROC)
        key = P.key32(z) * V + (V - 1 - offs)
        key = tl.where(m & (key >= floor_key), key, -1)
        hit = key[:, None] >= t[None, :]
        if MASS:
            e = P.mass_fixed(P.centered(z, zmax, inv_t))
            acc += tl.sum(tl.where(hit, e[:, None], 0), axis=0)
        else:
            acc += tl.sum(hit.to(tl.int64), axis=0)
    return acc


@triton.jit
def _search(row_ptr, V, zmax, inv_t, floor_key, lo, hi, target, pc, MASS: tl.constexpr,
            BLOCK: tl.constexpr, NTHR: tl.constexpr, NSTAGE: tl.constexpr, PROC: tl.constexpr):
    """The largest t in [lo, hi) with F(t) >= target, F = ``_ge_stats`` (nonincreasing);
    requires F(lo) >= target > F(hi). (NTHR+1)-ary search: one pass over the row per step."""
    j1 = tl.arange(0, NTHR).to(tl.int64) + 1
    while hi - lo > 1:
        step = (hi - lo + NTHR) // (NTHR + 1)
        t = tl.minimum(lo + j1 * step, hi)
        f = _ge_stats(row_ptr, V, zmax, inv_t, floor_key, t, pc, MASS, BLOCK, NTHR, NSTAGE,
                      PROC)
        ok = f >= target
        new_lo = tl.maximum(lo, tl.max(tl.where(ok, t, lo), axis=0))
        new_hi = tl.minimum(hi, tl.min(tl.where(ok, hi, t), axis=0))
        lo = new_lo
        hi = new_hi
    return lo


@triton.jit
def _gumbel_tile(start, offs, y, kept, seed, offset, bar, tok, best, BLOCK: tl.constexpr,
                 FAST: tl.constexpr):
    """Exact Gumbel-max of one tile's kept tokens (y: their processed logits), folded into the
    running (tok, best); tiles come in increasing id order, so a tie keeps the earlier token.
    ``bar`` <= the final winner's score prunes: fl(y + G) <= y + 16.7 for every G of the grid,
    so a tile whose kept max y is below bar - 16.7 skips Philox, and in the exact frame (|y|,
    |bar| small) a token with u < exp(-exp(y - bar + 0.01)) - 2^-19 has fl(y + G) < bar
    (PLAIN's test with a tiny slack), so a tile where every kept token fails that skips G."""
    ymax = tl.max(tl.where(kept, y, NEG_INF), axis=0)
    if ymax + G_MAX_PAD >= bar:
        bits = _philox_tile(start, seed, offset, BLOCK)
        th = _ex2(_ex2((y - (bar - 0.01)) * LOG2E, FAST) * (-LOG2E), FAST)
        need = kept & (P.uniform_from_bits(bits) + PRUNE_DELTA >= th)
        if tl.max(need.to(tl.int32), axis=0) > 0:
            sc = tl.where(kept, y + P.gumbel_from_bits(bits), NEG_INF)
            bm = tl.max(sc, axis=0)
            bi = tl.min(tl.where(kept & (sc == bm), offs, BIG_ID), axis=0)
            if bm > best:
                tok = bi
                best = bm
    return tok, best


@triton.jit
def _exact_row(row_ptr, V, zmax, amax, inv_t, k_on, k, p_on, p, mp_on, L, seed, offset, pc,
               HAS_K: tl.constexpr, HAS_P: tl.constexpr, BLOCK: tl.constexpr,
               NTHR: tl.constexpr, NSTAGE: tl.constexpr, FAST: tl.constexpr,
               PROC: tl.constexpr):
    """The contract computed directly: thresholds on the compact key key32(z) * V + (V-1-id)
    (order-preserving and unique like key56) by counting / fixed-point mass searches, then
    exact scores over the kept keys. Returns (token, sum of exp(y) over the kept set)."""
    maxkey = P.key32(zmax) * V + (V - 1 - amax)
    thr = tl.full([], 0, tl.int64)
    if HAS_K:
        if k_on:
            thr = _search(row_ptr, V, zmax, inv_t, thr, thr, maxkey + 1, k, pc, False, BLOCK,
                          NTHR, NSTAGE, PROC)
    if HAS_P:
        if p_on:
            s_k = tl.max(_ge_stats(row_ptr, V, zmax, inv_t, thr,
                                   thr + tl.zeros([NTHR], tl.int64), pc, True, BLOCK, NTHR,
                                   NSTAGE, PROC), axis=0)
            lim = P.top_p_limit(p, s_k)
            thr = _search(row_ptr, V, zmax, inv_t, thr, thr, maxkey + 1, lim, pc, True, BLOCK,
                          NTHR, NSTAGE, PROC)
    lmin = tl.where(mp_on, L, NEG_INF)
    best = tl.full([], NEG_INF, tl.float32)
    tok = tl.full([], 0, tl.int32)
    ksum = tl.full([], 0.0, tl.float32)
    for start in tl.range(0, V, BLOCK, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        z = _zload(row_ptr, start, offs, m, pc, PROC)
        key = P.key32(z) * V + (V - 1 - offs)
        y = P.centered(z, zmax, inv_t)
        kept = m & (key >= thr) & (y >= lmin)
        ksum += tl.sum(tl.where(kept, tl.exp(y), 0.0), axis=0)
        tok, best = _gumbel_tile(start, offs, y, kept, seed, offset, best, tok, best, BLOCK,
                                 FAST)
    return tok, ksum


@triton.jit
def _ext_stats(row_ptr, V, zmax, inv_t, lastP, t, pc, BLOCK: tl.constexpr,
               NTHR: tl.constexpr, NSTAGE: tl.constexpr, PROC: tl.constexpr):
    """For each threshold t[j] (a key56 value, >= 0): the number and the fixed-point mass of the
    row's finite tokens with key56 in [t[j], lastP). Integer sums (exact, order-independent),
    accumulated per lane ([BLOCK, NTHR]) and reduced once. Returns two [NTHR] int64."""
    cnt = tl.zeros([BLOCK, NTHR], dtype=tl.int32)
    mass = tl.zeros([BLOCK, NTHR], dtype=tl.int64)
    for start in tl.range(0, V, BLOCK, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK)
        z = _zload(row_ptr, start, offs, offs < V, pc, PROC)
        key = P.key56(z, offs)
        key = tl.where((z > NEG_INF) & (key < lastP), key, -1)
        hit = key[:, None] >= t[None, :]
        e = P.mass_fixed(P.centered(z, zmax, inv_t))
        cnt += hit.to(tl.int32)
        mass += tl.where(hit, e[:, None], 0)
    return tl.sum(cnt, axis=0).to(tl.int64), tl.sum(mass, axis=0)


@triton.jit
def _ext_bracket(t, cnt, mass, ok, lo, c_lo, m_lo, hi, c_hi, m_hi):
    """Narrow [lo, hi) (F(lo) reaches the target, F(hi) does not; F = (count, mass) of
    [t, lastP), nonincreasing in t) with the thresholds t (lo < t <= hi) and their F."""
    new_lo = tl.max(tl.where(ok, t, lo), axis=0)
    sel = ok & (t == new_lo)
    c_lo = tl.where(new_lo > lo, tl.max(tl.where(sel, cnt, -1), axis=0), c_lo)
    m_lo = tl.where(new_lo > lo, tl.max(tl.where(sel, mass, -1), axis=0), m_lo)
    new_hi = tl.min(tl.where(ok, hi, t), axis=0)
    sel = (ok == 0) & (t == new_hi)
    c_hi = tl.where(new_hi < hi, tl.max(tl.where(sel, cnt, -1), axis=0), c_hi)
    m_hi = tl.where(new_hi < hi, tl.max(tl.where(sel, mass, -1), axis=0), m_hi)
    return new_lo, c_lo, m_lo, new_hi, c_hi, m_hi


@triton.jit
def _ext_collect(row_ptr, V, zmax, inv_t, lastP, t_lo, t_hi, lmin, seed, offset, bar, scr_ptr,
                 pc, CCAP: tl.constexpr, BLOCK: tl.constexpr, NSTAGE: tl.constexpr,
                 FAST: tl.constexpr, WANT_LP: tl.constexpr, PROC: tl.constexpr):
    """One pass over the row: the finite tokens with key56 in [t_hi, lastP) and y >= lmin (all
    kept) -> exact Gumbel-max (token, score; tiles that cannot reach max(bar, best) skip Philox
    / G as in ``_exact_row``) and sum of exp(y); those with key56 in [t_lo, t_hi) -> their key56
    compacted into scr (at most CCAP of them: the caller checked the count). Returns (token,
    score, exp-sum, number collected)."""
    best = tl.full([], NEG_INF, tl.float32)
    tok = tl.full([], BIG_ID, tl.int32)
    ksum = tl.full([], 0.0, tl.float32)
    n = tl.full([], 0, tl.int32)
    for start in tl.range(0, V, BLOCK, num_stages=NSTAGE):
        offs = start + tl.arange(0, BLOCK)
        z = _zload(row_ptr, start, offs, offs < V, pc, PROC)
        key = P.key56(z, offs)
        fin = (z > NEG_INF) & (key < lastP)
        col = fin & (key >= t_lo) & (key < t_hi)
        nc = tl.sum(col.to(tl.int32), axis=0)
        if nc > 0:
            pos = n + tl.cumsum(col.to(tl.int32), axis=0) - 1
            tl.store(scr_ptr + pos, key, mask=col & (pos < CCAP))
            n += nc
        y = P.centered(z, zmax, inv_t)
        up = fin & (key >= t_hi) & (y >= lmin)
        if WANT_LP:
            ksum += tl.sum(tl.where(up, tl.exp(y), 0.0), axis=0)
        tok, best = _gumbel_tile(start, offs, y, up, seed, offset, tl.maximum(bar, best), tok,
                                 best, BLOCK, FAST)
    return tok, best, ksum, n


@triton.jit
def _topr_extend(row_ptr, V, zmax, inv_t, k_on, k, p_on, p, lim, lmin, seed, offset,
                 top, nP, y, ids, e, bar, scr_ptr, pc,
                 KCAP: tl.constexpr, NTHR: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_X: tl.constexpr, NREF: tl.constexpr, NSTAGE: tl.constexpr,
                 FAST: tl.constexpr, USE_RANK: tl.constexpr, WANT_LP: tl.constexpr,
                 PROC: tl.constexpr):
    """TOPR rows whose kept prefix runs past the end of P (module docstring, "Extension").
    top: P sorted (nP keys; every row key >= its last key lastP is in P), y / ids / e: their
    processed logits, ids and masses (e: all of P, since k > nP or top-k is off), lim: the
    top-p limit (top-p without top-k), bar: the best exact score of P's kept entries (a
    pruning bar; top-k + top-p recompute P's kept set). Returns (ok, token, exp-sum)."""
    r = tl.arange(0, KCAP)
    vr = r < nP
    kp = k_on & p_on
    lastP = tl.max(tl.where(r == nP - 1, top, -1), axis=0)
    massP = tl.sum(e, axis=0)
    k_need = k - nP.to(tl.int64)          # top-k: keys still needed below P (> 0)
    m_need = lim - massP                   # top-p only: mass still needed below P (> 0)
    # initial thresholds: value thresholds (key32(v) << 24 = "z >= v") whose y spread
    # quadratically from y(lastP) to min(-27, y(lastP) - 1) (mass_fixed(y) = 0 below -26.4),
    # then the whole rest of the row (key 0)
    j = tl.arange(0, NTHR)
    g = (j + 1).to(tl.float32) * (1.0 / NTHR)
    g = g * g
    z_last = P.key32_to_float(lastP >> 24)
    T = 1.0 / inv_t
    dz_top = zmax - z_last
    dz_f = tl.maximum(T * EXT_FLOOR_Y, dz_top + T)
    zt = zmax - (dz_top + (dz_f - dz_top) * g)
    t = tl.minimum(P.key32(zt) << 24, lastP)
    t = tl.where(j == NTHR - 1, 0, t)
    cnt, mass = _ext_stats(row_ptr, V, zmax, inv_t, lastP, t, pc, BLOCK_R, NTHR, NSTAGE, PROC)
    ok = tl.where(k_on, cnt >= k_need, mass >= m_need)
    zero = tl.full([], 0, tl.int64)
    lo, c_lo, m_lo, hi, c_hi, m_hi = _ext_bracket(t, cnt, mass, ok, zero - 1, zero, zero, lastP,
                                                  zero, zero)
    # nothing reached (top-k only: fewer than k finite tokens): lo = -1, [lo, hi) empty
    found = lo >= 0
    c_lo = tl.where(found, c_lo, c_hi)
    m_lo = tl.where(found, m_lo, m_hi)
    # refine [lo, hi) uniformly in key space until the keys to collect fit KCAP: [lo, hi)
    # (top-k + top-p: [lo, lastP), S_K needs them all)
    need = tl.where(kp, c_lo, c_lo - c_hi)
    j1 = j.to(tl.int64) + 1
    it = tl.full([], 0, tl.int32)
    while (need > KCAP) & (it < NREF):
        step = (hi - lo + NTHR) // (NTHR + 1)
        t = tl.minimum(lo + j1 * step, hi)
        cnt, mass = _ext_stats(row_ptr, V, zmax, inv_t, lastP, t, pc, BLOCK_R, NTHR, NSTAGE,
                               PROC)
        ok = tl.where(k_on, cnt >= k_need, mass >= m_need)
        lo, c_lo, m_lo, hi, c_hi, m_hi = _ext_bracket(t, cnt, mass, ok, lo, c_lo, m_lo, hi,
                                                      c_hi, m_hi)
        need = tl.where(kp, c_lo, c_lo - c_hi)
        it += 1
    ext_ok = (found | k_on) & (need <= KCAP)
    tok = tl.full([], 0, tl.int32)
    ksum = tl.full([], 0.0, tl.float32)
    if ext_ok:
        # top-k + top-p: collect [lo, lastP), stream nothing; else stream [hi, lastP) (kept
        # by top-k / top-p: F(hi) does not reach the target) and collect [lo, hi)
        u = tl.where(kp, lastP, hi)
        c_u = tl.where(kp, 0, c_hi)
        m_u = tl.where(kp, 0, m_hi)
        tl.debug_barrier()   # every thread is done reading the slots / P before they are reused
        st, sb, ssum, nc = _ext_collect(row_ptr, V, zmax, inv_t, lastP, lo, u, lmin, seed,
                                        offset, tl.where(kp, float("inf"), bar), scr_ptr, pc,
                                        KCAP, BLOCK_X, NSTAGE, FAST, WANT_LP, PROC)
        tl.debug_barrier()
        kc = _sort_desc(tl.load(scr_ptr + r, mask=r < nc, other=-1), USE_RANK)
        vc = r < nc
        yc = P.centered(P.key32_to_float(kc >> 24), zmax, inv_t)
        idc = P.key56_id(kc).to(tl.int32)
        rank = nP.to(tl.int64) + c_u + r
        in_kc = vc & ((rank < k) | (k_on == 0))
        ec = tl.where(in_kc, P.mass_fixed(yc), 0)
        lim2 = lim
        if kp:   # S_K = P + the collected keys of rank < k (below them: rank >= k or mass 0)
            lim2 = P.top_p_limit(p, massP + tl.sum(ec, axis=0))
        in_pc = ((massP + m_u + tl.cumsum(ec, axis=0) - ec) < lim2) | (p_on == 0)
        keptc = in_kc & in_pc & (yc >= lmin)
        keptP = vr & (((tl.cumsum(e, axis=0) - e) < lim2) | (p_on == 0)) & (y >= lmin)
        pt, pb, psum = _winner(keptP, y, ids, seed, offset)
        ct, cb, csum = _winner(keptc, yc, idc, seed, offset)
        best, tok = _better(pb, pt, sb, st)
        best, tok = _better(best, tok, cb, ct)
        ksum = psum + ssum + csum
    return ext_ok, tok, ksum


@triton.jit(do_not_specialize=["n_rows", "S1", "slot_t", "slot_w", "NW", "S2", "tpr",
                               "nnz_b", "nslots"])
def _k3_finalize(logits_ptr, stride_row, n_rows, V, S1, slot_t, slot_w, NW, S2, tpr,
                 seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
                 pf_ptr, pi_ptr, pk_ptr, cand_ptr, mass_ptr,
                 tok_ptr, valid_ptr, lp_ptr, plp_ptr, stats_ptr,
                 bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr, pres_ptr, seen_ptr, cnt_ptr,
                 slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots, pr_ptr,
                 HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
                 HAS_MINP: tl.constexpr, WANT_LP: tl.constexpr,
                 KCAP: tl.constexpr, NP: tl.constexpr, NC: tl.constexpr,
                 SMAX: tl.constexpr, NSTAGE: tl.constexpr, FAST: tl.constexpr,
                 S2MAX: tl.constexpr, BLOCK_X: tl.constexpr, NTHR: tl.constexpr,
                 BLOCK_R: tl.constexpr, NREF: tl.constexpr, USE_RANK: tl.constexpr,
                 STATS: tl.constexpr, PROC: tl.constexpr):
    row = tl.program_id(0)
    seed, offset, inv_t, k_on, k, p_on, p, mp_on, L, mode = _row_setup(
        row, V, tpr, seed_ptr, offset_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr,
        HAS_T, HAS_K, HAS_P, HAS_MINP, KCAP)
    zmax, amax, valid, Ms, fl, sidx, sm, pidx = _row_max(pf_ptr, pi_ptr, row, S1, SMAX)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    pc = _proc_ctx(row, tpr, V, bias_ip_ptr, bias_ids_ptr, bias_val_ptr, rep_ptr, freq_ptr,
                   pres_ptr, seen_ptr, cnt_ptr, slots_ptr, keep_ptr, hasb_ptr, nnz_b, nslots, PROC)
    tok = amax
    ksum = tl.full([], 1.0, tl.float32)
    fallback = tl.full([], 0, tl.int32)
    ext = tl.full([], 0, tl.int32)
    go = valid & (mode != GREEDY)
    if go & (mode == PLAIN):
        h1s = tl.load(pf_ptr + pidx * NPF + 1, mask=sm, other=NEG_INF)
        h2s = tl.load(pf_ptr + pidx * NPF + 2, mask=sm, other=NEG_INF)
        i1s = tl.load(pi_ptr + pidx * NPI + 1, mask=sm, other=BIG_ID)
        hb = tl.max(h1s, axis=0)
        ib = tl.min(tl.where(h1s == hb, i1s, BIG_ID), axis=0)
        hs = tl.max(tl.where((h1s == hb) & (i1s == ib), h2s, h1s), axis=0)
        A = tl.abs(zmax * inv_t)
        ok = (A <= GAP_A_MAX) & (hb - hs > (A + GAP_A_PAD) * GAP_SCALE)
        tok = tl.where(ok, ib, tok)
        fallback = tl.where(ok, 0, 1)
        if WANT_LP:
            S2s = tl.load(pf_ptr + pidx * NPF + 4, mask=sm, other=0.0)
            ksum = tl.sum(tl.where(Ms > NEG_INF, S2s * tl.exp(P.centered(Ms, zmax, inv_t)), 0.0),
                          axis=0)
    if HAS_MINP:
        if go & (mode == WINDOW):
            # the chunks' candidates, compacted NC at a time (chunk of entry j: prefix sums);
            # only chunks whose max is kept can hold a kept key (y is monotone in z): the
            # others' entries and slot overflows are skipped
            live = sm & (P.centered(Ms, zmax, inv_t) >= L)
            cnts = tl.load(pi_ptr + pidx * NPI + 3, mask=live, other=0)
            incl = tl.cumsum(cnts, axis=0)
            total = tl.sum(cnts, axis=0)
            best = tl.full([], NEG_INF, tl.float32)
            wt = tl.full([], BIG_ID, tl.int32)
            wsum = tl.full([], 0.0, tl.float32)
            for c0 in tl.range(0, total, NC):
                j = c0 + tl.arange(0, NC)
                below = incl[None, :] <= j[:, None]
                sj = tl.sum(below.to(tl.int32), axis=1)
                first = tl.max(tl.where(below, incl[None, :], 0), axis=1)
                ent = j < total
                key = tl.load(cand_ptr + row.to(tl.int64) * NW + sj * slot_w + (j - first),
                              mask=ent, other=-1)
                z = P.key32_to_float(key >> 24)
                ids = P.key56_id(key).to(tl.int32)
                y = P.centered(z, zmax, inv_t)
                kept = ent & (y >= L)
                bits = P.philox_word(seed, offset, ids, P.STREAM_SAMPLE)
                sc = tl.where(kept, y + P.gumbel_from_bits(bits), NEG_INF)
                bm = tl.max(sc, axis=0)
                bi = tl.min(tl.where(kept & (sc == bm), ids, BIG_ID), axis=0)
                upd = (bm > best) | ((bm == best) & (bi < wt))
                wt = tl.where(upd, bi, wt)
                best = tl.where(upd, bm, best)
                wsum += tl.sum(tl.where(kept, tl.exp(y), 0.0), axis=0)
            ovf = tl.max(tl.where(live, fl & 2, 0), axis=0)
            tok = tl.where(ovf == 0, wt, tok)
            ksum = wsum
            fallback = tl.where(ovf == 0, 0, 1)
    if HAS_K or HAS_P:
        if go & (mode == TOPR):
            cand_row = cand_ptr + row.to(tl.int64) * NW
            j = tl.arange(0, NP)
            sj = j // slot_t
            cnt = tl.load(pi_ptr + (row.to(tl.int64) * S1 + sj) * NPI + 3, mask=sj < S1,
                          other=0)
            ent = (sj < S1) & ((j - sj * slot_t) < cnt)
            key = tl.load(cand_row + j, mask=ent, other=-1)
            taus = tl.load(pk_ptr + row.to(tl.int64) * S1 + sidx, mask=sm, other=-1)
            tau = tl.max(taus, axis=0)
            # P = the keys >= max tau: an exact prefix of the row's order; compacted into
            # KCAP entries (behind the slots) and sorted
            inP = ent & (key >= tau)
            nstar = tl.sum(inP.to(tl.int32), axis=0)
            r = tl.arange(0, KCAP)
            complete = (tau < 0) & (nstar <= KCAP)
            if nstar > KCAP:   # more than KCAP: a higher bound keeps KCAP (an exact prefix)
                tau, nstar = _cap_threshold(tl.where(ent, key, -1), tau.to(tl.int64), KCAP)
                inP = ent & (key >= tau)
            pos = tl.cumsum(inP.to(tl.int32), axis=0) - 1
            tl.store(cand_row + NP + pos, key, mask=inP)
            tl.debug_barrier()
            top = _sort_desc(tl.load(cand_row + NP + r, mask=r < nstar, other=-1), USE_RANK)
            nP = nstar
            vr = r < nP
            z = P.key32_to_float(top >> 24)
            ids = P.key56_id(top).to(tl.int32)
            y = P.centered(z, zmax, inv_t)
            in_k = (r < k) | (k_on == 0)
            e = tl.where(vr & in_k, P.mass_fixed(y), 0)
            in_p = vr
            s_known = (p_on == 0) | (k_on == 0) | (k <= nP) | complete
            lim = tl.full([], 1, tl.int64)
            if HAS_P:
                if p_on:
                    if k_on:
                        s_tot = tl.sum(e, axis=0)
                    else:
                        s2i = tl.arange(0, S2MAX)
                        s_tot = tl.sum(tl.load(mass_ptr + row.to(tl.int64) * S2 + s2i,
                                               mask=s2i < S2, other=0), axis=0)
                    lim = P.top_p_limit(p, s_tot)
                    before = tl.cumsum(e, axis=0) - e
                    in_p = before < lim
            kept = vr & in_k & in_p & (y >= tl.where(mp_on, L, NEG_INF))
            last_kept = tl.max(tl.where(r == nP - 1, kept.to(tl.int32), 0), axis=0)
            # the prefix ends inside P: P is the whole row, or it holds the top-k set, or its
            # last entry is not kept, or (S_K known) P's mass already reaches the top-p limit
            end_p = p_on & (tl.sum(e, axis=0) >= lim)
            decided = s_known & (complete | (k_on & (k <= nP)) | (last_kept == 0) | end_p)
            wt, wbest, wsum = _winner(kept, y, ids, seed, offset)
            tok = tl.where(decided, wt, tok)
            ksum = wsum
            fallback = tl.where(decided, 0, 1)
            if decided == 0:   # the kept prefix runs past P: extension (module docstring)
                ext = ext | 1
                xok, xt, xsum = _topr_extend(
                    row_ptr, V, zmax, inv_t, k_on, k, p_on, p, lim,
                    tl.where(mp_on, L, NEG_INF), seed, offset, top, nP, y, ids, e, wbest,
                    cand_row, pc, KCAP, NTHR, BLOCK_R, BLOCK_X, NREF, NSTAGE, FAST, USE_RANK,
                    WANT_LP, PROC)
                tok = tl.where(xok, xt, tok)
                ksum = tl.where(xok, xsum, ksum)
                fallback = tl.where(xok, 0, 1)
    if go & (mode == DIRECT):
        fallback = fallback | 1
    if fallback != 0:
        xt, xsum = _exact_row(row_ptr, V, zmax, amax, inv_t, k_on, k, p_on, p, mp_on, L, seed,
                              offset, pc, HAS_K, HAS_P, BLOCK_X, NTHR, NSTAGE, FAST, PROC)
        tok = xt
        ksum = xsum
    if STATS:   # testing: which path decided the row
        tl.store(stats_ptr + row, mode + 16 * fallback + 32 * ext)
    tok = tl.where(valid, tok, 0)
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(valid_ptr + row, valid.to(tl.uint8))
    if WANT_LP:
        if PROC != 0:
            # raw logprob over the unprocessed row (K1's raw summaries); processed: the
            # token's processed logit
            Mr = tl.load(pr_ptr + pidx * 2, mask=sm, other=NEG_INF)
            Sr = tl.load(pr_ptr + pidx * 2 + 1, mask=sm, other=0.0)
            rnan = tl.max((Mr != Mr).to(tl.int32), axis=0)
            rmax = tl.max(Mr, axis=0)
            raw_sum = tl.sum(tl.where(Mr > NEG_INF, Sr * tl.exp(Mr - rmax), 0.0), axis=0)
            rmax = tl.where(rnan != 0, float("nan"), rmax)
            o1 = tok + tl.arange(0, 1)
            zr1 = tl.load(row_ptr + o1).to(tl.float32)
            z_raw = tl.sum(zr1, axis=0)
            z_tok = tl.sum(_process(zr1, o1, o1 < V, pc, PROC), axis=0)
            lp = z_raw - rmax - tl.log(tl.where(valid, raw_sum, 1.0))
        else:
            Ss = tl.load(pf_ptr + pidx * NPF + 3, mask=sm, other=0.0)
            raw_sum = tl.sum(tl.where(Ms > NEG_INF, Ss * tl.exp(Ms - zmax), 0.0), axis=0)
            z_tok = tl.load(row_ptr + tok).to(tl.float32)
            lp = z_tok - zmax - tl.log(tl.where(valid, raw_sum, 1.0))
        plp = P.centered(z_tok, zmax, inv_t) - tl.log(tl.where(valid & go, ksum, 1.0))
        plp = tl.where(mode == GREEDY, 0.0, plp)
        tl.store(lp_ptr + row, tl.where(valid, lp, float("nan")))
        tl.store(plp_ptr + row, tl.where(valid, plp, float("nan")))


# ---------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------
# Testing only: overrides of the launch configuration (keys of ``_config``'s result), e.g.
# {"KCAP": 8, "NP": 64, "BLOCK_T": 16, "S1": 3}. Changes constexprs: recompiles.
_TEST_CONFIG: Optional[dict] = None

# Testing only: with _TEST_CONFIG["stats"], K3 writes per row mode + 16 * (exact pass taken)
# + 32 * (TOPR extension run) (modes: 0 greedy, 1 plain, 2 window, 3 top-k/top-p candidates,
# 4 direct) here: 3 = decided from P, 35 = decided by the extension, 51 = the extension gave up
# (refinement passes beyond NREF) and the exact pass decided, 20 = direct (exact pass).
_LAST_STATS: Optional[torch.Tensor] = None

_SM_COUNT = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _sm_count(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 1
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


_CONFIG_CACHE: dict = {}


def _config(rows: int, V: int, dev: torch.device, topr_possible: bool,
            window_possible: bool) -> dict:
    """Launch configuration: tile sizes (constexpr), chunk counts and sizes (runtime).
    BLOCK_R: lanes of the TOPR extension's count / mass passes ([BLOCK_R, 16] per-lane
    accumulators); NREF: the extension's refinement passes before it gives up. Cached per
    (shape, device, which parameters are given) unless ``_TEST_CONFIG`` overrides it (it would
    otherwise be recomputed on every eager call). The result is read-only."""
    if _TEST_CONFIG:
        return _make_config(rows, V, dev, topr_possible, window_possible)
    key = (rows, V, dev.type, dev.index, topr_possible, window_possible, _interpreting())
    cfg = _CONFIG_CACHE.get(key)
    if cfg is None:
        if len(_CONFIG_CACHE) > 4096:
            _CONFIG_CACHE.clear()
        cfg = _CONFIG_CACHE[key] = _make_config(rows, V, dev, topr_possible, window_possible)
    return cfg


def _make_config(rows: int, V: int, dev: torch.device, topr_possible: bool,
                 window_possible: bool) -> dict:
    if _interpreting():
        block = max(16, min(4096, triton.next_power_of_2(V)))
        cfg = dict(BLOCK=block, BLOCK_T=max(16, min(256, triton.next_power_of_2(V))),
                   KCAP=256, KSLOT=256, NP=1024, NC=256, BLOCK_X=block, BLOCK_R=block,
                   NREF=16, S1=1, S2=1, warps=4,
                   warps_t=4, USE_RANK=True, NSTAGE=1, NSTAGE_X=1, warps_x=4, FAST=False,
                   DEPTH_P=5)
    else:
        sms = _sm_count(dev)
        cfg = dict(BLOCK=1024, BLOCK_T=2048, KCAP=1024, KSLOT=256, NP=2048, NC=128,
                   BLOCK_X=1024, BLOCK_R=256, NREF=16, warps=8, warps_t=16, USE_RANK=False,
                   NSTAGE=3, NSTAGE_X=1, warps_x=8, FAST=True, DEPTH_P=5)
        nb = triton.cdiv(V, cfg["BLOCK"])
        if topr_possible:   # sorted candidate slots: at most 8 chunks
            cfg["S1"] = min(8, _pow2_floor(sms // max(rows, 1)), nb)
        else:               # window candidates: K3 scans [NC, S1] tiles, so at most 64
            cfg["S1"] = max(1, min(triton.cdiv(2 * sms, max(rows, 1)), nb,
                                   64 if window_possible else nb))
        cfg["S2"] = max(1, min(triton.cdiv(2 * sms, max(rows, 1)), nb))
        # bounds of S1 / S2 over every batch size: the constexpr widths SMAX / S2MAX derive
        # from them (not from this call's S1 / S2), so batch sizes never recompile K2 / K3
        cfg["s1_bound"] = 8 if topr_possible else min(2 * sms, nb, 64 if window_possible else nb)
        cfg["s2_bound"] = min(2 * sms, nb)
    if _TEST_CONFIG:
        cfg.update({k: v for k, v in _TEST_CONFIG.items() if k != "stats"})
    blk = max(cfg["BLOCK"], cfg["BLOCK_T"]) if topr_possible else cfg["BLOCK"]
    chunk = triton.cdiv(triton.cdiv(V, max(1, cfg["S1"])), blk) * blk
    cfg["S1"] = max(1, triton.cdiv(V, chunk))
    cfg["chunk"] = chunk
    s1_pad = triton.next_power_of_2(cfg["S1"])
    # candidates per row: TOPR slots (NP) + K3's compaction area (KCAP); WINDOW slots of at
    # least 64 entries per chunk
    cfg["NW"] = max(cfg["NP"] + cfg["KCAP"], 64 * s1_pad)
    cfg["slot_w"] = cfg["NW"] // s1_pad
    cfg["slot_t"] = cfg["NP"] // s1_pad
    assert not topr_possible or cfg["slot_t"] >= cfg["KSLOT"], "TOPR slots below KSLOT"
    cfg["SMAX"] = max(16, s1_pad, triton.next_power_of_2(cfg.get("s1_bound", 1)))
    chunk2 = triton.cdiv(triton.cdiv(V, max(1, cfg["S2"])), cfg["BLOCK"]) * cfg["BLOCK"]
    cfg["S2"] = max(1, triton.cdiv(V, chunk2))
    cfg["chunk2"] = chunk2
    cfg["S2MAX"] = max(16, triton.next_power_of_2(cfg["S2"]),
                       triton.next_power_of_2(cfg.get("s2_bound", 1)))
    return cfg


_PREP_BLOCK = 256


def _processing_args(proc: Optional[list], n: int, V: int, dummy: torch.Tensor):
    """The processing list of ``ops`` (``ops.sampling.PROC_FIELDS``: [] or 16 entries) ->
    (PROC constexpr, the kernels' 11 processing pointers and 2 bounds). Builds the keep / has-bias words
    (``_prep_masks``: one launch, [n, ceil(V / 32)] int32 scratch each) when banned ids,
    min_tokens stop ids or a bias are given; an allowed mask alone is read directly."""
    if not proc:
        return 0, (dummy,) * 11 + (0, 0)
    (bias_ip, bias_ids, bias_val, rep, freq, pres, seen, outc, slots, allowed, ban_ip, ban_ids,
     min_t, n_out, stop_ip, stop_ids) = proc
    dev = dummy.device
    W = (V + 31) // 32
    PROC = P_BIAS.value if bias_ip is not None else 0
    if seen is not None:
        # one kernel variant for every penalty combination: an absent penalty is its neutral
        # value (z / 1 = z * 1 = z, z - 0 * c = z - 0 = z exactly, NaN / -0.0 included)
        PROC |= P_PEN.value
        rep = rep if rep is not None else torch.ones(n, dtype=torch.float32, device=dev)
        freq = freq if freq is not None else torch.zeros(n, dtype=torch.float32, device=dev)
        pres = pres if pres is not None else torch.zeros(n, dtype=torch.float32, device=dev)
    has_ban, has_stop = ban_ip is not None, min_t is not None
    build_keep = has_ban or has_stop
    if allowed is not None or build_keep:
        PROC |= P_KEEP.value
    keep = allowed if (allowed is not None and not build_keep) else dummy
    hasb = dummy
    if build_keep or bias_ip is not None:
        if build_keep:
            keep = torch.empty(n, W, dtype=torch.int32, device=dev)
        if bias_ip is not None:
            hasb = torch.empty(n, W, dtype=torch.int32, device=dev)

        def d(t):
            return t if t is not None else dummy
        launch(_prep_masks, (n,), keep, hasb, d(allowed), d(ban_ip), d(ban_ids), d(min_t),
               d(n_out), d(stop_ip), d(stop_ids), d(bias_ip), d(bias_ids), V,
               _nnz(ban_ids), _nnz(stop_ids), _nnz(bias_ids),
               BUILD_KEEP=build_keep, HAS_ALLOWED=allowed is not None,
               HAS_BAN=has_ban, HAS_STOP=has_stop, HAS_BIAS=bias_ip is not None,
               BLOCK=_PREP_BLOCK)
    ptrs = tuple(t if t is not None else dummy
                 for t in (bias_ip, bias_ids, bias_val, rep, freq, pres, seen, outc, slots))
    # the bounds of unvalidated inputs: bias entries, count slots (_proc_ctx)
    return PROC, ptrs + (keep, hasb, _nnz(bias_ids), 0 if seen is None else seen.shape[0])


def _scratch(dev: torch.device, *parts) -> list:
    """Uninitialized scratch arrays ((numel, dtype) each) as views of one allocation (one
    allocator call instead of one per array: ~2 us of host time each in eager calls), each
    starting on a 128-byte boundary (Triton specializes pointer arguments on 16-byte alignment:
    offsets that moved with the batch size would compile the kernels again)."""
    offs, n = [], 0
    for numel, dtype in parts:
        offs.append(n)
        n += (numel * dtype.itemsize + 127) // 128 * 128
    buf = torch.empty(n, dtype=torch.uint8, device=dev)
    return [buf[o:o + numel * dtype.itemsize].view(dtype)
            for o, (numel, dtype) in zip(offs, parts)]


def _nnz(ids: Optional[torch.Tensor]) -> int:
    return 0 if ids is None else ids.shape[0]


def sample(logits: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor,
           temperature: Optional[torch.Tensor] = None, top_k: Optional[torch.Tensor] = None,
           top_p: Optional[torch.Tensor] = None, min_p: Optional[torch.Tensor] = None,
           tokens_per_request: int = 1, want_logprobs: bool = False,
           processing: Optional[list] = None):
    """Triton backend of ``ops.sample``. Arguments as ``reference.sampling.sample`` (already
    validated by ``ops``: per-request tensors on the logits' device, or None); ``processing``:
    the normalized list of ``ops.sampling.PROC_FIELDS`` ([] / None: none), applied inside every
    read of the logits (constexpr ``PROC``: calls without it compile the kernels unchanged).

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
    has_k, has_p = top_k is not None, top_p is not None
    cfg = _config(rows, V, dev, has_k or has_p, min_p is not None)
    S1, S2, NP = cfg["S1"], cfg["S2"], cfg["NP"]
    topr = has_k or has_p
    want_pr = bool(processing) and want_logprobs
    pf, pi, pk, cand, mass, pr = _scratch(dev, (rows * S1 * 5, torch.float32),
                                          (rows * S1 * 4, torch.int32),
                                          (rows * S1 if topr else 1, torch.int64),
                                          (rows * cfg["NW"] if (topr or min_p is not None) else 1,
                                           torch.int64),
                                          (rows * S2 if has_p else 1, torch.int64),
                                          (rows * S1 * 2 if want_pr else 1, torch.float32))
    stats = pi
    if _TEST_CONFIG and _TEST_CONFIG.get("stats"):
        global _LAST_STATS
        stats = _LAST_STATS = torch.full((rows,), -1, dtype=torch.int32, device=dev)
    dummy = seed
    PROC, proc_ptrs = _processing_args(processing, rows // tokens_per_request, V, pf)
    # raw logits' (max, exp-sum) per chunk: processing + logprobs only
    pr = pr if (PROC and want_logprobs) else pf
    params = (seed, offset,
              temperature if temperature is not None else dummy,
              top_k if top_k is not None else dummy,
              top_p if top_p is not None else dummy,
              min_p if min_p is not None else dummy)
    flags = dict(HAS_T=temperature is not None, HAS_K=has_k, HAS_P=has_p,
                 HAS_MINP=min_p is not None)
    stride = logits.stride(0)
    tpr = tokens_per_request
    warps = cfg["warps"]
    launch(
        _k1_partial, (rows, S1),
        logits, stride, rows, V, cfg["chunk"], S1, cfg["slot_t"], cfg["slot_w"], cfg["NW"], tpr,
        *params, pf, pi, pk, cand, *proc_ptrs, pr, **flags, WANT_LP=want_logprobs,
        BLOCK=cfg["BLOCK"], BLOCK_T=cfg["BLOCK_T"], KCAP=cfg["KCAP"], KSLOT=cfg["KSLOT"],
        USE_RANK=cfg["USE_RANK"], NSTAGE=cfg["NSTAGE"], FAST=cfg["FAST"],
        DEPTH=cfg["DEPTH_P"] if (has_p and not has_k and S1 == 1) else 4, PROC=PROC,
        num_warps=cfg["warps_t"] if topr else warps, enable_fp_fusion=False)
    if has_p:
        launch(
            _k2_mass, (rows, S2),
            logits, stride, rows, V, cfg["chunk2"], S1, S2, tpr, *params, pf, pi, mass,
            *proc_ptrs, pr, **flags, BLOCK=cfg["BLOCK"], KCAP=cfg["KCAP"], SMAX=cfg["SMAX"],
            NSTAGE=cfg["NSTAGE"], PROC=PROC, num_warps=warps, enable_fp_fusion=False)
    launch(
        _k3_finalize, (rows,),
        logits, stride, rows, V, S1, cfg["slot_t"], cfg["slot_w"], cfg["NW"], S2, tpr, *params,
        pf, pi, pk, cand, mass, tokens, valid,
        lp if lp is not None else pf, plp if plp is not None else pf, stats, *proc_ptrs, pr,
        **flags, WANT_LP=want_logprobs, KCAP=cfg["KCAP"], NP=NP, NC=cfg["NC"],
        SMAX=cfg["SMAX"], NSTAGE=cfg["NSTAGE_X"], FAST=cfg["FAST"],
        S2MAX=cfg["S2MAX"], BLOCK_X=cfg["BLOCK_X"], NTHR=NT, BLOCK_R=cfg["BLOCK_R"],
        NREF=cfg["NREF"], USE_RANK=cfg["USE_RANK"],
        STATS=stats is not pi, PROC=PROC,
        num_warps=cfg["warps_x"], enable_fp_fusion=False)
    return tokens, valid.view(torch.bool), lp, plp
