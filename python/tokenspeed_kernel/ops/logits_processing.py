"""Token counts: the per-request state of the repetition / frequency / presence penalties.

An engine keeps one ``TokenCounts`` for its request slots and updates it in place: at admission
(``admit_requests``: the slot is cleared and the prompt's tokens are marked seen) and after every
step (``add_output_tokens``: the sampled or accepted tokens are counted). The layout and the
exact semantics are ``reference/logits_processing.py``'s (the spec of the penalties and masks).

The sampler reads this state: ``ops.sample(..., processing=LogitsInputs(counts=counts,
count_slots=..., repetition_penalty=..., ...))`` applies the penalties (with logit bias and
the grammar / banned / min_tokens masks) inside its reads of the logits (every backend:
``ops/sampling.py``). After each step, count the step's tokens with ``add_output_tokens``.

Backends: ``"triton"`` (the device path: fixed-shape in-place kernels, no host sync with
``validate=False``, CUDA-graph safe) and ``"reference"`` (plain PyTorch; boolean indexing, so
not graph-safe). ``"auto"``: Triton for CUDA tensors, the reference for CPU tensors. There is no
CUDA-extension kernel: these are scatter updates of a few tokens per request.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _common as C
from ..reference import logits_processing as _ref
from ..reference.logits_processing import TokenCounts  # noqa: F401  (public type)

BACKENDS = ("auto", "triton", "reference")


def new_token_counts(max_requests: int, vocab_size: int, device=None) -> TokenCounts:
    """Zeroed counts for ``max_requests`` slots: ``seen [max_requests, ceil(V / 32)] int32``
    (a bit per token, prompt or output) and ``output [max_requests, V] int32``."""
    n = C.check_int(max_requests, "max_requests", lo=0)
    V = C.check_int(vocab_size, "vocab_size", lo=1, hi=1 << 24)
    return _ref.new_token_counts(n, V, device=device)


def _backend(backend: str, device: torch.device) -> str:
    C.check(backend in BACKENDS, "backend", f"must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if backend == "triton":
        C.check_triton_device(device)
    return backend


def _check_counts(counts) -> tuple:
    C.check_type(isinstance(counts, tuple) and len(counts) == 2
                 and all(isinstance(t, torch.Tensor) for t in counts), "counts",
                 f"must be a TokenCounts (from new_token_counts), got {type(counts).__name__}")
    seen, output = counts
    C.check(output.dim() == 2 and output.dtype == torch.int32 and output.is_contiguous(),
            "counts", f"output must be a contiguous [n, V] int32 tensor, got "
            f"{tuple(output.shape)} {output.dtype}")
    n, V = output.shape
    W = _ref.mask_words(V)
    C.check(seen.shape == (n, W) and seen.dtype == torch.int32 and seen.is_contiguous(),
            "counts", f"seen must be a contiguous [{n}, {W}] int32 tensor (V = {V}), got "
            f"{tuple(seen.shape)} {seen.dtype}")
    C.check(seen.device == output.device, "counts", "seen and output must be on one device")
    C.check_not_meta(output, "counts")
    return n, V, output.device


def _int_tensor(t, name: str, dim: int, device) -> torch.Tensor:
    C.check_type(isinstance(t, torch.Tensor), name,
                 f"must be an integer tensor, got {type(t).__name__}")
    C.check(not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool,
            name, f"must be an integer tensor, got {t.dtype}")
    C.check(t.dim() == dim, name, f"must be {dim}-D, got shape {tuple(t.shape)}")
    C.check(t.device == device, name, f"must be on {device} (the counts' device), got {t.device}")
    return t.to(torch.int64).contiguous()


def _raise_bad(checks) -> None:
    """One host sync for every value check: [(argument, message, device bool 'bad')]."""
    if checks:
        bad = torch.stack([c[2] for c in checks]).tolist()
        for (name, msg, _), b in zip(checks, bad):
            C.check(not b, name, msg)


def admit_requests(counts: TokenCounts, slots: torch.Tensor, prompt_ids: torch.Tensor,
                   prompt_indptr: torch.Tensor, *, backend: str = "auto",
                   validate: bool = True) -> None:
    """New requests in ``slots [m]``: clears each slot's seen bits and output counts, then marks
    its prompt's tokens seen. Prompts in CSR form: request ``slots[i]``'s tokens are
    ``prompt_ids[prompt_indptr[i]:prompt_indptr[i + 1]]`` (``prompt_indptr [m + 1]``,
    non-decreasing, from 0). In place.

    ``validate`` (one host sync; skipped under CUDA-graph capture / torch.compile): slots in
    ``[0, n)`` and distinct, prompt ids in ``[0, V)``, the CSR well formed. Without it nothing
    is read or written out of bounds: a slot outside ``[0, n)`` is skipped, prompt ``i``'s
    entries are ``[clamp(indptr[i], 0, nnz), clamp(indptr[i + 1], that, nnz))``, ids outside
    ``[0, V)`` are skipped."""
    n, V, dev = _check_counts(counts)
    slots = _int_tensor(slots, "slots", 1, dev)
    ids = _int_tensor(prompt_ids, "prompt_ids", 1, dev)
    indptr = _int_tensor(prompt_indptr, "prompt_indptr", 1, dev)
    m = slots.shape[0]
    C.check(indptr.shape[0] == m + 1, "prompt_indptr",
            f"must have len(slots) + 1 = {m + 1} entries, got {indptr.shape[0]}")
    if validate and not C.is_tracing():
        checks = []
        if m:
            checks += [("slots", f"must be in [0, {n})", ((slots < 0) | (slots >= n)).any()),
                       ("slots", "must be distinct", (slots.sort().values.diff() == 0).any())]
        checks += [("prompt_indptr", f"must start at 0, be non-decreasing and end at "
                    f"<= len(prompt_ids) = {ids.shape[0]}",
                    (indptr[0] != 0) | (indptr.diff() < 0).any() | (indptr[-1] > ids.shape[0]))]
        if ids.shape[0]:
            checks.append(("prompt_ids", f"must be in [0, {V})", ((ids < 0) | (ids >= V)).any()))
        _raise_bad(checks)
    be = _backend(backend, dev)
    if be == "reference":
        _ref.admit(counts, slots, _ref.Csr(indptr, ids[:int(indptr[-1])] if m else ids[:0]))
        return
    if C.compiling():   # the launches are opaque to Dynamo: a custom op
        torch.ops.tokenspeed_kernel.triton_admit_requests(counts.seen, counts.output, slots, ids,
                                                          indptr)
        return
    from ..triton import token_counts as tri
    tri.admit(counts.seen, counts.output, slots, ids, indptr)


def add_output_tokens(counts: TokenCounts, tokens: torch.Tensor, *,
                      valid: Optional[torch.Tensor] = None, slots: Optional[torch.Tensor] = None,
                      backend: str = "auto", validate: bool = True) -> None:
    """Counts the tokens each request emitted this step: ``tokens [b]`` (one per request, e.g.
    ``ops.sample``'s) or ``[b, m]`` (e.g. ``ops.verify``'s tokens, ``-1`` after the emitted
    ones). Row ``i`` belongs to slot ``slots[i]`` (default ``i``): ``output[slot, t] += 1`` and
    ``t`` is marked seen. Negative tokens (padding) and rows with ``valid[i] == False`` are
    skipped. In place.

    ``validate`` (one host sync; skipped under CUDA-graph capture / torch.compile): slots in
    ``[0, n)``, tokens ``< V``. Without it, tokens ``>= V`` and rows whose slot is outside
    ``[0, n)`` are skipped, never written."""
    n, V, dev = _check_counts(counts)
    tok = _int_tensor(tokens, "tokens", tokens.dim() if isinstance(tokens, torch.Tensor) and
                      tokens.dim() in (1, 2) else 2, dev)
    if tok.dim() == 1:
        tok = tok[:, None]
    b = tok.shape[0]
    if slots is not None:
        slots = _int_tensor(slots, "slots", 1, dev)
        C.check(slots.shape[0] == b, "slots", f"must have one entry per row of tokens ({b}), "
                f"got {slots.shape[0]}")
    else:
        C.check(b <= n, "tokens", f"has {b} rows but counts hold {n} slots: pass slots")
    if valid is not None:
        C.check_type(isinstance(valid, torch.Tensor), "valid", "must be a bool tensor")
        C.check(valid.dtype == torch.bool and valid.shape == (b,) and valid.device == dev,
                "valid", f"must be a bool tensor [{b}] on {dev}, got {tuple(valid.shape)} "
                f"{valid.dtype} on {valid.device}")
        valid = valid.contiguous()
    if validate and not C.is_tracing() and b:
        checks = [("tokens", f"must be < V = {V} (negative = padding, skipped)",
                   (tok >= V).any())]
        if slots is not None:
            checks.append(("slots", f"must be in [0, {n})", ((slots < 0) | (slots >= n)).any()))
        _raise_bad(checks)
    be = _backend(backend, dev)
    if be == "reference":
        _ref.add_tokens(counts, tok, valid, slots)
        return
    if C.compiling():   # the launches are opaque to Dynamo: a custom op
        torch.ops.tokenspeed_kernel.triton_add_output_tokens(counts.seen, counts.output, tok,
                                                             valid, slots)
        return
    from ..triton import token_counts as tri
    tri.add_tokens(counts.seen, counts.output, tok, valid, slots)
