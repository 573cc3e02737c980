"""Tokens and logprobs of min-p calls on the split launch (lab bit F_SPLIT_MINP, 268435456,
bench/lab/patches/s20_split_minp.patch) against the reference and against the launch without the
bit: B = 1 / 4 / 16 / 33 (the split launch's range), fp32 / bf16, min-p 0.1 / 0.5 / 0.01 at
T = 0.8, near-greedy T = 0.05, flat rows (T = 2, min-p 0.01: many chunks hold kept tokens), a
greedy row and a min-p 0 row in each call, with and without logprobs. GPU, patched build.

    PYTHONPATH=python python bench/lab/tools/split_minp_check.py
"""
import torch

from tokenspeed_kernel import ops, testing

F_SPLIT_MINP = 268435456
dev = torch.device("cuda")
bad = n = 0
for dtype in (torch.float32, torch.bfloat16):
    for B in (1, 4, 16, 33):
        for T, mp, scale in ((0.8, 0.1, 4.0), (0.8, 0.5, 4.0), (0.8, 0.01, 4.0), (0.05, 0.1, 4.0),
                             (2.0, 0.01, 1.0)):
            g = torch.Generator(device=dev).manual_seed(B * 100 + int(T * 10) + int(mp * 1000))
            z = (torch.randn(B, 151936, generator=g, device=dev) * scale).to(dtype)
            seed = torch.arange(B, device=dev) + 5
            off = torch.full((B,), 3, dtype=torch.int64, device=dev)
            temp = torch.full((B,), T, device=dev)
            minp = torch.full((B,), mp, device=dev)
            if B > 2:
                temp[1] = 0.0   # a greedy row
                minp[2] = 0.0   # a temperature-only row in the min-p call
            kw = dict(temperature=temp, min_p=minp)
            ref = ops.sample_with_logprobs(z, seed, off, backend="reference", **kw)
            for lp in (False, True):
                for fl in (0, F_SPLIT_MINP):
                    with testing.knobs(sampler_flags=fl):
                        if lp:
                            got = ops.sample_with_logprobs(z, seed, off, backend="cuda", **kw)
                        else:
                            got = ops.sample(z, seed, off, backend="cuda", **kw)
                    torch.cuda.synchronize()
                    n += 1
                    d = int((got.tokens != ref.tokens).sum())
                    msg = ""
                    if lp:
                        for name in ("logprobs", "processed_logprobs"):
                            a, b = getattr(got, name, None), getattr(ref, name, None)
                            if a is not None and b is not None:
                                err = float((a - b).abs().max())
                                if not err <= 1e-3:
                                    msg += f" {name} max err {err:.2e}"
                    if d or msg:
                        bad += 1
                        print(f"FAIL {dtype} B={B} T={T} min_p={mp} lp={lp} flags={fl}: "
                              f"{d} tokens differ{msg}")
print(f"split_minp_check: {n} calls, {bad} failures")
