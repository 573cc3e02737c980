"""ops.verify with logits processing (``processing=``): the processed target rows follow
``reference.logits_processing.apply_verify`` bit for bit on the Triton kernel that the CUDA and
Triton backends use, the drafts before a position count for its penalties and min_tokens, every
backend emits the same tokens, raw logprobs stay over the unprocessed rows, and the emitted
tokens follow the processed target distribution (chi-square)."""
from __future__ import annotations

import sys

import pytest
import torch

from conftest import DEVICE, skip_unless_backend
from tokenspeed_kernel import ops
from tokenspeed_kernel.reference import logits_processing as LP
from test_sample_processing import _counts, _csr, _gen, _picks, _pooled_chisquare

OV = sys.modules["tokenspeed_kernel.ops.verify"]
ALPHA = 1e-3


def _layout(ns, V, gen, padded):
    """Target logits, draft ids and layout of requests with ns drafts: (tgt, ids, cu, max_n,
    rows of the ragged target inside tgt). Padded: tgt [bs * (max_n + 1), V], ids [bs, max_n]
    with -1 padding."""
    bs, max_n = len(ns), max(ns)
    cu = torch.tensor([0] + list(ns)).cumsum(0)
    ids = torch.randint(0, V, (int(cu[-1]),), generator=gen)
    # draft tokens with large logits, so that penalties on them change the verify
    R = int(cu[-1]) + bs
    tgt = torch.randn(R, V, generator=gen) * 3
    if not padded:
        return tgt.to(DEVICE), ids.to(DEVICE), cu.to(DEVICE), max_n, None
    W = max_n + 1
    tp = torch.randn(bs * W, V, generator=gen) * 3
    ip = torch.full((bs, max(max_n, 1)), -1, dtype=torch.int64)[:, :max_n]
    rows = []
    for i, n in enumerate(ns):
        rows += [i * W + j for j in range(n + 1)]
        ip[i, :n] = ids[int(cu[i]):int(cu[i + 1])]
    tp[rows] = tgt
    return tp.to(DEVICE), ip.to(DEVICE), cu.to(DEVICE), max_n, torch.tensor(rows)


def _proc_inputs(kind, ns, V, gen, ids=None):
    """Per-request LogitsInputs; penalties include the draft ids so the prefix rule matters."""
    n = len(ns)
    kw = {}
    every = kind == "all"
    if kind in ("bias", "all"):
        kw["logit_bias"] = _csr(_picks(n, V, 6, gen), gen, values=True)
    if kind in ("penalties", "all"):
        kw["repetition_penalty"] = (1.2 + torch.rand(n, generator=gen)).to(DEVICE)
        kw["frequency_penalty"] = (0.1 + torch.rand(n, generator=gen)).to(DEVICE)
        kw["presence_penalty"] = (0.2 + torch.rand(n, generator=gen)).to(DEVICE)
        kw["counts"], kw["count_slots"] = _counts(n, V, gen)
    if kind in ("allowed", "all"):
        W = (V + 31) // 32
        m = torch.randint(-2**31, 2**31, (n, W), generator=gen, dtype=torch.int64)
        kw["allowed_mask"] = m.to(torch.int32).to(DEVICE)
    if kind in ("banned", "all"):
        kw["banned"] = _csr(_picks(n, V, 5, gen))
    if kind in ("min_tokens", "all") or every:
        kw["min_tokens"] = torch.tensor([3, 0, 4, 2, 6][:n]).to(DEVICE)
        kw["num_output_tokens"] = torch.tensor([1, 4, 2, 2, 3][:n]).to(DEVICE)
        kw["stop_ids"] = _csr(_picks(n, V, 3, gen))
    return LP.LogitsInputs(**kw)


def _per_row_mask(R, V, gen):
    W = (V + 31) // 32
    m = torch.randint(-2**31, 2**31, (R, W), generator=gen, dtype=torch.int64)
    return m.to(torch.int32).to(DEVICE)


