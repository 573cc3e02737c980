"""Triton fallback of DP sampling's two comm kernels: the vocab -> batch swap and the results
gather.

Same protocol and workspace as the CUDA kernels (csrc/comm/dp_swap.cuh, docs/COMM.md "DP
sampling"); only the swap's partition differs, so its flags live in tables of their own
(``kDpTritonSwapFlags`` / ``kDpTritonReadyFlags``): ranks that disagree on the backend of one
call time out instead of reading partial data. The call counters (state words 0 and 16) are
shared with the CUDA kernels, so calls may alternate between the two backends.

Swap, call ``e`` (= state[0] + 1), program ``b`` of rank ``p`` (the same grid ``G`` on every
rank):

1. entry handshake: publishes ``ready'[b][p] = e`` on every rank (release, system scope) and
   waits for ``ready'[b][d] >= e`` of every rank ``d`` (acquire, bounded): ``d`` has entered
   call ``e``, so it is done with its view of call ``e - 1``;
2. pushes units ``[chunk(b), chunk(b + 1))`` of the ``(row, BLOCK-element tile)`` space of one
   destination block of ``Bl`` rows to every destination ``d``: rows ``d Bl + i`` of x
   (``i < n_d``) go to row ``i``, column ``p w`` of d's swap buffer; then publishes
   ``swap'[b][p] = e`` on every rank;
3. waits for ``swap'[b][s] >= e`` of every ``s``; the last program (done counter, state word 8)
   advances the call counter.

Gather, call ``g`` (= state[16] + 1), one program: pushes this rank's items of every field into
every peer's results buffer ``g & 1`` at section ``p Bl item_bytes`` (its own straight into the
outputs) and publishes ``gather[p] = g`` (the CUDA gather's flag words: one flag per source, no
partition) on every rank; then waits for ``gather[s] >= g`` of every ``s``, copies the peers'
sections out (zeroes them after a failed wait) and advances state[16]. On a poisoned
communicator it zeroes every output and moves nothing (token 0, valid false, logprob 0).

Call headers (csrc/comm/call_signature.h): the swap's program ``b`` stores ``(e << 32) | sig``
into every rank's slot ``hdr[e & 1][b][p]`` before its ready flag and compares every rank's
header of the call in the handshake wait, before it pushes anything (the CUDA swap's table; the
kinds differ, so ranks that disagree on the backend of a swap are told so); the gather stores
``ghdr[g & 1][p]`` before its flag and compares before the copy-out (the CUDA gather's table and
kind: the two gathers are interchangeable). A header of the call with another signature records
``ERR_MISMATCH`` with both signatures, B, rows per rank and the slot / field count.

Bounded waits give up after ``timeout_ns`` (``%globaltimer``; under ``TRITON_INTERPRET=1`` after
``max_spins`` polls instead), record (code, block, source, call) in the state words 1..4 of the
kernel's block and poison the communicator: a later call of either kernel (either backend)
returns at once when state[1] or state[17] is set.

Moves are element-level: the swap moves 2- or 4-byte integers (the logits' bits), the gather
bytes, in vectorized tiles.

``phase`` is a bit mask (1: handshake publish, 2: handshake wait + push + publish, 4: wait +
copy-out + advance; the gather has nothing in phase 1). A GPU launch runs ``phase=7``. The CPU
tests run every simulated rank's phase 1, then every rank's phase 2, then every rank's phase 4
under the interpreter (which runs one program after the other): every wait of a phase is on a
flag that every rank published in an earlier phase, so sequential execution cannot deadlock.

``ops.dp`` uses it only with an explicit ``backend="triton"`` (docs/COMM.md says what has run on
GPUs).
"""
from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from ._spin import uniform_load, uniform_time

# a kernel's state block has the all-gather's layout (csrc/comm/dp_swap.cuh kDpSeq ..): its words
from .comm import (_DONE, _ERR, _ERR_BLOCK, _ERR_EPOCH, _ERR_PEER_SIG, _ERR_ROWS,  # noqa: F401
                   _ERR_SIG, _ERR_SRC, _LOW32, _SEQ, STATE_DONE, STATE_ERR, STATE_ERR_BLOCK,
                   STATE_ERR_EPOCH, STATE_ERR_PEER_SIG, STATE_ERR_ROWS, STATE_ERR_SIG,
                   STATE_ERR_SRC, STATE_SEQ, _signed32, header_state)
from .prims import Const

