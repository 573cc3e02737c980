"""GPU: the Triton backend compiles once per parameter combination, never per call.

Issue 29's contract for the Triton fallback: no recompilation across batch sizes and parameter
values (only which parameters are given, logprobs on/off and the dtype are constexpr or part of
the signature), so a serving loop never pays a JIT compile after warm-up. Counted on Triton's
own per-device kernel caches of the sampler's and verify's kernels.
"""
from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, skip_unless_backend
from tokenspeed_kernel import ops

pytestmark = pytest.mark.gpu


def _cache_sizes(mod) -> dict:
    """Compiled kernels per @triton.jit function of ``mod`` (all devices)."""
    out = {}
    for name in dir(mod):
        fn = getattr(mod, name)
        caches = getattr(fn, "device_caches", None)
        if caches is None:
            continue
        n = 0
        for entry in caches.values():
            kernel_cache = entry[0] if isinstance(entry, tuple) else entry
            n += len(kernel_cache)
        out[name] = n
    return out


def test_triton_sampler_no_recompile_across_batch_and_values():
    skip_unless_backend("triton")
    if DEVICE.type != "cuda":
        pytest.skip("compilation is a GPU matter (the interpreter compiles nothing)")
    from tokenspeed_kernel.triton import sampling as tri
    V = 32000
    g = torch.Generator(device=DEVICE).manual_seed(0)

    def call(B, T, k, p, mp, lp=False):
        x = torch.randn(B, V, generator=g, device=DEVICE) * 4
        kw = dict(temperature=torch.full((B,), T, device=DEVICE),
                  top_k=torch.full((B,), k, dtype=torch.int32, device=DEVICE),
                  top_p=torch.full((B,), p, device=DEVICE),
                  min_p=torch.full((B,), mp, device=DEVICE))
        seed = torch.arange(B, device=DEVICE)
        off = torch.zeros(B, dtype=torch.int64, device=DEVICE)
        f = ops.sample_with_logprobs if lp else ops.sample
        f(x, seed, off, backend="triton", validate=False, **kw)

    call(4, 0.8, 50, 0.9, 0.1)             # warm-up: one compile per kernel
    call(4, 0.8, 50, 0.9, 0.1, lp=True)    # logprobs on: a second variant (constexpr)
    torch.cuda.synchronize()
    before = _cache_sizes(tri)
    assert sum(before.values()) > 0, "no compiled Triton kernels found (cache layout changed?)"
    for B in (1, 3, 16, 64, 200):
        for T, k, p, mp in ((0.8, 50, 0.9, 0.1), (0.0, 50, 0.9, 0.1), (1.3, 2000, 0.5, 0.0),
                            (0.5, 0, 1.0, 0.3), (2.0, 1, 0.99, 0.0)):
            call(B, T, k, p, mp)
            call(B, T, k, p, mp, lp=True)
    torch.cuda.synchronize()
    after = _cache_sizes(tri)
    assert after == before, f"Triton sampler recompiled: {before} -> {after}"


def test_triton_verify_no_recompile_across_batch_and_values():
    skip_unless_backend("triton")
    if DEVICE.type != "cuda":
        pytest.skip("compilation is a GPU matter (the interpreter compiles nothing)")
    from tokenspeed_kernel.triton import verify as triv
    V, n = 32000, 3
    g = torch.Generator(device=DEVICE).manual_seed(1)

    def call(B, T):
        tgt = torch.randn(B * (n + 1), V, generator=g, device=DEVICE) * 3
        drf = torch.randn(B, n, V, generator=g, device=DEVICE) * 3
        draft = torch.randint(0, V, (B, n), generator=g, device=DEVICE)
        kw = dict(temperature=torch.full((B,), T, device=DEVICE))
        ops.verify(tgt, draft, torch.arange(B, device=DEVICE),
                   torch.zeros(B, dtype=torch.int64, device=DEVICE), draft_logits=drf,
                   backend="triton", **kw)

    call(4, 0.8)
    torch.cuda.synchronize()
    before = _cache_sizes(triv)
    assert sum(before.values()) > 0, "no compiled Triton kernels found (cache layout changed?)"
    for B in (1, 5, 64):
        for T in (0.8, 1.7):
            call(B, T)
    torch.cuda.synchronize()
    after = _cache_sizes(triv)
    assert after == before, f"Triton verify recompiled: {before} -> {after}"
