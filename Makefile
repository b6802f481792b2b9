# Two commands do all set-up on a fresh machine:  `make run` (the main job) and `make test`.
# They create .venv, install the pinned dependencies, build the extension (CMake via
# scikit-build-core; incremental in build/) and run.  CI runs `make test` (.ci/run).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CUTLASS translation units take 3-5 GB each: two at a time fits 2 cores / 24 GB.
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export CUDACXX ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)

.PHONY: run test build ptxas-report config-report clean

run: build
	$(PY) -m gemmbn

test: build
	$(PY) -m pytest -q tests

build: $(VENV)/.deps
	$(PY) -m pip install --no-build-isolation --no-deps -v .

# Registers, stack frames and spills of every kernel.
ptxas-report: $(VENV)/.deps
	$(PY) -m pip install --no-build-isolation --no-deps -v . -Ccmake.define.GEMMBN_PTXAS_VERBOSE=ON 2>&1 \
	  | grep -E "Compiling entry|stack frame|registers" | sed 's/^ *//'

# Mainloop stages and shared memory of every GEMM configuration row (host-only; no GPU needed).
config-report: $(VENV)/.deps
	CUTLASS=$$($(PY) -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('cutlass_library').origin).parent / 'source')") && \
	mkdir -p build && $(CUDACXX) -std=c++17 -O1 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
	  -I kernels/include -I $$CUTLASS/include -I $$CUTLASS/tools/util/include perf/config_report.cu -o build/config_report && \
	build/config_report

$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0" numpy pytest "nanobind>=2.0" "scikit-build-core>=0.10" ninja
	$(PY) -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"
	touch $@

clean:
	rm -rf build $(VENV)
