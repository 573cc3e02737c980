"""``ops.sample(..., processing=LogitsInputs(...))``: logits processing fused into the sampler.

The spec is ``reference.logits_processing.apply`` followed by the reference sampler (tokens,
valid, processed logprobs; raw logprobs from the unprocessed logits). Checked here:

* every input kind alone and all together (bias, repetition / frequency / presence penalties
  with count slots, allowed-token bitmask, banned ids, min_tokens stop ids): Triton == the
  reference, tokens / valid bit for bit and logprobs to 1e-4, for several seeds,
  tokens_per_request 1 and 2, temperature-only and mixed top-k / top-p / min-p / greedy rows;
* the Triton sampler's rare paths with processing (several chunks, the top-p mass pass, the
  TOPR extension, the exact pass, window overflows), forced with small launch configs;
* distribution: chi-square of the sampled tokens against the softmax of ``apply(...)``
  (reference backend, many draws; Triton, fewer draws on CPU);
* NaN policy on the processed row: a row the masks empty is invalid; a NaN raw logit at a
  masked position does not invalidate the row;
* argument errors name ``processing.<field>``;
* calls without processing are unchanged (and on a GPU, compile no new Triton variants);
* GPU only (skipped here): CUDA == Triton == reference at V = 151936 and a small V; every CUDA
  sampler path (forced with the ``sampler_flags`` knob: generic radix thresholds, the exact pass,
  streamed chunks, the cluster launch instead of the split launch) with each input kind, at
  batch sizes that take clusters of 16 / a few / one CTA, fp32 / bf16, unaligned rows.

Shapes: V = 200 / 203 (odd, not a multiple of 32: the last bitmask word is partial), n = 3-4
requests: small enough for the Triton interpreter, large enough that every request has
several bias / banned / stop entries and seen / counted tokens in different words.
"""
from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, HAS_CUDA, sampler_path, skip_unless_backend
import tokenspeed_kernel
from tokenspeed_kernel import ops
from tokenspeed_kernel.reference import logits_processing as LP
from tokenspeed_kernel.reference import sampling as ref

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

KINDS = ("bias", "repetition", "frequency", "presence", "allowed", "banned", "min_tokens", "all")
GREEDY, PLAIN, WINDOW, TOPR, DIRECT, EXACT, EXT = 0, 1, 2, 3, 4, 16, 32
ALPHA = 1e-3


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _skip_unless(backend):
    """skip_unless_backend, and for "cuda" also unless the CUDA sampler applies processing."""
    skip_unless_backend(backend)
    if backend == "cuda":
        from tokenspeed_kernel.ops import sampling as S
        if not S.cuda_takes_processing():
            pytest.skip("the CUDA sampler does not apply processing (ops.sampling."
                        "CUDA_PROCESSING)")


def _csr(lists, gen=None, values=False, device=DEVICE):
    indptr = torch.tensor([0] + [len(x) for x in lists]).cumsum(0)
    ids = torch.tensor([t for x in lists for t in x], dtype=torch.int64)
    vals = (torch.randn(ids.numel(), generator=gen) * 4).to(device) if values else None
    return LP.Csr(indptr.to(device), ids.to(device), vals)


def _picks(n, V, k, gen):
    return [torch.randperm(V, generator=gen)[:k].tolist() for _ in range(n)]


def _counts(n, V, gen, slots=None):
    """TokenCounts with ``n + 2`` slots (prompts of 40 tokens, 12 output tokens per request),
    requests in ``slots`` (default: a permutation, so that count_slots matters)."""
    N = n + 2
    counts = LP.new_token_counts(N, V)
    slots = torch.randperm(N, generator=gen)[:n] if slots is None else slots
    prompts = LP.Csr(torch.arange(n + 1) * 40, torch.randint(0, V, (40 * n,), generator=gen))
    LP.admit(counts, slots, prompts)
    LP.add_tokens(counts, torch.randint(0, V, (n, 12), generator=gen), slots=slots)
    return LP.TokenCounts(counts.seen.to(DEVICE), counts.output.to(DEVICE)), slots.to(DEVICE)


def _inputs(kind, n, V, gen):
    """LogitsInputs for one kind of input (or "all" of them)."""
    f32 = dict(dtype=torch.float32)
    kw = {}
    every = kind == "all"
    if kind == "bias" or every:
        kw["logit_bias"] = _csr(_picks(n, V, 8, gen), gen, values=True)
    pen = {"repetition": ("repetition_penalty", 0.6, 1.8),
           "frequency": ("frequency_penalty", -0.5, 1.0),
           "presence": ("presence_penalty", -0.5, 1.5)}
    for k, (name, lo, hi) in pen.items():
        if kind == k or every:
            kw[name] = (lo + (hi - lo) * torch.rand(n, generator=gen, **f32)).to(DEVICE)
    if any(k in kw for k in ("repetition_penalty", "frequency_penalty", "presence_penalty")):
        kw["counts"], kw["count_slots"] = _counts(n, V, gen)
    if kind == "allowed" or every:
        W = (V + 31) // 32
        m = torch.randint(-2**31, 2**31, (n, W), generator=gen, dtype=torch.int64)
        kw["allowed_mask"] = m.to(torch.int32).to(DEVICE)
    if kind == "banned" or every:
        kw["banned"] = _csr(_picks(n, V, 10, gen))
    if kind == "min_tokens" or every:
        kw["min_tokens"] = torch.tensor([5, 0, 9, 3][:n]).to(DEVICE)
        kw["num_output_tokens"] = torch.tensor([2, 4, 9, 0][:n]).to(DEVICE)
        kw["stop_ids"] = _csr(_picks(n, V, 3, gen))
    return LP.LogitsInputs(**kw)


def _peak_on(z, inp, tpr):
    """Makes the processing matter: request 0's largest logits sit on processed tokens (its
    bias / banned / stop ids, a token its mask disallows)."""
    ids = []
    for f in (inp.logit_bias, inp.banned, inp.stop_ids):
        if f is not None:
            ids.append(f.ids[: f.indptr[1]].cpu())
    if inp.allowed_mask is not None:
        V = z.shape[1]
        allowed = LP.bit_is_set(inp.allowed_mask[:1].cpu(), V)[0]
        ids.append((~allowed).nonzero()[:1, 0])
    if ids:
        z[:tpr, torch.cat(ids)] += 30.0
    return z


FILTER_SETS = {
    # per request: greedy, temperature-only rows
    "temperature": lambda n: dict(temperature=torch.tensor([0.0, 0.7, 1.0, 1.6][:n])),
    # top-k / top-p / min-p mixed per request
    "filters": lambda n: dict(temperature=torch.tensor([0.9, 1.0, 0.7, 1.2][:n]),
                              top_k=torch.tensor([5, 0, 30, 0][:n], dtype=torch.int32),
                              top_p=torch.tensor([0.9, 0.8, 1.0, 1.0][:n]),
                              min_p=torch.tensor([0.0, 0.05, 0.1, 0.2][:n])),
}


