"""Host (Python + dispatcher) time per eager call of the public ops' CUDA path, measured on
the CPU: no GPU needed. The CUDA op of each family is replaced, in this process only, by a
no-op CPU kernel and the backend choice is forced to "cuda", so what is timed is the wrapper
(argument checks, parameter tensors, output allocation, backend and flag logic) plus one
custom-op dispatch -- not the C++ adapter's checks nor the kernel launches of a real GPU.

    python bench/lab/tools/host_overhead.py          # needs the compiled extension (the op schemas)
    python bench/lab/tools/host_overhead.py --gpu    # on a GPU: the real CUDA ops (sample, verify), host
                                           # time of 200 eager calls issued without a sync

Prints µs per call (median of 5 runs of 2000 calls after a warm-up). Used for the eager-call
numbers in docs/PERF_LOG.md ("Host overhead").
"""
from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
warnings.filterwarnings("ignore")


def _us(f, n=2000, runs=5, warmup=200, sync=lambda: None):
    """Median over `runs` batches of the host time per call of `n` back-to-back calls of f;
    `sync` runs after the warm-up and after each batch (outside the timed loop)."""
    for _ in range(warmup):
        f()
    sync()
    res = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        res.append((time.perf_counter() - t0) / n * 1e6)
        sync()
    return statistics.median(res)


def _sample_verify_rows(ops, dev, timer):
    """(name, µs) of the sample and verify calls timed by both modes: sample over 64 rows of
    V = 151936 (per-row tensors, validate=False, as the bench calls it), verify at bs 16,
    n 3, probabilistic, ragged and padded."""
    n, V = 64, 151936
    logits = torch.randn(n, V, device=dev)
    seed, off = torch.arange(n, device=dev), torch.zeros(n, dtype=torch.int64, device=dev)
    temp = torch.full((n,), 0.8, device=dev)
    tk = torch.full((n,), 50, dtype=torch.int32, device=dev)
    tp = torch.full((n,), 0.9, device=dev)
    rows = [("sample, temperature", timer(lambda: ops.sample(
        logits, seed, off, temperature=temp, validate=False))),
            ("sample, temperature + top-k + top-p", timer(lambda: ops.sample(
                logits, seed, off, temperature=temp, top_k=tk, top_p=tp, validate=False,
                top_k_max=256)))]
    bs, nd = 16, 3
    tgt = torch.randn(bs * (nd + 1), V, device=dev)
    drf = torch.randn(bs * nd, V, device=dev)
    ids = torch.randint(0, V, (bs * nd,), device=dev)
    cu = torch.arange(0, bs * nd + 1, nd, device=dev)
    seed, off = torch.arange(bs, device=dev), torch.zeros(bs, dtype=torch.int64, device=dev)
    temp = torch.full((bs,), 0.8, device=dev)
    rows.append(("verify, ragged", timer(lambda: ops.verify(
        tgt, ids, seed, off, cu_num_draft=cu, draft_logits=drf, temperature=temp,
        mode="probabilistic", validate=False, max_num_draft=nd))))
    rows.append(("verify, padded", timer(lambda: ops.verify(
        tgt, ids.view(bs, nd), seed, off, draft_logits=drf, temperature=temp,
        mode="probabilistic", validate=False))))
    return rows


def _print(rows) -> None:
    w = max(len(r[0]) for r in rows)
    for name, t in rows:
        print(f"{name:<{w}}  {t:7.1f} us")


def _gpu() -> int:
    """Host time per eager call of the real CUDA ops (no stand-ins): 200 calls issued back to
    back without a sync (the GPU queue absorbs them), median of 5 such batches."""
    from tokenspeed_kernel import _library, ops
    if not (torch.cuda.is_available() and _library.extension_available()):
        print("--gpu needs a GPU and the compiled extension")
        return 2
    _print(_sample_verify_rows(ops, torch.device("cuda"), lambda f: _us(
        f, n=200, runs=5, warmup=20, sync=torch.cuda.synchronize)))
    return 0


def _override_impl(lib, name: str, fn, key: str) -> None:
    """lib.impl, replacing the package's own Python kernel for `key` (sample and verify register
    their reference as the CPU kernel). torch 2.14 (the CPU machine) takes allow_override=True;
    torch 2.11 (the GPU image) has no such argument and refuses a second Python registration, so
    there the record of the first one is dropped first (the dispatcher itself overrides, with a
    warning, in both)."""
    import inspect
    if "allow_override" in inspect.signature(lib.impl).parameters:
        lib.impl(name, fn, key, allow_override=True)
        return
    getattr(torch.library, "_impls", set()).discard(f"{lib.ns}/{name}/{key}")
    lib.impl(name, fn, key)


def main() -> int:
    if "--gpu" in sys.argv[1:]:
        return _gpu()
    from tokenspeed_kernel import _library, ops
    from tokenspeed_kernel.ops import _common as C
    from tokenspeed_kernel.ops import comm as oc
    if not _library.extension_available():
        print("needs the compiled extension (op schemas):", _library.extension_error())
        return 2
    lib = torch.library.Library("tokenspeed_kernel", "IMPL")
    for name in ("sample", "verify_probabilistic", "all_gather_hidden"):
        _override_impl(lib, name, lambda *a, **k: None, "CPU")
    C.pick_backend = lambda backend, dev, op: "cuda"
    # sample / verify with the stand-ins (same shapes as --gpu; the no-op kernels ignore data)
    rows = _sample_verify_rows(ops, torch.device("cpu"), _us)

    # ---- all_gather_hidden_out: a one-rank communicator with a process-local workspace ----
    import torch.distributed as dist

    import comm_helpers as H
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{H.free_port()}", rank=0,
                            world_size=1)
    c = oc.create_all_gather_comm(max_tokens=512, max_total_width=8192, dtype=torch.bfloat16,
                                  device="cpu")
    H.attach_cpu_workspace(c)
    c.extension = True
    x = torch.zeros(8, 7168, dtype=torch.bfloat16)
    out = torch.empty(8, 7168, dtype=torch.bfloat16)
    rows.append(("all_gather_hidden_out", _us(lambda: ops.all_gather_hidden_out(
        c, x, out, backend="cuda"))))
    args = oc._cuda_args(c, x, out, [0, 7168], 0, 8, [7168])
    rows.append(("(the custom-op dispatch alone)", _us(
        lambda: torch.ops.tokenspeed_kernel.all_gather_hidden(*args))))
    dist.destroy_process_group()

    _print(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
