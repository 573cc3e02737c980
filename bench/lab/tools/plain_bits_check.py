"""Tokens of the temperature-only (PLAIN) lab bits against the reference, on a GPU build with the
patch applied: F_PLAIN_BEST (67108864, bench/lab/patches/s19_plain_best.patch: the cluster
launch's and the split-candidates launch's streamed filter against the CTA's best score) and
F_SPLIT_ROWBAR (134217728, s19_split_rowbar.patch: the split launch's CTAs share the row's
best score). Cases: the split launch (B = 1 / 4 / 16 / 33 / 64, one greedy row each), the cluster
launch at one CTA per row (B = 128 / 256 / 300), the split-candidates launch's plain rows (B = 4 /
16, top-k off on the odd rows), fp32 / bf16, T = 0.8 and near-greedy T = 0.05, with logprobs.
A bit the build does not know is dropped by the op (kCallerFlags), so a build checks its own.
(F_PLAIN_BEST's filter is the default since it was merged: on the tree, flag 0 checks it, and the
default list no longer names its bit.)

    PYTHONPATH=python python bench/lab/tools/plain_bits_check.py [flags ...]
        (default: 0 134217728)
"""
import sys

import torch

from tokenspeed_kernel import ops, testing

flags = [int(f) for f in sys.argv[1:]] or [0, 134217728]
dev = torch.device("cuda")
bad = n = 0
for dtype in (torch.float32, torch.bfloat16):
    for B, T, topk in ((1, 0.8, False), (4, 0.8, False), (16, 0.8, False), (33, 0.05, False),
                       (64, 0.8, False), (128, 0.8, False), (256, 0.8, False), (300, 0.05, False),
                       (4, 0.8, True), (16, 0.8, True)):
        g = torch.Generator(device=dev).manual_seed(B + int(T * 100))
        z = (torch.randn(B, 151936, generator=g, device=dev) * 4).to(dtype)
        seed = torch.arange(B, device=dev) + 17
        off = torch.zeros(B, dtype=torch.int64, device=dev)
        temp = torch.full((B,), T, device=dev)
        if B > 1 and not topk:
            temp[B // 2] = 0.0   # a greedy row in the call
        kw = dict(temperature=temp)
        if topk:
            kw["top_k"] = torch.tensor([50 if i % 2 == 0 else 0 for i in range(B)],
                                       dtype=torch.int32, device=dev)
        want = ops.sample(z, seed, off, backend="reference", **kw).tokens
        for fl in flags:
            with testing.knobs(sampler_flags=fl):
                got = ops.sample_with_logprobs(z, seed, off, backend="cuda", **kw)
            torch.cuda.synchronize()
            d = int((got.tokens != want).sum())
            n += 1
            if d:
                bad += 1
                print(f"FAIL {dtype} B={B} T={T} top_k={topk} flags={fl}: {d} rows differ")
print(f"plain_bits_check: {n} calls, {bad} failures")
