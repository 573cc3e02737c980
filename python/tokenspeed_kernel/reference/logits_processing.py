"""Reference logits processing: plain PyTorch, the executable spec of what engines apply to the
logits before sampling (penalties, logit bias, grammar masks, banned tokens, ``min_tokens``).

**Status: applied by ``ops.sample`` / ``ops.sample_with_logprobs``** (``processing=LogitsInputs(...)``)
the reference backend runs ``apply`` below and then the reference sampler; the CUDA and Triton
samplers apply the same steps inside their reads of the logits (no processed copy of the logits
is materialized) and give the same float32 values as this file, bit for bit, so the sampled
token is the same on every backend. The token-count state and its updates
(below) are ops too (``ops/logits_processing.py``).

Per request ``q`` (rows map to requests as in sampling: ``q = row // tokens_per_request``; every
row of a request gets the request's inputs; its penalty state is row ``s = count_slots[q]`` of
the ``TokenCounts``, default ``s = q``). With ``z`` = the row's raw logits as float32, in this
order (each step is one IEEE float32 operation per element, never fused):

1. **logit bias** (sparse, CSR over requests): ``z[id] = fl32(z[id] + b)``.
2. **repetition penalty** ``r > 0`` (HF / vLLM convention, sign-aware) on every token *seen* by
   the request (prompt or output): ``z = fl32(z / r)`` if ``z > 0`` else ``fl32(z * r)``.
   ``r = 1`` is off.
3. **frequency / presence penalties** ``f``, ``p`` on the request's *output* tokens with count
   ``c > 0``: ``z = fl32(z - fl32(f * c))``, then ``z = fl32(z - p)``. ``f = p = 0`` is off.
4. **masks** (``-inf``): tokens whose bit is clear in the allowed-token bitmask (xgrammar
   layout: token ``t`` is allowed iff ``(mask[q, t >> 5] >> (t & 31)) & 1``; bits past V are
   ignored), banned tokens (CSR), and the request's stop tokens while its output holds fewer
   than ``min_tokens`` tokens.

Then the sampler runs unchanged on the processed row (temperature, top-k, top-p, min-p,
Gumbel-max; docs/DESIGN.md). A row whose masks leave no finite logit is invalid (the sampler's
NaN policy), never token 0 silently. Raw logprobs stay those of the unprocessed logits;
processed logprobs are those of the processed distribution.

**Token counts** (the penalties' state, kept by the caller per request slot, updated in place):
``TokenCounts.seen`` ``[n, ceil(V / 32)] int32`` (bit per token, prompt or output: the
repetition penalty's set and the kernels' cheap membership test) and ``TokenCounts.output``
``[n, V] int32`` (output-token counts). ``admit`` clears a slot for a new request and marks its
prompt (``add_prompt``); ``add_tokens`` counts the tokens sampled this step (rows not valid,
and negative / out-of-range tokens, are skipped). The ops ``ops.admit_requests`` /
``ops.add_output_tokens`` do the same in place on the device (Triton kernels, graph-safe).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class TokenCounts(NamedTuple):
    seen: torch.Tensor     # [n, ceil(V / 32)] int32: prompt or output tokens (bit t & 31 of word t >> 5)
    output: torch.Tensor   # [n, V] int32: output-token counts


class Csr(NamedTuple):
    """Per-request lists: request q owns entries indptr[q] .. indptr[q + 1] - 1."""
    indptr: torch.Tensor               # [n + 1] int64, non-decreasing, indptr[0] = 0
    ids: torch.Tensor                  # [nnz] int64 token ids, unique within a request
    values: Optional[torch.Tensor] = None   # [nnz] float32 (logit bias), else None


class LogitsInputs(NamedTuple):
    """What an engine applies to the logits before sampling; every field optional (None: off)."""
    logit_bias: Optional[Csr] = None                  # ids + float32 values
    repetition_penalty: Optional[torch.Tensor] = None  # [n] float32 > 0 (1: off)
    frequency_penalty: Optional[torch.Tensor] = None   # [n] float32 (0: off)
    presence_penalty: Optional[torch.Tensor] = None    # [n] float32 (0: off)
    counts: Optional[TokenCounts] = None              # needed by the three penalties
    allowed_mask: Optional[torch.Tensor] = None       # [n, ceil(V / 32)] int32
    banned: Optional[Csr] = None                      # ids
    min_tokens: Optional[torch.Tensor] = None         # [n] int64 (0: off)
    num_output_tokens: Optional[torch.Tensor] = None  # [n] int64, with min_tokens
    stop_ids: Optional[Csr] = None                    # ids, with min_tokens
    count_slots: Optional[torch.Tensor] = None        # [n] int64: request q's row of counts
                                                      # (None: row q)


CSR_FIELDS = ("logit_bias", "banned", "stop_ids")


def map_requests(inputs: LogitsInputs, per_request, per_csr) -> LogitsInputs:
    """A copy of ``inputs`` with every per-request tensor field ``t`` replaced by
    ``per_request(t)`` and every CSR field ``c`` by ``per_csr(c)`` (None stays None); ``counts``
    is kept as is (requests address it through ``count_slots``)."""
    out = {}
    for name in LogitsInputs._fields:
        v = getattr(inputs, name)
        if v is None or name == "counts":
            out[name] = v
        else:
            out[name] = per_csr(v) if name in CSR_FIELDS else per_request(v)
    return LogitsInputs(**out)


def mask_words(vocab: int) -> int:
    return (vocab + 31) // 32


def new_token_counts(n: int, vocab: int, device=None) -> TokenCounts:
    return TokenCounts(torch.zeros(n, mask_words(vocab), dtype=torch.int32, device=device),
                       torch.zeros(n, vocab, dtype=torch.int32, device=device))


def _set_bits(words: torch.Tensor, req: torch.Tensor, tok: torch.Tensor) -> None:
    """words[req, tok >> 5] |= 1 << (tok & 31), for every (req, tok) pair (duplicates fine)."""
    if tok.numel() == 0:
        return
    n, W = words.shape
    flat = words.view(-1)
    bit = torch.zeros(n * W, 32, dtype=torch.bool, device=words.device)
    bit[req * W + (tok >> 5), tok & 31] = True
    shifts = torch.arange(32, device=words.device, dtype=torch.int64)
    add = (bit.to(torch.int64) << shifts).sum(1)
    merged = flat.to(torch.int64) & 0xFFFFFFFF | add
    flat.copy_(torch.where(merged >= 2**31, merged - 2**32, merged).to(torch.int32))


def bit_is_set(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, W] int32 bitmask -> [n, vocab] bool (token t: bit t & 31 of word t >> 5)."""
    t = torch.arange(vocab, device=words.device)
    return ((words.to(torch.int64)[:, t >> 5] >> (t & 31)) & 1).bool()


