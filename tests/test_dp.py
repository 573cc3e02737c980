"""DP sampling (ops.dp): the swap, dp_sample / dp_verify and their fallbacks.

CPU (CI): the constants mirror the CUDA header; gloo process groups of 2-4 ranks run the
NCCL-style fallback and the reference backend against ops.sample / ops.verify on the full
logits (uneven B and V, garbage past V); ranks that disagree at creation all raise.
CPU, Triton interpreter: the Triton swap / results gather with W = 2, 3 simulated ranks (CPU
workspaces, driven phase by phase): bit-exact swap, gather, epochs and parities, a missing rank
-> the error words; an ahead-of-time sm_90 compile of both kernels.
One GPU: virtual ranks (W workspaces on one GPU wired like symmetric memory, one stream each)
run the CUDA push kernels: bit-exact swap, tokens equal to ops.sample, graph replays with
changing inputs, a dead peer -> CommError. Several GPUs: the same on real ranks.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dp_helpers as H  # noqa: E402

from tokenspeed_kernel import _library, ops  # noqa: E402
from tokenspeed_kernel.ops import comm as oc  # noqa: E402
from tokenspeed_kernel.ops import dp as D  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
needs_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and _library.extension_available()),
                               reason="needs a CUDA GPU and the compiled extension")


def _ngpu() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------
def test_constants_match_cuda_header():
    src = (ROOT / "csrc/comm/dp_swap.cuh").read_text()

    def const(name):
        m = re.search(rf"constexpr int(?:64_t)? {name} = ([^;]+);", src)
        assert m, name
        return m.group(1)

    assert int(const("kDpMaxRanks")) == D.MAX_RANKS
    assert int(const("kDpMaxBlocks")) == D.MAX_BLOCKS
    assert int(const("kDpMaxFields")) == D.MAX_FIELDS
    assert int(const("kDpStateWords")) == D.STATE_WORDS
    assert int(const("kDpGatherState")) == D.GATHER_STATE
    assert "4 * kDpSlots" in const("kDpGatherFlags") and D.GATHER_FLAGS == 4 * D.SLOT_WORDS
    assert "kDpSlots" == const("kDpReadyFlags") and D.READY_FLAGS == D.SLOT_WORDS
    assert "kDpGatherFlags + 256" == const("kDpHeaders") and D.HEADERS == D.GATHER_FLAGS + 256
    assert "kDpHeaders + 2 * kDpSlots" == const("kDpGatherHeaders")
    assert D.GATHER_HEADERS == D.HEADERS + 2 * D.SLOT_WORDS
    assert "(kDpGatherHeaders + 256) * 8" == const("kDpFlagBytes")
    assert D.FLAG_BYTES == (D.GATHER_HEADERS + 256) * 8
    assert int(const("kDpErrTimeoutSwap")) == D.ERR_TIMEOUT_SWAP
    assert int(const("kDpErrTimeoutReady")) == D.ERR_TIMEOUT_READY
    assert int(const("kDpErrTimeoutGather")) == D.ERR_TIMEOUT_GATHER
    assert int(const("kDpErrMismatch")) == D.ERR_MISMATCH
    for name, v in (("kDpErrSig", D.STATE_ERR_SIG), ("kDpErrPeerSig", D.STATE_ERR_PEER_SIG),
                    ("kDpErrRows", D.STATE_ERR_ROWS), ("kDpErrPerRank", D.STATE_ERR_PER_RANK),
                    ("kDpErrExtra", D.STATE_ERR_EXTRA)):
        assert int(re.search(rf"{name} = (\d+)", src).group(1)) == v, name
    assert int(const("kDpFlagTrap")) == D.F_TRAP
    assert "2 * kDpSlots" == const("kDpTritonSwapFlags") and D.TRITON_SWAP_FLAGS == 2 * D.SLOT_WORDS
    assert "3 * kDpSlots" == const("kDpTritonReadyFlags")
    assert D.TRITON_READY_FLAGS == 3 * D.SLOT_WORDS
    from tokenspeed_kernel.triton import dp as tri   # the Triton kernels' own copies
    assert (tri.MAX_RANKS, tri.MAX_BLOCKS, tri.MAX_FIELDS) == (D.MAX_RANKS, D.MAX_BLOCKS,
                                                               D.MAX_FIELDS)
    assert (tri.TRITON_SWAP_FLAGS, tri.TRITON_READY_FLAGS, tri.GATHER_FLAGS) == (
        D.TRITON_SWAP_FLAGS, D.TRITON_READY_FLAGS, D.GATHER_FLAGS)
    assert (tri.GATHER_STATE, tri.STATE_SEQ, tri.STATE_ERR, tri.STATE_ERR_BLOCK,
            tri.STATE_ERR_SRC, tri.STATE_ERR_EPOCH) == (D.GATHER_STATE, D.STATE_SEQ, D.STATE_ERR,
                                                        D.STATE_ERR_BLOCK, D.STATE_ERR_SRC,
                                                        D.STATE_ERR_EPOCH)
    assert int(re.search(r"kDpDone = (\d+)", src).group(1)) == tri.STATE_DONE
    assert (tri.ERR_TIMEOUT_SWAP, tri.ERR_TIMEOUT_READY, tri.ERR_TIMEOUT_GATHER,
            tri.ERR_MISMATCH) == (D.ERR_TIMEOUT_SWAP, D.ERR_TIMEOUT_READY, D.ERR_TIMEOUT_GATHER,
                                  D.ERR_MISMATCH)
    assert (tri.HEADERS, tri.GATHER_HEADERS) == (D.HEADERS, D.GATHER_HEADERS)
    assert (tri.STATE_ERR_SIG, tri.STATE_ERR_PEER_SIG, tri.STATE_ERR_ROWS,
            tri.STATE_ERR_PER_RANK, tri.STATE_ERR_EXTRA) == (
        D.STATE_ERR_SIG, D.STATE_ERR_PEER_SIG, D.STATE_ERR_ROWS, D.STATE_ERR_PER_RANK,
        D.STATE_ERR_EXTRA)


def test_row_ranges_cover_the_batch_once():
    c = D.DPSamplingComm()
    for W in (1, 2, 3, 4, 8):
        c.world_size = W
        for B in (0, 1, 2, 5, 16, 17, 40):
            seen = []
            for r in range(W):
                s, n = c.row_range(B, r)
                assert 0 <= n <= c.rows_per_rank(B)
                seen += list(range(s, s + n))
            assert seen == list(range(B)), (W, B)


@pytest.fixture
def gloo1():
    import torch.distributed as dist
    from comm_helpers import free_port
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_create_argument_errors(gloo1):
    kw = dict(max_rows=8, vocab_size=100, dtype=torch.float32)
    for bad, arg in ((dict(max_rows=0), "max_rows"), (dict(vocab_size=True), "vocab_size"),
                     (dict(dtype=torch.int32), "dtype"), (dict(shard_width=50), "shard_width"),
                     (dict(slots=0), "slots"), (dict(timeout_ms=-1), "timeout_ms")):
        with pytest.raises(ValueError, match=f"^{arg}:"):
            ops.create_dp_sampling_comm(**{**kw, **bad})
    with pytest.raises(TypeError, match="^group:"):
        ops.create_dp_sampling_comm("not-a-group", **kw)


def test_one_rank_is_plain_sampling_and_validation_names_arguments(gloo1):
    comm = ops.create_dp_sampling_comm(max_rows=8, vocab_size=100, dtype=torch.float32,
                                       shard_width=104)
    assert not comm.p2p and D.select_backend(comm) == "copy"
    full = H.full_logits(6, 100, torch.float32, "cpu")
    x = H.shard_of(full, 1, 0, 104)
    seed, offset, kw = H.sample_params(6, "cpu", "topk_topp")
    ref = ops.sample(full, seed, offset, **kw)
    out = ops.dp_sample(comm, x, seed, offset, **kw)
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.valid, ref.valid)
    assert torch.equal(ops.sample_from_shards(comm, x, seed, offset, **kw).tokens, ref.tokens)
    with pytest.raises(ValueError, match="^logits_shard:.*shard_width"):
        ops.dp_sample(comm, full, seed, offset)
    with pytest.raises(ValueError, match="^logits_shard:.*max_rows"):
        ops.dp_sample(comm, torch.zeros(9, 104), 1, 0)
    with pytest.raises(ValueError, match="^logits_shard: dtype"):
        ops.dp_sample(comm, x.half(), seed, offset)
    with pytest.raises(ValueError, match="^temperature:"):
        ops.dp_sample(comm, x, seed, offset, temperature=-1.0)
    with pytest.raises(ValueError, match="^backend:"):
        ops.dp_sample(comm, x, seed, offset, backend="cuda-ish")
    with pytest.raises(ValueError, match="^comm:"):
        ops.dp_sample(object(), x, seed, offset)
    with pytest.raises(ValueError, match="^slot:"):
        ops.swap_vocab_to_batch(comm, x, slot=1)
    assert D.select_route(comm, 64) == "all_gather"  # one rank: nothing to swap


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_fallback_and_reference_match_full_sampling(world):
    H.run_workers("dp_fallback_worker", world, "gloo", timeout_s=900)


@pytest.mark.parametrize("what", ["dtype", "max_rows", "vocab_size"])
def test_gloo_mismatched_ranks_all_raise(what):
    H.run_workers("dp_mismatch_worker", 2, "gloo", args=(what,), timeout_s=300)


def test_policy():
    assert D.default_dp_min_rows(2, 2) == 32 and D.default_dp_min_rows(2, 4) == 16
    assert D.default_dp_min_rows(4, 2) == 16 and D.default_dp_min_rows(8, 2) == D.DEFAULT_DP_MIN_ROWS
    c = D.DPSamplingComm()
    c.world_size, c.dp_min_rows = 2, 16
    assert D.select_route(c, 15) == "all_gather" and D.select_route(c, 16) == "dp"
    c.dp_min_rows = 0
    assert D.select_route(c, 1) == "dp"


# ---------------------------------------------------------------------------------------------
# CPU: the Triton kernels under TRITON_INTERPRET=1, W simulated ranks in one process
# ---------------------------------------------------------------------------------------------
# Workspaces are CPU uint8 tensors wired by peer-pointer tables (create_virtual_dp_comms on the
# CPU); the interpreter runs one program after the other, so the ranks are driven phase by phase
# (comm.triton_phase): every rank's phase 1 (handshake publish), then every rank's phase 2
# (handshake wait + push + publish), then every rank's phase 4 (wait + copy-out + advance).
needs_interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="runs the Triton kernels on CPU tensors (interpreter)")
_PHASES = (1, 2, 4)


def _sim_comms(W, max_rows, V, dtype, shard_width=None, block_bytes=64, max_spins=16):
    comms = D.create_virtual_dp_comms(W, max_rows=max_rows, vocab_size=V, dtype=dtype,
                                      shard_width=shard_width, device="cpu",
                                      block_bytes=block_bytes, slots=2)
    for c in comms:
        c.triton_max_spins = max_spins
    return comms


def _phased(comms, fn):
    out = [None] * len(comms)
    for phase in _PHASES:
        for r, c in enumerate(comms):
            c.triton_phase = phase
            out[r] = fn(r, c)
    for c in comms:
        c.triton_phase = 7
    return out


def _flag_tables(comm):
    """The flag region of a simulated rank: the [4 tables][256 blocks][16 ranks] swap tables
    (CUDA swap, CUDA ready, Triton swap, Triton ready) and the 256 gather words."""
    words = comm.symm[: D.FLAG_BYTES].view(torch.int64)
    return (words[: 4 * D.SLOT_WORDS].view(4, D.MAX_BLOCKS, D.MAX_RANKS),
            words[D.GATHER_FLAGS:D.GATHER_FLAGS + 256])


def _headers(comm):
    """The call-header tables of a simulated rank: swap [2][256][16] and gather [2][16]."""
    words = comm.symm[: D.FLAG_BYTES].view(torch.int64)
    return (words[D.HEADERS:D.HEADERS + 2 * D.SLOT_WORDS].view(2, D.MAX_BLOCKS, D.MAX_RANKS),
            words[D.GATHER_HEADERS:D.GATHER_HEADERS + 2 * D.MAX_RANKS].view(2, D.MAX_RANKS))


def _i64(v):
    return v - (1 << 64) if v >= (1 << 63) else v


@needs_interp
@pytest.mark.parametrize("W,B,V,dtname,w,block", [
    (2, 5, 100, "float32", None, 16),      # B % W != 0, two tiles per row
    (3, 7, 300, "bfloat16", None, 32),     # shard row 200 bytes: not a multiple of 16
    (3, 2, 64, "float32", None, 1024),     # B < W: rank 2 owns no row
    (2, 3, 130, "bfloat16", 69, 32),       # 138-byte shard rows, +1e4 garbage past V
    (3, 4, 250, "float16", 84, 16),        # 168-byte shard rows, 6 tiles per row
])
def test_triton_swap_simulated_ranks_bit_exact(W, B, V, dtname, w, block, monkeypatch):
    from tokenspeed_kernel.triton import dp as tri
    monkeypatch.setattr(tri, "BLOCK", block)
    dtype = H.DTYPES[dtname]
    comms = _sim_comms(W, 8, V, dtype, shard_width=w)
    w = comms[0].shard_width
    G = D._num_blocks(comms[0], comms[0].rows_per_rank(B))
    assert G > 1 or B < W
    for call in range(1, 3):   # two calls: epochs advance, the same buffer is reused
        for slot in (0, 1):
            full = H.full_logits(B, V, dtype, "cpu", seed=call * 10 + slot)
            xs = [H.shard_of(full, W, r, w) for r in range(W)]
            views = _phased(comms, lambda r, c: ops.swap_vocab_to_batch(c, xs[r], slot=slot,
                                                                        backend="triton"))
            e = 2 * (call - 1) + slot + 1
            for r, c in enumerate(comms):
                s, n = c.row_range(B)
                assert views[r].shape == (n, V)
                assert H.same(views[r], full[s:s + n]), (W, B, V, dtname, call, slot, r)
                st = c.state.tolist()
                assert st[D.STATE_SEQ] == e and st[D.STATE_ERR] == 0 and st[8] == 0, st
                assert c.error() is None
                fl, gw = _flag_tables(c)
                for t in (2, 3):   # the Triton swap / ready tables: one word per (block, rank)
                    assert bool((fl[t, :G, :W] == e).all()), (t, fl[t, :G, :W])
                    assert bool((fl[t, G:] == 0).all()) and bool((fl[t, :, W:] == 0).all())
                assert bool((fl[:2] == 0).all())   # the CUDA kernel's tables untouched
                assert bool((gw == 0).all())       # no gather yet
                # this call's headers from every rank in slot [e & 1][b][s]
                sig = D.swap_signature(D.SIG_DP_SWAP_TRITON, B, c.rows_per_rank(B),
                                       w * c.element_size, c.row_bytes, slot, G, W)
                hs, _ = _headers(c)
                assert bool((hs[e & 1, :G, :W] == _i64(oc.header_word(e, sig))).all())


@needs_interp
@pytest.mark.parametrize("W,B", [(2, 5), (3, 7), (3, 2)])
def test_triton_gather_simulated_ranks(W, B, monkeypatch):
    from tokenspeed_kernel.triton import dp as tri
    monkeypatch.setattr(tri, "BLOCK", 16)    # several byte tiles per section
    comms = _sim_comms(W, 8, 64, torch.float32)
    Bl = comms[0].rows_per_rank(B)
    g = torch.Generator().manual_seed(B)
    for call in range(1, 4):   # parities 1, 0, 1
        tok = torch.randint(0, 2**40, (B,), generator=g)
        valid = torch.rand(B, generator=g) > 0.5
        lp = torch.randn(B, generator=g)
        rows = torch.randint(-5, 5, (B, 3), generator=g).to(torch.int32)   # verify-shaped
        want = [tok, valid, lp, rows]
        # (the phases of one call must write the same outputs: _gather_triton, which _gather
        # calls with fresh outputs for backend="triton")
        outs = [[torch.full_like(t, -7 if t.dtype != torch.bool else 0) for t in want]
                for _ in comms]

        def run(r, c):
            s, n = c.row_range(B)
            D._gather_triton(c, [t[s:s + n] for t in want], outs[r], B, Bl)

        _phased(comms, run)
        for r, c in enumerate(comms):
            for o, t in zip(outs[r], want):
                assert o.dtype == t.dtype and torch.equal(o, t), (W, B, call, r)
            st = c.state.tolist()
            assert st[D.GATHER_STATE + D.STATE_SEQ] == call and st[D.GATHER_STATE + 1] == 0
            assert st[D.STATE_SEQ] == 0   # the swap's counter untouched
            fl, gw = _flag_tables(c)
            assert gw[:W].tolist() == [call] * W and bool((gw[W:] == 0).all())
            assert bool((fl == 0).all())   # no swap flag touched
            # the peers' sections of this call's tokens lie in results buffer call & 1
            res = c.symm[c.res_base + (call & 1) * c.res_bytes:].view(torch.int64)
            for s in range(W):
                if s != r:
                    s0, n = c.row_range(B, s)
                    assert torch.equal(res[s0:s0 + n], tok[s0:s0 + n])


def _sentinel_slots(comms, byte=0x5A):
    for c in comms:
        c.symm[D.FLAG_BYTES:c.res_base].fill_(byte)


@needs_interp
@pytest.mark.parametrize("what", ["B", "slot", "rows_per_rank"])
def test_triton_swap_mismatch_is_detected_before_any_push(what):
    """Ranks that call the swap with different B / slot / rows per rank: every rank records
    ERR_MISMATCH in the entry handshake (not a timeout), pushes nothing (every swap buffer keeps
    its sentinel, the own rows included), check() raises CommError naming the other rank; the
    communicator is poisoned."""
    from tokenspeed_kernel.ops.comm import CommError
    W, V = 2, 100
    comms = _sim_comms(W, 8, V, torch.float32, max_spins=8)
    w = comms[0].shard_width
    _sentinel_slots(comms)
    Bs = {"B": [5, 6], "slot": [5, 5], "rows_per_rank": [4, 4]}[what]
    slots = [0, 1] if what == "slot" else [0, 0]
    xs = [H.shard_of(H.full_logits(Bs[r], V, torch.float32, "cpu"), W, r, w) for r in range(W)]

    def run(r, c):
        if what == "rows_per_rank":   # (dp_verify's per-request grouping differs)
            return D._swap_triton(c, xs[r], 3 + r, slots[r])
        return ops.swap_vocab_to_batch(c, xs[r], slot=slots[r], backend="triton")

    _phased(comms, run)
    for r, c in enumerate(comms):
        st = c.state.tolist()
        assert st[D.STATE_ERR] == D.ERR_MISMATCH and st[D.STATE_ERR_SRC] == 1 - r, (what, r, st)
        assert st[D.STATE_ERR_EPOCH] == 1 and st[D.STATE_SEQ] == 0, st
        assert st[D.STATE_ERR_ROWS] == Bs[r] and st[D.STATE_ERR_EXTRA] == slots[r], st
        assert st[D.STATE_ERR_SIG] != st[D.STATE_ERR_PEER_SIG]
        assert bool((c.symm[D.FLAG_BYTES:c.res_base] == 0x5A).all()), f"{what}: pushed"
        with pytest.raises(CommError, match=f"different arguments: rank {1 - r} joined call 1"):
            c.check()
        assert f"B={Bs[r]}" in c.error() and f"slot {slots[r]}" in c.error()
    before = comms[1].symm[: D.FLAG_BYTES].clone()
    ops.swap_vocab_to_batch(comms[0], xs[0], backend="triton")
    assert torch.equal(comms[1].symm[: D.FLAG_BYTES], before), "a poisoned swap signalled"


@needs_interp
@pytest.mark.parametrize("what", ["fields", "items", "dtype"])
def test_triton_gather_mismatch_zeroes_peer_sections(what):
    """Ranks whose results gathers differ (logprobs on one rank only, B, out_dtype): every rank
    records ERR_MISMATCH and copies nothing out of its results buffer: the peers' sections of
    the outputs are zeroed (token 0, valid false: never a peer's bytes of another layout, never
    what the output held before); its own items were stored before the wait. A later call on the
    poisoned communicator zeroes every output, its own items included."""
    W = 2
    comms = _sim_comms(W, 8, 64, torch.float32, max_spins=8)
    B = [5, 5]
    if what == "items":
        B = [5, 6]
    nf = [2, 3] if what == "fields" else [2, 2]
    dts = [torch.int64, torch.int32] if what == "dtype" else [torch.int64, torch.int64]
    outs, wants = [], []
    for r in range(W):
        want = [torch.arange(B[r], dtype=dts[r]) + 100, torch.ones(B[r], dtype=torch.bool),
                torch.full((B[r],), 0.5)][: nf[r]]
        wants.append(want)
        outs.append([torch.full_like(t, -7 if t.dtype != torch.bool else 0) for t in want])

    def run(r, c):
        Bl = c.rows_per_rank(B[r])
        s, n = c.row_range(B[r])
        D._gather_triton(c, [t[s:s + n] for t in wants[r]], outs[r], B[r], Bl)

    _phased(comms, run)
    for r, c in enumerate(comms):
        st = c.state.tolist()[D.GATHER_STATE:]
        assert st[D.STATE_ERR] == D.ERR_MISMATCH and st[D.STATE_ERR_SRC] == 1 - r, (what, r, st)
        assert st[D.STATE_ERR_ROWS] == B[r] and st[D.STATE_ERR_EXTRA] == nf[r], st
        s, n = c.row_range(B[r])
        for o, t in zip(outs[r], wants[r]):
            assert torch.equal(o[s:s + n], t[s:s + n])      # own items
            rest = torch.cat([o[:s], o[s + n:]])
            assert rest.numel() > 0 and bool((rest == 0).all()), (what, r, rest)
        assert "results gather" in c.error() and f"{nf[r]} fields" in c.error()
    # poisoned: the next gather moves nothing and zeroes every output (own items included)
    for r, c in enumerate(comms):
        outs[r] = [torch.full_like(t, -7 if t.dtype != torch.bool else 1) for t in wants[r]]
        seq = c.state.tolist()[D.GATHER_STATE + D.STATE_SEQ]
        run(r, c)
        for o in outs[r]:
            assert bool((o == 0).all()), (what, r, o)
        assert c.state.tolist()[D.GATHER_STATE + D.STATE_SEQ] == seq


def test_signatures_and_messages():
    """The per-call signatures separate every argument a peer must agree on, and the error
    messages name the mismatch with this rank's arguments."""
    base = dict(kind=D.SIG_DP_SWAP_CUDA, rows=7, rows_per_rank=4, shard_bytes=400,
                row_bytes=800, slot=0, num_blocks=3, world=2)
    s0 = D.swap_signature(**base)
    seen = {s0}
    for k, v in [("kind", D.SIG_DP_SWAP_TRITON), ("rows", 8), ("rows_per_rank", 5),
                 ("shard_bytes", 416), ("row_bytes", 832), ("slot", 1), ("num_blocks", 4),
                 ("world", 3)]:
        sig = D.swap_signature(**{**base, k: v})
        assert sig not in seen, k
        seen.add(sig)
    g0 = D.gather_signature(7, 4, 2, [8, 1], [0, 64])
    for args in [(8, 4, 2, [8, 1], [0, 64]), (7, 3, 2, [8, 1], [0, 64]),
                 (7, 4, 2, [4, 1], [0, 64]), (7, 4, 2, [8, 1, 4], [0, 64, 80]),
                 (7, 4, 2, [8, 1], [0, 128])]:
        assert D.gather_signature(*args) != g0, args
    assert D.format_dp_error([0] * D.STATE_WORDS, 0, 100) is None
    words = [0] * D.STATE_WORDS
    words[1:8] = [D.ERR_MISMATCH, 2, 1, 9, 0x1234, 0xABCD, 7]
    words[9:11] = [4, 1]
    msg = D.format_dp_error(words, 0, 100)
    assert msg.startswith("dp sampling swap: ranks called swap_vocab_to_batch"), msg
    assert "rank 1 joined call 9" in msg and "B=7, 4 rows per rank, slot 1" in msg, msg
    assert "0x0000abcd on rank 1, 0x00001234 here" in msg, msg
    words = [0] * D.STATE_WORDS
    words[D.GATHER_STATE + 1: D.GATHER_STATE + 5] = [D.ERR_TIMEOUT_GATHER, 0, 1, 3]
    assert "results flag of rank 1" in D.format_dp_error(words, 0, 100)


