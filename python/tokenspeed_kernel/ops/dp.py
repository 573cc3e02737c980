"""DP sampling: swap vocab-sharded logits into batch-sharded rows, sample / verify only this
rank's rows, gather the small results back.

Under tensor parallelism every rank ``r`` of a group of ``W`` ranks holds ``logits_shard[B, w]``
(columns ``[r w, (r + 1) w)`` of the vocabulary, the same shard width ``w`` on every rank; the
last shard may run past the true vocabulary size ``V``, as with engines that pad the vocab to a
multiple of the group). Instead of all-gathering ``[B, V]`` on every rank and sampling the whole
batch ``W`` times, ``swap_vocab_to_batch`` gives rank ``d`` whole rows ``[d Bl, d Bl + n_d)``
(``Bl = ceil(B / W)``, ``n_d = clamp(B - d Bl, 0, Bl)``); ``dp_sample`` / ``dp_verify`` sample /
verify those rows and gather tokens (and valid flags, logprobs) of the whole batch on every rank.

**Placement invariance** is the contract: the tokens are bit-identical to ``ops.sample`` /
``ops.verify`` on the all-gathered logits with the same parameters, for any W, B and row-to-rank
assignment: the randomness contract is keyed on (seed, offset, token id) per request
(docs/DESIGN.md), and a request's rows are sampled from the same logits.

Usage::

    comm = create_dp_sampling_comm(group, max_rows=256, vocab_size=151936,
                                   dtype=torch.bfloat16)          # once, outside graph capture
    out = dp_sample(comm, logits_shard, seed, offset, temperature=t, top_k=k, top_p=p)
    out.tokens                                                    # [B] on every rank

Backends (``backend=``): ``"cuda"`` (one-sided P2P push kernels, csrc/comm/dp_swap.cuh),
``"triton"`` (the same push protocol on the same workspace in Triton, triton/dp.py; only with
an explicit ``backend="triton"``: tested in the Triton interpreter with simulated ranks, never
run on a GPU), ``"nccl"`` (``all_to_all_single`` + permute, ``all_gather_into_tensor`` for the
results, over the group's own backend: NCCL on GPU, gloo on CPU), ``"reference"``
(``torch.distributed`` all-gather of the shards; every rank keeps its rows) and ``"auto"`` (cuda
when the symmetric workspace is mapped and the extension loads on every rank, else nccl; never
triton). Protocol, memory and the policy against "all-gather + sample": docs/COMM.md ("DP
sampling").
"""
from __future__ import annotations

import warnings
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from .. import _library
from . import _common as C
from . import sampling as S
from .comm import (SIG_DP_GATHER, SIG_DP_SWAP_CUDA, SIG_DP_SWAP_TRITON,  # noqa: F401
                   CommError, _ag_single, _rendezvous, agree_config, call_signature)

# ---- mirrors of csrc/comm/dp_swap.cuh (tests/test_dp.py checks they agree) ----
MAX_RANKS = 16
MAX_BLOCKS = 256
MAX_FIELDS = 8
SLOT_WORDS = MAX_BLOCKS * MAX_RANKS
SWAP_FLAGS, READY_FLAGS, GATHER_FLAGS = 0, SLOT_WORDS, 4 * SLOT_WORDS
TRITON_SWAP_FLAGS, TRITON_READY_FLAGS = 2 * SLOT_WORDS, 3 * SLOT_WORDS
HEADERS = GATHER_FLAGS + 256               # swap call headers [2 parities][block][rank]
GATHER_HEADERS = HEADERS + 2 * SLOT_WORDS  # gather call headers [2 parities][rank]
FLAG_BYTES = (GATHER_HEADERS + 256) * 8
STATE_WORDS, GATHER_STATE = 32, 16
STATE_SEQ, STATE_ERR, STATE_ERR_BLOCK, STATE_ERR_SRC, STATE_ERR_EPOCH = 0, 1, 2, 3, 4
# mismatch details (kDpErrSig ..): both signatures, B (items), rows (items) per rank, slot (fields)
STATE_ERR_SIG, STATE_ERR_PEER_SIG, STATE_ERR_ROWS, STATE_ERR_PER_RANK, STATE_ERR_EXTRA = \
    5, 6, 7, 9, 10
ERR_TIMEOUT_SWAP, ERR_TIMEOUT_READY, ERR_TIMEOUT_GATHER, ERR_MISMATCH = 1, 2, 3, 4
F_TRAP = 4

BACKENDS = ("auto", "cuda", "triton", "nccl", "reference")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEFAULT_TIMEOUT_MS = 30_000
# Bytes of one destination's block pushed per CTA of the swap (grid = ceil(Bl * shard bytes /
# this), capped by the SM count and MAX_BLOCKS). Not yet tuned on a multi-GPU machine.
DEFAULT_BLOCK_BYTES = 16 << 10
# Smallest batch for which the policy (select_route) prefers dp_sample over all-gather + sample,
# by world size and element size. Measured on 2x H100 (bench/results/h100/dp_sampling_tp2.md,
# T = 0.8 / top-k 50 / top-p 0.9, V = 151936): bf16 dp-sample loses at B = 16 (59.4 vs
# 58.4 us) and wins from B = 32 (67.2 vs 72.5); fp32 loses at B = 4 (47.4 vs 39.6) and wins from
# B = 16 (56.1 vs 58.7). 4x H100 (dp_sampling_tp4.md, same shapes, batch grid 1 / 4 / 16 / ...):
# both dtypes lose at B = 4 (bf16 59.3 vs 50.1, fp32 50.1 vs 45.6) and win from B = 16 (63.4 vs
# 72.2, 58.2 vs 79.3); B = 5..15 not measured. Not measured beyond 4 ranks: 16 there (the
# tokenspeed project's gate).
DP_MIN_ROWS_MEASURED = {(2, 2): 32, (2, 4): 16,    # (world, element bytes) -> rows
                        (4, 2): 16, (4, 4): 16}
DEFAULT_DP_MIN_ROWS = 16


def default_dp_min_rows(world: int, element_size: int) -> int:
    """The route policy's crossover for a group of ``world`` ranks and logits of
    ``element_size`` bytes (measured where ``DP_MIN_ROWS_MEASURED`` has it, else 16)."""
    return DP_MIN_ROWS_MEASURED.get((world, element_size), DEFAULT_DP_MIN_ROWS)
