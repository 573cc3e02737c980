"""Small ops.sample workload for compute-sanitizer (memcheck / racecheck) on the CUDA sampler:
every row mode (greedy, temperature, top-k, top-p, min-p, all filters) at batch sizes that take
the split launch (B = 2: temperature / greedy), the split-candidates launch (B = 2 / 24 with a
top-k tensor: S CTAs per row, the last to arrive finishing it), clusters of 16 and of 2-4 CTAs
(B = 2 / 24: top-p / min-p without top-k, and every mode with F_NO_SPLIT), chunks in shared
memory and streamed, the forced exact / generic paths, the split-candidates launch's
launch-policy bits (processing, band masses, streamed temperature-only rows, the complete
prefix and the rescan of top-k-off rows, at B = 24 the deferral of undecided rows to a cluster
launch; the default without the deferral; without any of them; the opt-in top-p route), a
batch of SMs / 2 + 4 rows with top-p tensors and flat rows (one CTA per row: rows past the
candidates queued for the launch of clusters after it, F_WIDE_DEFER, and without the bit), with
logprobs; the HIST finish of top-p rows without top-k on a cluster (F_HIST_TOPP: boundary bins
resolved, past their capacity, at level 1, below the dead line, with min-p; and without the bit);
fp32 and bf16, aligned and unaligned rows; each also with logits processing (bias, penalties,
an allowed mask, banned ids, min_tokens stop ids: the prep kernel and the processing kernels).
Each result is compared with the reference (token identity), so the run fails on a wrong token
as well as on a sanitizer error.

    compute-sanitizer --tool memcheck --error-exitcode 3 python tools/sanitize_sampling.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python tools/sanitize_sampling.py --quick
    compute-sanitizer --tool racecheck --error-exitcode 3 --kernel-name kns=sample_kernel \
        python tools/sanitize_sampling.py --hist
(--quick: fp32, aligned rows, no forced paths; racecheck is slow. --hist: only the HIST finish's
calls, six of them, for a racecheck of its cluster kernel that fits a short run)
"""
import sys

import torch

from tokenspeed_kernel import ops, testing
from tokenspeed_kernel.ops import sampling as S
from tokenspeed_kernel.reference import logits_processing as LP

MODES = {"greedy": dict(T=0.0), "temperature": dict(), "top_k": dict(k=50),
         "top_p": dict(p=0.9), "min_p": dict(mp=0.1), "all": dict(k=200, p=0.8, mp=0.05),
         # rows alternating filtered / unfiltered (top-k 0, top-p 1: temperature-only rows)
         "mixed": dict(k=(50, 0), p=(0.9, 1.0)), "mixed_p": dict(p=(0.9, 1.0)),
         # top-k-off top-p rows in calls with a top-k tensor (the complete prefix, the rescan)
         "k_off_p": dict(k=(50, 0), p=(0.9, 0.9)),
         # k = 1000 > 512 rows with a top-p tensor: never decided by the candidates (at B = 24
         # deferred to the cluster launch after the split-candidates launch)
         "k_gt_512": dict(k=(50, 1000), p=(0.9, 0.95))}


def processing(B: int, V: int, g: torch.Generator, dev) -> LP.LogitsInputs:
    """Every processing input for B requests (count slots permuted, one request all banned)."""
    N = B + 2
    counts = ops.new_token_counts(N, V, device=dev)
    slots = torch.randperm(N, generator=g)[:B].to(dev)
    ops.admit_requests(counts, slots, torch.randint(0, V, (300 * B,), generator=g).to(dev),
                       (torch.arange(B + 1) * 300).to(dev))
    ops.add_output_tokens(counts, torch.randint(0, V, (B, 30), generator=g).to(dev), slots=slots)

    def csr(lists, values=False):
        ip = torch.tensor([0] + [len(x) for x in lists]).cumsum(0).to(dev)
        ids = torch.tensor([t for x in lists for t in x], dtype=torch.int64).to(dev)
        return LP.Csr(ip, ids, (torch.randn(ids.numel(), generator=g) * 4).to(dev)
                      if values else None)

    def picks(k):
        return [torch.randperm(V, generator=g)[:k].tolist() for _ in range(B)]

    W = (V + 31) // 32
    return LP.LogitsInputs(
        logit_bias=csr(picks(40), values=True), repetition_penalty=torch.full((B,), 1.2, device=dev),
        frequency_penalty=torch.full((B,), 0.3, device=dev),
        presence_penalty=torch.full((B,), 0.2, device=dev), counts=counts, count_slots=slots,
        allowed_mask=torch.randint(-2**31, 2**31, (B, W), generator=g).to(torch.int32).to(dev),
        banned=csr([list(range(V))] + picks(10)[1:]), min_tokens=torch.full((B,), 3, device=dev),
        num_output_tokens=(torch.arange(B) % 5).to(dev), stop_ids=csr(picks(3)))


