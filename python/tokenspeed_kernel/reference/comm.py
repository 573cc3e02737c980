"""Executable spec of the tensor-parallel all-gather along the hidden / vocab dimension.

Rank ``r`` of a group of ``W`` ranks holds ``x_r[T, w_r]``; every rank gets
``y[T, H] = cat([x_0, ..., x_{W-1}], dim=1)`` with ``H = sum(w)``: rank ``r``'s slice sits at
column offset ``off_r = w_0 + ... + w_{r-1}``. It is a pure copy: the result is bit-exact (NaN
payloads, signed zeros and all) on every backend.

Plain PyTorch only: ``all_gather_hidden`` states the result from the list of slices;
``all_gather_hidden_dist`` computes it with ``torch.distributed.all_gather`` (any backend: gloo on
CPU, NCCL on GPU), padding uneven slices to the widest one.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def column_offsets(widths: Sequence[int]) -> List[int]:
    """Prefix sums ``[0, w_0, w_0 + w_1, ..., H]`` (length ``len(widths) + 1``)."""
    offs = [0]
    for w in widths:
        offs.append(offs[-1] + int(w))
    return offs


def all_gather_hidden(slices: Sequence[torch.Tensor]) -> torch.Tensor:
    """The gathered matrix from every rank's slice: ``torch.cat(slices, dim=1)``.

    Parameters
    ----------
    slices : W tensors ``[T, w_s]`` of one dtype and device (rank order).

    Returns
    -------
    Tensor ``[T, sum(w_s)]``, a new contiguous tensor.
    """
    if len(slices) == 0:
        raise ValueError("slices: need at least one slice")
    t = slices[0].shape[0]
    for i, s in enumerate(slices):
        if s.dim() != 2 or s.shape[0] != t:
            raise ValueError(f"slices[{i}]: must be 2-D with {t} rows, got {tuple(s.shape)}")
        if s.dtype != slices[0].dtype:
            raise ValueError(f"slices[{i}]: dtype {s.dtype} != {slices[0].dtype}")
    return torch.cat(list(slices), dim=1)


def all_gather_hidden_dist(x: torch.Tensor, group=None,
                           widths: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Collective reference: every rank calls it with its own slice ``x[T, w_rank]``.

    ``widths`` (one per rank) defaults to ``[x.shape[1]] * W``. Uneven slices are padded to the
    widest one, gathered with ``torch.distributed.all_gather`` and cut back.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if widths is None:
        widths = [x.shape[1]] * world
    widths = [int(w) for w in widths]
    if len(widths) != world or widths[rank] != x.shape[1]:
        raise ValueError(f"widths: expected {world} widths with widths[{rank}] == {x.shape[1]}, "
                         f"got {widths}")
    wmax = max(widths)
    xp = torch.zeros((x.shape[0], wmax), dtype=x.dtype, device=x.device)
    xp[:, : x.shape[1]] = x
    parts = [torch.empty_like(xp) for _ in range(world)]
    dist.all_gather(parts, xp, group=group)
    return all_gather_hidden([p[:, :w] for p, w in zip(parts, widths)])
