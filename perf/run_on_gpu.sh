#!/usr/bin/env bash
# One call on a GPU machine that has torch, nvcc, cmake, ninja and scikit-build-core but no
# package registry: build (with the ptxas report), GPU tests, main job. Logs go to OUT_DIR.
#   bash perf/run_on_gpu.sh [OUT_DIR] [--build-only | pytest args (default: tests)]
# The CUTLASS wheel travels in .whl/ (nvidia_cutlass-4.2.0.0-py3-none-any.whl).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/gemmbn-out}}
shift || true
mkdir -p "$out"
export PYTHONUNBUFFERED=1

python3 -m pip install -q --no-index --no-deps --target /tmp/gemmbn-site .whl/nvidia_cutlass-*.whl || exit 1
export PYTHONPATH=/tmp/gemmbn-site${PYTHONPATH:+:$PYTHONPATH}
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse --short HEAD 2>/dev/null || true
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

t0=$(date +%s)
if ! python3 -m pip install --no-build-isolation --no-deps -v . -Ccmake.define.GEMMBN_PTXAS_VERBOSE=ON \
    > "$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40
  tail -30 "$out/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
# Every kernel: stack frame and spills (want 0), registers.
grep -E "Compiling entry|stack frame|Used [0-9]+ registers" "$out/build.log" \
  | sed -E 's/Compiling entry function .(_Z[^ ]{0,60}).*/\1/' > "$out/ptxas.txt"
echo "ptxas: $(grep -c 'stack frame' "$out/ptxas.txt") kernels; nonzero stack/spill lines:"
grep "stack frame" "$out/ptxas.txt" | grep -v "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" || echo "  none"

cd /tmp && python3 -c "import gemmbn._native as n, sys; r = n.load_operators(); print(r or 'operators: ' + n.__file__.replace('_native.py', '_operators.so')); sys.exit(r is not None)" && cd - >/dev/null
[ "${1:-}" != "--build-only" ] || exit 0
[ $# -gt 0 ] || set -- tests
python3 -m pytest -q -rs "$@" 2>&1 | tee "$out/tests.log" | tail -40
python3 -m gemmbn 2>&1 | tee "$out/main.log"