def test_gather_dispatches_triton(monkeypatch):
    seen = []
    monkeypatch.setattr(D, "_gather_triton", lambda *a: seen.append(a))
    c = D.DPSamplingComm()
    c.world_size, c.device = 2, torch.device("cpu")
    outs = D._gather(c, [torch.zeros(2)], 3, 2, "triton", [()], [torch.float32])
    assert len(seen) == 1 and seen[0][2] is outs and seen[0][3:] == (3, 2)


@needs_interp
def test_triton_missing_rank_gives_up_and_poisons():
    from tokenspeed_kernel.ops.comm import CommError
    W, B, V = 2, 3, 64
    full = H.full_logits(B, V, torch.float32, "cpu")
    # handshake: rank 1 never enters -> rank 0's ready wait gives up
    comms = _sim_comms(W, 8, V, torch.float32, max_spins=8)
    x0 = H.shard_of(full, W, 0, comms[0].shard_width)
    ops.swap_vocab_to_batch(comms[0], x0, backend="triton")
    st = comms[0].state.tolist()
    assert st[D.STATE_ERR] == D.ERR_TIMEOUT_READY and st[D.STATE_ERR_SRC] == 1, st
    assert st[D.STATE_ERR_EPOCH] == 1 and st[D.STATE_SEQ] == 0, st
    with pytest.raises(CommError, match="ready flag of rank 1"):
        comms[0].check()
    # poisoned: a later gather returns at once (no flag, nothing moved) with every output
    # zeroed (token 0, valid false), its own items included
    flags1 = comms[1].symm[: D.FLAG_BYTES].clone()
    outs = [torch.full((B,), -7), torch.ones(B, dtype=torch.bool)]
    D._gather_triton(comms[0], [torch.arange(2) + 5, torch.ones(2, dtype=torch.bool)], outs, B, 2)
    assert comms[0].state[D.GATHER_STATE].item() == 0
    assert torch.equal(comms[1].symm[: D.FLAG_BYTES], flags1)
    assert outs[0].tolist() == [0] * B and outs[1].tolist() == [False] * B
    # dp_sample on the poisoned communicator: every row invalid, never a stale token
    res = ops.dp_sample(comms[0], x0, 1, 0, temperature=1.0, backend="triton",
                        sample_backend="reference")
    assert res.tokens.tolist() == [0] * B and res.valid.tolist() == [False] * B
    # data flags: rank 1 enters (phase 1) but never pushes -> rank 0's data wait gives up
    comms = _sim_comms(W, 8, V, torch.float32, max_spins=8)
    comms[1].triton_phase = 1
    ops.swap_vocab_to_batch(comms[1], H.shard_of(full, W, 1, comms[1].shard_width),
                            backend="triton")
    ops.swap_vocab_to_batch(comms[0], x0, backend="triton")
    st = comms[0].state.tolist()
    assert st[D.STATE_ERR] == D.ERR_TIMEOUT_SWAP and st[D.STATE_ERR_SRC] == 1, st
    assert comms[0].error() is not None and "data flag of rank 1" in comms[0].error()
    # results gather: rank 1 never joins -> rank 0 gives up, the swap is poisoned too
    comms = _sim_comms(W, 8, V, torch.float32, max_spins=8)
    out = torch.full((B,), -7)
    D._gather_triton(comms[0], [torch.arange(2)], [out], B, 2)
    st = comms[0].state.tolist()
    assert st[D.GATHER_STATE + D.STATE_ERR] == D.ERR_TIMEOUT_GATHER, st
    assert st[D.GATHER_STATE + D.STATE_ERR_SRC] == 1, st
    assert out[:2].tolist() == [0, 1]    # own items were stored before the wait
    assert out[2:].tolist() == [0] * (B - 2)   # the missing peer's section: zeroed
    with pytest.raises(CommError, match="results gather.*results flag of rank 1"):
        comms[0].check()
    before = comms[1].symm[: D.FLAG_BYTES].clone()
    ops.swap_vocab_to_batch(comms[0], x0, backend="triton")
    assert torch.equal(comms[1].symm[: D.FLAG_BYTES], before), "a poisoned swap signalled"
    assert comms[0].state[D.STATE_SEQ].item() == 0


