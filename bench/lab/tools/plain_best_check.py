"""Tokens of the lab bit F_PLAIN_BEST (bench/lab/patches/s19_plain_best.patch: the PLAIN streamed
rows filter against the CTA's best approximate score minus a margin) against the reference: temperature-only rows on the
cluster launch at one CTA per row (B = 128 / 256 / 300), with logprobs, fp32 / bf16, T = 0.8 and
near-greedy T = 0.05; and the split-candidates launch's plain rows (B = 4 / 16, a top-k tensor
with top-k off on the odd rows). A GPU build with the patch applied:

    PYTHONPATH=python python bench/lab/tools/plain_best_check.py
"""
import torch

from tokenspeed_kernel import ops, testing

F_PLAIN_BEST = 67108864
dev = torch.device("cuda")
bad = n = 0
for dtype in (torch.float32, torch.bfloat16):
    for B, T, topk in ((128, 0.8, False), (256, 0.8, False), (300, 0.05, False), (4, 0.8, True),
                       (16, 0.8, True)):
        g = torch.Generator(device=dev).manual_seed(B + int(T * 100))
        z = (torch.randn(B, 151936, generator=g, device=dev) * 4).to(dtype)
        seed = torch.arange(B, device=dev) + 17
        off = torch.zeros(B, dtype=torch.int64, device=dev)
        kw = dict(temperature=torch.full((B,), T, device=dev))
        if topk:
            kw["top_k"] = torch.tensor([50 if i % 2 == 0 else 0 for i in range(B)],
                                       dtype=torch.int32, device=dev)
        want = ops.sample(z, seed, off, backend="reference", **kw).tokens
        for fl in (0, F_PLAIN_BEST):
            with testing.knobs(sampler_flags=fl):
                got = ops.sample_with_logprobs(z, seed, off, backend="cuda", **kw)
            torch.cuda.synchronize()
            d = int((got.tokens != want).sum())
            n += 1
            if d:
                bad += 1
                print(f"FAIL {dtype} B={B} T={T} top_k={topk} flags={fl}: {d} rows differ")
print(f"plain_best_check: {n} calls, {bad} failures")
