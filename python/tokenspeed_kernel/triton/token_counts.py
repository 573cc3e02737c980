"""Triton kernels of the token-count updates (``ops.admit_requests`` / ``ops.add_output_tokens``;
spec: ``reference/logits_processing.py``).

Fixed-shape, in place, no host sync (CUDA-graph safe): the grids depend only on the shapes.
Seen bits are set with ``atomic_or`` and counts incremented with ``atomic_add``, so duplicates
(the same token twice in one step, a prompt repeating a token) need no ordering. Tokens outside
``[0, V)`` (``-1`` padding; out-of-range ids when the op's validation is off) and rows whose
``valid`` is False are skipped, never written. Without the op's validation nothing is read or
written out of bounds either: a slot outside ``[0, N)`` is skipped (its row does nothing) and
a prompt's entries are ``[clamp(indptr[i], 0, nnz), clamp(indptr[i + 1], that, nnz))``.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .prims import csr_range, slot_in


@triton.jit(do_not_specialize=["N"])
def _clear_rows(seen_ptr, out_ptr, slots_ptr, N, W, V, BLOCK: tl.constexpr):
    # program (i, j): zeroes block j of slot slots[i]'s seen words and output counts
    i = tl.program_id(0)
    j = tl.program_id(1)
    slot, ok = slot_in(slots_ptr, i, N)
    offs = j.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    zero = tl.zeros([BLOCK], tl.int32)
    tl.store(out_ptr + slot * V + offs, zero, mask=(offs < V) & ok)
    tl.store(seen_ptr + slot * W + offs, zero, mask=(offs < W) & ok)


@triton.jit
def _set_seen(seen_ptr, slot, t, keep, W, V):
    # seen[slot, t >> 5] |= 1 << (t & 31) where keep and 0 <= t < V (t int64)
    ok = keep & (t >= 0) & (t < V)
    tc = tl.where(ok, t, 0)
    bit = (tl.full(tc.shape, 1, tl.int64) << (tc & 31)).to(tl.int32)   # bit 31: -2**31
    tl.atomic_or(seen_ptr + slot * W + (tc >> 5), bit, mask=ok, sem="relaxed")
    return ok, tc


@triton.jit(do_not_specialize=["N", "nnz"])
def _mark_prompts(seen_ptr, slots_ptr, ids_ptr, indptr_ptr, N, nnz, W, V, BLOCK: tl.constexpr):
    # program i: the prompt entries indptr[i] .. indptr[i + 1] - 1 of slot slots[i]
    i = tl.program_id(0)
    slot, ok = slot_in(slots_ptr, i, N)
    start, end = csr_range(indptr_ptr, i, nnz)
    end = tl.where(ok, end, start)
    for b in range(start, end, BLOCK):
        e = b + tl.arange(0, BLOCK)
        m = e < end
        t = tl.load(ids_ptr + e, mask=m, other=-1).to(tl.int64)
        _set_seen(seen_ptr, slot, t, m, W, V)


@triton.jit(do_not_specialize=["N"])
def _add_tokens(seen_ptr, out_ptr, tok_ptr, valid_ptr, slots_ptr, N, M, W, V,
                HAS_VALID: tl.constexpr, HAS_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr):
    # program i: row i's M tokens (-1 padding) go to slot slots[i] (or i)
    i = tl.program_id(0)
    slot = i.to(tl.int64)
    row_ok = True
    if HAS_SLOTS:
        slot, row_ok = slot_in(slots_ptr, i, N)
    if HAS_VALID:
        row_ok = row_ok & (tl.load(valid_ptr + i) != 0)
    for b in range(0, M, BLOCK_M):
        k = b + tl.arange(0, BLOCK_M)
        m = (k < M) & row_ok
        t = tl.load(tok_ptr + i.to(tl.int64) * M + k, mask=m, other=-1).to(tl.int64)
        ok, tc = _set_seen(seen_ptr, slot, t, m, W, V)
        tl.atomic_add(out_ptr + slot * V + tc, tl.full([BLOCK_M], 1, tl.int32), mask=ok,
                      sem="relaxed")


_BLOCK = 1024


def admit(seen: torch.Tensor, output: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor,
          indptr: torch.Tensor) -> None:
    """Clears the rows of ``slots`` and marks their prompts seen (arguments checked by ops)."""
    n = slots.numel()
    if n == 0:
        return
    W, V = seen.shape[1], output.shape[1]
    N = seen.shape[0]
    _clear_rows[(n, triton.cdiv(V, _BLOCK))](seen, output, slots, N, W, V, BLOCK=_BLOCK)
    if ids.numel():
        _mark_prompts[(n,)](seen, slots, ids, indptr, N, ids.numel(), W, V, BLOCK=_BLOCK)


def add_tokens(seen: torch.Tensor, output: torch.Tensor, tokens: torch.Tensor,
               valid: Optional[torch.Tensor], slots: Optional[torch.Tensor]) -> None:
    """``tokens`` contiguous ``[n, M]`` (arguments checked by ops)."""
    n, M = tokens.shape
    if n == 0 or M == 0:
        return
    W, V = seen.shape[1], output.shape[1]
    _add_tokens[(n,)](seen, output, tokens, valid if valid is not None else tokens,
                      slots if slots is not None else tokens, seen.shape[0], M, W, V,
                      HAS_VALID=valid is not None, HAS_SLOTS=slots is not None,
                      BLOCK_M=max(16, min(256, triton.next_power_of_2(M))))
