# The two commands: `make bench` (the main job) and `make test`. Both set themselves up.
SHELL := /bin/bash
PY = $(shell tools/env.sh)
HAS_GPU = $(shell $(PY) -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
MAX_JOBS ?= $(shell nproc)
export MAX_JOBS

.PHONY: build test test-gpu bench cmake-build clean lint format format-check

# Incremental: an editable pure-Python install once, then the extension compiled in place by ninja
# in build/ (only changed sources recompile; nothing at all when the .so is newer than csrc/).
build:
	@echo "[build] $(PY)"
	tools/build.sh $(PY)
	@$(PY) -c "import tokenspeed_kernel as t; print('[build] extension:', t.extension_available() or t.extension_error())"

test: build
ifeq ($(HAS_GPU),1)
	$(PY) -m pytest -q -ra tests
else
	TRITON_INTERPRET=1 $(PY) -m pytest -q -ra tests
endif

bench: build
ifeq ($(HAS_GPU),1)
	@# FlashInfer (baseline only): an offline bundle made by tools/flashinfer-bundle.sh .bench-deps
	if [ -f .bench-deps/flashinfer.tgz ]; then mkdir -p /tmp/ts-fi && tar xzf .bench-deps/flashinfer.tgz -C /tmp/ts-fi; \
	else echo "[bench] no .bench-deps/flashinfer.tgz (tools/flashinfer-bundle.sh makes it): no FlashInfer columns"; fi; \
	PYTHONPATH=$${PYTHONPATH:+$$PYTHONPATH:}/tmp/ts-fi $(PY) -m tokenspeed_kernel.bench all
else
	@echo "[bench] no GPU here: running a CPU smoke of the reference and Triton (interpreter) backends."
	@echo "[bench] GPU numbers need a GPU (committed results: bench/results/)."
	TRITON_INTERPRET=1 $(PY) -m tokenspeed_kernel.bench smoke
endif

# The same sources built through Torch's CMake config (for C++ users and IDEs).
CUDA_HOME ?= $(shell [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda || dirname $$(dirname $$(command -v nvcc)))
cmake-build:
	TORCH_CUDA_ARCH_LIST=$${TORCH_CUDA_ARCH_LIST:-9.0a} cmake -S . -B cmake-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc -DCUDA_TOOLKIT_ROOT_DIR=$(CUDA_HOME) \
	  -DCUDAToolkit_ROOT=$(CUDA_HOME) -DCMAKE_MAKE_PROGRAM=$$(dirname $(PY))/ninja \
	  -DPython3_EXECUTABLE=$(PY) -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch;print(torch.utils.cmake_prefix_path)')"
	cmake --build cmake-build -j $(MAX_JOBS)

clean:
	rm -rf build cmake-build python/tokenspeed_kernel/_C*.so *.egg-info python/*.egg-info

# ruff (pyproject.toml [tool.ruff]: pyflakes + pycodestyle errors) and clang-format (.clang-format:
# csrc/ must be formatted; `make format` applies it); each installed from the package registry when
# missing. Says so, and does not fail, when one cannot be installed.
CSRC_FILES = $(shell find csrc -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp')
lint:
	@if ! $(PY) -m ruff --version >/dev/null 2>&1; then $(PY) -m pip install -q ruff >/dev/null 2>&1 || true; fi
	@if $(PY) -m ruff --version >/dev/null 2>&1; then \
		$(PY) -m ruff check python tests tools bench examples && echo "[lint] ruff: clean"; \
	else echo "[lint] ruff could not be installed here: lint SKIPPED"; fi
	@$(MAKE) --no-print-directory format-check

# one pinned version: another clang-format version may lay the same code out differently
CLANG_FORMAT_VERSION = 23.1.5
CLANG_FORMAT = $(dir $(PY))clang-format
format-check:
	@if ! $(CLANG_FORMAT) --version 2>/dev/null | grep -q ' $(CLANG_FORMAT_VERSION)'; then \
		$(PY) -m pip install -q 'clang-format==$(CLANG_FORMAT_VERSION)' >/dev/null 2>&1 || true; fi
	@if $(CLANG_FORMAT) --version 2>/dev/null | grep -q ' $(CLANG_FORMAT_VERSION)'; then \
		$(CLANG_FORMAT) --dry-run --Werror $(CSRC_FILES) && echo "[lint] clang-format: clean"; \
	else echo "[lint] clang-format $(CLANG_FORMAT_VERSION) could not be installed here: format check SKIPPED"; fi

format:
	@$(CLANG_FORMAT) --version 2>/dev/null | grep -q ' $(CLANG_FORMAT_VERSION)' || \
		$(PY) -m pip install -q 'clang-format==$(CLANG_FORMAT_VERSION)'
	$(CLANG_FORMAT) -i $(CSRC_FILES)