MAX_RANKS = 16
MAX_BLOCKS = 256
MAX_FIELDS = 8
SLOT_WORDS = MAX_BLOCKS * MAX_RANKS
TRITON_SWAP_FLAGS = 2 * SLOT_WORDS     # kDpTritonSwapFlags (uint64 words of the flag region)
TRITON_READY_FLAGS = 3 * SLOT_WORDS    # kDpTritonReadyFlags
GATHER_FLAGS = 4 * SLOT_WORDS          # kDpGatherFlags
HEADERS = GATHER_FLAGS + 256           # kDpHeaders: swap call headers [2][256][MAX_RANKS]
GATHER_HEADERS = HEADERS + 2 * SLOT_WORDS  # kDpGatherHeaders: gather call headers [2][MAX_RANKS]
GATHER_STATE = 16
STATE_ERR_PER_RANK, STATE_ERR_EXTRA = 9, 10  # kDpErrPerRank, kDpErrExtra
ERR_TIMEOUT_SWAP, ERR_TIMEOUT_READY, ERR_TIMEOUT_GATHER, ERR_MISMATCH = 1, 2, 3, 4
BLOCK = 1024          # elements per (row, tile) unit of the swap; bytes per gather tile
NUM_WARPS = 4
PHASE_ALL = 7

_GSTATE = Const(GATHER_STATE)
_SWAP_FL = Const(TRITON_SWAP_FLAGS)
_READY_FL = Const(TRITON_READY_FLAGS)
_GATHER_FL = Const(GATHER_FLAGS)
_T_SWAP = Const(ERR_TIMEOUT_SWAP)
_T_READY = Const(ERR_TIMEOUT_READY)
_T_GATHER = Const(ERR_TIMEOUT_GATHER)
_MISMATCH = Const(ERR_MISMATCH)
_HDR = Const(HEADERS)
_GHDR = Const(GATHER_HEADERS)
_SLOTS = Const(SLOT_WORDS)
_MAXRANKS = Const(MAX_RANKS)
_ERR_PER_RANK = Const(STATE_ERR_PER_RANK)
_ERR_EXTRA = Const(STATE_ERR_EXTRA)


@triton.jit
def _poisoned(state_ptr):
    # either kernel's error makes the communicator unusable: both check both words
    # (uniform_load: the same in every thread of the program; triton/_spin.py says why)
    e0 = uniform_load(state_ptr + _ERR, "gpu")
    e1 = uniform_load(state_ptr + _GSTATE + _ERR, "gpu")
    return ((e0 != 0) | (e1 != 0)).to(tl.int32)


@triton.jit
def _wait_ge(flag_ptr, target, state_ptr, st_ptr, code, blk, src, timeout_ns, hdr_ptr, want,
             rows, per_rank, extra, USE_TIMER: tl.constexpr, MAX_SPINS: tl.constexpr,
             CHECK_HDR: tl.constexpr):
    """Spin until *flag_ptr >= target (acquire, system scope) and, with CHECK_HDR, until
    *hdr_ptr holds this call's header ``want`` (polled with the flag); bounded by timeout_ns
    (%globaltimer) or MAX_SPINS polls (interpreter), or until this rank recorded an error.
    On giving up, records (code, blk, src, target) in st_ptr[1..4] if no error was recorded
    yet; a header of this call with another signature records ERR_MISMATCH with both
    signatures and (rows, per_rank, extra). Returns 1 on failure, else 0."""
    cur = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    spins = tl.zeros((), tl.int32)
    hs = tl.zeros((), tl.int32) + 1
    h = want
    if CHECK_HDR:
        h = uniform_load(hdr_ptr, "sys")
        hs = header_state(h, want)
        if hs < 0:
            spins = -3
    if USE_TIMER:
        t0 = uniform_time()
    while ((cur < target) | (hs == 0)) & (spins >= 0):
        if CHECK_HDR:
            h = uniform_load(hdr_ptr, "sys")
            hs = header_state(h, want)
        cur = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        spins += 1
        if USE_TIMER:
            if timeout_ns > 0:
                if uniform_time() - t0 > timeout_ns:
                    spins = -1
        else:
            if spins > MAX_SPINS:
                spins = -1
        if _poisoned(state_ptr) != 0:
            spins = -2
        if hs < 0:
            spins = -3
    fail = (spins < 0).to(tl.int32)
    if (spins == -1) | (spins == -3):
        zero = tl.zeros((), tl.int64)
        old = tl.atomic_cas(st_ptr + _ERR, zero, zero + tl.where(spins == -3, _MISMATCH, code))
        if old == 0:
            tl.store(st_ptr + _ERR_BLOCK, blk.to(tl.int64))
            tl.store(st_ptr + _ERR_SRC, src.to(tl.int64))
            tl.store(st_ptr + _ERR_EPOCH, target)
            if spins == -3:
                tl.store(st_ptr + _ERR_SIG, want & _LOW32)
                tl.store(st_ptr + _ERR_PEER_SIG, h & _LOW32)
                tl.store(st_ptr + _ERR_ROWS, rows + zero)
                tl.store(st_ptr + _ERR_PER_RANK, per_rank + zero)
                tl.store(st_ptr + _ERR_EXTRA, extra + zero)
    return fail


