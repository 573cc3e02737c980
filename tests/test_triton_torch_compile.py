"""The Triton backends under ``torch.compile(fullgraph=True)``.

The Triton launches are Python (raw pointers, a launch cache, driver calls) that Dynamo cannot
trace, so under compilation ``ops`` calls them through custom ops (``ops/_triton_library.py``).
Checked here, on CPU tensors through the Triton interpreter (and on CUDA tensors on a GPU):

* ``ops.sample`` / ``sample_with_logprobs`` with every filter and every processing input,
  ``ops.verify`` (probabilistic and strict, with processing) and the penalty-state updates
  (``admit_requests``, ``add_output_tokens``) compile with ``fullgraph=True`` (``aot_eager``:
  no code generation, so no FMA contraction of the traced float ops) and give the eager calls'
  outputs bit for bit;
* without the custom ops the same calls break the graph (so the test above tests something);
* ``torch.library.opcheck`` of the ops (schemas, fake kernels, mutation annotations).
"""
from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, skip_unless_backend
from tokenspeed_kernel import ops
from tokenspeed_kernel.ops import _triton_library as TL
from tokenspeed_kernel.reference import logits_processing as LP
from test_sample_processing import _counts, _inputs

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _compiled(f):
    torch._dynamo.reset()
    return torch.compile(f, fullgraph=True, backend="aot_eager")


def _sample_args(R, V, gen):
    z = (torch.randn(R, V, generator=gen) * 3).to(DEVICE)
    seed = torch.randint(0, 2**62, (R,), generator=gen).to(DEVICE)
    offset = torch.randint(0, 1000, (R,), generator=gen).to(DEVICE)
    T = torch.tensor([0.8, 0.0, 1.3, 0.7][:R], dtype=torch.float32).to(DEVICE)
    k = torch.tensor([5, 0, 20, 0][:R]).to(DEVICE)
    p = torch.tensor([0.9, 1.0, 0.7, 0.95][:R], dtype=torch.float32).to(DEVICE)
    mp = torch.tensor([0.0, 0.1, 0.0, 0.05][:R], dtype=torch.float32).to(DEVICE)
    return z, seed, offset, T, k, p, mp


@pytest.mark.parametrize("be", ["triton", "cuda"])
@pytest.mark.parametrize("with_proc", [False, True])
def test_sample_compiles_fullgraph(with_proc, be):
    skip_unless_backend(be)
    gen = _gen(3)
    R, V = 4, 203
    z, seed, offset, T, k, p, mp = _sample_args(R, V, gen)
    proc = _inputs("all", R, V, gen) if with_proc else None

    def f(z, seed, offset, T, k, p, mp):
        a = ops.sample(z, seed, offset, temperature=T, top_k=k, top_p=p, min_p=mp,
                       backend=be, processing=proc)
        b = ops.sample_with_logprobs(z, seed, offset + 1, temperature=T, top_k=k, top_p=p,
                                     min_p=mp, backend=be, processing=proc)
        return a.tokens, a.valid, b.tokens, b.valid, b.logprobs, b.processed_logprobs

    args = (z, seed, offset, T, k, p, mp)
    want = f(*args)
    got = _compiled(f)(*args)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    # the same tokens as the reference (the custom op is the backend, not something else)
    r = ops.sample(z, seed, offset, temperature=T, top_k=k, top_p=p, min_p=mp,
                   backend="reference", processing=proc)
    assert torch.equal(got[0], r.tokens) and torch.equal(got[1], r.valid)


def test_sample_without_the_op_breaks_the_graph(monkeypatch):
    """Dynamo cannot trace the Triton launch itself: with the custom op bypassed, fullgraph
    compilation fails (what the ops exist for)."""
    skip_unless_backend("triton")
    from tokenspeed_kernel.ops import _common as C
    gen = _gen(5)
    z, seed, offset, T, *_ = _sample_args(2, 64, gen)

    def f(z, seed, offset, T):
        return ops.sample(z, seed, offset, temperature=T, backend="triton",
                          validate=False).tokens

    _compiled(f)(z, seed, offset, T)   # with the op: compiles
    monkeypatch.setattr(C, "compiling", lambda: False)
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):   # Dynamo stops at the launch
        _compiled(f)(z, seed, offset, T)


def _verify_case(gen, V, padded=False):
    ns = [3, 0, 2]
    bs, max_n = len(ns), max(ns)
    cu = torch.tensor([0] + ns).cumsum(0)
    ids = torch.randint(0, V, (int(cu[-1]),), generator=gen)
    tgt = torch.randn(int(cu[-1]) + bs, V, generator=gen) * 3
    drf = torch.randn(int(cu[-1]), V, generator=gen) * 3
    # drafts the target likes, so that some are accepted
    for i in range(int(cu[-1])):
        tgt[i + int((cu[1:] <= i).sum()), ids[i]] += 6.0
        drf[i, ids[i]] += 6.0
    seed = torch.randint(0, 2**62, (bs,), generator=gen)
    offset = torch.randint(0, 100, (bs,), generator=gen)
    T = torch.tensor([0.9, 0.0, 1.2], dtype=torch.float32)
    d = dict(tgt=tgt, drf=drf, ids=ids, cu=cu, seed=seed, offset=offset, T=T)
    return {k: v.to(DEVICE) for k, v in d.items()}, ns, max_n


