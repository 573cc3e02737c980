"""Bad bounds under validate=False (what a wrong bound inside a CUDA graph reaches), for
compute-sanitizer memcheck on the CUDA and Triton kernels: every output must be the documented
one (the reference backend's), and nothing may be read or written out of bounds.

    compute-sanitizer --tool memcheck python tools/sanitize_bad_bounds.py [cuda|triton ...]
    TS_SAN_DEVICE=cpu TRITON_INTERPRET=1 python tools/sanitize_bad_bounds.py triton   # dry run

Sets PYTORCH_NO_CUDA_MEMORY_CACHING=1 before torch loads, so that every tensor is its own
allocation and memcheck sees an access past its end (the caching allocator's pools hide them).
Cases:
  verify, ragged: a request with more drafts than max_num_draft (n = 5 > 2) -> that request
    invalid (token 0, 0 accepted), the others exact; probabilistic and strict, with logprobs.
  verify, padded: num_draft outside [0, max_n] (5 and -1 with max_n = 3) -> invalid requests.
  verify, ragged cu_num_draft that is not a partition of the drafts (ranges past the ids,
    before 0, decreasing) -> those requests invalid, the others as verified alone.
  sample: huge top_k (2**40, saturates to "off"), temperature 1e-39, rows of NaN / -inf.
  sample and verify with processing: malformed CSR offsets, ids outside [0, V), repeated bias
    ids, count slots outside [0, N) (the documented rules; tests/test_sample_processing.py's
    cases).
  token counts: tokens >= V and < 0 with validate=False -> skipped.
"""
import os
import sys

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import torch  # noqa: E402

from tokenspeed_kernel import ops  # noqa: E402


def same(a, b, what):
    a, b = a.cpu(), b.cpu()
    ok = torch.equal(a, b)
    print(f"  {what}: {'ok' if ok else 'MISMATCH'}", flush=True)
    if not ok:
        print("   got ", a.tolist(), "\n   want", b.tolist())
    return ok


