"""A/B of the CUDA verify pos kernel's position-major order with skips (on by default where the
launcher allows it) against the same kernel without skips (tuning hook TS_VERIFY_NOSKIP), on the
bench's problems: whole calls, CUDA-graph replay, cold L2 (the bench's timing helper).

    python bench/lab/tools/verify_ab_skip.py [--rounds R] [--cs K | --cs-list 0,1,2] [--same-draft]
                                   bs,n,V,dtype ...
    python bench/lab/tools/verify_ab_skip.py --plot CSV PNG     # render a CSV (CPU)

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
import re

os.environ["TOKENSPEED_VERIFY_TUNING"] = "1"

import torch  # noqa: E402

from tokenspeed_kernel.bench.timing import measure  # noqa: E402
from tokenspeed_kernel.bench.verify import Problem, ours_call  # noqa: E402

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def summarize(csv_path):
    """Rows of the launcher's own cluster size (cs 0) of an A/B CSV (this tool's columns, with
    or without the committed file's leading git / kernels / drafts columns): per (drafts,
    shape), the mean skip / noskip ratio over the rounds of the last commit that measured it,
    and the share of positions a lazy walk needs."""
    import csv
    with open(csv_path) as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    last = {}
    for r in csv.DictReader(lines):
        if int(r["cs"]) != 0:
            continue
        key = (r.get("drafts", "bench"), int(r["bs"]), int(r["n"]), int(r["V"]), r["dtype"])
        git = r.get("git", "")
        if key not in last or last[key][0] != git:
            last[key] = (git, [])
        last[key][1].append((float(r["skip/noskip"]), float(r["needed_positions_share"])))
    out = []
    for (drafts, bs, n, V, dt), (git, xs) in sorted(last.items()):
        out.append({"drafts": drafts, "shape": f"bs {bs} n {n} V {V} {dt}", "git": git,
                    "ratio": sum(x[0] for x in xs) / len(xs), "needed": xs[0][1]})
    return out


def plot(csv_path, png_path):
    """Horizontal bars: time with skips / without, per shape (the launcher's pick), the bench's
    drafts and every draft accepted side by side; the needed share of positions as a marker."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = summarize(csv_path)
    with open(csv_path) as fh:
        title = re.split(r" \(|;|,", fh.readline().lstrip("# "))[0].strip()
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.6))
    labels = [f"{r['shape']} ({'bench drafts' if r['drafts'] == 'bench' else 'all accepted'})"
              for r in rows]
    y = list(range(len(rows)))
    ax.barh(y, [r["ratio"] for r in rows],
            color=["tab:blue" if r["drafts"] == "bench" else "tab:gray" for r in rows])
    ax.plot([r["needed"] for r in rows], y, "k|", markersize=12, label="positions needed (share)")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time with skips / without (graph replay, cold L2)")
    ax.set_title(f"verify pos kernel: position-major skips\n{title}", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)
    plt.close(fig)
    return rows


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
    ap.add_argument("--plot", nargs=2, metavar=("CSV", "PNG"),
                    help="render an A/B CSV (no GPU needed) and exit")
    ap.add_argument("shapes", nargs="*")
    a = ap.parse_args()
    if a.plot:
        for r in plot(*a.plot):
            print(f"{r['drafts']:5s} {r['shape']:32s} {r['ratio']:.3f} needed {r['needed']:.3f}")
        return
    if not a.shapes:
        ap.error("give shapes bs,n,V,dtype (or --plot CSV PNG)")
    sizes = [int(x) for x in a.cs_list.split(",")] if a.cs_list else [a.cs]
    call = ours_call("cuda")
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
