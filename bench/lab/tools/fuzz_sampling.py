"""Randomized cross-backend check of ops.sample / sample_with_logprobs: small random cases (V from
1 to 257, 1-5 rows, tokens_per_request 1-2, fp32 / bf16 / fp16, magnitudes 0.01 to 1e30, ties,
+-inf / NaN entries, -inf rows, every filter with edge values, sometimes a processing input)
against the reference on the CPU: tokens and valid equal, logprobs to 1e-4, and one row sampled
alone gives the token it got in the batch. Prints each mismatch or raise, and a count.

    python bench/lab/tools/fuzz_sampling.py N SEED [backends=triton[,cuda]] [device=cpu|cuda]

On the CPU the Triton backend runs in the interpreter (TRITON_INTERPRET=1). It borrows
tests/test_sample_processing.py's input builder; tests/test_random_cases.py runs it.
"""
import random
import sys
from pathlib import Path

import torch

from tokenspeed_kernel import ops
from tokenspeed_kernel.reference import logits_processing as LP

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_sample_processing import _inputs  # noqa: E402

KINDS = ["bias", "repetition", "frequency", "presence", "allowed", "banned", "min_tokens", "all"]


def case(rng):
    R = rng.choice([1, 2, 3, 4])
    tpr = rng.choice([1, 1, 2]) if R % 2 == 0 else 1
    n = R // tpr
    V = rng.choice([1, 2, 7, 31, 32, 33, 64, 100, 203, 257])
    dt = rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16])
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    scale = rng.choice([0.01, 1, 4, 30, 1e4, 1e30 if dt == torch.float32 else 100])
    z = torch.randn(R, V, generator=g) * scale
    if rng.random() < 0.3:   # ties
        z = torch.round(z)
    if rng.random() < 0.2:
        z[rng.randrange(R), rng.randrange(V)] = rng.choice([-float("inf"), float("inf"),
                                                            float("nan")])
    if rng.random() < 0.1:
        z[rng.randrange(R)] = -float("inf")
    z = z.to(dt)
    kw = {}
    f32 = torch.float32
    if rng.random() < 0.8:
        kw["temperature"] = torch.tensor(
            [rng.choice([0.0, 1e-6, 0.5, 1.0, 2.0, 1e-30]) for _ in range(n)], dtype=f32)
    if rng.random() < 0.5:
        kw["top_k"] = torch.tensor([rng.choice([0, 1, 2, 5, V, V + 3, -1]) for _ in range(n)])
    if rng.random() < 0.5:
        kw["top_p"] = torch.tensor([rng.choice([1.0, 0.9, 0.5, 1e-6, 0.999]) for _ in range(n)],
                                   dtype=f32)
    if rng.random() < 0.4:
        kw["min_p"] = torch.tensor([rng.choice([0.0, 0.1, 0.9, 1.0, 1e-4]) for _ in range(n)],
                                   dtype=f32)
    if rng.random() < 0.3 and V >= 31 and n <= 4:
        kw["processing"] = _inputs(rng.choice(KINDS), n, V, g)
    seed = torch.randint(0, 2**62, (n,), generator=g)
    off = torch.randint(0, 2**40, (n,), generator=g)
    return z, seed, off, tpr, kw


def to_dev(v, dev):
    if isinstance(v, torch.Tensor):
        return v.to(dev)
    out = LP.map_requests(v, lambda t: t.to(dev),
                          lambda c: LP.Csr(*[t if t is None else t.to(dev) for t in c]))
    if v.counts is not None:
        out = out._replace(counts=LP.TokenCounts(v.counts.seen.to(dev), v.counts.output.to(dev)))
    return out


def main(N, s0, backends, dev):
    rng = random.Random(s0)
    bad = 0
    for i in range(N):
        z, seed, off, tpr, kw = case(rng)
        lp = rng.random() < 0.5
        f = ops.sample_with_logprobs if lp else ops.sample
        desc = (tuple(z.shape), z.dtype, "tpr", tpr,
                {k: (v.tolist() if isinstance(v, torch.Tensor) else "proc") for k, v in kw.items()})
        try:
            a = f(z, seed, off, tokens_per_request=tpr, backend="reference", **kw)
        except Exception as e:  # noqa: BLE001
            print(i, "reference raised", type(e).__name__, str(e)[:150], desc)
            continue
        for be in backends:
            kd = {k: to_dev(v, dev) for k, v in kw.items()}
            try:
                b = f(z.to(dev), seed.to(dev), off.to(dev), tokens_per_request=tpr, backend=be,
                      **kd)
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(i, be, "raised", type(e).__name__, str(e)[:300], desc, flush=True)
                continue
            ok = torch.equal(a.tokens, b.tokens.cpu()) and torch.equal(a.valid, b.valid.cpu())
            if lp and ok:
                for x, y in ((a.logprobs, b.logprobs), (a.processed_logprobs,
                                                        b.processed_logprobs)):
                    ok = ok and torch.allclose(x, y.cpu(), rtol=1e-4, atol=1e-4, equal_nan=True)
            if not ok:
                bad += 1
                print(i, be, "MISMATCH", desc, "reference", a.tokens.tolist(), a.valid.tolist(),
                      be, b.tokens.tolist(), b.valid.tolist(), flush=True)
                continue
            if tpr == 1 and "processing" not in kw and z.shape[0] > 1:
                # batch invariance: one row alone (another batch size: another launch layout)
                j = rng.randrange(z.shape[0])
                kj = {k: v[j:j + 1].to(dev) for k, v in kw.items()}
                c = ops.sample(z[j:j + 1].to(dev), seed[j:j + 1].to(dev), off[j:j + 1].to(dev),
                               backend=be, **kj)
                if (int(c.tokens[0]) != int(a.tokens[j])
                        or bool(c.valid[0]) != bool(a.valid[j])):
                    bad += 1
                    print(i, be, "ROW ALONE DIFFERS", desc, "row", j, "in the batch",
                          int(a.tokens[j]), "alone", int(c.tokens[0]), flush=True)
        if i % 100 == 0:
            print("progress", i, "bad", bad, flush=True)
    print("done", N, "cases, backends", backends, "bad", bad)
    return bad


def cli(main_fn) -> int:
    """``main_fn(N, SEED, backends, device)`` from the command line; exit status 1 on a bad case."""
    a = sys.argv
    return 1 if main_fn(int(a[1]), int(a[2]), (a[3] if len(a) > 3 else "triton").split(","),
                        torch.device(a[4] if len(a) > 4 else "cpu")) else 0


if __name__ == "__main__":
    sys.exit(cli(main))