def _compare(z, inp, kw, seeds, tpr, lp=True):
    n = z.shape[0] // tpr
    kw = {k: v.to(DEVICE) for k, v in kw.items()}
    for s in seeds:
        seed = torch.arange(n, device=DEVICE) * 31 + s
        offset = torch.arange(n, device=DEVICE) * 3 + s
        fn = ops.sample_with_logprobs if lp else ops.sample
        want = fn(z, seed, offset, tokens_per_request=tpr, processing=inp, backend="reference",
                  **kw)
        got = fn(z, seed, offset, tokens_per_request=tpr, processing=inp, backend="triton", **kw)
        assert torch.equal(got.tokens, want.tokens), (s, got.tokens.tolist(), want.tokens.tolist())
        assert torch.equal(got.valid, want.valid)
        if lp:
            v = want.valid
            for a, b in ((got.logprobs, want.logprobs),
                         (got.processed_logprobs, want.processed_logprobs)):
                torch.testing.assert_close(a[v], b[v], atol=1e-4, rtol=1e-4, equal_nan=True)
                assert torch.isnan(a[~v]).all()


# ---------------------------------------------------------------------------------------------
# Triton == reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tpr", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_triton_matches_reference(kind, tpr):
    skip_unless_backend("triton")
    gen = _gen(KINDS.index(kind) * 10 + tpr)
    n, V = 4, 203
    inp = _inputs(kind, n, V, gen)
    z = _peak_on(torch.randn(n * tpr, V, generator=gen) * 3, inp, tpr).to(DEVICE)
    for make in FILTER_SETS.values():
        _compare(z, inp, make(n), seeds=(0, 7) if kind == "all" else (tpr,), tpr=tpr)
    # the processing changes the greedy tokens (the test would be vacuous otherwise)
    seed = torch.arange(n, device=DEVICE)
    a, b = (ops.sample(z, seed, seed, temperature=0.0, processing=p, tokens_per_request=tpr,
                       backend="reference").tokens for p in (inp, None))
    if kind in ("bias", "banned", "allowed", "all", "min_tokens"):
        assert not torch.equal(a, b), kind


def test_triton_bf16_and_strided_rows():
    """bf16 logits (read natively) and rows with a stride larger than V."""
    skip_unless_backend("triton")
    gen = _gen(3)
    n, V = 3, 200
    inp = _inputs("all", n, V, gen)
    big = torch.randn(n, V + 37, generator=gen) * 3
    z = big[:, :V].to(DEVICE)
    assert z.stride(0) == V + 37
    _compare(z, inp, FILTER_SETS["filters"](n), seeds=(1,), tpr=1)
    _compare(z.to(torch.bfloat16), inp, FILTER_SETS["temperature"](n), seeds=(2,), tpr=1)


@pytest.fixture
def tri():
    skip_unless_backend("triton")
    from tokenspeed_kernel.triton import sampling as tri_mod
    yield tri_mod
    tri_mod._TEST_CONFIG = None


def _tri_paths(tri, z, inp, kw, cfg, tpr=1, seed=0):
    """Triton with launch config ``cfg`` == the reference (with processing); the path codes."""
    n = z.shape[0] // tpr
    seed_t = torch.arange(n, device=DEVICE) + seed
    off = torch.arange(n, device=DEVICE) * 2
    kw = {k: v.to(DEVICE) for k, v in kw.items()}
    want = ops.sample_with_logprobs(z, seed_t, off, tokens_per_request=tpr, processing=inp,
                                    backend="reference", **kw)
    tri._TEST_CONFIG = dict(cfg, stats=True)
    try:
        got = ops.sample_with_logprobs(z, seed_t, off, tokens_per_request=tpr, processing=inp,
                                       backend="triton", **kw)
        stats = tri._LAST_STATS.cpu()
    finally:
        tri._TEST_CONFIG = None
    assert torch.equal(got.tokens, want.tokens), (cfg, got.tokens.tolist(), want.tokens.tolist())
    assert torch.equal(got.valid, want.valid)
    v = want.valid
    torch.testing.assert_close(got.logprobs[v], want.logprobs[v], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.processed_logprobs[v], want.processed_logprobs[v], atol=1e-4,
                               rtol=1e-4)
    return stats


def test_triton_paths_with_processing(tri):
    """Every read of the logits applies the processing: several chunks per row (K1), the top-p
    mass pass over several chunks (K2), the TOPR extension (flat rows, small KCAP), the exact
    pass (k > KCAP; no refinement allowed), window candidates overflowing their slot, and the
    PLAIN exact pass (|z / T| beyond the gap test's range)."""
    gen = _gen(40)
    n, V = 4, 1000
    inp = _inputs("all", n, V, gen)
    T = torch.full((n,), 1.0)
    flat = (torch.randn(n, V, generator=gen) * 0.05).to(DEVICE)
    z = (torch.randn(n, V, generator=gen) * 3).to(DEVICE)
    ext = dict(BLOCK=256, BLOCK_T=64, S1=1, KCAP=32, KSLOT=16, NP=16)
    st = _tri_paths(tri, flat, inp, dict(temperature=T, top_p=torch.full((n,), 0.9)), ext)
    assert (st == TOPR + EXT).all(), st
    st = _tri_paths(tri, flat, inp, dict(temperature=T, top_p=torch.full((n,), 0.9)),
                    dict(ext, NREF=0))
    assert (st == TOPR + EXT + EXACT).all(), st
    k = torch.tensor([100, 40, 300, 20], dtype=torch.int32)
    st = _tri_paths(tri, flat, inp, dict(temperature=T, top_k=k, top_p=torch.full((n,), 0.95)),
                    ext)
    assert (st[:3] == DIRECT + EXACT).all() and st[3] == TOPR + EXT, st   # KCAP 32
    chunks = dict(BLOCK=64, BLOCK_T=64, S1=3, S2=3, KCAP=64, KSLOT=64, NP=256)
    kw = FILTER_SETS["filters"](n)
    st = _tri_paths(tri, z, inp, kw, chunks, seed=3)
    assert ((st & 15) == torch.tensor([TOPR, TOPR, TOPR, WINDOW], dtype=torch.int32)).all(), st
    st = _tri_paths(tri, z, inp, dict(temperature=T, top_p=torch.full((n,), 0.7)), chunks)
    assert ((st & 15) == TOPR).all(), st
    # min-p low enough that the flat tokens stay kept next to the biased ones: chunks whose max
    # is kept overflow their slots (chunks whose max is not kept are skipped, test_sampling.py)
    ovf = dict(BLOCK=64, S1=4, NP=256, KCAP=64, NC=16)
    st = _tri_paths(tri, flat, inp, dict(temperature=T, min_p=torch.full((n,), 1e-6)), ovf)
    assert (st == WINDOW + EXACT).all(), st
    st = _tri_paths(tri, z * 1e30, inp, dict(temperature=T), dict(BLOCK=64, S1=3), tpr=1)
    assert (st == PLAIN + EXACT).all(), st
    st = _tri_paths(tri, z, inp, dict(temperature=T), dict(BLOCK=64, S1=3), seed=5)
    assert (st == PLAIN).all(), st