def _same(a, b):
    return torch.equal(torch.nan_to_num(a, nan=7.5), torch.nan_to_num(b, nan=7.5)) and \
        torch.equal(a.isnan(), b.isnan())


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("kind", ["all", "penalties", "min_tokens", "allowed_per_row"])
def test_processed_rows_match_spec(kind, padded):
    """The Triton kernel's processed rows (CUDA and Triton backends) equal apply_verify's,
    bit for bit; padding rows are copied unprocessed."""
    skip_unless_backend("triton")
    from tokenspeed_kernel.triton import verify_processing as tvp
    gen = _gen(11)
    ns, V = [2, 0, 3, 1, 4], 77
    tgt, ids, cu, max_n, rows = _layout(ns, V, gen, padded)
    inp = _proc_inputs("all" if kind == "allowed_per_row" else kind, ns, V, gen)
    R = tgt.shape[0]
    if kind == "allowed_per_row":
        inp = inp._replace(allowed_mask=_per_row_mask(R, V, gen))
    proc, per_row = OV._prepare_processing(inp, len(ns), R, V, tgt.device, True)
    assert per_row == (kind == "allowed_per_row")
    got = tvp.process_target(tgt, proc, per_row, ids.reshape(-1), cu, max_n, padded, block=32)
    if padded:
        ids_r = torch.cat([ids[i, :n] for i, n in enumerate(ns)])
        spec_in = inp
        if per_row:
            spec_in = inp._replace(allowed_mask=inp.allowed_mask[rows.to(DEVICE)])
        want = LP.apply_verify(tgt[rows.to(DEVICE)], spec_in, cu, ids_r)
        assert _same(got[rows.to(DEVICE)], want)
        pad = torch.ones(R, dtype=torch.bool)
        pad[rows] = False
        assert torch.equal(got[pad.to(DEVICE)], tgt[pad.to(DEVICE)].float())
    else:
        want = LP.apply_verify(tgt, inp, cu, ids)
        assert _same(got, want)
    assert not _same(got, tgt.float())   # processing changed something
    # another split of the rows over programs (the lab's A/B knobs) writes the same values
    again = tvp.process_target(tgt, proc, per_row, ids.reshape(-1), cu, max_n, padded, block=16,
                               splits=3, num_warps=2)
    assert torch.equal(again, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_log_sum_exp_from_the_processing_pass(dtype):
    """process_target(raw_lse=True): the rows are those without it, and the raw rows'
    log-sum-exp matches torch.logsumexp of their float32 values (to float32 rounding) with its
    special values: a NaN row NaN, a +inf row +inf, an all -inf row -inf; any split count."""
    skip_unless_backend("triton")
    from tokenspeed_kernel.triton import verify_processing as tvp
    gen = _gen(31)
    ns, V = [2, 0, 3], 203
    tgt, ids, cu, max_n, _ = _layout(ns, V, gen, False)
    tgt = (tgt * 4).to(dtype)
    tgt[1, 7] = float("nan")
    tgt[2, 100] = float("inf")
    tgt[3] = float("-inf")
    tgt[4, 5] = float("-inf")
    tgt[5, :150] = float("-inf")
    inp = _proc_inputs("all", ns, V, gen)
    proc, per_row = OV._prepare_processing(inp, len(ns), tgt.shape[0], V, tgt.device, True)
    plain = tvp.process_target(tgt, proc, per_row, ids, cu, max_n, False, block=32)
    want = torch.logsumexp(tgt.float(), dim=1)
    for splits in (0, 1, 3, 7):
        rows, lse = tvp.process_target(tgt, proc, per_row, ids, cu, max_n, False, block=32,
                                       splits=splits, raw_lse=True)
        torch.testing.assert_close(rows, plain, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(lse, want, rtol=2e-6, atol=2e-6, equal_nan=True)
        assert lse[1].isnan() and lse[2] == float("inf") and lse[3] == float("-inf")


def test_drafts_before_a_position_count():
    """Position j sees the drafts d_0 .. d_{j-1} as output tokens (repetition penalty) and
    num_output_tokens + j for min_tokens, on the spec and on the Triton kernel."""
    V, d0 = 40, 5
    tgt = torch.full((3, V), 1.0)
    tgt[:, d0] = 4.0
    ids = torch.tensor([d0, 7])
    cu = torch.tensor([0, 2])
    counts = LP.new_token_counts(1, V)
    inp = LP.LogitsInputs(repetition_penalty=torch.tensor([2.0]), counts=counts,
                          min_tokens=torch.tensor([2]), num_output_tokens=torch.tensor([1]),
                          stop_ids=LP.Csr(torch.tensor([0, 1]), torch.tensor([9])))
    want = LP.apply_verify(tgt, inp, cu, ids)
    assert want[0, d0] == 4.0 and want[1, d0] == 2.0 and want[2, d0] == 2.0   # d0 seen from j=1
    assert want[2, 7] == 0.5 and want[1, 7] == 1.0                           # d1 seen from j=2
    assert want[0, 9] == float("-inf") and want[1, 9] == 1.0   # 1 + j < 2 only at j = 0
    backends = ["reference"]
    try:
        skip_unless_backend("triton")
        backends.append("triton")
    except pytest.skip.Exception:
        pass
    if "triton" in backends:
        from tokenspeed_kernel.triton import verify_processing as tvp
        dev = torch.empty(0, device=DEVICE).device   # with its index, as the ops pass it
        inp_d = LP.map_requests(inp, lambda t: t.to(dev),
                                lambda c: LP.Csr(*[t if t is None else t.to(dev) for t in c]))
        inp_d = inp_d._replace(counts=LP.TokenCounts(counts.seen.to(dev), counts.output.to(dev)))
        proc, _ = OV._prepare_processing(inp_d, 1, 3, V, dev, True)
        got = tvp.process_target(tgt.to(dev), proc, False, ids.to(dev), cu.to(dev), 2, False,
                                 block=16)
        assert torch.equal(got.cpu(), want)


def _backends():
    out = []
    for b in ("reference", "triton", "cuda"):
        try:
            skip_unless_backend(b)
            out.append(b)
        except pytest.skip.Exception:
            pass
    return out


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("mode", ["probabilistic", "ngram", "strict"])
def test_backends_agree_with_processing(mode, padded):
    """Same tokens, accept counts and validity on every backend; logprobs are raw (over the
    unprocessed target rows), processed_logprobs agree across backends."""
    backends = _backends()
    if len(backends) < 2:
        pytest.skip("needs two backends")
    gen = _gen(5)
    ns, V = [2, 0, 3, 1], 96
    tgt, ids, cu, max_n, rows = _layout(ns, V, gen, padded)
    R = tgt.shape[0]
    inp = _proc_inputs("all", ns, V, gen)
    inp = inp._replace(allowed_mask=_per_row_mask(R, V, gen) | 0x0F0F0F0F)
    bs = len(ns)
    kw = dict(mode=mode, temperature=torch.tensor([0.8, 1.0, 0.0, 1.3], device=DEVICE),
              top_k=torch.tensor([0, 20, 0, 5], device=DEVICE), processing=inp,
              max_num_draft=max_n)
    if padded:
        kw["num_draft"] = torch.tensor(ns, device=DEVICE)
    else:
        kw["cu_num_draft"] = cu
    if mode == "probabilistic":
        nd = ids.numel() if padded else int(cu[-1])
        kw["draft_logits"] = (torch.randn(nd, V, generator=gen) * 2).to(DEVICE)
    seed = torch.arange(bs, device=DEVICE) + 100
    off = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    outs = {}
    for b in backends:
        outs[b] = ops.verify_with_logprobs(tgt, ids, seed, off, backend=b, **kw)
    ref = outs["reference"]
    for b in backends[1:]:
        o = outs[b]
        assert torch.equal(o.tokens, ref.tokens), (b, o.tokens, ref.tokens)
        assert torch.equal(o.num_accepted, ref.num_accepted)
        assert torch.equal(o.valid, ref.valid)
        torch.testing.assert_close(o.logprobs, ref.logprobs, atol=2e-4, rtol=1e-4, equal_nan=True)
        torch.testing.assert_close(o.processed_logprobs, ref.processed_logprobs, atol=2e-4,
                                   rtol=1e-4, equal_nan=True)
        plain = ops.verify(tgt, ids, seed, off, backend=b, **kw)
        assert torch.equal(plain.tokens, o.tokens)
    # raw logprobs: log_softmax of the unprocessed target row at the emitted token
    W = max_n + 1
    for i in range(bs):
        if not bool(ref.valid[i]):
            continue
        for j in range(int(ref.num_accepted[i]) + 1):
            r = i * W + j if padded else int(cu[i]) + i + j
            t = int(ref.tokens[i, j])
            want = torch.log_softmax(tgt[r].float(), 0)[t]
            torch.testing.assert_close(ref.logprobs[i, j], want, atol=1e-5, rtol=1e-5)
    # processing changed the outcome of this case (else the test would not test it)
    base = ops.verify(tgt, ids, seed, off, backend="reference",
                      **{k: v for k, v in kw.items() if k != "processing"})
    assert not torch.equal(base.tokens, ref.tokens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_logits_with_processing_agree(dtype):
    """bf16 / fp16 target and draft logits with processing: the processed target rows are
    float32 and the drafts are converted to float32 with them (the CUDA and the Triton kernels
    take one dtype for target and drafts: the Triton kernels' mixed-dtype row pointer fails to
    compile for the GPU, which the interpreter does not check); every backend gives the
    reference's tokens."""
    backends = _backends()
    if len(backends) < 2:
        pytest.skip("needs two backends")
    gen = _gen(11)
    ns, V = [3, 1, 2], 80
    tgt, ids, cu, max_n, rows = _layout(ns, V, gen, False)
    inp = _proc_inputs("all", ns, V, gen)
    drf = (torch.randn(int(cu[-1]), V, generator=gen) * 2).to(DEVICE)
    kw = dict(cu_num_draft=cu, draft_logits=drf.to(dtype), max_num_draft=max_n, processing=inp,
              temperature=torch.tensor([0.9, 1.0, 0.7], device=DEVICE))
    seed = torch.arange(len(ns), device=DEVICE) + 7
    off = torch.zeros(len(ns), dtype=torch.int64, device=DEVICE)
    outs = {b: ops.verify(tgt.to(dtype), ids, seed, off, backend=b, **kw) for b in backends}
    ref = outs["reference"]
    for b in backends[1:]:
        assert torch.equal(outs[b].tokens, ref.tokens), (b, outs[b].tokens, ref.tokens)
        assert torch.equal(outs[b].num_accepted, ref.num_accepted)
        assert torch.equal(outs[b].valid, ref.valid)


def test_emitted_tokens_follow_processed_distribution():
    """ngram verify with one draft, many requests with different seeds (reference): the first
    emitted token follows softmax(processed row 0), and after an accepted draft the second
    follows softmax(processed row 1) -- where the draft counts as an output token
    (repetition penalty); chi-square at alpha 1e-3. The second distribution is checked to
    differ from the one without the draft counted, so the test would catch its omission."""
    V, n, d0 = 12, 5000, 3
    g = _gen(3)
    base = torch.randn(2, V, generator=g)
    base[:, d0] = 2.5            # the draft is likely, accepted often
    counts = LP.new_token_counts(1, V)
    one = LP.LogitsInputs(repetition_penalty=torch.tensor([3.0]), counts=counts,
                          logit_bias=LP.Csr(torch.tensor([0, 1]), torch.tensor([7]),
                                            torch.tensor([1.5])))
    P = LP.apply_verify(base, one, torch.tensor([0, 1]), torch.tensor([d0]))
    P_nopre = LP.apply(base, one, 2)   # both rows as request 0 with no draft counted
    p0, p1 = torch.softmax(P[0], 0), torch.softmax(P[1], 0)
    assert (p1 - torch.softmax(P_nopre[1], 0)).abs().sum() > 0.3
    tgt = base.repeat(n, 1)
    ids = torch.full((n,), d0)
    cu = torch.arange(n + 1)
    inp = LP.LogitsInputs(repetition_penalty=torch.full((n,), 3.0), counts=counts,
                          count_slots=torch.zeros(n, dtype=torch.int64),
                          logit_bias=LP.Csr(torch.arange(n + 1), torch.full((n,), 7),
                                            torch.full((n,), 1.5)))
    out = ops.verify(tgt, ids, torch.arange(n) + 1, torch.zeros(n, dtype=torch.int64),
                     cu_num_draft=cu, mode="ngram", processing=inp, max_num_draft=1,
                     backend="reference")
    assert bool(out.valid.all())
    first = torch.bincount(out.tokens[:, 0], minlength=V).double()
    assert _pooled_chisquare(first.numpy(), (p0.double() * n).numpy()) > ALPHA
    acc = out.num_accepted == 1
    second = torch.bincount(out.tokens[acc, 1], minlength=V).double()
    m = int(acc.sum())
    assert m > 1000
    assert _pooled_chisquare(second.numpy(), (p1.double() * m).numpy()) > ALPHA
    # power: the same draws reject the distribution without the draft counted
    wrong = torch.softmax(P_nopre[1], 0).double() * m
    assert _pooled_chisquare(second.numpy(), wrong.numpy()) < ALPHA


def test_processing_errors_name_the_argument():
    gen = _gen(1)
    tgt, ids, cu, max_n, _ = _layout([1, 2], 40, gen, False)
    kw = dict(cu_num_draft=cu, mode="ngram", max_num_draft=max_n)
    with pytest.raises(TypeError, match="processing"):
        ops.verify(tgt, ids, 1, 0, processing="bias", **kw)
    bad = LP.LogitsInputs(allowed_mask=torch.zeros(4, 2, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="processing.allowed_mask.* or 5"):
        ops.verify(tgt, ids, 1, 0, processing=bad, **kw)
    bad = LP.LogitsInputs(allowed_mask=torch.zeros(5, 3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="processing.allowed_mask"):   # per row, wrong width
        ops.verify(tgt, ids, 1, 0, processing=bad, **kw)
    bad = LP.LogitsInputs(repetition_penalty=torch.tensor([1.0, 2.0], device=DEVICE))
    with pytest.raises(ValueError, match="processing.counts"):
        ops.verify(tgt, ids, 1, 0, processing=bad, **kw)
    # empty inputs: the plain verify
    a = ops.verify(tgt, ids, 1, 0, processing=LP.LogitsInputs(), **kw)
    b = ops.verify(tgt, ids, 1, 0, **kw)
    assert torch.equal(a.tokens, b.tokens)


def test_bench_proc_providers_check_against_the_reference():
    """The verify bench's +proc providers: checked against the reference with the same inputs
    (a call that ignores the processing is caught)."""
    import os
    from tokenspeed_kernel.bench import verify as bv
    skip_unless_backend("triton")
    if DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Problem() samples its drafts with Triton")
    pb = bv.Problem(3, 2, 300, torch.float32, DEVICE)
    assert bv._check_ours(pb, bv.ours_call("triton", proc=True), "ours-triton+proc") is None
    why = bv._check_ours(pb, bv.ours_call("triton"), "ours-triton+proc")
    assert why is not None and "differ" in why
    assert {"ours-cuda+proc", "ours-triton+proc"} <= set(bv.PROVIDERS)


@pytest.mark.parametrize("backend", ["reference", "triton", "cuda"])
def test_unvalidated_bad_inputs_follow_the_samplers_rules(backend):
    """validate=False with malformed CSR offsets, ids outside [0, V), repeated bias ids and
    count slots outside [0, N) (tests/test_sample_processing.py's cases): verify with no drafts
    emits the sampler's documented greedy tokens on every backend (the CUDA backend included:
    its processing is the Triton pre-pass), and validate=True raises naming processing."""
    skip_unless_backend(backend)
    from test_sample_processing import _bad_inputs_cases
    V = 64
    x = (1.0 - 0.01 * torch.arange(V, dtype=torch.float32, device=DEVICE)).repeat(4, 1)
    ids = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    cu = torch.zeros(5, dtype=torch.int64, device=DEVICE)
    for name, inp, want, _ in _bad_inputs_cases():
        out = ops.verify(x, ids, 1, 0, cu_num_draft=cu, mode="ngram", temperature=0.0,
                         processing=inp, backend=backend, validate=False, max_num_draft=0)
        assert out.tokens[:, 0].tolist() == want, (name, out.tokens.tolist())
        assert out.valid.all(), name
        with pytest.raises(ValueError, match="processing"):
            ops.verify(x, ids, 1, 0, cu_num_draft=cu, mode="ngram", temperature=0.0,
                       processing=inp, backend=backend)
