"""Statistical tests of the sampler: the emitted tokens follow the exact processed distribution.

For every filter combination, one logits row is replicated into a large batch whose rows have
different seeds (one Philox key per draw), the tokens are counted, and a chi-square goodness-of-
fit test (alpha = 1e-3, bins with expected count < 5 pooled) compares the counts with
``reference.sampling.probabilities`` -- the exact renormalized kept distribution. Any token
outside the support fails at once. Deterministic cases (greedy, k = 1) must always return the
first token of the order.

Draws: >= 1e6 on a GPU; 4e4 on CPU runs (reference backend) so the suite stays fast. On CPU the
Triton interpreter is too slow for that many draws: there, the two-sample test below checks that
Triton returns the reference's token sequence draw for draw (identical sequences => identical
statistics); on a GPU the chi-square runs on every backend as well.

The cases (chosen to put the boundaries where samplers get them wrong):
* temperature only, top-k, top-p, min-p, top-k + top-p, top-k + top-p + min-p;
* ties exactly at the top-k boundary and inside the top-p boundary group (bf16 and
  integer-valued logits: kept = the lowest ids of the tied group);
* -inf entries (probability 0, never drawn);
* top_p = 0.01 on a flat row (a few tokens survive), k = 1, k = V (= off), min_p near 1;
* greedy (T = 0, a tie at the maximum);
* magnitude: equal logits at 1e7 / -1e30 (|z / T| = 1e30), ulp ladders of logits near
  +-1e30 at |z / T| ~ 3e6 .. 5e6 (with and without filters), T = 1e-6 on [10, 9.999999] (exact: 0.7218 / 0.2782), T = 0.01 on logits of 30..100,
  and a subnormal T whose 1/T overflows (uniform over the tied maxima).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import DEVICE, HAS_CUDA, draws, skip_unless_backend
from tokenspeed_kernel import ops
from tokenspeed_kernel.reference import sampling as ref

# numpy warnings of the Triton interpreter on NaN / inf rows (expected; results are masked)
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

ALPHA = 1e-3


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(V, seed, scale):
    return torch.randn(1, V, generator=_gen(seed)) * scale


def _tie_top_k():
    # values 3 (ids 5, 17), 2 (ids 2, 9, 11, 30, 33), lower elsewhere; k = 4 keeps both 3s and
    # the two lowest-id 2s (ids 2 and 9)
    z = torch.randint(-3, 1, (1, 40), generator=_gen(11)).float()
    z[0, [5, 17]] = 3.0
    z[0, [2, 9, 11, 30, 33]] = 2.0
    return z.to(torch.bfloat16), dict(top_k=4)


def _tie_top_p():
    # three 2s, six 1s, the rest 0 (x - m = 0, -1, -2: masses 1, e^-1, e^-2 in units of 2^38).
    # p puts P' inside the group of 1s: 3 + 2.5 e^-1 of the mass -> the three 2s and the three
    # lowest-id 1s are kept
    V = 36
    z = torch.zeros(1, V)
    perm = torch.randperm(V, generator=_gen(12))
    z[0, perm[:3]] = 2.0
    z[0, perm[3:9]] = 1.0
    e1, e2 = np.exp(-1.0), np.exp(-2.0)
    S = 3 + 6 * e1 + (V - 9) * e2
    p = float((3 + 2.5 * e1) / S)
    return z.to(torch.bfloat16), dict(top_p=p)


def _neg_inf():
    z = _randn(48, 13, 1.5)
    z[0, ::3] = float("-inf")
    return z, dict(temperature=0.8, top_p=0.9)


def _min_p_near_1():
    z = _randn(40, 14, 1.0) - 1.0
    z[0, [3, 8, 21, 30]] = torch.tensor([2.0, 1.99, 2.0, 1.975])
    return z, dict(min_p=0.97)      # keeps x - m >= ln 0.97 = -0.0305: ids 3, 8, 21, 30


def _greedy():
    z = _randn(48, 15, 1.0)
    z[0, [10, 31]] = 4.0              # tie at the max: the lowest id (10) wins
    return z, dict(temperature=0.0, top_k=3, top_p=0.5)


def _ulp_ladder(base, n, steps_per_unit, seed):
    """n float32 logits just below ``base`` (z_i = base - j_i ulps) and T such that one ulp is
    1 / steps_per_unit of a unit of z / T: magnitudes |z / T| ~ base * steps_per_unit / ulp."""
    b = np.float32(base)
    ulp = np.float32(abs(np.spacing(b)))
    j = torch.randint(0, 4 * steps_per_unit, (1, n), generator=_gen(seed)).numpy()
    z = torch.tensor(b - j.astype(np.float32) * ulp, dtype=torch.float32)
    return z, float(ulp) * steps_per_unit


def _huge_ladder():
    # z near 1e30 (ulp 7.6e22), a unit of z / T = 4 ulps: |z / T| ~ 3e6 with an O(1) spread
    z, T = _ulp_ladder(1e30, 40, 4, 21)
    return z, dict(temperature=T)


def _huge_ladder_filtered():
    z, T = _ulp_ladder(-3e29, 48, 3, 22)
    return z, dict(temperature=T, top_k=9, top_p=0.85, min_p=0.02)


def _tiny_temperature():
    # the documented example: logits [10, 9.999999] at T = 1e-6; the exact answer for these
    # float32 inputs is softmax((z - zmax) / T) = [0.7218, 0.2782]
    return torch.tensor([[10.0, 9.999999]]), dict(temperature=1e-6)


def _near_greedy():
    # T = 0.01 on logits of 30..100: |z / T| up to 1e4, where fl32(z / T + G) quantizes the noise
    z = torch.rand(1, 64, generator=_gen(23)) * 70 + 30
    z[0, :8] = z[0, :8].max() - torch.rand(8, generator=_gen(24)) * 0.03
    return z, dict(temperature=0.01)


def _subnormal_temperature():
    # 1/T overflows float32: the T -> 0 limit, uniform over the tied maxima (ids 3, 9, 17)
    z = _randn(24, 25, 1.0)
    z[0, [3, 9, 17]] = 5.0
    return z, dict(temperature=1e-40)


CASES = {
    "temperature": lambda: (_randn(48, 1, 1.5), dict(temperature=0.7)),
    "top_k": lambda: (_randn(48, 2, 1.5), dict(top_k=7)),
    "top_p": lambda: (_randn(48, 3, 1.5), dict(top_p=0.8)),
    "min_p": lambda: (_randn(48, 4, 1.5), dict(min_p=0.1)),
    "top_k_top_p": lambda: (_randn(48, 5, 1.5), dict(temperature=1.3, top_k=12, top_p=0.7)),
    "top_k_top_p_min_p": lambda: (_randn(64, 6, 1.0), dict(temperature=0.9, top_k=20,
                                                            top_p=0.9, min_p=0.05)),
    "tie_top_k": _tie_top_k,
    "tie_top_p": _tie_top_p,
    "tie_top_k_top_p_int": lambda: (torch.randint(0, 3, (1, 30), generator=_gen(16)).float(),
                                    dict(top_k=9, top_p=0.6)),
    "neg_inf": _neg_inf,
    "top_p_0.01": lambda: (_randn(256, 7, 0.05), dict(top_p=0.01)),
    "k_1": lambda: (_randn(48, 8, 1.5), dict(top_k=1)),
    "k_V": lambda: (_randn(48, 9, 1.5), dict(top_k=48, temperature=1.1)),
    "min_p_near_1": _min_p_near_1,
    "greedy": _greedy,
    # exact at every magnitude (randomness contract: scores relative to the row max)
    "equal_1e7": lambda: (torch.full((1, 2), 1e7), dict(temperature=1.0)),
    "equal_1e30": lambda: (torch.full((1, 3), -1e30), dict(temperature=1.0)),
    "huge_ladder": _huge_ladder,
    "huge_ladder_filtered": _huge_ladder_filtered,
    "tiny_temperature": _tiny_temperature,
    "near_greedy": _near_greedy,
    "subnormal_temperature": _subnormal_temperature,
}
DETERMINISTIC = {"k_1", "greedy"}


def _param_tensors(kw, n, device):
    out = {}
    for name in ("temperature", "top_k", "top_p", "min_p"):
        if name in kw:
            dt = torch.int32 if name == "top_k" else torch.float32
            out[name] = torch.full((n,), kw[name], dtype=dt, device=device)
    return out


def _draw(backend, z, kw, n, seed0=0, chunk=None):
    """Tokens of n draws: row i of the replicated batch uses seed seed0 + i, offset i % 7."""
    chunk = chunk or (1 << 16 if HAS_CUDA else 1 << 13)
    out = []
    for start in range(0, n, chunk):
        b = min(chunk, n - start)
        rows = z.expand(b, z.shape[1])                  # stride-0 rows: no copy
        i = torch.arange(start, start + b, device=z.device)
        out.append(ops.sample(rows, seed0 + i, i % 7, backend=backend, **kw).tokens)
    return torch.cat(out)


def _assert_follows(tok, z, kw, n, what, min_support=0):
    """n draws from row z with parameters kw follow ref.probabilities: none outside the support,
    at least min_support tokens in it, chi-square p > ALPHA."""
    counts = torch.bincount(tok, minlength=z.shape[1]).cpu().numpy()
    probs = ref.probabilities(z, **_param_tensors(kw, 1, DEVICE))[0].cpu().numpy()
    assert counts[probs == 0].sum() == 0, f"draws outside the support ({what})"
    assert (probs > 0).sum() >= min_support
    pval = _pooled_chisquare(counts[probs > 0], probs[probs > 0] * n)
    assert pval > ALPHA, f"chi-square p = {pval:.2e} ({what})"


def _pooled_chisquare(obs: np.ndarray, exp: np.ndarray) -> float:
    """Chi-square p-value; the bins with expected count < 5 are pooled into one bin (grown with
    the next smallest bins until its expected count reaches 5)."""
    from scipy import stats
    order = np.argsort(exp, kind="stable")
    obs, exp = obs[order].astype(np.float64), exp[order].astype(np.float64)
    s = int((exp < 5).sum())
    if s:
        cum = np.cumsum(exp)
        while s < len(exp) and cum[s - 1] < 5:
            s += 1
        obs = np.concatenate([[obs[:s].sum()], obs[s:]])
        exp = np.concatenate([[exp[:s].sum()], exp[s:]])
    if len(exp) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp * (obs.sum() / exp.sum())).pvalue)


@pytest.mark.parametrize("case", list(CASES))
def test_sample_distribution(backend, case):
    if backend == "triton" and not HAS_CUDA:
        pytest.skip("Triton interpreter: too slow for chi-square draws; "
                    "test_sample_draws_match_reference checks its tokens draw for draw")
    z, kw = CASES[case]()
    z = z.to(DEVICE)
    V = z.shape[1]
    n = draws(40_000, 1_000_000)
    tok = _draw(backend, z, kw, n)
    counts = torch.bincount(tok, minlength=V).cpu().numpy()
    probs = ref.probabilities(z, **_param_tensors(kw, 1, DEVICE))[0].cpu().numpy()
    outside = counts[probs == 0].sum()
    assert outside == 0, f"{outside} draws outside the support"
    if case in DETERMINISTIC:
        assert counts[np.argmax(probs)] == n and probs.max() == 1.0
        return
    assert (probs > 0).sum() >= 2
    pval = _pooled_chisquare(counts[probs > 0], probs[probs > 0] * n)
    assert pval > ALPHA, f"chi-square p = {pval:.2e} (case {case}, {n} draws)"


def test_expected_kept_sets():
    """The cases above put their boundaries where intended (guards the test itself)."""
    def support(case):
        z, kw = CASES[case]()
        return (ref.probabilities(z, **_param_tensors(kw, 1, "cpu"))[0] > 0).nonzero()[:, 0]
    assert support("tie_top_k").tolist() == [2, 5, 9, 17]
    z, _ = _tie_top_p()
    kept = support("tie_top_p")
    ones = (z[0].float() == 1).nonzero()[:, 0][:3]
    twos = (z[0].float() == 2).nonzero()[:, 0]
    assert sorted(kept.tolist()) == sorted(twos.tolist() + ones.tolist())
    assert support("min_p_near_1").tolist() == [3, 8, 21, 30]
    assert 2 <= len(support("top_p_0.01")) <= 10
    assert support("greedy").tolist() == [10]
    assert len(support("k_V")) == 48
    assert support("subnormal_temperature").tolist() == [3, 9, 17]


def test_magnitude_cases_are_nontrivial():
    """The magnitude cases really sit at |z / T| >> 1 with an O(1) spread of z / T, and their
    exact probabilities are the float64 softmax of (z - zmax) / T (guards the cases)."""
    for case in ("huge_ladder", "huge_ladder_filtered", "near_greedy", "tiny_temperature"):
        z, kw = CASES[case]()
        x = z.double() / kw["temperature"]
        assert x.abs().max() > 1e3, case
        probs = ref.probabilities(z, **_param_tensors(kw, 1, "cpu"))[0]
        assert (probs > 0.01).sum() >= 2, case
    z, kw = _tiny_temperature()
    probs = ref.probabilities(z, **_param_tensors(kw, 1, "cpu"))[0]
    assert abs(probs[0].item() - 0.7218) < 1e-3


@pytest.mark.parametrize("be", ["triton", "cuda"])
def test_sample_draws_match_reference(be):
    """Two-sample check: the same (seed, offset) draws give identical token sequences on the
    backend and the reference (on the same device), for every case."""
    skip_unless_backend(be)
    for case, make in CASES.items():
        z, kw = make()
        z = z.to(DEVICE)
        # the Triton interpreter runs one program per row chunk (its GPU launch shape), a few
        # hundred draws per case keep CI within minutes; the GPU takes 200k
        n = draws(150 if z.shape[1] <= 64 else 60, 200_000) if be == "triton" else \
            draws(3_000 if z.shape[1] <= 64 else 1_000, 200_000)
        want = _draw("reference", z, kw, n, seed0=12345)
        got = _draw(be, z, kw, n, seed0=12345)
        assert torch.equal(got, want), f"{case}: {(got != want).sum().item()} draws differ"


@pytest.mark.gpu
@pytest.mark.parametrize("be", ["reference", "triton", "cuda"])
@pytest.mark.parametrize("V,kw", [(32000, dict(top_k=50, top_p=0.9, temperature=0.8)),
                                  (151936, dict(top_p=0.5, temperature=0.7)),
                                  (151936, dict(min_p=0.2))])
def test_sample_distribution_large_vocab(be, V, kw):
    """Real vocabulary sizes (GPU only): multi-block rows, generic top-p paths."""
    skip_unless_backend(be)
    z = (torch.randn(1, V, generator=_gen(V)) * 2.5).to(DEVICE)
    # the reference materializes int64 [rows, V] temporaries, and the Triton fallback runs one
    # program per row of ~25 passes: fewer draws for them (the CUDA path takes 1e6)
    n, chunk = {"reference": (50_000, 256), "triton": (100_000, 1 << 14),
                "cuda": (1_000_000, 1 << 14)}[be]
    tok = _draw(be, z, kw, n, chunk=chunk)
    _assert_follows(tok, z, kw, n, f"{be}, V = {V}")


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [2, 32])
@pytest.mark.parametrize("case", ["top_k_top_p", "top_k_min_p", "low_ids", "k_gt_512"])
def test_small_batch_launch_distribution(chunk, case):
    """The CUDA split-candidates launch (calls of B <= SMs / 4 with a top-k tensor: each row
    over several CTAs, the last to arrive finishes it): chi-square over 2^17 draws made B = 2 or
    32 rows per call (V = 8192: 8 / 4 CTAs per row on a 132-SM GPU), with the top values
    crowded into the first chunk (the finishing CTA reads it again) and k > 512 (its generic
    path)."""
    skip_unless_backend("cuda")
    V = 8192
    z = torch.randn(1, V, generator=_gen(31)) * 1.5
    kw = {"top_k_top_p": dict(temperature=0.9, top_k=50, top_p=0.9),
          "top_k_min_p": dict(temperature=1.2, top_k=200, min_p=0.05),
          "low_ids": dict(temperature=1.0, top_k=40),
          "k_gt_512": dict(temperature=0.5, top_k=700, top_p=0.95)}[case]
    if case == "low_ids":
        z[0, :64] += 3.0
    z = z.to(DEVICE)
    n = 1 << 17
    tok = _draw("cuda", z, kw, n, chunk=chunk)
    _assert_follows(tok, z, kw, n, f"{case}, B = {chunk}", min_support=10)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["top_p", "top_p_min_p", "k_off_top_p", "k_off_prefix",
                                  "k_off_rescan"])
def test_small_batch_top_p_band_distribution(case):
    """Band masses: the split-candidates launch's finishing CTA bounds a top-p row's total mass
    from the chunks' float64 sums instead of reading the row. "k_off_top_p": rows with top-k off
    (k = 0) in a call with a top-k tensor (the default F_SCAND_BAND); the others: opt-in
    F_SCAND_TOPP, top-p calls without a top-k tensor on that launch. Chi-square over 2^16 draws
    made 4 rows per call (V = 32768: 32 CTAs per row on a 132-SM GPU), 100 dominant tokens so
    that the kept set fits the candidates."""
    skip_unless_backend("cuda")
    from tokenspeed_kernel import testing
    from tokenspeed_kernel.ops import sampling as S
    V = 32768
    g = _gen(33)
    # "k_off_prefix": the same rows 16 per call (8 CTAs per row: fewer forwarded keys than the
    # candidates) without F_SCAND_RESCAN: the finishing CTA decides from the complete prefix
    # above the chunks' bounds; "k_off_rescan": the same with the default F_SCAND_RESCAN (the
    # chunks that may hold keys above the smallest forwarded key read again)
    z = torch.randn(1, V, generator=g) * 1.5
    z[0, torch.randperm(V, generator=g)[:100]] += 12.0
    kw = {"top_p": dict(temperature=0.9, top_p=0.9),
          "top_p_min_p": dict(temperature=1.1, top_p=0.95, min_p=0.02),
          "k_off_top_p": dict(temperature=0.8, top_k=0, top_p=0.85),
          "k_off_prefix": dict(temperature=0.8, top_k=0, top_p=0.85),
          "k_off_rescan": dict(temperature=0.8, top_k=0, top_p=0.85)}[case]
    z = z.to(DEVICE)
    n = 1 << 16
    launch = {"k_off_prefix": S._DEFAULT_LAUNCH_FLAGS & ~S.F_SCAND_RESCAN}.get(
        case, S._DEFAULT_LAUNCH_FLAGS)
    with testing.knobs(sampler_flags=0 if case.startswith("k_off") else S.F_SCAND_TOPP,
                       sampler_launch_flags=launch):
        tok = _draw("cuda", z, kw, n, chunk=16 if case in ("k_off_prefix", "k_off_rescan") else 4)
    assert torch.equal(tok[:4096], _draw("reference", z, kw, 4096, chunk=512))
    _assert_follows(tok, z, kw, n, case, min_support=10)
