"""Small ops.sample workload for compute-sanitizer (memcheck / racecheck) on the CUDA sampler:
every row mode (greedy, temperature, top-k, top-p, min-p, all filters) at batch sizes that take
the split launch (B = 2: temperature / greedy), clusters of 16 and of 2-4 CTAs (B = 2 / 24 with
filters), chunks in shared memory and streamed, the forced exact / generic paths, with logprobs;
fp32 and bf16, aligned and unaligned rows. Each result is compared with the reference (token
identity), so the run fails on a wrong token as well as on a sanitizer error.

    compute-sanitizer --tool memcheck --error-exitcode 3 python tools/sanitize_sampling.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python tools/sanitize_sampling.py --quick
(--quick: B = 2 only, fp32, no forced paths; racecheck is slow)
"""
import sys

import torch

from tokenspeed_kernel import ops, testing
from tokenspeed_kernel.ops import sampling as S
from tokenspeed_kernel.reference import sampling as ref

MODES = {"greedy": dict(T=0.0), "temperature": dict(), "top_k": dict(k=50),
         "top_p": dict(p=0.9), "min_p": dict(mp=0.1), "all": dict(k=200, p=0.8, mp=0.05)}


def run(quick: bool) -> int:
    dev = torch.device("cuda")
    n = 0
    flag_sets = [0] if quick else [0, S.F_NO_RESIDENT, S.F_FORCE_EXACT, S.F_FORCE_GENERIC,
                                   S.F_NO_SPLIT]
    for dtype in ([torch.float32] if quick else [torch.float32, torch.bfloat16]):
        for B in ((2,) if quick else (2, 24)):
            for unaligned in ((False,) if quick else (False, True)):
                g = torch.Generator().manual_seed(B * 7 + unaligned)
                V = 40000
                full = torch.randn(B, V + 1, generator=g) * 4
                z = (full[:, 1:] if unaligned else full[:, :V]).to(dtype).to(dev)
                seed = torch.arange(B, device=dev) + 11
                offset = torch.zeros(B, dtype=torch.int64, device=dev)
                for mode, m in MODES.items():
                    kw = {"temperature": torch.full((B,), m.get("T", 0.8), device=dev)}
                    if "k" in m:
                        kw["top_k"] = torch.full((B,), m["k"], dtype=torch.int32, device=dev)
                    if "p" in m:
                        kw["top_p"] = torch.full((B,), m["p"], device=dev)
                    if "mp" in m:
                        kw["min_p"] = torch.full((B,), m["mp"], device=dev)
                    want = ref.sample(z, seed, offset, kw.get("temperature"), kw.get("top_k"),
                                      kw.get("top_p"), kw.get("min_p"), 1)[0]
                    for fl in flag_sets:
                        with testing.knobs(sampler_flags=fl):
                            got = ops.sample_with_logprobs(z, seed, offset, backend="cuda", **kw)
                        torch.cuda.synchronize()
                        assert torch.equal(got.tokens, want), (dtype, B, unaligned, mode, fl)
                        n += 1
    print(f"sanitize_sampling: {n} calls, tokens = reference: OK")
    return 0


if __name__ == "__main__":
    sys.exit(run("--quick" in sys.argv[1:]))