def test_triton_backend_selection():
    assert "triton" in D.BACKENDS
    c = D.DPSamplingComm()
    c.world_size, c.virtual, c.p2p, c.extension, c.triton = 2, False, True, False, True
    assert D.select_backend(c) == "nccl"          # auto never picks triton
    assert D.select_backend(c, "triton") == "triton"
    c.extension = True
    assert D.select_backend(c) == "cuda"
    c.triton = False
    with pytest.raises(ValueError, match="^backend: 'triton' needs triton"):
        D.select_backend(c, "triton")
    c.p2p, c.triton = False, True
    with pytest.raises(ValueError, match="^backend: 'triton' needs the symmetric P2P"):
        D.select_backend(c, "triton")
    c.world_size = 1
    assert D.select_backend(c, "triton") == "copy"


def test_triton_kernels_compile_for_sm90():
    """Ahead-of-time compile of both Triton kernels for sm_90 (subprocess, interpreter off):
    catches what the interpreter does not (types of loop-carried values, atomics) and checks the
    PTX for release / acquire flags at system scope, the %globaltimer bound and one-thread
    (broadcast) polls."""
    import triton_aot
    triton_aot.run_script("dp_helpers.py", "triton-aot", oks=2)


# ---------------------------------------------------------------------------------------------
# one GPU: virtual ranks
# ---------------------------------------------------------------------------------------------
# (Each test is one fresh process: run_virtual; the cases run inside it.)
@needs_gpu
def test_virtual_swap_is_bit_exact():
    H.run_virtual("virtual_cases", "swap", [(w, d) for w in (2, 3, 4)
                                            for d in ("float32", "bfloat16", "float16")])