def main(backends):
    dev = torch.device(os.environ.get("TS_SAN_DEVICE", "cuda"))   # cpu: a dry run (interpreter)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    V = 4099                     # odd: unaligned rows
    good = True
    for be in backends:
        print(f"[{be}]", flush=True)
        # verify, ragged, a request beyond max_num_draft
        n = [2, 5, 0, 1]
        cu = torch.tensor([0] + torch.tensor(n).cumsum(0).tolist())
        tot, bs = int(cu[-1]), len(n)
        tgt = torch.randn(tot + bs, V, generator=g) * 3
        drf = torch.randn(tot, V, generator=g) * 3
        ids = torch.randint(0, V, (tot,), generator=g)
        seed = torch.arange(bs) + 3
        off = torch.zeros(bs, dtype=torch.int64)
        for mode in ("probabilistic", "strict"):
            kw = dict(cu_num_draft=cu, mode=mode, max_num_draft=2, validate=False,
                      temperature=torch.full((bs,), 0.9),
                      draft_logits=drf if mode == "probabilistic" else None)
            want = ops.verify_with_logprobs(tgt, ids, seed, off, backend="reference", **kw)
            got = ops.verify_with_logprobs(
                tgt.to(dev), ids.to(dev), seed.to(dev), off.to(dev), backend=be,
                **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
            sync()
            good &= same(got.tokens, want.tokens, f"verify ragged {mode} tokens")
            good &= same(got.num_accepted, want.num_accepted, f"verify ragged {mode} accepted")
            good &= same(got.valid, want.valid, f"verify ragged {mode} valid")
        # verify, padded, num_draft outside [0, max_n]
        max_n = 3
        tgt3 = torch.randn(bs, max_n + 1, V, generator=g) * 3
        drf3 = torch.randn(bs, max_n, V, generator=g) * 3
        ids3 = torch.randint(0, V, (bs, max_n), generator=g)
        nd = torch.tensor([1, 5, -1, 3])
        kw = dict(num_draft=nd, draft_logits=drf3, max_num_draft=max_n, validate=False)
        want = ops.verify(tgt3, ids3, seed, off, backend="reference", **kw)
        got = ops.verify(tgt3.to(dev), ids3.to(dev), seed.to(dev), off.to(dev), backend=be,
                         **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v)
                            for k, v in kw.items()})
        sync()
        good &= same(got.tokens, want.tokens, "verify padded tokens")
        good &= same(got.valid, want.valid, "verify padded valid")
        # verify, ragged layouts that are not a partition of the drafts (ranges past the draft
        # ids, before 0, decreasing): those requests invalid, the others as verified alone
        for cu_l, nids in ([0, 2, 9], 3), ([2, 3, 3], 3), ([0, 5, 3], 3), ([0, 2, 1, 3], 3):
            b2 = len(cu_l) - 1
            tg = torch.randn(nids + b2, V, generator=g) * 3
            dr = torch.randn(nids, V, generator=g) * 3
            di = torch.randint(0, V, (nids,), generator=g)
            for mode in ("probabilistic", "strict"):
                kw = dict(cu_num_draft=torch.tensor(cu_l), mode=mode, max_num_draft=8,
                          validate=False, temperature=torch.full((b2,), 0.9),
                          draft_logits=dr if mode == "probabilistic" else None)
                want = ops.verify(tg, di, torch.arange(b2), torch.zeros(b2, dtype=torch.int64),
                                  backend="reference", **kw)
                got = ops.verify(tg.to(dev), di.to(dev), torch.arange(b2, device=dev),
                                 torch.zeros(b2, dtype=torch.int64, device=dev), backend=be,
                                 **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v)
                                    for k, v in kw.items()})
                sync()
                good &= same(got.tokens, want.tokens, f"verify {mode} cu={cu_l} tokens")
                good &= same(got.valid, want.valid, f"verify {mode} cu={cu_l} valid")
        # sample: saturating top_k, tiny temperature, special rows
        x = torch.randn(4, V, generator=g) * 4
        x[1] = float("nan")
        x[2] = float("-inf")
        s = torch.arange(4)
        for kw in (dict(top_k=2**40, temperature=0.7), dict(temperature=1e-39),
                   dict(top_k=torch.tensor([0, 2**31 - 1, V, V + 1]), top_p=0.5)):
            want = ops.sample(x, s, 0, backend="reference", **kw)
            got = ops.sample(x.to(dev), s.to(dev), 0, backend=be, validate=False,
                             **{k: (v.to(dev) if isinstance(v, torch.Tensor) else v)
                                for k, v in kw.items()})
            sync()
            good &= same(got.tokens, want.tokens, f"sample {sorted(kw)} tokens")
            good &= same(got.valid, want.valid, f"sample {sorted(kw)} valid")
        # sample with processing: malformed CSR offsets, ids outside [0, V), repeated bias ids,
        # count slots outside [0, N) (tests/test_sample_processing.py's cases, V = 64)
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests"))
        import conftest
        conftest.DEVICE = dev
        import test_sample_processing as TP
        TP.DEVICE = dev
        xp = (1.0 - 0.01 * torch.arange(64, dtype=torch.float32, device=dev)).repeat(4, 1)
        for name, inp, want_tok, cuda_exact in TP._bad_inputs_cases():
            got = ops.sample(xp, 1, 0, temperature=0.0, processing=inp, backend=be,
                             validate=False)
            sync()
            if be != "cuda" or cuda_exact:
                good &= same(got.tokens, torch.tensor(want_tok), f"processing: {name}")
            good &= same(got.valid, torch.ones(4, dtype=torch.bool), f"processing: {name} valid")
            # verify with processing (the Triton pre-pass on both backends), no drafts
            cu0 = torch.zeros(5, dtype=torch.int64, device=dev)
            got = ops.verify(xp, cu0[:0], 1, 0, cu_num_draft=cu0, mode="ngram",
                             temperature=0.0, processing=inp, backend=be, validate=False,
                             max_num_draft=0)
            sync()
            good &= same(got.tokens[:, 0], torch.tensor(want_tok), f"verify processing: {name}")
    # token counts (Triton kernels): out-of-range tokens skipped
    c = ops.new_token_counts(3, V, device=dev)
    ops.add_output_tokens(c, torch.tensor([[V, 1], [-5, 2**40], [V - 1, -1]], device=dev),
                          validate=False)
    sync()
    good &= same(c.output.sum(), torch.tensor(2, dtype=torch.int64), "token counts: 2 counted")
    print("ALL OK" if good else "FAILED", flush=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["cuda", "triton"]))
