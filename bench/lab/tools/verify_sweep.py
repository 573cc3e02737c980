"""Tuning sweep of the CUDA verify launcher (probabilistic, temperature only, bench inputs).

    python bench/lab/tools/verify_sweep.py pos   bs,n,V,dtype ...   # pos kernel: cluster size 0 (= the
                                                          #   launcher's pick), 1, 2, 4, 8, 16
    python bench/lab/tools/verify_sweep.py final bs,n,V,dtype ...   # final kernel: splits per request
    python bench/lab/tools/verify_sweep.py pick  bs,n,V,dtype ...   # the launcher's own picks only

Forces the sizes through the launcher's tuning hook (TOKENSPEED_VERIFY_TUNING, TS_VERIFY_CS,
TS_VERIFY_FS; see tuning_enabled() in csrc/verify/launch.cuh) and prints CSV, one line per
(shape, size): the device time of each kernel of one call (torch.profiler, mean of 6 calls after
2 warm-up calls, back to back), and whether the tokens equal those of the first size (they must:
the sizes never change a token)."""
import os
import sys

os.environ["TOKENSPEED_VERIFY_TUNING"] = "1"

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from tokenspeed_kernel.bench.verify import Problem, ours_call  # noqa: E402

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
POS = (0, 1, 2, 4, 8, 16)
FINAL = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 74)


def measure(call, pb, reps=6):
    for _ in range(2):
        out = call(pb, pb.tgt, pb.drf)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call(pb, pb.tgt, pb.drf)
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type.name == "CUDA" and "verify" in e.name]
    ev.sort(key=lambda e: e.time_range.start)
    per = len(ev) // reps
    t = [sum(ev[r * per + k].time_range.elapsed_us() for r in range(reps)) / reps
         for k in range(per)]
    return t, out


def main():
    mode, cfgs = sys.argv[1], sys.argv[2:]
    assert mode in ("pos", "final", "pick"), "mode: pos, final or pick"
    call = ours_call("cuda")
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"git {os.environ.get('TS_GIT_SHA', '?')}")
    print("bs,n,V,dtype,pos_cs,final_splits,pos_us,final1_us,resolve_us,final2_us,total_us,"
          "same_tokens", flush=True)
    for c in cfgs:
        bs, n, V, dt = c.split(",")
        pb = Problem(int(bs), int(n), int(V), DT[dt], torch.device("cuda"))
        ref = None
        for size in ((0,) if mode == "pick" else POS if mode == "pos" else FINAL):
            os.environ["TS_VERIFY_CS"] = str(size if mode == "pos" else 0)
            os.environ["TS_VERIFY_FS"] = str(size if mode == "final" else 0)
            t, out = measure(call, pb)
            ref = out.tokens.clone() if ref is None else ref
            t4 = (t + [0.0] * 4)[:4]
            print(f"{bs},{n},{V},{dt},{size if mode == 'pos' else 0},"
                  f"{size if mode == 'final' else 0}," + ",".join(f"{x:.1f}" for x in t4) +
                  f",{sum(t):.1f},{int(torch.equal(out.tokens, ref))}", flush=True)
        del pb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