@needs_gpu
def test_virtual_dp_sample_equals_sample():
    H.run_virtual("virtual_cases", "sample",
                  [(m, w, b, d) for m in ("temp", "topk", "topp", "topk_topp", "minp")
                   for w, b, d in ((2, 16, "bfloat16"), (3, 7, "float32"), (4, 64, "float16"),
                                   (8, 5, "bfloat16"))])


@needs_gpu
def test_virtual_dp_sample_uneven_vocab_and_small_units():
    # shard rows that are not 16-byte multiples (4- and 2-byte units); B < W: empty ranks
    H.run_virtual("virtual_cases", "sample",
                  [("topk_topp", w, b, d, v) for w, v, d, b in
                   ((3, 4099, "bfloat16", 2), (2, 1001, "float16", 9), (4, 999, "float32", 3))])


@needs_gpu
def test_virtual_dp_verify_equals_verify():
    H.run_virtual("virtual_cases", "verify", [("strict",), ("probabilistic",)])


@needs_gpu
def test_virtual_graph_replays_10000_with_changing_inputs():
    H.run_virtual("virtual_graph_replays", 2, 10_000)


@needs_gpu
def test_virtual_dead_peer_gives_commerror():
    H.run_virtual("virtual_dead_peer_check")


# ---------------------------------------------------------------------------------------------
# several GPUs: real ranks (NCCL group, symmetric memory)
# ---------------------------------------------------------------------------------------------
def _world_sizes():
    return [w for w in (2, 4, 8) if w <= max(_ngpu(), 2)]


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4, 8])
def test_multigpu_dp_matches_sampling_all_backends(world):
    if _ngpu() < world or not _library.extension_available():
        pytest.skip(f"needs {world} GPUs and the extension")
    H.run_workers("dp_fallback_worker", world, "nccl",
                  args=("cuda", ("cuda", "nccl", "reference", "auto")), timeout_s=900)


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4, 8])
def test_multigpu_dp_triton_matches_sampling(world):
    """The whole Triton path (swap, per-rank sampling / verify, gather) on real ranks, uneven B
    and V. Slow the first time: the Triton sampler and verify kernels compile (every mode, with
    logprobs) in each rank's process."""
    if _ngpu() < world or not _library.extension_available():
        pytest.skip(f"needs {world} GPUs and the extension")
    H.run_workers("dp_fallback_worker", world, "nccl", args=("cuda", ("triton",)), timeout_s=1500)


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_multigpu_graph_replays_10000(world, backend):
    if _ngpu() < world or not _library.extension_available():
        pytest.skip(f"needs {world} GPUs and the extension")
    H.run_workers("dp_graph_worker", world, "nccl", args=(10_000, backend), timeout_s=900)


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_multigpu_dead_peer_commerror(world, backend):
    if _ngpu() < world or not _library.extension_available():
        pytest.skip(f"needs {world} GPUs and the extension")
    H.run_workers("dp_dead_peer_worker", world, "nccl", args=(backend,), timeout_s=300)


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2])
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_multigpu_late_peer_outputs_read_invalid(world, backend):
    """A peer that arrives after the bounded wait gave up: CommError on both ranks, and the
    outputs of that call and of the next (poisoned) call are all invalid rows, zeros
    (dp_helpers.dp_late_peer_worker)."""
    needs_ext = backend == "cuda"
    if _ngpu() < world or (needs_ext and not _library.extension_available()):
        pytest.skip(f"needs {world} GPUs" + (" and the extension" if needs_ext else ""))
    H.run_workers("dp_late_peer_worker", world, "nccl", args=(backend,), timeout_s=600)


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_multigpu_per_call_mismatch_commerror(world, backend):
    """Ranks that call the swap / dp_sample / the results gather with different B, slot,
    logprobs, out_dtype or fields: CommError naming the mismatch on every rank, no push into any
    swap buffer, no peer section copied out, a new communicator works
    (dp_helpers.dp_call_mismatch_worker)."""
    if _ngpu() < world or not _library.extension_available():
        pytest.skip(f"needs {world} GPUs and the extension")
    H.run_workers("dp_call_mismatch_worker", world, "nccl", args=(backend,), timeout_s=600)


