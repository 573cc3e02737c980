"""Token check of the s18 lab patches' bits (a GPU build with bench/lab/patches/s18_hist_wide,
s18_hist_skip, s18_cs_any, s18_hist_band and s18_hist_stash applied, in that order): every row
type of tests/test_sampling_cuda.py's `_hist_rows`, alone (B = 1), mixed (B = 8 / 24), at one
CTA per row (B = 200), and B = 16 of one type, fp32 / bf16, V = 32000 / 151936, with and
without logprobs; each flag combination below against the reference (tests' `_check`) and
against the default launch. Prints one line per failure and a count.

    PYTHONPATH=python:tests python bench/lab/tools/hist_lab_check.py
"""
import sys
import time
import torch
sys.path.insert(0, "tests")
import test_sampling_cuda as T  # noqa: E402
from tokenspeed_kernel.ops import sampling as S  # noqa: E402

D = S._DEFAULT_LAUNCH_FLAGS
SKIP, CSANY, BAND, STASH = 4194304, 8388608, 16777216, 33554432   # lab bits: not in ops
WIDE = S.F_HIST_WIDE   # (defined by s18_hist_wide)
combos = {
    "skip": (SKIP, D), "band": (BAND, D), "band_exact": (BAND | S.F_FORCE_EXACT, D),
    "skip_band": (SKIP | BAND, D), "csany": (0, D | CSANY), "csany_band": (BAND | SKIP, D | CSANY),
    "wide": (0, D | WIDE), "wide_skip": (SKIP, D | WIDE), "wide_stash": (STASH, D | WIDE),
    "wide_all": (SKIP | BAND | STASH, D | WIDE), "wide_all_exact": (SKIP | BAND | STASH | S.F_FORCE_EXACT, D | WIDE),
}
bad = 0
t0 = time.time()
for dtype in (torch.float32, torch.bfloat16):
    for V in (32000, 151936):
        g = T._gen(7 + V)
        calls = [[t] for t in range(8)] + [list(range(8)), [i % 8 for i in range(24)],
                                         [i % 8 for i in range(200)], [0] * 16, [1] * 16, [4] * 200]
        for types in calls:
            z, kw = T._hist_rows(len(types), V, g, types)
            z = z.to(dtype).to(T.DEVICE)
            for lp in (True, False):
                a = T._check(z, kw, logprobs=lp)
                for name, fl in combos.items():
                    try:
                        b = T._check(z, kw, fl, logprobs=lp)
                        if not torch.equal(b.tokens, a.tokens):
                            raise AssertionError("tokens differ from default")
                    except AssertionError as e:
                        bad += 1
                        print(f"FAIL {dtype} V={V} types={types[:8]}.. B={len(types)} lp={lp} {name}: {str(e)[:200]}")
print(f"lab_check: {bad} failures, {time.time() - t0:.0f} s")
