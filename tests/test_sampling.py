"""Tests of ``ops.sample`` / ``ops.sample_with_logprobs`` on every backend.

The reference (``tokenspeed_kernel.reference.sampling``) is the spec: the Triton and CUDA
backends must return *the same tokens* (bit-exact Philox, float32 op sequences and integer filter
decisions), so most tests compare tokens for equality, not distributions (statistics live in
test_sampling_stats.py).

Shape grid (why these sizes):
* V = 111: odd, smaller than any block, not a multiple of 4 (Philox lanes) or 16;
* V = 4097: one past a power of two (a tail chunk of 1 element);
* V = 32000 / 151936 / 262144: real vocabularies (Llama-2, Qwen, Gemma), GPU runs (CPU: 32000 only
  with a couple of rows, since the Triton interpreter is slow);
* batch 1 (split-vocabulary paths) and batch > 1024 (GPU grids wider than one wave);
* bf16 and integer-valued logits: many exact ties, at the top-k and top-p boundaries too.
"""
from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, HAS_CUDA, skip_unless_backend
import tokenspeed_kernel
from tokenspeed_kernel import ops
from tokenspeed_kernel.reference import prims
from tokenspeed_kernel.reference import sampling as ref

# numpy warnings of the Triton interpreter on NaN / inf rows (expected; results are masked)
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

F_TEMP, F_TOPK, F_TOPP, F_MINP, F_LOGPROBS = 1, 2, 4, 8, 16

ON_GPU = HAS_CUDA


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _logits(R, V, gen, dtype=torch.float32, scale=3.0, kind="randn"):
    if kind == "randn":
        z = torch.randn(R, V, generator=gen) * scale
    elif kind == "int":      # integer-valued: many exact ties
        z = torch.randint(-4, 4, (R, V), generator=gen).float()
    else:
        raise ValueError(kind)
    return z.to(dtype).to(DEVICE)


FILTERS = ("none", "temperature", "top_k", "top_p", "min_p", "top_k_top_p", "all", "greedy_mix")