@needs_gpu
def test_op_argument_errors_raise_instead_of_crashing():
    """The C++ adapters' own checks (the last line behind ops.dp's validation) must raise
    RuntimeError, not take the process down. Run in a child process: on the GPU image
    (torch 2.11) a failing TORCH_CHECK with a formatted message crashed the process with
    SIGSEGV: the image's g++ links libstdc++ statically, and c10::str's ostringstream ran in an
    uninitialised copy. The adapters now use TS_CHECK (csrc/common/check.h, docs/COMM.md)."""
    import subprocess
    code = (
        "import torch\nfrom tokenspeed_kernel import _library\n_library.extension_available()\n"
        "x = torch.zeros(4, 8, device='cuda')\n"
        "st = torch.zeros(32, dtype=torch.int64, device='cuda')\n"
        "sy = torch.zeros(1 << 21, dtype=torch.uint8, device='cuda')\n"
        "try:\n"
        "    torch.ops.tokenspeed_kernel.dp_swap(x, st, sy, [16, 16], [16, 16], 0, 16, 64, 0, 1,"
        " 0, 0)\n"
        "except RuntimeError as e:\n"
        "    assert 'rows_per_rank' in str(e), str(e)\n"
        "    print('raised')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ,
                            "PYTHONPATH": str(ROOT / "python")})
    assert r.returncode == 0 and "raised" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