# ---------------------------------------------------------------------------------------------
# distribution
# ---------------------------------------------------------------------------------------------
def _pooled_chisquare(obs, exp):
    from test_sampling_stats import _pooled_chisquare as chi
    return chi(obs, exp)


def _replicated(inp, n):
    """One request's inputs repeated for n requests (the counts stay one slot: count_slots)."""
    def rep_csr(c):
        k = int(c.indptr[1])
        ids = c.ids[:k].repeat(n)
        vals = None if c.values is None else c.values[:k].repeat(n)
        return LP.Csr(torch.arange(n + 1, device=ids.device) * k, ids, vals)

    return LP.map_requests(inp, lambda t: t[:1].expand(n, *t.shape[1:]).contiguous(), rep_csr)


@pytest.mark.parametrize("backend,n", [("reference", 40_000), ("triton", 150),
                                       ("cuda", 400_000)])
def test_distribution_matches_processed_softmax(backend, n):
    """Tokens drawn with processing follow softmax(apply(z) / T) over the kept set (Triton:
    few draws in the interpreter, its tokens are also compared with the reference's draw for
    draw; 400k on a GPU)."""
    _skip_unless(backend)
    if backend == "triton" and HAS_CUDA:
        n = 400_000
    gen = _gen(50)
    V = 64
    inp = _inputs("all", 1, V, gen)
    z = (torch.randn(1, V, generator=gen) * 1.5).to(DEVICE)
    proc = LP.apply(z, inp)
    kw = dict(temperature=0.9, top_p=0.98)
    probs = ref.probabilities(proc, temperature=torch.tensor([0.9], device=DEVICE),
                              top_p=torch.tensor([0.98], device=DEVICE))[0].cpu().numpy()
    assert (probs > 0).sum() >= 5 and (probs == 0).sum() >= 5
    rinp = _replicated(inp, n)
    i = torch.arange(n, device=DEVICE)
    tok = ops.sample(z.expand(n, V), 1000 + i, i % 5, processing=rinp, backend=backend,
                     **kw).tokens
    if backend == "triton" and not HAS_CUDA:
        want = ops.sample(z.expand(n, V), 1000 + i, i % 5, processing=rinp,
                          backend="reference", **kw).tokens
        assert torch.equal(tok, want)
    counts = torch.bincount(tok, minlength=V).cpu().numpy()
    assert counts[probs == 0].sum() == 0, "draws outside the processed support"
    pval = _pooled_chisquare(counts[probs > 0], probs[probs > 0] * n)
    assert pval > ALPHA, f"chi-square p = {pval:.2e} ({backend}, {n} draws)"


# ---------------------------------------------------------------------------------------------
# NaN policy on the processed row
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["reference", "triton", "cuda"])
def test_nothing_allowed_is_invalid(backend):
    _skip_unless(backend)
    n, V = 3, 70
    z = torch.randn(n, V, generator=_gen(60)).to(DEVICE)
    mask = torch.full((n, 3), -1, dtype=torch.int32)
    mask[1] = 0                                  # request 1: nothing allowed
    banned = _csr([[], [], list(range(V))])      # request 2: everything banned
    inp = LP.LogitsInputs(allowed_mask=mask.to(DEVICE), banned=banned)
    s = torch.arange(n, device=DEVICE)
    for kw in (dict(temperature=0.8), dict(temperature=0.0), dict(top_k=3, top_p=0.5),
               dict(min_p=0.1)):
        out = ops.sample_with_logprobs(z, s, s, processing=inp, backend=backend, **kw)
        assert out.valid.tolist() == [True, False, False]
        assert out.tokens[1:].tolist() == [0, 0]
        assert torch.isnan(out.logprobs[1:]).all() and torch.isnan(out.processed_logprobs[1:]).all()
        assert not torch.isnan(out.logprobs[0])


@pytest.mark.parametrize("backend", ["reference", "triton", "cuda"])
def test_nan_raw_logit_at_masked_position(backend):
    """A NaN (or +inf) raw logit where the mask / banned list puts -inf: the row is valid and
    samples as if that logit were -inf; its raw logprob is NaN (log_softmax of the raw row). A
    NaN at an unmasked position still makes the row invalid."""
    _skip_unless(backend)
    n, V = 4, 70
    z = torch.randn(n, V, generator=_gen(61)) * 2
    mask = torch.full((n, 3), -1, dtype=torch.int32)
    mask[0, 0] = ~(1 << 5)                       # token 5 not allowed for request 0
    z[0, 5] = float("nan")
    z[1, 9] = float("nan")                       # banned for request 1
    z[2, 11] = float("inf")                      # banned for request 2
    z[3, 12] = float("nan")                      # not masked: invalid
    inp = LP.LogitsInputs(allowed_mask=mask.to(DEVICE), banned=_csr([[], [9], [11], []]))
    clean = z.clone()
    clean[0, 5] = clean[1, 9] = clean[2, 11] = float("-inf")
    z, clean = z.to(DEVICE), clean.to(DEVICE)
    s = torch.arange(n, device=DEVICE)
    for kw in (dict(temperature=0.8), dict(top_k=5), dict(top_p=0.9, min_p=0.05)):
        out = ops.sample_with_logprobs(z, s, s, processing=inp, backend=backend, **kw)
        want = ops.sample_with_logprobs(clean, s, s, backend="reference", **kw)
        assert out.valid.tolist() == [True, True, True, False]
        assert torch.equal(out.tokens[:3], want.tokens[:3])
        assert out.tokens[3] == 0
        assert torch.isnan(out.logprobs).all()      # raw rows with NaN / +inf
        torch.testing.assert_close(out.processed_logprobs[:3], want.processed_logprobs[:3],
                                   atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# unchanged without processing; neutral processing changes nothing
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["reference", "triton", "cuda"])
def test_without_processing_unchanged(backend):
    _skip_unless(backend)
    gen = _gen(70)
    n, V = 4, 203
    z = (torch.randn(n, V, generator=gen) * 3).to(DEVICE)
    s = torch.arange(n, device=DEVICE)
    kw = {k: v.to(DEVICE) for k, v in FILTER_SETS["filters"](n).items()}
    base = ops.sample_with_logprobs(z, s, s, backend=backend, **kw)
    counts, slots = _counts(n, V, gen)
    W = (V + 31) // 32
    neutral = LP.LogitsInputs(
        repetition_penalty=torch.ones(n, device=DEVICE),
        frequency_penalty=torch.zeros(n, device=DEVICE),
        presence_penalty=torch.zeros(n, device=DEVICE), counts=counts, count_slots=slots,
        allowed_mask=torch.full((n, W), -1, dtype=torch.int32, device=DEVICE),
        logit_bias=LP.Csr(torch.tensor([0, 1, 1, 1, 1], device=DEVICE),
                          torch.tensor([3], device=DEVICE), torch.zeros(1, device=DEVICE)),
        banned=_csr([[], [], [], []]))
    for proc in (None, LP.LogitsInputs(), neutral):
        out = ops.sample_with_logprobs(z, s, s, backend=backend, processing=proc, **kw)
        assert torch.equal(out.tokens, base.tokens) and torch.equal(out.valid, base.valid)
        torch.testing.assert_close(out.logprobs, base.logprobs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.processed_logprobs, base.processed_logprobs, atol=1e-5,
                                   rtol=1e-5)


