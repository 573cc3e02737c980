"""Tensor-parallel all-gather along the hidden / vocab dimension for small token counts.

Each rank ``r`` of a process group holds ``x[T, w_r]``; every rank gets ``y[T, H]``
(``H = sum(w)``) with rank ``r``'s slice at column offset ``w_0 + ... + w_{r-1}``. Bit-exact on
every backend (it is a copy). Executable spec: ``tokenspeed_kernel.reference.comm``; protocol,
multicast gate and auto policy: ``docs/COMM.md``.

Usage::

    comm = create_all_gather_comm(group, max_tokens=512, max_total_width=151936,
                                  dtype=torch.bfloat16)          # once, outside graph capture
    y = all_gather_hidden(comm, x)                               # even widths: H = W * x.shape[1]
    all_gather_hidden_out(comm, x, out, widths=[4096, 3072])     # uneven widths, caller's output

Backends (``backend=``): ``"cuda"`` (P2P push kernel, csrc/comm), ``"triton"`` (the same push in
Triton), ``"nccl"`` (``all_gather_into_tensor`` + permute over the group's own backend: NCCL on
GPU, gloo on CPU), ``"reference"`` (``torch.distributed.all_gather`` + cat), ``"multimem"``
(multicast push; only when the communicator was created with ``allow_multimem=True`` *and* the
multicast gate passed on every rank) and ``"auto"`` (see ``select_backend``). Every rank of a
call must pass the same arguments (T, widths, backend); ``auto`` decides from values agreed at
creation, so it picks the same backend on every rank. The P2P backends check it on the device:
each call carries a signature of its arguments (``all_gather_signature``) in a header word that
every peer compares, so ranks that call with different arguments get ``CommError`` (never a
result mixed from different layouts); see docs/COMM.md ("Per-call mismatches").
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .. import _library
from . import _common as C

# ---- mirrors of csrc/comm/all_gather_hidden.cuh (tests/test_comm.py checks they agree) ----
MAX_RANKS = 16
MAX_BLOCKS = 256
READY_OFFSET = MAX_BLOCKS * MAX_RANKS      # uint64 words
TRITON_FLAG_OFFSET = 2 * READY_OFFSET      # uint64 words: the Triton kernel's data flags
HEADER_OFFSET = 3 * READY_OFFSET           # uint64 words: call headers [2 parities][block][rank]
FLAG_BYTES = 5 * READY_OFFSET * 8
STATE_WORDS = 16
STATE_SEQ, STATE_ERR, STATE_ERR_BLOCK, STATE_ERR_SRC, STATE_ERR_EPOCH, STATE_DONE = 0, 1, 2, 3, 4, 8
# mismatch details (kAgStateErrSig ..): both signatures, this rank's T, width and H (16-byte
# vectors), (kernel kind << 16) | its SIG_FLAGS bits
STATE_ERR_SIG, STATE_ERR_PEER_SIG, STATE_ERR_ROWS = 5, 6, 7
STATE_ERR_WIDTH, STATE_ERR_TOTAL, STATE_ERR_VARIANT = 9, 10, 11
ERR_TIMEOUT_DATA, ERR_TIMEOUT_READY, ERR_MISMATCH = 1, 2, 3
F_MULTIMEM, F_VIEW, F_TRAP, F_LL, F_NOPIPE, F_PDL = 1, 2, 4, 8, 16, 32
F_LL4, F_LL_PAIRED = 64, 128  # LL packing: 4-byte packets (small outputs); paired: testing only
SIG_FLAGS = F_MULTIMEM | F_VIEW | F_LL | F_NOPIPE | F_LL4 | F_LL_PAIRED  # kAgSigFlags
# kernel kinds of the call signatures (csrc/comm/call_signature.h kSig*)
SIG_ALL_GATHER_CUDA, SIG_ALL_GATHER_TRITON = 1, 2
SIG_DP_SWAP_CUDA, SIG_DP_SWAP_TRITON, SIG_DP_GATHER = 3, 4, 5
# Testing / A-B knob (flag protocol, copy-out calls): the unpipelined kernel
# (all_gather_hidden_kernel) even where a CTA's chunk spans several rounds. Every rank must set
# it alike. (Pipelined rounds of 60 KiB and 15 KiB were measured slower than 30 KiB -- 70.6 and
# 70.2 vs 68.5 us at bf16 T = 128 x 151936 -- and removed.)
_UNPIPELINED_FLAG_KERNEL_FOR_TESTING = False
# Testing / A-B knob (LL protocol): None = the library's choice by size (ll_packing); "w6" /
# "w4" force the 6-byte-packet kernel (4/3 of the data on the wire) / the 4-byte-packet one (2x);
# "w4pair" = the 4-byte kernel with a vector's two LL units side by side (the first LL kernel's
# layout, measured 1.1-1.7x slower from 115 KB on). Every rank must set it alike.
_LL_VARIANT_FOR_TESTING: Optional[str] = None
_LL_VARIANT_FLAGS = {"w6": 0, "w4": F_LL4, "w4pair": F_LL4 | F_LL_PAIRED}
PROTOCOLS = ("auto", "ll", "flag")

BACKENDS = ("auto", "cuda", "triton", "nccl", "reference", "multimem")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Any of these, set on any rank, turns the multicast path off (read only; never modified here).
MULTICAST_DISABLE_ENV = (("NCCL_NVLS_ENABLE", "0"),
                         ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                         ("NVSHMEM_DISABLE_NVLS", "1"))

# ---- auto-policy knobs (measured on 2x H200: bench/results/h200/comm_*, docs/COMM.md) ----
# Output bytes (T * H * element size) above which auto uses NCCL + permute instead of the P2P
# push. Measured: the push beat NCCL + permute at every size up to 311 MB (T = 512 of an fp32
# 151936-wide row, 2x H200); no crossover inside that range, so the cap is a guard.
DEFAULT_P2P_MAX_BYTES = 1 << 30
# Bytes of the widest slice pushed per CTA (grid = ceil(slice bytes / this), capped by SMs).
# Measured on 2x H200 (bench/lab/tools/comm_sweep.py, block_bytes 2-16 KiB): 4 KiB is the fastest or
# within 0.15 us of it wherever auto uses the protocol (LL up to the LL crossover, flag above);
# 16 KiB (the earlier default) was up to 1.0 us slower at T = 8 / 32 (too few CTAs storing over
# NVLink). LL beyond its crossover wants even more CTAs (fp32 T = 1 row: 6.0 us at 2 KiB, 7.1 at
# 4 KiB), which auto does not use.
DEFAULT_BLOCK_BYTES = 4 << 10
DEFAULT_TIMEOUT_MS = 30_000
# Output bytes (T * H * element size) up to which the CUDA backend uses the LL protocol (packets
# stamped with the call: one NVLink trip, no barrier, 4/3 or 2x the bytes) instead of the flag
# protocol (push, release/acquire flag round trip, copy-out). It also sizes the LL region
# (2 parities x (2 x min(this, buffer) + 1 KiB) bytes). Crossover: bench/results/<gpu>/comm_*
# (COMM.md).
# Until 0fa8497 (4-byte packets, a vector's two units side by side), on 2x H200 (bench/lab/tools/comm_sweep.py
# at block_bytes 4 KiB, pipelined flag kernel): LL won at 14-115 KB and lost from 304 KB; the
# crossover was 192 KiB (320 KiB at d80a34b, 16 KiB blocks).
# dc36166 (6-byte packets in planes, 4/3 of the data on the wire; 2x H100,
# bench/results/h100/comm_sweep_ll6.csv): LL won up to 2.75 MB and lost at 3.65 MB.
# Since 9ad4c0f (LL index math off the critical path; 2x H200, bench/lab/tools/ag_micro.cu with PDL,
# bench/results/h200/comm_micro_s23.csv): LL wins at 2.75 / 3.67 / 4.59 MB of H = 7168 bf16
# (7.94 vs 8.65, 9.81 vs 10.17, 11.71 vs 11.88 us) and at 3.6 MB of a bf16 / fp32 vocab row
# (9.79 vs 10.20, 9.78 vs 10.32), ties at 4.86 MB (12.35 vs 12.34, 12.36 vs 12.39) and loses
# from 5.5 MB (13.53 vs 13.42; 6.1 MB: 14.88 vs 14.47). Crossover set between the last win
# and the tie.
DEFAULT_LL_MAX_BYTES = 9 << 19          # 2 ranks: 4.5 MiB
# 3-4 ranks: 4x H200, d3331c0 (bench/lab/tools/comm_sweep.py --nproc 4, bench/results/h200/
# comm_sweep_tp4.csv; LL at the library's packing vs flag, us): H = 7168 bf16 LL wins up to
# 1.38 MB (10.20 vs 10.88), ties at 1.84 MB (12.53 vs 12.50; the bench: 12.3 vs 12.8) and loses
# at 2.29 MB (14.85 vs 14.28); a bf16 vocab row wins at 1.82 MB (12.48 vs 12.69) and loses at
# 2.43 MB (15.39 vs 14.66); fp32 ties at 1.82 MB (12.47 vs 12.48). Crossover set at the tie.
# (The first LL kernel, 4-byte packets side by side, lost from 115 KB on 4 ranks: 16 KiB then.)
DEFAULT_LL_MAX_BYTES_4 = 7 << 18        # 3-4 ranks: 1.75 MiB
# > 4 ranks: not measured (no 8-GPU machine lent). The crossover fell from 4.5 MiB (2 ranks) to
# 1.75 MiB (4); 16 KiB is a conservative guess (LL won at that size with every kernel and group
# measured so far), to be replaced by a run at 8 ranks.
DEFAULT_LL_MAX_BYTES_MULTI = 16 << 10
# Output bytes up to which an LL call uses the 4-byte-packet kernel instead of the 6-byte one.
# Until 8255459 the 6-byte kernel lost up to ~600 KB (2x H100 with PDL: 3.32 vs 2.75 us at 14 KB):
# its index divisions sat on the critical path (docs/COMM.md, "LL index math"). Since 9ad4c0f
# (2x H200, bench/lab/tools/ag_micro.cu, PDL, H = 7168 bf16, 4-byte vs 6-byte): 2.61 vs 2.74 us at 115 KB,
# 2.92 vs 2.98 at 229 KB, 3.11 vs 3.10 at 287 KB, 3.30 vs 3.21 at 344 KB, 3.64 vs 3.45 at 458 KB.
DEFAULT_LL4_MAX_BYTES = 256 << 10


def default_ll_max_bytes(world_size: int) -> int:
    """The default LL crossover / capacity (output bytes) for a group of ``world_size`` ranks:
    each rank stores world - 1 stamped copies (2 wire bytes per payload byte), so LL pays off
    only for smaller outputs as the group grows (docs/COMM.md, measured crossovers)."""
    if world_size <= 2:
        return DEFAULT_LL_MAX_BYTES
    return DEFAULT_LL_MAX_BYTES_4 if world_size <= 4 else DEFAULT_LL_MAX_BYTES_MULTI


class CommError(RuntimeError):
    """A device-side bounded wait gave up (a peer never arrived), or a peer joined a call with
    other arguments (T, widths, backend, ...); the communicator is unusable."""


# ---------------------------------------------------------------------------------------------
# per-call signatures (mirror of csrc/comm/call_signature.h; tests/test_comm.py compares them)
# ---------------------------------------------------------------------------------------------
def call_signature(words: Sequence[int]) -> int:
    """CRC-32 (zlib's) of ``words`` as little-endian 32-bit words (each taken modulo 2^32): the
    signature a comm kernel compares with every peer's. CRC-32 catches every difference confined
    to one word; differences in several words collide with probability ~2^-32."""
    import struct
    import zlib
    return zlib.crc32(struct.pack(f"<{len(words)}I", *[int(w) & 0xFFFFFFFF for w in words]))


def all_gather_signature(kind: int, variant: int, element_size: int, rows: int, num_blocks: int,
                         offsets: Sequence[int]) -> int:
    """Signature of one all-gather call (``ag_signature``): the kernel kind (``SIG_ALL_GATHER_*``),
    its ``SIG_FLAGS`` bits, the element size, T, the grid and the ``W + 1`` column offsets (in
    elements)."""
    world = len(offsets) - 1
    return call_signature([kind, variant, element_size, rows, num_blocks, world, *offsets])


def header_word(epoch: int, sig: int) -> int:
    """The header a rank stores for call ``epoch``: ``(epoch << 32) | sig`` as uint64."""
    return ((int(epoch) << 32) | (int(sig) & 0xFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF


def _signed32(v: int) -> int:
    """``v`` modulo 2^32 as a signed 32-bit int (a Triton kernel argument of one fixed type)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def _variant_name(word: int) -> str:
    kind, bits = word >> 16, word & 0xFFFF
    if kind == SIG_ALL_GATHER_TRITON:
        return "backend 'triton'"
    if bits & F_MULTIMEM:
        return "backend 'multimem'"
    if bits & F_VIEW:
        return "all_gather_hidden_view"
    if bits & F_LL:
        packing = "4-byte" if bits & F_LL4 else "6-byte"
        return f"backend 'cuda', protocol 'll' ({packing} packets)"
    return "backend 'cuda', protocol 'flag'" + (" (single-round kernel)" if bits & F_NOPIPE
                                                  else "")


def format_comm_error(words: Sequence[int], rank: int, timeout_ms: int,
                      element_size: int) -> Optional[str]:
    """The message of the error recorded in an all-gather state block ``words`` (None if none)."""
    err = int(words[STATE_ERR])
    if err == 0:
        return None
    blk, src, epoch = (int(words[i]) for i in (STATE_ERR_BLOCK, STATE_ERR_SRC, STATE_ERR_EPOCH))
    if err == ERR_MISMATCH:
        vec = 16 // element_size
        rows, w, h = (int(words[i]) for i in (STATE_ERR_ROWS, STATE_ERR_WIDTH, STATE_ERR_TOTAL))
        return (f"all_gather_hidden: ranks called all_gather_hidden with different arguments: "
                f"rank {src} joined call {epoch} with arguments other than this rank's (rank "
                f"{rank}: T={rows}, width {w * vec}, total width {h * vec}, "
                f"{_variant_name(int(words[STATE_ERR_VARIANT]))}; call signature "
                f"{int(words[STATE_ERR_PEER_SIG]):#010x} on rank {src}, "
                f"{int(words[STATE_ERR_SIG]):#010x} here; block {blk}). T, the widths, the dtype "
                f"and the backend / protocol of a call must be the same on every rank. The "
                f"communicator is unusable: create a new one.")
    what = {ERR_TIMEOUT_DATA: "data", ERR_TIMEOUT_READY: "ready"}.get(err, f"code {err}")
    return (f"all_gather_hidden: rank {rank} gave up after {timeout_ms} ms waiting "
            f"for the {what} flag of rank {src} (block {blk}, call {epoch}); a peer did not "
            f"join the same call (or joined it with other arguments). The communicator is "
            f"unusable: create a new one.")


# ---------------------------------------------------------------------------------------------
# the multicast gate (pure: tested without a GPU)
# ---------------------------------------------------------------------------------------------
def multicast_disabled_by_env(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Name=value of the first multicast-disabling variable set in ``environ``, else None."""
    env = os.environ if environ is None else environ
    for name, off in MULTICAST_DISABLE_ENV:
        if env.get(name, "").strip() == off:
            return f"{name}={off}"
    return None


def multimem_gate(requested: bool, multicast_ptr: int, offset_ok: bool, capability: Tuple[int, int],
                  extension: bool, environ: Optional[Mapping[str, str]] = None
                  ) -> Tuple[bool, str]:
    """This rank's vote on the multimem transport: ``(ok, reason)``.

    All of: explicit opt-in (``requested``), no disabling variable in ``environ``
    (``MULTICAST_DISABLE_ENV``), a multicast mapping from torch SymmetricMemory
    (``multicast_ptr != 0``; we never create one ourselves), the workspace at offset 0 of its
    symmetric block (``offset_ok``), sm_90+ and the compiled extension. The communicator then
    takes the MIN of the votes over all ranks, so one refusing rank refuses for the group.
    """
    if not requested:
        return False, "not requested (create_all_gather_comm(..., allow_multimem=True))"
    env = multicast_disabled_by_env(environ)
    if env is not None:
        return False, f"disabled by {env}"
    if tuple(capability) < (9, 0):
        return False, f"needs sm_90+, got sm_{capability[0]}{capability[1]}"
    if not extension:
        return False, "needs the compiled extension"
    if not multicast_ptr:
        return False, "torch SymmetricMemory reports no multicast mapping (multicast_ptr == 0)"
    if not offset_ok:
        return False, "workspace is not at offset 0 of its symmetric block"
    return True, "enabled"


# ---------------------------------------------------------------------------------------------
# the communicator
# ---------------------------------------------------------------------------------------------
def _ag_single():
    import torch.distributed as dist
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _agree_min(group, device: torch.device, values: Sequence[int]) -> List[int]:
    """Element-wise MIN over the group (one host sync; creation time only)."""
    import torch.distributed as dist
    backend = str(dist.get_backend(group))
    dev = device if (device.type == "cuda" and backend != "gloo") else torch.device("cpu")
    t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return [int(v) for v in t.tolist()]


# ---- creation-time agreement (one small collective; shared with the other communicators) ----
MAX_AGREED_ITEMS = 64
_TAG_NONE, _TAG_BOOL, _TAG_INT, _TAG_DTYPE, _TAG_FLOAT, _TAG_STR, _TAG_OTHER = range(7)


def _crc(text: str) -> int:
    import zlib
    return zlib.crc32(text.encode())


def _encode(v) -> Tuple[int, int]:
    """(tag, int64 payload) of a parameter value, decodable by ``_decode`` for None, bools,
    ints of 64 bits, torch dtypes, floats and strings of up to 7 ASCII bytes; anything else is
    compared by a hash of its repr."""
    import struct
    if v is None:
        return _TAG_NONE, 0
    if isinstance(v, bool):
        return _TAG_BOOL, int(v)
    if C.is_int(v) and -(1 << 63) <= int(v) < (1 << 63):
        return _TAG_INT, int(v)
    if isinstance(v, torch.dtype):
        return _TAG_DTYPE, _crc(str(v))
    if isinstance(v, float):
        return _TAG_FLOAT, struct.unpack("<q", struct.pack("<d", v))[0]
    if isinstance(v, str) and v.isascii() and len(v) <= 7:
        return _TAG_STR, int.from_bytes(v.encode(), "little")
    return _TAG_OTHER, _crc(f"{type(v).__qualname__}:{v!r}")


def _decode(tag: int, payload: int) -> str:
    import struct
    if tag == _TAG_NONE:
        return "None"
    if tag == _TAG_BOOL:
        return str(bool(payload))
    if tag == _TAG_INT:
        return str(payload)
    if tag == _TAG_DTYPE:
        names = {_crc(str(d)): str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
        return names.get(payload, f"<dtype {payload:#x}>")
    if tag == _TAG_FLOAT:
        return repr(struct.unpack("<d", struct.pack("<q", payload))[0])
    if tag == _TAG_STR:
        return repr(payload.to_bytes(8, "little").rstrip(b"\0").decode())
    return f"<value of hash {payload:#x}>"


def _collective_device(group, device: Optional[torch.device]) -> torch.device:
    """Where a small creation-time collective of ``group`` runs: the rank's CUDA device for a
    non-gloo group (NCCL needs CUDA tensors), else the CPU."""
    import torch.distributed as dist
    if str(dist.get_backend(group)) == "gloo":
        return torch.device("cpu")
    if device is not None and device.type == "cuda" and device.index is not None:
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_config(group, device: Optional[torch.device], items: Sequence[Tuple[str, object]],
                 what: str, local_error: Optional[BaseException] = None) -> None:
    """Check that every rank of ``group`` passed the same creation-time parameters (collective:
    every rank calls it with the same names in the same order; host-blocking; never under
    CUDA-graph capture). Run it before allocating anything.

    Parameters
    ----------
    group : the ProcessGroup (every rank of it calls this).
    device : the rank's device, or None: the collective runs on it for NCCL-style groups (CPU for
        gloo; ``_collective_device``).
    items : ``[(name, value), ...]``, at most ``MAX_AGREED_ITEMS``. Values: None, bool, int,
        torch.dtype, float, str (anything else is compared by a hash of its repr).
    what : the caller, for messages (e.g. ``"create_all_gather_comm"``).
    local_error : this rank's own argument error, if its local checks failed. Every rank still
        joins the collective, so that nobody is left waiting: the failing ranks re-raise their
        error, the others raise ``ValueError("group: ...")`` naming the failing ranks.

    Raises ``ValueError`` on every rank, with the same message, when the values differ:
    ``"<first differing name>: <what> needs the same value on every rank; got <name>: rank 0
    <v0>, rank 1 <v1>, ...; <next differing name>: ..."``.

    One all_gather of ``2 + 2 * MAX_AGREED_ITEMS`` int64 per rank: a local-check flag, a hash of
    ``what`` and the names (ranks calling with different lists are reported as such), then a
    (type tag, payload) pair per value.
    """
    import torch.distributed as dist
    items = list(items)
    if len(items) > MAX_AGREED_ITEMS:
        raise AssertionError(f"agree_config: at most {MAX_AGREED_ITEMS} items")
    names = [n for n, _ in items]
    vec = [0 if local_error is not None else 1, _crc(what + "|" + ",".join(names))]
    for _, v in items:
        vec.extend(_encode(v))
    vec.extend([0] * (2 + 2 * MAX_AGREED_ITEMS - len(vec)))
    dev = _collective_device(group, device)
    world = dist.get_world_size(group)
    t = torch.tensor(vec, dtype=torch.int64, device=dev)
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=group)
    rows = [o.tolist() for o in out]
    failed = [r for r in range(world) if rows[r][0] == 0]
    if local_error is not None:
        raise local_error
    if failed:
        raise ValueError(f"group: rank(s) {failed} refused their {what} arguments (see the error "
                         f"on those ranks); nothing was allocated")
    if any(row[1] != rows[0][1] for row in rows):
        raise ValueError(f"group: the ranks call {what} with different parameter lists "
                         f"(different library versions?)")
    diffs = []
    for k, name in enumerate(names):
        vals = [(row[2 + 2 * k], row[3 + 2 * k]) for row in rows]
        if any(v != vals[0] for v in vals):
            per_rank = ", ".join(f"rank {r} {_decode(*v)}" for r, v in enumerate(vals))
            diffs.append(f"{name}: {per_rank}")
    if diffs:
        raise ValueError(f"{diffs[0].split(':')[0]}: {what} needs the same value on every rank; "
                         f"got {'; '.join(diffs)}")


def _rendezvous(t: torch.Tensor, group):
    from torch.distributed import _symmetric_memory as symm_mem
    name = group.group_name
    try:
        return symm_mem.rendezvous(t, name)
    except RuntimeError as e:  # torch versions that still need the group registered first
        if "group" not in str(e).lower() or not hasattr(symm_mem, "enable_symm_mem_for_group"):
            raise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(name)
        return symm_mem.rendezvous(t, name)


class AllGatherComm:
    """Workspace of ``all_gather_hidden`` for one process group. Build it with
    ``create_all_gather_comm`` (a collective; host-blocking; never under CUDA-graph capture).

    Attributes (read-only): ``group, rank, world_size, device, dtype, max_tokens,
    max_total_width``; ``p2p`` (symmetric workspace mapped on every rank), ``extension`` /
    ``triton`` (backends usable on every rank), ``multimem`` and ``multimem_reason`` (the gate's
    agreed outcome), ``max_blocks``, ``block_bytes``, ``p2p_max_bytes``, ``ll_max_bytes``,
    ``timeout_ms``, ``enable_view``, ``closed``.

    Memory: ``160 KiB + (3 if enable_view else 2) * B + 4 * min(ll_max_bytes, B) + 2 KiB`` bytes of
    symmetric memory per rank (``B = max_tokens * max_total_width * elt``), plus 128 bytes of
    state.
    """

    def __init__(self):  # use create_all_gather_comm
        self.symm: Optional[torch.Tensor] = None
        self.handle = None
        self.state: Optional[torch.Tensor] = None
        self._offs_cache: Dict[Tuple[int, ...], torch.Tensor] = {}
        self.closed = False

    # -- error flag -------------------------------------------------------------------------
    def error(self) -> Optional[str]:
        """The recorded device-side error (one host sync), or None."""
        if self.state is None:
            return None
        return format_comm_error(self.state.tolist(), self.rank, self.timeout_ms,
                                 self.element_size)

    def check(self) -> None:
        """Raise ``CommError`` if a bounded wait gave up or a peer called with other arguments
        (one host sync)."""
        msg = self.error()
        if msg is not None:
            raise CommError(msg)

    @property
    def calls(self) -> int:
        """Number of completed P2P calls (device counter; one host sync)."""
        return 0 if self.state is None else int(self.state[STATE_SEQ].item())

    @property
    def element_size(self) -> int:
        esz = self.__dict__.get("_esz")
        if esz is None or self.__dict__.get("_esz_dtype") is not self.dtype:
            esz = torch.empty((), dtype=self.dtype).element_size()
            self._esz, self._esz_dtype = esz, self.dtype
        return esz

    def close(self) -> None:
        """Drop the workspace. No call may be in flight on any rank (synchronize first). Later
        calls on this communicator raise ValueError("comm: is closed ...")."""
        self.handle = None
        self.symm = None
        self._offs_cache.clear()
        self.closed = True

    def __repr__(self) -> str:
        return (f"AllGatherComm(rank={self.rank}/{self.world_size}, device={self.device}, "
                f"dtype={self.dtype}, max_tokens={self.max_tokens}, "
                f"max_total_width={self.max_total_width}, p2p={self.p2p}, "
                f"extension={self.extension}, triton={self.triton}, multimem={self.multimem})")

    # -- per-widths offset table for the Triton kernel (built outside capture) --------------
    def _offs_vec(self, offsets: Sequence[int]) -> torch.Tensor:
        key = tuple(offsets)
        t = self._offs_cache.get(key)
        if t is None:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise ValueError(
                    f"widths: the Triton backend needs one eager call with these widths before "
                    f"CUDA-graph capture (offsets {list(key)})")
            vec = 16 // self.element_size
            t = torch.tensor([o // vec for o in key], dtype=torch.int32, device=self.device)
            self._offs_cache[key] = t
        return t


def _check_create_args(group, max_tokens, max_total_width, dtype, device, timeout_ms,
                       block_bytes, p2p_max_bytes, ll_max_bytes, enable_pdl,
                       max_blocks) -> torch.device:
    """This rank's checks of create_all_gather_comm's arguments; returns the resolved device."""
    import torch.distributed as dist
    C.check(dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {dtype}")
    for name, v in (("max_tokens", max_tokens), ("max_total_width", max_total_width)):
        C.check_int(v, name, lo=1)
    C.check_int(timeout_ms, "timeout_ms", lo=0)
    C.check_int(block_bytes, "block_bytes", lo=16)
    C.check_int(p2p_max_bytes, "p2p_max_bytes", lo=0)
    C.check_int(ll_max_bytes, "ll_max_bytes", lo=0)
    C.check_type(isinstance(enable_pdl, bool), "enable_pdl", f"must be a bool, got {enable_pdl!r}")
    if max_blocks is not None:
        C.check_int(max_blocks, "max_blocks", 1, MAX_BLOCKS)
    if device is None:
        backend = str(dist.get_backend(group))
        device = (torch.device("cuda", torch.cuda.current_device())
                  if backend != "gloo" and torch.cuda.is_available() else torch.device("cpu"))
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: not a device: {device!r} ({e})") from None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    C.check(device.type in ("cuda", "cpu"), "device", f"must be a CUDA device or CPU, got {device}")
    return device


def create_all_gather_comm(group=None, *, max_tokens: int, max_total_width: int,
                           dtype: torch.dtype, device=None, enable_view: bool = False,
                           allow_multimem: bool = False, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                           trap_on_timeout: bool = False,
                           p2p_max_bytes: int = DEFAULT_P2P_MAX_BYTES,
                           block_bytes: int = DEFAULT_BLOCK_BYTES,
                           max_blocks: Optional[int] = None,
                           use_symmetric_memory: bool = True,
                           ll_max_bytes: Optional[int] = None,
                           enable_pdl: bool = False) -> AllGatherComm:
    """Create the all-gather workspace of ``group`` (collective: every rank calls it).

    Parameters
    ----------
    group : ProcessGroup or None (the default group).
    max_tokens, max_total_width : capacity: calls need ``T <= max_tokens`` and
        ``H = sum(widths) <= max_total_width``.
    dtype : bfloat16, float16 or float32 (every call uses this dtype).
    device : the rank's CUDA device (default: the current one) or CPU (NCCL-style path only).
    enable_view : also allocate a third buffer for ``all_gather_hidden_view``.
    allow_multimem : opt in to the multicast transport; it is enabled only if the gate passes on
        every rank (``multimem_gate``; see docs/COMM.md). Off by default, and no test or
        benchmark opts in.
    timeout_ms : bound of every device-side wait; after it the kernel records an error in the
        communicator (``check()`` raises ``CommError``), or traps if ``trap_on_timeout``.
        ``0`` waits forever.
    p2p_max_bytes, block_bytes, max_blocks : auto-policy crossover and grid sizing (the grid
        is capped by the smallest SM count of the group).
    use_symmetric_memory : False builds a communicator without P2P (NCCL-style path only).
    ll_max_bytes : output bytes (T * H * element size) up to which the CUDA backend's ``auto``
        protocol is LL (see ``cuda_protocol``); also the capacity of ``protocol="ll"``. 0
        disables LL. Default (None): ``default_ll_max_bytes(world_size)`` (4.5 MiB for 2 ranks,
        1.75 MiB for 3-4, 16 KiB for more). Costs
        ``4 * min(ll_max_bytes, max_tokens * max_total_width * elt) + 2 KiB`` bytes of symmetric
        memory.
    enable_pdl : default of the calls' ``enable_pdl`` (CUDA backend, sm_90+): launch the push
        kernel with programmatic dependent launch, so that it is scheduled while the previous
        kernel of the stream finishes (it still waits for that kernel's completion and memory
        before its first memory access) and lets the next PDL-launched kernel do the same.

    Every rank must pass the same values of every parameter above except ``device`` (its type
    must match) and ``allow_multimem`` (a vote: one refusing rank refuses for the group). They
    are checked with one small collective before anything is allocated (``agree_config``): a
    mismatch raises the same ``ValueError`` on every rank, naming the parameter and each rank's
    value; a rank whose own checks fail raises its error and the others raise ``ValueError``
    naming it, so that no rank is left waiting. ``group`` that is not a ProcessGroup raises
    ``TypeError``.

    Host-blocking (the agreement, symmetric allocation, rendezvous, two small all-reduces); not
    allowed under CUDA-graph capture.
    """
    import torch.distributed as dist

    C.check(dist.is_available() and dist.is_initialized(), "group",
            "torch.distributed is not initialized")
    if group is None:
        group = dist.group.WORLD
    C.check_type(isinstance(group, dist.ProcessGroup), "group",
                 f"must be a torch.distributed ProcessGroup or None, got "
                 f"{type(group).__name__} {group!r}")
    C.check(dist.get_rank(group) >= 0, "group", "this process is not a member of the group")
    world = dist.get_world_size(group)
    if ll_max_bytes is None:
        ll_max_bytes = default_ll_max_bytes(world)
    # Local checks first; a rank whose checks fail still joins the agreement below (so that no
    # peer is left waiting in it) and raises there.
    local_error, capability = None, (0, 0)
    try:
        device = _check_create_args(group, max_tokens, max_total_width, dtype, device,
                                    timeout_ms, block_bytes, p2p_max_bytes, ll_max_bytes,
                                    enable_pdl, max_blocks)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError("group: create_all_gather_comm must run outside CUDA-graph capture")
        capability = (torch.cuda.get_device_capability(device) if device.type == "cuda"
                      else (0, 0))
        C.check(not enable_pdl or capability >= (9, 0), "enable_pdl",
                f"needs a GPU of compute capability 9.0+ (programmatic dependent launch), got "
                f"{device} with {capability}")
    except (ValueError, TypeError) as e:
        local_error = e
        device = device if isinstance(device, torch.device) else None
    # Every creation-time parameter is the same on every rank, or every rank raises the same
    # error (before anything is allocated): a rank with another dtype / capacity would read a
    # peer's workspace wrongly or wait for a call that never comes.
    agree_config(group, device, [
        ("dtype", dtype), ("max_tokens", max_tokens), ("max_total_width", max_total_width),
        ("device", device.type if device is not None else None),
        ("enable_view", bool(enable_view)), ("timeout_ms", timeout_ms),
        ("trap_on_timeout", bool(trap_on_timeout)), ("p2p_max_bytes", p2p_max_bytes),
        ("block_bytes", block_bytes), ("max_blocks", max_blocks),
        ("use_symmetric_memory", bool(use_symmetric_memory)), ("ll_max_bytes", ll_max_bytes),
        ("enable_pdl", enable_pdl)], "create_all_gather_comm", local_error)
    max_tokens, max_total_width = int(max_tokens), int(max_total_width)
    timeout_ms, block_bytes = int(timeout_ms), int(block_bytes)
    p2p_max_bytes, ll_max_bytes = int(p2p_max_bytes), int(ll_max_bytes)
    max_blocks = None if max_blocks is None else int(max_blocks)

    comm = AllGatherComm()
    comm.group = group
    comm.rank = dist.get_rank(group)
    comm.world_size = world
    comm.device = device
    comm.dtype = dtype
    comm.max_tokens = max_tokens
    comm.max_total_width = max_total_width
    comm.enable_view = bool(enable_view)
    comm.timeout_ms = timeout_ms
    comm.trap_on_timeout = bool(trap_on_timeout)
    comm.capability = capability
    comm.enable_pdl = bool(enable_pdl)
    elt = comm.element_size
    comm.buf_bytes = -(-max_tokens * max_total_width * elt // 256) * 256
    comm.mc_data = 0
    comm.peer_data: List[int] = []
    comm.peer_flags: List[int] = []

    # ---- round 1: what every rank could do ----
    cuda = device.type == "cuda"
    ext = cuda and _library.extension_available()
    try:
        import triton  # noqa: F401
        tri = cuda
    except Exception:
        tri = False
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401
        symm_importable = True
    except Exception:
        symm_importable = False
    can_symm = bool(cuda and use_symmetric_memory and symm_importable
                    and comm.world_size <= MAX_RANKS)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1
    cap = torch.cuda.get_device_capability(device) if cuda else (0, 0)
    want_blocks = min(MAX_BLOCKS, sms, max_blocks or MAX_BLOCKS)
    r1 = _agree_min(group, device, [can_symm, ext, tri, want_blocks, block_bytes, p2p_max_bytes,
                                    allow_multimem, ll_max_bytes])
    can_symm, comm.extension, comm.triton = bool(r1[0]), bool(r1[1]), bool(r1[2])
    comm.max_blocks, comm.block_bytes, comm.p2p_max_bytes = r1[3], r1[4], r1[5]
    requested_mm = bool(r1[6])
    # LL region, per parity: 2 bytes per output byte for outputs up to ll_max_bytes (4-byte
    # packets; the 6-byte packets need 4/3 + 64 bytes per rank: ll_region_bytes in the kernel)
    comm.ll_max_bytes = min(int(r1[7]), comm.buf_bytes)
    comm.ll_bytes = 2 * (-(-comm.ll_max_bytes // 256) * 256) + 64 * MAX_RANKS
    nbuf = 3 if comm.enable_view else 2
    comm.ll_off = nbuf * comm.buf_bytes

    # ---- symmetric workspace ----
    ok, delta, mm_vote = False, 0, False
    comm.multimem_reason = "no symmetric workspace"
    if can_symm:
        try:
            from torch.distributed import _symmetric_memory as symm_mem
            with torch.cuda.device(device):
                symm = symm_mem.empty(FLAG_BYTES + nbuf * comm.buf_bytes + 2 * comm.ll_bytes,
                                      dtype=torch.uint8, device=device)
                symm.zero_()                 # flags start at 0 (epochs start at 1)
                torch.cuda.synchronize(device)
                handle = _rendezvous(symm, group)
            ptrs = [int(p) for p in handle.buffer_ptrs]
            # buffer_ptrs are block bases in some torch versions and tensor addresses in
            # others: the local difference covers both (symmetric blocks share offsets).
            delta = symm.data_ptr() - ptrs[comm.rank]
            bases = [p + delta if p else 0 for p in ptrs]
            ok = (len(bases) == comm.world_size
                  and all(b != 0 and b % 16 == 0 for b in bases)
                  and int(getattr(handle, "world_size", comm.world_size)) == comm.world_size
                  and int(getattr(handle, "rank", comm.rank)) == comm.rank)
            if ok:
                comm.symm, comm.handle = symm, handle
                comm.peer_flags = bases
                comm.peer_data = [b_ + FLAG_BYTES for b_ in bases]
                mc = 0
                env_off = multicast_disabled_by_env()
                if requested_mm and env_off is None:
                    mc = int(getattr(handle, "multicast_ptr", 0) or 0)
                offset_ok = delta == 0 and int(getattr(handle, "offset", 0) or 0) == 0
                mm_vote, comm.multimem_reason = multimem_gate(requested_mm, mc, offset_ok, cap,
                                                              comm.extension)
                comm.mc_data = (mc + FLAG_BYTES) if mm_vote else 0
        except Exception as e:  # no P2P / multi-node / backend without symmetric memory
            ok = False
            comm.multimem_reason = f"symmetric memory unavailable: {type(e).__name__}: {e}"
            warnings.warn(f"create_all_gather_comm: symmetric memory unavailable on rank "
                          f"{comm.rank} ({type(e).__name__}: {e}); using the NCCL path",
                          RuntimeWarning, stacklevel=2)
    # ---- round 2: agree (also a barrier: every rank zeroed its flags before anyone proceeds)
    r2 = _agree_min(group, device, [ok, delta, -delta, mm_vote])
    comm.p2p = bool(r2[0]) and r2[1] == -r2[2]
    comm.multimem = comm.p2p and bool(r2[3])
    if requested_mm and mm_vote and not comm.multimem:
        comm.multimem_reason = "refused by another rank"
    if not comm.p2p:
        comm.symm, comm.handle, comm.peer_data, comm.peer_flags, comm.mc_data = None, None, [], [], 0
    if not comm.multimem:
        comm.mc_data = 0
    if comm.p2p:
        comm.state = torch.zeros(STATE_WORDS, dtype=torch.int64, device=device)
        comm.peer_data_dev = torch.tensor(comm.peer_data, dtype=torch.int64, device=device)
        comm.peer_flags_dev = torch.tensor(comm.peer_flags, dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)
    return comm


# ---------------------------------------------------------------------------------------------
# validation, backend choice
# ---------------------------------------------------------------------------------------------
def _widths(comm: AllGatherComm, x: torch.Tensor, widths) -> Tuple[int, ...]:
    if widths is None:
        return (int(x.shape[1]),) * comm.world_size
    C.check(isinstance(widths, (list, tuple)) and len(widths) == comm.world_size, "widths",
            f"must be a list of {comm.world_size} ints (one per rank), got {widths!r}")
    ws = []
    for i, w in enumerate(widths):
        C.check(isinstance(w, int) and not isinstance(w, bool) and w >= 1, "widths",
                f"widths[{i}] must be an int >= 1, got {w!r}")
        ws.append(int(w))
    C.check(ws[comm.rank] == x.shape[1], "widths",
            f"widths[{comm.rank}] = {ws[comm.rank]} but x has {x.shape[1]} columns on rank "
            f"{comm.rank}")
    return tuple(ws)


def _check_matrix(t, name: str, comm: AllGatherComm) -> None:
    # Fast path (every call): the same conditions as below without formatting any message.
    if (isinstance(t, torch.Tensor) and t.dim() == 2 and t.dtype == comm.dtype
            and t.device == comm.device):
        n0, n1 = t.shape
        s0, s1 = t.stride()
        if ((n1 <= 1 or s1 == 1) and (n0 <= 1 or (s0 * t.element_size()) % 16 == 0)
                and (n0 == 0 or n1 == 0 or t.data_ptr() % 16 == 0)):
            return
    # Something is off: the first failing check raises with its message.
    C.check(isinstance(t, torch.Tensor), name, f"must be a torch.Tensor, got {type(t)}")
    C.check(t.dim() == 2, name, f"must be 2-D [tokens, width], got shape {tuple(t.shape)}")
    C.check(t.dtype == comm.dtype, name, f"dtype must be {comm.dtype} (the communicator's), "
            f"got {t.dtype}")
    C.check(t.device == comm.device, name, f"must be on {comm.device}, got {t.device}")
    C.check(t.shape[1] <= 1 or t.stride(1) == 1, name,
            f"last dimension must be contiguous (stride 1), got strides {t.stride()}")
    esz = t.element_size()
    C.check(t.shape[0] <= 1 or (t.stride(0) * esz) % 16 == 0, name,
            f"row stride must be a multiple of 16 bytes, got {t.stride(0)} elements")
    C.check(t.numel() == 0 or t.data_ptr() % 16 == 0, name, "data pointer must be 16-byte aligned")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    esz = a.element_size()
    a0 = a.data_ptr()
    a1 = a0 + ((a.shape[0] - 1) * a.stride(0) + a.shape[1]) * esz
    b0 = b.data_ptr()
    b1 = b0 + ((b.shape[0] - 1) * b.stride(0) + b.shape[1]) * esz
    return a0 < b1 and b0 < a1


def _validate(comm, x, out, widths) -> Tuple[Tuple[int, ...], List[int]]:
    # (Messages are formatted only when a check fails: this runs on every eager call.)
    if not isinstance(comm, AllGatherComm):
        C.check(False, "comm", f"must come from create_all_gather_comm, got {type(comm)}")
    if comm.closed:
        C.check(False, "comm", "is closed (close() was called): create a new communicator")
    _check_matrix(x, "x", comm)
    if x.shape[0] > comm.max_tokens:
        C.check(False, "x", f"has {x.shape[0]} tokens, more than the communicator's capacity "
                f"max_tokens={comm.max_tokens}")
    ws = _widths(comm, x, widths)
    esz = x.element_size()
    for i, w in enumerate(ws):
        if (w * esz) % 16:
            C.check(False, "widths" if widths is not None else "x",
                    f"width {w} of rank {i} is {w * esz} bytes, not a multiple of 16 bytes "
                    f"({16 // esz} elements of {comm.dtype})")
    offs = [0]
    for w in ws:
        offs.append(offs[-1] + w)
    if offs[-1] > comm.max_total_width:
        C.check(False, "widths" if widths is not None else "x",
                f"total width {offs[-1]} exceeds the communicator's max_total_width="
                f"{comm.max_total_width}")
    if out is not None:
        _check_matrix(out, "out", comm)
        if out.shape[0] != x.shape[0] or out.shape[1] != offs[-1]:
            C.check(False, "out",
                    f"must have shape {(x.shape[0], offs[-1])}, got {tuple(out.shape)}")
        C.check(not _overlap(x, out), "out", "must not overlap x")
    return ws, offs


def _num_blocks(comm: AllGatherComm, rows: int, widths: Sequence[int]) -> int:
    """Grid size of the push kernels: a function of the call's shape and agreed values only,
    so it is the same on every rank."""
    slice_bytes = rows * max(widths) * comm.element_size
    return max(1, min(comm.max_blocks, -(-slice_bytes // comm.block_bytes)))


def select_backend(comm: AllGatherComm, num_tokens: int, total_width: int,
                   backend: str = "auto") -> str:
    """The transport a call would use: ``"cuda" | "triton" | "nccl" | "reference" |
    "multimem" | "copy"`` (``"copy"``: a group of one rank).

    ``auto``: world size 1 -> copy; no P2P workspace (multi-node group, no peer access, CPU,
    symmetric memory unavailable) -> nccl; output bytes > ``comm.p2p_max_bytes`` -> nccl
    (a guard: no crossover was found up to 311 MB on 2x H200); else cuda if the extension
    loads on every rank (protocol: ``cuda_protocol``), else triton, else nccl. ``auto`` never
    picks multimem. Explicit backends raise ValueError when unavailable. Depends only on values
    agreed at creation and on the call's shape, so every rank picks the same.
    """
    if backend not in BACKENDS:
        C.check(False, "backend", f"must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if comm.world_size == 1:
            return "copy"
        if not comm.p2p:
            return "nccl"
        if num_tokens * total_width * comm.element_size > comm.p2p_max_bytes:
            return "nccl"
        if comm.extension:
            return "cuda"
        if comm.triton:
            return "triton"
        return "nccl"
    if backend in ("cuda", "triton", "multimem") and not comm.p2p:
        C.check(False, "backend", f"{backend!r} needs the symmetric P2P workspace, which this "
                f"communicator does not have (multi-node group, no peer access, CPU, or "
                f"symmetric memory unavailable): use 'nccl' or 'auto'")
    if backend == "cuda" and not comm.extension:
        _library.require("tokenspeed_kernel.ops.all_gather_hidden(backend='cuda')")
        C.check(False, "backend", "'cuda' needs the compiled extension on every rank")
    if backend == "triton":
        C.check(comm.triton, "backend", "'triton' needs triton and CUDA on every rank")
    if backend == "multimem" and not comm.multimem:
        C.check(False, "backend",
                f"'multimem' is not enabled on this communicator: {comm.multimem_reason}")
    return backend


# ---------------------------------------------------------------------------------------------
# transports
# ---------------------------------------------------------------------------------------------
def _nccl(comm: AllGatherComm, x: torch.Tensor, out: torch.Tensor, ws, offs) -> None:
    """all_gather_into_tensor of [T, w_max] slices (padded if uneven) + permute into out."""
    world, rows = comm.world_size, x.shape[0]
    wmax = max(ws)
    even = all(w == wmax for w in ws)
    if even:
        src = x.contiguous()
    else:
        src = torch.empty((rows, wmax), dtype=x.dtype, device=x.device)
        src[:, : x.shape[1]].copy_(x)
    buf = torch.empty((world * rows, wmax), dtype=x.dtype, device=x.device)
    _ag_single()(buf, src, group=comm.group)
    g = buf.view(world, rows, wmax)
    if even and out.is_contiguous():
        out.view(rows, world, wmax).copy_(g.transpose(0, 1))
    else:
        for s in range(world):
            out[:, offs[s]:offs[s + 1]].copy_(g[s, :, : ws[s]])


def _reference(comm: AllGatherComm, x: torch.Tensor, out: torch.Tensor, ws) -> None:
    from ..reference import comm as ref
    out.copy_(ref.all_gather_hidden_dist(x, comm.group, ws))


def cuda_protocol(comm: AllGatherComm, num_tokens: int, total_width: int,
                  protocol: str = "auto") -> str:
    """The CUDA backend's protocol for a call: ``"ll"`` or ``"flag"``.

    ``flag``: push 16-byte vectors into every peer's gather buffer, publish a release flag, wait
    for every peer's flag (acquire), copy the buffer out -- one NVLink round trip plus a local
    copy, bandwidth-efficient. ``ll``: push packets that carry the call's flag next to every 4
    data bytes straight into every peer's LL region; the peer polls them and writes its output --
    one NVLink trip, no barrier, twice the bytes on the wire. ``auto``: ``ll`` while the output
    (``T * H * element size``) is at most ``comm.ll_max_bytes`` (crossover measured, see
    docs/COMM.md), else ``flag``. Explicit ``ll`` beyond ``comm.ll_max_bytes`` raises ValueError.
    """
    if protocol not in PROTOCOLS:
        C.check(False, "protocol", f"must be one of {PROTOCOLS}, got {protocol!r}")
    nbytes = num_tokens * total_width * comm.element_size
    if protocol == "flag":
        return "flag"
    if protocol == "ll":
        C.check(nbytes <= comm.ll_max_bytes, "protocol",
                f"'ll' needs T * H * element size = {nbytes} <= the communicator's "
                f"ll_max_bytes={comm.ll_max_bytes} (create_all_gather_comm(ll_max_bytes=...))")
        return "ll"
    return "ll" if 0 < nbytes <= comm.ll_max_bytes else "flag"


def ll_packing(nbytes: int) -> str:
    """The LL kernel for an output of ``nbytes``: ``"w4"`` (4-byte packets: one vector per
    thread, 2x the data on the wire) up to ``DEFAULT_LL4_MAX_BYTES``, else ``"w6"`` (6-byte
    packets: three vectors per thread, 4/3 on the wire). Measured crossover (docs/COMM.md)."""
    return "w4" if nbytes <= DEFAULT_LL4_MAX_BYTES else "w6"


def _cuda_args(comm: AllGatherComm, x, out, offs, flags: int, rows: int, ws) -> tuple:
    """Arguments of torch.ops.tokenspeed_kernel.all_gather_hidden (schema in comm_ops.cu)."""
    f = flags | (F_TRAP if comm.trap_on_timeout else 0)
    if _UNPIPELINED_FLAG_KERNEL_FOR_TESTING:
        f |= F_NOPIPE
    ll = bool(flags & F_LL)
    if ll:
        f |= _LL_VARIANT_FLAGS[_LL_VARIANT_FOR_TESTING
                               or ll_packing(rows * offs[-1] * comm.element_size)]
    return (x, out, comm.state, comm.symm, comm.peer_data, comm.peer_flags,
            comm.mc_data if flags & F_MULTIMEM else 0, list(offs), comm.rank, comm.buf_bytes,
            _num_blocks(comm, rows, ws), f, comm.timeout_ms * 1_000_000,
            comm.ll_off if ll else 0, comm.ll_bytes if ll else 0)


def _launch_cuda(comm: AllGatherComm, x, out, offs, flags: int, rows: int, ws) -> None:
    torch.ops.tokenspeed_kernel.all_gather_hidden(*_cuda_args(comm, x, out, offs, flags, rows, ws))


def _launch_triton(comm: AllGatherComm, x, out, offs, rows: int, ws) -> None:
    from ..triton import comm as tri
    nb = _num_blocks(comm, rows, ws)
    sig = all_gather_signature(SIG_ALL_GATHER_TRITON, 0, comm.element_size, rows, nb, offs)
    tri.all_gather_hidden(x, out, comm.peer_data_dev, comm.peer_flags_dev, comm.state,
                          comm._offs_vec(offs), comm.rank, comm.buf_bytes, nb,
                          comm.timeout_ms * 1_000_000, sig=sig)


def _pdl_flag(comm: AllGatherComm, enable_pdl: Optional[bool]) -> int:
    """F_PDL if this call launches with programmatic dependent launch (``enable_pdl`` or, when
    None, the communicator's default)."""
    if enable_pdl is None:
        return F_PDL if getattr(comm, "enable_pdl", False) else 0
    C.check(isinstance(enable_pdl, bool), "enable_pdl",
            f"must be None or a bool, got {enable_pdl!r}")
    C.check(not enable_pdl or getattr(comm, "capability", (0, 0)) >= (9, 0), "enable_pdl",
            f"needs a GPU of compute capability 9.0+, got {comm.device}")
    return F_PDL if enable_pdl else 0


def _run(comm, x, out, ws, offs, backend, protocol: str = "auto",
         enable_pdl: Optional[bool] = None) -> None:
    if protocol not in PROTOCOLS:
        C.check(False, "protocol", f"must be one of {PROTOCOLS}, got {protocol!r}")
    pdl = _pdl_flag(comm, enable_pdl)
    if x.shape[0] == 0 or offs[-1] == 0:   # nothing to move: no rank communicates
        return
    if backend == "copy":
        out.copy_(x)
    elif backend == "nccl":
        _nccl(comm, x, out, ws, offs)
    elif backend == "reference":
        _reference(comm, x, out, ws)
    elif backend == "cuda":
        ll = cuda_protocol(comm, x.shape[0], offs[-1], protocol) == "ll"
        _launch_cuda(comm, x, out, offs, (F_LL if ll else 0) | pdl, x.shape[0], ws)
    elif backend == "multimem":
        _launch_cuda(comm, x, out, offs, F_MULTIMEM | pdl, x.shape[0], ws)
    elif backend == "triton":
        _launch_triton(comm, x, out, offs, x.shape[0], ws)
    else:  # pragma: no cover
        raise AssertionError(backend)


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def all_gather_hidden_out(comm: AllGatherComm, x: torch.Tensor, out: torch.Tensor, *,
                          widths: Optional[Sequence[int]] = None,
                          backend: str = "auto", protocol: str = "auto",
                          enable_pdl: Optional[bool] = None) -> torch.Tensor:
    """Gather every rank's ``x`` along dim 1 into ``out`` (collective).

    Parameters
    ----------
    comm : from ``create_all_gather_comm`` (same group on every rank).
    x : [T, w_rank] of ``comm.dtype`` on ``comm.device``; last dim contiguous, row stride and
        data pointer 16-byte aligned; ``T <= comm.max_tokens``; same T on every rank.
    out : [T, H] (H = sum of widths), same dtype/device, last dim contiguous, rows 16-byte
        aligned; must not overlap x. Written entirely; x is not modified.
    widths : None (every rank has x.shape[1] columns) or the list of every rank's width
        (identical on every rank; each a multiple of 16 bytes; ``widths[rank] == x.shape[1]``).
    backend : "auto" | "cuda" | "triton" | "nccl" | "reference" | "multimem" (see
        ``select_backend``). Every rank must use the same one (auto does).
    protocol : "auto" | "ll" | "flag": the CUDA backend's protocol (``cuda_protocol``); ignored
        by the other backends. Every rank must use the same one (auto does).
    enable_pdl : None (the communicator's ``enable_pdl``) or a bool: launch the CUDA / multimem
        push kernel with programmatic dependent launch (sm_90+; see ``create_all_gather_comm``).
        Ignored by the other backends.

    Returns ``out``. No randomness. CUDA-graph safe for "cuda" (fixed workspace addresses, the
    call counter lives on the device; capture after one eager call per shape for "triton", and
    for "nccl" as NCCL allows). Consecutive calls on one communicator must be ordered on each
    rank's stream (same stream, or event dependencies). A rank that never arrives makes the
    peers' kernels give up after ``comm.timeout_ms``; ``comm.check()`` then raises. Ranks that
    call with different T, widths or backend / protocol: every rank's P2P kernel records the
    mismatch (call signatures in header words), ``out`` receives nothing of a peer, and
    ``comm.check()`` raises ``CommError`` on every rank (the NCCL path does not check).

    Example
    -------
    >>> out = torch.empty(x.shape[0], 2 * x.shape[1], dtype=x.dtype, device=x.device)
    >>> all_gather_hidden_out(comm, x, out)
    """
    if torch.compiler.is_compiling():
        ws = _widths(comm, x, widths)
        offs = [0]
        for w in ws:
            offs.append(offs[-1] + w)
    else:
        C.check(out is not None, "out", "is required (use all_gather_hidden to allocate)")
        ws, offs = _validate(comm, x, out, widths)
    b = select_backend(comm, x.shape[0], offs[-1], backend)
    _run(comm, x, out, ws, offs, b, protocol, enable_pdl)
    return out


def all_gather_hidden(comm: AllGatherComm, x: torch.Tensor, *,
                      widths: Optional[Sequence[int]] = None,
                      backend: str = "auto", protocol: str = "auto",
                      enable_pdl: Optional[bool] = None) -> torch.Tensor:
    """``all_gather_hidden_out`` into a new ``[T, H]`` tensor (see there).

    Example
    -------
    >>> y = all_gather_hidden(comm, x)        # [T, W * x.shape[1]]
    """
    if not torch.compiler.is_compiling():
        ws, offs = _validate(comm, x, None, widths)
    else:
        ws = _widths(comm, x, widths)
        offs = [0]
        for w in ws:
            offs.append(offs[-1] + w)
    out = torch.empty((x.shape[0], offs[-1]), dtype=x.dtype, device=x.device)
    b = select_backend(comm, x.shape[0], offs[-1], backend)
    _run(comm, x, out, ws, offs, b, protocol, enable_pdl)
    return out


def all_gather_hidden_view(comm: AllGatherComm, x: torch.Tensor, *,
                           widths: Optional[Sequence[int]] = None,
                           enable_pdl: Optional[bool] = None) -> torch.Tensor:
    """Gather without the copy-out: returns a ``[T, H]`` view of the communicator's view buffer.

    Needs ``create_all_gather_comm(..., enable_view=True)``, the P2P workspace and the
    extension (CUDA backend only). Lifetime: the view holds this call's result for all work
    enqueued on this rank's stream before the next ``all_gather_hidden_view`` on the same
    communicator; that call overwrites it (it first waits until every rank entered it, so peers
    never overwrite a view that is still being read). Do not write into the view. CUDA-graph
    safe (the view's address is fixed).
    """
    C.check(isinstance(comm, AllGatherComm), "comm",
            f"must come from create_all_gather_comm, got {type(comm)}")
    C.check(comm.enable_view, "comm", "was created without enable_view=True")
    ws, offs = _validate(comm, x, None, widths)
    select_backend(comm, x.shape[0], offs[-1], "cuda")
    rows, total = x.shape[0], offs[-1]
    esz = comm.element_size
    start = FLAG_BYTES + 2 * comm.buf_bytes
    view = comm.symm[start:start + rows * total * esz].view(comm.dtype).view(rows, total)
    pdl = _pdl_flag(comm, enable_pdl)
    if rows > 0:
        _launch_cuda(comm, x, None, offs, F_VIEW | pdl, rows, ws)
    return view


def _register_library() -> None:
    """Fake kernel of every comm op (all are out-variants: nothing to allocate)."""
    import torch.library as L

    @L.register_fake("tokenspeed_kernel::all_gather_hidden")
    def _fake(x, out, state, symm, peer_data, peer_flags, mc_data, col_offsets, rank, buf_bytes,
              num_blocks, flags, timeout_ns, ll_off=0, ll_bytes=0):
        return None
