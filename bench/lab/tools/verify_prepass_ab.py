"""Verify's processing pre-pass (``triton/verify_processing.process_target``) alone, under launch
overrides: graph-replay µs (the bench's ``timing.measure``, warm L2) of the processed target rows of the verify
bench's problems (``bench.verify.Problem``, ``bench.sampling.make_processing`` inputs) against a
plain fp32 copy of the same rows (read + write: the pass's floor). The verify with processing
costs 1.9-3.7x the verify without it (fp32, n <= 5; up to 11x for bf16: H100 table at 90f9508);
at bs = 256 the pass runs one program of 4 warps per row (splits = 1). Values are checked equal
to the default configuration's. Then ``ops.verify_with_logprobs(..., processing=)`` (CUDA backend) with the raw rows'
log-sum-exp from the processing pass (the tree) against the previous way (the pass without it,
then ``torch.logsumexp`` over the raw rows: ``process_target`` patched), same tokens and
logprobs checked. Usage (GPU, repository root):

    python bench/lab/tools/verify_prepass_ab.py [n=1,3] [bs=16,64,256] [dtype=fp32,bf16]
"""
import sys

import torch

from tokenspeed_kernel.bench import timing
from tokenspeed_kernel.bench.sampling import make_processing
from tokenspeed_kernel.bench.verify import Problem
from tokenspeed_kernel.ops import verify as OV_fn  # noqa: F401  (registers the module)
from tokenspeed_kernel.triton import verify_processing as tvp

OV = sys.modules["tokenspeed_kernel.ops.verify"]
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}
V = 151936
VARIANTS = [dict(), dict(num_warps=8), dict(splits=2), dict(splits=4), dict(splits=4, num_warps=8),
            dict(splits=8), dict(block=2048), dict(block=2048, num_warps=8),
            dict(splits=4, block=2048, num_warps=8)]


def graph_us(fn):
    """Median graph-replay µs of fn (the bench's timing, warm L2)."""
    return timing.measure([fn], eager=False, host=False, cold_l2=False).graph_us


def main():
    ns = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,3").split(",")]
    bss = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16,64,256").split(",")]
    dts = (sys.argv[3] if len(sys.argv) > 3 else "fp32,bf16").split(",")
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name()} V={V}", flush=True)
    for dt in dts:
        for n in ns:
            for bs in bss:
                pb = Problem(bs, n, V, DT[dt], dev)
                inp = make_processing(bs, V, dev)[0]
                R = pb.tgt.shape[0]
                proc, per_row = OV._prepare_processing(inp, bs, R, V, dev, True)
                out = torch.empty(R, V, dtype=torch.float32, device=dev)
                floor = graph_us(lambda: out.copy_(pb.tgt))
                ref = tvp.process_target(pb.tgt, proc, per_row, pb.ids, pb.cu, n, False)
                cells = []
                for v in VARIANTS:
                    got = tvp.process_target(pb.tgt, proc, per_row, pb.ids, pb.cu, n, False, **v)
                    same = torch.equal(got, ref)
                    us = graph_us(lambda: tvp.process_target(pb.tgt, proc, per_row, pb.ids, pb.cu,
                                                             n, False, **v))
                    cells.append(f"{v or 'default'} {us:.1f}{'' if same else ' DIFF'}")
                print(f"== {dt} n={n} bs={bs} rows={R}: copy {floor:.1f} us | " + " | ".join(cells),
                      flush=True)
                pb = out = ref = got = None
                torch.cuda.empty_cache()


def logprobs_ab():
    from tokenspeed_kernel import ops
    ns = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,3").split(",")]
    bss = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16,64,256").split(",")]
    dts = (sys.argv[3] if len(sys.argv) > 3 else "fp32,bf16").split(",")
    dev = torch.device("cuda")
    orig = tvp.process_target

    def old_way(*a, raw_lse=False, **k):   # the pass without the log-sum-exp; torch's later
        out = orig(*a, **k)
        return (out, None) if raw_lse else out

    for dt in dts:
        for n in ns:
            for bs in bss:
                pb = Problem(bs, n, V, DT[dt], dev)
                inp = make_processing(bs, V, dev)[0]

                def call():
                    return ops.verify_with_logprobs(
                        pb.tgt, pb.ids, pb.seed, pb.offset, cu_num_draft=pb.cu,
                        draft_logits=pb.drf, temperature=pb.T, max_num_draft=n, backend="cuda",
                        validate=False, processing=inp)
                a = call()
                new_us = graph_us(call)
                tvp.process_target = old_way
                try:
                    b = call()
                    old_us = graph_us(call)
                finally:
                    tvp.process_target = orig
                same = all(torch.equal(x, y) for x, y in zip(a[:3], b[:3]))
                close = torch.allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5,
                                       equal_nan=True)
                print(f"== lp {dt} n={n} bs={bs}: with lse {new_us:.1f} us, torch.logsumexp "
                      f"{old_us:.1f} us (x{old_us / new_us:.2f}); tokens "
                      f"{'same' if same else 'DIFF'}, logprobs {'close' if close else 'DIFF'}",
                      flush=True)
                pb = a = b = None
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
    logprobs_ab()