@triton.jit(do_not_specialize=["rows", "rows_per_rank", "rank", "timeout_ns", "sig", "slot"])
def _dp_swap_kernel(x_ptr, ldx, peer_recv_ptr, peer_flags_ptr, state_ptr, pitch, shard,
                    rows, rows_per_rank, rank, timeout_ns, sig, slot,
                    W: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
                    PHASE: tl.constexpr, USE_TIMER: tl.constexpr, MAX_SPINS: tl.constexpr,
                    MAXR: tl.constexpr):
    # x_ptr [rows, shard] integer view of the logits (row stride ldx elements);
    # peer_recv_ptr / peer_flags_ptr: int64 [W] addresses (swap buffer of this call's slot, flag
    # region) of every rank; pitch: the swap buffer's row pitch in elements.
    b = tl.program_id(0)
    G = tl.num_programs(0)
    ety = x_ptr.dtype.element_ty
    if _poisoned(state_ptr) == 0:
        epoch = uniform_load(state_ptr + _SEQ, "gpu") + 1
        rank64 = rank + tl.zeros((), tl.int64)
        fail = b * 0
        want = ((epoch & _LOW32) << 32) | (sig.to(tl.int64) & _LOW32)  # this call's header
        hdr = _HDR + (epoch % 2) * _SLOTS + b * MAXR
        if PHASE & 1:
            # ---- entry handshake, publish: header, then ready'[b][rank] = e on every rank ----
            for q in tl.static_range(W):
                fq = tl.load(peer_flags_ptr + q).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(fq + hdr + rank, want, sem="relaxed", scope="sys")
                tl.atomic_xchg(fq + _READY_FL + b * MAXR + rank, epoch, sem="release",
                               scope="sys")
        if PHASE & 2:
            my_flags = tl.load(peer_flags_ptr + rank).to(tl.pointer_type(tl.int64))
            # ---- entry handshake, wait: ready'[b][d] >= e and d's header equal to mine ----
            for d in tl.static_range(W):
                if fail == 0:
                    fail |= _wait_ge(my_flags + _READY_FL + b * MAXR + d, epoch, state_ptr,
                                     state_ptr, _T_READY, b, d + rank64 * 0, timeout_ns,
                                     my_flags + hdr + d, want, rows, rows_per_rank, slot,
                                     USE_TIMER, MAX_SPINS, True)
            if fail == 0:
                # ---- push units [chunk(b), chunk(b + 1)) to every destination ----
                cols = tl.arange(0, BLOCK)
                shard64 = shard + tl.zeros((), tl.int64)
                tiles = tl.cdiv(shard64, BLOCK)
                n = (rows_per_rank + tl.zeros((), tl.int64)) * tiles
                lo = n * b // G
                hi = n * (b + 1) // G
                col_off = rank64 * shard64
                for k in tl.static_range(W):
                    dr = (rank + 1 + k) % W          # peers first, my own rows last
                    nd = rows - dr * rows_per_rank
                    nd = tl.minimum(tl.maximum(nd, 0), rows_per_rank).to(tl.int64) * tiles
                    hid = tl.minimum(hi, nd)
                    base = tl.load(peer_recv_ptr + dr).to(tl.pointer_type(ety))
                    if ALIGNED:
                        base = tl.multiple_of(base, 16)
                    xs = x_ptr + (dr * rows_per_rank).to(tl.int64) * ldx
                    it = lo
                    while it < hid:   # (not range(): the interpreter rejects tensor bounds)
                        t = it // tiles
                        c = (it - t * tiles) * BLOCK + cols
                        m = c < shard64
                        v = tl.load(xs + t * ldx + c, mask=m)
                        tl.store(base + t * pitch + col_off + c, v, mask=m)
                        it += 1
                tl.debug_barrier()  # every thread's stores precede the releases below
                for q in tl.static_range(W):
                    fq = tl.load(peer_flags_ptr + q).to(tl.pointer_type(tl.int64))
                    tl.atomic_xchg(fq + _SWAP_FL + b * MAXR + rank, epoch, sem="release",
                                   scope="sys")
        if PHASE & 4:
            if fail == 0:
                # ---- wait swap'[b][s] >= e for every s, then advance the counter ----
                my_flags2 = tl.load(peer_flags_ptr + rank).to(tl.pointer_type(tl.int64))
                wfail = b * 0
                for s in tl.static_range(W):
                    if wfail == 0:
                        wfail |= _wait_ge(my_flags2 + _SWAP_FL + b * MAXR + s, epoch,
                                          state_ptr, state_ptr, _T_SWAP, b, s + rank64 * 0,
                                          timeout_ns, my_flags2, want, rows, rows_per_rank,
                                          slot, USE_TIMER, MAX_SPINS, False)
                old_done = tl.atomic_add(state_ptr + _DONE, 1, sem="acq_rel", scope="gpu")
                if old_done == G - 1:
                    tl.store(state_ptr + _DONE, 0)
                    tl.store(state_ptr + _SEQ, epoch)


