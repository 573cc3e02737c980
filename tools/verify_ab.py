"""A/B of the CUDA verify launcher's fused rows + first-pass kernel (device tool, not a test).

    python tools/verify_ab.py bs,n,V,dtype ...

For each shape: ours-cuda timed exactly as the bench times it (CUDA-graph replay, cold L2,
median µs per call; tokenspeed_kernel.bench.verify._time) with TS_VERIFY_FUSED=0 (separate pos
and final kernels) and =1 (the launcher's default), in the order 0, 1, 0, 1 (drift shows up as a
difference between the two runs of one setting); prints CSV with the tokens of both settings
compared (they must be equal)."""
import os
import sys
import types

os.environ["TOKENSPEED_VERIFY_TUNING"] = "1"

import torch  # noqa: E402

from tokenspeed_kernel.bench.verify import Problem, _ours, _time  # noqa: E402

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    call = _ours("cuda")
    args = types.SimpleNamespace(reps=None, warm_l2=False, eager_only=False)
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"git {os.environ.get('TS_GIT_SHA', '?')}; graph replay, cold L2, median us per call")
    print("bs,n,V,dtype,unfused_us,fused_us,unfused2_us,fused2_us,fused_over_unfused,same_tokens",
          flush=True)
    for c in sys.argv[1:]:
        bs, n, V, dt = c.split(",")
        pb = Problem(int(bs), int(n), int(V), DT[dt], dev)
        t, tok = {}, {}
        for k, f in enumerate((0, 1, 0, 1)):
            os.environ["TS_VERIFY_FUSED"] = str(f)
            tok[f] = call(pb, pb.tgt, pb.drf).tokens.clone()
            t[k] = _time(call, pb, args, dev).best_us
        same = int(torch.equal(tok[0], tok[1]))
        r = (t[1] + t[3]) / (t[0] + t[2])
        print(f"{bs},{n},{V},{dt},{t[0]:.1f},{t[1]:.1f},{t[2]:.1f},{t[3]:.1f},{r:.3f},{same}",
              flush=True)
        del pb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
