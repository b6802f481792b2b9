#!/usr/bin/env bash
# Everything one device call should do after a kernel change, in order of importance, logs in OUT_DIR:
# build (ptxas report), GPU tests, the tuning sweep, finish_normalize's bandwidth, the per-launch breakdown,
# the side-by-side benchmark
# at the KernelBench shape, and the main job; the logs come back as OUT_DIR/session.tgz.
#   bash perf/gpu_session.sh OUT_DIR          (carry .whl/ with the CUTLASS wheel; see perf/README.md)
set -uo pipefail
cd "$(dirname "$0")/.."
source perf/session_lib.sh
session_begin "${1:?usage: bash perf/gpu_session.sh OUT_DIR}" session

step build
bash perf/run_on_gpu.sh "$out" --build-only || exit 1
grep "stack frame" "$out/ptxas.txt" | sort | uniq -c
step tests
timeout 240 python3 -m pytest -q -rs tests/test_native_gpu.py tests/test_fused_gpu.py 2>&1 | tee "$out/tests.log" | tail -6
step tune
timeout 120 python3 perf/tune_gemm.py --out "$out/tune.csv" 2>&1 | tee "$out/tune.txt" | awk '/:/{c=0} {c++; if (c<=13) print}'
step finish-bandwidth
timeout 60 python3 perf/finish_bandwidth.py 2>&1 | tee "$out/finish.txt"
step breakdown
timeout 60 python3 perf/breakdown.py 2>&1 | tee "$out/breakdown.txt" | tail -5
step bench
GEMMBN_COMMIT=${GEMMBN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} timeout 200 \
  python3 perf/bench.py --set kernelbench --providers gemmbn,eager,compile,cublas,gemmbn-gemm-only \
  --out "$out/bench.csv" 2>&1 | tee "$out/bench.txt" | grep "^|"
step main-job
timeout 150 python3 -m gemmbn 2>&1 | tee "$out/main.log" | tail -25
