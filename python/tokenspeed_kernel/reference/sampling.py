"""Reference sampler: plain PyTorch, the executable spec of ``ops.sample``.

Row r belongs to request ``q = r // tokens_per_request`` at position ``j = r % tokens_per_request``
and uses that request's parameters; its Philox offset is ``offset[q] + j``.

Per row (docs/DESIGN.md has the full contract):

1. ``x = float32(z) * fl32(1 / T)`` (T = 0: greedy, ``x = z``, token = max key).
2. Order: key56(x, id) descending (value descending, id ascending). ``m = max x``.
3. top-k: keep rank < k (k <= 0 or k >= V: off).
4. top-p on the top-k-renormalized mass: ``e = mass_fixed(x - m)`` (int64, exact sums),
   ``S_K`` = sum over the top-k set, keep a token iff the mass before it < ``max(1, trunc(p*S_K))``.
5. min-p: keep iff ``x - m >= soft_ln(min_p)`` (min_p = 0: off).
6. token = argmax over kept tokens of ``x + G(seed, offset + j, id)``, ties by lowest id.

Invalid rows (a NaN or +inf processed logit, or no finite one): token 0, valid False, NaN logprobs.
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


def kept_mask(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor):
    """Boolean [R, V] of the tokens each filter chain keeps, for processed logits x (float32).

    Also returns m (row max). Pure integer/fixed-point decisions: identical on every backend.
    """
    R, V = x.shape
    ids = torch.arange(V, device=x.device)
    key = prims.key56(x, ids[None, :])
    sk, order = key.sort(dim=1, descending=True)
    m = x.max(dim=1).values
    xs = prims.key32_to_float(sk >> 24)
    rank = ids[None, :]
    k_eff = torch.where((top_k <= 0) | (top_k >= V), torch.full_like(top_k, V), top_k)
    in_k = rank < k_eff[:, None]
    e = prims.mass_fixed(xs - m[:, None])
    e_k = torch.where(in_k, e, torch.zeros_like(e))
    s_k = e_k.sum(dim=1)
    before = torch.cumsum(e_k, dim=1) - e_k
    lim = prims.top_p_limit(top_p, s_k)
    in_p = torch.where((top_p < 1.0)[:, None], before < lim[:, None], torch.ones_like(in_k))
    mp_on = min_p > 0
    L = prims.soft_ln(torch.where(mp_on, min_p, torch.ones_like(min_p)))
    in_mp = torch.where(mp_on[:, None], (xs - m[:, None]) >= L[:, None], torch.ones_like(in_k))
    kept_sorted = in_k & in_p & in_mp
    kept = torch.zeros_like(kept_sorted).scatter(1, order, kept_sorted)
    return kept, m, order


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
    z = logits.to(torch.float32)
    greedy = ~(T > 0)
    inv_t = prims.inv_temperature(T)
    x = z * inv_t[:, None]
    invalid = torch.isnan(x).any(1) | (x == float("inf")).any(1) | ~(x > float("-inf")).any(1)
    # greedy rows ignore filters (they all keep the max); give them neutral filters
    k = torch.where(greedy, torch.zeros_like(k), k)
    p = torch.where(greedy, torch.ones_like(p), p)
    mp = torch.where(greedy, torch.zeros_like(mp), mp)
    kept, m, order = kept_mask(x, k, p, mp)
    ids = torch.arange(V, device=dev)
    bits = prims.philox_bits(sd[:, None], off[:, None], ids[None, :], prims.STREAM_SAMPLE)
    score = x + prims.gumbel_from_bits(bits)
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
    kept_exp = torch.where(kept, torch.exp(x - m[:, None]), torch.zeros_like(x))
    proc = x.gather(1, tokens[:, None])[:, 0] - m - torch.log(kept_exp.sum(1))
    proc = torch.where(greedy, torch.zeros_like(proc), proc)
    raw = torch.where(invalid, nan, raw)
    proc = torch.where(invalid, nan, proc)
    return tokens, valid, raw, proc


def probabilities(logits, temperature=None, top_k=None, top_p=None, min_p=None,
                  tokens_per_request: int = 1) -> torch.Tensor:
    """Exact processed distribution [R, V] (float64) the sampler draws from (for tests)."""
    R, V = logits.shape
    dev = logits.device
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    seed = zero.expand(R // tokens_per_request)
    T, k, p, mp, _, _ = _gather_params(R, tokens_per_request, temperature, top_k, top_p, min_p,
                                       seed, seed, dev)
    z = logits.to(torch.float32)
    greedy = ~(T > 0)
    x = z * prims.inv_temperature(T)[:, None]
    kept, m, order = kept_mask(x, torch.where(greedy, torch.zeros_like(k), k),
                               torch.where(greedy, torch.ones_like(p), p),
                               torch.where(greedy, torch.zeros_like(mp), mp))
    w = torch.where(kept, torch.exp((x - m[:, None]).double()), torch.zeros_like(x).double())
    probs = w / w.sum(1, keepdim=True)
    onehot = torch.zeros_like(probs).scatter(1, order[:, :1], 1.0)
    return torch.where(greedy[:, None], onehot, probs)