def _csr_rows(csr: Csr, n: int, vocab: Optional[int] = None, values: bool = False):
    """(request of each entry, ids[, entry index]) of a CSR list.

    Unvalidated lists get the device kernels' rules (never an out-of-bounds read): request q
    owns entries ``[b0, b1)`` with ``b0 = clamp(indptr[q], 0, nnz)`` and ``b1 =
    clamp(indptr[q + 1], b0, nnz)``, and, with ``vocab``, ids outside ``[0, vocab)`` are
    skipped. A well-formed list gives its entries in order."""
    indptr = csr.indptr.to(torch.int64)
    ids = csr.ids.to(torch.int64)
    nnz = ids.shape[0]
    b0 = indptr[:n].clamp(0, nnz)
    b1 = torch.maximum(indptr[1:n + 1].clamp(max=nnz), b0)
    counts = b1 - b0
    req = torch.repeat_interleave(torch.arange(n, device=indptr.device), counts)
    first = torch.cumsum(counts, 0) - counts          # output position of each request's first
    entry = b0[req] + torch.arange(req.numel(), device=req.device) - first[req]
    tok = ids[entry]
    if vocab is not None:
        ok = (tok >= 0) & (tok < vocab)
        req, tok, entry = req[ok], tok[ok], entry[ok]
    return (req, tok, entry) if values else (req, tok)


