"""ops.new_token_counts / admit_requests / add_output_tokens: the Triton kernels (interpreter on
CPU, the device path on a GPU) and the reference against a per-token loop; argument errors."""
from __future__ import annotations

import os

import pytest
import torch

from tokenspeed_kernel import ops


def _backends():
    bes = ["reference"]
    if os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available():
        bes.append("triton")
    return bes


def _dev(backend):
    return torch.device("cuda") if backend == "triton" and torch.cuda.is_available() else \
        torch.device("cpu")


class Loop:
    """The state kept as Python sets / dicts, updated token by token."""

    def __init__(self, n):
        self.seen = [set() for _ in range(n)]
        self.out = [dict() for _ in range(n)]

    def admit(self, slots, prompts):
        for s, p in zip(slots, prompts):
            self.seen[s] = set(p)
            self.out[s] = {}

    def add(self, rows, slots, valid, V):
        for i, toks in enumerate(rows):
            if valid is not None and not valid[i]:
                continue
            s = slots[i] if slots is not None else i
            for t in toks:
                if 0 <= t < V:
                    self.seen[s].add(t)
                    self.out[s][t] = self.out[s].get(t, 0) + 1

    def check(self, counts):
        n, V = counts.output.shape
        seen = counts.seen.to(torch.int64).cpu()
        out = counts.output.cpu()
        for s in range(n):
            bits = {t for t in range(V) if (int(seen[s, t >> 5]) >> (t & 31)) & 1}
            assert bits == self.seen[s], s
            nz = {t: int(out[s, t]) for t in torch.nonzero(out[s]).flatten().tolist()}
            assert nz == self.out[s], s


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("V", [64, 97, 1000])
def test_updates_match_a_token_loop(backend, V):
    dev = _dev(backend)
    g = torch.Generator().manual_seed(V)
    n = 6
    counts = ops.new_token_counts(n, V, device=dev)
    loop = Loop(n)
    for step in range(4):
        # admit 2 slots with prompts (repeats, ids 31 mod 32 for the sign bit, the last id)
        slots = torch.randperm(n, generator=g)[:2]
        prompts = [torch.randint(0, V, (int(torch.randint(0, 9, (1,), generator=g)),),
                                 generator=g).tolist() + [31 % V, V - 1] for _ in range(2)]
        indptr = torch.tensor([0] + list(torch.tensor([len(p) for p in prompts]).cumsum(0)))
        ops.admit_requests(counts, slots.to(dev), torch.tensor(sum(prompts, [])).to(dev),
                           indptr.to(dev), backend=backend)
        loop.admit(slots.tolist(), prompts)
        # a step: [b, m] tokens with -1 padding and duplicates, a slot permutation, valid mask
        b, m = 5, 3
        tok = torch.randint(0, V, (b, m), generator=g)
        tok[0, 1] = tok[0, 0]
        tok[1, 2:] = -1
        tok[2, 0] = 63 % V
        perm = torch.randperm(n, generator=g)[:b]
        valid = torch.rand(b, generator=g) > 0.2
        ops.add_output_tokens(counts, tok.to(dev), valid=valid.to(dev), slots=perm.to(dev),
                              backend=backend)
        loop.add(tok.tolist(), perm.tolist(), valid.tolist(), V)
        # one token per request, rows = slots
        t1 = torch.randint(-1, V, (n,), generator=g)
        ops.add_output_tokens(counts, t1.to(dev), backend=backend)
        loop.add([[t] for t in t1.tolist()], None, None, V)
        loop.check(counts)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs the Triton interpreter or a GPU")
def test_unvalidated_out_of_range_tokens_are_skipped():
    dev = _dev("triton")
    counts = ops.new_token_counts(2, 40, device=dev)
    ops.add_output_tokens(counts, torch.tensor([[40, 5], [1 << 40, -7]], device=dev),
                          backend="triton", validate=False)
    assert counts.output.sum().item() == 1 and counts.output[0, 5].item() == 1
    assert counts.seen[0, 0].item() == 1 << 5 and counts.seen[1].sum().item() == 0


