"""Triton P2P push all-gather along the hidden dimension.

Same protocol and workspace as the CUDA kernel (csrc/comm/all_gather_hidden.cuh, docs/COMM.md):
program ``b`` stores chunk ``b`` of this rank's slice into every rank's gather buffer
``epoch & 1`` at the slice's column offset, publishes ``data[b][rank] = epoch`` on every rank
with a release atomic at system scope, waits (acquire, bounded by ``%globaltimer``) until
``data[b][s] >= epoch`` for every source ``s``, copies chunk ``b`` of every source into the
caller's output, and the last program advances the device-side call counter.

Before its flag, program ``b`` also stores the call's header word ``(epoch << 32) | sig`` into
every rank's slot ``hdr[epoch & 1][b][rank]`` (the table the CUDA kernels use; ``sig`` =
``ops.comm.all_gather_signature``); the wait polls the source's header with its flag, and a header
of this call with another signature records ``ERR_MISMATCH`` and skips the copy-out (ranks that
call with different arguments, or with the CUDA backend, fail instead of mixing layouts).

Peer pointers are integers (an int64 table of addresses) turned into typed pointers in the kernel.
The chunking unit here is a (row, BLOCK-column tile) item, not the CUDA kernel's 16-byte vector,
so this kernel publishes its data flags in a region of its own (``FLAG_OFFSET``): ranks that
disagree on the backend of one call time out instead of reading partial data. The call counter
is shared, so calls may alternate between the two backends.

``phase`` (1 = push + publish, 2 = wait + copy-out + advance, 3 = both) lets the CPU tests run
every simulated rank's phase 1 before any phase 2 under ``TRITON_INTERPRET=1``; on a GPU the
op always runs phase 3 in one launch.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ._spin import uniform_load, uniform_time
from .prims import Const

MAX_RANKS = 16        # csrc/comm/all_gather_hidden.cuh kAgMaxRanks (flag slots per block)
FLAG_OFFSET = 2 * 256 * MAX_RANKS   # kAgTritonOffset: this kernel's data flags (uint64 words)
HEADER_OFFSET = 3 * 256 * MAX_RANKS  # kAgHeaderOffset: call headers [2][256][MAX_RANKS]
HEADER_PARITY = 256 * MAX_RANKS      # words per parity of the header table
STATE_SEQ, STATE_ERR, STATE_ERR_BLOCK, STATE_ERR_SRC, STATE_ERR_EPOCH, STATE_DONE = 0, 1, 2, 3, 4, 8
STATE_ERR_SIG, STATE_ERR_PEER_SIG, STATE_ERR_ROWS = 5, 6, 7
STATE_ERR_WIDTH, STATE_ERR_TOTAL, STATE_ERR_VARIANT = 9, 10, 11
ERR_TIMEOUT_DATA, ERR_MISMATCH = 1, 3
SIG_KIND = 2          # kSigAllGatherTriton (recorded in STATE_ERR_VARIANT as kind << 16)
BLOCK = 1024          # elements per (row, tile) item
NUM_WARPS = 4

# the same values as constexpr globals for the kernel
_SEQ = Const(STATE_SEQ)
_ERR = Const(STATE_ERR)
_ERR_BLOCK = Const(STATE_ERR_BLOCK)
_ERR_SRC = Const(STATE_ERR_SRC)
_ERR_EPOCH = Const(STATE_ERR_EPOCH)
_DONE = Const(STATE_DONE)
_TIMEOUT_DATA = Const(ERR_TIMEOUT_DATA)
_MISMATCH = Const(ERR_MISMATCH)
_ERR_SIG = Const(STATE_ERR_SIG)
_ERR_PEER_SIG = Const(STATE_ERR_PEER_SIG)
_ERR_ROWS = Const(STATE_ERR_ROWS)
_ERR_WIDTH = Const(STATE_ERR_WIDTH)
_ERR_TOTAL = Const(STATE_ERR_TOTAL)
_ERR_VARIANT = Const(STATE_ERR_VARIANT)
_LOW32 = Const(0xFFFFFFFF)
_KIND_WORD = Const(SIG_KIND << 16)


@triton.jit
def header_state(h, want):
    """A polled header word against this rank's ``want`` (call_signature.h header_state):
    0 = not this call's yet, 1 = this call's and equal, -1 = this call's with another
    signature."""
    here = ((h ^ want) >> 32) == 0
    return tl.where(here, tl.where(h == want, 1, -1), 0)


@triton.jit(do_not_specialize=["rows", "rank", "timeout_ns", "sig"])
def _all_gather_hidden_kernel(x_ptr, ldx, out_ptr, ldo, peer_data_ptr, peer_flags_ptr,
                              state_ptr, offs_ptr, rows, row_vec, buf_vec, rank, timeout_ns, sig,
                              W: tl.constexpr, VEC: tl.constexpr, BLOCK: tl.constexpr,
                              MAXR: tl.constexpr, FLAG_OFF: tl.constexpr, HDR_OFF: tl.constexpr,
                              HDR_PAR: tl.constexpr, PHASE: tl.constexpr,
                              USE_TIMER: tl.constexpr, MAX_SPINS: tl.constexpr):
    # x_ptr [rows, w_rank] (row stride ldx elements); out_ptr [rows, H] (row stride ldo);
    # peer_data_ptr / peer_flags_ptr: int64 [W] addresses; offs_ptr: int32 [W + 1] column
    # offsets in VEC-element vectors; row_vec = H / VEC; buf_vec = one buffer in vectors;
    # sig: the call signature (int32 bits).
    b = tl.program_id(0)
    G = tl.num_programs(0)
    ety = x_ptr.dtype.element_ty
    # (uniform_load: every value that steers a branch or a loop is the same in all threads;
    # triton/_spin.py says why)
    err0 = uniform_load(state_ptr + _ERR, "gpu")
    epoch = uniform_load(state_ptr + _SEQ, "gpu") + 1
    if err0 == 0:
        buf_base = (epoch % 2) * buf_vec          # int64, in vectors
        cols = tl.arange(0, BLOCK)
        rows64 = rows + tl.zeros((), tl.int64)
        fail = b * 0
        sig64 = sig.to(tl.int64) & _LOW32
        want = ((epoch & _LOW32) << 32) | sig64   # this call's header word
        hdr = HDR_OFF + (epoch % 2) * HDR_PAR + b * MAXR
        if PHASE % 2 == 1:
            # ---- push chunk b of my slice to every rank's buffer ----
            my_c0 = tl.load(offs_ptr + rank).to(tl.int64)
            my_w = (tl.load(offs_ptr + rank + 1).to(tl.int64) - my_c0) * VEC
            tiles = tl.cdiv(my_w, BLOCK)
            n = rows64 * tiles
            lo = n * b // G
            hi = n * (b + 1) // G
            it = lo
            while it < hi:  # (not range(lo, hi): the 3.6 interpreter rejects tensor bounds)
                t = it // tiles
                c = (it - t * tiles) * BLOCK + cols
                m = c < my_w
                v = tl.load(x_ptr + t * ldx + c, mask=m)
                dst = (buf_base + t * row_vec + my_c0) * VEC + c
                for q in tl.static_range(W):
                    base = tl.load(peer_data_ptr + q).to(tl.pointer_type(ety))
                    base = tl.multiple_of(base, 16)
                    tl.store(base + dst, v, mask=m)
                it += 1
            tl.debug_barrier()  # all threads' stores precede the release below
            for q in tl.static_range(W):
                fq = tl.load(peer_flags_ptr + q).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(fq + hdr + rank, want, sem="relaxed", scope="sys")
                tl.atomic_xchg(fq + FLAG_OFF + b * MAXR + rank, epoch, sem="release",
                               scope="sys")
        if PHASE >= 2:
            # ---- wait for data[b][s] >= epoch and s's header of this call (bounded) ----
            my_flags = tl.load(peer_flags_ptr + rank).to(tl.pointer_type(tl.int64))
            for s in tl.static_range(W):
                fl = my_flags + FLAG_OFF + b * MAXR + s
                hp = my_flags + hdr + s
                h = uniform_load(hp, "sys")
                cur = tl.atomic_add(fl, 0, sem="acquire", scope="sys")
                hs = header_state(h, want)
                spins = b * 0
                if hs < 0:
                    spins = -3
                if USE_TIMER:
                    t0 = uniform_time()
                while ((cur < epoch) | (hs == 0)) & (spins >= 0):
                    h = uniform_load(hp, "sys")
                    cur = tl.atomic_add(fl, 0, sem="acquire", scope="sys")
                    hs = header_state(h, want)
                    spins += 1
                    if USE_TIMER:
                        if timeout_ns > 0:
                            if uniform_time() - t0 > timeout_ns:
                                spins = -1
                    else:
                        if spins > MAX_SPINS:
                            spins = -1
                    if uniform_load(state_ptr + _ERR, "gpu") != 0:
                        spins = -1
                    if hs < 0:
                        spins = -3
                if spins < 0:
                    fail = fail | 1
                    zero = tl.zeros((), tl.int64)
                    code = tl.where(spins == -3, _MISMATCH, _TIMEOUT_DATA)
                    old = tl.atomic_cas(state_ptr + _ERR, zero, zero + code)
                    if old == 0:
                        tl.store(state_ptr + _ERR_BLOCK, b.to(tl.int64))
                        tl.store(state_ptr + _ERR_SRC, s + zero)
                        tl.store(state_ptr + _ERR_EPOCH, epoch)
                        if spins == -3:
                            my_c0 = tl.load(offs_ptr + rank).to(tl.int64)
                            tl.store(state_ptr + _ERR_SIG, sig64)
                            tl.store(state_ptr + _ERR_PEER_SIG, h & _LOW32)
                            tl.store(state_ptr + _ERR_ROWS, rows64)
                            tl.store(state_ptr + _ERR_WIDTH,
                                     tl.load(offs_ptr + rank + 1).to(tl.int64) - my_c0)
                            tl.store(state_ptr + _ERR_TOTAL, row_vec + zero)
                            tl.store(state_ptr + _ERR_VARIANT, zero + _KIND_WORD)
            tl.debug_barrier()
            # ---- copy chunk b of every source out of the local buffer ----
            if fail == 0:
                my_buf = tl.load(peer_data_ptr + rank).to(tl.pointer_type(ety))
                my_buf = tl.multiple_of(my_buf, 16)
                for s in tl.static_range(W):
                    c0 = tl.load(offs_ptr + s).to(tl.int64)
                    w = (tl.load(offs_ptr + s + 1).to(tl.int64) - c0) * VEC
                    tiles_s = tl.cdiv(w, BLOCK)
                    n_s = rows64 * tiles_s
                    lo_s = n_s * b // G
                    hi_s = n_s * (b + 1) // G
                    it = lo_s
                    while it < hi_s:
                        t = it // tiles_s
                        c = (it - t * tiles_s) * BLOCK + cols
                        m = c < w
                        v = tl.load(my_buf + (buf_base + t * row_vec + c0) * VEC + c, mask=m,
                                    cache_modifier=".cg")
                        tl.store(out_ptr + t * ldo + c0 * VEC + c, v, mask=m)
                        it += 1
            # ---- the last program advances the call counter ----
            old_done = tl.atomic_add(state_ptr + _DONE, 1, sem="acq_rel", scope="gpu")
            if old_done == G - 1:
                tl.store(state_ptr + _DONE, 0)
                tl.store(state_ptr + _SEQ, epoch)


def _signed32(v: int) -> int:
    v = int(v) & 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def all_gather_hidden(x: torch.Tensor, out: torch.Tensor, peer_data: torch.Tensor,
                      peer_flags: torch.Tensor, state: torch.Tensor, offs_vec: torch.Tensor,
                      rank: int, buf_bytes: int, num_blocks: int, timeout_ns: int,
                      phase: int = 3, max_spins: int = 1 << 20, sig: int = 0) -> None:
    """Launch the push all-gather (arguments validated by ``ops.comm``).

    x [T, w_rank] and out [T, H]: last dim contiguous, rows 16-byte aligned. peer_data /
    peer_flags: int64 [W] device tensors of addresses (data region = buffer 0, flag region) of
    every rank. state: the communicator's int64 state. offs_vec: int32 [W + 1] column offsets in
    16-byte vectors. sig: the call's signature (``ops.comm.all_gather_signature`` with
    ``SIG_ALL_GATHER_TRITON``; every rank computes it from its own arguments). Under
    ``TRITON_INTERPRET=1`` the spin is bounded by ``max_spins`` instead of ``%globaltimer``.
    """
    world = peer_data.numel()
    esz = x.element_size()
    vec = 16 // esz
    rows = x.shape[0]
    row_vec = out.shape[1] // vec
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    _all_gather_hidden_kernel[(num_blocks,)](
        x, x.stride(0) if rows > 1 else x.shape[1], out, out.stride(0) if rows > 1 else out.shape[1],
        peer_data, peer_flags, state, offs_vec, rows, row_vec, buf_bytes // 16, rank,
        int(timeout_ns), _signed32(sig),
        W=world, VEC=vec, BLOCK=BLOCK, MAXR=MAX_RANKS, FLAG_OFF=FLAG_OFFSET,
        HDR_OFF=HEADER_OFFSET, HDR_PAR=HEADER_PARITY, PHASE=phase,
        USE_TIMER=not interp,
        MAX_SPINS=max_spins, num_warps=NUM_WARPS)
