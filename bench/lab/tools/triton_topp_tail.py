"""Triton top-p tail on a GPU: for each batch size and input seed, the graph-replay time of one
``ops.sample(..., top_p=0.9, temperature=0.8, backend="triton")`` call (warm L2, 20 replays,
CUDA events), how many rows K3 decided outside the candidate prefix (extension / exact pass:
its per-row path codes), and whether the tokens equal ``backend="reference"``'s.

    python bench/lab/tools/triton_topp_tail.py LABEL [--batch 16,32,64,128] [--seeds 8]
        [--config '{"warps_x": 16}']   (a _TEST_CONFIG override for the timed calls)
        [--mode min_p]   (another bench mode, proc included: "rows past P" then counts rows
                          that K3 did not decide on its candidate path: fallback or extension)

A/B of a patch (no build: Triton only), from the repository root:

    mkdir -p /tmp/new && cp -a python /tmp/new/ && (cd /tmp/new && git apply P.patch)
    PYTHONPATH=python python bench/lab/tools/triton_topp_tail.py base
    PYTHONPATH=/tmp/new/python python bench/lab/tools/triton_topp_tail.py new

(``P.patch`` standing for the patch's absolute path). Result lines start with "==".
"""
import argparse
import json

import torch

from tokenspeed_kernel import ops
from tokenspeed_kernel.bench.sampling import make_logits, make_params
from tokenspeed_kernel.triton import sampling as TS

V = 151936


def call(x, P, backend="triton"):
    return ops.sample(x, P.seed, P.offset, temperature=P.T, top_k=P.k, top_p=P.p, min_p=P.mp,
                      backend=backend, validate=False, processing=P.proc)


def graph_us(x, P, n=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            call(x, P)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call(x, P)
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--batch", default="16,32,64,128")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--config", default=None)
    ap.add_argument("--mode", default="top_p")
    a = ap.parse_args()
    dev = torch.device("cuda")
    extra = json.loads(a.config) if a.config else None
    for B in (int(b) for b in a.batch.split(",")):
        P = make_params(a.mode, B, dev, V=V)
        times, slow, bad = [], 0, 0
        TS._TEST_CONFIG = extra   # the launch configuration with the override
        cfg = TS._config(B, V, dev, P.k is not None or P.p is not None, P.mp is not None)
        TS._TEST_CONFIG = None
        for seed in range(a.seeds):
            x = make_logits(B, V, torch.float32, dev, seed=seed)
            TS._TEST_CONFIG = dict(extra or {}, stats=True, S1=cfg["S1"], S2=cfg["S2"])
            r = call(x, P)
            st = TS._LAST_STATS.cpu()
            TS._TEST_CONFIG = extra
            slow += int((st >= 16).sum())   # path code + 16 fallback + 32 extension
            ref = call(x, P, "reference")
            bad += int((r.tokens != ref.tokens).sum())
            times.append(graph_us(x, P))
            TS._TEST_CONFIG = None
        ts = sorted(times)
        print(f"== {a.label} {a.mode} B={B} S1={cfg['S1']}: us per seed "
              f"{' '.join(f'{t:.0f}' for t in times)} | median {ts[len(ts) // 2]:.1f} "
              f"mean {sum(ts) / len(ts):.1f} max {ts[-1]:.1f} | rows past P {slow}/{B * a.seeds}"
              f" | tokens != reference {bad}", flush=True)


if __name__ == "__main__":
    main()