def test_reference_count_slots_is_a_row_gather():
    gen = _gen(71)
    n, V = 3, 100
    inp = _inputs("all", n, V, gen)
    z = torch.randn(n, V, generator=gen).to(DEVICE)
    slots = inp.count_slots
    gathered = inp._replace(counts=LP.TokenCounts(inp.counts.seen[slots],
                                                  inp.counts.output[slots]), count_slots=None)
    assert torch.equal(LP.apply(z, inp), LP.apply(z, gathered))


# ---------------------------------------------------------------------------------------------
# argument errors
# ---------------------------------------------------------------------------------------------
def _bad_cases():
    n, V = 3, 70
    gen = _gen(80)
    good = _inputs("all", n, V, gen)
    cpu = torch.device("cpu")
    ids = good.banned.ids
    W = 3

    def bias(**kw):
        return good._replace(logit_bias=good.logit_bias._replace(**kw))

    def ban(**kw):
        return good._replace(banned=good.banned._replace(**kw))

    cases = [
        ("processing", "type", (1, 2)),
        ("processing.logit_bias.values", "nan", bias(values=torch.where(
            torch.arange(len(good.logit_bias.values), device=DEVICE) == 2, float("nan"),
            good.logit_bias.values))),
        ("processing.logit_bias.values", "missing", bias(values=None)),
        ("processing.logit_bias.values", "shape", bias(values=good.logit_bias.values[:-1])),
        ("processing.logit_bias.ids", "range", bias(ids=good.logit_bias.ids + V)),
        ("processing.logit_bias.ids", "float", bias(ids=good.logit_bias.ids.float())),
        ("processing.logit_bias.indptr", "length", bias(indptr=good.logit_bias.indptr[:-1])),
        ("processing.logit_bias.indptr", "end", bias(indptr=good.logit_bias.indptr - 0
                                                     + torch.tensor([0, 0, 0, 1], device=DEVICE))),
        ("processing.logit_bias.indptr", "decreasing",
         bias(indptr=torch.tensor([0, 9, 5, 24], device=DEVICE))),
        ("processing.banned.ids", "duplicate",
         ban(ids=torch.cat([ids[:1], ids[:1], ids[2:]]))),
        ("processing.banned.ids", "negative", ban(ids=ids - 100)),
        ("processing.banned.ids", "device", ban(ids=ids.to("meta"))),
        ("processing.repetition_penalty", "zero",
         good._replace(repetition_penalty=torch.tensor([1.0, 0.0, 1.0], device=DEVICE))),
        ("processing.repetition_penalty", "inf",
         good._replace(repetition_penalty=torch.tensor([1.0, float("inf"), 1.0],
                                                       device=DEVICE))),
        ("processing.frequency_penalty", "nan",
         good._replace(frequency_penalty=torch.tensor([float("nan"), 0.0, 0.0], device=DEVICE))),
        ("processing.presence_penalty", "shape",
         good._replace(presence_penalty=torch.zeros(4, device=DEVICE))),
        ("processing.counts", "missing", good._replace(counts=None)),
        ("processing.counts", "dtype", good._replace(counts=LP.TokenCounts(
            good.counts.seen, good.counts.output.to(torch.int64)))),
        ("processing.counts", "vocab", good._replace(counts=LP.TokenCounts(
            good.counts.seen, good.counts.output[:, :-1].contiguous()))),
        ("processing.counts", "seen shape", good._replace(counts=LP.TokenCounts(
            good.counts.seen[:, :-1].contiguous(), good.counts.output))),
        ("processing.counts", "too few slots", good._replace(
            counts=LP.TokenCounts(good.counts.seen[:2], good.counts.output[:2]),
            count_slots=None)),
        ("processing.count_slots", "range",
         good._replace(count_slots=torch.tensor([0, 1, 5], device=DEVICE))),
        ("processing.count_slots", "shape",
         good._replace(count_slots=torch.tensor([0, 1], device=DEVICE))),
        ("processing.allowed_mask", "shape",
         good._replace(allowed_mask=good.allowed_mask[:, :2])),
        ("processing.allowed_mask", "float",
         good._replace(allowed_mask=good.allowed_mask.float())),
        ("processing.num_output_tokens", "missing", good._replace(num_output_tokens=None)),
        ("processing.stop_ids", "missing", good._replace(stop_ids=None)),
        ("processing.stop_ids.ids", "range", good._replace(stop_ids=good.stop_ids._replace(
            ids=good.stop_ids.ids + V))),
        ("processing.min_tokens", "float",
         good._replace(min_tokens=torch.zeros(n, device=DEVICE))),
    ]
    if DEVICE.type == "cuda":
        cases.append(("processing.allowed_mask", "device",
                      good._replace(allowed_mask=good.allowed_mask.to(cpu))))
    assert W == good.allowed_mask.shape[1]
    return n, V, good, cases


_N, _V, _GOOD, _BAD = _bad_cases()


@pytest.mark.parametrize("arg,proc", [(a, p) for a, _, p in _BAD],
                         ids=[f"{a}-{i}" for a, i, _ in _BAD])
def test_processing_validation_errors(arg, proc):
    z = torch.randn(_N, _V, device=DEVICE)
    s = torch.arange(_N, device=DEVICE)
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        ops.sample(z, s, s, processing=proc, backend="reference")
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        ops.sample_with_logprobs(z, s, s, processing=proc, backend="reference")


def test_processing_validation_accepts_good_and_skips_values_without_validate():
    z = torch.randn(_N, _V, device=DEVICE)
    s = torch.arange(_N, device=DEVICE)
    ops.sample(z, s, s, processing=_GOOD, backend="reference")
    # value checks are skipped with validate=False (shape checks are not)
    bad = _GOOD._replace(repetition_penalty=torch.tensor([1.0, 0.5, 2.0], device=DEVICE))
    ops.sample(z, s, s, processing=bad, backend="reference", validate=False)
    with pytest.raises(ValueError, match=r"^processing.presence_penalty\b"):
        ops.sample(z, s, s, processing=_GOOD._replace(presence_penalty=torch.zeros(2)),
                   backend="reference", validate=False)


