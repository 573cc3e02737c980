"""Token dump / compare across builds of the CUDA verify kernels (device tool, not a test).

    python bench/lab/tools/verify_tokens.py dump OUT.pt [TRIALS]   # tokens of a fixed set of problems
    python bench/lab/tools/verify_tokens.py cmp A.pt B.pt          # exit 1 if any token differs

Used to check a change of the final kernel's pruning against a build without any pruning
(-DTS_FINAL_NOPRUNE: every element of the support scored exactly): pruning may only skip tokens
that cannot win, so the two must agree on every token. The problems cover the paths of the scan:
plain rows (bf16 / fp32 / fp16, flat and peaked logits), rows with top-k / top-p / min-p, greedy
requests, ngram drafts, and rows that are not 16-byte aligned (the scalar path). Each trial uses a
different offset (different noise and coins)."""
import os
import sys

import torch

# local smoke of the script itself: TS_TOK_SMALL=1 (small shapes), TS_TOK_BACKEND, TS_TOK_DEV
SMALL = os.environ.get("TS_TOK_SMALL") == "1"
BACKEND = os.environ.get("TS_TOK_BACKEND", "cuda")
DEV = os.environ.get("TS_TOK_DEV", "cuda")

from tokenspeed_kernel import ops


def problems(dev):
    g = torch.Generator(device=dev)
    g.manual_seed(1234)
    out = []

    def mk(name, bs, n, V, dtype, scale=3.0, temp=0.8, filt=False, greedy=False, ngram=False,
           unaligned=False):
        if SMALL:
            bs, V = 4, 1000
        Vx = V + 1 if unaligned else V
        tgt = torch.randn(bs * (n + 1), Vx, generator=g, device=dev) * scale
        drf = tgt.view(bs, n + 1, Vx)[:, :n].reshape(bs * n, Vx) + \
            torch.randn(bs * n, Vx, generator=g, device=dev)
        tgt, drf = tgt.to(dtype), drf.to(dtype)
        if unaligned:
            tgt, drf = tgt[:, 1:], drf[:, 1:]
        T = torch.full((bs,), temp, device=dev)
        if greedy:
            T[::3] = 0.0
        kw = dict(temperature=T)
        if filt:
            kw["top_k"] = torch.tensor([0, 50, 1000, 0] * (bs // 4), device=dev, dtype=torch.int32)
            kw["top_p"] = torch.tensor([0.9, 1.0, 0.95, 1.0] * (bs // 4), device=dev)
            kw["min_p"] = torch.tensor([0.0, 0.0, 0.0, 0.05] * (bs // 4), device=dev)
        # drafts: the draft rows' argmax half the time, a random id otherwise
        ids = drf.float().argmax(-1)
        rnd = torch.randint(0, V, ids.shape, generator=g, device=dev)
        ids = torch.where(torch.rand(ids.shape, generator=g, device=dev) < 0.5, ids, rnd)
        cu = torch.arange(bs + 1, device=dev, dtype=torch.int64) * n
        out.append((name, dict(target_logits=tgt, draft_token_ids=ids, cu_num_draft=cu,
                               draft_logits=None if ngram else drf,
                               mode="ngram" if ngram else "probabilistic",
                               max_num_draft=n, **kw), bs))

    mk("bf16_plain", 128, 3, 151936, torch.bfloat16)
    mk("fp32_plain", 128, 3, 151936, torch.float32)
    mk("fp16_plain", 64, 2, 151936, torch.float16)
    mk("bf16_peaked", 128, 3, 151936, torch.bfloat16, scale=9.0, temp=1.0)
    mk("fp32_filters", 128, 3, 151936, torch.float32, filt=True)
    mk("bf16_greedy", 96, 2, 151936, torch.bfloat16, greedy=True)
    mk("bf16_ngram", 128, 3, 151936, torch.bfloat16, ngram=True)
    mk("fp32_unaligned", 64, 2, 65536, torch.float32, unaligned=True)
    mk("bf16_small_batch", 4, 1, 262144, torch.bfloat16)
    return out


def dump(path, trials):
    dev = torch.device(DEV)
    res = {}
    for name, kw, bs in problems(dev):
        toks = []
        for t in range(trials):
            seed = torch.arange(bs, device=dev, dtype=torch.int64) * 7919 + 1 + t
            offset = torch.full((bs,), 1000 + 64 * t, device=dev, dtype=torch.int64)
            o = ops.verify(seed=seed, offset=offset, backend=BACKEND, **kw)
            toks.append(torch.cat([o.tokens, o.num_accepted[:, None].long(),
                                   o.valid[:, None].long()], 1).cpu())
        res[name] = torch.stack(toks)
        acc = res[name][..., -2].float().mean().item()
        print(f"{name}: {trials} trials x {bs} requests, mean accepted {acc:.2f}", flush=True)
    torch.save(res, path)


def cmp(a, b):
    A, B = torch.load(a), torch.load(b)
    bad = 0
    for k in A:
        d = (A[k] != B[k]).any(-1)
        n = int(d.sum())
        bad += n
        print(f"{k}: {A[k].shape[0] * A[k].shape[1]} requests, {n} differ")
    print("SAME" if bad == 0 else f"DIFFER in {bad} requests")
    return bad == 0


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)
    else:
        sys.exit(0 if cmp(sys.argv[2], sys.argv[3]) else 1)
