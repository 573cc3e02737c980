"""CPU: ahead-of-time compile of the Triton verify kernels that stream the logits (_pass1,
_pass2, _final) for sm_90, as the JIT specializes them: every argument that the JIT would mark
16-divisible for the bench's shapes (pointers, row strides, V = 151936, chunk) and that the
kernel does not exclude with ``do_not_specialize``. Prints each kernel's count of 16-byte loads
(``ld.global.*.v4``); exits 5 when this triton has no ahead-of-time API. Run with
TRITON_INTERPRET unset (tests/test_verify.py::test_triton_verify_loads_vectorize)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_aot  # noqa: E402


def check() -> None:
    from tokenspeed_kernel.triton import verify as tv

    ptr = {"tgt_ptr", "drf_ptr", "row_req_ptr", "temp_ptr", "minp_ptr", "key_ptr", "nan_ptr",
           "thr_ptr", "s_ptr", "se_ptr", "cu_ptr", "seed_ptr", "off_ptr", "jobi_ptr", "jobf_ptr",
           "cand_ptr", "topk_ptr", "topp_ptr"}
    types = {"tgt_ptr": "*fp32", "drf_ptr": "*fp32", "row_req_ptr": "*i32", "temp_ptr": "*fp32",
             "minp_ptr": "*fp32", "key_ptr": "*i64", "nan_ptr": "*i32", "thr_ptr": "*i64",
             "s_ptr": "*i64", "se_ptr": "*fp32", "cu_ptr": "*i64", "seed_ptr": "*i64",
             "off_ptr": "*i64", "jobi_ptr": "*i64", "jobf_ptr": "*fp32", "cand_ptr": "*i64",
             "topk_ptr": "*i32", "topp_ptr": "*fp32"}
    # values the bench passes (V = 151936 fp32 rows): multiples of 16 except the row count / bound
    div16 = {"stride_t", "stride_d", "V", "chunk"}
    consts = {"BLOCK": 1024, "LOGPROBS": False, "FILT": False, "PADDED": False, "NGRAM": False}
    # fp32, then bf16 logits (target and drafts take one dtype: ops converts bf16 / fp16 drafts
    # to float32 when the processed target rows are float32; the interpreter would not notice a
    # kernel that fails to compile for the GPU with one of them)
    for dt in ("fp32", "bf16"):
        for kern in (tv._pass1, tv._pass2, tv._thresholds, tv._final):
            names = [p.name for p in kern.params]
            skip = {names[i] if isinstance(i, int) else i for i in kern.do_not_specialize or ()}
            sig, const, attrs = {}, {}, {}
            for i, n in enumerate(names):
                if n in consts:
                    const[n] = consts[n]
                    continue
                sig[n] = f"*{dt}" if n in ("tgt_ptr", "drf_ptr") else types.get(n, "i32")
                if (n in ptr or n in div16) and n not in skip:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            ptx = triton_aot.compile_ptx(kern, sig, const, attrs, num_warps=4,
                                         enable_fp_fusion=False)
            n4 = len(re.findall(r"ld\.global(?:\.[a-z0-9_:]+)*\.v4", ptx))
            if dt == "fp32" and kern is not tv._thresholds:
                print(f"{kern.fn.__name__}: v4 loads {n4} (not specialized: {sorted(skip)})",
                      flush=True)
            else:
                print(f"{kern.fn.__name__} {dt} compiled (v4 loads {n4})", flush=True)
    # the per-row request table (one small kernel, ragged and padded layouts): compiles
    for padded in (False, True):
        triton_aot.compile_ptx(tv._row_req_kernel, {"cu_ptr": "*i64", "out_ptr": "*i32",
                                                    "R_t": "i32", "R_d": "i32", "bs": "i32",
                                                    "max_n": "i32", "nlog": "i32"},
                               {"PADDED": padded, "BLOCK": 1024}, num_warps=4)
        print(f"row table (padded={padded}) compiled", flush=True)
    # the walk and the strict accept (the request bounds of unvalidated ranges): compile
    more = {"ids_ptr": "*i64", "tok_ptr": "*i64", "acc_ptr": "*i64", "valid_ptr": "*i1",
            "lp_ptr": "*fp32", "plp_ptr": "*fp32", "row_tok_ptr": "*i64", "row_valid_ptr": "*i1",
            "row_lp_ptr": "*fp32", "row_plp_ptr": "*fp32"}
    for kern, kc in ((tv._walk, {"NGRAM": False, "LOGPROBS": True, "FILT": False}),
                     (tv._strict_accept, {"LOGPROBS": True})):
        for padded in (False, True):
            const = dict(kc, PADDED=padded, BLOCK_N=8)
            sig = {p.name: {**types, **more}.get(p.name, "i32") for p in kern.params
                   if p.name not in const}
            triton_aot.compile_ptx(kern, sig, const, num_warps=4, enable_fp_fusion=False)
            print(f"{kern.fn.__name__} (padded={padded}) compiled", flush=True)

    # logits processing of the target rows (ops.verify(processing=)): every input on
    from tokenspeed_kernel.triton import verify_processing as tvp
    pt = {"tgt_ptr": "*fp32", "out_ptr": "*fp32", "row_req_ptr": "*i32", "cu_ptr": "*i64",
          "ids_ptr": "*i64", "bias_ip_ptr": "*i64", "bias_ids_ptr": "*i64",
          "bias_val_ptr": "*fp32", "rep_ptr": "*fp32", "freq_ptr": "*fp32", "pres_ptr": "*fp32",
          "seen_ptr": "*i32", "cnt_ptr": "*i32", "slots_ptr": "*i64", "keep_ptr": "*i32",
          "hasb_ptr": "*i32", "allowed_ptr": "*i32", "ban_ip_ptr": "*i64", "ban_ids_ptr": "*i64",
          "min_ptr": "*i64", "nout_ptr": "*i64", "stop_ip_ptr": "*i64", "stop_ids_ptr": "*i64",
          "part_ptr": "*fp32", "lse_ptr": "*fp32"}
    for padded in (False, True):
        kern = tvp._process_rows
        # (with logprobs the raw log-sum-exp partials: one variant each way)
        const = {"PADDED": padded, "PROC": 31, "KEEP_PER_ROW": True, "BLOCK": 1024,
                 "RAW_LSE": padded}
        names = [p.name for p in kern.params]
        skip = {names[i] if isinstance(i, int) else i for i in kern.do_not_specialize or ()}
        sig, attrs = {}, {}
        for i, n in enumerate(names):
            if n in const:
                continue
            sig[n] = pt.get(n, "i32")
            if (n.endswith("_ptr") or n in {"stride_t", "V", "chunk"}) and n not in skip:
                attrs[(i,)] = [["tt.divisibility", 16]]
        ptx = triton_aot.compile_ptx(kern, sig, const, attrs, num_warps=4,
                                     enable_fp_fusion=False)
        n4 = len(re.findall(r"ld\.global(?:\.[a-z0-9_:]+)*\.v4", ptx))
        print(f"_process_rows: v4 loads {n4} (padded={padded})", flush=True)
        kern = tvp._prep_rows
        const = {"PADDED": padded, "BUILD_KEEP": True, "HAS_ALLOWED": True,
                 "ALLOWED_PER_ROW": padded, "HAS_BAN": True, "HAS_STOP": True, "HAS_BIAS": True,
                 "BLOCK": 256}
        sig = {p.name: pt.get(p.name, "i32") for p in kern.params if p.name not in const}
        triton_aot.compile_ptx(kern, sig, const, num_warps=4)
        print(f"_prep_rows (padded={padded}) compiled", flush=True)
    sig = {"part_ptr": "*fp32", "lse_ptr": "*fp32", "S": "i32"}
    triton_aot.compile_ptx(tvp._lse_combine, sig, {"SP": 256}, num_warps=4,
                           enable_fp_fusion=False)
    print("_lse_combine compiled", flush=True)


if __name__ == "__main__":
    sys.exit(triton_aot.run(check))
