"""The op schemas as csrc/ defines them: the ``m.def("...")`` calls of csrc/<family>/*_ops.cu
(their one source). Tests that run without the compiled extension define the same schemas from
here; with the extension, tests check that the loaded library has exactly these."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_DEF = re.compile(r'm\.def\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\)')
_LIT = re.compile(r'"((?:[^"\\]|\\.)*)"')


def cpp_schemas() -> dict:
    """{op name: schema string} of every op defined under csrc/ (adjacent string literals
    joined, as the C++ compiler does)."""
    out = {}
    for f in sorted((ROOT / "csrc").rglob("*.cu")) + [ROOT / "csrc" / "bindings.cpp"]:
        for m in _DEF.finditer(f.read_text()):
            schema = "".join(_LIT.findall(m.group(1)))
            name = schema.split("(", 1)[0]
            assert name not in out, f"{name} defined twice (csrc/)"
            out[name] = schema
    return out
