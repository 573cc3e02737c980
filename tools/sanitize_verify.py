"""Small ops.verify workload for compute-sanitizer (memcheck / racecheck) on the CUDA kernels:
fast rows, filtered (exact-path) rows, greedy rows, ngram, with and without logprobs (the two
kernel orders), the testing knobs that force the exact paths, clusters
(V >= 32768) and single CTAs, the pos kernel's position-major order with skips (cases 4, 5),
aligned and unaligned rows, bf16 and fp32; each result is
compared with the reference (token identity).

    compute-sanitizer --tool memcheck python tools/sanitize_verify.py [case ...] [--temp-only]
                                                                      [--filters-only]
(racecheck is slow: select cases, e.g. `1 2 --temp-only` for the cluster cases;
`--filters-only`: only the top-k / top-p parameter sets, i.e. the threshold kernels;
`--excl-test`: level 0 of the top-p rows cuts at m - 2 (knob levels_excl_test), so its
excluded-bins scan runs with a cut the boundary often falls below, and the level is redone)
"""
import contextlib
import importlib
import sys

import torch

from tokenspeed_kernel import ops, testing

ov = importlib.import_module("tokenspeed_kernel.ops.verify")


def problem(n_list, V, dtype, seed, unaligned=False):
    g = torch.Generator().manual_seed(seed)
    bs = len(n_list)
    cu = torch.zeros(bs + 1, dtype=torch.int64)
    cu[1:] = torch.tensor(n_list).cumsum(0)
    tot = int(cu[-1])
    W = V + 1 if unaligned else V
    tgt = (torch.randn(tot + bs, W, generator=g) * 3)[:, :V]
    drf = (torch.randn(tot, W, generator=g) * 3)[:, :V]
    ids = torch.randint(0, V, (tot,), generator=g)
    dev = "cuda"
    return dict(target_logits=tgt.to(dtype).to(dev), draft_token_ids=ids.to(dev),
                cu_num_draft=cu.to(dev), draft_logits=drf.to(dtype).to(dev),
                seed=torch.arange(bs, device=dev) + seed, offset=torch.zeros(bs, dtype=torch.int64,
                                                                             device=dev))


def run(prob, mode, backend, extra, lp=True):
    a = dict(prob)
    tl, ids, seed, off = (a.pop(k) for k in ("target_logits", "draft_token_ids", "seed", "offset"))
    if mode != "probabilistic":
        a.pop("draft_logits")
    a.update(extra)
    fn = ops.verify_with_logprobs if lp else ops.verify
    return fn(tl, ids, seed, off, mode=mode, backend=backend, **a)


def main() -> int:
    bad = 0
    cases = [([3, 0, 2], 4099, torch.float32, False), ([2, 5], 40000, torch.bfloat16, False),
             ([1, 3], 40000, torch.bfloat16, True), ([4], 1003, torch.float16, True),
             # 800 positions of one CTA each (more than one wave): the pos kernel's
             # position-major order with skips
             ([3] * 200, 1003, torch.float32, False),
             # 606 positions in clusters of 2 (1212 CTAs, three waves on an H100 / H200): the
             # same order in the cluster kernel (the skip decision shared through DSMEM)
             ([8, 7] * 35, 151936, torch.bfloat16, False)]
    pick = [int(a) for a in sys.argv[1:] if a.isdigit()]
    temp_only = "--temp-only" in sys.argv
    filters_only = "--filters-only" in sys.argv
    run_knobs = contextlib.ExitStack()   # knobs set for the rest of this process
    if "--excl-test" in sys.argv:
        run_knobs.enter_context(testing.knobs(levels_excl_test=True))
    for k, (n_list, V, dt, un) in enumerate(cases):
        if pick and k not in pick:
            continue
        bs = len(n_list)
        prob = problem(n_list, V, dt, 10 + k, un)
        temp = torch.full((bs,), 0.8, device="cuda")
        temp[0] = 0.0 if k % 2 else 0.8
        sets = ({"temperature": temp},
                {"temperature": temp, "min_p": torch.full((bs,), 0.05, device="cuda")},
                {"temperature": temp, "top_k": torch.full((bs,), 20, dtype=torch.int32,
                                                          device="cuda"),
                 "top_p": torch.full((bs,), 0.8, device="cuda")},
                {"temperature": temp, "top_p": torch.full((bs,), 0.6, device="cuda")})
        sets = sets[:1] if temp_only else sets[2:] if filters_only else sets
        for extra in sets:
            for mode in ("probabilistic", "ngram"):
                ref = run(prob, mode, "reference", extra)
                # logprobs: one-pass order; without: first pass + listed requests (the knobs
                # list every request at once / after the interval scan)
                for lp, knob in ((True, None), (True, "verify_exact_coins"), (False, None),
                                 (False, "verify_exact_coins"), (False, "verify_exact_residual")):
                    with testing.knobs(**({knob: True} if knob else {})):
                        out = run(prob, mode, "cuda", extra, lp)
                    same = torch.equal(out.tokens.cpu(), ref.tokens.cpu())
                    bad += not same
                    print(f"case {k} {sorted(extra)} {mode} logprobs={lp} {knob or ''}: "
                          f"{'ok' if same else 'MISMATCH'}")
    torch.cuda.synchronize()
    print("sanitize_verify:", "OK" if bad == 0 else f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
