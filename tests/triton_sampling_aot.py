"""CPU: ahead-of-time compile of the Triton sampler's kernels for sm_90 with the GPU launch
configuration (``_make_config`` as on a 132-SM H100; the interpreter runs another one), with and
without logits processing: every kernel variant a temperature / top-k / top-p / min-p call
launches compiles for the GPU, not only in the interpreter. Prints one "triton-aot ok" line per
compiled kernel; exits 5 (``triton_aot.NO_API``) when this triton has no ahead-of-time API. Run
with TRITON_INTERPRET unset (tests/test_sample_processing.py::test_triton_sampler_compiles_for_sm90)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_aot  # noqa: E402

# pointer parameters: their element type (the processing pointers as ops passes them)
_PTR = {
    "logits_ptr": "*fp32", "seed_ptr": "*i64", "offset_ptr": "*i64", "temp_ptr": "*fp32",
    "topk_ptr": "*i32", "topp_ptr": "*fp32", "minp_ptr": "*fp32", "pf_ptr": "*fp32",
    "pi_ptr": "*i32", "pk_ptr": "*i64", "cand_ptr": "*i64", "mass_ptr": "*i64",
    "tok_ptr": "*i64", "valid_ptr": "*u8", "lp_ptr": "*fp32", "plp_ptr": "*fp32",
    "stats_ptr": "*i32", "bias_ip_ptr": "*i64", "bias_ids_ptr": "*i64", "bias_val_ptr": "*fp32",
    "rep_ptr": "*fp32", "freq_ptr": "*fp32", "pres_ptr": "*fp32", "seen_ptr": "*i32",
    "cnt_ptr": "*i32", "slots_ptr": "*i64", "keep_ptr": "*i32", "hasb_ptr": "*i32",
    "pr_ptr": "*fp32", "allowed_ptr": "*i32", "ban_ip_ptr": "*i64", "ban_ids_ptr": "*i64",
    "min_ptr": "*i64", "nout_ptr": "*i64", "stop_ip_ptr": "*i64", "stop_ids_ptr": "*i64",
}

# (name, HAS_T, HAS_K, HAS_P, HAS_MINP, WANT_LP, PROC): the modes of the bench, processing off
# and with every input (P_BIAS | P_PEN | P_KEEP = 31), logprobs with processing
CASES = [
    ("temperature", True, False, False, False, False, 0),
    ("top-k + top-p", True, True, True, False, False, 0),
    ("top-p", True, False, True, False, False, 0),
    ("min-p", True, False, False, True, False, 0),
    ("temperature+proc+lp", True, False, False, False, True, 31),
    ("top-k + top-p+proc", True, True, True, False, False, 31),
    ("top-p+proc+lp", True, False, True, False, True, 31),
    # bf16 logits (read natively), processing on: the tiled bitmask word loads with 8-element
    # vectors
    ("temperature+proc bf16", True, False, False, False, False, 31, "bf16"),
    ("top-k + top-p+proc bf16", True, True, True, False, False, 31, "bf16"),
]


def _compile(kern, consts: dict, vals: dict, logits: str = "*fp32") -> str:
    """Pointers and the 16-divisible ints (V = 151936, row stride, chunk) get the JIT's
    divisibility hint unless the kernel excludes them from specialization; other ints are i32."""
    names = [p.name for p in kern.params]
    skip = set(kern.do_not_specialize or ())
    sig, const, attrs = {}, {}, {}
    for i, n in enumerate(names):
        if n in consts:
            const[n] = consts[n]
            continue
        sig[n] = logits if n == "logits_ptr" else _PTR.get(n, "i32")
        if (n in _PTR or n in ("V", "stride_row", "chunk", "chunk2")) and n not in skip:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton_aot.compile_ptx(kern, sig, const, attrs, num_warps=vals["num_warps"],
                                  enable_fp_fusion=False)


def check() -> None:
    import torch
    from tokenspeed_kernel.triton import sampling as TS

    TS._sm_count = lambda dev: 132          # the launch configuration of a 132-SM GPU
    V = 151936
    for name, has_t, has_k, has_p, has_minp, lp, proc, *dt in CASES:
        logits = "*" + (dt[0] if dt else "fp32")
        rows = 16
        topr = has_k or has_p
        cfg = TS._make_config(rows, V, torch.device("cuda", 0), topr, has_minp)
        S1 = cfg["S1"]
        flags = dict(HAS_T=has_t, HAS_K=has_k, HAS_P=has_p, HAS_MINP=has_minp)
        k1 = dict(flags, WANT_LP=lp, BLOCK=cfg["BLOCK"], BLOCK_T=cfg["BLOCK_T"],
                  KCAP=cfg["KCAP"], KSLOT=cfg["KSLOT"], USE_RANK=cfg["USE_RANK"],
                  NSTAGE=cfg["NSTAGE"], FAST=cfg["FAST"],
                  DEPTH=cfg["DEPTH_P"] if (has_p and not has_k and S1 == 1) else 4, PROC=proc)
        ptx = _compile(TS._k1_partial, k1,
                       {"num_warps": cfg["warps_t"] if topr else cfg["warps"]}, logits)
        print(f"{name}: _k1_partial {len(ptx)} bytes of PTX; triton-aot ok", flush=True)
        if has_p:
            k2 = dict(flags, BLOCK=cfg["BLOCK"], KCAP=cfg["KCAP"], SMAX=cfg["SMAX"],
                      NSTAGE=cfg["NSTAGE"], PROC=proc)
            ptx = _compile(TS._k2_mass, k2, {"num_warps": cfg["warps"]}, logits)
            print(f"{name}: _k2_mass {len(ptx)} bytes of PTX; triton-aot ok", flush=True)
        k3 = dict(flags, WANT_LP=lp, KCAP=cfg["KCAP"], NP=cfg["NP"], NC=cfg["NC"],
                  SMAX=cfg["SMAX"], NSTAGE=cfg["NSTAGE_X"], FAST=cfg["FAST"],
                  S2MAX=cfg["S2MAX"], BLOCK_X=cfg["BLOCK_X"], NTHR=TS.NT,
                  BLOCK_R=cfg["BLOCK_R"], NREF=cfg["NREF"], USE_RANK=cfg["USE_RANK"],
                  STATS=False, PROC=proc)
        ptx = _compile(TS._k3_finalize, k3, {"num_warps": cfg["warps_x"]}, logits)
        print(f"{name}: _k3_finalize {len(ptx)} bytes of PTX; triton-aot ok", flush=True)
    prep = dict(BUILD_KEEP=True, HAS_ALLOWED=True, HAS_BAN=True, HAS_STOP=True, HAS_BIAS=True,
                BLOCK=TS._PREP_BLOCK)
    ptx = _compile(TS._prep_masks, prep, {"num_warps": 4})
    print(f"_prep_masks {len(ptx)} bytes of PTX; triton-aot ok", flush=True)


def expected_oks() -> int:
    return sum(2 + (1 if c[3] else 0) for c in CASES) + 1


if __name__ == "__main__":
    sys.exit(triton_aot.run(check))