@pytest.mark.parametrize("be", ["triton", "cuda"])
@pytest.mark.parametrize("mode", ["probabilistic", "strict"])
@pytest.mark.parametrize("with_proc", [False, True])
def test_verify_compiles_fullgraph(mode, with_proc, be):
    """(CUDA backend: its ops' fake kernels, and with processing the Triton pre-pass's op.)"""
    skip_unless_backend(be)
    gen = _gen(11)
    V = 96
    c, ns, max_n = _verify_case(gen, V)
    proc = None
    if with_proc:
        kw = {"logit_bias": _inputs("bias", len(ns), V, gen).logit_bias,
              "repetition_penalty": torch.full((len(ns),), 1.3, device=DEVICE),
              "frequency_penalty": torch.full((len(ns),), 0.4, device=DEVICE)}
        kw["counts"], kw["count_slots"] = _counts(len(ns), V, gen)
        proc = LP.LogitsInputs(**kw)

    def f(tgt, drf, ids, cu, seed, offset, T):
        out = ops.verify_with_logprobs(
            tgt, ids, seed, offset, cu_num_draft=cu,
            draft_logits=drf if mode == "probabilistic" else None, mode=mode, temperature=T,
            top_k=torch.full_like(cu[1:], 20), max_num_draft=max_n, backend=be,
            processing=proc)
        return out.tokens, out.num_accepted, out.valid, out.logprobs, out.processed_logprobs

    args = (c["tgt"], c["drf"], c["ids"], c["cu"], c["seed"], c["offset"], c["T"])
    want = f(*args)
    got = _compiled(f)(*args)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    r = ops.verify(c["tgt"], c["ids"], c["seed"], c["offset"], cu_num_draft=c["cu"],
                   draft_logits=c["drf"] if mode == "probabilistic" else None, mode=mode,
                   temperature=c["T"], top_k=torch.full_like(c["cu"][1:], 20),
                   max_num_draft=max_n, backend="reference", processing=proc)
    assert torch.equal(got[0], r.tokens) and torch.equal(got[1], r.num_accepted)


def test_token_count_updates_compile_fullgraph():
    skip_unless_backend("triton")
    gen = _gen(17)
    N, V = 5, 150
    slots = torch.tensor([3, 0, 4]).to(DEVICE)
    indptr = torch.tensor([0, 7, 7, 19]).to(DEVICE)
    prompt = torch.randint(0, V, (19,), generator=gen).to(DEVICE)
    toks = torch.randint(-1, V, (3, 4), generator=gen).to(DEVICE)
    valid = torch.tensor([True, False, True]).to(DEVICE)

    def f(counts, slots, prompt, indptr, toks, valid):
        ops.admit_requests(counts, slots, prompt, indptr, backend="triton", validate=False)
        ops.add_output_tokens(counts, toks, valid=valid, slots=slots, backend="triton",
                              validate=False)
        ops.add_output_tokens(counts, toks[:, 0], slots=slots, backend="triton", validate=False)
        return counts.seen.clone(), counts.output.clone()

    a = ops.new_token_counts(N, V, device=DEVICE)
    b = ops.new_token_counts(N, V, device=DEVICE)
    for c in (a, b):   # state to clear: admission must reset these slots
        c.output.fill_(2)
        c.seen.fill_(-1)
    want = f(a, slots, prompt, indptr, toks, valid)
    got = _compiled(f)(b, slots, prompt, indptr, toks, valid)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    # and in place: the compiled call mutated b as the eager call mutated a
    assert torch.equal(a.seen, b.seen) and torch.equal(a.output, b.output)
    r = LP.new_token_counts(N, V)
    r.output.fill_(2)
    r.seen.fill_(-1)
    LP.admit(r, slots.cpu(), LP.Csr(indptr.cpu(), prompt.cpu()))
    LP.add_tokens(r, toks.cpu(), valid.cpu(), slots.cpu())
    LP.add_tokens(r, toks[:, :1].cpu(), None, slots.cpu())
    assert torch.equal(r.output, b.output.cpu()) and torch.equal(r.seen, b.seen.cpu())


def test_opcheck():
    skip_unless_backend("triton")
    gen = _gen(23)
    R, V = 3, 64
    z, seed, offset, T, k, p, mp = _sample_args(R, V, gen)
    for lp in (False, True):
        torch.library.opcheck(TL.triton_sample, (z, seed, offset, T, k, p, None, 1, lp, []))
    counts = ops.new_token_counts(4, V, device=DEVICE)
    toks = torch.randint(0, V, (R, 2), generator=gen).to(DEVICE)
    slots = torch.tensor([2, 0, 3]).to(DEVICE)
    torch.library.opcheck(TL.triton_add_output_tokens,
                          (counts.seen, counts.output, toks, None, slots))
    torch.library.opcheck(TL.triton_admit_requests,
                          (counts.seen, counts.output, slots, toks.reshape(-1),
                           torch.tensor([0, 2, 2, 6]).to(DEVICE)))


def test_sample_compiled_over_batch_sizes():
    """New batch sizes reuse one dynamic-shape graph (the fake kernel takes symbolic rows)."""
    skip_unless_backend("triton")
    from torch._dynamo.utils import counters

    def f(z, seed, offset, T, k):
        o = ops.sample_with_logprobs(z, seed, offset, temperature=T, top_k=k, backend="triton",
                                     validate=False)
        return o.tokens, o.logprobs

    cf = _compiled(f)
    counters.clear()
    gen = _gen(29)
    for R in (3, 5, 7, 4):
        z = torch.randn(R, 80, generator=gen).to(DEVICE) * 3
        seed = torch.arange(R).to(DEVICE)
        offset = torch.zeros(R, dtype=torch.int64).to(DEVICE)
        T = torch.full((R,), 0.8).to(DEVICE)
        k = torch.full((R,), 5, dtype=torch.int32).to(DEVICE)
        got, want = cf(z, seed, offset, T, k), f(z, seed, offset, T, k)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
