"""Ahead-of-time Triton compiles for sm_90 on the CPU (no GPU needed), shared by the tests that
check a kernel's PTX: what the interpreter cannot show (types, atomics, vector widths). Run with
TRITON_INTERPRET unset; the tests run these checks in a subprocess and skip on exit code
``NO_API`` (a triton without this ahead-of-time API).

    python tests/triton_aot.py token-counts      # the token-count kernels (ops.add_output_tokens)
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

NO_API = 5


class NoApi(Exception):
    """This triton has no (compatible) ahead-of-time compile API."""


def compile_ptx(fn, signature: dict, constexprs: dict, attrs: dict = None, **options) -> str:
    """PTX of ``fn`` for sm_90. ``signature``: every parameter's type ("*fp32", "i32", ...; the
    constexprs' entries are filled in); ``attrs``: {(index,): [["tt.divisibility", 16]]}."""
    assert os.environ.get("TRITON_INTERPRET") != "1", "run with the interpreter off"
    import triton
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        raise NoApi(f"triton {triton.__version__}: no ahead-of-time compile API ({e})")
    sig = dict(signature, **{k: "constexpr" for k in constexprs})
    try:
        src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs or {})
    except TypeError as e:
        raise NoApi(f"triton {triton.__version__}: ahead-of-time compile API differs ({e})")
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def run(check) -> int:
    """Runs ``check()`` (which prints its findings and raises on a failed check): 0, or NO_API."""
    try:
        check()
    except NoApi as e:
        print(e)
        return NO_API
    return 0


def run_script(script: str, *args: str, oks: int = 0) -> str:
    """For the tests: runs ``tests/<script> args`` in a subprocess with the interpreter off,
    skips (pytest) on NO_API, asserts exit 0 and ``oks`` lines "triton-aot ok"; returns stdout."""
    import subprocess

    import pytest
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root / "python"))
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(root / "tests" / script), *args], env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode == NO_API:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout.count("triton-aot ok") == oks, r.stdout
    return r.stdout


def count(pattern: str, ptx: str) -> int:
    return len(re.findall(pattern, ptx))


def token_counts_check() -> None:
    """The token-count kernels compile for sm_90 with 32-bit atomic OR / ADD at global scope."""
    from tokenspeed_kernel.triton import dp as tdp
    from tokenspeed_kernel.triton import token_counts as tc
    atom_or = r"(?:atom|red)\.global(?:\.[a-z0-9_]+)*\.or\.b32"
    atom_add = r"(?:atom|red)\.global(?:\.[a-z0-9_]+)*\.add\.[su]32"
    cases = [
        ("add_tokens", tc._add_tokens,
         {"seen_ptr": "*i32", "out_ptr": "*i32", "tok_ptr": "*i64", "valid_ptr": "*i1",
          "slots_ptr": "*i64", "N": "i32", "M": "i32", "W": "i32", "V": "i32"},
         {"HAS_VALID": True, "HAS_SLOTS": True, "BLOCK_M": 16}, {"or": atom_or, "add": atom_add}),
        ("mark_prompts", tc._mark_prompts,
         {"seen_ptr": "*i32", "slots_ptr": "*i64", "ids_ptr": "*i64", "indptr_ptr": "*i64",
          "N": "i32", "nnz": "i32", "W": "i32", "V": "i32"}, {"BLOCK": 1024}, {"or": atom_or}),
        ("clear_rows", tc._clear_rows,
         {"seen_ptr": "*i32", "out_ptr": "*i32", "slots_ptr": "*i64", "N": "i32", "W": "i32",
          "V": "i32"},
         {"BLOCK": 1024}, {"store": r"st\.global"}),
        ("dp set_table", tdp._set_table,
         dict({"tab": "*i64"}, **{f"v{i}": "i64" for i in range(32)}), {},
         {"store": r"st\.global"}),
    ]
    for name, fn, sig, const, checks in cases:
        ptx = compile_ptx(fn, sig, const, num_warps=4)
        for what, pat in checks.items():
            n = count(pat, ptx)
            assert n > 0, f"{name}: no {what} ({pat}) in the PTX"
            print(f"  {name}: {what}: {n}")
        print(f"triton-aot ok: {name}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what != "token-counts":
        sys.exit(f"usage: {sys.argv[0]} token-counts")
    sys.exit(run(token_counts_check))