def test_processing_list_layout():
    """The raw op's trailing list: 16 entries in PROC_FIELDS order, interface dtypes."""
    from tokenspeed_kernel.ops import sampling as S
    assert len(S.PROC_FIELDS) == 16
    lst = S.prepare_processing(_GOOD, _N, _V, DEVICE, True)
    want = {"bias_indptr": torch.int64, "bias_ids": torch.int64, "bias_values": torch.float32,
            "repetition_penalty": torch.float32, "frequency_penalty": torch.float32,
            "presence_penalty": torch.float32, "seen": torch.int32,
            "output_counts": torch.int32, "count_slots": torch.int64,
            "allowed_mask": torch.int32, "banned_indptr": torch.int64,
            "banned_ids": torch.int64, "min_tokens": torch.int64,
            "num_output_tokens": torch.int64, "stop_indptr": torch.int64,
            "stop_ids": torch.int64}
    assert len(lst) == 16
    for name, t in zip(S.PROC_FIELDS, lst):
        assert t.dtype == want[name] and t.is_contiguous() and t.device == DEVICE, name
    assert S.prepare_processing(None, _N, _V, DEVICE, True) == []
    assert S.prepare_processing(LP.LogitsInputs(), _N, _V, DEVICE, True) == []
    # penalties without count_slots: row q (count_slots = arange)
    one = LP.LogitsInputs(frequency_penalty=torch.zeros(_N, device=DEVICE), counts=_GOOD.counts)
    lst = S.prepare_processing(one, _N, _V, DEVICE, True)
    assert torch.equal(lst[8].cpu(), torch.arange(_N))
    assert lst[3] is None and lst[6] is not None and lst[7] is not None


def test_cpu_op_takes_processing():
    """The raw op's CPU kernel (the reference) with the trailing processing list, when the
    loaded extension's schema has it."""
    if not tokenspeed_kernel.extension_available():
        pytest.skip(f"extension unavailable: {tokenspeed_kernel.extension_error()}")
    from tokenspeed_kernel.ops import sampling as S
    if not S._op_has_processing():
        pytest.skip("the loaded extension's sample op predates the processing argument")
    n, V = _N, _V
    z = torch.randn(n, V)
    s = torch.arange(n)
    inp = _inputs("all", n, V, _gen(81))
    inp = LP.LogitsInputs(*(x.cpu() if isinstance(x, torch.Tensor) else
                            (type(x)(*(y.cpu() if y is not None else None for y in x))
                             if x is not None else None) for x in inp))
    proc = S.prepare_processing(inp, n, V, torch.device("cpu"), True)
    outs = (torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.bool),
            torch.empty(n), torch.empty(n))
    T = torch.full((n,), 0.8)
    args = (z, T, None, None, None, s, s, 1, S.F_TEMP | S.F_LOGPROBS, *outs, proc)
    torch.library.opcheck(torch.ops.tokenspeed_kernel.sample.default, args)
    torch.ops.tokenspeed_kernel.sample(*args)
    want = ops.sample(z, s, s, temperature=T, processing=inp, backend="reference")
    assert torch.equal(outs[0], want.tokens)


# ---------------------------------------------------------------------------------------------
# GPU only
# ---------------------------------------------------------------------------------------------
def _gpu_inputs(n, V, gen):
    """Engine-like inputs: 20 bias entries, ~2000 prompt / 200 output tokens, half the vocab
    allowed, 10 banned ids, 2 stop ids under min_tokens (every other request)."""
    dev = DEVICE
    N = n + 3
    counts = ops.new_token_counts(N, V, device=dev)
    slots = torch.randperm(N, generator=gen)[:n].to(dev)
    prompts = torch.randint(0, V, (2000 * n,), generator=gen).to(dev)
    ops.admit_requests(counts, slots, prompts, (torch.arange(n + 1) * 2000).to(dev))
    ops.add_output_tokens(counts, torch.randint(0, V, (n, 200), generator=gen).to(dev),
                          slots=slots)
    W = (V + 31) // 32
    half = torch.randint(-2**31, 2**31, (n, W), generator=gen, dtype=torch.int64)
    return LP.LogitsInputs(
        logit_bias=_csr(_picks(n, V, 20, gen), gen, values=True),
        repetition_penalty=torch.full((n,), 1.1, device=dev),
        frequency_penalty=torch.full((n,), 0.2, device=dev),
        presence_penalty=torch.full((n,), 0.1, device=dev), counts=counts, count_slots=slots,
        allowed_mask=half.to(torch.int32).to(dev), banned=_csr(_picks(n, V, 10, gen)),
        min_tokens=torch.full((n,), 4, device=dev),
        num_output_tokens=(torch.arange(n) % 2 * 8).to(dev),
        stop_ids=_csr(_picks(n, V, 2, gen)))


def _gpu_compare(backends, B, V, tpr=1):
    gen = _gen(B * 7 + V % 1000)
    n = B // tpr
    inp = _gpu_inputs(n, V, gen)
    z = (torch.randn(B, V, generator=gen) * 4).to(DEVICE)
    s = torch.arange(n, device=DEVICE)
    f32 = dict(device=DEVICE)
    combos = [dict(temperature=torch.full((n,), 0.8, **f32)),
              dict(temperature=(torch.arange(n, **f32) % 3) * 0.5),
              dict(temperature=torch.full((n,), 0.8, **f32),
                   top_k=torch.full((n,), 50, dtype=torch.int32, device=DEVICE),
                   top_p=torch.full((n,), 0.9, **f32)),
              dict(temperature=torch.full((n,), 0.8, **f32), top_p=torch.full((n,), 0.9, **f32)),
              dict(temperature=torch.full((n,), 0.8, **f32),
                   min_p=torch.full((n,), 0.1, **f32))]
    for kw in combos:
        outs = {be: ops.sample_with_logprobs(z, s * 5 + 1, s, tokens_per_request=tpr,
                                             processing=inp, backend=be, **kw)
                for be in backends}
        want = outs["reference"]
        for be, o in outs.items():
            assert torch.equal(o.tokens, want.tokens), (be, B, V, list(kw))
            assert torch.equal(o.valid, want.valid), (be, B, V, list(kw))
            v = want.valid
            torch.testing.assert_close(o.logprobs[v], want.logprobs[v], atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(o.processed_logprobs[v], want.processed_logprobs[v],
                                       atol=1e-3, rtol=1e-4)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,V,tpr", [(1, 151936, 1), (7, 151936, 1), (64, 151936, 2),
                                     (3, 257, 1), (300, 257, 3)])
