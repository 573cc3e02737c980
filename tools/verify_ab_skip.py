"""A/B of the CUDA verify pos kernel's position-major order with skips (on by default where the
launcher allows it) against the same kernel without skips (tuning hook TS_VERIFY_NOSKIP), on the
bench's problems: whole calls, CUDA-graph replay, cold L2 (the bench's timing helper).

    python tools/verify_ab_skip.py [--rounds R] [--cs K | --cs-list 0,1,2] [--same-draft]
                                   bs,n,V,dtype ...

Per shape, cluster size and round, each setting is captured into its own graph and timed in
turn (so the spread between rounds shows the noise); the tokens of the two settings must be
identical (the skips never change a token: they only leave out positions after a decided
rejection). --cs K / --cs-list force the pos kernel's cluster size (TS_VERIFY_CS; 0 = the
launcher's pick); the order (and so skipping) is used only where the grid exceeds one wave.
--same-draft: the draft logits are the target's (q = p), so every draft is accepted and nothing
can be skipped -- the order's worst case. Also printed: the positions a lazy walk needs (sum
over requests of min(accepted + 1, n + 1)) as a share of all positions: what skipping could
save at most. CSV on stdout."""
import argparse
import os

os.environ["TOKENSPEED_VERIFY_TUNING"] = "1"

import torch  # noqa: E402

from tokenspeed_kernel.bench.timing import measure  # noqa: E402
from tokenspeed_kernel.bench.verify import Problem, _ours  # noqa: E402

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cs", type=int, default=0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--same-draft", action="store_true",
                    help="draft logits = the target's (q = p: every draft is accepted, so "
                         "nothing can be skipped: the worst case of the order)")
    ap.add_argument("--cs-list", default=None,
                    help="comma list of cluster sizes to force in turn (0 = the pick)")
    ap.add_argument("shapes", nargs="+")
    a = ap.parse_args()
    sizes = [int(x) for x in a.cs_list.split(",")] if a.cs_list else [a.cs]
    call = _ours("cuda")
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"git {os.environ.get('TS_GIT_SHA', '?')} cs={sizes} (0 = the launcher's pick)"
          f"{' same-draft (q = p)' if a.same_draft else ''}")
    print("bs,n,V,dtype,cs,round,skip_us,noskip_us,skip/noskip,needed_positions_share,"
          "same_tokens", flush=True)
    for c in a.shapes:
        bs, n, V, dt = c.split(",")
        bs, n, V = int(bs), int(n), int(V)
        pb = Problem(bs, n, V, DT[dt], torch.device("cuda"))
        if a.same_draft:
            from tokenspeed_kernel.bench.verify import TEMP
            from tokenspeed_kernel.ops import sampling as S
            pb.drf = pb.tgt.view(bs, n + 1, V)[:, :n].reshape(bs * n, V).clone()
            rows = torch.arange(bs * n, device=pb.drf.device)
            pb.ids = S.sample(pb.drf, rows + 99991, torch.zeros_like(rows),
                              temperature=torch.full((bs * n,), TEMP, device=pb.drf.device),
                              validate=False).tokens
        for size, r in [(z, r) for z in sizes for r in range(1, a.rounds + 1)]:
            os.environ["TS_VERIFY_CS"] = str(size)
            toks = {}
            us = {}
            for setting in ("skip", "noskip"):
                if setting == "noskip":
                    os.environ["TS_VERIFY_NOSKIP"] = "1"
                else:
                    os.environ.pop("TS_VERIFY_NOSKIP", None)
                out = call(pb, pb.tgt, pb.drf)
                torch.cuda.synchronize()
                toks[setting] = (out.tokens.clone(), out.num_accepted.clone())
                t = measure([lambda: call(pb, pb.tgt, pb.drf)], graph=True, eager=False,
                            host=False, reps=a.reps)
                us[setting] = t.graph_us
            os.environ.pop("TS_VERIFY_NOSKIP", None)
            acc = toks["skip"][1].to(torch.int64)
            needed = float(torch.clamp(acc + 1, max=n + 1).sum()) / (bs * (n + 1))
            same = int(torch.equal(toks["skip"][0], toks["noskip"][0]) and
                       torch.equal(toks["skip"][1], toks["noskip"][1]))
            print(f"{bs},{n},{V},{dt},{size},{r},{us['skip']:.1f},{us['noskip']:.1f},"
                  f"{us['skip'] / us['noskip']:.3f},{needed:.3f},{same}", flush=True)
        del pb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