@triton.jit
def _copy_bytes(dst_addr, src_addr, nbytes, BLOCK: tl.constexpr, REMOTE: tl.constexpr):
    dst = dst_addr.to(tl.pointer_type(tl.uint8))
    src = src_addr.to(tl.pointer_type(tl.uint8))
    cols = tl.arange(0, BLOCK)
    i = nbytes * 0
    while i < nbytes:
        o = i + cols
        m = o < nbytes
        if REMOTE:
            v = tl.load(src + o, mask=m, cache_modifier=".cg")
        else:
            v = tl.load(src + o, mask=m)
        tl.store(dst + o, v, mask=m)
        i += BLOCK


@triton.jit
def _zero_bytes(dst_addr, nbytes, BLOCK: tl.constexpr):
    dst = dst_addr.to(tl.pointer_type(tl.uint8))
    cols = tl.arange(0, BLOCK)
    i = nbytes * 0
    while i < nbytes:
        o = i + cols
        tl.store(dst + o, tl.zeros([BLOCK], tl.uint8), mask=o < nbytes)
        i += BLOCK


_TABLE_MAX = 4 * MAX_FIELDS


@triton.jit(do_not_specialize=[f"v{i}" for i in range(_TABLE_MAX)])
def _set_table(tab, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
               v16, v17, v18, v19, v20, v21, v22, v23, v24, v25, v26, v27, v28, v29, v30, v31):
    """tab[i] = v_i: the gather's fields table, from kernel arguments (no host-to-device copy)."""
    tl.store(tab + 0, v0)
    tl.store(tab + 1, v1)
    tl.store(tab + 2, v2)
    tl.store(tab + 3, v3)
    tl.store(tab + 4, v4)
    tl.store(tab + 5, v5)
    tl.store(tab + 6, v6)
    tl.store(tab + 7, v7)
    tl.store(tab + 8, v8)
    tl.store(tab + 9, v9)
    tl.store(tab + 10, v10)
    tl.store(tab + 11, v11)
    tl.store(tab + 12, v12)
    tl.store(tab + 13, v13)
    tl.store(tab + 14, v14)
    tl.store(tab + 15, v15)
    tl.store(tab + 16, v16)
    tl.store(tab + 17, v17)
    tl.store(tab + 18, v18)
    tl.store(tab + 19, v19)
    tl.store(tab + 20, v20)
    tl.store(tab + 21, v21)
    tl.store(tab + 22, v22)
    tl.store(tab + 23, v23)
    tl.store(tab + 24, v24)
    tl.store(tab + 25, v25)
    tl.store(tab + 26, v26)
    tl.store(tab + 27, v27)
    tl.store(tab + 28, v28)
    tl.store(tab + 29, v29)
    tl.store(tab + 30, v30)
    tl.store(tab + 31, v31)