# Results bytes reserved per logits row (tokens, valid flag, two logprobs; verify's per-request
# fields fit too) plus the top-n fields.
_RES_BYTES_PER_ROW = 32


def swap_signature(kind: int, rows: int, rows_per_rank: int, shard_bytes: int, row_bytes: int,
                   slot: int, num_blocks: int, world: int) -> int:
    """Signature of one swap call (csrc/comm/call_signature.h ``dp_swap_signature``): the kind
    (``SIG_DP_SWAP_CUDA`` / ``SIG_DP_SWAP_TRITON``), B, rows per rank, shard bytes, the swap
    buffer's row pitch, the slot, the grid and W."""
    return call_signature([kind, rows, rows_per_rank, shard_bytes, row_bytes, slot, num_blocks,
                           world])


def gather_signature(items: int, items_per_rank: int, world: int, item_bytes: Sequence[int],
                     res_off: Sequence[int]) -> int:
    """Signature of one results gather (either backend; ``dp_gather_signature``): items, items
    per rank, W, the number of fields and each field's item bytes and results offset."""
    words = [SIG_DP_GATHER, items, items_per_rank, world, len(item_bytes)]
    for ib, off in zip(item_bytes, res_off):
        words += [ib, off]
    return call_signature(words)


def format_dp_error(words: Sequence[int], rank: int, timeout_ms: int) -> Optional[str]:
    """The message of the first error recorded in a DP state (``words``: both blocks), or None."""
    for base, what in ((0, "swap"), (GATHER_STATE, "results gather")):
        err = int(words[base + STATE_ERR])
        if not err:
            continue
        blk, src, epoch = (int(v) for v in words[base + STATE_ERR_BLOCK: base + STATE_ERR_EPOCH + 1])
        if err == ERR_MISMATCH:
            rows, per, extra = (int(words[base + i]) for i in (STATE_ERR_ROWS, STATE_ERR_PER_RANK,
                                                                 STATE_ERR_EXTRA))
            mine = (f"B={rows}, {per} rows per rank, slot {extra}" if base == 0 else
                    f"{rows} items, {per} per rank, {extra} fields")
            op = ("swap_vocab_to_batch / dp_sample / dp_verify" if base == 0 else
                  "dp_sample / dp_verify (results gather)")
            return (f"dp sampling {what}: ranks called {op} with different arguments: rank {src} "
                    f"joined call {epoch} with arguments other than this rank's (rank {rank}: "
                    f"{mine}; call signature {int(words[base + STATE_ERR_PEER_SIG]):#010x} on "
                    f"rank {src}, {int(words[base + STATE_ERR_SIG]):#010x} here; block {blk}). "
                    f"The batch, the slot, the fields (logprobs, out_dtype, verify shapes) and "
                    f"the backend of a call must be the same on every rank. The communicator is "
                    f"unusable: create a new one.")
        flag = {ERR_TIMEOUT_SWAP: "data", ERR_TIMEOUT_READY: "ready",
                ERR_TIMEOUT_GATHER: "results"}.get(err, f"code {err}")
        return (f"dp sampling {what}: rank {rank} gave up after {timeout_ms} ms "
                f"waiting for the {flag} flag of rank {src} (block {blk}, call {epoch}); "
                f"a peer did not join the same call (or joined it with other arguments). The "
                f"communicator is unusable: create a new one.")
    return None


class DPOutput(NamedTuple):
    tokens: torch.Tensor              # [B]
    valid: torch.Tensor               # [B] bool
    logprobs: Optional[torch.Tensor] = None            # [B] f32 (logprobs=True)
    processed_logprobs: Optional[torch.Tensor] = None  # [B] f32 (logprobs=True)


class DPVerifyOutput(NamedTuple):
    tokens: torch.Tensor              # [bs, n + 1]
    num_accepted: torch.Tensor        # [bs]
    valid: torch.Tensor               # [bs] bool
    logprobs: Optional[torch.Tensor] = None
    processed_logprobs: Optional[torch.Tensor] = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _up(a: int, m: int) -> int:
    return _cdiv(a, m) * m


class DPSamplingComm:
    """Workspace of DP sampling for one process group. Build it with
    ``create_dp_sampling_comm`` (a collective; host-blocking; never under CUDA-graph capture).

    Attributes (read-only): ``group, rank, world_size, device, dtype, max_rows, vocab_size,
    shard_width, slots, max_top_n, p2p, extension, triton, timeout_ms, block_bytes,
    dp_min_rows, closed``. Test hooks of the Triton backend (interpreter only): ``triton_phase`` (the
    kernels' phase mask, 7 = all) and ``triton_max_spins`` (polls before an interpreted wait gives
    up).
    Memory (symmetric, per rank): ``196 KiB + slots * ceil(max_rows / W) * row_bytes +
    2 * res_bytes`` (``row_bytes = W * shard_width * elt`` rounded up to 16).
    """

    def __init__(self):  # use create_dp_sampling_comm
        self.symm: Optional[torch.Tensor] = None
        self.handle = None
        self.state: Optional[torch.Tensor] = None
        self.group = None
        self.virtual = False
        self.triton = False
        self.triton_phase = 7
        self.triton_max_spins = 1 << 20
        self.closed = False

    # -- layout ---------------------------------------------------------------------------
    def rows_per_rank(self, rows: int) -> int:
        """``Bl = ceil(rows / W)``: rank d owns rows ``[d Bl, d Bl + n_d)``."""
        return _cdiv(rows, self.world_size)

    def row_range(self, rows: int, rank: Optional[int] = None) -> Tuple[int, int]:
        """``(start, count)`` of the rows a rank owns in a batch of ``rows``."""
        r = self.rank if rank is None else rank
        bl = self.rows_per_rank(rows)
        start = min(rows, r * bl)
        return start, max(0, min(bl, rows - start))

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    # -- error flag -----------------------------------------------------------------------
    def error(self) -> Optional[str]:
        """The recorded device-side error (one host sync), or None."""
        if self.state is None:
            return None
        return format_dp_error(self.state.tolist(), self.rank, self.timeout_ms)

    def check(self) -> None:
        """Raise ``CommError`` if a bounded wait gave up or a peer called with other arguments
        (one host sync)."""
        msg = self.error()
        if msg is not None:
            raise CommError(msg)

    def close(self) -> None:
        """Drop the workspace. No call may be in flight on any rank (synchronize first). Later
        calls on this communicator raise ValueError("comm: is closed ...")."""
        self.handle = None
        self.symm = None
        self.closed = True

    def __repr__(self) -> str:
        return (f"DPSamplingComm(rank={self.rank}/{self.world_size}, device={self.device}, "
                f"dtype={self.dtype}, max_rows={self.max_rows}, vocab_size={self.vocab_size}, "
                f"shard_width={self.shard_width}, p2p={self.p2p}, extension={self.extension})")


