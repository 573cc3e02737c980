"""How often, and why, the CUDA verify kernel lists requests for its exact path, and what each
kernel costs per call (probabilistic, temperature only, the bench's inputs).

    python bench/lab/tools/verify_listed.py [--offsets K] bs,n,V,dtype ...

For each shape and each of K offsets (1000, 1016, ...: the bench uses 1000), one call with the
launcher's list statistics on (tuning hook: TOKENSPEED_VERIFY_TUNING + TS_VERIFY_LISTSTATS, a
host sync and a line on stderr, see verify_ops.cu), then, statistics off, 2 warm-up calls and
4 calls timed per kernel with torch.profiler (tools/verify_sweep.measure). Prints CSV: per
(shape, offset) the listed requests and why (kUnsure coin at the deciding position / bounds too wide / score intervals undecided), the
positions the resolve kernel summed, and the mean device time of each kernel."""
import argparse
import os
import re
import sys
import tempfile

os.environ["TOKENSPEED_VERIFY_TUNING"] = "1"

import torch  # noqa: E402

from tokenspeed_kernel.bench.verify import Problem, ours_call  # noqa: E402
from verify_sweep import measure  # noqa: E402  (tools/ is sys.path[0] when run as a script)

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PAT = re.compile(r"verify_list_stats listed=(\d+) unsure=(\d+) wide=(\d+) interval=(\d+) "
                 r"positions=(\d+)")


def stats_call(call, pb):
    """One call with the statistics on; the line the launcher writes to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 2)
        try:
            os.environ["TS_VERIFY_LISTSTATS"] = "1"
            call(pb, pb.tgt, pb.drf)
            torch.cuda.synchronize()
        finally:
            os.environ.pop("TS_VERIFY_LISTSTATS", None)
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    m = PAT.findall(text)
    if len(m) != 1:
        raise RuntimeError(f"expected one statistics line, got: {text!r}")
    return [int(x) for x in m[0]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--offsets", type=int, default=8)
    ap.add_argument("shapes", nargs="+")
    a = ap.parse_args()
    call = ours_call("cuda")
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"git {os.environ.get('TS_GIT_SHA', '?')}")
    print("bs,n,V,dtype,offset,listed,unsure,wide,interval,positions,pos_us,final1_us,"
          "resolve_us,final2_us,total_us", flush=True)
    for c in a.shapes:
        bs, n, V, dt = c.split(",")
        pb = Problem(int(bs), int(n), int(V), DT[dt], torch.device("cuda"))
        for k in range(a.offsets):
            off = 1000 + 16 * k
            pb.offset.fill_(off)
            s = stats_call(call, pb)
            t = (measure(call, pb, reps=4)[0] + [0.0] * 4)[:4]
            print(f"{bs},{n},{V},{dt},{off}," + ",".join(str(x) for x in s) + "," +
                  ",".join(f"{x:.1f}" for x in t) + f",{sum(t):.1f}", flush=True)
        del pb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
