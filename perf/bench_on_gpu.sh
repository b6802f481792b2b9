#!/usr/bin/env bash
# The benchmark on a GPU box without a package registry: build and install the extension unless
# gemmbn's operators already load, then perf/bench.py and perf/report.py. Outputs in OUT_DIR:
# bench.csv (rows), bench.txt (stdout), bench.md (README table), bench.png, build.log if it built.
#   bash perf/bench_on_gpu.sh OUT_DIR [bench.py args (default: --set kernelbench,tiny,sweep --max-minutes 5.5)]
# Needs what perf/run_on_gpu.sh needs (torch, nvcc, cmake, ninja, scikit-build-core; the
# CUTLASS wheel in .whl/). Without git on the box, set GEMMBN_COMMIT for the CSV's metadata.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash perf/bench_on_gpu.sh OUT_DIR [bench.py args]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if ! (cd /tmp && python3 -c "import gemmbn._native as n, sys; r = n.load_operators(); print(r or 'operators: ' + n.__file__.replace('_native.py', '_operators.so')); sys.exit(r is not None)") >/dev/null 2>&1; then
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --target /tmp/gemmbn-site .whl/nvidia_cutlass-*.whl || exit 1
  if ! PYTHONPATH=/tmp/gemmbn-site CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      python3 -m pip install --no-build-isolation --no-deps -v . > "$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    exit 1
  fi
  echo "build: $(( $(date +%s) - t0 )) s"
fi

[ $# -gt 0 ] || set -- --set kernelbench,tiny,sweep --max-minutes 5.5
python3 perf/bench.py "$@" --out "$out/bench.csv" | tee "$out/bench.txt"
status=${PIPESTATUS[0]}
python3 perf/report.py "$out/bench.csv" --readme-table "$out/bench.md" --plot "$out/bench.png" > /dev/null
exit "$status"