@triton.jit(do_not_specialize=["items", "items_per_rank", "rank", "timeout_ns", "sig"])
def _dp_gather_kernel(src_tab, out_tab, off_tab, ib_tab, peer_res_ptr, peer_flags_ptr,
                      state_ptr, res_bytes, items, items_per_rank, rank, timeout_ns, sig,
                      W: tl.constexpr, NF: tl.constexpr, BLOCK: tl.constexpr,
                      PHASE: tl.constexpr, USE_TIMER: tl.constexpr, MAX_SPINS: tl.constexpr):
    # src_tab / out_tab: int64 [NF] addresses of this rank's items / the outputs of each field;
    # off_tab / ib_tab: int64 [NF] byte offset in a results buffer / item bytes of each field;
    # peer_res_ptr / peer_flags_ptr: int64 [W] addresses (results buffer 0, flag region).
    st = state_ptr + _GSTATE
    if _poisoned(state_ptr) == 0:
        epoch = uniform_load(st + _SEQ, "gpu") + 1
        par_off = (epoch % 2) * res_bytes
        rank64 = rank + tl.zeros((), tl.int64)
        per = items_per_rank + tl.zeros((), tl.int64)
        n_me = tl.minimum(tl.maximum(items - rank64 * per, 0), per)
        want = ((epoch & _LOW32) << 32) | (sig.to(tl.int64) & _LOW32)  # this call's header
        ghdr = _GHDR + (epoch % 2) * _MAXRANKS
        if PHASE & 2:
            # ---- push my items of every field to every rank, publish gather[rank] = g ----
            for f in tl.static_range(NF):
                ib = tl.load(ib_tab + f)
                sec = rank64 * per * ib
                src = tl.load(src_tab + f)
                out = tl.load(out_tab + f)
                off = tl.load(off_tab + f)
                for k in tl.static_range(W):
                    d = (rank + 1 + k) % W
                    peer = tl.load(peer_res_ptr + d)
                    dst = tl.where(d == rank, out + sec, peer + par_off + off + sec)
                    _copy_bytes(dst, src, n_me * ib, BLOCK, False)
            tl.debug_barrier()
            for q in tl.static_range(W):
                fq = tl.load(peer_flags_ptr + q).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(fq + ghdr + rank, want, sem="relaxed", scope="sys")
                tl.atomic_xchg(fq + _GATHER_FL + rank, epoch, sem="release", scope="sys")
        if PHASE & 4:
            # ---- wait gather[s] >= g, copy the peers' sections out, advance ----
            my_flags = tl.load(peer_flags_ptr + rank).to(tl.pointer_type(tl.int64))
            fail = rank * 0
            for s0 in tl.static_range(W):
                if fail == 0:
                    fail |= _wait_ge(my_flags + _GATHER_FL + s0, epoch, state_ptr, st, _T_GATHER,
                                     rank * 0, s0 + rank64 * 0, timeout_ns, my_flags + ghdr + s0,
                                     want, items, items_per_rank, NF, USE_TIMER, MAX_SPINS, True)
            tl.debug_barrier()
            # copy the peers' sections out; after a failed wait zero them instead (the outputs
            # never hold a peer's stale or foreign bytes: token 0, valid false)
            mine = tl.load(peer_res_ptr + rank) + par_off
            for s in tl.static_range(W):
                if s != rank:
                    ns = tl.minimum(tl.maximum(items - s * per, 0), per)
                    for f2 in tl.static_range(NF):
                        ib2 = tl.load(ib_tab + f2)
                        sec2 = s * per * ib2
                        if fail == 0:
                            _copy_bytes(tl.load(out_tab + f2) + sec2,
                                        mine + tl.load(off_tab + f2) + sec2, ns * ib2, BLOCK,
                                        True)
                        else:
                            _zero_bytes(tl.load(out_tab + f2) + sec2, ns * ib2, BLOCK)
            tl.store(st + _SEQ, epoch)
    elif PHASE & 4:
        # poisoned (this call's swap or an earlier call failed): every item invalid
        for f3 in tl.static_range(NF):
            _zero_bytes(tl.load(out_tab + f3), items * tl.load(ib_tab + f3), BLOCK)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def swap(x: torch.Tensor, peer_recv: torch.Tensor, peer_flags: torch.Tensor,
         state: torch.Tensor, rank: int, row_bytes: int, rows_per_rank: int, num_blocks: int,
         timeout_ns: int, phase: int = PHASE_ALL, max_spins: int = 1 << 20,
         block: Optional[int] = None, sig: int = 0, slot: int = 0) -> None:
    """Launch the swap (arguments validated by ``ops.dp``).

    x: ``[B, w]`` logits shard (2- or 4-byte elements, last dim contiguous). peer_recv /
    peer_flags: int64 ``[W]`` tensors of addresses (the call's swap buffer, the flag region) of
    every rank, on x's device. state: the communicator's int64[32]. row_bytes: the swap buffer's
    row pitch (a multiple of 16). ``num_blocks`` (<= 256) must be the same on every rank. sig:
    the call's signature (``ops.dp.swap_signature``, kind ``SIG_DP_SWAP_TRITON``); slot: the swap
    buffer's slot (recorded with a mismatch).
    Under ``TRITON_INTERPRET=1`` a wait gives up after ``max_spins`` polls. ``block``: elements
    per (row, tile) unit (default the module's ``BLOCK``, read at call time).
    """
    world = peer_recv.numel()
    esz = x.element_size()
    if esz not in (2, 4):
        raise ValueError(f"x: 2- or 4-byte elements, got {x.dtype}")
    if not 1 <= num_blocks <= MAX_BLOCKS:
        raise ValueError(f"num_blocks: must be in [1, {MAX_BLOCKS}], got {num_blocks}")
    if row_bytes % 16:
        raise ValueError(f"row_bytes: must be a multiple of 16, got {row_bytes}")
    xi = x.view(torch.int16 if esz == 2 else torch.int32)
    rows, w = xi.shape
    ldx = xi.stride(0) if rows > 1 else w
    aligned = (w * esz) % 16 == 0 and (ldx * esz) % 16 == 0 and xi.data_ptr() % 16 == 0
    interp = _interpreted()
    _dp_swap_kernel[(num_blocks,)](
        xi, ldx, peer_recv, peer_flags, state, row_bytes // esz, w, rows, rows_per_rank, rank,
        int(timeout_ns), _signed32(sig), int(slot), W=world, BLOCK=block or BLOCK, ALIGNED=aligned, PHASE=phase,
        USE_TIMER=not interp, MAX_SPINS=max_spins, MAXR=MAX_RANKS, num_warps=NUM_WARPS)