@pytest.mark.parametrize("backend", _backends())
def test_unvalidated_bad_slots_and_prompt_offsets_stay_in_bounds(backend):
    """validate=False with count slots outside [0, N) and malformed prompt offsets: those rows
    are skipped and the prompt ranges clamped into [0, nnz], on every backend. The counts are
    views into larger buffers whose guard rows (slot -1 and slot N) and the prompt ids' guard
    entries must stay untouched: an out-of-bounds access would show there."""
    dev = _dev(backend)
    N, V = 3, 70
    W = (V + 31) // 32
    seen_big = torch.full((N + 2, W), 5, dtype=torch.int32, device=dev)
    out_big = torch.full((N + 2, V), 7, dtype=torch.int32, device=dev)
    counts = ops.TokenCounts(seen_big[1:N + 1], out_big[1:N + 1])
    seen0, out0 = seen_big.clone(), out_big.clone()
    ids_big = torch.tensor([3, 4, 66, 66], device=dev)
    ids = ids_big[:2]          # entries 2, 3 (token 66) are past the end: never read
    # slots -1 and N are skipped; slot 1: indptr [.., 1, 9] clamped to its entries [1, 2)
    ops.admit_requests(counts, torch.tensor([-1, 1, N], device=dev), ids,
                       torch.tensor([0, 1, 9, 9], device=dev), backend=backend, validate=False)
    # row 0 -> slot N (skipped), row 1 -> slot 2, row 2 -> slot -1 (skipped)
    ops.add_output_tokens(counts, torch.tensor([[8], [9], [10]], device=dev),
                          slots=torch.tensor([N, 2, -1], device=dev), backend=backend,
                          validate=False)
    assert torch.equal(seen_big[[0, N + 1]], seen0[[0, N + 1]]), "guard rows of seen written"
    assert torch.equal(out_big[[0, N + 1]], out0[[0, N + 1]]), "guard rows of counts written"
    want_seen = seen0[1:N + 1].clone()
    want_out = out0[1:N + 1].clone()
    want_seen[1] = 0
    want_seen[1, 0] = 1 << 4           # slot 1: cleared, prompt entry 1 (token 4) only
    want_out[1] = 0
    want_seen[2, 0] |= 1 << 9          # slot 2: token 9 counted
    want_out[2, 9] += 1
    assert torch.equal(counts.seen, want_seen), counts.seen
    assert torch.equal(counts.output, want_out)


def test_argument_errors_name_the_argument():
    c = ops.new_token_counts(3, 100)
    with pytest.raises(ValueError, match="^tokens: must be < V = 100"):
        ops.add_output_tokens(c, torch.tensor([1, 100, 2]))
    with pytest.raises(ValueError, match="^slots: must be in"):
        ops.add_output_tokens(c, torch.tensor([1, 2]), slots=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="^tokens: has 4 rows"):
        ops.add_output_tokens(c, torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="^tokens: must be an integer tensor"):
        ops.add_output_tokens(c, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="^valid: must be a bool tensor"):
        ops.add_output_tokens(c, torch.tensor([1]), valid=torch.tensor([1]))
    with pytest.raises(TypeError, match="^counts: must be a TokenCounts"):
        ops.add_output_tokens("x", torch.tensor([1]))
    with pytest.raises(ValueError, match="^counts: seen must be"):
        ops.add_output_tokens(ops.TokenCounts(c.seen[:, :1].contiguous(), c.output),
                              torch.tensor([1]))
    ids, ip = torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3])
    with pytest.raises(ValueError, match="^slots: must be distinct"):
        ops.admit_requests(c, torch.tensor([1, 1]), ids, ip)
    with pytest.raises(ValueError, match="^prompt_ids: must be in"):
        ops.admit_requests(c, torch.tensor([0, 1]), torch.tensor([1, 2, 100]), ip)
    with pytest.raises(ValueError, match="^prompt_indptr: must start at 0"):
        ops.admit_requests(c, torch.tensor([0, 1]), ids, torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="^prompt_indptr: must have len"):
        ops.admit_requests(c, torch.tensor([0, 1]), ids, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="^backend: must be one of"):
        ops.add_output_tokens(c, torch.tensor([1]), backend="cuda")
    with pytest.raises(ValueError, match="^vocab_size: must be an int"):
        ops.new_token_counts(2, 0)
    assert c.output.sum().item() == 0 and c.seen.sum().item() == 0   # nothing was written


def test_kernels_compile_for_sm90():
    """Ahead-of-time compile for sm_90 (subprocess, interpreter off): the updates are 32-bit
    atomic OR / ADD in the PTX (and the DP gather's table kernel compiles)."""
    import triton_aot
    triton_aot.run_script("triton_aot.py", "token-counts", oks=4)