def _last_per_key(rows: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
    """Indices of the last occurrence of each (row, id) pair, in order (a repeated id of an
    unvalidated bias list: its last entry counts, as in the device kernels)."""
    key = rows * V + ids
    order = torch.sort(key, stable=True).indices
    k = key[order]
    last = torch.ones_like(k, dtype=torch.bool)
    if k.numel() > 1:
        last[:-1] = k[1:] != k[:-1]
    return torch.sort(order[last]).values


def add_prompt(counts: TokenCounts, slots: torch.Tensor, prompts: Csr) -> None:
    """Marks the prompt tokens of requests admitted into ``slots`` (prompts: one CSR entry list
    per admitted request, in the order of ``slots``) as seen; output counts are untouched."""
    s = slots.to(torch.int64)
    req, ids = _csr_rows(prompts, s.numel(), counts.output.shape[1])
    ok = (s[req] >= 0) & (s[req] < counts.seen.shape[0])   # (unvalidated slots: skipped)
    _set_bits(counts.seen, s[req][ok], ids[ok])


def admit(counts: TokenCounts, slots: torch.Tensor, prompts: Csr) -> None:
    """A new request in each of ``slots``: clears the slot's seen bits and output counts, then
    ``add_prompt``."""
    s = slots.to(torch.int64)
    ok = (s >= 0) & (s < counts.seen.shape[0])   # (unvalidated slots outside [0, N): skipped)
    counts.seen[s[ok]] = 0
    counts.output[s[ok]] = 0
    add_prompt(counts, slots, prompts)


def add_tokens(counts: TokenCounts, tokens: torch.Tensor,
               valid: Optional[torch.Tensor] = None,
               slots: Optional[torch.Tensor] = None) -> None:
    """Counts this step's sampled token of every request (``tokens [n]``, or ``[n, m]`` for
    several tokens per request, e.g. accepted drafts padded with -1): ``output[q, t] += 1`` and
    ``t`` marked seen, where ``q = slots[i]`` for row ``i`` (default ``q = i``). Tokens outside
    ``[0, V)`` (negative: padding) and rows with ``valid == False`` are skipped."""
    t = tokens.to(torch.int64)
    if t.dim() == 1:
        t = t[:, None]
    keep = (t >= 0) & (t < counts.output.shape[1])
    if valid is not None:
        keep &= valid.to(torch.bool).view(-1, 1)
    rows = (torch.arange(t.shape[0], device=t.device) if slots is None
            else slots.to(torch.int64).to(t.device))
    keep &= ((rows >= 0) & (rows < counts.output.shape[0]))[:, None]   # (unvalidated slots)
    req = rows[:, None].expand_as(t)[keep]
    tok = t[keep]
    counts.output.index_put_((req, tok), torch.ones_like(tok, dtype=torch.int32), accumulate=True)
    _set_bits(counts.seen, req, tok)


def apply(logits: torch.Tensor, inputs: LogitsInputs, tokens_per_request: int = 1) -> torch.Tensor:
    """The processed logits (float32 ``[rows, V]``; the input is not modified)."""
    R, V = logits.shape
    z = logits.to(torch.float32).clone()
    n = R // tokens_per_request
    req_of_row = torch.arange(R, device=z.device) // tokens_per_request

    def per_row(t):   # [n, ...] -> [R, ...]
        return t.to(z.device)[req_of_row]

    def csr_rows(csr):   # the CSR entries repeated for every row of their request
        req, ids, entry = _csr_rows(csr, n, V, values=True)
        rows = req[:, None] * tokens_per_request + torch.arange(tokens_per_request,
                                                                device=req.device)
        return (rows.reshape(-1), ids.repeat_interleave(tokens_per_request),
                req.repeat_interleave(tokens_per_request),
                entry.repeat_interleave(tokens_per_request))

    if inputs.logit_bias is not None:
        rows, ids, _, entry = csr_rows(inputs.logit_bias)
        b = inputs.logit_bias.values.to(torch.float32).to(z.device)[entry]
        keep = _last_per_key(rows, ids, V)
        rows, ids, b = rows[keep], ids[keep], b[keep]
        z[rows, ids] = z[rows, ids] + b
    pen = (inputs.repetition_penalty, inputs.frequency_penalty, inputs.presence_penalty)
    if any(x is not None for x in pen):
        if inputs.counts is None:
            raise ValueError("counts: the penalties need the requests' TokenCounts")
        seen_w, out_c = inputs.counts.seen, inputs.counts.output
        if inputs.count_slots is not None:   # request q's state is row count_slots[q]
            slots = inputs.count_slots.to(torch.int64).to(seen_w.device)
            # (unvalidated: a slot outside [0, N) turns the request's penalties off)
            ok = (slots >= 0) & (slots < seen_w.shape[0])
            safe = torch.where(ok, slots, 0)
            if seen_w.shape[0] == 0:
                seen_w = seen_w.new_zeros((slots.numel(),) + tuple(seen_w.shape[1:]))
                out_c = out_c.new_zeros((slots.numel(),) + tuple(out_c.shape[1:]))
            else:
                seen_w = torch.where(ok[:, None], seen_w[safe], 0)
                out_c = torch.where(ok[:, None], out_c[safe], 0)
        if inputs.repetition_penalty is not None:
            r = per_row(inputs.repetition_penalty.to(torch.float32))[:, None]
            seen = per_row(bit_is_set(seen_w, V))
            z = torch.where(seen, torch.where(z > 0, z / r, z * r), z)
        c = per_row(out_c).to(torch.float32)
        hit = c > 0
        if inputs.frequency_penalty is not None:
            f = per_row(inputs.frequency_penalty.to(torch.float32))[:, None]
            z = torch.where(hit, z - f * c, z)
        if inputs.presence_penalty is not None:
            p = per_row(inputs.presence_penalty.to(torch.float32))[:, None]
            z = torch.where(hit, z - p, z)
    if inputs.allowed_mask is not None:
        z = torch.where(per_row(bit_is_set(inputs.allowed_mask, V)), z, float("-inf"))
    if inputs.banned is not None:
        rows, ids, _, _ = csr_rows(inputs.banned)
        z[rows, ids] = float("-inf")
    if inputs.min_tokens is not None and inputs.stop_ids is not None:
        if inputs.num_output_tokens is None:
            raise ValueError("num_output_tokens: required with min_tokens")
        rows, ids, req, _ = csr_rows(inputs.stop_ids)
        active = (inputs.num_output_tokens.to(torch.int64) <
                  inputs.min_tokens.to(torch.int64)).to(z.device)
        on = active[req]
        z[rows[on], ids[on]] = float("-inf")
    return z


def apply_verify(target_logits: torch.Tensor, inputs: LogitsInputs, cu_num_draft: torch.Tensor,
                 draft_ids: torch.Tensor) -> torch.Tensor:
    """The processed *target* logits of a chain speculative verify (``ops.verify(...,
    processing=)``), ragged layout (request ``i`` owns target rows ``cu[i] + i .. cu[i + 1] + i``,
    position ``j = 0 .. n_i``, and drafts ``cu[i] .. cu[i + 1]``).

    Position ``j`` of request ``i`` is processed as ``apply`` would process the next token after
    the drafts ``d_0 .. d_{j-1}`` were emitted (the convention of vLLM's rejection sampler, which
    combines the output tokens with the draft tokens before each position):

    * bias, banned ids, penalty values: the request's;
    * penalty state: slot ``count_slots[i]``'s counts plus one per occurrence of a token among
      ``d_0 .. d_{j-1}`` (those tokens are seen);
    * ``min_tokens``: the stop ids are masked while ``num_output_tokens[i] + j < min_tokens[i]``;
    * ``allowed_mask``: ``[n, W]`` (every position of a request the same) or ``[R_t, W]`` (one
      mask per target row, as a grammar gives for each draft prefix).

    The draft logits are the draft distribution as given (not processed here). Unvalidated
    inputs follow ``apply``'s rules (a count slot outside ``[0, N)`` turns the request's
    penalties off, the drafts' included); draft ids outside ``[0, V)`` are not counted."""
    R_t, V = target_logits.shape
    dev = target_logits.device
    cu = cu_num_draft.to(torch.int64).to(dev)
    n = cu.numel() - 1
    counts_n = cu[1:] - cu[:-1]
    req = torch.repeat_interleave(torch.arange(n, device=dev), counts_n + 1)
    assert req.numel() == R_t, "target_logits: sum(n_i + 1) rows expected"
    pos = torch.arange(R_t, device=dev) - (cu[:-1] + torch.arange(n, device=dev))[req]
    ids = draft_ids.to(torch.int64).to(dev)

    def rows_of(t):   # [n, ...] -> [R_t, ...]
        return None if t is None else t.to(dev)[req]

    def csr_rows(csr):   # each request's entries once per target row of the request
        if csr is None:
            return None
        ip = csr.indptr.to(torch.int64).to(dev)
        nnz = csr.ids.shape[0]   # (unvalidated offsets: the sampler's clamping rule)
        lo = ip[req].clamp(0, nnz)
        hi = torch.maximum(ip[req + 1].clamp(0, nnz), lo)
        take = torch.cat([torch.arange(int(a), int(b), device=dev) for a, b in zip(lo, hi)]
                         or [torch.zeros(0, dtype=torch.int64, device=dev)])
        new_ip = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), (hi - lo).cumsum(0)])
        return Csr(new_ip, csr.ids.to(dev)[take],
                   None if csr.values is None else csr.values.to(dev)[take])

    counts = None
    if inputs.counts is not None:
        slots = (torch.arange(n, device=dev) if inputs.count_slots is None
                 else inputs.count_slots.to(torch.int64).to(dev))
        N = inputs.counts.seen.shape[0]
        ok = (slots >= 0) & (slots < N)
        safe = torch.where(ok, slots, 0)
        if N == 0:
            seen = inputs.counts.seen.new_zeros((R_t,) + tuple(inputs.counts.seen.shape[1:]))
            output = inputs.counts.output.new_zeros((R_t, V))
        else:
            seen = inputs.counts.seen.to(dev)[safe[req]].clone()
            output = inputs.counts.output.to(dev)[safe[req]].clone()
        for r in range(R_t):   # the drafts before each position count as output tokens
            i, j = int(req[r]), int(pos[r])
            if not bool(ok[i]):
                seen[r] = 0
                output[r] = 0
                continue
            prev = ids[int(cu[i]):int(cu[i]) + j]
            prev = prev[(prev >= 0) & (prev < V)]
            if prev.numel():
                output[r].index_put_((prev,), torch.ones_like(prev, dtype=torch.int32),
                                     accumulate=True)
                _set_bits(seen, torch.full_like(prev, r), prev)
        counts = TokenCounts(seen, output)
    allowed = inputs.allowed_mask
    if allowed is not None and allowed.shape[0] != R_t:
        allowed = rows_of(allowed)
    nout = inputs.num_output_tokens
    per_row = LogitsInputs(
        logit_bias=csr_rows(inputs.logit_bias),
        repetition_penalty=rows_of(inputs.repetition_penalty),
        frequency_penalty=rows_of(inputs.frequency_penalty),
        presence_penalty=rows_of(inputs.presence_penalty),
        counts=counts, allowed_mask=allowed, banned=csr_rows(inputs.banned),
        min_tokens=rows_of(inputs.min_tokens),
        num_output_tokens=None if nout is None else rows_of(nout).to(torch.int64) + pos,
        stop_ids=csr_rows(inputs.stop_ids), count_slots=None)
    return apply(target_logits, per_row, 1)
