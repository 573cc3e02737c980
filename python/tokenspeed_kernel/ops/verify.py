"""Speculative-decoding verify from logits: strict and probabilistic, chain, ragged or padded.

See docs/VERIFY.md for the contract (streams, order, exactness argument, what is not done); the
executable spec is ``tokenspeed_kernel.reference.verify``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import _common as C
from . import sampling as _sampling

MODES = ("strict", "probabilistic", "ngram")
# flag bits shared with csrc/verify/verify_ops.cu
F_PADDED, F_NGRAM, F_LOGPROBS, F_EXACT_COINS, F_EXACT_RESIDUAL = 1, 2, 4, 8, 16
F_BISECT_THRESHOLDS = 32   # 128 / 256 / 512: the radix levels' testing flags (sampling.py)
# Testing only: the CUDA probabilistic kernels decide every accept coin (and every final token)
# from the exact mass sums instead of from the error-bounded approximate ones first (the tokens
# must not change).
_EXACT_COINS_FOR_TESTING = False
# Testing only: the CUDA first final pass scores with the approximate sums' intervals as usual,
# then sends every token it decided that way to the exact path (resolve kernel, second pass).
_EXACT_RESIDUAL_FOR_TESTING = False
# Testing only: the CUDA top-k / top-p thresholds come from the bisection kernel (one CTA per
# row, ~113 passes: the independent oracle) instead of the radix select.
_BISECT_THRESHOLDS_FOR_TESTING = False


class VerifyOutput(NamedTuple):
    tokens: torch.Tensor        # [bs, max_n + 1]: accepted drafts, then one target token, then -1
    num_accepted: torch.Tensor  # [bs]: accepted drafts (emitted tokens = num_accepted + 1)
    valid: torch.Tensor         # [bs] bool: False if a row the walk read was NaN / +inf / empty


class VerifyLogprobsOutput(NamedTuple):
    tokens: torch.Tensor
    num_accepted: torch.Tensor
    valid: torch.Tensor
    logprobs: torch.Tensor            # [bs, max_n + 1] f32: log_softmax(raw target logits)[tok]
    processed_logprobs: torch.Tensor  # [bs, max_n + 1] f32: log p_processed_target(tok)


class _Plan(NamedTuple):
    tgt: torch.Tensor                 # [R_t, V]
    drf: Optional[torch.Tensor]       # [R_d, V] or None
    ids: torch.Tensor                 # flat int64 draft ids (ragged: [total], padded: [bs*max_n])
    cu: torch.Tensor                  # int64 [bs + 1]
    padded: bool
    max_n: int
    bs: int
    params: C.SamplingParams           # per request (bs)
    mode: str
    backend: str
    proc: Optional[list] = None       # processing: ops.sampling.PROC_FIELDS' list, or None
    allowed_per_row: bool = False     # proc's allowed_mask has one row per target row


def _as_rows(t: torch.Tensor, name: str, rows: int, V: Optional[int]) -> torch.Tensor:
    """[rows, V] view of a 2-D or (padded) 3-D logits tensor."""
    if t.dim() == 3:
        try:
            t = t.view(t.shape[0] * t.shape[1], t.shape[2])
        except RuntimeError:
            raise ValueError(f"{name}: a 3-D tensor must be viewable as [rows, V] (uniform row "
                             f"stride); got strides {t.stride()}") from None
    C.check_logits(t, name)
    if t.shape[0] != rows:
        C.check(False, name, f"must have {rows} rows, got {t.shape[0]}")
    if V is not None:
        if t.shape[1] != V:
            C.check(False, name, f"vocab size {t.shape[1]} != target vocab size {V}")
    return t


def _prepare_processing(processing, bs: int, R_t: int, V: int, dev, validate: bool):
    """``processing`` -> (the normalized list of ``ops.sampling.PROC_FIELDS`` for the ``bs``
    requests or None, allowed_per_row): ``allowed_mask`` may also have one row per target row
    (``R_t`` rows), as a grammar gives one mask per draft prefix."""
    if processing is None:
        return None, False
    C.check_type(isinstance(processing, _sampling.LogitsInputs), "processing",
                 f"must be a LogitsInputs or None, got {type(processing).__name__}")
    m = processing.allowed_mask
    if isinstance(m, torch.Tensor) and m.dim() == 2 and m.shape[0] not in (bs, R_t):
        C.check(False, "processing.allowed_mask",
                f"must have {bs} rows (one mask per request) or {R_t} (one per target row), "
                f"got shape {list(m.shape)}")
    per_row = isinstance(m, torch.Tensor) and m.dim() == 2 and m.shape[0] == R_t != bs
    if per_row:   # checked as the mask of R_t requests, then put back
        ia = _sampling.PROC_FIELDS.index("allowed_mask")
        pr = _sampling.prepare_processing(
            _sampling.LogitsInputs(allowed_mask=m), R_t, V, dev, validate)
        proc = _sampling.prepare_processing(processing._replace(allowed_mask=None), bs, V, dev,
                                            validate)
        if not proc:
            proc = [None] * len(_sampling.PROC_FIELDS)
        proc[ia] = pr[ia]
        return proc, True
    proc = _sampling.prepare_processing(processing, bs, V, dev, validate)
    return (proc or None), False


def _prepare(target_logits, draft_token_ids, seed, offset, cu_num_draft, num_draft, draft_logits,
             mode, temperature, top_k, top_p, min_p, max_num_draft, backend, validate,
             processing=None) -> _Plan:
    if mode not in MODES:
        C.check(False, "mode", f"must be one of {MODES}, got {mode!r}")
    C.check(isinstance(target_logits, torch.Tensor), "target_logits", "must be a torch.Tensor")
    C.check_not_meta(target_logits, "target_logits")
    C.check(isinstance(draft_token_ids, torch.Tensor), "draft_token_ids",
            "must be a torch.Tensor")
    if draft_token_ids.dtype.is_floating_point or draft_token_ids.dtype == torch.bool:
        C.check(False, "draft_token_ids", f"must be an integer tensor, got {draft_token_ids.dtype}")
    dev = target_logits.device
    if draft_token_ids.device != dev:
        C.check(False, "draft_token_ids", f"must be on {dev}, got {draft_token_ids.device}")
    tracing = C.is_tracing()
    checks = validate and not tracing
    if draft_token_ids.dim() == 2:                       # padded
        C.check(cu_num_draft is None, "cu_num_draft",
                "must be None with padded [bs, max_n] draft_token_ids (use num_draft)")
        bs, max_n = draft_token_ids.shape
        if max_num_draft is not None:
            if type(max_num_draft) is not int:
                max_num_draft = C.check_int(max_num_draft, "max_num_draft", lo=0)
            if max_num_draft != max_n:
                C.check(False, "max_num_draft",
                        f"must equal draft_token_ids.shape[1] ({max_n}) in the padded form")
        ids = draft_token_ids.reshape(-1).to(torch.int64)
        if num_draft is None:
            nd = (draft_token_ids >= 0).sum(1)
            if checks and max_n:
                col = torch.arange(max_n, device=dev)
                bad = ((draft_token_ids >= 0) != (col[None, :] < nd[:, None])).any()
                C.check(not bool(bad), "draft_token_ids",
                        "padding (-1) must come after the drafts of each row")
        else:
            nd = C.as_param(num_draft, "num_draft", bs, torch.int64, dev, allow_none=False)
            if checks and bs:
                if not bool(((nd >= 0) & (nd <= max_n)).all()):
                    C.check(False, "num_draft", f"values must be in [0, {max_n}]")
        cu = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
        if bs:
            cu[1:] = torch.cumsum(nd.to(torch.int64), 0)
        padded = True
        tgt = _as_rows(target_logits, "target_logits", bs * (max_n + 1), None)
        n_draft_rows = bs * max_n
    else:
        if draft_token_ids.dim() != 1:
            C.check(False, "draft_token_ids", f"must be 1-D (ragged) or 2-D [bs, max_n] "
                    f"(padded), got {tuple(draft_token_ids.shape)}")
        C.check(num_draft is None, "num_draft", "only for padded [bs, max_n] draft_token_ids")
        C.check(isinstance(cu_num_draft, torch.Tensor), "cu_num_draft",
                "is required with 1-D (ragged) draft_token_ids")
        if not (cu_num_draft.dim() == 1 and cu_num_draft.shape[0] >= 1):
            C.check(False, "cu_num_draft",
                    f"must have shape [bs + 1], got {tuple(cu_num_draft.shape)}")
        if cu_num_draft.device != dev:
            C.check(False, "cu_num_draft", f"must be on {dev}, got {cu_num_draft.device}")
        if cu_num_draft.dtype.is_floating_point or cu_num_draft.dtype == torch.bool:
            C.check(False, "cu_num_draft", f"must be an integer tensor, got {cu_num_draft.dtype}")
        cu = cu_num_draft.to(torch.int64)
        bs = cu.shape[0] - 1
        total = draft_token_ids.shape[0]
        ids = draft_token_ids.to(torch.int64)
        padded = False
        if target_logits.dim() != 2:
            C.check(False, "target_logits", f"must be 2-D [sum(n_i + 1), V] with ragged "
                    f"drafts, got {tuple(target_logits.shape)}")
        if target_logits.shape[0] != total + bs:
            C.check(False, "target_logits", f"must have sum(n_i + 1) = {total + bs} rows "
                    f"(len(draft_token_ids) + bs), got {target_logits.shape[0]}")
        tgt = _as_rows(target_logits, "target_logits", total + bs, None)
        n_draft_rows = total
        if checks:
            vals = torch.stack([cu[0] != 0, (cu[1:] < cu[:-1]).any() if bs else cu[0] != 0,
                                cu[-1] != total,
                                (cu[1:] - cu[:-1]).max() if bs else cu[0] * 0]).tolist()
            C.check(not vals[0], "cu_num_draft", "must start at 0")
            C.check(not vals[1], "cu_num_draft", "must be non-decreasing (monotone offsets)")
            if vals[2]:
                C.check(False, "cu_num_draft",
                        f"last value must equal len(draft_token_ids) = {total}")
            if max_num_draft is None:
                max_num_draft = int(vals[3])
        if max_num_draft is None:
            C.check(False, "max_num_draft", (
                "is required with ragged drafts under CUDA-graph capture / torch.compile (the "
                "default, max(n_i), needs a host sync)") if tracing else (
                "is required with ragged drafts when validate=False (the default, max(n_i), is "
                "read in the validation's host sync): pass max_num_draft, or validate=True"))
        if not (type(max_num_draft) is int and max_num_draft >= 0):    # bools refused
            max_num_draft = C.check_int(max_num_draft, "max_num_draft", lo=0)
        max_n = max_num_draft
        if checks and bs:
            C.check(bool((cu[1:] - cu[:-1]).max() <= max_n), "max_num_draft",
                    "is smaller than the largest number of drafts")
    V = tgt.shape[1]
    if mode == "probabilistic":
        C.check(draft_logits is not None, "draft_logits",
                "is required in mode='probabilistic' (use mode='ngram' for drafts without a "
                "distribution)")
        drf = _as_rows(draft_logits, "draft_logits", n_draft_rows, V)
        if drf.device != dev:
            C.check(False, "draft_logits", f"must be on {dev}, got {drf.device}")
        if drf.dtype != tgt.dtype:
            C.check(False, "draft_logits",
                    f"dtype {drf.dtype} must match target_logits dtype {tgt.dtype}")
    else:
        if draft_logits is not None:
            C.check(False, "draft_logits", f"must be None in mode={mode!r}")
        drf = None
    if checks and ids.numel():
        if padded:
            col = torch.arange(max_n, device=dev)
            live = (col[None, :] < (cu[1:] - cu[:-1])[:, None]).reshape(-1)
            bad = (live & ((ids < 0) | (ids >= V))).any()
        else:
            bad = ((ids < 0) | (ids >= V)).any()
        if bool(bad):
            C.check(False, "draft_token_ids", f"ids must be in [0, {V})")
    params = C.sampling_params(bs, dev, seed, offset, temperature, top_k, top_p, min_p)
    if checks and bs:
        params.check_values()
    backend = C.pick_backend(backend, dev, "verify")
    proc, per_row = _prepare_processing(processing, bs, tgt.shape[0], V, dev, validate)
    return _Plan(tgt, drf, ids.contiguous(), cu.contiguous(), padded, int(max_n), bs, params,
                 mode, backend, proc, per_row)


def _to_ragged(plan: _Plan, rows: bool = False):
    """Padded -> ragged copies for the reference backend (and, with ``rows``, the kept target
    rows' indices: None when the layout is ragged already)."""
    if not plan.padded:
        return (plan.tgt, plan.drf, plan.ids) + ((None,) if rows else ())
    bs, W = plan.bs, plan.max_n + 1
    dev = plan.tgt.device
    n = plan.cu[1:] - plan.cu[:-1]
    col = torch.arange(W, device=dev)
    rows_t = (torch.arange(bs, device=dev)[:, None] * W + col[None, :])[col[None, :] <= n[:, None]]
    colD = col[:plan.max_n]
    keep_d = colD[None, :] < n[:, None]
    rows_d = (torch.arange(bs, device=dev)[:, None] * plan.max_n + colD[None, :])[keep_d]
    tgt = plan.tgt[rows_t]
    drf = plan.drf[rows_d] if plan.drf is not None else None
    return (tgt, drf, plan.ids[rows_d]) + ((rows_t,) if rows else ())


def _reference(plan: _Plan):
    """The reference on any layout. A padded request whose draft count is outside [0, max_n]
    (unvalidated ``num_draft``) is invalid, as in the kernels: token 0 at slot 0, num_accepted
    0, valid False, NaN logprob (its rows are not read)."""
    from ..reference import verify as ref
    over = None
    if plan.padded and plan.bs:
        n = plan.cu[1:] - plan.cu[:-1]
        over = (n > plan.max_n) | (n < 0)
        if bool(over.any()):         # (host sync: the reference backend only)
            cu = torch.zeros_like(plan.cu)
            cu[1:] = torch.cumsum(n.masked_fill(over, 0), 0)
            plan = plan._replace(cu=cu)
        else:
            over = None
    tgt, drf, ids, rows_t = _to_ragged(plan, rows=True)
    if plan.proc:   # the processed target rows (reference.logits_processing.apply_verify)
        from ..reference import logits_processing as lp_ref
        inputs = _sampling.processing_inputs(plan.proc)
        if plan.allowed_per_row and rows_t is not None:
            inputs = inputs._replace(allowed_mask=inputs.allowed_mask[rows_t])
        tgt = lp_ref.apply_verify(tgt, inputs, plan.cu, ids)
        if drf is not None:
            drf = drf.to(torch.float32)
    q = plan.params
    tok, acc, valid, lp, plp = ref.verify(tgt, ids, plan.cu, q.seed, q.offset, drf, q.temperature,
                                          q.top_k, q.top_p, q.min_p, plan.mode, plan.max_n)
    if over is not None:
        first = torch.zeros_like(tok[0], dtype=torch.bool)
        first[0] = True
        bad = over[:, None] & first[None, :]
        tok = torch.where(over[:, None], torch.where(bad, 0, -1), tok)
        acc = torch.where(over, 0, acc)
        valid = valid & ~over
        nan = torch.full((), float("nan"), device=lp.device)
        lp = torch.where(over[:, None], torch.where(bad, nan, 0.0), lp)
        plp = torch.where(over[:, None], torch.where(bad, nan, 0.0), plp)
    return tok, acc, valid, lp, plp


def _strict_rows(plan: _Plan):
    """(request, position) of every target row (device ops, no sync)."""
    dev = plan.tgt.device
    R = plan.tgt.shape[0]
    r = torch.arange(R, device=dev)
    if plan.padded:
        W = plan.max_n + 1
        return r // W, r % W
    t_start = plan.cu[:-1] + torch.arange(plan.bs, device=dev)
    req = torch.searchsorted(t_start, r, right=True) - 1
    return req, r - t_start[req]


def _raw_logprobs(raw_tgt: torch.Tensor, plan: _Plan, tok, acc, valid, lp,
                  lse: Optional[torch.Tensor] = None):
    """With processing the verify ran on the processed rows: ``logprobs`` of the emitted slots
    become log_softmax(raw target row)[token] (the sampler's convention: raw logprobs are over
    the unprocessed row; NaN where it holds a NaN / +inf); the other slots keep the run's values
    (0 after the last emitted token, NaN in an invalid request's last slot). ``lse``: each raw
    target row's log-sum-exp when the processing pass computed it (else ``torch.logsumexp``
    here, one more read of the rows)."""
    bs, W = plan.bs, plan.max_n + 1
    dev = raw_tgt.device
    if bs == 0 or raw_tgt.shape[0] == 0:
        return lp
    j = torch.arange(W, device=dev)
    if plan.padded:
        rows = torch.arange(bs, device=dev)[:, None] * W + j[None, :]
    else:
        rows = (plan.cu[:-1] + torch.arange(bs, device=dev))[:, None] + j[None, :]
    emitted = (j[None, :] <= acc.to(torch.int64)[:, None]) & valid[:, None]
    rows = torch.where(emitted, rows, 0).clamp(0, raw_tgt.shape[0] - 1)
    t = torch.where(emitted, tok.to(torch.int64), 0).clamp(0, raw_tgt.shape[1] - 1)
    if lse is None:
        lse = torch.logsumexp(raw_tgt.to(torch.float32), dim=1)
    raw = raw_tgt[rows.reshape(-1), t.reshape(-1)].to(torch.float32).view(bs, W) - lse[rows]
    return torch.where(emitted, raw, lp)


def _run(plan: _Plan, out_dtype, validate, want_logprobs):
    if plan.proc:
        raw_tgt = plan.tgt
        lse = None   # (the reference's raw log-sum-exp: torch.logsumexp in _raw_logprobs)
        if plan.backend != "reference":
            try:
                from ..triton import verify_processing as tvp
            except ImportError as e:   # (the CUDA backend's processing is a Triton pre-pass)
                raise RuntimeError(f"processing: verify's processing of the target rows runs "
                                   f"a Triton kernel, and triton is not importable ({e})") from e
            # with logprobs the same pass gives the raw rows' log-sum-exp (raw logprobs)
            if C.compiling():   # opaque to Dynamo: a custom op
                tgt, lse = torch.ops.tokenspeed_kernel.triton_verify_process_target(
                    plan.tgt, plan.proc, plan.allowed_per_row, plan.ids, plan.cu, plan.max_n,
                    plan.padded, want_logprobs)
            else:
                res = tvp.process_target(plan.tgt, plan.proc, plan.allowed_per_row, plan.ids,
                                         plan.cu, plan.max_n, plan.padded,
                                         raw_lse=want_logprobs)
                tgt, lse = res if want_logprobs else (res, None)
            # the kernels of both backends take one dtype for target and drafts (the Triton
            # kernels select one row pointer for either; mixed element types do not compile)
            drf = plan.drf.to(torch.float32) if plan.drf is not None else None
            plan = plan._replace(tgt=tgt, drf=drf)
        tok, acc, valid, lp, plp = _run_plain(plan, out_dtype, validate, want_logprobs)
        if want_logprobs:
            lp = _raw_logprobs(raw_tgt, plan, tok, acc, valid, lp, lse)
        return tok, acc, valid, lp, plp
    return _run_plain(plan, out_dtype, validate, want_logprobs)


def _run_plain(plan: _Plan, out_dtype, validate, want_logprobs):
    bs, W = plan.bs, plan.max_n + 1
    dev = plan.tgt.device
    if plan.backend == "reference":
        tok, acc, valid, lp, plp = _reference(plan)
        return tok.to(out_dtype), acc.to(out_dtype), valid, lp, plp
    tokens = torch.empty((bs, W), dtype=out_dtype, device=dev)
    acc = torch.empty(bs, dtype=out_dtype, device=dev)
    valid = torch.empty(bs, dtype=torch.bool, device=dev)
    lp = torch.empty((bs, W), dtype=torch.float32, device=dev) if want_logprobs else None
    plp = torch.empty((bs, W), dtype=torch.float32, device=dev) if want_logprobs else None
    flags = (F_PADDED if plan.padded else 0) | (F_LOGPROBS if want_logprobs else 0)
    if _EXACT_COINS_FOR_TESTING:
        flags |= F_EXACT_COINS
    if _EXACT_RESIDUAL_FOR_TESTING:
        flags |= F_EXACT_RESIDUAL
    if _BISECT_THRESHOLDS_FOR_TESTING:
        flags |= F_BISECT_THRESHOLDS
    flags |= _sampling.level_test_flags()
    q = plan.params
    if plan.mode == "strict":
        req, pos = _strict_rows(plan)
        kw = {k: None if t is None else t[req] for k, t in q.filters().items()}
        kw.update(backend=plan.backend, validate=validate)
        if want_logprobs:
            s = _sampling.sample_with_logprobs(plan.tgt, q.seed[req], q.offset[req] + pos, **kw)
            row_lp, row_plp = s.logprobs, s.processed_logprobs
        else:
            s = _sampling.sample(plan.tgt, q.seed[req], q.offset[req] + pos, **kw)
            row_lp = row_plp = None
        if plan.backend == "triton":
            if C.compiling():   # opaque to Dynamo: a custom op
                torch.ops.tokenspeed_kernel.triton_verify_strict_accept(
                    s.tokens, s.valid, row_lp, row_plp, plan.ids, plan.cu, plan.max_n,
                    plan.padded, tokens, acc, valid, lp, plp)
            else:
                from ..triton import verify as tri
                tri.strict_accept(s.tokens, s.valid, row_lp, row_plp, plan.ids, plan.cu,
                                  plan.max_n, plan.padded, tokens, acc, valid, lp, plp)
        else:
            torch.ops.tokenspeed_kernel.verify_strict_accept(
                s.tokens, s.valid, plan.ids, plan.cu, row_lp, row_plp, plan.max_n, flags, tokens,
                acc, valid, lp, plp)
        return tokens, acc, valid, lp, plp
    ngram = plan.mode == "ngram"
    if plan.backend == "triton":
        if C.compiling():   # opaque to Dynamo: a custom op
            torch.ops.tokenspeed_kernel.triton_verify_probabilistic(
                plan.tgt, plan.drf, plan.ids, plan.cu, q.seed, q.offset, q.temperature, q.min_p,
                q.top_k, q.top_p, plan.max_n, plan.padded, ngram, tokens, acc, valid, lp, plp)
        else:
            from ..triton import verify as tri
            tri.verify_probabilistic(plan.tgt, plan.drf, plan.ids, plan.cu, q.seed, q.offset,
                                     q.temperature, q.min_p, plan.max_n, plan.padded, ngram,
                                     tokens, acc, valid, lp, plp, top_k=q.top_k, top_p=q.top_p)
    else:
        torch.ops.tokenspeed_kernel.verify_probabilistic(
            plan.tgt, plan.drf, plan.ids, plan.cu, *q, plan.max_n,
            flags | (F_NGRAM if ngram else 0), tokens, acc, valid, lp, plp)
    return tokens, acc, valid, lp, plp


_DOC_ARGS = """
    Parameters
    ----------
    target_logits : Tensor, float32 / bfloat16 / float16, last dim contiguous, read natively.
        Ragged: [sum_i (n_i + 1), V], request i's rows are ``cu[i] + i + j`` (j = 0..n_i; row
        n_i is the bonus position). Padded: [bs, max_n + 1, V] or [bs * (max_n + 1), V].
    draft_token_ids : int tensor. Ragged: [sum_i n_i] with ``cu_num_draft``. Padded: [bs, max_n]
        with -1 padding after each row's drafts (or any padding with ``num_draft``).
    seed, offset : int64 [bs] (or Python ints). Position j of request i samples the target with
        Philox offset ``offset[i] + j``; advance ``offset`` yourself (e.g. by max_n + 1) per step.
    cu_num_draft : int [bs + 1], cumulative draft counts (ragged form; starts at 0, monotone).
    num_draft : int [bs] (padded form, optional): drafts per row; default counts ids >= 0.
    draft_logits : Tensor [sum_i n_i, V] (ragged) / [bs, max_n(, V)] (padded), same dtype as
        the target. Required in mode='probabilistic'; must be None otherwise.
    mode : 'strict' (accept while draft == target sample), 'probabilistic' (Leviathan / Chen
        rejection sampling against the draft distribution) or 'ngram' (probabilistic with q =
        one-hot at the draft token: drafts without a distribution).
    temperature, top_k, top_p, min_p : per-request sampling parameters (as ``ops.sample``),
        applied identically to target and draft rows. T = 0 is greedy (argmax).
    max_num_draft : int, the padded width of the outputs for ragged input (default: max n_i, one
        host sync; required under CUDA-graph capture / torch.compile and with validate=False).
        Unvalidated, a request with more drafts than this is invalid (token 0 in slot 0,
        num_accepted 0, valid False); nothing is written outside the outputs.
    out_dtype : torch.int64 or torch.int32 (tokens and num_accepted).
    backend : 'auto' | 'cuda' | 'triton' | 'reference'.
    validate : check values (one host sync; skipped under capture / compile).
    processing : ``LogitsInputs`` (as ``ops.sample``: penalties, logit bias, allowed mask, banned
        ids, min_tokens; per request) applied to the *target* rows before temperature and the
        filters. Position j of request i is processed as the next token after the drafts
        d_0 .. d_{j-1}: those count as output tokens for the penalties, and min_tokens compares
        ``num_output_tokens[i] + j`` (spec: ``reference.logits_processing.apply_verify``).
        ``allowed_mask`` is ``[bs, ceil(V / 32)]`` or one mask per target row ``[R_t, ...]``.
        Draft logits are used as given. Implementation: one extra pass writes the processed
        target rows (float32) that the verify then reads (the sampler applies processing inside
        its read; verify does not yet); the Triton kernel does it for the CUDA and Triton
        backends, which also convert bf16 / fp16 draft logits to float32 (the kernels take one
        dtype for target and drafts). Raw ``logprobs`` stay over the unprocessed rows.
"""


def verify(target_logits: torch.Tensor, draft_token_ids: torch.Tensor, seed, offset, *,
           cu_num_draft: Optional[torch.Tensor] = None, num_draft=None,
           draft_logits: Optional[torch.Tensor] = None, mode: str = "probabilistic",
           temperature=None, top_k=None, top_p=None, min_p=None,
           max_num_draft: Optional[int] = None, out_dtype: torch.dtype = torch.int64,
           backend: str = "auto", validate: bool = True,
           processing: Optional[_sampling.LogitsInputs] = None) -> VerifyOutput:
    """Verify chain drafts against the target model; emit accepted drafts + one target token.

    Every emitted token is distributed exactly as the processed target distribution at its
    position (probabilistic / ngram), or is the sampler's target token (strict), whatever the
    draft. Same seeds give the same tokens on every backend, batch layout, ragged/padded form and
    eager/graph replay.
    {args}
    Returns
    -------
    VerifyOutput(tokens [bs, max_n + 1] (-1 after the last emitted token), num_accepted [bs],
    valid [bs] bool). Request i emits ``tokens[i, :num_accepted[i] + 1]``.

    Randomness: Philox4x32-10 keyed by seed; target samples use (offset + j, stream 0, token id),
    accept coins (offset, stream 1, token slot j), residual noise (offset + j, stream 2, token
    id). Stateless: CUDA-graph safe with device seed / offset. Mutates nothing.

    Example
    -------
    >>> out = verify(target_logits, draft_ids, seed=torch.tensor([1, 2]), offset=torch.tensor([0, 0]),
    ...              cu_num_draft=torch.tensor([0, 3, 5]), draft_logits=draft_logits,
    ...              temperature=torch.tensor([0.7, 1.0]))
    """
    plan = _prepare(target_logits, draft_token_ids, seed, offset, cu_num_draft, num_draft,
                    draft_logits, mode, temperature, top_k, top_p, min_p, max_num_draft, backend,
                    validate, processing)
    if out_dtype not in (torch.int64, torch.int32):
        C.check(False, "out_dtype", f"must be torch.int64 or torch.int32, got {out_dtype}")
    tok, acc, valid, _, _ = _run(plan, out_dtype, validate, False)
    return VerifyOutput(tok, acc, valid)


def verify_with_logprobs(target_logits: torch.Tensor, draft_token_ids: torch.Tensor, seed, offset,
                         *, cu_num_draft: Optional[torch.Tensor] = None, num_draft=None,
                         draft_logits: Optional[torch.Tensor] = None,
                         mode: str = "probabilistic", temperature=None, top_k=None, top_p=None,
                         min_p=None, max_num_draft: Optional[int] = None,
                         out_dtype: torch.dtype = torch.int64, backend: str = "auto",
                         validate: bool = True,
                         processing: Optional[_sampling.LogitsInputs] = None
                         ) -> VerifyLogprobsOutput:
    """``verify`` plus the logprobs of every emitted token (same tokens for the same seeds).

    logprobs[i, j] = log_softmax(raw target logits of position j)[tokens[i, j]];
    processed_logprobs[i, j] = log of the processed target probability of that token at that
    position (what ``sample_with_logprobs`` reports; 0 for greedy requests). Slots after the last
    emitted token hold 0; an invalid request's last slot holds NaN. Values are float32 and not
    bit-identical across backends (normalizers are float sums).
    """
    plan = _prepare(target_logits, draft_token_ids, seed, offset, cu_num_draft, num_draft,
                    draft_logits, mode, temperature, top_k, top_p, min_p, max_num_draft, backend,
                    validate, processing)
    if out_dtype not in (torch.int64, torch.int32):
        C.check(False, "out_dtype", f"must be torch.int64 or torch.int32, got {out_dtype}")
    tok, acc, valid, lp, plp = _run(plan, out_dtype, validate, True)
    return VerifyLogprobsOutput(tok, acc, valid, lp, plp)


verify.__doc__ = verify.__doc__.replace("{args}", _DOC_ARGS)


def _register_library() -> None:
    """Fake kernels (out-variants: nothing to allocate) and CPU kernels (the reference)."""
    import torch.library as L

    @L.register_fake("tokenspeed_kernel::verify_probabilistic")
    def _fake_prob(target_logits, draft_logits, draft_token_ids, cu_num_draft, seed, offset,
                   temperature, top_k, top_p, min_p, max_num_draft, flags, tokens, num_accepted,
                   valid, logprobs, processed_logprobs):
        return None

    @L.register_fake("tokenspeed_kernel::verify_strict_accept")
    def _fake_strict(target_tokens, target_valid, draft_token_ids, cu_num_draft, target_logprobs,
                     target_processed_logprobs, max_num_draft, flags, tokens, num_accepted, valid,
                     logprobs, processed_logprobs):
        return None

    @L.impl("tokenspeed_kernel::verify_probabilistic", "CPU")
    def _cpu_prob(target_logits, draft_logits, draft_token_ids, cu_num_draft, seed, offset,
                  temperature, top_k, top_p, min_p, max_num_draft, flags, tokens, num_accepted,
                  valid, logprobs, processed_logprobs):
        plan = _Plan(target_logits, draft_logits, draft_token_ids, cu_num_draft,
                     bool(flags & F_PADDED), int(max_num_draft), cu_num_draft.shape[0] - 1,
                     C.SamplingParams(seed, offset, temperature, top_k, top_p, min_p),
                     "ngram" if flags & F_NGRAM else "probabilistic", "reference")
        tok, acc, ok, lp, plp = _reference(plan)
        C.copy_outputs((tokens, num_accepted, valid, logprobs, processed_logprobs),
                       (tok, acc, ok, lp, plp))

    @L.impl("tokenspeed_kernel::verify_strict_accept", "CPU")
    def _cpu_strict(target_tokens, target_valid, draft_token_ids, cu_num_draft, target_logprobs,
                    target_processed_logprobs, max_num_draft, flags, tokens, num_accepted, valid,
                    logprobs, processed_logprobs):
        from ..reference import verify as ref
        tok, acc, ok, lp, plp = ref.strict_accept(
            target_tokens, target_valid, draft_token_ids, cu_num_draft, target_logprobs,
            target_processed_logprobs, int(max_num_draft), bool(flags & F_PADDED))
        C.copy_outputs((tokens, num_accepted, valid, logprobs, processed_logprobs),
                       (tok, acc, ok, lp, plp))
