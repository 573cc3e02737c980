"""Randomized cross-backend check of ops.verify / verify_with_logprobs: small random chains (1-3
requests of 0-4 drafts, V from 2 to 203, fp32 / bf16 / fp16, probabilistic / ngram / strict,
drafts the target likes or not, NaN / +-inf entries, every filter, sometimes processing) against
the reference on the CPU: tokens, accept counts and valid equal, logprobs to 1e-4, and one
request verified alone gives what it got in the batch. Prints each mismatch or raise, and a
count.

    python bench/lab/tools/fuzz_verify.py N SEED [backends=triton[,cuda]] [device=cpu|cuda]

On the CPU the Triton backend runs in the interpreter (TRITON_INTERPRET=1). It borrows
tests/test_verify_processing.py's input builder; tests/test_random_cases.py runs it.
"""
import random
import sys
from pathlib import Path

import torch

from tokenspeed_kernel import ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from fuzz_sampling import cli, to_dev  # noqa: E402
from test_verify_processing import _proc_inputs  # noqa: E402


def case(rng):
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    bs = rng.choice([1, 2, 3])
    ns = [rng.choice([0, 1, 2, 4]) for _ in range(bs)]
    V = rng.choice([2, 7, 33, 64, 100, 203])
    dt = rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16])
    mode = rng.choice(["probabilistic", "ngram", "strict"])
    scale = rng.choice([0.1, 1, 4, 30, 1e4 if dt == torch.float32 else 50])
    cu = torch.tensor([0] + ns).cumsum(0)
    nd = int(cu[-1])
    ids = torch.randint(0, V, (nd,), generator=g)
    tgt = torch.randn(nd + bs, V, generator=g) * scale
    drf = torch.randn(nd, V, generator=g) * scale
    for k in range(nd):   # drafts the target likes, sometimes
        if rng.random() < 0.6:
            q = int((cu[1:] <= k).sum())
            tgt[k + q, ids[k]] += abs(scale) * 2
            drf[k, ids[k]] += abs(scale) * 2
    if rng.random() < 0.15:
        tgt[rng.randrange(nd + bs), rng.randrange(V)] = rng.choice(
            [float("nan"), float("inf"), -float("inf")])
    kw = {}
    f32 = torch.float32
    if rng.random() < 0.8:
        kw["temperature"] = torch.tensor([rng.choice([0.0, 1e-6, 0.7, 1.0, 1.5])
                                          for _ in range(bs)], dtype=f32)
    if rng.random() < 0.4:
        kw["top_k"] = torch.tensor([rng.choice([0, 1, 3, V]) for _ in range(bs)])
    if rng.random() < 0.4:
        kw["top_p"] = torch.tensor([rng.choice([1.0, 0.9, 0.3]) for _ in range(bs)], dtype=f32)
    if rng.random() < 0.3:
        kw["min_p"] = torch.tensor([rng.choice([0.0, 0.1, 0.5]) for _ in range(bs)], dtype=f32)
    if rng.random() < 0.25 and V >= 33:
        kw["processing"] = _proc_inputs(rng.choice(["bias", "penalties", "allowed", "all"]), ns,
                                        V, g)
    seed = torch.randint(0, 2**62, (bs,), generator=g)
    off = torch.randint(0, 2**40, (bs,), generator=g)
    return tgt.to(dt), drf.to(dt), ids, cu, seed, off, mode, kw, (ns, V, dt, mode)


def main(N, s0, backends, dev):
    rng = random.Random(s0)
    bad = 0
    for i in range(N):
        tgt, drf, ids, cu, seed, off, mode, kw, desc = case(rng)
        lp = rng.random() < 0.5
        f = ops.verify_with_logprobs if lp else ops.verify

        def call(be, d):
            return f(tgt.to(d), ids.to(d), seed.to(d), off.to(d), backend=be,
                     cu_num_draft=cu.to(d),
                     draft_logits=drf.to(d) if mode == "probabilistic" else None, mode=mode,
                     **{k: to_dev(v, d) for k, v in kw.items()})
        try:
            a = call("reference", torch.device("cpu"))
        except Exception as e:  # noqa: BLE001
            print(i, "reference raised", type(e).__name__, str(e)[:200], desc)
            continue
        for be in backends:
            try:
                b = call(be, dev)
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(i, be, "raised", type(e).__name__, str(e)[:300], desc, flush=True)
                continue
            ok = all(torch.equal(x, y.cpu()) for x, y in zip(a[:3], b[:3]))
            if lp and ok:
                ok = all(torch.allclose(x, y.cpu(), rtol=1e-4, atol=1e-4, equal_nan=True)
                         for x, y in zip(a[3:], b[3:]))
            if not ok:
                bad += 1
                print(i, be, "MISMATCH", desc, "reference", [x.tolist() for x in a], be,
                      [x.tolist() for x in b], flush=True)
                continue
            if "processing" not in kw and len(cu) > 2:
                # batch invariance: one request alone (its rows, drafts and parameters)
                q = rng.randrange(len(cu) - 1)
                c0, c1 = int(cu[q]), int(cu[q + 1])
                kq = {k: v[q:q + 1].to(dev) for k, v in kw.items()}
                c = ops.verify(tgt[c0 + q:c1 + q + 1].to(dev), ids[c0:c1].to(dev),
                               seed[q:q + 1].to(dev), off[q:q + 1].to(dev), backend=be,
                               cu_num_draft=torch.tensor([0, c1 - c0], device=dev),
                               draft_logits=(drf[c0:c1].to(dev) if mode == "probabilistic"
                                             else None), mode=mode, **kq)
                n = c1 - c0
                same = (int(c.num_accepted[0]) == int(a.num_accepted[q])
                        and bool(c.valid[0]) == bool(a.valid[q])
                        and torch.equal(c.tokens[0, :n + 1].cpu(), a.tokens[q, :n + 1]))
                if not same:
                    bad += 1
                    print(i, be, "REQUEST ALONE DIFFERS", desc, "request", q, "in the batch",
                          a.tokens[q].tolist(), "alone", c.tokens[0].tolist(), flush=True)
        if i % 100 == 0:
            print("progress", i, "bad", bad, flush=True)
    print("done", N, "verify cases, backends", backends, "bad", bad)
    return bad


if __name__ == "__main__":
    sys.exit(cli(main))