def gather(src: Sequence[torch.Tensor], out: Sequence[torch.Tensor], res_off: Sequence[int],
           peer_res: torch.Tensor, peer_flags: torch.Tensor, state: torch.Tensor, rank: int,
           res_bytes: int, items: int, items_per_rank: int, timeout_ns: int,
           phase: int = PHASE_ALL, max_spins: int = 1 << 20,
           block: Optional[int] = None, sig: int = 0) -> None:
    """Launch the results gather (arguments validated by ``ops.dp``).

    src[f]: this rank's items of field f (contiguous, ``n_rank`` items); out[f]: ``[items, ...]``
    contiguous outputs; res_off[f]: byte offset of field f in a results buffer (each field's
    region holds ``W items_per_rank`` items). peer_res / peer_flags: int64 ``[W]`` addresses
    (results buffer 0, flag region) of every rank. res_bytes: one results buffer (the parity
    stride). sig: the call's signature (``ops.dp.gather_signature``)."""
    nf = len(src)
    if not 1 <= nf <= MAX_FIELDS or len(out) != nf or len(res_off) != nf:
        raise ValueError(f"fields: 1..{MAX_FIELDS} (src, out, res_off of equal length)")
    world = peer_res.numel()
    dev = state.device
    for t in list(src) + list(out):
        if not t.is_contiguous():
            raise ValueError("gather: src and out tensors must be contiguous")
    ib = [math.prod(o.shape[1:]) * o.element_size() for o in out]
    # the fields' table [4, NF]: written on the device by a kernel whose arguments are the
    # values, so a captured call records no host-to-device copy (CUDA-graph safe)
    vals = ([s.data_ptr() for s in src] + [o.data_ptr() for o in out] + [int(v) for v in res_off]
            + ib)
    tab32 = torch.empty(_TABLE_MAX, dtype=torch.int64, device=dev)
    _set_table[(1,)](tab32, *(vals + [0] * (_TABLE_MAX - len(vals))))
    tab = tab32[:4 * nf].view(4, nf)
    interp = _interpreted()
    _dp_gather_kernel[(1,)](
        tab[0], tab[1], tab[2], tab[3], peer_res, peer_flags, state, res_bytes, items,
        items_per_rank, rank, int(timeout_ns), _signed32(sig), W=world, NF=nf, BLOCK=block or BLOCK,
        PHASE=phase, USE_TIMER=not interp, MAX_SPINS=max_spins, num_warps=NUM_WARPS)
