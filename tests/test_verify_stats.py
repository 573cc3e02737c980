"""Speculative verify is exact: whatever the draft, the emitted token at every position is
distributed as the processed target distribution p, and the acceptance rate is sum_x min(p, q).

Each trial is one request whose n drafts are sampled from the processed draft distribution q
(``ops.sample`` with an unrelated seed; ngram mode: drafts from an arbitrary rule), verified with
its own seed. Target and draft rows are the same at every position (stride-0 row views on the
GPU), so the token at position j (over the trials that reach j) must follow p.

Counts: 1e6 trials per case on the GPU (CUDA and Triton; TV < 0.005 and chi-square at alpha 1e-3),
fewer on the CPU with the reference (chi-square at alpha 1e-3 and a TV bound scaled to the trial
count). The Triton interpreter is too slow for these counts; test_verify.py checks its tokens are
identical to the reference, draw for draw.

Cases (why):
* ``random``: generic p, q (temperature 0.8).
* ``holes``: q has zero mass where p has mass and vice versa (-inf logits on both sides).
* ``minp``: the min-p filter creates the zeros (kept sets of target and draft differ).
* ``disjoint``: supports do not overlap: nothing is ever accepted, every token is a resample.
* ``same``: q == p: everything is accepted, the last token is the bonus sample.
* ``greedy``: T = 0 (argmax emitted at every position).
* ``topk_topp``: top-k + top-p kept sets.
* ``large``: logits near 1e7 (integers, float32-exact) at T = 3: |z / T| ~ 3.3e6, where a score
  fl(z / T + G) would round the noise to multiples of 0.25; the processed logits are relative to
  the row max (docs/DESIGN.md), so p is the softmax of the exact (z - zmax) / T.
* ``overflow``: integer logits with tied maxima at T = 1e-38: z / T overflows float32 (such a row
  was invalid before the scores became relative to the max), (z - zmax) / T is 0 at the maxima
  and <= -1e38 elsewhere: p (and q) are uniform over the tied maxima, every row valid.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import HAS_CUDA, draws, skip_unless_backend
from tokenspeed_kernel import ops
from tokenspeed_kernel.reference import sampling as rs

ALPHA = 1e-3
DEV = torch.device("cuda") if HAS_CUDA else torch.device("cpu")
V = 61           # odd, small enough that 1e6 trials resolve every bin
N_DRAFT = 3


def _logits(case: str):
    g = torch.Generator().manual_seed(sum(map(ord, case)))
    zt = torch.randn(V, generator=g) * 2.0
    zq = torch.randn(V, generator=g) * 2.0
    kw = {}
    if case == "random":
        kw = {"temperature": 0.8}
    elif case == "holes":
        zq[:10] = float("-inf")            # q = 0 where p has mass
        zt[30:40] = float("-inf")          # p = 0 where q has mass
        zq[30:40] += 3.0
    elif case == "minp":
        kw = {"temperature": 1.2, "min_p": 0.05}
    elif case == "disjoint":
        zt[V // 2:] = float("-inf")
        zq[:V // 2] = float("-inf")
    elif case == "same":
        zq = zt.clone()
    elif case == "greedy":
        kw = {"temperature": 0.0}
    elif case == "topk_topp":
        kw = {"temperature": 0.9, "top_k": 20, "top_p": 0.8}
    elif case == "large":
        zt = 1e7 + torch.round(zt * 3.0)     # integers within ~+-25 of 1e7: exact in float32
        zq = 1e7 + torch.round(zq * 3.0)
        kw = {"temperature": 3.0}
    elif case == "overflow":
        zt = torch.round(zt).clamp(-5, 2)     # several tokens tie at the max of each row
        zq = torch.round(zq).clamp(-5, 2)
        kw = {"temperature": 1e-38}
    return zt, zq, kw


def _params(kw, n, device):
    out = {}
    for k, v in kw.items():
        dt = torch.int32 if k == "top_k" else torch.float32
        out[k] = torch.full((n,), v, dtype=dt, device=device)
    return out


def _probs(z, kw):
    P = {k: torch.tensor([v]) for k, v in kw.items()}
    return rs.probabilities(z[None, :].double().float(), **P)[0].double().numpy()


def _run_trials(case, mode, backend, n_trials, chunk):
    """Returns (tokens [N, n+1] int64 numpy, num_accepted [N], draft tokens [N, n])."""
    zt, zq, kw = _logits(case)
    toks, accs, drafts = [], [], []
    done = 0
    call = 0
    while done < n_trials:
        N = min(chunk, n_trials - done)
        zt_d = zt.to(DEV)
        zq_d = zq.to(DEV)
        tgt = zt_d[None, :].expand(N * (N_DRAFT + 1), V)       # stride-0 rows: no copies
        drf = zq_d[None, :].expand(N * N_DRAFT, V)
        p_d = _params(kw, N, DEV)
        p_rows = {k: v.repeat_interleave(N_DRAFT) for k, v in p_d.items()}
        base = 1_000_003 * (call + 1)
        if mode == "ngram":
            # drafts from an arbitrary rule unrelated to p: token (trial * 7 + j) % 5 * 3
            idx = torch.arange(N * N_DRAFT, device=DEV)
            ids = (idx * 7) % 5 * 3
        else:
            s = ops.sample(drf, torch.arange(N * N_DRAFT, device=DEV) + base * 3,
                           torch.zeros(N * N_DRAFT, dtype=torch.int64, device=DEV),
                           backend="reference" if backend == "reference" else "auto",
                           **p_rows)
            ids = s.tokens
        cu = torch.arange(N + 1, device=DEV) * N_DRAFT
        out = ops.verify(tgt, ids, torch.arange(N, device=DEV) + base,
                         torch.full((N,), 17, dtype=torch.int64, device=DEV), cu_num_draft=cu,
                         draft_logits=drf if mode == "probabilistic" else None, mode=mode,
                         max_num_draft=N_DRAFT, backend=backend, **p_d)
        assert bool(out.valid.all())
        toks.append(out.tokens.cpu())
        accs.append(out.num_accepted.cpu())
        drafts.append(ids.view(N, N_DRAFT).cpu())
        done += N
        call += 1
    return (torch.cat(toks).numpy(), torch.cat(accs).numpy(), torch.cat(drafts).numpy(), zt, zq,
            kw)


def _pooled_chisquare(obs, exp):
    """Chi-square p-value with bins of expected count < 5 pooled together."""
    big = exp >= 5
    o = list(obs[big])
    e = list(exp[big])
    if (~big).any():
        o.append(obs[~big].sum())
        e.append(exp[~big].sum())
    o, e = np.array(o, dtype=np.float64), np.array(e, dtype=np.float64)
    if len(o) < 2:
        return 1.0
    return float(stats.chisquare(o, e * (o.sum() / e.sum())).pvalue)


def _tv_bound(p, n):
    """TV bound: 0.005 at >= 1e6 trials (the GPU target); on the CPU, 4x the expected noise."""
    noise = 0.5 * np.sum(np.sqrt(2.0 * p * (1 - p) / (math.pi * max(n, 1))))
    return max(0.005, 4.0 * noise) if n < 1_000_000 else 0.005


def _check_positions(tokens, acc, p, n_trials):
    for j in range(N_DRAFT + 1):
        reach = acc >= j
        m = int(reach.sum())
        if m < 200:
            continue
        t = tokens[reach, j]
        counts = np.bincount(t, minlength=V).astype(np.float64)
        outside = counts[p == 0].sum()
        assert outside == 0, f"position {j}: {outside} tokens outside the target support"
        emp = counts / m
        tv = 0.5 * np.abs(emp - p).sum()
        bound = _tv_bound(p, m) if m < 1_000_000 else 0.005
        if j == 0:
            assert tv < bound, f"position {j}: TV {tv:.4f} >= {bound:.4f} over {m} trials"
        else:
            assert tv < _tv_bound(p, m), f"position {j}: TV {tv:.4f} over {m} trials"
        pval = _pooled_chisquare(counts[p > 0], p[p > 0] * m)
        assert pval > ALPHA, f"position {j}: chi-square p = {pval:.2e} over {m} trials"


def _backend_list():
    return ["reference", "triton", "cuda"]


CASES = ["random", "holes", "minp", "disjoint", "same", "greedy", "topk_topp", "large",
         "overflow"]


@pytest.mark.parametrize("backend", _backend_list())
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["probabilistic", "ngram"])
def test_verify_emits_target_distribution(backend, case, mode):
    skip_unless_backend(backend, DEV)
    if backend == "triton" and not HAS_CUDA:
        pytest.skip("Triton interpreter: too slow for these counts; test_verify.py checks its "
                    "tokens equal the reference's")
    if mode == "ngram" and case in ("disjoint", "same"):
        pytest.skip("draft distribution irrelevant in ngram mode")
    if backend == "reference":
        n = draws(40_000, 200_000)
    else:
        n = draws(0, 1_000_000)
    chunk = 1 << 18 if HAS_CUDA else 6_000
    tokens, acc, drafts, zt, zq, kw = _run_trials(case, mode, backend, n, chunk)
    p = _probs(zt, kw)
    _check_positions(tokens, acc, p, n)
    # acceptance rate at position 0
    if mode == "probabilistic":
        q = _probs(zq, kw)
        expect = float(np.minimum(p, q).sum())
    else:
        x0 = drafts[:, 0]
        expect = float(p[x0].mean())      # q one-hot: accept with probability p(x)
    rate = float((acc >= 1).mean())
    sd = math.sqrt(max(expect * (1 - expect), 1e-12) / n)
    assert abs(rate - expect) <= 4.5 * sd + 1e-9, \
        f"acceptance {rate:.5f} vs sum min(p, q) = {expect:.5f} (sd {sd:.5f})"
    if case == "disjoint" and mode == "probabilistic":
        assert (acc == 0).all()
    if case == "same" and mode == "probabilistic":
        assert (acc == N_DRAFT).all()
    if case == "greedy":
        assert (tokens[:, 0] == int(np.argmax(p))).all()


@pytest.mark.parametrize("backend", ["reference", "triton", "cuda"])
def test_verify_later_positions_conditional(backend):
    """Given acceptance of position 0, the tokens at position 1 still follow p: the coins of
    different positions are independent (distinct Philox counters)."""
    skip_unless_backend(backend, DEV)
    if not HAS_CUDA and backend != "reference":
        pytest.skip("CPU: reference only")
    n = draws(12_000, 400_000)
    tokens, acc, drafts, zt, zq, kw = _run_trials("random", "probabilistic", backend, n,
                                                  1 << 18 if HAS_CUDA else 6_000)
    p = _probs(zt, kw)
    # position 1 tokens, split by whether position 1's draft was accepted: the union follows p
    reach = acc >= 1
    t = tokens[reach, 1]
    counts = np.bincount(t, minlength=V).astype(np.float64)
    pval = _pooled_chisquare(counts[p > 0], p[p > 0] * reach.sum())
    assert pval > ALPHA