def _agree_min(group, device, values: Sequence[int]) -> List[int]:
    from .comm import _agree_min as am
    return am(group, device, values)


def _finish_layout(comm: DPSamplingComm) -> None:
    """Byte layout of the workspace from the agreed configuration."""
    elt = comm.element_size
    W = comm.world_size
    comm.rows_cap = _cdiv(comm.max_rows, W)
    comm.row_bytes = _up(W * comm.shard_width * elt, 16)
    comm.recv_bytes = _up(comm.rows_cap * comm.row_bytes, 256)
    per_row = _RES_BYTES_PER_ROW + 12 * comm.max_top_n
    comm.res_bytes = _up(W * comm.rows_cap * per_row + 16 * MAX_FIELDS, 256)
    comm.res_base = FLAG_BYTES + comm.slots * comm.recv_bytes
    comm.total_bytes = comm.res_base + 2 * comm.res_bytes


def _check_create_args(max_rows, vocab_size, dtype, shard_width, world, slots, max_top_n,
                       timeout_ms, block_bytes, dp_min_rows):
    for name, v in (("max_rows", max_rows), ("vocab_size", vocab_size)):
        C.check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name,
                f"must be an int >= 1, got {v!r}")
    C.check(dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {dtype!r}")
    if shard_width is None:
        shard_width = _cdiv(vocab_size, world)
    C.check(isinstance(shard_width, int) and not isinstance(shard_width, bool)
            and shard_width >= 1, "shard_width", f"must be an int >= 1, got {shard_width!r}")
    C.check(world * shard_width >= vocab_size, "shard_width",
            f"{world} shards of {shard_width} columns do not cover vocab_size={vocab_size}")
    C.check((world - 1) * shard_width < vocab_size, "shard_width",
            f"the last of {world} shards of {shard_width} columns lies past vocab_size="
            f"{vocab_size}")
    C.check(isinstance(slots, int) and 1 <= slots <= 4, "slots",
            f"must be an int in [1, 4], got {slots!r}")
    C.check(isinstance(max_top_n, int) and max_top_n >= 0, "max_top_n",
            f"must be an int >= 0, got {max_top_n!r}")
    C.check(isinstance(timeout_ms, int) and not isinstance(timeout_ms, bool) and timeout_ms >= 0,
            "timeout_ms", f"must be an int >= 0, got {timeout_ms!r}")
    C.check(isinstance(block_bytes, int) and block_bytes >= 16, "block_bytes",
            f"must be an int >= 16, got {block_bytes!r}")
    C.check(isinstance(dp_min_rows, int) and dp_min_rows >= 0, "dp_min_rows",
            f"must be an int >= 0, got {dp_min_rows!r}")
    return shard_width


def create_dp_sampling_comm(group=None, *, max_rows: int, vocab_size: int, dtype: torch.dtype,
                            shard_width: Optional[int] = None, device=None, slots: int = 1,
                            max_top_n: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                            trap_on_timeout: bool = False,
                            block_bytes: int = DEFAULT_BLOCK_BYTES,
                            dp_min_rows: Optional[int] = None,
                            use_symmetric_memory: bool = True) -> DPSamplingComm:
    """Create the DP-sampling workspace of ``group`` (collective: every rank calls it, with the
    same arguments; a mismatch raises the same ValueError on every rank).

    Parameters
    ----------
    max_rows : the largest batch (logits rows) of a call: ``B <= max_rows``. ``dp_verify``
        keeps a request's positions on one rank, so it needs ``max_rows >= W * ceil(bs / W) *
        (n + 1)`` (a little more than ``bs * (n + 1)`` when W does not divide bs).
    vocab_size : the true vocabulary size V.
    dtype : bfloat16, float16 or float32 (the logits' dtype in every call).
    shard_width : columns of each rank's shard (default ``ceil(V / W)``); ``W * shard_width >=
        V > (W - 1) * shard_width``. Columns at or past V are ignored.
    slots : swap views that can be alive at once (``dp_verify`` in probabilistic mode needs 2:
        target and draft).
    max_top_n : reserved results space for top-n logprobs (not gathered yet; 0).
    timeout_ms : bounded device-side waits (0 = forever); ``comm.check()`` raises CommError.
    dp_min_rows : the policy's crossover (``select_route``); None: ``default_dp_min_rows``
        (measured on 2 ranks, docs/COMM.md).
    use_symmetric_memory : False forces the NCCL path.
    """
    import torch.distributed as dist
    C.check(dist.is_available() and dist.is_initialized(), "group",
            "torch.distributed is not initialized")
    if group is None:
        group = dist.group.WORLD
    C.check_type(isinstance(group, dist.ProcessGroup), "group",
                 f"must be a torch.distributed ProcessGroup or None, got "
                 f"{type(group).__name__} {group!r}")
    world = dist.get_world_size(group)
    # Local checks first; a rank whose checks fail still joins the agreement (no peer is left
    # waiting in it) and raises there; the others raise "group: rank(s) [...] refused ...".
    local_error = None
    if dp_min_rows is None and dtype in DTYPES:
        dp_min_rows = default_dp_min_rows(world, torch.empty((), dtype=dtype).element_size())
    try:
        C.check(world <= MAX_RANKS, "group", f"at most {MAX_RANKS} ranks, got {world}")
        shard_width = _check_create_args(max_rows, vocab_size, dtype, shard_width, world, slots,
                                         max_top_n, timeout_ms, block_bytes, dp_min_rows)
        if device is None:
            backend = str(dist.get_backend(group))
            device = (torch.device("cuda", torch.cuda.current_device())
                      if backend != "gloo" and torch.cuda.is_available() else torch.device("cpu"))
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        C.check(device.type in ("cuda", "cpu"), "device",
                f"must be a CUDA device or CPU, got {device}")
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError("group: create_dp_sampling_comm must run outside CUDA-graph capture")
    except (ValueError, TypeError, RuntimeError) as e:
        local_error = e
        device = device if isinstance(device, torch.device) else None
    agree_config(group, device, [
        ("max_rows", max_rows), ("vocab_size", vocab_size), ("shard_width", shard_width),
        ("dtype", dtype), ("device", device.type if device is not None else None),
        ("slots", slots), ("max_top_n", max_top_n), ("timeout_ms", timeout_ms),
        ("trap_on_timeout", bool(trap_on_timeout)), ("block_bytes", block_bytes),
        ("dp_min_rows", dp_min_rows), ("use_symmetric_memory", bool(use_symmetric_memory))],
        "create_dp_sampling_comm", local_error)
    comm = DPSamplingComm()
    comm.group, comm.rank, comm.world_size = group, dist.get_rank(group), world
    comm.device, comm.dtype = device, dtype
    comm.max_rows, comm.vocab_size, comm.shard_width = max_rows, vocab_size, shard_width
    comm.slots, comm.max_top_n = slots, max_top_n
    comm.timeout_ms, comm.trap_on_timeout = timeout_ms, bool(trap_on_timeout)
    comm.block_bytes, comm.dp_min_rows = block_bytes, dp_min_rows
    _finish_layout(comm)

    cuda = device.type == "cuda"
    ext = cuda and _library.extension_available()
    tri = cuda and _triton_importable()
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401,F811
        symm_ok = True
    except Exception:
        symm_ok = False
    can_symm = bool(cuda and use_symmetric_memory and symm_ok)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1
    r1 = _agree_min(group, device, [can_symm, ext, min(MAX_BLOCKS, sms), tri])
    can_symm, comm.extension, comm.max_blocks = bool(r1[0]), bool(r1[1]), int(r1[2])
    comm.triton = bool(r1[3])
    ok, delta, bases = False, 0, []
    if can_symm:
        try:
            from torch.distributed import _symmetric_memory as symm_mem
            with torch.cuda.device(device):
                symm = symm_mem.empty(comm.total_bytes, dtype=torch.uint8, device=device)
                symm.zero_()
                torch.cuda.synchronize(device)
                handle = _rendezvous(symm, group)
            ptrs = [int(p) for p in handle.buffer_ptrs]
            delta = symm.data_ptr() - ptrs[comm.rank]
            bases = [p + delta if p else 0 for p in ptrs]
            ok = len(bases) == world and all(b != 0 and b % 16 == 0 for b in bases)
            if ok:
                comm.symm, comm.handle = symm, handle
        except Exception as e:  # no P2P / multi-node / backend without symmetric memory
            ok = False
            warnings.warn(f"create_dp_sampling_comm: symmetric memory unavailable on rank "
                          f"{comm.rank} ({type(e).__name__}: {e}); using the NCCL path",
                          RuntimeWarning, stacklevel=2)
    r2 = _agree_min(group, device, [ok, delta, -delta])
    comm.p2p = bool(r2[0]) and r2[1] == -r2[2]
    if comm.p2p:
        _set_tables(comm, bases)
    else:
        comm.symm, comm.handle = None, None
    return comm


def _set_tables(comm: DPSamplingComm, bases: Sequence[int]) -> None:
    comm.peer_flags = [int(b) for b in bases]
    comm.peer_recv = [b + FLAG_BYTES for b in comm.peer_flags]
    comm.peer_res = [b + comm.res_base for b in comm.peer_flags]
    comm.state = torch.zeros(STATE_WORDS, dtype=torch.int64, device=comm.device)
    # the Triton kernels take the tables as device tensors (built here, outside any capture)
    dev = comm.device
    comm.peer_flags_dev = torch.tensor(comm.peer_flags, dtype=torch.int64, device=dev)
    comm.peer_res_dev = torch.tensor(comm.peer_res, dtype=torch.int64, device=dev)
    comm.peer_recv_dev = [torch.tensor([p + k * comm.recv_bytes for p in comm.peer_recv],
                                       dtype=torch.int64, device=dev)
                          for k in range(comm.slots)]
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _triton_importable() -> bool:
    import importlib
    try:
        importlib.import_module("triton")
        return True
    except Exception:
        return False


def create_virtual_dp_comms(world: int, *, max_rows: int, vocab_size: int, dtype: torch.dtype,
                            shard_width: Optional[int] = None, device=None, slots: int = 1,
                            timeout_ms: int = DEFAULT_TIMEOUT_MS,
                            block_bytes: int = DEFAULT_BLOCK_BYTES) -> List[DPSamplingComm]:
    """Testing: ``world`` virtual ranks on ONE GPU, each with its own workspace, wired to each
    other exactly as symmetric memory wires real ranks (peer pointer tables). Drive rank r's
    calls on its own stream (all grids must be co-resident); only the 'cuda' and 'triton'
    backends work. ``device="cpu"``: CPU workspaces for the Triton kernels under
    ``TRITON_INTERPRET=1`` (drive the simulated ranks phase by phase: ``triton_phase``)."""
    C.check(isinstance(world, int) and 1 <= world <= MAX_RANKS, "world",
            f"must be an int in [1, {MAX_RANKS}], got {world!r}")
    device = torch.device(device if device is not None else "cuda")
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    shard_width = _check_create_args(max_rows, vocab_size, dtype, shard_width, world, slots, 0,
                                     timeout_ms, block_bytes, DEFAULT_DP_MIN_ROWS)
    comms = []
    for r in range(world):
        c = DPSamplingComm()
        c.virtual = True
        c.rank, c.world_size, c.device, c.dtype = r, world, device, dtype
        c.max_rows, c.vocab_size, c.shard_width = max_rows, vocab_size, shard_width
        c.slots, c.max_top_n = slots, 0
        c.timeout_ms, c.trap_on_timeout = timeout_ms, False
        c.block_bytes, c.dp_min_rows = block_bytes, DEFAULT_DP_MIN_ROWS
        c.extension = cuda and _library.extension_available()
        c.triton = _triton_importable()
        # every rank's swap grid must be resident at once on the one GPU: at most one CTA
        # per SM over all ranks (CPU, interpreted: programs run one after the other)
        sms = (torch.cuda.get_device_properties(device).multi_processor_count if cuda
               else MAX_BLOCKS * world)
        c.max_blocks = max(1, min(MAX_BLOCKS, sms // world))
        _finish_layout(c)
        c.symm = torch.zeros(c.total_bytes, dtype=torch.uint8, device=device)
        c.p2p = True
        comms.append(c)
    bases = [c.symm.data_ptr() for c in comms]
    for c in comms:
        _set_tables(c, bases)
    return comms


# ---------------------------------------------------------------------------------------------
# backend choice, validation
# ---------------------------------------------------------------------------------------------
def select_backend(comm: DPSamplingComm, backend: str = "auto") -> str:
    """``"copy"`` (one rank) | ``"cuda"`` | ``"triton"`` | ``"nccl"`` | ``"reference"``.
    ``auto``: cuda when the symmetric workspace is mapped and the extension loads on every rank,
    else nccl. ``auto`` never picks triton (triton/dp.py; its GPU runs so far, listed in
    docs/COMM.md, do not yet cover uneven shapes); name it explicitly (needs the P2P workspace
    and triton on every rank). Depends only on values agreed
    at creation, so every rank picks the same."""
    if backend not in BACKENDS:
        C.check(False, "backend", f"must be one of {BACKENDS}, got {backend!r}")
    if comm.world_size == 1 and backend in ("auto", "cuda", "triton", "nccl"):
        return "copy"
    if backend == "auto":
        return "cuda" if (comm.p2p and comm.extension) else "nccl"
    if backend == "cuda":
        C.check(comm.p2p, "backend", "'cuda' needs the symmetric P2P workspace, which this "
                "communicator does not have (multi-node group, no peer access, CPU, or symmetric "
                "memory unavailable): use 'nccl' or 'auto'")
        if not comm.extension:
            _library.require("tokenspeed_kernel.ops.swap_vocab_to_batch(backend='cuda')")
    if backend == "triton":
        C.check(comm.p2p, "backend", "'triton' needs the symmetric P2P workspace, which this "
                "communicator does not have (multi-node group, no peer access, CPU, or symmetric "
                "memory unavailable): use 'nccl' or 'auto'")
        C.check(getattr(comm, "triton", False), "backend",
                "'triton' needs triton importable (and CUDA) on every rank")
    if backend in ("nccl", "reference"):
        C.check(not comm.virtual, "backend", f"{backend!r} needs a process group (virtual "
                "ranks only run the 'cuda' backend)")
    return backend


def select_route(comm: DPSamplingComm, rows: int) -> str:
    """The policy of ``sample_from_shards``: ``"dp"`` (swap + sample this rank's rows + gather)
    for ``rows >= comm.dp_min_rows``, else ``"all_gather"`` (every rank gathers the logits and
    samples the whole batch). Override with ``create_dp_sampling_comm(dp_min_rows=...)``."""
    return "dp" if comm.world_size > 1 and rows >= comm.dp_min_rows else "all_gather"


def _check_shard(comm: DPSamplingComm, x, name: str = "logits_shard") -> None:
    if not isinstance(comm, DPSamplingComm):
        C.check(False, "comm", f"must come from create_dp_sampling_comm, got {type(comm)}")
    if comm.closed:
        C.check(False, "comm", "is closed (close() was called): create a new communicator")
    C.check(isinstance(x, torch.Tensor), name, f"must be a torch.Tensor, got {type(x)}")
    C.check(x.dim() == 2, name, f"must be 2-D [rows, shard_width], got shape {tuple(x.shape)}")
    C.check(x.dtype == comm.dtype, name, f"dtype must be {comm.dtype} (the communicator's), "
            f"got {x.dtype}")
    C.check(x.device == comm.device, name, f"must be on {comm.device}, got {x.device}")
    C.check(x.shape[1] == comm.shard_width, name,
            f"must have shard_width={comm.shard_width} columns, got {x.shape[1]}")
    C.check(x.shape[0] <= comm.max_rows, name,
            f"has {x.shape[0]} rows, more than the communicator's max_rows={comm.max_rows}")
    C.check(x.shape[1] <= 1 or x.stride(1) == 1, name,
            f"last dimension must be contiguous (stride 1), got strides {x.stride()}")


# ---------------------------------------------------------------------------------------------
# the swap
# ---------------------------------------------------------------------------------------------
def _num_blocks(comm: DPSamplingComm, rows_per_rank: int) -> int:
    nbytes = rows_per_rank * comm.shard_width * comm.element_size
    return max(1, min(comm.max_blocks, _cdiv(nbytes, comm.block_bytes)))


def _swap_cuda(comm, x, rows_per_rank: int, slot: int) -> torch.Tensor:
    torch.ops.tokenspeed_kernel.dp_swap(
        x, comm.state, comm.symm, [p + slot * comm.recv_bytes for p in comm.peer_recv],
        comm.peer_flags, comm.rank, comm.recv_bytes, comm.row_bytes, rows_per_rank,
        _num_blocks(comm, rows_per_rank), F_TRAP if comm.trap_on_timeout else 0,
        comm.timeout_ms * 1_000_000)
    start, n = _range(x.shape[0], rows_per_rank, comm.rank)
    off = FLAG_BYTES + slot * comm.recv_bytes
    elt = comm.element_size
    pitch = comm.row_bytes // elt
    buf = comm.symm[off: off + comm.recv_bytes].view(comm.dtype)
    return buf.as_strided((n, comm.vocab_size), (pitch, 1))


def _swap_triton(comm, x, rows_per_rank: int, slot: int) -> torch.Tensor:
    from ..triton import dp as tri
    C.check(rows_per_rank * comm.world_size >= x.shape[0] and rows_per_rank <= comm.rows_cap,
            "logits_shard", f"{rows_per_rank} rows per rank do not fit the swap buffer "
            f"({comm.rows_cap} rows)")
    nb = _num_blocks(comm, rows_per_rank)
    sig = swap_signature(SIG_DP_SWAP_TRITON, x.shape[0], rows_per_rank,
                         x.shape[1] * comm.element_size, comm.row_bytes, slot, nb,
                         comm.world_size)
    tri.swap(x, comm.peer_recv_dev[slot], comm.peer_flags_dev, comm.state, comm.rank,
             comm.row_bytes, rows_per_rank, nb, comm.timeout_ms * 1_000_000,
             phase=comm.triton_phase, max_spins=comm.triton_max_spins, sig=sig, slot=slot)
    start, n = _range(x.shape[0], rows_per_rank, comm.rank)
    off = FLAG_BYTES + slot * comm.recv_bytes
    pitch = comm.row_bytes // comm.element_size
    buf = comm.symm[off: off + comm.recv_bytes].view(comm.dtype)
    return buf.as_strided((n, comm.vocab_size), (pitch, 1))


def _range(rows: int, rows_per_rank: int, rank: int) -> Tuple[int, int]:
    start = min(rows, rank * rows_per_rank)
    return start, max(0, min(rows_per_rank, rows - start))


def _swap_nccl(comm, x, rows_per_rank: int) -> torch.Tensor:
    import torch.distributed as dist
    W, w = comm.world_size, comm.shard_width
    rows = x.shape[0]
    if rows == W * rows_per_rank and x.is_contiguous():
        inp = x
    else:
        inp = torch.zeros((W * rows_per_rank, w), dtype=x.dtype, device=x.device)
        inp[:rows].copy_(x)
    recv = torch.empty((W, rows_per_rank, w), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv.view(W * rows_per_rank, w), inp, group=comm.group)
    _, n = _range(rows, rows_per_rank, comm.rank)
    full = recv.permute(1, 0, 2).reshape(rows_per_rank, W * w)
    return full[:n, :comm.vocab_size]


def _swap_reference(comm, x, rows_per_rank: int) -> torch.Tensor:
    import torch.distributed as dist
    parts = [torch.empty_like(x) for _ in range(comm.world_size)]
    dist.all_gather(parts, x.contiguous(), group=comm.group)
    full = torch.cat(parts, dim=1)[:, :comm.vocab_size]
    start, n = _range(x.shape[0], rows_per_rank, comm.rank)
    return full[start:start + n].clone()


def _swap(comm, x, rows_per_rank: int, slot: int, backend: str) -> torch.Tensor:
    if backend == "copy":
        return x[:, :comm.vocab_size]
    if backend == "cuda":
        return _swap_cuda(comm, x, rows_per_rank, slot)
    if backend == "triton":
        return _swap_triton(comm, x, rows_per_rank, slot)
    if backend == "nccl":
        return _swap_nccl(comm, x, rows_per_rank)
    return _swap_reference(comm, x, rows_per_rank)


def swap_vocab_to_batch(comm: DPSamplingComm, logits_shard: torch.Tensor, *, slot: int = 0,
                        backend: str = "auto") -> torch.Tensor:
    """``[B, shard_width]`` on every rank -> this rank's whole rows ``[n, V]`` (collective).

    Rank ``d`` gets rows ``comm.row_range(B)`` = ``[d Bl, d Bl + n)`` of the virtual
    ``[B, V]`` logits (``Bl = ceil(B / W)``; ``n < Bl`` or 0 on the last ranks when ``W`` does
    not divide ``B``: padding is never materialized, so nothing can sample it). Columns are
    ``[0, V)``: the shards' columns at or past V are dropped.

    The CUDA and Triton backends return a view of the communicator's swap buffer ``slot`` (row
    stride
    ``comm.row_bytes``): valid for all work enqueued on this rank's stream before the next swap
    into the same slot. Do not write into it. Other backends return fresh tensors. Every rank
    must pass the same B and slot: the CUDA and Triton swaps compare call signatures before they
    push anything and record a mismatch (``comm.check()`` raises ``CommError`` on every rank).
    CUDA-graph safe (fixed addresses, device call counter).
    """
    _check_shard(comm, logits_shard)
    C.check(isinstance(slot, int) and 0 <= slot < comm.slots, "slot",
            f"must be an int in [0, {comm.slots}), got {slot!r}")
    b = select_backend(comm, backend)
    return _swap(comm, logits_shard, comm.rows_per_rank(logits_shard.shape[0]), slot, b)


# ---------------------------------------------------------------------------------------------
# the results gather
# ---------------------------------------------------------------------------------------------
def _res_layout(comm, outs: Sequence[torch.Tensor], per_rank: int) -> List[int]:
    """Byte offset of each field's region in a results buffer (W sections of ``per_rank`` items,
    16-byte aligned), shared by the CUDA and Triton gathers; checks that the call fits."""
    offs, off = [], 0
    for o in outs:
        offs.append(off)
        off = _up(off + comm.world_size * per_rank * o[0].numel() * o.element_size(), 16)
    C.check(off <= comm.res_bytes, "comm",
            f"the results of this call ({off} bytes) exceed the communicator's results buffer "
            f"({comm.res_bytes} bytes): create it with a larger max_rows / max_top_n")
    return offs


def _gather(comm, fields: Sequence[torch.Tensor], items: int, per_rank: int, backend: str,
            shapes: Sequence[Tuple[int, ...]], dtypes) -> List[torch.Tensor]:
    """Every rank's ``fields`` (this rank's ``n`` items each) -> ``[items, ...]`` on every rank."""
    outs = [torch.empty((items,) + tuple(s), dtype=dt, device=comm.device)
            for s, dt in zip(shapes, dtypes)]
    if items == 0:
        return outs
    if backend == "copy":
        for o, f in zip(outs, fields):
            o.copy_(f)
        return outs
    if backend == "cuda":
        offs = _res_layout(comm, outs, per_rank)
        torch.ops.tokenspeed_kernel.dp_gather(
            [f.contiguous() for f in fields], outs, comm.state, comm.symm, comm.peer_res,
            comm.peer_flags, offs, comm.rank, comm.res_bytes, items, per_rank,
            F_TRAP if comm.trap_on_timeout else 0, comm.timeout_ms * 1_000_000)
        return outs
    if backend == "triton":
        _gather_triton(comm, fields, outs, items, per_rank)
        return outs
    W = comm.world_size
    for o, f in zip(outs, fields):
        pad = torch.zeros((per_rank,) + tuple(f.shape[1:]), dtype=f.dtype, device=f.device)
        pad[: f.shape[0]].copy_(f)
        allv = torch.empty((W * per_rank,) + tuple(f.shape[1:]), dtype=f.dtype, device=f.device)
        if f.dtype == torch.bool:  # (gloo / NCCL all-gather of bool: move bytes)
            _ag_single()(allv.view(torch.uint8), pad.view(torch.uint8), group=comm.group)
        else:
            _ag_single()(allv, pad, group=comm.group)
        o.copy_(allv[:items])
    return outs


def _gather_triton(comm, fields, outs, items: int, per_rank: int) -> None:
    """The Triton results gather: the CUDA gather's layout (fields' regions at 16-byte aligned
    offsets of a results buffer) and flags. The fields' address table is written per call by a
    small kernel (CUDA-graph safe)."""
    from ..triton import dp as tri
    offs = _res_layout(comm, outs, per_rank)
    C.check(len(fields) <= MAX_FIELDS, "fields", f"at most {MAX_FIELDS} fields")
    _, n = _range(items, per_rank, comm.rank)
    for f, o in zip(fields, outs):
        C.check(f.shape[0] == n and f.dtype == o.dtype and f.shape[1:] == o.shape[1:], "fields",
                f"this rank's field must be [{n}, ...] of {o.dtype}, got {tuple(f.shape)} "
                f"{f.dtype}")
    sig = gather_signature(items, per_rank, comm.world_size,
                           [o[0].numel() * o.element_size() for o in outs], offs)
    tri.gather([f.contiguous() for f in fields], outs, offs, comm.peer_res_dev,
               comm.peer_flags_dev, comm.state, comm.rank, comm.res_bytes, items, per_rank,
               comm.timeout_ms * 1_000_000, phase=comm.triton_phase,
               max_spins=comm.triton_max_spins, sig=sig)


# ---------------------------------------------------------------------------------------------
# dp_sample / dp_verify
# ---------------------------------------------------------------------------------------------
def _slice(t, start: int, n: int):
    return None if t is None else t[start:start + n]


def dp_sample(comm: DPSamplingComm, logits_shard: torch.Tensor, seed, offset, *,
              temperature=None, top_k=None, top_p=None, min_p=None, logprobs: bool = False,
              out_dtype: torch.dtype = torch.int64, backend: str = "auto",
              sample_backend: str = "auto", validate: bool = True) -> DPOutput:
    """Sample the whole batch from vocab-sharded logits; every rank gets every token.

    Same parameters as ``ops.sample`` (per request = per row here: ``[B]`` tensors or Python
    scalars), given for the WHOLE batch on every rank (each rank slices its rows). Returns
    ``DPOutput(tokens [B], valid [B], logprobs, processed_logprobs)`` (logprobs only with
    ``logprobs=True``), bit-identical to ``ops.sample`` / ``ops.sample_with_logprobs`` on the
    all-gathered ``[B, V]`` logits. ``backend`` moves the data (see module doc);
    ``sample_backend`` samples this rank's rows ("auto" | "cuda" | "triton" | "reference").
    Parameter values are checked once before anything is communicated (``validate``; one host
    sync; skipped under capture / compile). Three launches on the CUDA path: swap, sampler,
    results gather.
    """
    _check_shard(comm, logits_shard)
    C.check(isinstance(logprobs, bool), "logprobs", f"must be a bool, got {logprobs!r}")
    if out_dtype not in (torch.int64, torch.int32):
        C.check(False, "out_dtype", f"must be torch.int64 or torch.int32, got {out_dtype}")
    rows = logits_shard.shape[0]
    dev = logits_shard.device
    params = C.sampling_params(rows, dev, seed, offset, temperature, top_k, top_p, min_p)
    if validate and not C.is_tracing() and rows > 0:
        params.check_values()
    b = select_backend(comm, backend)
    sb = C.pick_backend(sample_backend, dev, "sample", arg="sample_backend")
    per_rank = comm.rows_per_rank(rows)
    view = _swap(comm, logits_shard, per_rank, 0, b)
    start, n = comm.row_range(rows)
    if n > 0:
        tok, valid, lp, plp = S.run_prepared(view, params.slice(start, n), 1, out_dtype, sb,
                                     S.param_flags(params), logprobs)
    else:
        tok = torch.empty(0, dtype=out_dtype, device=dev)
        valid = torch.empty(0, dtype=torch.bool, device=dev)
        lp = plp = torch.empty(0, dtype=torch.float32, device=dev) if logprobs else None
    fields = [tok, valid] + ([lp, plp] if logprobs else [])
    dts = [out_dtype, torch.bool] + ([torch.float32, torch.float32] if logprobs else [])
    outs = _gather(comm, fields, rows, per_rank, b, [()] * len(fields), dts)
    return DPOutput(*outs) if logprobs else DPOutput(outs[0], outs[1])


def dp_verify(comm: DPSamplingComm, target_shard: torch.Tensor, draft_token_ids: torch.Tensor,
              seed, offset, *, num_draft=None, draft_shard: Optional[torch.Tensor] = None,
              mode: str = "probabilistic", temperature=None, top_k=None, top_p=None, min_p=None,
              logprobs: bool = False, out_dtype: torch.dtype = torch.int64,
              backend: str = "auto", verify_backend: str = "auto",
              validate: bool = True) -> DPVerifyOutput:
    """Speculative verify of the whole batch from vocab-sharded logits (padded chain form).

    ``target_shard`` ``[bs * (n + 1), shard_width]`` (request i's rows ``i (n + 1) + j``),
    ``draft_token_ids`` ``[bs, n]`` (-1 padding, or ``num_draft``), ``draft_shard``
    ``[bs * n, shard_width]`` (probabilistic mode; needs ``slots >= 2``). A request's positions
    stay together on one rank: rank d verifies requests ``comm.row_range(bs)``. Returns
    ``DPVerifyOutput(tokens [bs, n + 1], num_accepted [bs], valid [bs], logprobs,
    processed_logprobs)`` on every rank, bit-identical to ``ops.verify`` /
    ``ops.verify_with_logprobs`` on the all-gathered logits. Parameter checks run on this rank's
    requests, after the swap (``validate``; the swap itself checks only shapes).
    """
    import importlib
    Vf = importlib.import_module("tokenspeed_kernel.ops.verify")
    _check_shard(comm, target_shard, "target_shard")
    C.check(isinstance(draft_token_ids, torch.Tensor) and draft_token_ids.dim() == 2,
            "draft_token_ids", "must be a 2-D tensor [bs, n] (padded form)")
    bs, n_d = draft_token_ids.shape
    C.check(target_shard.shape[0] == bs * (n_d + 1), "target_shard",
            f"must have bs * (n + 1) = {bs * (n_d + 1)} rows, got {target_shard.shape[0]}")
    if draft_shard is None and mode == "probabilistic":
        C.check(False, "draft_shard", "is required in mode='probabilistic' (use mode='ngram' "
                "for drafts without a distribution)")
    if draft_shard is not None:
        _check_shard(comm, draft_shard, "draft_shard")
        C.check(draft_shard.shape[0] == bs * n_d, "draft_shard",
                f"must have bs * n = {bs * n_d} rows, got {draft_shard.shape[0]}")
        C.check(comm.slots >= 2, "draft_shard", "needs a communicator created with slots >= 2 "
                "(the target and draft views are alive together)")
    b = select_backend(comm, backend)
    dev = target_shard.device
    params = C.sampling_params(bs, dev, seed, offset, temperature, top_k, top_p, min_p)
    if num_draft is not None:
        num_draft = C.as_param(num_draft, "num_draft", bs, torch.int64, dev, allow_none=False)
    per_req = comm.rows_per_rank(bs)
    if per_req * (n_d + 1) > comm.rows_cap:
        C.check(False, "target_shard",
                f"{bs} requests of {n_d + 1} positions put {per_req * (n_d + 1)} rows on a rank, "
                f"more than the communicator holds ({comm.rows_cap}): dp_verify needs max_rows >= "
                f"W * ceil(bs / W) * (n + 1) = {comm.world_size * per_req * (n_d + 1)}")
    tview = _swap(comm, target_shard, per_req * (n_d + 1), 0, b)
    dview = _swap(comm, draft_shard, per_req * n_d, 1, b) if draft_shard is not None else None
    start, n = comm.row_range(bs)
    W1 = n_d + 1
    if n > 0:
        fn = Vf.verify_with_logprobs if logprobs else Vf.verify
        mine = params.slice(start, n)
        res = fn(tview, draft_token_ids[start:start + n], mine.seed, mine.offset,
                 num_draft=_slice(num_draft, start, n), draft_logits=dview, mode=mode,
                 **mine.filters(), max_num_draft=n_d, out_dtype=out_dtype,
                 backend=verify_backend, validate=validate)
        fields = [res.tokens, res.num_accepted, res.valid]
        if logprobs:
            fields += [res.logprobs, res.processed_logprobs]
    else:
        fields = [torch.empty((0, W1), dtype=out_dtype, device=dev),
                  torch.empty(0, dtype=out_dtype, device=dev),
                  torch.empty(0, dtype=torch.bool, device=dev)]
        if logprobs:
            fields += [torch.empty((0, W1), dtype=torch.float32, device=dev)] * 2
    shapes = [(W1,), (), ()] + ([(W1,), (W1,)] if logprobs else [])
    dts = [out_dtype, out_dtype, torch.bool] + ([torch.float32] * 2 if logprobs else [])
    outs = _gather(comm, fields, bs, per_req, b, shapes, dts)
    return DPVerifyOutput(*outs) if logprobs else DPVerifyOutput(outs[0], outs[1], outs[2])


def sample_from_shards(comm: DPSamplingComm, logits_shard: torch.Tensor, seed, offset, *,
                       route: str = "auto", **kw) -> DPOutput:
    """Tokens of the whole batch from vocab-sharded logits, by the route ``select_route`` picks
    (``route="auto"``) or the one named: ``"dp"`` (``dp_sample``) or ``"all_gather"``
    (``torch.distributed`` all-gather of the shards, then ``ops.sample`` of the whole batch on
    every rank; the same tokens). Keyword arguments as ``dp_sample``."""
    C.check(route in ("auto", "dp", "all_gather"), "route",
            f"must be 'auto', 'dp' or 'all_gather', got {route!r}")
    _check_shard(comm, logits_shard)
    if route == "auto":
        route = select_route(comm, logits_shard.shape[0])
    if route == "dp":
        return dp_sample(comm, logits_shard, seed, offset, **kw)
    logprobs = kw.pop("logprobs", False)
    kw.pop("backend", None)
    sb = kw.pop("sample_backend", "auto")
    if comm.world_size > 1:
        C.check(not comm.virtual, "route", "'all_gather' needs a process group")
        W, w = comm.world_size, comm.shard_width
        allv = torch.empty((W, logits_shard.shape[0], w), dtype=comm.dtype, device=comm.device)
        _ag_single()(allv.view(-1, w), logits_shard.contiguous(), group=comm.group)
        full = allv.permute(1, 0, 2).reshape(logits_shard.shape[0], W * w)[:, :comm.vocab_size]
    else:
        full = logits_shard[:, :comm.vocab_size]
    if logprobs:
        o = S.sample_with_logprobs(full, seed, offset, backend=sb, **kw)
        return DPOutput(o.tokens, o.valid, o.logprobs, o.processed_logprobs)
    o = S.sample(full, seed, offset, backend=sb, **kw)
    return DPOutput(o.tokens, o.valid)


def _register_library() -> None:
    """Fake kernels of the DP comm ops (out-variants: nothing to allocate)."""
    import torch.library as L

    @L.register_fake("tokenspeed_kernel::dp_swap")
    def _fake_swap(x, state, symm, peer_recv, peer_flags, rank, recv_bytes, row_bytes,
                   rows_per_rank, num_blocks, flags, timeout_ns):
        return None

    @L.register_fake("tokenspeed_kernel::dp_gather")
    def _fake_gather(src, out, state, symm, peer_res, peer_flags, res_off, rank, res_bytes,
                     items, items_per_rank, flags, timeout_ns):
        return None
