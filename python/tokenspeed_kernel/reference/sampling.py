"""Reference sampler: plain PyTorch, the executable spec of ``ops.sample``.

Row r belongs to request ``q = r // tokens_per_request`` at position ``j = r % tokens_per_request``
and uses that request's parameters; its Philox offset is ``offset[q] + j``.

Per row (docs/DESIGN.md has the full contract):

1. ``zmax = max z`` (raw logits as float32). Processed logit ``y = fl32(fl32(z - zmax) * fl32(1/T))``
   (``y = 0`` where ``z == zmax``): ``y <= 0``, the max token has ``y = 0``. T = 0: greedy, token
   = the first key.
2. Order: key56(z, id) descending (raw value descending, id ascending): the same order as y's.
3. top-k: keep rank < k (k <= 0 or k >= V: off).
4. top-p on the top-k-renormalized mass: ``e = mass_fixed(y)`` (int64, exact sums),
   ``S_K`` = sum over the top-k set, keep a token iff the mass before it < ``max(1, trunc(p*S_K))``.
5. min-p: keep iff ``y >= soft_ln(min_p)`` (min_p = 0: off).
6. token = argmax over kept tokens of the score ``fl32(y + G(seed, offset + j, id))``, ties by
   lowest id. Scores relative to the row max keep the noise at every magnitude of z / T.

Invalid rows (a NaN or +inf logit, or no finite one): token 0, valid False, NaN logprobs.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import prims


def _gather_params(rows, tokens_per_request, temperature, top_k, top_p, min_p, seed, offset,
                   device):
    req = torch.arange(rows, device=device) // tokens_per_request
    pos = torch.arange(rows, device=device) % tokens_per_request

    def g(t, default, dtype):
        if t is None:
            return torch.full((rows,), default, dtype=dtype, device=device)
        return t.to(device)[req].to(dtype)

    return (g(temperature, 1.0, torch.float32), g(top_k, 0, torch.int64),
            g(top_p, 1.0, torch.float32), g(min_p, 0.0, torch.float32),
            seed.to(device)[req].to(torch.int64), offset.to(device)[req].to(torch.int64) + pos)


def process(logits: torch.Tensor, T: torch.Tensor):
    """Processed rows: (z float32, y float32 [R, V], zmax [R], greedy [R], invalid [R]).

    ``y = centered(z, zmax, fl32(1/T))`` (``prims.centered``); greedy rows (T <= 0 or NaN) get
    ``1/T := 1`` (their y is only used for the kept-set bookkeeping of verify). Invalid: a NaN
    or +inf logit, or no finite logit.
    """
    z = logits.to(torch.float32)
    greedy = ~(T > 0)
    if z.shape[1] == 0 or z.shape[0] == 0:
        zmax = torch.zeros(z.shape[0], dtype=torch.float32, device=z.device)
    else:
        zmax = z.max(dim=1).values
    y = prims.centered(z, zmax[:, None], prims.inv_temperature(T)[:, None])
    invalid = torch.isnan(z).any(1) | (z == float("inf")).any(1) | ~(z > float("-inf")).any(1)
    return z, y, zmax, greedy, invalid


def kept_mask(z: torch.Tensor, y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
              min_p: torch.Tensor):
    """Boolean [R, V] of the tokens each filter chain keeps, for raw logits z (float32) and their
    processed logits y (``process``). Also returns the order (token ids by key56(z) descending).

    Pure integer / fixed-point decisions: identical on every backend.
    """
    R, V = z.shape
    ids = torch.arange(V, device=z.device)
    key = prims.key56(z, ids[None, :])
    order = key.argsort(dim=1, descending=True)
    ys = y.gather(1, order)
    rank = ids[None, :]
    k_eff = torch.where((top_k <= 0) | (top_k >= V), torch.full_like(top_k, V), top_k)
    in_k = rank < k_eff[:, None]
    e = prims.mass_fixed(ys)
    e_k = torch.where(in_k, e, torch.zeros_like(e))
    s_k = e_k.sum(dim=1)
    before = torch.cumsum(e_k, dim=1) - e_k
    lim = prims.top_p_limit(top_p, s_k)
    in_p = torch.where((top_p < 1.0)[:, None], before < lim[:, None], torch.ones_like(in_k))
    # an unvalidated min_p > 1 (inf included) acts as 1: the max tokens (a kept set is never
    # empty); NaN and values <= 0 are off
    min_p = torch.where(min_p > 1, torch.ones_like(min_p), min_p)
    mp_on = min_p > 0
    L = prims.soft_ln(torch.where(mp_on, min_p, torch.ones_like(min_p)))
    in_mp = torch.where(mp_on[:, None], ys >= L[:, None], torch.ones_like(in_k))
    kept_sorted = in_k & in_p & in_mp
    kept = torch.zeros_like(kept_sorted).scatter(1, order, kept_sorted)
    return kept, order


def sample(
    logits: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    temperature: Optional[torch.Tensor] = None,
    top_k: Optional[torch.Tensor] = None,
    top_p: Optional[torch.Tensor] = None,
    min_p: Optional[torch.Tensor] = None,
    tokens_per_request: int = 1,
):
    """Returns (tokens int64 [R], valid bool [R], logprob f32 [R], processed_logprob f32 [R])."""
    R, V = logits.shape
    dev = logits.device
    T, k, p, mp, sd, off = _gather_params(R, tokens_per_request, temperature, top_k, top_p,
                                          min_p, seed, offset, dev)
    z, y, zmax, greedy, invalid = process(logits, T)
    # greedy rows ignore filters (they all keep the max); give them neutral filters
    k = torch.where(greedy, torch.zeros_like(k), k)
    p = torch.where(greedy, torch.ones_like(p), p)
    mp = torch.where(greedy, torch.zeros_like(mp), mp)
    kept, order = kept_mask(z, y, k, p, mp)
    ids = torch.arange(V, device=dev)
    bits = prims.philox_bits(sd[:, None], off[:, None], ids[None, :], prims.STREAM_SAMPLE)
    score = y + prims.gumbel_from_bits(bits)
    neg_inf = torch.full_like(score, float("-inf"))
    score = torch.where(kept, score, neg_inf)
    best = score.max(dim=1, keepdim=True).values
    is_best = kept & (score == best)
    sampled = torch.argmax(is_best.to(torch.int8), dim=1)  # first (lowest id) maximal
    tokens = torch.where(greedy, order[:, 0], sampled)
    tokens = torch.where(invalid, torch.zeros_like(tokens), tokens)
    valid = ~invalid

    nan = torch.full((R,), float("nan"), dtype=torch.float32, device=dev)
    raw = torch.log_softmax(z, dim=1).gather(1, tokens[:, None])[:, 0]
    kept_exp = torch.where(kept, torch.exp(y), torch.zeros_like(y))
    proc = y.gather(1, tokens[:, None])[:, 0] - torch.log(kept_exp.sum(1))
    proc = torch.where(greedy, torch.zeros_like(proc), proc)
    raw = torch.where(invalid, nan, raw)
    proc = torch.where(invalid, nan, proc)
    return tokens, valid, raw, proc


def probabilities(logits, temperature=None, top_k=None, top_p=None, min_p=None,
                  tokens_per_request: int = 1) -> torch.Tensor:
    """Exact processed distribution [R, V] (float64) the sampler draws from (for tests).

    The kept set is the contract's (integer decisions); the weights are the exact softmax of
    ``(z - zmax) / T`` in float64 over it, computed from the float32 logits (not from y), so
    tests compare against the ideal distribution, not against the sampler's own rounding.
    """
    R, V = logits.shape
    dev = logits.device
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    seed = zero.expand(R // tokens_per_request)
    T, k, p, mp, _, _ = _gather_params(R, tokens_per_request, temperature, top_k, top_p, min_p,
                                       seed, seed, dev)
    z, y, zmax, greedy, _ = process(logits, T)
    kept, order = kept_mask(z, y, torch.where(greedy, torch.zeros_like(k), k),
                            torch.where(greedy, torch.ones_like(p), p),
                            torch.where(greedy, torch.zeros_like(mp), mp))
    Td = torch.where(greedy, torch.ones_like(T), T).double()
    y64 = (z.double() - zmax.double()[:, None]) / Td[:, None]
    y64 = torch.where(z.double() == zmax.double()[:, None], torch.zeros_like(y64), y64)
    w = torch.where(kept, torch.exp(y64), torch.zeros_like(y64))
    probs = w / w.sum(1, keepdim=True)
    onehot = torch.zeros_like(probs).scatter(1, order[:, :1], 1.0)
    return torch.where(greedy[:, None], onehot, probs)
