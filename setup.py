"""Build tokenspeed-kernel.

The CUDA extension is built when the toolchain can build it -- a CUDA-enabled torch
(``torch.version.cuda``) and nvcc (``CUDA_HOME``) -- never based on whether a GPU is visible.
Otherwise the pure-Python package (Triton + reference backends) is installed and the reason is
printed. Knobs: TORCH_CUDA_ARCH_LIST (default "9.0a"), DEBUG=1 (-G -lineinfo), MAX_JOBS,
TOKENSPEED_KERNEL_NO_EXT=1 (skip the extension).
"""
import glob
import os
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _cuda_extension():
    if os.environ.get("TOKENSPEED_KERNEL_NO_EXT") == "1":
        return None, "TOKENSPEED_KERNEL_NO_EXT=1"
    if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
        # prefer a real toolkit directory over an nvcc wrapper on PATH
        for d in ("/usr/local/cuda",):
            if os.path.exists(os.path.join(d, "bin", "nvcc")):
                os.environ["CUDA_HOME"] = d
                break
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except Exception as e:  # torch missing at build time (use --no-build-isolation)
        return None, f"torch is not importable at build time ({e})"
    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} is a CPU-only build"
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return None, "nvcc not found (set CUDA_HOME)"
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
    return (ext, BuildExtension.with_options(use_ninja=True)), None


ext, why = _cuda_extension()
kwargs = {}
if ext is not None:
    kwargs = {"ext_modules": [ext[0]], "cmdclass": {"build_ext": ext[1]}}
    print(f"tokenspeed-kernel: building the CUDA extension for "
          f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}", file=sys.stderr)
else:
    print(f"tokenspeed-kernel: NOT building the CUDA extension: {why}. Installing the pure "
          f"Python package (Triton + reference backends).", file=sys.stderr)

setup(
    packages=find_packages("python"),
    package_dir={"": "python"},
    **kwargs,
)