def test_gpu_backends_agree(B, V, tpr):
    backends = ["reference", "triton"]
    from tokenspeed_kernel.ops import sampling as S
    if tokenspeed_kernel.extension_available() and S.cuda_takes_processing():
        backends.append("cuda")
    _gpu_compare(backends, B, V, tpr)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_auto_takes_triton_for_processing_and_cuda_refuses_it():
    """The CUDA kernels do not apply processing (ops.sampling.CUDA_PROCESSING): backend="auto"
    gives the Triton tokens for such calls, an explicit backend="cuda" raises naming the
    argument; without processing "auto" is unchanged."""
    from tokenspeed_kernel.ops import sampling as S
    if S.cuda_takes_processing():
        pytest.skip("the CUDA sampler applies processing")
    skip_unless_backend("cuda")
    gen = _gen(5)
    n, V = 4, 151936
    inp = _gpu_inputs(n, V, gen)
    z = (torch.randn(n, V, generator=gen) * 4).to(DEVICE)
    s = torch.arange(n, device=DEVICE)
    T = torch.full((n,), 0.8, device=DEVICE)
    auto = ops.sample(z, s, s, temperature=T, processing=inp)
    tri = ops.sample(z, s, s, temperature=T, processing=inp, backend="triton")
    ref = ops.sample(z, s, s, temperature=T, processing=inp, backend="reference")
    assert torch.equal(auto.tokens, tri.tokens) and torch.equal(auto.tokens, ref.tokens)
    with pytest.raises(ValueError, match="processing"):
        ops.sample(z, s, s, temperature=T, processing=inp, backend="cuda")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_cuda_processing():
    skip_unless_backend("cuda")
    from tokenspeed_kernel.ops import sampling as S
    if not S.cuda_takes_processing():
        pytest.skip("the CUDA sampler does not apply processing (ops.sampling.CUDA_PROCESSING)")
    for B, V in ((1, 151936), (33, 151936), (512, 151936), (5, 1000)):
        _gpu_compare(["reference", "triton", "cuda"], B, V)


# the CUDA sampler's paths, forced (tests/test_sampling_cuda.py): "default" takes the split
# launch for the temperature rows at B <= SMs / 4, clusters with chunks in shared memory at small
# B, one streamed CTA per row at large B; "generic" the radix thresholds + exact pass for every
# filtered row, "exact" the exact pass instead of the gap test, "stream" no shared-memory copy,
# "nosplit" the cluster launch for small temperature batches, "scand" the split-candidates launch
# (its processing instantiation, default F_SCAND_PROC) for small batches with a top-k tensor, at
# more batch sizes; "launch0" without the default launch-policy bits (processing calls on the
# cluster launch)
def _cuda_flag_sets():
    from tokenspeed_kernel.ops import sampling as S
    return {"default": 0, "generic": S.F_FORCE_GENERIC, "exact": S.F_FORCE_EXACT,
            "stream": S.F_NO_RESIDENT, "nosplit": S.F_NO_SPLIT,
            "nosplit_exact": S.F_NO_SPLIT | S.F_FORCE_EXACT, "scand": S.F_SCAND_PROC,
            "launch0": (0, 0)}


def _kind_only(inp, kind):
    """The inputs of one kind (``KINDS``) out of engine-like inputs with all of them."""
    if kind == "all":
        return inp
    pen = {"repetition": "repetition_penalty", "frequency": "frequency_penalty",
           "presence": "presence_penalty"}
    if kind in pen:
        return LP.LogitsInputs(**{pen[kind]: getattr(inp, pen[kind])}, counts=inp.counts,
                               count_slots=inp.count_slots)
    if kind == "bias":
        return LP.LogitsInputs(logit_bias=inp.logit_bias)
    if kind == "allowed":
        return LP.LogitsInputs(allowed_mask=inp.allowed_mask)
    if kind == "banned":
        return LP.LogitsInputs(banned=inp.banned)
    return LP.LogitsInputs(min_tokens=inp.min_tokens, num_output_tokens=inp.num_output_tokens,
                           stop_ids=inp.stop_ids)