def _params(kind: str, n: int, V: int, gen: torch.Generator) -> dict:
    """Per-request filter tensors (on DEVICE) for a filter combination ``kind``."""
    def u(lo, hi):
        return (torch.rand(n, generator=gen) * (hi - lo) + lo).float()

    T = u(0.3, 1.7)
    k = torch.randint(1, max(2, min(V, 64)), (n,), generator=gen, dtype=torch.int32)
    # a few top-k corner values: off (0, -1, V, V + 3), k = 1, k = V - 1, large k
    corner = torch.tensor([0, -1, V, V + 3, 1, max(V - 1, 1), max(V // 2, 1)], dtype=torch.int32)
    pick = torch.rand(n, generator=gen) < 0.3
    k = torch.where(pick, corner[torch.randint(0, len(corner), (n,), generator=gen)], k)
    p = u(0.05, 1.0)
    p = torch.where(torch.rand(n, generator=gen) < 0.15, torch.ones(n), p)
    p = torch.where(torch.rand(n, generator=gen) < 0.1, torch.full((n,), 0.01), p)
    mp = u(0.0, 0.3)
    mp = torch.where(torch.rand(n, generator=gen) < 0.15, torch.zeros(n), mp)
    out = {"none": {},
           "temperature": dict(temperature=T),
           "top_k": dict(temperature=T, top_k=k),
           "top_p": dict(temperature=T, top_p=p),
           "min_p": dict(temperature=T, min_p=mp),
           "top_k_top_p": dict(temperature=T, top_k=k, top_p=p),
           "all": dict(temperature=T, top_k=k, top_p=p, min_p=mp),
           "greedy_mix": dict(temperature=torch.where(torch.rand(n, generator=gen) < 0.5,
                                                      torch.zeros(n), T),
                              top_k=k, top_p=p, min_p=mp)}[kind]
    return {name: t.to(DEVICE) for name, t in out.items()}


def _seeds(n: int, gen: torch.Generator):
    seed = torch.randint(-2**62, 2**62, (n,), generator=gen).to(DEVICE)
    offset = torch.randint(0, 2**40, (n,), generator=gen).to(DEVICE)
    return seed, offset


def _ref(logits, seed, offset, tokens_per_request=1, **kw):
    """The spec, called directly (no ops layer), on the logits' device."""
    return ref.sample(logits, seed, offset, kw.get("temperature"), kw.get("top_k"),
                      kw.get("top_p"), kw.get("min_p"), tokens_per_request)


def _kept(logits, tokens_per_request=1, **kw):
    """Kept mask [R, V] of each row, as the reference defines it (greedy rows: the max)."""
    R, V = logits.shape
    dev = logits.device
    zero = torch.zeros(R // tokens_per_request, dtype=torch.int64, device=dev)
    T, k, p, mp, _, _ = ref._gather_params(R, tokens_per_request, kw.get("temperature"),
                                           kw.get("top_k"), kw.get("top_p"), kw.get("min_p"),
                                           zero, zero, dev)
    z, y, _, greedy, _ = ref.process(logits, T)
    kept, order = ref.kept_mask(z, y, torch.where(greedy, torch.zeros_like(k), k),
                                torch.where(greedy, torch.ones_like(p), p),
                                torch.where(greedy, torch.zeros_like(mp), mp))
    first = torch.zeros_like(kept).scatter(1, order[:, :1], True)
    return torch.where(greedy[:, None], first, kept)


# ---------------------------------------------------------------------------------------------
# argument validation (backend-independent: ops validates before dispatch)
# ---------------------------------------------------------------------------------------------
_BAD = [  # (argument named in the error, case id, call overrides)
    ("logits", "int32", dict(logits=torch.randn(4, 16).to(torch.int32))),
    ("logits", "float64", dict(logits=torch.randn(4, 16).double())),
    ("logits", "rank1", dict(logits=torch.randn(16))),
    ("logits", "rank3", dict(logits=torch.randn(1, 4, 16))),
    ("logits", "noncontig", dict(logits=torch.randn(16, 4).t())),
    ("logits", "empty_vocab", dict(logits=torch.randn(4, 0))),
    ("seed", "none", dict(seed=None)),
    ("seed", "length", dict(seed=torch.arange(3))),
    ("seed", "float", dict(seed=torch.zeros(4))),
    ("seed", "device", dict(seed=torch.arange(4, device="meta"))),
    ("offset", "length", dict(offset=torch.arange(5))),
    ("offset", "rank2", dict(offset=torch.arange(4)[:, None])),
    ("temperature", "length", dict(temperature=torch.ones(3))),
    ("temperature", "negative", dict(temperature=torch.tensor([1.0, -0.5, 1.0, 1.0]))),
    ("temperature", "nan", dict(temperature=torch.tensor([1.0, float("nan"), 1.0, 1.0]))),
    ("temperature", "inf", dict(temperature=torch.tensor([1.0, float("inf"), 1.0, 1.0]))),
    ("temperature", "negative_scalar", dict(temperature=-1.0)),
    ("top_k", "float", dict(top_k=torch.ones(4))),
    ("top_k", "length", dict(top_k=torch.ones(5, dtype=torch.int32))),
    ("top_p", "zero", dict(top_p=torch.tensor([0.5, 0.0, 0.5, 0.5]))),
    ("top_p", "above_1", dict(top_p=torch.tensor([0.5, 1.5, 0.5, 0.5]))),
    ("top_p", "negative", dict(top_p=torch.tensor([0.5, -0.1, 0.5, 0.5]))),
    ("top_p", "nan", dict(top_p=torch.tensor([0.5, float("nan"), 0.5, 0.5]))),
    ("top_p", "int", dict(top_p=torch.ones(4, dtype=torch.int32))),
    ("top_p", "zero_scalar", dict(top_p=0.0)),
    ("min_p", "negative", dict(min_p=torch.tensor([0.5, -0.1, 0.5, 0.5]))),
    ("min_p", "above_1", dict(min_p=torch.tensor([0.5, 1.01, 0.5, 0.5]))),
    ("min_p", "above_1_scalar", dict(min_p=2.0)),
    ("tokens_per_request", "zero", dict(tokens_per_request=0)),
    ("tokens_per_request", "not_divisor", dict(tokens_per_request=3)),   # 4 rows
    ("tokens_per_request", "float", dict(tokens_per_request=2.0)),
    ("out_dtype", "float", dict(out_dtype=torch.float32)),
    ("backend", "unknown", dict(backend="numpy")),
    ("top_n", "negative", dict(top_n=-1, _logprobs=True)),
    ("top_n", "above_V", dict(top_n=17, _logprobs=True)),
    # issue 33: wrong Python types (ArgumentTypeError: a TypeError and a ValueError), values
    # out of the parameter's range, meta tensors
    ("logits", "meta", dict(logits=torch.randn(4, 16, device="meta"))),
    ("seed", "py_float", dict(seed=1.5)),
    ("seed", "py_float_integral", dict(seed=2.0)),
    ("seed", "py_bool", dict(seed=True)),
    ("seed", "2**64", dict(seed=2**64)),
    ("seed", "below_-2**63", dict(seed=-(2**63) - 1)),
    ("seed", "bool_tensor", dict(seed=torch.ones(4, dtype=torch.bool))),
    ("seed", "string", dict(seed="7")),
    ("offset", "py_float", dict(offset=1.5)),
    ("offset", "2**64", dict(offset=2**64)),
    ("top_k", "py_float", dict(top_k=2.5)),
    ("top_k", "py_bool", dict(top_k=True)),
    ("top_k", "bool_tensor", dict(top_k=torch.ones(4, dtype=torch.bool))),
    ("temperature", "py_bool", dict(temperature=True)),
    ("temperature", "string", dict(temperature="0.5")),
    ("temperature", "int_tensor", dict(temperature=torch.ones(4, dtype=torch.int32))),
    ("temperature", "beyond_float", dict(temperature=10**400)),
    ("temperature", "f64_beyond_f32", dict(temperature=torch.full((4,), 1e300,
                                                                  dtype=torch.float64))),
    ("temperature", "neg_inf_scalar", dict(temperature=float("-inf"))),
    ("top_p", "nan_scalar", dict(top_p=float("nan"))),
    ("top_p", "inf", dict(top_p=torch.tensor([0.5, float("inf"), 0.5, 0.5]))),
    ("min_p", "nan", dict(min_p=torch.tensor([0.5, float("nan"), 0.5, 0.5]))),
    ("min_p", "py_bool", dict(min_p=False)),
    ("tokens_per_request", "py_bool", dict(tokens_per_request=True)),
    ("tokens_per_request", "tensor", dict(tokens_per_request=torch.tensor(2))),
    ("top_n", "py_bool", dict(top_n=True, _logprobs=True)),
    ("top_n", "py_float", dict(top_n=2.0, _logprobs=True)),
    ("top_k_max", "py_bool", dict(top_k_max=True)),
    ("top_k_max", "zero", dict(top_k_max=0)),
]
# the cases above whose error is an ArgumentTypeError (a wrong Python type)
_TYPE_ERRORS = {"py_float", "py_float_integral", "py_bool", "string"}


@pytest.mark.parametrize("arg,kw", [(a, kw) for a, _, kw in _BAD],
                         ids=[f"{a}-{i}" for a, i, _ in _BAD])
def test_sample_validation_errors(arg, kw):
    """Bad arguments raise ValueError whose message starts with the argument's name. A
    partially bad per-request tensor (one bad entry) must be caught too."""
    kw = dict(kw)
    logprobs = kw.pop("_logprobs", False)
    call = dict(logits=torch.randn(4, 16), seed=torch.arange(4), offset=torch.arange(4),
                backend="reference")
    call.update(kw)
    fn = ops.sample_with_logprobs if logprobs else ops.sample
    logits = call.pop("logits")
    seed = call.pop("seed")
    offset = call.pop("offset")
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        fn(logits, seed, offset, **call)


@pytest.mark.parametrize("arg,kw", [(a, kw) for a, i, kw in _BAD if i in _TYPE_ERRORS],
                         ids=[f"{a}-{i}" for a, i, _ in _BAD if i in _TYPE_ERRORS])
def test_sample_wrong_python_types_raise_type_error(arg, kw):
    """A float (1.5 and 2.0 alike) or a bool for an integer parameter, a bool or a string for a
    float one: TypeError naming the argument (never a truncated value). It is also a
    ValueError (ops' other argument errors), so one ``except ValueError`` catches all."""
    kw = dict(kw)
    fn = ops.sample_with_logprobs if kw.pop("_logprobs", False) else ops.sample
    call = dict(seed=torch.arange(4), offset=torch.arange(4), backend="reference")
    call.update(kw)
    with pytest.raises(TypeError, match=rf"^{arg}\b"):
        fn(torch.randn(4, 16), call.pop("seed"), call.pop("offset"), **call)


def test_sample_huge_top_k_is_off_and_seeds_are_64_bit(backend):
    """top_k means "off" for k <= 0 and k >= V whatever its size: 2**32 + 1 (which an int32 cast
    would wrap to 1), 2**40, 10**30, int64 tensors beyond int32 and hugely negative values all
    give the tokens of no top-k (they saturate, never wrap). A seed / offset is 64 bits: ints in
    [2**63, 2**64) are their two's-complement int64 (same Philox key / counter); numpy ints are
    ints."""
    import numpy as np
    gen = _gen(33)
    R, V = 5, 37
    z = _logits(R, V, gen)
    seed, offset = _seeds(R, gen)
    T = torch.full((R,), 0.8, device=DEVICE)
    base = ops.sample(z, seed, offset, temperature=T, backend=backend).tokens
    for k in (2**32 + 1, 2**40, 10**30, -(2**40), V, np.int64(2**40),
              torch.full((R,), 2**32 + 1, device=DEVICE),
              torch.full((R,), -(2**40), device=DEVICE)):
        got = ops.sample(z, seed, offset, temperature=T, top_k=k, backend=backend).tokens
        assert torch.equal(got, base), k
    # k = 1 is greedy-like: the wrap that 2**32 + 1 used to take would give this
    k1 = ops.sample(z, seed, offset, temperature=T, top_k=1, backend=backend).tokens
    assert torch.equal(k1, z.argmax(1))
    for s_big, s_neg in ((2**64 - 1, -1), (2**63, -(2**63))):
        a = ops.sample(z, s_big, s_big, temperature=T, backend=backend).tokens
        b = ops.sample(z, s_neg, s_neg, temperature=T, backend=backend).tokens
        assert torch.equal(a, b)
    a = ops.sample(z, np.int64(7), np.uint32(3), temperature=0.8, backend=backend,
                   tokens_per_request=np.int64(R)).tokens
    b = ops.sample(z, 7, 3, temperature=0.8, backend=backend, tokens_per_request=R).tokens
    assert torch.equal(a, b)


def test_sample_validation_accepts_edges():
    """Boundary values that are legal: k <= 0 / k >= V (off), p == 1, min_p in {0, 1}, T == 0,
    Python scalars, int32 seeds, any row stride, a single-token vocabulary."""
    z = torch.randn(4, 16)
    for kw in (dict(top_k=torch.tensor([0, -5, 16, 1000], dtype=torch.int32)),
               dict(top_p=1.0), dict(min_p=0.0), dict(min_p=1.0), dict(temperature=0.0),
               dict(temperature=0.5, top_k=3, top_p=0.5, min_p=0.1)):
        out = ops.sample(z, 1, 2, backend="reference", **kw)
        assert out.tokens.shape == (4,) and out.valid.all()
    ops.sample(z, torch.arange(4, dtype=torch.int32), torch.arange(4, dtype=torch.int32),
               backend="reference")
    wide = torch.randn(4, 40)[:, 3:19]
    assert ops.sample(wide, 0, 0, backend="reference").tokens.shape == (4,)
    one = ops.sample(torch.randn(3, 1), 0, 0, backend="reference")
    assert one.tokens.tolist() == [0, 0, 0] and one.valid.all()


# ---------------------------------------------------------------------------------------------
# exactness: every backend returns the reference's tokens
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("filters", FILTERS)
def test_sample_matches_reference(backend, filters):
    gen = _gen(FILTERS.index(filters))
    R, V = 24, 111 if not ON_GPU else 1000
    z = _logits(R, V, gen)
    seed, offset = _seeds(R, gen)
    kw = _params(filters, R, V, gen)
    want = _ref(z, seed, offset, **kw)
    got = ops.sample(z, seed, offset, backend=backend, **kw)
    assert torch.equal(got.tokens, want[0])
    assert torch.equal(got.valid, want[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["randn", "int"])
def test_sample_matches_reference_dtypes(backend, dtype, kind):
    """Native bf16 / fp16 reads, and integer-valued logits (ties everywhere)."""
    gen = _gen(7)
    R, V = 16, 257
    z = _logits(R, V, gen, dtype=dtype, kind=kind)
    seed, offset = _seeds(R, gen)
    kw = _params("all", R, V, gen)
    want = _ref(z, seed, offset, **kw)
    got = ops.sample(z, seed, offset, backend=backend, **kw)
    assert torch.equal(got.tokens, want[0])
    assert torch.equal(got.valid, want[1])


# V sizes; see the module docstring. (R, V) pairs: CPU keeps the interpreter affordable.
_VOCABS_CPU = [(3, 111), (3, 4097), (2, 32000)]
_VOCABS_GPU = [(1, 111), (1500, 111), (1, 32000), (1100, 32000), (1, 151936), (64, 151936),
               (1, 262144), (33, 262144)]


@pytest.mark.parametrize("R,V", _VOCABS_GPU if ON_GPU else _VOCABS_CPU)
@pytest.mark.parametrize("filters", ["temperature", "all"])
def test_sample_vocab_sizes(backend, R, V, filters):
    gen = _gen(V + R)
    z = _logits(R, V, gen, dtype=torch.bfloat16 if V % 2 else torch.float32)
    seed, offset = _seeds(R, gen)
    kw = _params(filters, R, V, gen)
    if filters == "all" and V > 1000:  # k beyond the CUDA fast-path bound (256), k off, small k
        kw["top_k"] = torch.tensor([1000, 0, 300, 5], dtype=torch.int32,
                                   device=DEVICE)[torch.arange(R, device=DEVICE) % 4]
    want = _ref(z, seed, offset, **kw)
    got = ops.sample(z, seed, offset, backend=backend, **kw)
    assert torch.equal(got.tokens, want[0])
    assert torch.equal(got.valid, want[1])


def _fuzz_case(i: int):
    """Random case i: V (odd sizes included), dtype, specials, strides, tokens_per_request,
    partial parameter sets (None = not given), 64-bit seeds and offsets."""
    g = _gen(1000 + i)

    def r():
        return torch.rand(1, generator=g).item()

    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    R, V = ri(1, 9), ri(1, 700)
    kind = i % 5
    if kind == 0:
        z = torch.randn(R, V, generator=g) * 4
    elif kind == 1:
        z = torch.randint(-3, 3, (R, V), generator=g).float()
    elif kind == 2:
        z = (torch.randn(R, V, generator=g) * 2).bfloat16()
    elif kind == 3:
        z = (torch.randn(R, V, generator=g) * 2).half()
    else:
        z = torch.randn(R, V, generator=g)
        z[torch.rand(R, V, generator=g) < 0.5] = float("-inf")
    if r() < 0.3:
        z[ri(0, R), ri(0, V)] = [float("nan"), float("inf"), float("-inf")][ri(0, 3)]
    if r() < 0.2:
        z[0, :] = float("-inf")
    if r() < 0.3:   # a view into a wider buffer
        big = torch.zeros(R, V + 37, dtype=z.dtype)
        big[:, 5:5 + V] = z
        z = big[:, 5:5 + V]
    tpr = R if (r() < 0.4 and R > 1) else 1
    n = R // tpr
    T = torch.where(torch.rand(n, generator=g) < 0.2, torch.zeros(n),
                    torch.rand(n, generator=g) * 2 + 0.05)
    k = torch.randint(-2, V + 3, (n,), generator=g, dtype=torch.int32)
    k = torch.where(torch.rand(n, generator=g) < 0.5,
                    torch.randint(1, 5, (n,), generator=g, dtype=torch.int32), k)
    p = torch.where(torch.rand(n, generator=g) < 0.3, torch.ones(n),
                    torch.rand(n, generator=g).clamp_min(0.001))
    mp = torch.where(torch.rand(n, generator=g) < 0.5, torch.zeros(n), torch.rand(n, generator=g))
    seed = torch.randint(-2**62, 2**62, (n,), generator=g)
    offset = torch.randint(-2**40, 2**62, (n,), generator=g)
    kw = {name: t.to(DEVICE) for name, t in
          zip(("temperature", "top_k", "top_p", "min_p"), (T, k, p, mp)) if r() < 0.7}
    return z.to(DEVICE), seed.to(DEVICE), offset.to(DEVICE), tpr, kw


@pytest.mark.parametrize("i", range(96 if ON_GPU else 40))
def test_sample_fuzz_matches_reference(backend, i):
    z, seed, offset, tpr, kw = _fuzz_case(i)
    want = _ref(z, seed, offset, tokens_per_request=tpr, **kw)
    got = ops.sample_with_logprobs(z, seed, offset, tokens_per_request=tpr, backend=backend, **kw)
    assert torch.equal(got.tokens, want[0])
    assert torch.equal(got.valid, want[1])
    v = want[1]
    torch.testing.assert_close(got.logprobs[v], want[2][v], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.processed_logprobs[v], want[3][v], atol=1e-4, rtol=1e-4)
    assert torch.isnan(got.logprobs[~v]).all() and torch.isnan(got.processed_logprobs[~v]).all()


def test_sample_strided_rows(backend):
    """Any row stride (last dim contiguous): a view into a wider buffer, and a stride-0 batch."""
    gen = _gen(11)
    big = _logits(6, 300, gen)
    z = big[:, 17:17 + 211]
    assert z.stride(0) == 300
    seed, offset = _seeds(6, gen)
    kw = _params("all", 6, 211, gen)
    assert torch.equal(ops.sample(z, seed, offset, backend=backend, **kw).tokens,
                       _ref(z.contiguous(), seed, offset, **kw)[0])
    row = _logits(1, 97, gen).expand(8, 97)   # stride(0) == 0
    seed, offset = _seeds(8, gen)
    assert torch.equal(ops.sample(row, seed, offset, backend=backend, top_p=0.7).tokens,
                       _ref(row.contiguous(), seed, offset,
                            top_p=torch.full((8,), 0.7, device=DEVICE))[0])


def test_sample_determinism(backend):
    gen = _gen(3)
    R, V = 8, 333
    z = _logits(R, V, gen, scale=0.5)   # flat: different noise almost surely moves the token
    seed, offset = _seeds(R, gen)
    kw = _params("top_k_top_p", R, V, gen)
    kw["top_k"] = torch.zeros_like(kw["top_k"])
    kw["top_p"] = torch.full_like(kw["top_p"], 0.95)
    a = ops.sample(z, seed, offset, backend=backend, **kw).tokens
    b = ops.sample(z, seed, offset, backend=backend, **kw).tokens
    assert torch.equal(a, b)
    c = ops.sample(z, seed + 1, offset, backend=backend, **kw).tokens
    d = ops.sample(z, seed, offset + 1, backend=backend, **kw).tokens
    assert (a != c).sum() >= R // 2 and (a != d).sum() >= R // 2


def test_sample_batch_invariance(backend):
    """A row's token depends only on (seed, offset, its logits and parameters): not on its
    position, its batch-mates or the batch size."""
    gen = _gen(5)
    R, V = 12, 199
    z = _logits(R, V, gen)
    seed, offset = _seeds(R, gen)
    kw = _params("greedy_mix", R, V, gen)
    base = ops.sample(z, seed, offset, backend=backend, **kw).tokens
    perm = torch.randperm(R, generator=gen).to(DEVICE)
    got = ops.sample(z[perm], seed[perm], offset[perm], backend=backend,
                     **{k: v[perm] for k, v in kw.items()}).tokens
    assert torch.equal(got, base[perm])
    # new batch-mates (different logits, parameters, seeds) around rows 3 and 7
    z2 = _logits(R, V, gen)
    seed2, offset2 = _seeds(R, gen)
    kw2 = _params("all", R, V, gen)
    for r in (3, 7):
        z2[r] = z[r]
        seed2[r], offset2[r] = seed[r], offset[r]
        for name in kw2:
            kw2[name][r] = kw[name][r]
    kw2 = {n: kw2[n] for n in kw}
    got = ops.sample(z2, seed2, offset2, backend=backend, **kw2).tokens
    assert got[3] == base[3] and got[7] == base[7]
    one = ops.sample(z[5:6], seed[5:6], offset[5:6], backend=backend,
                     **{k: v[5:6] for k, v in kw.items()}).tokens
    assert one[0] == base[5]


@pytest.mark.parametrize("tpr", [2, 5])
def test_sample_tokens_per_request(backend, tpr):
    """Row r = request r // tpr, position j = r % tpr: request parameters, offset[q] + j."""
    gen = _gen(tpr)
    n, V = 4, 150
    R = n * tpr
    z = _logits(R, V, gen)
    seed, offset = _seeds(n, gen)
    kw = _params("greedy_mix", n, V, gen)
    got = ops.sample(z, seed, offset, tokens_per_request=tpr, backend=backend, **kw).tokens
    q = torch.arange(R, device=DEVICE) // tpr
    j = torch.arange(R, device=DEVICE) % tpr
    flat = ops.sample(z, seed[q], offset[q] + j, backend=backend,
                      **{k: v[q] for k, v in kw.items()}).tokens
    assert torch.equal(got, flat)
    assert torch.equal(got, _ref(z, seed, offset, tokens_per_request=tpr, **kw)[0])


def test_sample_greedy(backend):
    """T == 0: argmax of the raw row, lowest id among ties (-0.0 ties +0.0), filters ignored;
    mixed with sampled rows in one batch."""
    V = 50
    z = torch.full((6, V), -3.0)
    z[0, [7, 20, 41]] = 2.0                        # tie: 7
    z[1, 49] = 5.0
    z[2, :] = 1.0                                  # all tied: 0
    z[3, [4, 9]] = torch.tensor([-0.0, 0.0])       # -0.0 == +0.0: 4
    z[3, :4] = -1.0
    z[4, [0, 1]] = float("-inf")                   # -inf entries are legal
    z[4, 30] = 1.0
    z[5] = torch.randn(V, generator=_gen(0))       # sampled row
    z = z.to(DEVICE)
    T = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0], device=DEVICE)
    kw = dict(temperature=T, top_k=torch.tensor([1, 3, 2, 5, 2, 10], dtype=torch.int32,
                                                   device=DEVICE),
              top_p=torch.full((6,), 0.3, device=DEVICE), min_p=torch.full((6,), 0.5,
                                                                         device=DEVICE))
    seed, offset = _seeds(6, _gen(1))
    got = ops.sample(z, seed, offset, backend=backend, **kw)
    assert got.tokens[:5].tolist() == [7, 49, 0, 4, 30]
    assert got.valid.all()
    assert torch.equal(got.tokens, _ref(z, seed, offset, **kw)[0])


@pytest.mark.parametrize("filters", ["top_k", "top_p", "min_p", "all", "greedy_mix"])
def test_sample_support(backend, filters):
    """Never outside the kept set (reference.sampling.kept_mask), many rows."""
    gen = _gen(17)
    R = 512 if ON_GPU or backend == "reference" else 96
    V = 64
    z = _logits(R, V, gen, kind="int" if filters in ("top_p", "all") else "randn",
                dtype=torch.bfloat16)
    seed, offset = _seeds(R, gen)
    kw = _params(filters, R, V, gen)
    tok = ops.sample(z, seed, offset, backend=backend, **kw).tokens
    kept = _kept(z, **kw)
    assert kept.gather(1, tok[:, None]).all()


def test_sample_special_values(backend):
    """NaN / +inf / all -inf rows are invalid (token 0, valid False, NaN logprobs); -inf entries
    are legal; other rows are undisturbed. A huge finite logit stays valid at any temperature
    (y is relative to the row max: z / T overflowing to +inf does not matter)."""
    gen = _gen(23)
    R, V = 8, 77
    z = _logits(R, V, gen)
    z[1, 5] = float("nan")
    z[2, 70] = float("inf")
    z[3, :] = float("-inf")
    z[4, ::2] = float("-inf")                      # legal
    z[5, 0] = 3e38                                 # finite; z / 0.5 would overflow, y does not
    z[6, 3] = float("-inf")
    z[6, 4] = float("nan")                         # invalid even if greedy
    T = torch.ones(R, device=DEVICE)
    T[5] = 0.5
    T[6] = 0.0
    seed, offset = _seeds(R, gen)
    kw = dict(temperature=T, top_p=torch.full((R,), 0.9, device=DEVICE))
    out = ops.sample_with_logprobs(z, seed, offset, backend=backend, **kw)
    bad = [1, 2, 3, 6]
    good = [0, 4, 5, 7]
    assert out.valid.tolist() == [r in good for r in range(R)]
    assert out.tokens[bad].tolist() == [0] * len(bad)
    assert torch.isnan(out.logprobs[bad]).all() and torch.isnan(out.processed_logprobs[bad]).all()
    assert torch.isfinite(out.logprobs[good]).all()
    assert (z[4, out.tokens[4]] > float("-inf")).item()
    assert out.tokens[5] == 0      # every other y overflows to -inf: the max token
    alone = ops.sample(z[good], seed[good], offset[good], backend=backend,
                       **{k: v[good] for k, v in kw.items()}).tokens
    assert torch.equal(out.tokens[good], alone)
    want = _ref(z, seed, offset, **kw)
    assert torch.equal(out.tokens, want[0]) and torch.equal(out.valid, want[1])


@pytest.mark.parametrize("filters", ["temperature", "all"])
def test_sample_subnormal_temperature_is_the_greedy_limit(backend, filters):
    """0 < T < ~2.9e-39: 1/T overflows to +inf. Validation accepts it on every backend, and the
    row is valid: y = 0 at the maxima and -inf elsewhere (docs/DESIGN.md), so the token is
    uniform over the tied maxima (the T -> 0 limit; greedy T = 0 takes the lowest id instead).
    The same token as the reference (tiny V; rows with 1, 2 and 3 tied maxima), with and
    without the other filters (which keep the maxima)."""
    R, V = 10, 13
    gen = _gen(55)
    z = _logits(R, V, gen)
    z[1:4, 2] = z[1:4, 9] = 50.0                 # two tied maxima
    z[4:7, 0] = z[4:7, 5] = z[4:7, 12] = 50.0    # three
    T = torch.tensor([1e-45, 1e-40, 2.9e-39, 2**-149, 1e-42, 1e-39, 2.9e-39, 3e-39, 1e-38, 1e-30],
                     device=DEVICE)
    assert torch.isinf(1.0 / T[:7]).all() and torch.isfinite(1.0 / T[7:]).all()
    seed, offset = _seeds(R, gen)
    kw = dict(temperature=T)
    if filters == "all":
        kw.update(top_k=torch.full((R,), 3, device=DEVICE),
                  top_p=torch.full((R,), 0.5, device=DEVICE),
                  min_p=torch.full((R,), 0.1, device=DEVICE))
    out = ops.sample_with_logprobs(z, seed, offset, backend=backend, **kw)
    assert out.valid.all()
    assert (z.gather(1, out.tokens[:, None])[:, 0] == z.max(1).values).all()
    want = _ref(z, seed, offset, **kw)
    assert torch.equal(out.tokens, want[0]) and torch.equal(out.valid, want[1])
    assert torch.isfinite(out.logprobs).all()
    # over many seeds the tied rows take every one of their maxima (not always the lowest id)
    S = 40
    zz = z[4:5].expand(S, V).contiguous()
    many = ops.sample(zz, torch.arange(S, device=DEVICE), torch.zeros(S, dtype=torch.int64,
                      device=DEVICE), temperature=1e-40, backend=backend).tokens
    assert set(many.tolist()) == {0, 5, 12}


def test_sample_boundary_ties(backend):
    """Ties exactly at the top-k and top-p boundaries: the lowest ids of the tied group are
    kept (key order), on every backend, and both sides of the boundary are exercised."""
    V, R = 12, 64 if (ON_GPU or backend == "reference") else 32
    z = torch.zeros(R, V)
    z[:, 8:] = -1.0        # 8 tied maxima (ids 0..7), 4 smaller ones
    z = z.to(torch.bfloat16).to(DEVICE)
    seed, offset = _seeds(R, _gen(29))
    # top-k = 3 cuts the tied group: ids {0, 1, 2}
    tk = ops.sample(z, seed, offset, top_k=3, backend=backend).tokens
    assert set(tk.tolist()) == {0, 1, 2}
    # top-p: the tied group's masses are equal (2^38 each); p = 0.3 of S = 8 * 2^38 +
    # 4 * e(-1) * 2^38 keeps the tokens whose mass before them is < P': ids 0..2
    tp = ops.sample(z, seed, offset, top_p=0.3, backend=backend).tokens
    kept = _kept(z, top_p=torch.full((R,), 0.3, device=DEVICE))[0].nonzero()[:, 0].tolist()
    assert set(tp.tolist()) == set(kept)
    assert kept == [0, 1, 2]    # before(3) = 3 * 2^38 >= P' = trunc(0.3 * 9.47 * 2^38)
    # top-k + top-p on the top-k mass: k = 5, p = 0.5 of 5 * 2^38 -> ids 0..2
    both = ops.sample(z, seed, offset, top_k=5, top_p=0.5, backend=backend).tokens
    assert set(both.tolist()) == {0, 1, 2}
    # min-p = 1 keeps exactly the tied maxima
    mp = ops.sample(z, seed, offset, min_p=1.0, backend=backend).tokens
    assert set(mp.tolist()) <= set(range(8)) and len(set(mp.tolist())) >= 4
    for kw in (dict(top_k=3), dict(top_p=0.3), dict(top_k=5, top_p=0.5), dict(min_p=1.0)):
        full = {n: torch.full((R,), v, device=DEVICE,
                              dtype=torch.int32 if n == "top_k" else torch.float32)
                for n, v in kw.items()}
        assert torch.equal(ops.sample(z, seed, offset, backend=backend, **kw).tokens,
                           _ref(z, seed, offset, **full)[0])


def test_sample_top_p_stops_in_top_k_bucket(backend):
    """top-k > 256 (the CUDA radix path) + top-p whose boundary falls in a radix bucket that holds
    one key the top-k keeps and keys it drops: only the kept one may stay (the threshold is
    max(bucket, top-k threshold)). 299 tokens at 9.0, token 299 at 5.1 and 700 tokens at 5.0
    (5.1 and 5.0 share the top 12 key bits); k = 300 keeps ids 0..299, p = 0.99999 keeps token
    299 (its mass before, 299 * 2^38, is < trunc(p * S)); the 5.0 tokens hold ~4 % of the mass
    a wrong threshold would add."""
    R, V = 64 if (ON_GPU or backend == "reference") else 16, 1000
    z = torch.full((R, V), 5.0)
    z[:, :299] = 9.0
    z[:, 299] = 5.1
    z = z.to(DEVICE)
    seed, offset = _seeds(R, _gen(37))
    kw = dict(top_k=torch.full((R,), 300, dtype=torch.int32, device=DEVICE),
              top_p=torch.full((R,), 0.99999, device=DEVICE))
    kept = _kept(z, **kw)[0]
    assert kept[:300].all() and not kept[300:].any()
    got = ops.sample(z, seed, offset, backend=backend, **kw).tokens
    assert int(got.max()) < 300
    assert torch.equal(got, _ref(z, seed, offset, **kw)[0])


def test_sample_int32_out(backend):
    gen = _gen(31)
    z = _logits(5, 100, gen)
    seed, offset = _seeds(5, gen)
    kw = _params("all", 5, 100, gen)
    a = ops.sample(z, seed, offset, backend=backend, out_dtype=torch.int32, **kw)
    b = ops.sample(z, seed, offset, backend=backend, **kw)
    assert a.tokens.dtype == torch.int32 and b.tokens.dtype == torch.int64
    assert torch.equal(a.tokens.long(), b.tokens)
    c = ops.sample_with_logprobs(z, seed, offset, backend=backend, out_dtype=torch.int32, **kw)
    assert c.tokens.dtype == torch.int32 and torch.equal(c.tokens.long(), b.tokens)


def test_sample_empty_batch(backend):
    z = torch.randn(0, 50, device=DEVICE)
    e = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    out = ops.sample(z, e, e, backend=backend)
    assert out.tokens.shape == (0,) and out.valid.shape == (0,)
    # with every filter, Python-scalar parameters and logprobs: still empty, no error
    out = ops.sample_with_logprobs(z, 1, 2, temperature=0.5, top_k=3, top_p=0.9, min_p=0.1,
                                   top_n=2, backend=backend)
    assert out.tokens.shape == (0,) and out.top_ids.shape == (0, 2)


def test_sample_one_token_vocabulary(backend):
    """V = 1: a valid row samples token 0 with logprob 0 under any filter; a NaN / +inf / -inf
    row is invalid (token 0, valid False, NaN logprobs) like any other."""
    z = torch.tensor([[2.0], [float("nan")], [float("inf")], [float("-inf")], [-1e30]],
                     device=DEVICE)
    out = ops.sample_with_logprobs(z, 3, 4, temperature=0.7, top_k=1, top_p=0.5, min_p=0.9,
                                   top_n=1, backend=backend)
    assert out.tokens.tolist() == [0] * 5
    assert out.valid.tolist() == [True, False, False, False, True]
    assert out.logprobs[[0, 4]].tolist() == [0.0, 0.0]
    assert torch.isnan(out.logprobs[1:4]).all()


# ---------------------------------------------------------------------------------------------
# logprobs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("filters", ["temperature", "all", "greedy_mix"])
def test_sample_logprobs(backend, filters):
    gen = _gen(37)
    R, V = 16, 211
    z = _logits(R, V, gen, dtype=torch.bfloat16)
    z[0, :100] = float("-inf")
    seed, offset = _seeds(R, gen)
    kw = _params(filters, R, V, gen)
    out = ops.sample_with_logprobs(z, seed, offset, backend=backend, top_n=5, **kw)
    plain = ops.sample(z, seed, offset, backend=backend, **kw)
    assert torch.equal(out.tokens, plain.tokens)             # same tokens with or without
    tok = out.tokens
    raw = torch.log_softmax(z.float(), dim=1).gather(1, tok[:, None])[:, 0]
    torch.testing.assert_close(out.logprobs, raw, atol=2e-5, rtol=1e-5)
    probs = ref.probabilities(z, kw.get("temperature"), kw.get("top_k"), kw.get("top_p"),
                              kw.get("min_p"))
    proc = probs.gather(1, tok[:, None])[:, 0].log().float()
    torch.testing.assert_close(out.processed_logprobs, proc, atol=2e-5, rtol=1e-5)
    if "temperature" in kw:
        greedy = kw["temperature"] == 0
        assert (out.processed_logprobs[greedy] == 0).all()
    want = _ref(z, seed, offset, **kw)
    torch.testing.assert_close(out.logprobs, want[2], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out.processed_logprobs, want[3], atol=2e-5, rtol=1e-5)
    # top-n: the largest raw logits, ties by lowest id, with their raw logprobs
    assert out.top_ids.shape == (R, 5) and out.top_logprobs.shape == (R, 5)
    zf = z.float()
    key = prims.key56(zf, torch.arange(V, device=DEVICE)[None, :])
    ids = key.topk(5, dim=1).indices
    assert torch.equal(out.top_ids, ids)
    torch.testing.assert_close(out.top_logprobs,
                               torch.log_softmax(zf, 1).gather(1, ids), atol=2e-5, rtol=1e-5)


def test_sample_logprobs_top_n_ties(backend):
    """top-n ids follow the total order: value descending, lowest id first among ties, also
    for ties that straddle the n-th place (torch.topk alone does not promise which)."""
    gen = _gen(43)
    R, V = 6, 3000
    z = torch.randint(0, 4, (R, V), generator=gen).float().to(DEVICE)
    out = ops.sample_with_logprobs(z, 0, 0, top_n=8, backend=backend)
    key = prims.key56(z, torch.arange(V, device=DEVICE)[None, :])
    assert torch.equal(out.top_ids, key.topk(8, dim=1).indices)


def test_sample_logprobs_top_n_zero(backend):
    z = _logits(3, 40, _gen(41))
    out = ops.sample_with_logprobs(z, 1, 2, backend=backend)
    assert out.top_ids.shape == (3, 0) and out.top_logprobs.shape == (3, 0)


# ---------------------------------------------------------------------------------------------
# the Triton primitives against the reference primitives (bit patterns)
# ---------------------------------------------------------------------------------------------
try:
    import triton
    import triton.language as tl
    from tokenspeed_kernel.triton import prims as TP

    @triton.jit
    def _prims_kernel(x_ptr, y_ptr, bits_ptr, tok_ptr, seed, offset, o_ln, o_exp, o_g, o_w, o_k,
                      o_m, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        msk = offs < N
        x = tl.load(x_ptr + offs, mask=msk, other=1.0)
        y = tl.load(y_ptr + offs, mask=msk, other=0.0)
        bits = tl.load(bits_ptr + offs, mask=msk, other=0).to(tl.uint32)
        tok = tl.load(tok_ptr + offs, mask=msk, other=0)
        tl.store(o_ln + offs, TP.soft_ln(x), mask=msk)
        tl.store(o_exp + offs, TP.soft_exp_neg(y), mask=msk)
        tl.store(o_g + offs, TP.gumbel_from_bits(bits), mask=msk)
        tl.store(o_w + offs, TP.philox_word(seed, offset, tok, 0).to(tl.int64), mask=msk)
        tl.store(o_k + offs, TP.key56(y, tok), mask=msk)
        tl.store(o_m + offs, TP.mass_fixed(y), mask=msk)
except ImportError:  # pragma: no cover
    _prims_kernel = None


def test_triton_prims_bit_exact():
    """soft_ln, soft_exp_neg, Gumbel, Philox words, key56 and mass_fixed of the Triton prims
    against the reference prims, bit for bit (incl. -0.0, -64, < -64, -inf, extreme bits)."""
    skip_unless_backend("triton")
    if _prims_kernel is None:
        pytest.skip("triton not installed")
    gen = _gen(43)
    N = 4096
    x = torch.exp(torch.randn(N, generator=gen) * 10).clamp(1e-30, 1e30)
    y = -torch.rand(N, generator=gen) * 70
    y[:8] = torch.tensor([0.0, -0.0, -64.0, -64.00001, float("-inf"), -1e-8, -88.0, -1.0])
    bits = torch.randint(0, 2**32, (N,), generator=gen)
    bits[:4] = torch.tensor([0, 2**32 - 1, 511, 512])
    tok = torch.randint(0, 2**24, (N,), generator=gen, dtype=torch.int32)
    seed, offset = -1234567890123, 2**33 + 5
    dev = DEVICE
    outs = [torch.empty(N, dtype=d, device=dev) for d in
            (torch.float32, torch.float32, torch.float32, torch.int64, torch.int64, torch.int64)]
    _prims_kernel[(triton.cdiv(N, 512),)](x.to(dev), y.to(dev), bits.to(dev), tok.to(dev), seed,
                                          offset,
                                          *outs, N, BLOCK=512, enable_fp_fusion=False)
    ln, ex, g, w, k56, mass = (o.cpu() for o in outs)

    def same(a, b):
        return torch.equal(a.view(torch.int32), b.view(torch.int32))

    assert same(ln, prims.soft_ln(x))
    assert same(ex, prims.soft_exp_neg(y))
    assert same(g, prims.gumbel_from_bits(bits))
    want_w = prims.philox_bits(torch.tensor(seed), torch.tensor(offset), tok.long(),
                               prims.STREAM_SAMPLE)
    assert torch.equal(w, want_w)
    assert torch.equal(k56, prims.key56(y, tok.long()))
    assert torch.equal(mass, prims.mass_fixed(y))


# ---------------------------------------------------------------------------------------------
# the Triton sampler's paths (triton/sampling.py): each one taken on purpose, same tokens
# ---------------------------------------------------------------------------------------------
# K3 reports per row (``_TEST_CONFIG["stats"]``) mode + 16 * (exact pass taken) + 32 * (TOPR
# extension run: the kept prefix runs past the candidates' exact prefix P); modes:
GREEDY, PLAIN, WINDOW, TOPR, DIRECT, EXACT, EXT = 0, 1, 2, 3, 4, 16, 32


@pytest.fixture
def tri():
    """The Triton sampler module; its launch-config overrides are reset afterwards."""
    skip_unless_backend("triton")
    from tokenspeed_kernel.triton import sampling as tri_mod
    yield tri_mod
    tri_mod._TEST_CONFIG = None


def _tri_run(tri, z, kw, cfg, tpr=1, seed=None, gen=None):
    """Triton (launch config ``cfg``) == the reference: tokens, valid and logprobs. Returns the
    per-row path codes (see above)."""
    gen = gen or _gen(99)
    n = z.shape[0] // tpr
    if seed is None:
        seed, offset = _seeds(n, gen)
    else:
        seed, offset = seed
    kw = {k: v.to(DEVICE) for k, v in kw.items()}
    tri._TEST_CONFIG = dict(cfg, stats=True)
    got = tri.sample(z, seed, offset, kw.get("temperature"), kw.get("top_k"), kw.get("top_p"),
                     kw.get("min_p"), tpr, True)
    stats = tri._LAST_STATS.cpu()
    tri._TEST_CONFIG = None
    want = _ref(z, seed, offset, tokens_per_request=tpr, **kw)
    assert torch.equal(got[0], want[0]), (cfg, got[0].tolist(), want[0].tolist())
    assert torch.equal(got[1], want[1])
    v = want[1]
    torch.testing.assert_close(got[2][v], want[2][v], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[3][v], want[3][v], atol=1e-4, rtol=1e-4)
    assert torch.isnan(got[2][~v]).all() and torch.isnan(got[3][~v]).all()
    return stats


def _full(R, v, dtype=torch.float32):
    return torch.full((R,), v, dtype=dtype)


def test_triton_plain_paths(tri):
    """Temperature-only rows: the pruned single pass + gap test decides random rows (several
    chunks per row, many tiles per chunk: tiles are skipped); the exact pass decides rows whose
    gap test fails: |z / T| beyond 2^14, 1/T overflowing to +inf, and a constructed near tie
    (two tokens whose exact scores are equal up to rounding)."""
    gen = _gen(101)
    R, V = 6, 1001
    cfg = dict(BLOCK=64, S1=3)
    z = _logits(R, V, gen, scale=4.0)
    assert (_tri_run(tri, z, dict(temperature=_full(R, 0.8)), cfg, gen=gen) == PLAIN).all()
    assert (_tri_run(tri, z, {}, cfg, gen=gen) == PLAIN).all()          # T not given: 1
    big = z * 1e30
    assert (_tri_run(tri, big, dict(temperature=_full(R, 1.0)), cfg, gen=gen) == PLAIN + EXACT).all()
    tiny = torch.tensor([1e-30, 1e-39, 1e-30, 1e-39, 2.0, 1.0])       # 1e-39: 1/T = +inf
    st = _tri_run(tri, z, dict(temperature=tiny), cfg, gen=gen)
    assert (st[:4] == PLAIN + EXACT).all() and (st[4:] == PLAIN).all()
    # near tie: token a at 0, token b at G_b - G_a below it -> equal exact scores up to rounding
    seed, offset = _seeds(R, gen)
    ids = torch.arange(V, device=DEVICE)
    G = prims.gumbel_from_bits(prims.philox_bits(seed[:, None], offset[:, None], ids[None, :], 0))
    zt = torch.full((R, V), -60.0, device=DEVICE)
    for r in range(R):
        a, b = sorted(torch.topk(G[r], 2).indices.tolist())   # two large G: both can win
        zt[r, a] = 0.0
        zt[r, b] = (G[r, a] - G[r, b]).item()
        if zt[r, b] > 0:                                    # keep token a the max
            zt[r, a], zt[r, b] = -zt[r, b].item(), 0.0
    st = _tri_run(tri, zt, dict(temperature=_full(R, 1.0)), cfg, seed=(seed, offset))
    assert (st == PLAIN + EXACT).all(), st


def test_triton_window_paths(tri):
    """min-p rows: window candidates of one chunk, of many chunks (compacted in K3 a few
    entries at a time), and chunks whose candidates overflow their slot (flat or tied rows:
    the exact pass)."""
    gen = _gen(102)
    R, V = 5, 1200
    z = _logits(R, V, gen, scale=3.0)
    kw = dict(temperature=_full(R, 0.9), min_p=_full(R, 0.2))
    assert (_tri_run(tri, z, kw, dict(BLOCK=256), gen=gen) == WINDOW).all()
    assert (_tri_run(tri, z, kw, dict(BLOCK=64, S1=19, NC=16), gen=gen) == WINDOW).all()
    # 4 chunks of 320: slots of max(NP + KCAP, 64 * 4) / 4 = 80 entries
    cfg = dict(BLOCK=64, S1=4, NP=256, KCAP=64, NC=16)
    flat = _logits(R, V, gen, scale=0.01)
    assert (_tri_run(tri, flat, kw, cfg, gen=gen) == WINDOW + EXACT).all()
    ties = torch.zeros(R, V, device=DEVICE)                    # every value tied: window = row
    assert (_tri_run(tri, ties, kw, cfg, gen=gen) == WINDOW + EXACT).all()
    # a chunk that overflows its slot but whose max is not kept (tied far below the row's
    # peak): K3 skips it and decides from the window (no exact pass)
    low = _logits(R, V, gen, scale=0.5)
    low[:, 640:960] = -20.0
    low[:, 7] = 8.0
    assert (_tri_run(tri, low, kw, cfg, gen=gen) == WINDOW).all()


@pytest.mark.parametrize("S1", [1, 2, 4, 8])
def test_triton_topr_chunks(tri, S1):
    """top-k / top-p rows through the per-lane top-4 candidates (top-p without top-k, one
    chunk: top-5): one chunk, two, and 4 / 8 chunks (super-lanes of 2 / 8 lanes merged before
    the slot), with slots smaller than the chunk's
    exact prefix (the sorted top of the union is written instead); min-p on top; int-valued
    rows (ties across the candidate boundaries). Peaked rows are decided from the candidates."""
    gen = _gen(103 + S1)
    R, V = 6, 2000
    z = _logits(R, V, gen, scale=6.0)
    zi = _logits(R, V, gen, kind="int")
    k = torch.tensor([1, 5, 20, 0, 0, 30], dtype=torch.int32)
    p = torch.tensor([0.9, 1.0, 0.5, 0.6, 0.8, 0.7])
    mp = torch.tensor([0.0, 0.1, 0.0, 0.05, 0.0, 0.0])
    T = _full(R, 0.8)
    bt = {1: 64, 2: 128, 4: 256, 8: 256}[S1]   # lanes: super-lanes of 2 (S1 = 4) or 8 (S1 >= 8)
    cfgs = [dict(BLOCK=64, BLOCK_T=bt, S1=S1, KCAP=64, KSLOT=64, NP=1024),
            dict(BLOCK=64, BLOCK_T=bt, S1=S1, KCAP=64, KSLOT=32, NP=32 * S1)]   # slot 32
    if S1 == 1:   # top-p without top-k keeps 5 keys per lane there (DEPTH_P); also 4, as top-k
        cfgs.append(dict(cfgs[0], DEPTH_P=4))
    for cfg in cfgs:
        for zz, kw in ((z, dict(temperature=T, top_p=p)),
                       (z, dict(temperature=T, top_k=k, top_p=p, min_p=mp)),
                       (zi, dict(temperature=T, top_k=k, top_p=p))):
            st = _tri_run(tri, zz, kw, cfg, gen=gen)
            k_on = (k > 0) if "top_k" in kw else torch.zeros(R, dtype=torch.bool)
            mode = torch.where(k_on | (p < 1), TOPR, PLAIN)
            mode = torch.where(k_on & (k > cfg["KCAP"]), DIRECT + EXACT, mode).int()
            if zz is z:   # peaked rows: decided from the candidates
                assert torch.equal(st, mode), (cfg, list(kw), st)
            else:         # ties: the exact prefix may end before the kept set
                assert torch.equal(st & 15, mode & 15), (cfg, list(kw), st)


def _cap_threshold_kernel():
    """A one-program kernel around ``_cap_threshold`` (module level: a jitted function resolves
    the helpers it calls in its module's globals)."""
    global _CAP_K, _cap_threshold
    if _CAP_K is None:
        import triton
        import triton.language as tl
        from tokenspeed_kernel.triton.sampling import _cap_threshold

        @triton.jit
        def _k(keys_ptr, tau, cap, out_ptr, N: tl.constexpr):
            keys = tl.load(keys_ptr + tl.arange(0, N))
            t, n = _cap_threshold(keys, tau.to(tl.int64), cap)
            tl.store(out_ptr, t.to(tl.int64))
            tl.store(out_ptr + 1, n.to(tl.int64))
        _CAP_K = _k
    return _CAP_K


_CAP_K = None
_cap_threshold = None


def test_triton_cap_threshold(tri):
    """``_cap_threshold`` (the bound that caps a chunk's or a row's candidate prefix): for keys
    with many tied values (the id part decides at the boundary) and distinct ones, empty slots
    (-1) and bounds tau below every key or among them, it returns t with exactly ``cap`` keys
    >= t (so t lies in (key_(cap+1), key_cap]) and that count."""
    _k = _cap_threshold_kernel()
    g = _gen(91)
    N = 256
    for case in range(12):
        nval = (3, 17, 1 << 20)[case % 3]                 # values: heavy ties .. distinct
        val = torch.randint(0, nval, (N,), generator=g) * (1 << 9) + (1 << 31)
        ids = torch.randperm(1 << 12, generator=g)[:N]
        keys = (val << 24) | ((1 << 24) - 1 - ids)
        keys[torch.randperm(N, generator=g)[:N // 8]] = -1
        srt = keys[keys >= 0].sort(descending=True).values
        tau = -1 if case % 2 == 0 else int(srt[200])
        navail = int((srt >= tau).sum())
        for cap in (1, 5, 64, navail - 1):
            out = torch.zeros(2, dtype=torch.int64, device=DEVICE)
            _k[(1,)](keys.to(DEVICE), tau, cap, out, N=N)
            t, n = out.tolist()
            assert n == cap == int((srt >= t).sum()), (case, cap, t, n)
            assert t > tau and srt[cap] < t <= srt[cap - 1], (case, cap)


def test_triton_topp_depth5_prefix(tri):
    """top-p without top-k, one chunk per row: 5 keys per lane give a longer exact prefix than 4,
    so a row whose nucleus runs past the 4-key prefix (and needs the extension there) is decided
    from the candidates; same tokens either way."""
    R, V = 8, 2000
    z = (torch.randn(R, V, generator=torch.Generator().manual_seed(7)) * 4.0).to(DEVICE)
    kw = dict(temperature=_full(R, 1.0), top_p=_full(R, 0.9))
    cfg = dict(BLOCK=64, BLOCK_T=64, S1=1, KCAP=256, KSLOT=256, NP=1024)
    st4 = _tri_run(tri, z, kw, dict(cfg, DEPTH_P=4), gen=_gen(112))
    st5 = _tri_run(tri, z, kw, dict(cfg, DEPTH_P=5), gen=_gen(112))
    assert (st4 == TOPR + EXT).any() and (st5 == TOPR).all(), (st4.tolist(), st5.tolist())


def test_triton_topr_fallbacks(tri):
    """Rows the candidates cannot decide: top-p on flat rows keeping more than KCAP tokens
    (the extension decides them; with no refinement pass allowed it gives up and the exact
    pass decides), and (DIRECT) k > KCAP (exact pass); mixed per row with greedy,
    temperature-only and min-p rows in one batch, tokens_per_request > 1."""
    gen = _gen(111)
    R, V = 8, 2000
    flat = _logits(R, V, gen, scale=0.05)
    kw = dict(temperature=_full(R, 1.0), top_p=_full(R, 0.9))
    st = _tri_run(tri, flat, kw, dict(KCAP=32, KSLOT=32, NP=256), gen=gen)
    assert (st == TOPR + EXT).all(), st
    st = _tri_run(tri, flat, kw, dict(KCAP=32, KSLOT=32, NP=256, NREF=0), gen=gen)
    assert (st == TOPR + EXT + EXACT).all(), st
    st = _tri_run(tri, flat, dict(temperature=_full(R, 1.0), top_k=_full(R, 100, torch.int32)),
                  dict(KCAP=32, KSLOT=32, NP=256), gen=gen)
    assert (st == DIRECT + EXACT).all(), st
    # one request of 2 rows per mode
    z = _logits(R, V, gen, scale=3.0)
    T = torch.tensor([0.0, 1.0, 0.7, 0.9])
    k = torch.tensor([5, 0, 0, 100], dtype=torch.int32)
    p = torch.tensor([0.5, 1.0, 1.0, 0.9])
    mp = torch.tensor([0.5, 0.0, 0.1, 0.0])
    st = _tri_run(tri, z, dict(temperature=T, top_k=k, top_p=p, min_p=mp),
                  dict(KCAP=32, KSLOT=64, NP=256, BLOCK=64, BLOCK_T=64, S1=2), tpr=2, gen=gen)
    assert st.tolist() == [GREEDY] * 2 + [PLAIN] * 2 + [WINDOW] * 2 + [DIRECT + EXACT] * 2


# small candidate sets: slots of 16 keys (NP = 16, one chunk) -> |P| <= 16; KCAP = 64 (so
# top-k rows with 16 < k <= 64 stay TOPR and the collected keys fit 64 at a time)
_EXT_CFG = dict(BLOCK=256, BLOCK_T=64, S1=1, KCAP=64, KSLOT=16, NP=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_topr_extension(tri, dtype):
    """TOPR rows whose kept prefix runs past the candidates' exact prefix P are decided by the
    extension (count / mass passes below P, one collection pass, the kept prefix on the sorted
    collected keys), not by the exact pass: top-p only (kept sets of hundreds of tokens for
    KCAP = 64: the bracket is refined, the part above it streamed), top-k + top-p and top-k
    only with |P| < k <= KCAP, min-p on top; flat and peaked rows, fp32 and bf16 (ties)."""
    gen = _gen(120 if dtype == torch.float32 else 121)
    R, V = 6, 1000
    T = _full(R, 0.9)
    k = torch.tensor([40, 64, 20, 33, 60, 45], dtype=torch.int32)
    p = torch.tensor([0.9, 0.5, 0.95, 0.3, 0.8, 0.99])
    mp = torch.tensor([0.0, 0.02, 0.0, 0.1, 0.0, 0.001])
    mpc = torch.tensor([0.3, 0.4, 0.4, 0.35, 0.45, 0.3])   # cuts 30-150 tokens deep
    flat = _logits(R, V, gen, dtype=dtype, scale=0.5)
    for kw in (dict(temperature=T, top_p=p),
               dict(temperature=T, top_k=k, top_p=p),
               dict(temperature=T, top_k=k),
               dict(temperature=T, top_k=k, top_p=_full(R, 0.97), min_p=mpc),
               dict(temperature=T, top_p=p, min_p=mpc)):
        st = _tri_run(tri, flat, kw, _EXT_CFG, gen=gen)
        if "min_p" in kw:   # a shallow min-p cut may end the prefix inside P
            assert ((st == TOPR) | (st == TOPR + EXT)).all(), (list(kw), st)
            assert (st == TOPR + EXT).sum() >= R - 2, (list(kw), st)
        else:
            assert (st == TOPR + EXT).all(), (list(kw), st)
    # peaked rows: some end inside P, none needs the exact pass
    z = _logits(R, V, gen, dtype=dtype, scale=2.0)
    for kw in (dict(temperature=T, top_p=p), dict(temperature=T, top_k=k, top_p=p, min_p=mp)):
        st = _tri_run(tri, z, kw, _EXT_CFG, gen=gen)
        assert ((st == TOPR) | (st == TOPR + EXT)).all(), (list(kw), st)
        assert (st == TOPR + EXT).any(), (list(kw), st)


def test_triton_topr_extension_edges(tri):
    """The extension's corner cases: int-valued rows (runs of > KCAP equal values at the top-p
    / top-k boundary: the bracket is refined by id inside one value), rows with -inf entries
    and fewer finite tokens than k (the top-k set reaches the -inf tokens: every finite token
    below P is kept), several chunks with slots holding fewer keys than the chunk's prefix
    (P = the top of the union), and the give-up path (no refinement pass allowed: the exact
    pass decides)."""
    gen = _gen(122)
    R, V = 6, 1000
    T = _full(R, 1.0)
    zi = _logits(R, V, gen, kind="int")      # ~125 tokens per value
    k = torch.tensor([40, 64, 50, 33, 60, 45], dtype=torch.int32)
    p = torch.tensor([0.2, 0.3, 0.5, 0.6, 0.15, 0.9])
    for kw in (dict(temperature=T, top_p=p), dict(temperature=T, top_k=k, top_p=p)):
        st = _tri_run(tri, zi, kw, _EXT_CFG, gen=gen)
        assert (st == TOPR + EXT).all(), (list(kw), st)
    # few finite tokens: 30 finite values per row, the rest -inf; k = 50 > 30
    z = torch.full((R, V), float("-inf"))
    for r in range(R):
        z[r, torch.randperm(V, generator=gen)[:30]] = torch.randn(30, generator=gen) * 0.3
    z = z.to(DEVICE)
    k50 = _full(R, 50, torch.int32)
    for kw in (dict(temperature=T, top_k=k50), dict(temperature=T, top_k=k50, top_p=_full(R, 0.9))):
        st = _tri_run(tri, z, kw, _EXT_CFG, gen=gen)
        assert (st == TOPR + EXT).all(), (list(kw), st)
    # several chunks, slots smaller than the chunk's prefix; top-k + top-p and min-p
    zs = _logits(R, V, gen, scale=0.5)
    cfg = dict(BLOCK=256, BLOCK_T=64, S1=4, KCAP=64, KSLOT=8, NP=32)     # |P| <= 32
    k = torch.tensor([40, 64, 50, 36, 60, 45], dtype=torch.int32)
    kw = dict(temperature=T, top_k=k, top_p=_full(R, 0.9), min_p=_full(R, 0.01))
    st = _tri_run(tri, zs, kw, cfg, gen=gen)
    assert (st == TOPR + EXT).all(), st
    # give up: the bracket would need refining, none allowed -> the exact pass decides
    kw = dict(temperature=T, top_p=_full(R, 0.9))
    st = _tri_run(tri, zs, kw, dict(_EXT_CFG, NREF=0), gen=gen)
    assert (st == TOPR + EXT + EXACT).all(), st


@pytest.mark.parametrize("i", range(12))
def test_triton_fuzz_split_configs(tri, i):
    """The fuzz cases (odd V, V = 1, bf16 / fp16, -inf / NaN / +inf entries, all -inf rows,
    strided rows, tokens_per_request > 1, partial parameter sets, logprobs) through small tiles
    and several chunks per row (the interpreter's default config has one chunk per row)."""
    z, seed, offset, tpr, kw = _fuzz_case(200 + i)
    cfg = [dict(BLOCK=16, BLOCK_T=16, S1=3, KCAP=16, KSLOT=16, NP=256),
           dict(BLOCK=32, BLOCK_T=16, S1=8, KCAP=32, KSLOT=32, NP=256, S2=2),
           dict(BLOCK=64, BLOCK_T=64, S1=2, KCAP=64, KSLOT=64, NP=256, S2=3),
           dict(BLOCK=32, BLOCK_T=32, S1=5, KCAP=32, KSLOT=16, NP=256, S2=2)][i % 4]
    _tri_run(tri, z, kw, cfg, tpr=tpr, seed=(seed, offset))


# ---------------------------------------------------------------------------------------------
# CPU reference vs GPU reference, CUDA graphs, torch.library / torch.compile integration
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("be", ["cuda", "triton"])
def test_sample_beyond_int32_elements(be):
    """rows * V > 2^31 elements (int64 element offsets): the last rows still match."""
    skip_unless_backend(be)
    R, V = 14200, 151936                    # 2.16e9 elements, 4.3 GB of bf16
    z = torch.randn(R, V, device=DEVICE, dtype=torch.bfloat16)
    seed = torch.arange(R, device=DEVICE)
    offset = torch.arange(R, device=DEVICE) * 5
    T = torch.full((R,), 0.9, device=DEVICE)
    T[-1] = 0.0
    out = ops.sample(z, seed, offset, temperature=T, backend=be)
    tail = slice(R - 8, R)
    want = _ref(z[tail], seed[tail], offset[tail], temperature=T[tail])[0]
    assert torch.equal(out.tokens[tail], want)
    del z
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_reference_cpu_vs_gpu():
    """The reference on the CPU performs the same float32 operations; rows may differ only where
    two perturbed scores are within rounding of each other. Count them and bound them."""
    gen = _gen(47)
    R, V = 2048, 4096
    z = torch.randn(R, V, generator=gen) * 4
    seed = torch.randint(-2**62, 2**62, (R,), generator=gen)
    offset = torch.randint(0, 2**40, (R,), generator=gen)
    kw = {k: v.cpu() for k, v in _params("all", R, V, gen).items()}
    cpu = _ref(z, seed, offset, **kw)[0]
    gpu = _ref(z.cuda(), seed.cuda(), offset.cuda(), **{k: v.cuda() for k, v in kw.items()})[0]
    diff = (cpu != gpu.cpu()).nonzero()[:, 0]
    assert len(diff) <= max(2, R // 1000), f"{len(diff)} rows differ"
    if len(diff):
        _, y, _, _, _ = ref.process(z[diff], kw["temperature"][diff])
        ids = torch.arange(V)
        bits = prims.philox_bits(seed[diff][:, None], offset[diff][:, None], ids[None, :], 0)
        score = y + prims.gumbel_from_bits(bits)
        a = score.gather(1, cpu[diff][:, None])
        b = score.gather(1, gpu.cpu()[diff][:, None])
        assert ((a - b).abs() <= 4 * torch.finfo(torch.float32).eps * a.abs().clamp_min(1)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("be", ["cuda", "triton"])
def test_sample_cuda_graph_replay(be):
    skip_unless_backend(be)
    gen = _gen(53)
    R, V = 32, 32000
    z = _logits(R, V, gen, dtype=torch.bfloat16)
    seed, offset = _seeds(R, gen)
    kw = _params("all", R, V, gen)
    kw["top_k"][:4] = 1000                  # k > 256: the CUDA kernel's generic path, captured
    eager = ops.sample(z, seed, offset, backend=be, **kw).tokens
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):               # warm-up (compiles Triton kernels)
        ops.sample(z, seed, offset, backend=be, **kw)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.sample(z, seed, offset, backend=be, **kw)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.tokens, eager)
    # new seeds / offsets / logits in the same buffers: the graph follows them
    seed.add_(1)
    offset.add_(7)
    z.copy_(_logits(R, V, gen, dtype=torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.tokens, _ref(z, seed, offset, **kw)[0])


def _opcheck_args(device):
    gen = _gen(59)
    R, V = 6, 97
    z = torch.randn(R, V, generator=gen).to(device)
    T = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 0.8], device=device)
    k = torch.tensor([0, 5, 3, 400, 1, 20], dtype=torch.int32, device=device)
    p = torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0, 0.7], device=device)
    mp = torch.tensor([0.0, 0.1, 0.0, 0.05, 0.0, 0.2], device=device)
    seed = torch.arange(R, dtype=torch.int64, device=device)
    offset = torch.arange(R, dtype=torch.int64, device=device) * 3
    flags = F_TEMP | F_TOPK | F_TOPP | F_MINP | F_LOGPROBS
    outs = (torch.empty(R, dtype=torch.int64, device=device),
            torch.empty(R, dtype=torch.bool, device=device),
            torch.empty(R, dtype=torch.float32, device=device),
            torch.empty(R, dtype=torch.float32, device=device))
    return (z, T, k, p, mp, seed, offset, 1, flags, *outs)


def _need_extension():
    if not tokenspeed_kernel.extension_available():
        pytest.skip(f"extension unavailable: {tokenspeed_kernel.extension_error()}")


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sample_opcheck(dev):
    _need_extension()
    args = _opcheck_args(dev)
    torch.library.opcheck(torch.ops.tokenspeed_kernel.sample.default, args)
    torch.ops.tokenspeed_kernel.sample(*args)
    z, T, k, p, mp, seed, offset = args[:7]
    want = _ref(z, seed, offset, temperature=T, top_k=k, top_p=p, min_p=mp)
    assert torch.equal(args[9], want[0]) and torch.equal(args[10], want[1])


def test_sample_torch_compile():
    """ops.sample under torch.compile(fullgraph=True): the reference backend traced by dynamo
    (aot_eager: no codegen, so no FMA contraction of its float ops), and the custom op
    (opaque to the compiler; its fake kernel gives the shapes) when the extension is loaded."""
    gen = _gen(61)
    R, V = 8, 120
    z = _logits(R, V, gen)
    seed, offset = _seeds(R, gen)
    kw = _params("all", R, V, gen)
    want = _ref(z, seed, offset, **kw)[0]

    def f(z, seed, offset, T, k, p, mp, backend):
        return ops.sample(z, seed, offset, temperature=T, top_k=k, top_p=p, min_p=mp,
                          backend=backend).tokens

    args = (z, seed, offset, kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"])
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*args, "reference")
    assert torch.equal(got, want)
    if tokenspeed_kernel.extension_available() and (DEVICE.type == "cpu" or HAS_CUDA):
        be = "cuda" if DEVICE.type == "cuda" else "auto"
        torch._dynamo.reset()
        if DEVICE.type == "cpu":   # 'auto' on CPU is the reference; call the op itself
            def g(*a):
                out = (torch.empty(R, dtype=torch.int64), torch.empty(R, dtype=torch.bool))
                torch.ops.tokenspeed_kernel.sample(a[0], a[3], a[4], a[5], a[6], a[1], a[2], 1,
                                                   F_TEMP | F_TOPK | F_TOPP | F_MINP,
                                                   *out, None, None)
                return out[0]
            got = torch.compile(g, fullgraph=True, backend="aot_eager")(*args)
        else:
            got = torch.compile(f, fullgraph=True)(*args, be)
        assert torch.equal(got, want)


def test_flag_bits_match_cuda_headers():
    """The op flag bits are written in Python (ops/sampling.py, ops/verify.py) and in the CUDA
    headers; a bit that drifts would silently change what a kernel does. Parse the headers'
    enums and compare every shared name."""
    import re
    from pathlib import Path
    from tokenspeed_kernel.ops import sampling as S
    import importlib
    Vf = importlib.import_module("tokenspeed_kernel.ops.verify")   # ops.verify is a function
    root = Path(__file__).resolve().parents[1]

    def enum_values(path, first):
        src = (root / path).read_text()
        m = re.search(r"enum[^{]*\{([^}]*" + first + r"[^}]*)\}", src)
        assert m, (path, first)
        return {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", m.group(1))}

    # the request bits: one header for both kernel families
    common = {k: int(v) for k, v in re.findall(
        r"constexpr int (F_\w+) = (\d+);", (root / "csrc/common/param_flags.h").read_text())}
    assert set(common) == {"F_TEMP", "F_TOPK", "F_TOPP", "F_MINP", "F_LOGPROBS"}, common
    for name, v in common.items():
        assert v == getattr(S, name), name
    sampler = enum_values("csrc/sampling/sampler.cuh", "F_FORCE_GENERIC")
    for name in ("F_FORCE_GENERIC", "F_FORCE_EXACT", "F_NO_RESIDENT", "F_NO_SPLIT",
                 "F_SCAND_PROC", "F_SCAND_BAND", "F_SCAND_TOPP", "F_SCAND_RESCAN",
                 "F_SCAND_DEFER", "F_SPLIT_WIDE", "F_WIDE_DEFER", "F_HIST_TOPP"):
        assert sampler[name] == getattr(S, name), name
    # the flag bits are distinct from the forced cluster size's field, and the launch-policy
    # default only holds launch-policy bits (never a testing bit)
    launch = (S.F_SCAND_PROC | S.F_SCAND_BAND | S.F_SCAND_TOPP | S.F_SCAND_RESCAN
              | S.F_SCAND_DEFER | S.F_SPLIT_WIDE | S.F_WIDE_DEFER | S.F_HIST_TOPP)
    assert launch & (7 << sampler["F_CS_SHIFT"]) == 0
    assert S._DEFAULT_LAUNCH_FLAGS & ~launch == 0
    # the op passes every bit of the enum through (kCallerFlags; a bit missing there is dropped
    # silently)
    m = re.search(r"constexpr int kCallerFlags =([^;]*);",
                  (root / "csrc/sampling/sampler.cuh").read_text())
    assert m, "kCallerFlags"
    passed = set(re.findall(r"F_\w+", m.group(1)))
    assert set(sampler) <= passed and "F_LOGPROBS" in passed, set(sampler) - passed
    assert "kCallerFlags" in (root / "csrc/sampling/sampling_ops.cu").read_text()
    # each family's own bits start above the request bits (F_CS_SHIFT is a shift, not a bit)
    assert min(v for k, v in sampler.items() if k != "F_CS_SHIFT") > max(common.values())
    from tokenspeed_kernel import testing
    assert sampler["F_CS_SHIFT"] == testing.SAMPLER_CLUSTER_SHIFT
    levels = enum_values("csrc/sampling/sampling.cuh", "F_NO_LIST")
    for name in ("F_NO_LIST", "F_NO_EXCL", "F_EXCL_TEST"):
        assert levels[name] == getattr(S, name), name
    assert min(levels.values()) > max(common.values()), levels
    verify = enum_values("csrc/verify/params.cuh", "kPadded")
    for cname, pname in (("kPadded", "F_PADDED"), ("kNgram", "F_NGRAM"),
                         ("kLogprobs", "F_LOGPROBS"), ("kExactCoins", "F_EXACT_COINS"),
                         ("kExactResidual", "F_EXACT_RESIDUAL"),
                         ("kBisectThresholds", "F_BISECT_THRESHOLDS")):
        assert verify[cname] == getattr(Vf, pname), cname
    # verify passes the radix levels' testing bits through unchanged (ops/verify.py)
    for cname, pname in (("kNoLevelList", "F_NO_LIST"), ("kNoLevelExcl", "F_NO_EXCL"),
                         ("kLevelExclTest", "F_EXCL_TEST")):
        assert verify[cname] == getattr(S, pname), cname


def test_testing_knobs_door():
    """tokenspeed_kernel.testing.knobs: every listed knob exists where it says, names and types
    are checked, and values come back after the block (also when it raises)."""
    from tokenspeed_kernel import testing
    from tokenspeed_kernel.ops import sampling as S
    for name, k in testing.KNOBS.items():
        testing.get(name)                      # raises if the attribute moved
    assert testing.SAMPLER_NO_SPLIT == S.F_NO_SPLIT
    assert testing.SAMPLER_FORCE_EXACT == S.F_FORCE_EXACT
    assert testing.SAMPLER_FORCE_GENERIC == S.F_FORCE_GENERIC
    assert testing.SAMPLER_NO_RESIDENT == S.F_NO_RESIDENT
    assert testing.SAMPLER_SCAND_BAND == S.F_SCAND_BAND
    before = {n: testing.get(n) for n in testing.KNOBS}
    with testing.knobs(sampler_launch_flags=0):
        assert S._DEFAULT_LAUNCH_FLAGS == 0
        assert S.param_flags(S.C.sampling_params(1, torch.device("cpu"), 1, 0, None, None, None,
                                                 None)) == 0
    assert S._DEFAULT_LAUNCH_FLAGS == before["sampler_launch_flags"] != 0
    with testing.knobs(sampler_flags=testing.SAMPLER_FORCE_EXACT, verify_exact_coins=True,
                       comm_ll_variant="w4"):
        assert S._CUDA_TEST_FLAGS == testing.SAMPLER_FORCE_EXACT
        assert testing.get("verify_exact_coins") is True
    assert {n: testing.get(n) for n in testing.KNOBS} == before
    with pytest.raises(RuntimeError):
        with testing.knobs(levels_no_list=True):
            raise RuntimeError("body failed")
    assert testing.get("levels_no_list") is before["levels_no_list"]
    with pytest.raises(ValueError, match="unknown knob 'sampler_flag'"):
        with testing.knobs(sampler_flag=1):
            pass
    with pytest.raises(TypeError, match="sampler_flags"):
        with testing.knobs(sampler_flags=True):
            pass
    with pytest.raises(TypeError, match="verify_exact_coins"):
        with testing.knobs(verify_exact_coins=1):
            pass
    assert "sampler_flags" in testing.describe()


def test_sampling_params_object():
    """ops._common.SamplingParams: the one request-parameter object of the Python layer."""
    from tokenspeed_kernel.ops import _common as C
    p = C.sampling_params(4, torch.device("cpu"), 7, torch.arange(4), 0.5, None,
                          torch.tensor([0.9, 1.0, 0.5, 1.0]), None)
    assert p.seed.dtype == torch.int64 and p.seed.tolist() == [7] * 4
    assert p.temperature.dtype == torch.float32 and p.top_k is None and p.min_p is None
    seed, offset, temperature, top_k, top_p, min_p = p          # unpacks like the old tuple
    assert offset.tolist() == [0, 1, 2, 3]
    q = p.slice(1, 2)
    assert q.offset.tolist() == [1, 2] and q.top_p.tolist() == [1.0, 0.5] and q.top_k is None
    assert set(q.filters()) == {"temperature", "top_k", "top_p", "min_p"}
    p.check_values()
    bad = C.sampling_params(2, torch.device("cpu"), 1, 0, 0.5, None, torch.tensor([0.9, 1.5]),
                            None)
    with pytest.raises(ValueError, match="top_p"):
        bad.check_values()


def test_const_globals_compare_like_constexpr():
    """The kernels' module constants (``prims.Const``, a ``tl.constexpr`` with a fast ``!=`` for
    Triton's per-launch check of the globals a kernel used) give the base class's answers."""
    import copy

    import triton.language as tl

    from tokenspeed_kernel.triton.prims import Const
    vals = [0, 1, 2147483647, 0.03, 2.0 ** -19, float("-inf"), 26.33959286127792]
    for a in vals:
        c = Const(a)
        assert isinstance(c, tl.constexpr) and c.value == a
        for b in vals + [None, "x"]:
            for other in (Const(b), tl.constexpr(b), b, copy.deepcopy(Const(b))):
                got = c != other
                assert isinstance(got, tl.constexpr) and bool(got) == (a != b), (a, b, other)


@pytest.mark.parametrize("be", ["reference", "triton", "cuda"])
def test_unvalidated_min_p_above_one_acts_as_one(be):
    """validate=False with min_p > 1 (inf included): the row samples as with min_p = 1 (the
    max tokens; a kept set is never empty: no out-of-range token, no read past the candidate
    buffers), on every backend; NaN and negative min_p are off. The same for verify."""
    skip_unless_backend(be)
    g = torch.Generator().manual_seed(3)
    B, V = 6, 64
    x = (torch.randn(B, V, generator=g) * 3).to(DEVICE)
    x[0, 7] = x[0, 9] = 50.0                       # two tied maxima: min_p = 1 keeps both
    bad = torch.tensor([1.5, float("inf"), float("nan"), -0.2, 1.0, 3.0], device=DEVICE)
    good = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0], device=DEVICE)
    seed = torch.arange(B, device=DEVICE)
    T = torch.full((B,), 0.9, device=DEVICE)
    for off in range(4):
        o = torch.full((B,), off, dtype=torch.int64, device=DEVICE)
        got = ops.sample(x, seed, o, temperature=T, min_p=bad, backend=be, validate=False)
        want = ops.sample(x, seed, o, temperature=T, min_p=good, backend=be)
        assert torch.equal(got.tokens, want.tokens) and bool(got.valid.all()), (off, got)
        assert bool(((got.tokens >= 0) & (got.tokens < V)).all())
    if be == "cuda":
        return   # (verify's CUDA min-p clamp is the same line of code in its row params)
    ids = torch.randint(0, V, (4,), generator=g).to(DEVICE)
    tgt = (torch.randn(6, V, generator=g) * 3).to(DEVICE)
    cu = torch.tensor([0, 2, 4], device=DEVICE)
    kw = dict(cu_num_draft=cu, mode="strict", max_num_draft=2,
              temperature=torch.full((2,), 0.9, device=DEVICE), backend=be)
    got = ops.verify(tgt, ids, seed[:2], seed[:2] * 0, min_p=bad[:2], validate=False, **kw)
    want = ops.verify(tgt, ids, seed[:2], seed[:2] * 0, min_p=good[:2], **kw)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.valid, want.valid)


def test_scand_trace_patch_applies_and_compiles(tmp_path):
    """bench/lab/tools/scand_trace_patch.py (phase stamps of the CUDA split-candidates launch, a
    lab build): every marker is still found once in the sources, and the patched kernels compile
    (nvcc, sm_90a, float instantiations of the split-candidates and cluster kernels, the latter
    with the HIST stamps; the op file needs torch headers: not here)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "bench/lab/tools/scand_trace_patch.py"),
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    patched = (tmp_path / "sampling/sampler.cuh").read_text()
    assert patched.count("p.lab[") >= 10 and "lab;" in patched
    assert "TS_LAB_PROF" in (tmp_path / "sampling/sampling_ops.cu").read_text()
    nvcc = next((c for c in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin",
                                          "nvcc"), shutil.which("nvcc") or "")
                 if c and os.path.exists(c)), None)
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = tmp_path / "inst.cu"
    src.write_text('#include "sampling/sampler.cuh"\nnamespace tokenspeed_kernel::sampler {\n'
                   "template __global__ void scand_kernel<float>(const Params);\n"
                   "template __global__ void sample_kernel<float, true>(const Params);\n}\n")
    r = subprocess.run([nvcc, "-std=c++20", "-cubin", "-arch=sm_90a", "-I" + str(tmp_path),
                        "-I" + str(root / "csrc"), "-o", str(tmp_path / "inst.cubin"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def test_scand_band_mass_bound_holds():
    """The CUDA split-candidates launch's band masses (opt-in F_SCAND_TOPP): the contract's
    fixed-point top-p mass S must lie within S~ 2^38 (1 +- kBandRel) +- kBandAbs V, where S~ is
    the real sum of exp((z - zmax) / T') that the kernel computes in float64 (its chunked,
    per-thread-rescaled sum differs from the direct one by ~1e-14). Checked with the reference's
    arithmetic on rows where the errors cannot average out (one max and V - 1 equal tokens, any
    offset / temperature) and on random rows; the constants are read from sampler.cuh, and the
    observed error must stay below half of the allowed one."""
    import re
    from pathlib import Path
    src = (Path(__file__).resolve().parents[1] / "csrc/sampling/sampler.cuh").read_text()
    rel = float(re.search(r"constexpr double kBandRel = ([0-9.e+-]+);", src).group(1))
    absu = float(re.search(r"constexpr double kBandAbs = ([0-9.e+-]+);", src).group(1))
    g = torch.Generator().manual_seed(5)
    worst = 0.0
    V = 32768
    for trial in range(120):
        zmax = float([0.0, 17.3, -1e4, 3e6, 1e20][trial % 5]) * (0.5 + float(torch.rand(1, generator=g)))
        T = float([1e-3, 0.07, 0.8, 1.0, 3.3, 90.0][trial % 6]) * (
            0.5 + 1.5 * float(torch.rand(1, generator=g)))
        inv_t = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(T, dtype=torch.float32)
        zm = torch.tensor(zmax, dtype=torch.float32)
        if trial % 3 == 0:   # random rows around the max
            z = zm - (torch.rand(V, generator=g) * 30 / inv_t).float()
            z[0] = zm
        else:                # one max, V - 1 equal tokens: every rounding in the same direction
            d = float(torch.rand(1, generator=g)) * 27 / float(inv_t)
            z = torch.full((V,), float(zm - torch.tensor(d, dtype=torch.float32)))
            z[0] = zm
        zmax_t = z.max()
        y = prims.centered(z, zmax_t, inv_t)
        S = int(prims.mass_fixed(y).sum())
        Sx = float(torch.exp((z.double() - float(zmax_t)) * float(inv_t)).sum()) * 2.0 ** 38
        err = abs(S - Sx)
        allowed = Sx * rel + absu * V
        worst = max(worst, err / allowed)
    assert worst < 0.5, f"band-mass error {worst:.3f} of the allowed bound"
    print(f"band-mass error: at most {worst:.3f} of the allowed bound")


def test_triton_sampler_scratch_views_are_aligned_and_disjoint():
    """triton/sampling.py's scratch arrays share one allocation: each view has its dtype and
    size, starts on a 128-byte boundary (Triton's 16-byte pointer specialization must not move
    with the batch size), and no two overlap."""
    from tokenspeed_kernel.triton import sampling as tri
    for rows in (1, 3, 7, 64, 257):
        parts = ((rows * 5, torch.float32), (rows * 4 + 1, torch.int32), (rows, torch.int64),
                 (1, torch.int64), (rows * 3, torch.float32))
        views = tri._scratch(torch.device("cpu"), *parts)
        base = views[0].data_ptr()
        spans = []
        for v, (n, dt) in zip(views, parts):
            assert v.dtype == dt and v.numel() == n and v.is_contiguous()
            assert (v.data_ptr() - base) % 128 == 0
            spans.append((v.data_ptr(), v.data_ptr() + n * dt.itemsize))
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
