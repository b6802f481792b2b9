# Two commands do all set-up on a fresh machine:  `make run` (the main job) and `make test`.
# They create .venv, install the pinned dependencies, build the extension (CMake via
# scikit-build-core; incremental in build/) and run.  CI runs `make test` (.ci/run).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CUTLASS translation units take 3-5 GB each: two at a time fits 2 cores / 24 GB.
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export CUDACXX ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
SHELL := bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: run test test-oldest-torch build build-experiment ptxas-report config-report clean

run: build
	$(PY) -m gemmbn

test: build
	$(PY) -m pytest -q tests

# The same built extension under the oldest torch its stable-ABI target admits (TORCH_TARGET_VERSION 2.10): the
# installed package, .so included, copied out of .venv and imported by a venv of torch 2.10 (PyPI has only its CUDA
# build: ~7 GB, ~1-2 min to install here; it runs on the CPU), then the test command's CPU tests but those marked
# torch_agnostic (the emulated kernels and the rule's switches: ~250 s of CI's time, the same under any torch). It
# caught a compiled fallback that only 2.10's dynamo could not trace.
# Its install needs ~11 GB free (measured: 7.2 GB installed, 11.0 GB at the peak, the wheels beside what pip unpacked):
# checked first, so a full disk says so rather than failing inside pip (a CI run did, at 1204 s); --no-cache-dir keeps
# no copy of the wheels in pip's cache; a failed install leaves no venv for the next run to mistake for a good one.
OLDEST_TORCH ?= 2.10.0
OLDEST_VENV := .venv-torch$(OLDEST_TORCH)
OLDEST_TORCH_FREE_GB ?= 11
test-oldest-torch: build
	@test -x $(OLDEST_VENV)/bin/python || { \
	  free_gb=$$(df --output=avail -BG . | tail -1 | tr -dc 0-9); \
	  if [ "$$free_gb" -lt $(OLDEST_TORCH_FREE_GB) ]; then \
	    echo "test-oldest-torch: torch $(OLDEST_TORCH) (PyPI's CUDA build) needs $(OLDEST_TORCH_FREE_GB) GB free to" \
	      "install into $(OLDEST_VENV); $$free_gb GB free on $$(df --output=target . | tail -1)" >&2; exit 1; fi; \
	  $(PYTHON) -m venv $(OLDEST_VENV) && $(OLDEST_VENV)/bin/python -m pip install -q --no-cache-dir \
	    "torch==$(OLDEST_TORCH)" numpy pytest matplotlib || { rm -rf $(OLDEST_VENV); exit 1; }; }
	rm -rf build/oldest-torch && mkdir -p build/oldest-torch && \
	  cp -r "$$($(PY) -c 'import gemmbn, pathlib; print(pathlib.Path(gemmbn.__file__).parent)')" build/oldest-torch/
	PYTHONPATH=build/oldest-torch $(OLDEST_VENV)/bin/python -m pytest -q -m "not gpu and not torch_agnostic" \
	  -p no:cacheprovider tests

# One line per compiled file (a GEMM translation unit takes ~1 min on 2 cores); the compiler command lines go to
# build/pip.log, or to the console with `make build VERBOSE=1`. The log's tail is shown if the build fails.
build: $(VENV)/.deps
ifdef VERBOSE
	$(PY) -m pip install --no-build-isolation --no-deps -v .
else
	@mkdir -p build && echo "building gemmbn (first build ~14 min on 2 cores; log: build/pip.log)"
	@$(PY) -m pip install --no-build-isolation --no-deps -v . 2>&1 | tee build/pip.log \
	  | sed -nuE 's#^ *(\[[0-9]+/[0-9]+\]) .* -c ([^ ]*/)?([^ /]+\.(cu|cpp))( .*)?$$#  \1 \3#p; s#^ *(\[[0-9]+/[0-9]+\] Linking .*)#  \1#p' \
	  || { tail -40 build/pip.log; exit 1; }
endif

# The experimental rows as well (CMake GEMMBN_EXPERIMENT_ROWS=ON: rows no rule picks, which gpu_session.sh's experiment
# steps time), built apart in build/experiment (first build ~17 min) and left as $(EXPERIMENT_OUT)/_operators.so
# (ignored) for a device call to carry as python/gemmbn/_operators.so; .venv's install is left as it was.
# EXPERIMENT_OPTIONS names other CMake options instead, e.g. `make build-experiment
# EXPERIMENT_OPTIONS=GEMMBN_RAGGED_TILE_FROM_Y=OFF` (the default rows, the ragged row block's partials from the
# GEMM); the cache is configured afresh each time, so an option of an earlier call does not stay on.
EXPERIMENT_OUT ?= perf/results/raw/experiment
EXPERIMENT_OPTIONS ?= GEMMBN_EXPERIMENT_ROWS=ON
build-experiment: $(VENV)/.deps
	@mkdir -p build && echo "building gemmbn with $(EXPERIMENT_OPTIONS) (log: build/pip-experiment.log)"
	@rm -f build/experiment/CMakeCache.txt
	@$(PY) -m pip install --no-build-isolation --no-deps --upgrade -v --target build/experiment-site . \
	  -Cbuild-dir=build/experiment $(foreach option,$(EXPERIMENT_OPTIONS),-Ccmake.define.$(option)) \
	  > build/pip-experiment.log 2>&1 || { tail -40 build/pip-experiment.log; exit 1; }
	mkdir -p $(EXPERIMENT_OUT) && cp build/experiment-site/gemmbn/_operators.so $(EXPERIMENT_OUT)/

# Registers, stack frames and spills of every kernel.
ptxas-report: $(VENV)/.deps
	$(PY) -m pip install --no-build-isolation --no-deps -v . -Ccmake.define.GEMMBN_PTXAS_VERBOSE=ON 2>&1 \
	  | grep -E "Compiling entry|stack frame|registers" | sed 's/^ *//'

# Mainloop stages and shared memory of every GEMM configuration row (host-only; no GPU needed); EXPERIMENT_ROWS=1
# adds the rows of CMake's GEMMBN_EXPERIMENT_ROWS.
EXPERIMENT_ROWS ?= 0
config-report: $(VENV)/.deps
	CUTLASS=$$($(PY) -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('cutlass_library').origin).parent / 'source')") && \
	mkdir -p build && $(CUDACXX) -std=c++17 -O1 -DNDEBUG -DGEMMBN_EXPERIMENT_ROWS=$(EXPERIMENT_ROWS) \
	  --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
	  -I kernels/include -I $$CUTLASS/include -I $$CUTLASS/tools/util/include perf/config_report.cu -o build/config_report && \
	build/config_report

$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0" numpy pytest "scikit-build-core>=0.10" ninja matplotlib "cuda-python>=13.0,<14"
	$(PY) -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"
	touch $@

clean:
	rm -rf build $(VENV)