def _cycled(n, **cols):
    """Per-request parameter tensors: each column's values repeated over n requests."""
    out = {}
    for k, vals in cols.items():
        t = torch.tensor(vals)
        out[k] = t.repeat((n + len(vals) - 1) // len(vals))[:n].to(DEVICE)
    return out


def _gpu_cuda_check(z, inp, kw, tpr, flags, seed=0):
    """CUDA with the forced path == the reference (tokens, valid bit for bit; logprobs)."""
    n = z.shape[0] // tpr
    s = torch.arange(n, device=DEVICE) * 13 + seed
    want = ops.sample_with_logprobs(z, s, s * 3, tokens_per_request=tpr, processing=inp,
                                    backend="reference", **kw)
    with sampler_path(flags):
        got = ops.sample_with_logprobs(z, s, s * 3, tokens_per_request=tpr, processing=inp,
                                       backend="cuda", **kw)
        plain = ops.sample(z, s, s * 3, tokens_per_request=tpr, processing=inp, backend="cuda",
                           **kw)
    torch.cuda.synchronize()
    bad = (got.tokens != want.tokens).nonzero()[:, 0]
    assert bad.numel() == 0, (f"{bad.numel()} rows differ, first {bad[:5].tolist()}: "
                              f"{got.tokens[bad[:5]].tolist()} vs {want.tokens[bad[:5]].tolist()}")
    assert torch.equal(plain.tokens, want.tokens) and torch.equal(plain.valid, want.valid)
    assert torch.equal(got.valid, want.valid)
    v = want.valid
    torch.testing.assert_close(got.logprobs[v], want.logprobs[v], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(got.processed_logprobs[v], want.processed_logprobs[v], atol=1e-3,
                               rtol=1e-4)
    assert torch.isnan(got.logprobs[~v]).all() and torch.isnan(got.processed_logprobs[~v]).all()


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("flags", ["default", "generic", "exact", "stream", "nosplit",
                                   "nosplit_exact", "scand", "launch0"])
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_cuda_paths_with_processing(kind, flags):
    """Every read of the logits by the CUDA sampler applies the processing: each input kind on
    each forced path, at B = 1 / 3 (clusters of up to 16 CTAs with the chunk in shared memory;
    temperature rows: the split launch), 40 rows of 2 tokens per request (small clusters), 300
    (one streamed CTA per row), greedy / temperature rows and mixed top-k (50 and 1000: the
    candidates and the radix thresholds) / top-p / min-p rows: == the reference. "scand": the
    split-candidates launch with processing (the mixed top-k rows at B = 1 / 3 / 24 / 33 on a
    132-SM GPU: 132 down to 4 CTAs per row; k = 1000 rows take its finishing CTA's generic
    path); "launch0": the cluster launch with processing at B = 1 / 3."""
    _skip_unless("cuda")
    flag = _cuda_flag_sets()[flags]
    cases = ((1, 151936, 1), (3, 151936, 1), (40, 32000, 2), (300, 4099, 1))
    if flags == "scand":
        cases = ((1, 151936, 1), (3, 151936, 1), (24, 151936, 2), (33, 32000, 1))
    for B, V, tpr in cases:
        if (flags.startswith("nosplit") or flags == "launch0") and B > 3:
            continue   # (the split launches only take small batches)
        if flags == "stream" and B == 300:
            continue   # (already streams)
        gen = _gen(B * 31 + KINDS.index(kind))
        n = B // tpr
        inp = _kind_only(_gpu_inputs(n, V, gen), kind)
        z = _peak_on(torch.randn(B, V, generator=gen) * 4, inp, tpr).to(DEVICE)
        combos = [_cycled(n, temperature=[0.0, 0.7, 1.0, 1.6]),
                  _cycled(n, temperature=[0.9, 1.0, 0.7, 1.2, 0.8], top_k=[50, 0, 1000, 0, 7],
                          top_p=[0.9, 0.8, 1.0, 1.0, 0.95], min_p=[0.0, 0.05, 0.1, 0.2, 0.0])]
        combos[1]["top_k"] = combos[1]["top_k"].to(torch.int32)
        if flags.startswith("nosplit"):
            combos = combos[:1]
        if flags == "scand":
            combos = combos[1:]   # (only calls with a top-k tensor take it)
        for kw in combos:
            _gpu_cuda_check(z, inp, kw, tpr, flag, seed=B)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_cuda_scand_processing_distribution():
    """The split-candidates launch with processing (F_SCAND_PROC): 2^16 draws made 32
    rows per call (V = 8192: 4 CTAs per row on a 132-SM GPU) follow softmax(apply(z) / T) over
    the top-k + top-p set (chi-square), and every draw is the reference's."""
    _skip_unless("cuda")
    from tokenspeed_kernel import testing
    from tokenspeed_kernel.ops import sampling as S
    gen = _gen(77)
    V, B, n = 8192, 32, 1 << 16
    inp = _inputs("all", 1, V, gen)
    z = (torch.randn(1, V, generator=gen) * 1.5).to(DEVICE)
    kw = dict(temperature=0.9, top_k=50, top_p=0.9)
    probs = ref.probabilities(LP.apply(z, inp), temperature=torch.tensor([0.9], device=DEVICE),
                              top_k=torch.tensor([50], dtype=torch.int32, device=DEVICE),
                              top_p=torch.tensor([0.9], device=DEVICE))[0].cpu().numpy()
    assert (probs > 0).sum() >= 10
    rinp = _replicated(inp, B)
    zb = z.expand(B, V)
    got, want = [], []
    for c in range(n // B):
        i = torch.arange(c * B, (c + 1) * B, device=DEVICE)
        with testing.knobs(sampler_flags=S.F_SCAND_PROC):
            got.append(ops.sample(zb, 1000 + i, i % 7, processing=rinp, backend="cuda",
                                  **kw).tokens)
        if c < 64:
            want.append(ops.sample(zb, 1000 + i, i % 7, processing=rinp, backend="reference",
                                   **kw).tokens)
    tok = torch.cat(got)
    assert torch.equal(tok[:64 * B], torch.cat(want))
    counts = torch.bincount(tok, minlength=V).cpu().numpy()
    assert counts[probs == 0].sum() == 0, "draws outside the processed support"
    pval = _pooled_chisquare(counts[probs > 0], probs[probs > 0] * n)
    assert pval > ALPHA, f"chi-square p = {pval:.2e}"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_cuda_processing_dtypes_and_rows():
    """bf16 / fp16 logits (8 elements per 16-byte vector), rows with a stride larger than V and
    unaligned row starts (scalar loads), a long bias list (3000 entries: hash collisions), a
    request with every token banned (invalid), flat rows (top-p / min-p kept sets beyond the
    candidates): CUDA == the reference on several paths."""
    _skip_unless("cuda")
    flags = _cuda_flag_sets()
    gen = _gen(95)
    B, V = 6, 32003
    inp = _gpu_inputs(B, V, gen)
    ids = [torch.randperm(V, generator=gen)[:3000].tolist() for _ in range(B)]
    inp = inp._replace(logit_bias=_csr(ids, gen, values=True),
                       banned=_csr([list(range(V))] + [[7, 8, 9]] * (B - 1)))
    big = (torch.randn(B, V + 41, generator=gen) * 3).to(DEVICE)   # (sliced on the device)
    flat = (torch.randn(B, V, generator=gen) * 0.05).to(DEVICE)
    T = torch.full((B,), 0.9, device=DEVICE)
    for z in (big[:, :V], big[:, 1:V + 1], big.to(torch.bfloat16)[:, :V],
              big.to(torch.float16)[:, 1:V + 1], flat):
        assert z is flat or z.stride(0) == V + 41
        for kw in (dict(temperature=T), dict(temperature=T, top_k=torch.full(
                (B,), 40, dtype=torch.int32, device=DEVICE), top_p=torch.full(
                (B,), 0.9, device=DEVICE)), dict(temperature=T, top_p=torch.full(
                (B,), 0.95, device=DEVICE)), dict(temperature=T, min_p=torch.full(
                (B,), 0.3, device=DEVICE))):
            for f in ("default", "generic", "stream", "nosplit_exact", "scand", "launch0"):
                _gpu_cuda_check(z, inp, kw, 1, flags[f])


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_triton_no_new_variants_without_processing():
    """Calls without processing compile the kernels they compiled before (PROC = 0), and calls
    with processing do not add variants to later calls without it."""
    from test_triton_compile import _cache_sizes
    from tokenspeed_kernel.triton import sampling as tri
    V, B = 32000, 8
    gen = _gen(90)
    z = (torch.randn(B, V, generator=gen) * 4).to(DEVICE)
    s = torch.arange(B, device=DEVICE)
    kw = dict(temperature=torch.full((B,), 0.8, device=DEVICE),
              top_k=torch.full((B,), 50, dtype=torch.int32, device=DEVICE),
              top_p=torch.full((B,), 0.9, device=DEVICE))

    def plain():
        ops.sample(z, s, s, backend="triton", validate=False, **kw)
        ops.sample_with_logprobs(z, s, s, backend="triton", validate=False, **kw)

    plain()
    torch.cuda.synchronize()
    before = _cache_sizes(tri)
    inp = _gpu_inputs(B, V, gen)
    ops.sample(z, s, s, backend="triton", processing=inp, **kw)
    torch.cuda.synchronize()
    with_proc = _cache_sizes(tri)
    assert sum(with_proc.values()) > sum(before.values())   # processing variants exist
    for name, cnt in with_proc.items():
        if name not in ("_k1_partial", "_k2_mass", "_k3_finalize", "_prep_masks"):
            assert cnt == before.get(name, 0), name
    plain()
    torch.cuda.synchronize()
    assert _cache_sizes(tri) == with_proc
    # a new processing combination: new variants for it only; plain calls stay as they were
    ops.sample(z, s, s, backend="triton", processing=LP.LogitsInputs(banned=inp.banned), **kw)
    plain()
    torch.cuda.synchronize()
    after = _cache_sizes(tri)
    for name in ("_k1_partial", "_k3_finalize"):
        assert after[name] == with_proc[name] + 1, (name, with_proc, after)


def test_triton_sampler_compiles_for_sm90():
    """Every Triton sampler kernel variant of the bench's modes, with and without processing (and
    with logprobs), compiles ahead of time for sm_90 with the GPU launch configuration
    (tests/triton_sampling_aot.py): the interpreter does not compile, so this is what catches a
    kernel that only the GPU build rejects."""
    import triton_aot
    import triton_sampling_aot
    triton_aot.run_script("triton_sampling_aot.py", oks=triton_sampling_aot.expected_oks())


def test_triton_bias_values_per_id():
    """Each bias id gets its own value: ids listed out of order, sharing words, at word edges
    (0, 31, 32, 63, V - 1) and one request without entries."""
    skip_unless_backend("triton")
    V = 200
    lists = [[63, 5, 32, 0, 31, 199, 36], [], [7, 6, 64, 38, 39, 1]]
    n = len(lists)
    gen = _gen(77)
    z = (torch.randn(n, V, generator=gen) * 0.1).to(DEVICE)
    bias = _csr(lists, gen, values=True)
    inp = LP.LogitsInputs(logit_bias=bias)
    # greedy: each request's winner is its largest bias (|values| ~ 4 >> the logits' spread)
    s = torch.arange(n, device=DEVICE)
    want = ops.sample_with_logprobs(z, s, s, temperature=torch.zeros(n, device=DEVICE),
                                    processing=inp, backend="reference")
    got = ops.sample_with_logprobs(z, s, s, temperature=torch.zeros(n, device=DEVICE),
                                   processing=inp, backend="triton")
    assert torch.equal(got.tokens, want.tokens)
    vals = bias.values.cpu().tolist()
    e = 0
    for q, ids in enumerate(lists):
        if ids:
            j = max(range(len(ids)), key=lambda i: vals[e + i])
            if vals[e + j] > 1.0:
                assert got.tokens[q].item() == ids[j]
        e += len(ids)
    _compare(z, inp, FILTER_SETS["temperature"](n), seeds=(3, 4), tpr=1)


# ---------------------------------------------------------------------------------------------
# unvalidated bad inputs (validate=False: what a wrong value inside a CUDA graph reaches)
# ---------------------------------------------------------------------------------------------
def _t(v, dt=torch.int64):
    return torch.tensor(v, dtype=dt, device=DEVICE)


def _bad_inputs_cases():
    """(name, LogitsInputs, expected greedy tokens) on logits ``1 - 0.01 t`` (token 0 is the
    argmax, then 1, 2, ...): the rules every backend follows for unvalidated values (request q
    owns CSR entries [clamp(indptr[q], 0, nnz), clamp(indptr[q + 1], that, nnz)), ids outside
    [0, V) are skipped, a repeated bias id keeps its last entry, a count slot outside [0, N)
    turns the request's penalties off). Each case's expectation differs from the other rules'
    (no clamp, first entry, sum of entries, penalties on slot 0). The last flag: whether the
    CUDA backend gives the same tokens (with overlapping bias ranges its per-request bias
    tables overlap: in bounds, values unspecified)."""
    f32 = torch.float32
    counts = ops.new_token_counts(2, 64, device=DEVICE)
    counts.seen[:, 0] = 1                     # token 0 seen in both slots
    return [
        ("bias ranges clamped", LP.LogitsInputs(logit_bias=LP.Csr(
            _t([-4, 1, 1, 9, 9]), _t([10, 20, 30]), _t([5.0, 6.0, 7.0], f32))),
         [10, 0, 30, 0], True),
        ("bias ranges overlapping", LP.LogitsInputs(logit_bias=LP.Csr(
            _t([-4, 1, 0, 9, 2]), _t([10, 20, 30]), _t([5.0, 6.0, 7.0], f32))),
         [10, 0, 30, 0], False),
        ("bias ids outside V, repeated ids", LP.LogitsInputs(logit_bias=LP.Csr(
            _t([0, 2, 4, 7, 10]), _t([70, 5, -1, 6, 7, 8, 7, 9, 8, 9]),
            _t([9.0, 1.0, 9.0, 2.0, 2.0, 2.5, 3.0, 3.0, 2.0, 1.0], f32))), [5, 6, 7, 8], True),
        ("banned ranges clamped, ids outside V", LP.LogitsInputs(banned=LP.Csr(
            _t([-1, 1, 5, 2, 9]), _t([0, 64, 0, -2, 1]))), [1, 2, 0, 2], True),
        ("count slots outside [0, N)", LP.LogitsInputs(
            repetition_penalty=_t([100.0] * 4, f32), counts=counts,
            count_slots=_t([0, 2, -1, 1])), [1, 0, 0, 1], True),
        ("stop ids outside V", LP.LogitsInputs(
            min_tokens=_t([5, 0, 5, 0]), num_output_tokens=_t([0, 0, 0, 0]),
            stop_ids=LP.Csr(_t([0, 2, 2, 3, 3]), _t([70, 0, -5]))), [1, 0, 0, 0], True),
    ]


@pytest.mark.parametrize("backend", ["reference", "triton", "cuda"])
def test_unvalidated_bad_inputs_follow_the_kernels_rules(backend):
    """validate=False with malformed CSR offsets, ids outside [0, V), repeated bias ids and
    count slots outside [0, N): no error, no out-of-bounds access, and the same documented
    tokens on every backend (docs/DESIGN.md, error table); with validate=True each raises."""
    _skip_unless(backend)
    V = 64
    x = (1.0 - 0.01 * torch.arange(V, dtype=torch.float32, device=DEVICE)).repeat(4, 1)
    for name, inp, want, cuda_exact in _bad_inputs_cases():
        out = ops.sample(x, 1, 0, temperature=0.0, processing=inp, backend=backend,
                         validate=False)
        if backend != "cuda" or cuda_exact:
            assert out.tokens.tolist() == want, (name, out.tokens.tolist())
        else:
            torch.cuda.synchronize()   # (a launch error would surface here)
        assert out.valid.all(), name
        with pytest.raises(ValueError, match="processing"):
            ops.sample(x, 1, 0, temperature=0.0, processing=inp, backend=backend)
