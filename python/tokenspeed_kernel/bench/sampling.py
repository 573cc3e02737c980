"""Sampling benchmark: ours (CUDA, Triton) against torch and FlashInfer, every provider verified.

Providers (each verified on the same inputs before it is timed; a wrong one is never timed):

* ``ours-cuda``   ``ops.sample(backend="cuda")``   per-row tensors, ``validate=False`` (what a
  decode loop under a CUDA graph passes);
* ``ours-triton`` ``ops.sample(backend="triton")`` same arguments;
* ``torch``       vLLM's plain-torch path: ``logits.float() / T``, sort-based top-k / top-p
  (ascending sort, threshold gather, softmax + cumsum, scatter back), min-p on softmax probs,
  ``softmax`` + ``torch.multinomial``; greedy = ``argmax``;
* ``flashinfer``  (when ``import flashinfer.sampling`` works) temperature:
  ``sampling_from_logits``; top-k / top-p / min-p: ``softmax(logits, temperature=T)`` +
  ``top_{k,p}_sampling_from_probs`` / ``min_p_sampling_from_probs``; top-k + top-p:
  ``top_k_top_p_sampling_from_logits``; greedy: none. top_k / top_p / min_p / seed / offset are
  per-row tensors (what batched engines pass; a scalar top_k <= 256 at V >= 65536 would switch
  FlashInfer to its top-k-first path, a separate JIT module). The two ``*_from_logits``
  functions have no temperature argument: they get logits already divided by T, computed
  outside the timed region (lenient to FlashInfer) and verified against the reference on those
  very inputs.

Mode ``proc`` (top-k 50 + top-p 0.9 with logits processing, ``make_processing``: 20 bias entries
per request, repetition 1.1 / frequency 0.2 / presence 0.1 over token counts of ~2000 prompt and
200 output tokens, an allowed-token bitmask allowing ~half the vocabulary, 10 banned ids,
min_tokens active with 2 stop ids): ``ours-cuda`` / ``ours-triton`` = the same sampler call
without processing; ``ours-triton+proc`` = ``ops.sample(processing=...)`` (fused; an
``ours-cuda+proc`` row when ``ops.sampling.cuda_takes_processing()``: the loaded extension's
CUDA kernels apply it); ``torch-proc+ours-cuda`` / ``torch-proc+ours-triton`` = the engines' way: graph-safe
torch passes computing ``reference.logits_processing.apply`` (a float32 copy of the logits,
index_put for bias / banned / stop ids, dense seen / count gathers for the penalties, the
bitmask unpacked), then ``ops.sample`` on the processed copy; ``torch`` = those passes + the
torch sampler. The per-entry request index of the CSR lists (COO form) is built outside the
timed region. Processed providers are verified against the reference on ``apply(logits)``.

Mode ``mixed``: the tensors vLLM passes when only some requests filter: even rows top-k 50 +
top-p 0.9, odd rows k = V and p = 1 (off), every provider as in top-k + top-p.

Verification: tokens in [0, V) and ``valid``; greedy: equal to the argmax (lowest id among
ties); otherwise in the kept set of ``reference.sampling.kept_mask``. Ours are held to the exact
contract (kept set, and the same token as ``reference.sampling.sample`` for the same seeds on the
first rows and wherever ours-cuda and ours-triton disagree; cuda and triton must agree on every
row). Baselines use other tie-breaking and rounding conventions, so they are checked against the
kept set closed under ties with a 1e-3 slack on top_p and min_p.

Inputs: ``torch.randn(B, V) * 4`` in float32 (seeded), cast to the dtype: a peaked,
LLM-like distribution (at T = 0.8, V = 151936: top-p 0.9 keeps a few to ~200 tokens, min-p
0.1 a few to ~15).
"""
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch

from . import report, timing

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_ALIASES = {"float32": "fp32", "f32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                 "half": "fp16"}
ALL_B = [1, 4, 16, 64, 256, 512]
ALL_V = [32000, 128256, 151936, 262144]
ALL_DTYPES = ["fp32", "bf16"]
QUICK_B = [1, 16, 64, 256]
QUICK_V = [151936]
QUICK_DTYPES = ["fp32"]
# run order when the budget may not cover everything: headline vocab first
V_PRIORITY = {151936: 0, 262144: 1, 128256: 2, 32000: 3}

TEMP, TOP_K, TOP_P, MIN_P = 0.8, 50, 0.9, 0.1
MODES = {
    "greedy": dict(T=0.0),
    "temp": dict(T=TEMP),
    "top_k": dict(T=TEMP, k=TOP_K),
    "top_p": dict(T=TEMP, p=TOP_P),
    "top_k_top_p": dict(T=TEMP, k=TOP_K, p=TOP_P),
    "min_p": dict(T=TEMP, mp=MIN_P),
    "proc": dict(T=TEMP, k=TOP_K, p=TOP_P, proc=True),
    # vLLM's tensors when only some requests filter: even rows top-k 50 + top-p 0.9, odd rows
    # neither (k = V, p = 1: the values vLLM passes for "off")
    "mixed": dict(T=TEMP, k=TOP_K, p=TOP_P, mixed=True),
}
MODE_ALIASES = {"temperature": "temp", "topk": "top_k", "topp": "top_p", "minp": "min_p",
                "top_k_p": "top_k_top_p", "topk_topp": "top_k_top_p", "top-k": "top_k",
                "top-p": "top_p", "min-p": "min_p", "processing": "proc"}
ALL_PROVIDERS = ["ours-cuda", "ours-triton", "torch", "flashinfer"]
OURS = ("ours-cuda", "ours-triton", "reference", "ours-cuda+proc", "ours-triton+proc",
        "reference+proc", "torch-proc+ours-cuda", "torch-proc+ours-triton")
P_SLACK, MINP_SLACK = 1e-3, 1e-3     # baselines: top_p + slack, min_p * (1 - slack)
EXACT_ROWS = 8                       # ours: exact token check against the reference on these rows
CSV_COLUMNS = [
    "gpu", "gpu_short", "torch", "cuda", "triton", "flashinfer", "git_sha", "date",
    "provider", "impl", "mode", "B", "V", "dtype", "status",
    "graph_us", "graph_p20", "graph_p80", "eager_us", "eager_p20", "eager_p80", "host_us",
    "bytes", "floor_us", "gbps", "pct_floor", "hbm_gbps",
    "ratio_vs_flashinfer", "ratio_vs_torch", "calls", "samples", "inputs", "note"]
INPUT_DRAWS = 4                      # input draws per shape, rotated through the timed samples
MAX_DRAW_BYTES = 1 << 30             # ... at most this many bytes of them


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# inputs and parameters
# ------------------------------------------------------------------------------------------
@dataclass
class Params:
    T: torch.Tensor                     # float32 [B] (0 = greedy)
    k: Optional[torch.Tensor]           # int32 [B]
    p: Optional[torch.Tensor]           # float32 [B]
    mp: Optional[torch.Tensor]          # float32 [B]
    seed: torch.Tensor                  # int64 [B]
    offset: torch.Tensor                # int64 [B]
    proc: Any = None                    # LogitsInputs (mode "proc")
    coo: Any = None                     # request index of each bias / banned / stop entry


PROC_BIAS, PROC_PROMPT, PROC_OUTPUT, PROC_BANNED, PROC_STOP = 20, 2000, 200, 10, 2


def make_processing(B: int, V: int, device, salt: int = 0):
    """Engine-like processing inputs for B requests (module docstring, mode ``proc``) and the
    COO request index of their CSR entries (for the torch baseline). Ids of one request are
    distinct: ``(r + j * prime) % V``."""
    from .. import ops
    from ..reference import logits_processing as LP
    g = torch.Generator(device=device)
    g.manual_seed(4242 + salt)

    def csr(k, prime, values=False):
        r = torch.randint(0, V, (B, 1), generator=g, device=device)
        ids = ((r + torch.arange(k, device=device) * prime) % V).reshape(-1)
        vals = (torch.randn(B * k, generator=g, device=device) * 2 if values else None)
        indptr = torch.arange(B + 1, device=device) * k
        return LP.Csr(indptr, ids, vals), torch.arange(B, device=device).repeat_interleave(k)

    slots = torch.arange(B, device=device).flip(0)     # request q -> slot B - 1 - q
    counts = ops.new_token_counts(B, V, device=device)
    prompts = torch.randint(0, V, (B * PROC_PROMPT,), generator=g, device=device)
    ops.admit_requests(counts, slots, prompts,
                       torch.arange(B + 1, device=device) * PROC_PROMPT, validate=False)
    ops.add_output_tokens(counts, torch.randint(0, V, (B, PROC_OUTPUT), generator=g,
                                                device=device), slots=slots, validate=False)
    W = (V + 31) // 32
    allowed = torch.randint(-2**31, 2**31, (B, W), generator=g, device=device,
                            dtype=torch.int64).to(torch.int32)
    bias, bias_q = csr(PROC_BIAS, 7919, values=True)
    banned, banned_q = csr(PROC_BANNED, 104729)
    stop, stop_q = csr(PROC_STOP, 1299709)
    f32 = dict(dtype=torch.float32, device=device)
    inp = LP.LogitsInputs(
        logit_bias=bias, repetition_penalty=torch.full((B,), 1.1, **f32),
        frequency_penalty=torch.full((B,), 0.2, **f32),
        presence_penalty=torch.full((B,), 0.1, **f32), counts=counts, count_slots=slots,
        allowed_mask=allowed, banned=banned,
        min_tokens=torch.full((B,), 4, dtype=torch.int64, device=device),
        num_output_tokens=torch.full((B,), 2, dtype=torch.int64, device=device),
        stop_ids=stop)
    return inp, (bias_q, banned_q, stop_q)


def make_params(mode: str, B: int, device, salt: int = 0, V: Optional[int] = None) -> Params:
    m = MODES[mode]
    f32 = dict(dtype=torch.float32, device=device)
    seed = torch.arange(B, dtype=torch.int64, device=device) * 7919 + 12345 + 1000003 * salt
    offset = torch.full((B,), 17 + salt, dtype=torch.int64, device=device)
    k = torch.full((B,), m["k"], dtype=torch.int32, device=device) if "k" in m else None
    p = torch.full((B,), m["p"], **f32) if "p" in m else None
    if m.get("mixed"):
        if V is None:
            raise ValueError('make_params: mode "mixed" needs V (its unfiltered rows pass k = V)')
        k[1::2] = V
        p[1::2] = 1.0
    proc = coo = None
    if m.get("proc"):
        proc, coo = make_processing(B, V, device, salt)
    return Params(T=torch.full((B,), m["T"], **f32), k=k, p=p,
                  mp=torch.full((B,), m["mp"], **f32) if "mp" in m else None,
                  seed=seed, offset=offset, proc=proc, coo=coo)


def torch_processing(x: torch.Tensor, P: Params) -> torch.Tensor:
    """The engines' way: ``reference.logits_processing.apply`` as graph-safe torch passes (a
    float32 copy of the logits, then one pass per step; bit-identical to the reference)."""
    inp = P.proc
    bias_q, banned_q, stop_q = P.coo
    z = x.float()
    if z.data_ptr() == x.data_ptr():
        z = z.clone()
    V = z.shape[1]
    z.index_put_((bias_q, inp.logit_bias.ids), inp.logit_bias.values, accumulate=True)
    t = torch.arange(V, device=z.device)
    slots = inp.count_slots
    seen = ((inp.counts.seen[slots][:, t >> 5] >> (t & 31)) & 1).bool()
    r = inp.repetition_penalty[:, None]
    z = torch.where(seen, torch.where(z > 0, z / r, z * r), z)
    c = inp.counts.output[slots].float()
    hit = c > 0
    z = torch.where(hit, z - inp.frequency_penalty[:, None] * c, z)
    z = torch.where(hit, z - inp.presence_penalty[:, None], z)
    allowed = ((inp.allowed_mask[:, t >> 5] >> (t & 31)) & 1).bool()
    z = z.masked_fill_(~allowed, float("-inf"))
    z.index_put_((banned_q, inp.banned.ids), z.new_full((), float("-inf")))
    active = (inp.num_output_tokens < inp.min_tokens)[stop_q]
    sid = inp.stop_ids.ids
    z.index_put_((stop_q, sid), torch.where(active, float("-inf"), z[stop_q, sid]))
    return z


def make_logits(B: int, V: int, dtype: torch.dtype, device, seed: int = 0) -> torch.Tensor:
    """``randn(B, V) * 4`` (float32, seeded), cast to ``dtype``. Never zeros."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    x = torch.randn(B, V, generator=g, device=device, dtype=torch.float32) * 4.0
    return x.to(dtype)


def prescale(logits: torch.Tensor, T: float = TEMP) -> torch.Tensor:
    """Logits / T in the input dtype (for FlashInfer's from-logits functions; not timed)."""
    return (logits.float() / T).to(logits.dtype)


# ------------------------------------------------------------------------------------------
# reference decisions and verification
# ------------------------------------------------------------------------------------------
class RefSets:
    """What the reference decides for one (logits, params) pair, computed in row chunks."""

    def __init__(self, logits: torch.Tensor, P: Params, mode: str, prescaled: bool = False):
        from ..reference.sampling import kept_mask, process
        self.logits, self.P, self.mode, self.prescaled = logits, P, mode, prescaled
        B, V = logits.shape
        dev = logits.device
        z = logits.float()
        self.greedy = None
        self.kept = None
        self.x = None
        self.thr = None
        if mode == "greedy":
            m = z.max(dim=1, keepdim=True).values
            self.greedy = torch.argmax((z == m).to(torch.int8), dim=1)
            return
        T = torch.ones_like(P.T) if prescaled else P.T
        _, self.x, _, _, _ = process(logits, T)     # y = (z - zmax) / T: the kept-set values
        if mode == "temp":
            self.thr = self.x.min(dim=1).values
            return
        k = P.k.to(torch.int64) if P.k is not None else torch.zeros(B, dtype=torch.int64,
                                                                    device=dev)
        p = P.p if P.p is not None else torch.ones(B, dtype=torch.float32, device=dev)
        mp = P.mp if P.mp is not None else torch.zeros(B, dtype=torch.float32, device=dev)
        p_loose = torch.clamp(p + P_SLACK, max=1.0)
        mp_loose = mp * (1.0 - MINP_SLACK)
        self.kept = torch.empty(B, V, dtype=torch.bool, device=dev)
        self.thr = torch.empty(B, dtype=torch.float32, device=dev)
        step = max(1, (1 << 24) // V)   # bounds the int64 temporaries of kept_mask (~1.5 GB)
        inf = torch.tensor(float("inf"), device=dev)
        for a in range(0, B, step):
            b = min(B, a + step)
            xc, zc = self.x[a:b], z[a:b]
            self.kept[a:b] = kept_mask(zc, xc, k[a:b], p[a:b], mp[a:b])[0]
            loose = kept_mask(zc, xc, k[a:b], p_loose[a:b], mp_loose[a:b])[0]
            self.thr[a:b] = torch.where(loose, xc, inf).min(dim=1).values

    def ref_tokens(self, rows: torch.Tensor) -> torch.Tensor:
        from ..reference.sampling import sample as ref_sample
        P = self.P

        def sel(t):
            return None if t is None else t[rows]

        T = torch.ones_like(P.T) if self.prescaled else P.T
        return ref_sample(self.logits[rows], P.seed[rows], P.offset[rows], sel(T), sel(P.k),
                          sel(P.p), sel(P.mp))[0]


def unpack(out) -> tuple:
    """(tokens int64 [B], valid bool [B] or None) from a provider's return value."""
    if isinstance(out, tuple):   # SampleOutput or (tokens, valid)
        tok, valid = out[0], out[1]
    else:
        tok, valid = out, None
    return tok.reshape(-1).to(torch.int64), valid


def _rows_str(bad: torch.Tensor, tok: torch.Tensor) -> str:
    idx = torch.nonzero(bad).flatten()
    r = int(idx[0])
    return f"{idx.numel()}/{bad.numel()} rows (row {r}: token {int(tok[r])})"


def verify(out, refs: RefSets, strict: bool, other_ours: Optional[torch.Tensor] = None,
           exact_rows: int = EXACT_ROWS) -> Optional[str]:
    """None when ``out`` is right for ``refs``; else the reason."""
    tok, valid = unpack(out)
    B, V = refs.logits.shape
    if tok.numel() != B:
        return f"expected {B} tokens, got {tok.numel()}"
    if valid is not None and not bool(valid.all()):
        return f"valid=False on {_rows_str(~valid.reshape(-1).bool(), tok)}"
    oob = (tok < 0) | (tok >= V)
    if bool(oob.any()):
        return f"token out of [0, V) on {_rows_str(oob, tok)}"
    if refs.mode == "greedy":
        bad = tok != refs.greedy
        if bool(bad.any()):
            return f"greedy token != argmax on {_rows_str(bad, tok)}"
    elif strict:
        if refs.kept is not None:
            bad = ~refs.kept.gather(1, tok[:, None])[:, 0]
            if bool(bad.any()):
                return f"token outside the kept set on {_rows_str(bad, tok)}"
    else:
        xt = refs.x.gather(1, tok[:, None])[:, 0]
        slack = 1e-6 * refs.thr.abs()
        bad = ~(xt >= refs.thr - slack)
        if bool(bad.any()):
            return f"token outside the kept set (closed under ties) on {_rows_str(bad, tok)}"
    if strict:
        rows = torch.arange(min(B, exact_rows), device=tok.device)
        if other_ours is not None:
            diff = torch.nonzero(other_ours.reshape(-1) != tok).flatten()[:16]
            rows = torch.unique(torch.cat([rows, diff]))
        ref = refs.ref_tokens(rows)
        bad = ref != tok[rows]
        if bool(bad.any()):
            i = int(torch.nonzero(bad).flatten()[0])
            return (f"token != reference.sample on {int(bad.sum())}/{rows.numel()} checked rows "
                    f"(row {int(rows[i])}: {int(tok[rows[i]])} vs {int(ref[i])})")
    return None


# ------------------------------------------------------------------------------------------
# providers
# ------------------------------------------------------------------------------------------
@dataclass
class Provider:
    name: str
    impl: str
    call: Callable[[torch.Tensor, Params], Any]
    strict: bool
    prescaled: bool = False
    note: str = ""
    processed: bool = False     # draws from the processed logits (mode "proc")


def _ours_call(backend: str, proc: bool = False, torch_proc: bool = False):
    from .. import ops

    def call(x, P):
        if torch_proc:
            x = torch_processing(x, P)
        return ops.sample(x, P.seed, P.offset, temperature=P.T, top_k=P.k, top_p=P.p,
                          min_p=P.mp, backend=backend, validate=False,
                          processing=P.proc if proc else None)
    return call


def _torch_top_k_top_p(logits, k, p):
    """vLLM's sort-based apply_top_k_top_p (ascending sort; graph-safe, no host sync)."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        idx = (logits_sort.size(1) - k.to(torch.long)).clamp(min=0)
        thr = logits_sort.gather(1, idx.unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < thr, float("-inf"))
    if p is not None:
        probs_sort = logits_sort.softmax(dim=-1)
        probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        mask = probs_sum <= 1 - p.unsqueeze(1)
        mask[:, -1] = False
        logits_sort.masked_fill_(mask, float("-inf"))
    return torch.empty_like(logits_sort).scatter_(-1, logits_idx, logits_sort)


def _torch_min_p(logits, min_p):
    probs = torch.softmax(logits, dim=-1)
    thr = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < thr, float("-inf"))


def _torch_call(mode: str):
    def call(x, P):
        if mode == "greedy":
            return torch.argmax(x, dim=-1)
        if P.proc is not None:
            x = torch_processing(x, P)
        z = x.float() / P.T.unsqueeze(1)
        if P.k is not None or P.p is not None:
            z = _torch_top_k_top_p(z, P.k, P.p)
        if P.mp is not None:
            z = _torch_min_p(z, P.mp)
        probs = torch.softmax(z, dim=-1)
        return torch.multinomial(probs, 1).view(-1)
    return call


def _fi_providers(mode: str, fs) -> Optional[Provider]:
    kw = lambda P: dict(seed=P.seed, offset=P.offset)  # noqa: E731
    if mode == "temp":
        return Provider("flashinfer", "sampling_from_logits",
                        lambda x, P: fs.sampling_from_logits(x, **kw(P)), False, True,
                        "logits / T precomputed (untimed)")
    if mode == "top_k":
        return Provider("flashinfer", "softmax(T) + top_k_sampling_from_probs",
                        lambda x, P: fs.top_k_sampling_from_probs(
                            fs.softmax(x, temperature=P.T), P.k, **kw(P)), False)
    if mode == "top_p":
        return Provider("flashinfer", "softmax(T) + top_p_sampling_from_probs",
                        lambda x, P: fs.top_p_sampling_from_probs(
                            fs.softmax(x, temperature=P.T), P.p, **kw(P)), False)
    if mode in ("top_k_top_p", "mixed"):
        return Provider("flashinfer", "top_k_top_p_sampling_from_logits",
                        lambda x, P: fs.top_k_top_p_sampling_from_logits(x, P.k, P.p, **kw(P)),
                        False, True, "logits / T precomputed (untimed)")
    if mode == "min_p":
        return Provider("flashinfer", "softmax(T) + min_p_sampling_from_probs",
                        lambda x, P: fs.min_p_sampling_from_probs(
                            fs.softmax(x, temperature=P.T), P.mp, **kw(P)), False)
    return None   # greedy: FlashInfer has no argmax sampler


class Availability:
    """Which providers can run here, and why not (asked once)."""

    def __init__(self, names: List[str], device: torch.device, warm_flashinfer: bool = True):
        self.reason: Dict[str, str] = {}
        self.fs = None
        for n in names:
            r = self._check(n, device, warm_flashinfer)
            if r:
                self.reason[n] = r

    def _check(self, name, device, warm_fi) -> Optional[str]:
        if name == "ours-cuda":
            if device.type != "cuda":
                return "needs a CUDA GPU"
            from .. import _library
            if not _library.extension_available():
                return f"extension not loaded ({_library.extension_error()})"
        elif name == "ours-triton":
            if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
                return "Triton on CPU needs TRITON_INTERPRET=1"
            try:
                import importlib
                importlib.import_module("tokenspeed_kernel.triton.sampling")
            except Exception as e:
                return f"tokenspeed_kernel.triton.sampling: {type(e).__name__}: {_first(e)}"
        elif name == "flashinfer":
            if device.type != "cuda":
                return "needs a CUDA GPU"
            try:
                import flashinfer.sampling as fs
            except Exception as e:
                return f"not importable ({type(e).__name__}: {_first(e)})"
            if warm_fi:
                t0 = time.monotonic()
                log("[sampling] FlashInfer: building/loading its sampling JIT module "
                    "(first use on a machine: ~1-2 min) ...")
                try:
                    x = torch.randn(2, 4096, device=device)
                    s = torch.zeros(2, dtype=torch.int64, device=device)
                    fs.sampling_from_logits(x, seed=s, offset=s)
                    fs.top_p_sampling_from_probs(fs.softmax(x, temperature=torch.ones(
                        2, device=device)), torch.full((2,), 0.9, device=device), seed=s,
                        offset=s)
                    torch.cuda.synchronize()
                except Exception as e:
                    return f"JIT/first call failed ({type(e).__name__}: {_first(e)})"
                log(f"[sampling] FlashInfer ready ({time.monotonic() - t0:.0f}s)")
            self.fs = fs
        elif name == "torch":
            pass
        elif name == "reference":
            pass
        else:
            return "unknown provider"
        return None

    def ok(self, name) -> bool:
        return name not in self.reason


def _first(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:200] if s else ""


def _proc_providers(n: str) -> List[Provider]:
    """Mode "proc": the fused call and the torch passes + our sampler (module docstring)."""
    from ..ops import sampling as S
    be = {"ours-cuda": "cuda", "ours-triton": "triton", "reference": "reference"}[n]
    out = []
    if be != "cuda" or S.cuda_takes_processing():   # (an older extension does not take it)
        out.append(Provider(n + "+proc", f'ops.sample(backend="{be}", processing=...)',
                            _ours_call(be, proc=True), True, processed=True))
    if n != "reference":
        out.append(Provider(f"torch-proc+{n}", f'torch processing + ops.sample(backend="{be}")',
                            _ours_call(be, torch_proc=True), True, processed=True))
    return out


def providers_for(mode: str, names: List[str], avail: Availability) -> List[Provider]:
    out = []
    proc = MODES[mode].get("proc", False)
    for n in names:
        if not avail.ok(n):
            continue
        if proc and n in ("ours-cuda", "ours-triton", "reference"):
            out += _proc_providers(n)
        if n == "ours-cuda":
            out.append(Provider(n, 'ops.sample(backend="cuda")', _ours_call("cuda"), True))
        elif n == "ours-triton":
            out.append(Provider(n, 'ops.sample(backend="triton")', _ours_call("triton"), True))
        elif n == "reference":
            out.append(Provider(n, 'ops.sample(backend="reference")', _ours_call("reference"),
                                True))
        elif n == "torch":
            impl = "argmax" if mode == "greedy" else (
                "softmax + multinomial" if mode == "temp" else
                "min-p on softmax + softmax + multinomial" if mode == "min_p" else
                "sort top-k/top-p + softmax + multinomial")
            if proc:
                impl = "torch processing + " + impl
            out.append(Provider(n, impl, _torch_call(mode), False, processed=proc))
        elif n == "flashinfer" and not proc:
            p = _fi_providers(mode, avail.fs)
            if p is not None:
                out.append(p)
    return out


# ------------------------------------------------------------------------------------------
# grid
# ------------------------------------------------------------------------------------------
def _csv_list(s: Optional[str], conv=str) -> Optional[list]:
    if s is None:
        return None
    return [conv(t.strip()) for t in str(s).split(",") if t.strip()]


def parse_grid(args):
    quick = getattr(args, "quick", False)
    Bs = _csv_list(getattr(args, "batch", None), int) or (QUICK_B if quick else ALL_B)
    Vs = _csv_list(getattr(args, "vocab", None), int) or (QUICK_V if quick else ALL_V)
    dts = [DTYPE_ALIASES.get(d, d) for d in (_csv_list(getattr(args, "dtype", None))
                                            or (QUICK_DTYPES if quick else ALL_DTYPES))]
    modes = [MODE_ALIASES.get(m, m) for m in (_csv_list(getattr(args, "modes", None))
                                             or list(MODES))]
    provs = _csv_list(getattr(args, "providers", None)) or list(ALL_PROVIDERS)
    for d in dts:
        if d not in DTYPES:
            raise SystemExit(f"unknown dtype {d!r}; choose from {list(DTYPES)}")
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; choose from {list(MODES)}")
    for p in provs:
        if p not in ALL_PROVIDERS + ["reference"]:
            raise SystemExit(f"unknown provider {p!r}; choose from {ALL_PROVIDERS}")
    # ours-cuda before ours-triton (cross-check), baselines after
    provs = sorted(set(provs), key=lambda p: (ALL_PROVIDERS + ["reference"]).index(p))
    groups = [(d, V, B) for d in dts for V in Vs for B in Bs]
    # headline first when the budget may not cover the grid: V priority, fp32 before bf16
    groups.sort(key=lambda g: (V_PRIORITY.get(g[1], 9) + 1.5 * dts.index(g[0]), g[2]))
    return groups, modes, provs


# ------------------------------------------------------------------------------------------
# GPU run
# ------------------------------------------------------------------------------------------
def _short(t: Optional[float]) -> str:
    return "-" if t is None else (f"{t:.0f}" if t >= 100 else f"{t:.1f}")


def input_draws(B: int, V: int, dtype: torch.dtype, device, seed: int, k: int) -> List[torch.Tensor]:
    """The ``k`` input draws of one shape: ``make_logits`` with seeds seed, seed + 100003, ...
    (the first is the one every provider is verified on)."""
    return [make_logits(B, V, dtype, device, seed=seed + 100003 * j) for j in range(k)]


def rotation(pool: List[torch.Tensor], draws: List[torch.Tensor], n: int):
    """``prepare(i)`` for ``timing.measure``: before sample i, copy i of the N calls reads draw
    (i + copy) mod K, so that every sample spans min(N, K) draws and consecutive samples rotate
    through all K (None with one draw: the copies keep it)."""
    K = len(draws)
    if K <= 1:
        return None

    def prepare(i: int) -> None:
        for j, c in enumerate(pool[:n]):
            c.copy_(draws[(i + j) % K])
    return prepare


def _time_provider(prov: Provider, pool: List[torch.Tensor], draws: List[torch.Tensor],
                   P: Params, nbytes: int, args, device, cold: bool) -> timing.Timing:
    """Pick N from a rough estimate, make N input copies (working buffers: the draws are never
    written), measure with the draws rotated through them (``rotation``)."""
    if device.type != "cuda":   # --cpu-dry-run: exercises the loop and the reports only
        if not pool:
            pool.append(draws[0].clone())
        prepare = rotation(pool, draws, 1)
        if prepare is not None:
            prepare(1)
        ms = timing.cpu_time_ms(functools.partial(prov.call, pool[0], P), n=2)
        return timing.Timing(graph_us=ms * 1e3, graph_p20=ms * 1e3, graph_p80=ms * 1e3,
                             eager_us=ms * 1e3, eager_p20=ms * 1e3, eager_p80=ms * 1e3,
                             host_us=ms * 1e3, calls=1, samples=2)
    est = timing.estimate_us(functools.partial(prov.call, draws[0], P))
    n = timing.pick_calls(est, nbytes)
    while len(pool) < n:
        pool.append(draws[len(pool) % len(draws)].clone())
    fns = [functools.partial(prov.call, c, P) for c in pool[:n]]
    return timing.measure(fns, reps=getattr(args, "reps", None), cold_l2=cold,
                          graph=not getattr(args, "eager_only", False), device=device,
                          prepare=rotation(pool, draws, n))


def run_sampling(args) -> int:
    dry = bool(getattr(args, "cpu_dry_run", False))
    if not torch.cuda.is_available() and not dry:
        log("[sampling] no CUDA GPU here: GPU numbers need a GPU. "
            "Run `python -m tokenspeed_kernel.bench smoke` (TRITON_INTERPRET=1) on a CPU.")
        return 2
    t_start = time.monotonic()
    budget = float(getattr(args, "budget_s", None) or 420.0)
    deadline = getattr(args, "deadline", None) or (t_start + budget)
    device = torch.device("cpu") if dry else torch.device("cuda", torch.cuda.current_device())
    groups, modes, prov_names = parse_grid(args)
    env = report.env_info(device)
    log(f"[sampling] {env['gpu']} | torch {env['torch']} | triton {env['triton']} | "
        f"git {env['git_sha'][:12]} | {len(groups)} shapes x {len(modes)} modes | "
        f"budget {deadline - t_start:.0f}s")

    avail = Availability(prov_names, device)
    env = report.env_info(device)   # FlashInfer version after import
    for n, r in avail.reason.items():
        log(f"[sampling] {n}: unavailable: {r}")
    cold = not getattr(args, "warm_l2", False)
    if dry:
        hbm = 100.0
        log("[sampling] --cpu-dry-run: CPU tensors, CPU wall times (not performance numbers)")
    else:
        hbm = timing.hbm_read_gbps(device)
        log(f"[sampling] HBM read bandwidth (1 GiB amax): {hbm:.0f} GB/s; " +
            (f"L2 flush: {timing.flusher(device).nbytes >> 20} MiB read before each sample"
             if cold else "warm L2 (no flush)"))

    rows: List[Dict] = []
    failed_ours = []
    skipped = []
    errors: List[str] = []
    out_dir = report.results_dir(getattr(args, "out", None), env["gpu_short"])
    total = len(groups) * len(modes)
    done = 0
    for gi, (dt, V, B) in enumerate(groups):
        if time.monotonic() > deadline:
            skipped.append((dt, V, B))
            continue
        try:
            dtype = DTYPES[dt]
            nbytes = B * V * torch.tensor([], dtype=dtype).element_size()
            k = max(1, min(int(getattr(args, "inputs", None) or INPUT_DRAWS),
                           MAX_DRAW_BYTES // max(nbytes, 1)))
            draws = {False: input_draws(B, V, dtype, device, 1000 * gi + B, k)}
            floor_us = nbytes / (hbm * 1e3)
            pools: Dict[bool, List[torch.Tensor]] = {False: []}
            for mode in modes:
                done += 1
                P = make_params(mode, B, device, salt=gi, V=V)
                refs: Dict[tuple, RefSets] = {}
                ours_tok: Dict[str, torch.Tensor] = {}
                mode_rows = []
                for prov in providers_for(mode, prov_names, avail):
                    row = dict(env, provider=prov.name, impl=prov.impl, mode=mode, B=B, V=V,
                               dtype=dt, bytes=nbytes, floor_us=floor_us, hbm_gbps=hbm,
                               note=prov.note)
                    if prov.prescaled and True not in pools:
                        draws[True] = [prescale(d) for d in draws[False]]
                        pools[True] = []
                    pool = pools[prov.prescaled]
                    x0 = draws[prov.prescaled][0]
                    try:
                        out = prov.call(x0, P)
                        _sync(device)
                    except Exception as e:
                        row["status"] = f"ERROR: {type(e).__name__}: {_first(e)}"
                        _recover()
                        mode_rows.append(row)
                        continue
                    rk = (prov.prescaled, prov.processed)
                    if rk not in refs:
                        refs[rk] = RefSets(_processed(x0, P) if prov.processed else x0, P, mode,
                                           prescaled=prov.prescaled)
                    other = None
                    twin = prov.name.replace("ours-triton", "ours-cuda")
                    if twin != prov.name and twin in ours_tok:
                        other = ours_tok[twin]
                    why = verify(out, refs[rk], prov.strict, other_ours=other)
                    if why is None and other is not None and not torch.equal(
                            unpack(out)[0], other):
                        # triton matched the reference where they differ: cuda is the wrong one
                        why_c = "tokens differ from ours-triton, which matches reference.sample"
                        for r in mode_rows:
                            if r["provider"] == twin:
                                _fail(r, why_c)
                                failed_ours.append(r)
                    if why is not None:
                        _fail(row, why)
                        mode_rows.append(row)
                        if prov.name in OURS:
                            failed_ours.append(row)
                        continue
                    if prov.strict:
                        ours_tok[prov.name] = unpack(out)[0].clone()
                    del out
                    # time it
                    try:
                        t = _time_provider(prov, pool, draws[prov.prescaled], P, nbytes, args,
                                           device, cold)
                    except Exception as e:
                        row["status"] = f"ERROR: timing: {type(e).__name__}: {_first(e)}"
                        _recover()
                        mode_rows.append(row)
                        continue
                    row.update(status="ok", graph_us=t.graph_us, graph_p20=t.graph_p20,
                               graph_p80=t.graph_p80, eager_us=t.eager_us, eager_p20=t.eager_p20,
                               eager_p80=t.eager_p80, host_us=t.host_us, calls=t.calls,
                               samples=t.samples, inputs=len(draws[prov.prescaled]))
                    if t.graph_error:
                        row["note"] = (row["note"] + "; " if row["note"] else "") + \
                            f"graph capture failed: {t.graph_error}"
                    best = t.best_us
                    if best:
                        row["gbps"] = nbytes / best / 1e3
                        row["pct_floor"] = 100.0 * floor_us / best
                    mode_rows.append(row)
                _ratios(mode_rows)
                rows += mode_rows
                el = time.monotonic() - t_start
                cells = " | ".join(
                    f"{r['provider']} " + (f"{_short(r.get('graph_us'))}/{_short(r.get('eager_us'))}"
                                           if r["status"] == "ok" else r["status"][:60])
                    for r in mode_rows)
                log(f"[sampling {done:3d}/{total} {el:4.0f}s] {dt} V={V} B={B} {mode}: {cells}"
                    f"  (us graph/eager)")
                refs = ours_tok = None
        except Exception as e:   # keep going: one broken shape must not lose the run
            log(f"[sampling] {dt} V={V} B={B}: aborted: {type(e).__name__}: {_first(e)}")
            errors.append(f"{dt}/V={V}/B={B}: {type(e).__name__}: {_first(e)}")
            _recover()
        pools = draws = refs = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        report.write_csv(out_dir / "sampling.csv", rows, CSV_COLUMNS)  # partial results

    notes = default_notes()
    if not cold:
        notes.append("**warm L2** (--warm-l2): inputs may be L2-resident; not comparable.")
    for n, r in avail.reason.items():
        notes.append(f"{n} unavailable: {r}")
    for e in errors:
        notes.append(f"shape aborted: {e}")
    if skipped:
        notes.append(f"{len(skipped)} shapes not run (time budget): "
                     + ", ".join(f"{d}/V={v}/B={b}" for d, v, b in skipped[:12])
                     + (" ..." if len(skipped) > 12 else ""))
    _write(rows, env, hbm, notes, args, "sampling")
    summary(rows)
    if skipped:
        log(f"[sampling] budget reached: {len(skipped)} of {len(groups)} shapes skipped "
            f"(narrow the grid with --vocab/--dtype/--batch or raise --budget-s)")
    if failed_ours:
        log(f"[sampling] {len(failed_ours)} ours rows FAILED verification")
        return 1
    return 0


def _processed(x: torch.Tensor, P: Params) -> torch.Tensor:
    """The reference's processed logits (what processed providers are verified against)."""
    from ..reference import logits_processing as LP
    return LP.apply(x, P.proc)


def default_notes() -> List[str]:
    """The bullets every sampling table carries (inputs, how the baselines are called)."""
    return [f"Inputs: randn(B, V) * 4 (float32, seeded) cast to the dtype; T = {TEMP}, "
            f"top-k {TOP_K}, top-p {TOP_P}, min-p {MIN_P}; per-row parameter tensors.",
            "Each cell times several input draws (column `inputs` of the CSV, 4 unless they "
            "would exceed 1 GiB), rotated through the timed samples, so that input-dependent "
            "slow paths count as often as they occur; every provider is verified on the first.",
            "FlashInfer `*_from_logits` get logits / T computed outside the timed region "
            "(they have no temperature argument); its `*_from_probs` rows include "
            "`flashinfer.sampling.softmax(logits, temperature=T)`.",
            "torch = vLLM's plain-torch path (sort-based top-k/top-p, softmax, "
            "torch.multinomial); greedy = argmax.",
            f"Mode proc: top-k {TOP_K} + top-p {TOP_P} with processing ({PROC_BIAS} bias "
            f"entries, repetition 1.1 / frequency 0.2 / presence 0.1 over {PROC_PROMPT} prompt + "
            f"{PROC_OUTPUT} output tokens, ~half the vocabulary allowed, {PROC_BANNED} banned, "
            f"{PROC_STOP} stop ids under min_tokens); ours-* without +proc = the same call "
            "without processing; torch-proc+* = torch passes (a processed float32 copy) + "
            "ops.sample.",
            f"Mode mixed: even rows top-k {TOP_K} + top-p {TOP_P}, odd rows off (k = V, p = 1: "
            "what vLLM passes for requests without filters when others have them)."]


def _fail(row: Dict, why: str) -> None:
    row["status"] = f"FAILED: {why}"
    for k in ("graph_us", "graph_p20", "graph_p80", "eager_us", "eager_p20", "eager_p80",
              "host_us", "gbps", "pct_floor", "ratio_vs_flashinfer", "ratio_vs_torch"):
        row.pop(k, None)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _recover() -> None:
    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception:
        pass


def _ratios(mode_rows: List[Dict]) -> None:
    """CSV ratio columns of our rows: vs FlashInfer and vs the torch baseline of the mode (in
    mode "proc" the engines' way), graph to graph, else eager to eager (report.ratio_of)."""
    by = {r["provider"]: r for r in mode_rows if r["status"] == "ok"}
    fi = by.get("flashinfer")
    tt = report.torch_baseline(by, mode_rows[0]["mode"]) if mode_rows else None
    for r in mode_rows:
        if r["provider"] in OURS and r["status"] == "ok":
            r["ratio_vs_flashinfer"] = report.ratio_of(r, fi)
            r["ratio_vs_torch"] = report.ratio_of(r, tt)


def _write(rows, env, hbm, notes, args, stem) -> None:
    out = getattr(args, "out", None)
    d = report.results_dir(out, env["gpu_short"])
    report.write_csv(d / f"{stem}.csv", rows, CSV_COLUMNS)
    (d / f"{stem}.md").write_text(report.sampling_markdown(rows, env, hbm, notes) + "\n")
    pngs = [] if getattr(args, "no_plot", False) else report.sampling_plots(rows, d, stem)
    log(f"[sampling] wrote {d / (stem + '.csv')}, {stem}.md"
        + "".join(f", {p.name}" for p in pngs))


def summary(rows: List[Dict], max_rows: int = 60) -> None:
    """Short table on stdout (the end of the output is what a remote run shows)."""
    provs = [p for p in report.PROVIDER_ORDER if any(r["provider"] == p for r in rows)]
    keys = []
    for r in rows:
        k = (r["dtype"], r["V"], r["mode"], r["B"])
        if k not in keys:
            keys.append(k)
    groups = list(dict.fromkeys((k[0], k[1]) for k in keys))
    keys.sort(key=lambda k: (groups.index((k[0], k[1])), list(MODES).index(k[2]), k[3]))
    more = ""
    if len(keys) > max_rows:   # keep the tail of a remote run readable: headline shape only
        head = (keys[0][0], keys[0][1])
        keys = [k for k in keys if (k[0], k[1]) == head][:max_rows]
        more = f" ({head[0]}, V={head[1]} only; every shape is in sampling.md / sampling.csv)"
    body = []
    for k in keys:
        by = {r["provider"]: r for r in rows if (r["dtype"], r["V"], r["mode"], r["B"]) == k}
        _, r_fi, r_torch = report.table_ratios(by, k[2])
        body.append(list(k) + [report._cell(by.get(p)) for p in provs]
                    + [report._ratio(r_fi), report._ratio(r_torch)])
    print(f"\nsampling: graph-replay us (eager us), median per call, cold L2{more}")
    report.print_table(["dtype", "V", "mode", "B"] + provs + ["ours/FI", "ours/torch"], body)


# ------------------------------------------------------------------------------------------
# CPU smoke
# ------------------------------------------------------------------------------------------
SMOKE_B = [1, 4]
SMOKE_V = 1000


def run_smoke(args) -> int:
    """Tiny shapes on the CPU (Triton under TRITON_INTERPRET=1): verification, no timing."""
    t_start = time.monotonic()
    budget = float(getattr(args, "budget_s", None) or 100.0)
    deadline = t_start + budget
    cpu = torch.device("cpu")
    names = ["reference", "ours-triton", "torch"]
    avail = Availability(names, cpu, warm_flashinfer=False)
    cuda_dev = None
    if torch.cuda.is_available():
        from .. import _library
        if _library.extension_available():
            cuda_dev = torch.device("cuda", torch.cuda.current_device())
    if cuda_dev is None:
        avail.reason["ours-cuda"] = ("needs the compiled extension and a CUDA GPU"
                                     if torch.cuda.is_available() else "no CUDA GPU here")
    if os.environ.get("TRITON_INTERPRET") != "1":
        log("[smoke] note: TRITON_INTERPRET is not 1: the Triton backend is skipped on CPU")
    for n, r in avail.reason.items():
        log(f"[smoke] {n}: unavailable: {r}")
    env = report.env_info(None)
    rows, failed = [], []
    dts = [DTYPE_ALIASES.get(d, d) for d in (_csv_list(getattr(args, "dtype", None))
                                            or ["fp32", "bf16"])]
    modes = [MODE_ALIASES.get(m, m) for m in (_csv_list(getattr(args, "modes", None))
                                             or list(MODES))]
    skipped = 0
    for dt in dts:
        for B in SMOKE_B:
            base = make_logits(B, SMOKE_V, DTYPES[dt], cpu, seed=B)
            for mode in modes:
                if time.monotonic() > deadline:
                    skipped += 1
                    continue
                P = make_params(mode, B, cpu, V=SMOKE_V)
                refs = RefSets(base, P, mode)
                refs_p = RefSets(_processed(base, P), P, mode) if P.proc is not None else None
                provs = providers_for(mode, names, avail)
                if cuda_dev is not None:
                    provs.insert(1, Provider("ours-cuda", 'ops.sample(backend="cuda")',
                                             _ours_call("cuda"), True))
                    if P.proc is not None:
                        provs[2:2] = _proc_providers("ours-cuda")
                toks = {}
                line = []
                for prov in provs:
                    row = dict(env, provider=prov.name, impl=prov.impl, mode=mode, B=B,
                               V=SMOKE_V, dtype=dt, note=prov.note)
                    on_gpu = "ours-cuda" in prov.name
                    x = base.to(cuda_dev) if on_gpu else base
                    Pd = _params_to(P, cuda_dev) if on_gpu else P
                    t0 = time.perf_counter()
                    try:
                        out = prov.call(x, Pd)
                        if on_gpu:
                            torch.cuda.synchronize()
                            out = tuple(o.cpu() for o in out)
                    except Exception as e:
                        row["status"] = f"ERROR: {type(e).__name__}: {_first(e)}"
                        rows.append(row)
                        line.append(f"{prov.name} ERROR")
                        if prov.name == "ours-triton":   # being written: report, don't crash
                            avail.reason.setdefault("ours-triton", row["status"])
                        continue
                    ms = (time.perf_counter() - t0) * 1000.0
                    ref_name = "reference+proc" if prov.processed else "reference"
                    other = toks.get(ref_name) if prov.name != ref_name else None
                    why = verify(out, refs_p if prov.processed else refs, prov.strict,
                                 other_ours=other if prov.strict else None,
                                 exact_rows=B)
                    if why is None and prov.strict and other is not None and not torch.equal(
                            unpack(out)[0], other):
                        why = "tokens differ from the reference backend"
                    if why is not None:
                        _fail(row, why)
                        if prov.name in OURS:
                            failed.append(row)
                    else:
                        row["status"] = "ok"
                        row["cpu_ms"] = ms
                        if prov.strict:
                            toks[prov.name] = unpack(out)[0]
                    rows.append(row)
                    line.append(f"{prov.name} {row['status'][:50]}")
                for sfx in ("", "+proc"):
                    c, t = toks.get("ours-cuda" + sfx), toks.get("ours-triton" + sfx)
                    if c is not None and t is not None and not torch.equal(c, t):
                        failed.append({"provider": f"ours-cuda{sfx} vs ours-triton{sfx}"})
                log(f"[smoke {time.monotonic() - t_start:4.0f}s] {dt} V={SMOKE_V} B={B} "
                    f"{mode}: " + " | ".join(line))
    print("\nsmoke (CPU): verification of every provider on tiny shapes; "
          "times are CPU wall ms of the first call (interpreter), not performance numbers")
    report.print_table(
        ["dtype", "B", "mode", "provider", "status", "cpu ms"],
        [[r["dtype"], r["B"], r["mode"], r["provider"], r["status"][:70],
          report.fmt(r.get("cpu_ms"), 1)] for r in rows])
    for n, r in avail.reason.items():
        print(f"  {n}: unavailable: {r}")
    if skipped:
        print(f"  {skipped} (shape, mode) pairs skipped: smoke budget of {budget:.0f}s reached")
    print("GPU numbers need a GPU: `python -m tokenspeed_kernel.bench all` there "
          "(tools/gpu_sampling_bench.sh); committed results are under bench/results/.")
    if getattr(args, "out", None):
        d = report.results_dir(args.out, "cpu")
        report.write_csv(d / "smoke.csv", rows, CSV_COLUMNS + ["cpu_ms"])
        log(f"[smoke] wrote {d / 'smoke.csv'}")
    print(f"smoke finished in {time.monotonic() - t_start:.0f}s: "
          + ("OK" if not failed else f"{len(failed)} FAILED"))
    return 1 if failed else 0


def _params_to(P: Params, dev) -> Params:
    def f(t):
        if t is None:
            return None
        if isinstance(t, torch.Tensor):
            return t.to(dev)
        return type(t)(*(f(x) for x in t))    # LogitsInputs / Csr / TokenCounts / tuples
    return Params(f(P.T), f(P.k), f(P.p), f(P.mp), f(P.seed), f(P.offset), f(P.proc), f(P.coo))