def hist_rows(B: int, V: int, g: torch.Generator):
    """Top-p rows for the HIST finish, row i of type i % 6: randn * 4 (T = 0.8, p = 0.9); flat
    (p = 0.95: a boundary bin past its capacity, the generic path); one token at 0, the rest in
    [-19, -17] (p = 0.9999: level 1); the same in [-22, -20] (p = 0.99999: a dead boundary bin);
    randn * 4 with min-p 0.05; the dead row with min-p 1e-12 (its boundary resolved)."""
    z = torch.randn(B, V, generator=g) * 4
    T, p, mp = torch.full((B,), 0.8), torch.full((B,), 0.9), torch.zeros(B)
    for i in range(B):
        t = i % 6
        if t == 1:
            z[i] *= 0.0125
            T[i], p[i] = 1.0, 0.95
        elif t in (2, 3, 5):
            z[i] = (-17.0 if t == 2 else -20.0) - 2 * torch.rand(V, generator=g)
            z[i, int(torch.randint(0, V, (1,), generator=g))] = 0.0
            T[i], p[i], mp[i] = 1.0, (0.9999 if t == 2 else 0.99999), (1e-12 if t == 5 else 0.0)
        elif t == 4:
            T[i], p[i], mp[i] = 1.0, 0.95, 0.05
    return z, dict(temperature=T, top_p=p, min_p=mp)


def run(quick: bool, hist_only: bool = False) -> int:
    dev = torch.device("cuda")
    n = 0 if hist_only else run_modes(quick, dev)
    # the HIST finish (clusters of CTAs: B <= SMs / 2), every case, with logprobs; and without
    # F_HIST_TOPP (512 candidates)
    for B in (1, 6, 12):
        g = torch.Generator().manual_seed(1000 + B)
        z, kw = hist_rows(B, 32000, g)
        z, kw = z.to(dev), {k: v.to(dev) for k, v in kw.items()}
        seed = torch.arange(B, device=dev) + 5
        offset = torch.zeros(B, dtype=torch.int64, device=dev)
        want = ops.sample(z, seed, offset, backend="reference", **kw).tokens
        for launch in (None, S._DEFAULT_LAUNCH_FLAGS & ~S.F_HIST_TOPP):
            with testing.knobs(**({} if launch is None else {"sampler_launch_flags": launch})):
                got = ops.sample_with_logprobs(z, seed, offset, backend="cuda", **kw)
            torch.cuda.synchronize()
            assert torch.equal(got.tokens, want), ("hist", B, launch)
            n += 1
    print(f"sanitize_sampling: {n} calls, tokens = reference: OK")
    return 0


def run_modes(quick: bool, dev) -> int:
    """Every row mode, launch and flag set above (not the HIST cases); returns the call count."""
    n = 0
    # (testing bits, launch-policy bits; None = the default policy): the default, the launches
    # without the default policy bits, the opt-in top-p route, the default without the deferral
    # of undecided rows (the finishing CTA's generic path)
    flag_sets = [(0, None), (0, 0), (S.F_SCAND_TOPP, None),
                 (0, S._DEFAULT_LAUNCH_FLAGS & ~S.F_SCAND_DEFER)]
    if not quick:
        flag_sets += [(f, None) for f in (S.F_NO_RESIDENT, S.F_FORCE_EXACT, S.F_FORCE_GENERIC,
                                          S.F_NO_SPLIT)]
    wide = torch.cuda.get_device_properties(dev).multi_processor_count // 2 + 4
    for dtype in ([torch.float32] if quick else [torch.float32, torch.bfloat16]):
        for B in (2, 24, wide):
            for unaligned in ((False,) if quick else (False, True)):
                g = torch.Generator().manual_seed(B * 7 + unaligned)
                V = 40000
                full = torch.randn(B, V + 1, generator=g) * 4
                if B == wide:
                    full[3::7] *= 0.02      # flat rows: kept sets past the 512 candidates
                z = (full[:, 1:] if unaligned else full[:, :V]).to(dtype).to(dev)
                seed = torch.arange(B, device=dev) + 11
                offset = torch.zeros(B, dtype=torch.int64, device=dev)
                proc = processing(B, V, g, dev)
                for (mode, m), pr in [(x, pr) for x in MODES.items() for pr in (None, proc)]:
                    if B == wide and mode not in ("top_p", "mixed_p", "k_gt_512"):
                        continue
                    def col(v, dt=torch.float32):   # one value, or a pair alternated over rows
                        v = v if isinstance(v, tuple) else (v,)
                        return torch.tensor([v[i % len(v)] for i in range(B)], dtype=dt,
                                            device=dev)
                    kw = {"temperature": col(m.get("T", 0.8))}
                    if "k" in m:
                        kw["top_k"] = col(m["k"], torch.int32)
                    if "p" in m:
                        kw["top_p"] = col(m["p"])
                    if "mp" in m:
                        kw["min_p"] = col(m["mp"])
                    want = ops.sample(z, seed, offset, backend="reference", processing=pr,
                                      **kw).tokens
                    sets = flag_sets + ([(0, S._DEFAULT_LAUNCH_FLAGS & ~S.F_WIDE_DEFER)]
                                        if B == wide else [])
                    for fl in sets:
                        launch = {} if fl[1] is None else {"sampler_launch_flags": fl[1]}
                        with testing.knobs(sampler_flags=fl[0], **launch):
                            got = ops.sample_with_logprobs(z, seed, offset, backend="cuda",
                                                           processing=pr, **kw)
                        torch.cuda.synchronize()
                        assert torch.equal(got.tokens, want), (dtype, B, unaligned, mode, fl,
                                                               pr is not None)
                        n += 1
    return n


if __name__ == "__main__":
    sys.exit(run("--quick" in sys.argv[1:], "--hist" in sys.argv[1:]))
