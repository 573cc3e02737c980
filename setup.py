"""Build tokenspeed-kernel.

The CUDA extension (``tokenspeed_kernel._C``) needs, at build time, a CUDA-enabled torch
(``torch.version.cuda``) and nvcc (``CUDA_HOME``, else ``/usr/local/cuda``); whether a GPU is
visible does not matter. The extension links against the torch it is built with, so build it
against the torch you run with:

    pip install --no-build-isolation .          # torch already installed in this environment

If the toolchain is missing (the usual cause: pip's build isolation, where torch is not
importable) the build FAILS with the reason. A pure-Python install (Triton + reference backends,
no CUDA kernels) is an explicit choice: ``TOKENSPEED_KERNEL_NO_EXT=1 pip install .``.
Building an sdist needs neither torch nor nvcc.

Knobs: TORCH_CUDA_ARCH_LIST (default "9.0a"), DEBUG=1 (-G -lineinfo), MAX_JOBS,
TOKENSPEED_KERNEL_NO_EXT=1 (pure-Python package, no extension).
"""
import glob
import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
OPT_OUT = "TOKENSPEED_KERNEL_NO_EXT"


def _cuda_extension():
    """(ext_module, build_ext class), None -- or None, the reason the extension cannot be built."""
    if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
        # prefer a real toolkit directory over an nvcc wrapper on PATH
        for d in ("/usr/local/cuda",):
            if os.path.exists(os.path.join(d, "bin", "nvcc")):
                os.environ["CUDA_HOME"] = d
                break
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except Exception as e:
        return None, (f"torch is not importable at build time ({type(e).__name__}: {e}; pip's "
                      f"build isolation hides the torch of your environment)")
    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} is a CPU-only build (a CUDA torch is needed)"
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return None, "nvcc not found (install the CUDA toolkit or set CUDA_HOME)"
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    debug = os.environ.get("DEBUG") == "1"
    inc = [os.path.join(ROOT, "csrc")]
    if not os.path.exists(os.path.join(CUDA_HOME, "include", "cusparse.h")):
        # pip CUDA wheels (nvidia-*-cu13) ship the library headers torch's headers include
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        for d in (spec.submodule_search_locations or []) if spec else []:
            for sub in ("cu13/include", "cusparse/include", "cublas/include"):
                if os.path.exists(os.path.join(d, sub)):
                    inc.append(os.path.join(d, sub))
    srcs = sorted(glob.glob("csrc/**/*.cu", recursive=True)) + ["csrc/bindings.cpp"]
    nvcc = ["-O3" if not debug else "-O0", "-std=c++20", "--expt-relaxed-constexpr",
            "-Xptxas=-warn-spills", "-DNDEBUG" if not debug else "-G", "-lineinfo"]
    cxx = ["-O3" if not debug else "-O0", "-std=c++20"]
    ext = CUDAExtension(
        name="tokenspeed_kernel._C",
        sources=srcs,
        include_dirs=inc,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
    )
    base = BuildExtension.with_options(use_ninja=True)

    class _BuildExt(base):
        def run(self):
            arch = os.environ["TORCH_CUDA_ARCH_LIST"]
            print(f"tokenspeed-kernel: building the CUDA extension (nvcc {CUDA_HOME}, torch "
                  f"{torch.__version__}, TORCH_CUDA_ARCH_LIST={arch}, "
                  f"MAX_JOBS={os.environ.get('MAX_JOBS', 'all cores')}); ninja prints [i/n] per "
                  f"source (minutes per file on few cores)", file=sys.stderr, flush=True)
            super().run()

    return (ext, _BuildExt), None


def _no_extension_error(why: str) -> str:
    bar = "=" * 78
    return (f"\n{bar}\ntokenspeed-kernel: cannot build the CUDA extension: {why}.\n\n"
            f"  * with a CUDA torch and nvcc installed:  pip install --no-build-isolation .\n"
            f"  * a pure-Python install (Triton + reference backends, no CUDA kernels):\n"
            f"        {OPT_OUT}=1 pip install .\n{bar}\n")


class _RequireExtension(build_py):
    """Runs in every wheel / editable build (not in sdist): refuses to produce a package without
    the extension unless the opt-out is set, so the extension is never silently missing."""

    reason = None

    def run(self):
        raise SystemExit(_no_extension_error(self.reason))


kwargs = {}
if os.environ.get(OPT_OUT) == "1":
    print(f"tokenspeed-kernel: {OPT_OUT}=1: pure-Python package (Triton + reference backends), "
          f"no CUDA extension", file=sys.stderr)
else:
    ext, why = _cuda_extension()
    if ext is not None:
        kwargs = {"ext_modules": [ext[0]], "cmdclass": {"build_ext": ext[1]}}
    else:
        _RequireExtension.reason = why
        kwargs = {"cmdclass": {"build_py": _RequireExtension}}

# Licence metadata: the PEP 639 form (License-Expression, no deprecation warning) where setuptools
# supports it (>= 77), else the classic field, so that GPU images with an older setuptools can
# still run `python setup.py build_ext --inplace` (pyproject.toml declares the licence dynamic).
import setuptools  # noqa: E402

if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) >= (77, 0):
    kwargs["license_expression"] = "Apache-2.0"
else:
    kwargs["license"] = "Apache-2.0"

setup(
    license_files=["LICENSE"],
    packages=find_packages("python"),
    package_dir={"": "python"},
    **kwargs,
)
