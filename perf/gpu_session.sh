#!/usr/bin/env bash
# One device call, logs in OUT_DIR (returned as OUT_DIR/session.tgz however the call ends: the device tool returns
# few files):
#   bash perf/gpu_session.sh OUT_DIR [STEP ...]      (carry .whl/ with the CUTLASS wheel to build; perf/README.md)
# Same-call A/B runs of two builds or trees: perf/ab.sh. Steps run in the order given (default: build smoke tests
# tune tune-short finish-bandwidth breakdown bench main-job):
#   build             pip install with the ptxas report (env.txt, build.log, ptxas.txt); the operators also land
#                     in OUT_DIR (_operators.so), so a later call can carry it as python/gemmbn/ and skip the build
#   gpu-tests         every GPU test (pytest -m gpu)
#   smoke             the native GPU tests of the split GEMM and of every configuration row, stopping at
#                     the first failure (a quick verdict before the long steps)
#   tests             the GPU tests (tests/test_native_gpu.py, tests/test_fused_gpu.py)
#   tune              perf/tune_gemm.py at 16384x4096->4096 (every table row x tile order)
#   tune-short        the same at 1024x8192->8192 (short-M cliffs)
#   tune-small        the same at small M x N (few 128x128 tiles: the 64-row rows' territory), TF32 and bf16
#   tune-stream-k     the KernelBench shape and the sweep's worst shapes (short M with long K, short K, small
#                     N), TF32 and bf16, heuristic order, every row with stream-K rows also as split-K 2 and 4
#   finish-bandwidth  finish_normalize against a device copy
#   cuda-facts        perf/cuda_facts.py: SM count, L2, rated clocks, DRAM peak (cuda-python: carry its wheels in .whl/)
#   clocks            perf/clocks_under_load.py: ms, SM clock and power of gemmbn's and cuBLAS's GEMMs (at the
#                     KernelBench shape; GEMMBN_CLOCKS_SIZE="M K N" for another)
#   breakdown         each launch alone
#   host              perf/host_overhead.py --profile --launch and perf/anatomy.py at the tiny shape (host-bound)
#   bench             perf/bench.py at the KernelBench shape, every provider
#   bench-report      perf/bench.py with GEMMBN_BENCH_ARGS (default: --set kernelbench,tiny,sweep --max-minutes
#                     5.5), then perf/report.py: bench.csv, bench.txt, bench.md (the README's table), bench.png
#   profile-long-k    Nsight Compute on our bf16 GEMM (no statistics node) and cuBLAS's addmm at 4096x8192->2048
#                     (multi-wave long K, where ours trails); other cases by
#                     GEMMBN_PROFILE_ARGS="--dtype D --size M K N"; GEMMBN_PROFILE_NODE=1: ours with the statistics
#                     node and its finish (the training forward's two kernels)
#   profile-y-pass    Nsight Compute on the training forward with its statistics from y (the GEMM without the node, the
#                     finish's pass over y; launch_once.py --module) and cuBLAS's addmm, TF32 and bf16, at
#                     GEMMBN_PROFILE_SIZE (default 65536 1024 1024, where the sweep trails by under 1%)
#   tune-epilogue     perf/tune_gemm.py, every row, heuristic order, TF32 and bf16, at 16384x512->8192,
#                     65536x1024->1024 and 16384x4096->4096 (the statistics node's cost); other sizes by
#                     GEMMBN_TUNE_SIZES="M K N;M K N;..."
#   bench-short-k     perf/bench.py --set short_k, TF32 and bf16, without torch.compile
#   sweep             perf/bench.py's sweep set, TF32 and bf16, every provider back to back and (no torch.compile)
#                     synchronized, with perf/report.py's tables (disturbed pairs marked against the last committed
#                     run) and plots where matplotlib is installed
#   main-job          python -m gemmbn
#   backward          the backward's GPU tests (tests/test_backward_gpu.py)
#   train-step        perf/train_step.py: forward + backward (+ SGD step) against eager and torch.compile at
#                     issue 16's four shapes, fp32 / TF32 / bf16 (sizes by GEMMBN_TRAIN_SIZES="M K N;...")
#   fp32-step         the training step where gemmbn's fp32 `highest` SGD step trailed eager (perf/NOTES.md v48, v49;
#                     4096x1024->1024, GEMMBN_STEP_SIZE="M K N" to change): perf/train_step.py (fp32 and TF32, the
#                     control, gemmbn and eager, both modes), perf/host_step.py's host time per piece in both modes
#                     (the SGD update's, and the weight split's that every update brings), then
#                     perf/step_anatomy.py's kernels per step in both modes
#   statistics-source perf/statistics_source.py without torch.compile, three runs (a disturbed run shows as eager
#                     far off the others): the y pass against the epilogue where the rule's choice is least measured
#                     (perf/NOTES.md v25), TF32 and bf16; other sizes by GEMMBN_SOURCE_SIZES="M K N;...", other
#                     precisions by GEMMBN_SOURCE_CONFIGS (default tf32,bf16)
#   anatomy           perf/anatomy.py (kernels and GPU idle time per forward) at the sweep's worst training
#                     shapes, gemmbn and eager; other cases by GEMMBN_ANATOMY_CASES="M K N dtype;..."
#   merge-per-tile    the statistics node merged once per tile on the cooperative 256x128 tile (an experiment build's
#                     bf16 rows 15 (per subtile) and 16 (per tile), TF32 row 13; perf/NOTES.md v59): tune_gemm with the
#                     node against rows 0 and 4 and cuBLAS, L2 flushed, at long K (GEMMBN_MERGE_SIZES="M K N;..."),
#                     clocks under load at the KernelBench shape, then the bf16 training forward by the rule against
#                     rows 16 and 15 with the epilogue's statistics, back to back, two rounds
#   merge-per-tile-tf32  the TF32 training forward by the rule against rows 0 and 13 forced (row 0's tile, and the
#                     256x128 tile merged once per tile, which the rule takes under 4 TB/s of DRAM) with the epilogue's
#                     statistics, back to back and synchronized, two rounds each (GEMMBN_MERGE_SIZES)
#   ragged-tests      the GPU tests of test_native_gpu, test_fused_gpu and test_operators_gpu with a build of CMake
#                     GEMMBN_RAGGED_TILE_FROM_Y=ON, the default since perf/NOTES.md v63 (GEMMBN_RAGGED_BUILD, a folder
#                     holding its _operators.so; default python/gemmbn, the carried build): the node without its
#                     code for partial row blocks, the finish reading a ragged last row block from y (v61);
#                     compute-sanitizer's memcheck (and racecheck on the finish kernel) on ragged training forwards
#                     through both of the finish's walks first
#   ragged-ab         this tree's build's training forward against a carried build of GEMMBN_RAGGED_TILE_FROM_Y=OFF
#                     (GEMMBN_TILE_PARTIALS_BUILD, default perf/results/raw/tile-partials; `make build-experiment
#                     EXPERIMENT_OPTIONS=GEMMBN_RAGGED_TILE_FROM_Y=OFF EXPERIMENT_OUT=perf/results/raw/tile-partials`),
#                     both methods, three rounds, TF32 and bf16, at GEMMBN_RAGGED_SIZES (default: M a multiple of 128,
#                     where only the GEMM's code size differs, and ragged M, where the finish reads the last rows of y)
#   y-claims          the y pass's phase 2 claimed (GEMMBN_FINISH_Y_CLAIMS=1) and half claimed (the experiment
#                     GEMMBN_FINISH_Y_CLAIM_SHARE=50) against its static walk (perf/NOTES.md v58): the GPU tests of the
#                     walks, then the training forward at the sweep's y-pass shapes (TF32 at K = 2048 takes the
#                     epilogue: the control), TF32 and bf16, back to back and synchronized, three rounds; other sizes by
#                     GEMMBN_Y_CLAIMS_SIZES="M K N;..."
#   wide-tiles        16-bit's cooperative 256x128 row against row 0 (perf/NOTES.md v43): every row's GPU test,
#                     tune_gemm over rows 0, 6 and 8 without the statistics node at the long-K shapes where the H100
#                     trailed (GEMMBN_TUNE_SIZES to change), then the bf16 forward there (perf/ab.sh, two rounds) by the
#                     rule (row 8, the y pass) against row 0's tile (GEMMBN_STATISTICS_SOURCE=epilogue,
#                     GEMMBN_PLAIN_ROW=6): the check of v43's clauses on another device
#   wide-tiles-tf32   the same for TF32 (perf/NOTES.md v44): tune_gemm over TF32 rows 0, 7 and 9 (cooperative 256x128
#                     c1x2) without the node at the H100's trailing TF32 shapes, then the TF32 forward there by the rule
#                     (row 9, the y pass from K = 4096) against row 0's tile (GEMMBN_STATISTICS_SOURCE=epilogue,
#                     GEMMBN_PLAIN_ROW=7: the rule before v44 at these shapes)
#   wide-tiles-rest   the cooperative 256x128 row without the node (16-bit row 8) where the rule never measured it
#                     (perf/NOTES.md v48): N <= 1024 at K > 4096 (row 1 there) and K <= 1024 past a wave (row 6):
#                     tune_gemm over rows 1, 6 and 8 without the node, then the bf16 forward by the rule against
#                     GEMMBN_PLAIN_ROW=8 (eval on row 8; training too where its statistics come from y) and against
#                     row 8 with the y pass (GEMMBN_PLAIN_ROW=8,GEMMBN_STATISTICS_SOURCE=y)
#   wide-tiles-rest-tf32  the same for TF32 row 9 at N <= 1024 and K > 4096 (row 1, the cooperative 128x256
#                     tile, there; at K <= 1024 row 9 lost to row 7 in v45's tune): rows 1, 7 and 9, the rule
#                     against GEMMBN_PLAIN_ROW=9
#   build-ab          two carried builds' training forwards (GEMMBN_AB_BUILDS="DIR_A DIR_B", folders each holding an
#                     _operators.so, such as under the ignored perf/results/raw/; or switches, perf/ab.sh's
#                     NAME:VAR=VALUE sides), perf/ab.sh, three rounds, back to back and synchronized, at GEMMBN_AB_SIZES
#                     (default: the local walk's shapes, few partials per column) in GEMMBN_AB_CONFIGS (tf32,bf16)
#   tall-clause       the 2x2-cluster clause (perf/NOTES.md v52, v53) on this device: the forward by the rule against
#                     row 0's tile (GEMMBN_PLAIN_ROW=7 TF32, 6 16-bit), three rounds, both methods, at GEMMBN_TALL_SIZES
#                     (default: two shapes the clause takes in both precisions, 16384x1024->2048 (TF32 only) and
#                     16384x1024->1024 (neither: a control, where both sides must tie)); GEMMBN_TALL_ROWS="tf32 12;bf16 11"
#                     times the 2x2 rows against the rule instead (the clause's edges, outside it)
#   multi-wave-x      the one-wave 128x128 row with x multicast (TF32 row 10, 16-bit 9) past a wave, where training
#                     takes row 0 with the node (perf/NOTES.md v50: `clocks` had it ahead there): tune_gemm with the
#                     node over rows 0, 4 and the x row in two orders, then the TF32 training forward by the rule
#                     against GEMMBN_STATISTICS_ROW=10, two rounds (sizes by GEMMBN_MULTI_WAVE_SIZES)
#   profile-split     Nsight Compute on the split GEMM (perf/ncu/profile.sh --split): details and SASS pages
#   profile-short-k   Nsight Compute on the bf16 GEMM at 16384x512->8192 with and without the statistics node
#                     (the short-K shapes' cost), plus tune_gemm.py there over every tile order
# The one-off A/B steps of settled questions (flow-ab, flow-cost, presplit-rule, split-pass, tf32-stages, finish-local,
# tf32-y-pass, one-wave-order: perf/NOTES.md v34-v48 give their commands and results) are in
# `git show 45a4584:perf/gpu_session.sh`.
# With a carried python/gemmbn/_operators.so the build is skipped and PYTHONPATH=python uses it (one build loads
# under every torch >= 2.10, so one made on the CPU machine serves).
# GEMMBN_COMMIT: pass the commit (GEMMBN_COMMIT=abc1234 bash perf/gpu_session.sh ...): the device's copy of
# .git has been stale, so its rev-parse names an older commit in the CSVs.
# GEMMBN_SESSION_SECONDS (default 560) caps the whole call: each step's own time limit shrinks to what
# is left, and a step with under 20 s left is skipped, so the logs are archived before the device
# tool's 600 s limit kills the call.
set -uo pipefail
cd "$(dirname "$0")/.."
archive_dir=${1:?usage: bash perf/gpu_session.sh OUT_DIR [STEP ...]}
shift
out=$archive_dir/session
mkdir -p "$out"
trap 'tar czf "$archive_dir/session.tgz" -C "$archive_dir" session && rm -rf "$out" && echo "logs: session.tgz"' EXIT
export PYTHONUNBUFFERED=1
step() { echo "== $1 ($(date +%T))"; }
# Whether gemmbn's operators load (the installed build, or python/gemmbn's with PYTHONPATH=python), and from where.
load_check="import gemmbn._native as n, sys; r = n.load_operators(); \
print(r or 'operators: ' + n.__file__.replace('_native.py', '_operators.so')); sys.exit(r is not None)"
steps=${*:-build smoke tests tune tune-short finish-bandwidth breakdown bench main-job}
deadline=$(( $(date +%s) + ${GEMMBN_SESSION_SECONDS:-560} ))
# limit SECONDS: the step's limit, or what is left of the call (less a margin for the archive).
limit() { local left=$(( deadline - $(date +%s) - 10 )); echo $(( left < $1 ? left : $1 )); }
# require_rows DTYPE ROWS: stop where the carried build lacks a row ROWS names. tune_gemm would skip such a row and
# GEMMBN_PLAIN_ROW would ignore it (the rule's row then runs on both sides of an A/B: the rule timed against itself).
require_rows() {
  python3 -c "from gemmbn import debug; n = len(debug.gemm_configs('$1')); missing = [r for r in ($2,) if r >= n]
raise SystemExit(f'$name: rows {missing} are not in this build ({n} $1 rows); carry the build that has them'
                 if missing else 0)"
}
# bench_ab PREFIX SECONDS ROUNDS SIDE... -- BENCH_ARGS...: perf/ab.sh over perf/bench.py (the sides as ab.sh takes
# them, ROUNDS rounds, at most SECONDS), then perf/ab_summary.py's table against the first side: PREFIX.md, PREFIX.csv.
bench_ab() {
  local prefix=$1 seconds=$2 rounds=$3 sides=() files=() side
  shift 3
  while (($#)) && [[ $1 != -- ]]; do sides+=("$1"); shift; done
  shift
  timeout $(limit "$seconds") bash perf/ab.sh "$out/$prefix" "${sides[@]}" "$rounds" -- perf/bench.py "$@" \
    --out "$out/$prefix/bench_{side}_{round}.csv" > "$out/$prefix.log" 2>&1
  for side in "${sides[@]}"; do
    if [[ $side == *:*=* ]]; then side=${side%%:*}; else side=$(basename "$side"); fi
    files+=("$out/$prefix"/bench_"$side"_*.csv)
  done
  python3 perf/ab_summary.py "${files[@]}" --out "$out/$prefix.csv" \
    --note "perf/gpu_session.sh $name at $GEMMBN_COMMIT: ${sides[*]}" | tee "$out/$prefix.md"
}
# bench_ab_both_methods PREFIX SECONDS ROUNDS SIDE... -- BENCH_ARGS...: bench_ab back to back (PREFIX-back-to-back.*),
# then synchronized before each call (bench.py --sync; PREFIX-sync.*).
bench_ab_both_methods() {
  local prefix=$1
  shift
  bench_ab "$prefix-back-to-back" "$@"
  bench_ab "$prefix-sync" "$@" --sync
}
# size_args SIZES: SIZES ("M K N;M K N;...") as tune_gemm.py's arguments (--size M K N ...), in the array size_args.
size_args() {
  local shapes shape
  IFS=';' read -r -a shapes <<< "$1"
  size_args=()
  for shape in "${shapes[@]}"; do size_args+=(--size $shape); done
}
# row_tests PREFIX: every configuration row's GPU test in the carried build (PREFIX-tests.log).
row_tests() {
  timeout $(limit 150) python3 -m pytest -q -rs tests/test_native_gpu.py -k every_configuration_row 2>&1 \
    | tee "$out/$1-tests.log" | tail -3
}
# wide_tile_check PREFIX DTYPE CONFIG ROWS SIDES SIZES (the wide-tiles steps): every row's GPU test, tune_gemm over
# ROWS without the statistics node at SIZES (GEMMBN_TUNE_SIZES overrides), then the forward there by the rule against
# each of SIDES (perf/ab.sh NAME:ENV, space-separated; two rounds; cuBLAS's addmm timed in the same lines, whose drift
# between sides shows the device's: perf/NOTES.md v44).
wide_tile_check() {
  local prefix=$1 dtype=$2 config=$3 rows=$4 sizes=${GEMMBN_TUNE_SIZES:-$6} sides
  read -r -a sides <<< "$5"
  require_rows "$dtype" "$rows" || return 1
  row_tests "$prefix"
  size_args "$sizes"
  timeout $(limit 150) python3 perf/tune_gemm.py --dtypes "$dtype" --no-stats --rows "$rows" --rasters 0 --swizzles 0 \
    --iters 20 "${size_args[@]}" --out "$out/tune-$prefix.csv" 2>&1 | tee "$out/tune-$prefix.txt" \
    | awk '/:/{c=0} {c++; if (c<=8) print}'
  bench_ab "$prefix-ab" 260 2 rule:GEMMBN_PLAIN_ROW= "${sides[@]}" -- --sizes "$sizes" --configs "$config" \
    --providers gemmbn,eager,cublas --no-compile --iters 20
}
# build-ab's default sizes: the local walk's shapes (few partials per column; perf/NOTES.md v45, v47).
local_sizes="256 8192 8192;256 4096 4096;256 1024 1024;1024 4096 4096;1024 1024 1024;4096 1024 1024;2048 4096 1024;4096 8192 512"
# The long-K shapes of the merge-per-tile steps (the 256x128 tile against row 0).
merge_sizes=${GEMMBN_MERGE_SIZES:-16384 4096 4096;65536 4096 4096;16384 8192 2048;4096 4096 4096;4096 8192 2048}
# The ragged steps' builds of CMake GEMMBN_RAGGED_TILE_FROM_Y, ON (the default) and OFF (folders with an _operators.so).
ragged=${GEMMBN_RAGGED_BUILD:-python/gemmbn}
tile_partials=${GEMMBN_TILE_PARTIALS_BUILD:-perf/results/raw/tile-partials}
export GEMMBN_COMMIT=${GEMMBN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

# The perf extra on a bare device (no package index there): carried wheels of cuda-bindings and cuda-pathfinder
# (cuda-python's runtime bindings, for perf/cuda_facts.py: the ncu capture range, the device's clocks).
if compgen -G ".whl/cuda_bindings-*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/gemmbn-perf-site .whl/cuda_bindings-*.whl \
    .whl/cuda_pathfinder-*.whl && export PYTHONPATH=/tmp/gemmbn-perf-site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -f python/gemmbn/_operators.so ]; then
  step "prebuilt extension (carried)"
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "$load_check" || exit 1
  steps=$(printf "%s\n" $steps | grep -vx build)  # the word build alone (not build-ab)
fi
for name in $steps; do
  if (( $(limit 20) < 20 )); then echo "== $name skipped: the call's time is up"; continue; fi
  step "$name"
  case $name in
    build)
      python3 -m pip install -q --no-index --no-deps --target /tmp/gemmbn-site .whl/nvidia_cutlass-*.whl || exit 1
      { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
        nvcc --version | tail -2
        python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$out/env.txt" 2>&1
      cat "$out/env.txt"
      t0=$(date +%s)
      if ! PYTHONPATH=/tmp/gemmbn-site${PYTHONPATH:+:$PYTHONPATH} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
          python3 -m pip install --no-build-isolation --no-deps -v . -Ccmake.define.GEMMBN_PTXAS_VERBOSE=ON \
          > "$out/build.log" 2>&1; then
        grep -E "error|Error" "$out/build.log" | head -40
        tail -30 "$out/build.log"
        exit 1
      fi
      echo "build: $(( $(date +%s) - t0 )) s"
      # Every kernel's stack frame and spills (want 0) and registers.
      grep -E "Compiling entry|stack frame|Used [0-9]+ registers" "$out/build.log" \
        | sed -E 's/Compiling entry function .(_Z[^ ]{0,60}).*/\1/' > "$out/ptxas.txt"
      grep "stack frame" "$out/ptxas.txt" | sort | uniq -c
      (cd /tmp && python3 -c "$load_check") || exit 1
      (cd /tmp && cp "$(python3 -c 'import gemmbn, pathlib; print(pathlib.Path(gemmbn.__file__).with_name("_operators.so"))')" "$archive_dir/") ;;
    cuda-facts)
      timeout $(limit 60) python3 perf/cuda_facts.py 2>&1 | tee "$out/cuda_facts.txt" ;;
    gpu-tests)
      timeout $(limit 540) python3 -m pytest -q -rs --durations=10 -m gpu tests 2>&1 | tee "$out/gpu_tests.log" | tail -25 ;;
    smoke)
      timeout $(limit 150) python3 -m pytest -x -q -rs tests/test_native_gpu.py -k "split or every_configuration_row" 2>&1 \
        | tee "$out/smoke.log" | tail -15 ;;
    tests)
      timeout $(limit 420) python3 -m pytest -q -rs tests/test_native_gpu.py tests/test_fused_gpu.py 2>&1 \
        | tee "$out/tests.log" | tail -25 ;;
    tune)
      timeout $(limit 150) python3 perf/tune_gemm.py --out "$out/tune.csv" 2>&1 | tee "$out/tune.txt" \
        | awk '/:/{c=0} {c++; if (c<=10) print}' ;;
    tune-short)
      timeout $(limit 120) python3 perf/tune_gemm.py --size 1024 8192 8192 --swizzles 1,8 --out "$out/tune_short.csv" 2>&1 \
        | tee "$out/tune_short.txt" | awk '/:/{c=0} {c++; if (c<=8) print}' ;;
    tune-small)
      for size in "128 1024 512" "256 1024 1024" "256 4096 4096" "256 8192 8192" "512 2048 2048" \
                  "1024 1024 1024" "1024 4096 4096" "4096 1024 1024" "2048 4096 4096" "1024 8192 8192"; do
        (( $(limit 20) < 20 )) && break
        timeout $(limit 60) python3 perf/tune_gemm.py --size $size --dtypes float32,bfloat16 --rasters 0 \
          --swizzles 8 --iters 15 --out "$out/tune_small_${size// /x}.csv" 2>&1 | tee -a "$out/tune_small.txt" \
          | awk '/:/{c=0} {c++; if (c<=7) print}'
      done ;;
    tune-stream-k)
      for size in "16384 4096 4096" "256 8192 8192" "4096 8192 512" "1024 4096 4096" "1024 8192 8192" \
                  "16384 8192 512" "16384 512 8192" "4096 512 8192" "65536 1024 1024"; do
        (( $(limit 20) < 20 )) && break
        timeout $(limit 60) python3 perf/tune_gemm.py --size $size --dtypes float32,bfloat16 --rasters 0 \
          --swizzles 8 --splits=1,2,4 --iters 15 --out "$out/tune_sk_${size// /x}.csv" 2>&1 \
          | tee -a "$out/tune_stream_k.txt" | awk '/:/{c=0} {c++; if (c<=6) print}'
      done ;;
    finish-bandwidth)
      timeout $(limit 60) python3 perf/finish_bandwidth.py 2>&1 | tee "$out/finish.txt" ;;
    clocks)
      timeout $(limit 170) python3 perf/clocks_under_load.py ${GEMMBN_CLOCKS_SIZE:+--size $GEMMBN_CLOCKS_SIZE} 2>&1 \
        | tee "$out/clocks.txt" ;;
    host)
      timeout $(limit 150) python3 perf/host_overhead.py --profile --launch 2>&1 | tee "$out/host.txt" | head -45
      timeout $(limit 90) python3 perf/anatomy.py --size 128 1024 512 --dtype bfloat16 2>&1 \
        | tee "$out/anatomy_tiny.txt" | tail -25 ;;
    breakdown)
      timeout $(limit 90) python3 perf/breakdown.py 2>&1 | tee "$out/breakdown.txt" | tail -6 ;;
    bench)
      timeout $(limit 300) python3 perf/bench.py --set kernelbench --providers gemmbn,eager,compile,cublas,gemmbn-gemm-only \
        --out "$out/bench.csv" 2>&1 | tee "$out/bench.txt" | grep "^|" ;;
    bench-report)
      read -r -a bench_args <<< "${GEMMBN_BENCH_ARGS:---set kernelbench,tiny,sweep --max-minutes 5.5}"
      timeout $(limit 540) python3 perf/bench.py "${bench_args[@]}" --out "$out/bench.csv" 2>&1 | tee "$out/bench.txt" \
        | grep "^|"
      python3 perf/report.py "$out/bench.csv" --readme-table "$out/bench.md" --plot "$out/bench.png" > /dev/null ;;
    bench-short-k)
      # The short_k set without torch.compile (its compilations would take the call's time): train, eval,
      # the plain GEMM and cuBLAS side by side.
      timeout $(limit 120) python3 perf/bench.py --set short_k --configs tf32,bf16 \
        --providers gemmbn,eager,cublas,gemmbn-gemm-only --out "$out/bench_short_k.csv" 2>&1 \
        | tee "$out/bench_short_k.txt" | grep "^|" ;;
    sweep)
      # Both timing methods (issue 18): back to back with every provider, then synchronized before each call without
      # torch.compile; a plot each. 30 calls per point (10 left the host-bound small shapes 2-4x off: perf/NOTES.md
      # v19); both runs took ~110 s together on the H200.
      timeout $(limit 300) python3 perf/bench.py --set sweep --configs tf32,bf16 --iters 30 \
        --providers gemmbn,eager,compile,cublas,gemmbn-gemm-only --out "$out/sweep.csv" 2>&1 | tee "$out/sweep.txt" \
        | grep "^|" | head -90
      timeout $(limit 150) python3 perf/bench.py --set sweep --configs tf32,bf16 --iters 30 --sync \
        --providers gemmbn,eager,cublas,gemmbn-gemm-only --out "$out/sweep-sync.csv" > "$out/sweep-sync.txt" 2>&1
      # The tables mark (‡) the pairs whose eager, compile or cuBLAS times moved from the last committed run of the
      # same kind (a disturbed device, perf/NOTES.md v24) and count the rest.
      for csv in "$out"/sweep.csv "$out"/sweep-sync.csv; do
        python3 perf/report.py "$csv" --earlier-run auto --readme-table "${csv%.csv}.md" 2>&1 | tail -1
      done ;;
    main-job)
      timeout $(limit 200) python3 -m gemmbn 2>&1 | tee "$out/main.log" | tail -25 ;;
    backward)
      timeout $(limit 300) python3 -m pytest -q -rs tests/test_backward_gpu.py 2>&1 | tee "$out/backward.log" | tail -15 ;;
    train-step)
      timeout $(limit 400) python3 perf/train_step.py ${GEMMBN_TRAIN_SIZES:+--sizes "$GEMMBN_TRAIN_SIZES"} \
        --out "$out/train_step.csv" 2>&1 | tee "$out/train_step.txt" | tail -30 ;;
    fp32-step)
      read -r M K N <<< "${GEMMBN_STEP_SIZE:-4096 1024 1024}"
      timeout $(limit 150) python3 perf/train_step.py --sizes "$M $K $N" --configs fp32,tf32 --providers gemmbn,eager \
        --iters 30 --out "$out/fp32-step.csv" 2>&1 | tee "$out/fp32-step.txt" | tail -6
      timeout $(limit 120) python3 perf/host_step.py --size $M $K $N --config fp32 --steps 100 2>&1 \
        | tee "$out/fp32-step-host.txt"
      for mode in fwd_bwd step; do
        timeout $(limit 60) python3 perf/step_anatomy.py --size $M $K $N --config fp32 --mode $mode --iters 10 2>&1 \
          | tee -a "$out/fp32-step-anatomy.txt" | head -16
      done ;;
    statistics-source)
      sizes="5120 1024 512;4352 512 512;640 512 8192;384 1024 8192;2560 1024 1024;3072 1024 1024;1536 1024 2048"
      sizes=${GEMMBN_SOURCE_SIZES:-$sizes}
      for run in 1 2 3; do
        timeout $(limit 100) python3 perf/statistics_source.py --no-compile --iters 30 --sizes "$sizes" \
          --configs "${GEMMBN_SOURCE_CONFIGS:-tf32,bf16}" --out "$out/statistics-source-$run.csv" 2>&1 \
          | tee "$out/statistics-source-$run.txt" | grep "^|"
      done ;;
    profile-split)
      timeout $(limit 240) bash perf/ncu/profile.sh "$out/ncu" --split > "$out/ncu.log" 2>&1
      rm -f "$out"/ncu/*.ncu-rep  # the text pages come back; the reports are too large
      grep -E "Duration|Throughput|Registers|Theoretical Occupancy" "$out/ncu/gemm.details.txt" | head -30 ;;
    profile-short-k)
      for variant in stats no-stats; do
        flag=$([[ $variant == no-stats ]] && echo --no-stats || true)
        timeout $(limit 120) bash perf/ncu/profile.sh "$out/ncu-short-k-$variant" --dtype bfloat16 --size 16384 512 8192 \
          $flag > "$out/ncu-short-k-$variant.log" 2>&1
        rm -f "$out/ncu-short-k-$variant"/*.ncu-rep "$out/ncu-short-k-$variant"/*.raw.csv
        echo "-- $variant"
        grep -E "^  *(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per)" \
          "$out/ncu-short-k-$variant/gemm.details.txt" | head -8
      done
      timeout $(limit 60) python3 perf/tune_gemm.py --size 16384 512 8192 --dtypes bfloat16 --iters 10 \
        --out "$out/tune_short_k_orders.csv" 2>&1 | tee "$out/tune_short_k_orders.txt" | head -12 ;;
    profile-long-k)
      read -r -a profile_args <<< "${GEMMBN_PROFILE_ARGS:---dtype bfloat16 --size 4096 8192 2048}"
      for variant in ours cublas; do
        node=$([[ ${GEMMBN_PROFILE_NODE:-0} == 1 ]] || echo --no-stats)
        flag=$([[ $variant == cublas ]] && echo --cublas || echo "$node")
        timeout $(limit 150) bash perf/ncu/profile.sh "$out/ncu-long-k-$variant" "${profile_args[@]}" $flag \
          > "$out/ncu-long-k-$variant.log" 2>&1
        rm -f "$out/ncu-long-k-$variant"/*.ncu-rep "$out/ncu-long-k-$variant"/finish.*
        echo "-- $variant"
        headline="Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Grid Size|Block Size"
        grep -hE "^  *($headline|Dynamic Shared)" "$out/ncu-long-k-$variant"/*.details.txt | head -10
      done ;;
    profile-y-pass)
      read -r -a size <<< "${GEMMBN_PROFILE_SIZE:-65536 1024 1024}"
      for dtype in float32 bfloat16; do
        for variant in y-pass cublas; do
          dir="$out/ncu-y-pass-$dtype-$variant"
          flag=$([[ $variant == cublas ]] && echo --cublas || echo --module)
          GEMMBN_STATISTICS_SOURCE=y timeout $(limit 150) bash perf/ncu/profile.sh "$dir" --dtype $dtype \
            --size "${size[@]}" $flag > "$dir.log" 2>&1
          rm -f "$dir"/*.ncu-rep
          echo "-- $dtype $variant"
          headline="Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Grid Size"
          grep -hE "^  *($headline)" "$dir"/*.details.txt | head -12
        done
      done ;;
    tune-epilogue)
      # The statistics node's cost where it shows (short K, small N) and at the KernelBench shape.
      IFS=';' read -r -a sizes <<< "${GEMMBN_TUNE_SIZES:-16384 512 8192;65536 1024 1024;16384 4096 4096}"
      for size in "${sizes[@]}"; do
        (( $(limit 20) < 20 )) && break
        timeout $(limit 90) python3 perf/tune_gemm.py --size $size --dtypes float32,bfloat16 --rasters 0 \
          --swizzles 1 --iters 10 --out "$out/tune_epilogue_${size// /x}.csv" 2>&1 \
          | tee -a "$out/tune_epilogue.txt" | awk '/:/{c=0} {c++; if (c<=9) print}'
      done ;;
    wide-tiles)
      wide_tile_check wide bfloat16 bf16 0,6,8 row0:GEMMBN_STATISTICS_SOURCE=epilogue,GEMMBN_PLAIN_ROW=6 \
        "4096 8192 2048;4096 4096 4096;4096 2048 8192;16384 8192 2048;16384 4096 4096;16384 2048 8192;65536 4096 4096;1024 4096 4096" ;;
    wide-tiles-tf32)
      wide_tile_check wide-tf32 float32 tf32 0,7,9 row0:GEMMBN_STATISTICS_SOURCE=epilogue,GEMMBN_PLAIN_ROW=7 \
        "4096 8192 2048;16384 8192 2048;4096 4096 4096;4096 2048 8192;16384 4096 4096;65536 4096 4096;1024 4096 4096" ;;
    wide-tiles-rest)
      wide_tile_check wide-rest bfloat16 bf16 1,6,8 \
        "row8:GEMMBN_PLAIN_ROW=8 row8y:GEMMBN_PLAIN_ROW=8,GEMMBN_STATISTICS_SOURCE=y" \
        "16384 8192 512;16384 8192 1024;8192 8192 1024;65536 1024 1024;16384 1024 1024;65536 512 512" ;;
    wide-tiles-rest-tf32)
      wide_tile_check wide-rest-tf32 float32 tf32 1,7,9 row9:GEMMBN_PLAIN_ROW=9 \
        "16384 8192 512;16384 8192 1024;8192 8192 1024;65536 8192 512" ;;
    build-ab)
      read -r -a builds <<< "${GEMMBN_AB_BUILDS:-}"
      ((${#builds[@]} == 2)) \
        || { echo "build-ab: GEMMBN_AB_BUILDS must name two sides (build folders or NAME:VAR=VALUE)"; continue; }
      bench_ab_both_methods build-ab 240 3 "${builds[@]}" -- --sizes "${GEMMBN_AB_SIZES:-$local_sizes}" \
        --configs "${GEMMBN_AB_CONFIGS:-tf32,bf16}" --providers gemmbn,eager --no-compile --iters 30 ;;
    tall-clause)
      IFS=';' read -r -a runs <<< "${GEMMBN_TALL_ROWS:-tf32 7;bf16 6}"
      for run in "${runs[@]}"; do
        read -r config row <<< "$run"
        bench_ab_both_methods "tall-clause-$config-row$row" 150 3 rule:GEMMBN_AB_SIDE=rule row$row:GEMMBN_PLAIN_ROW=$row -- \
          --sizes "${GEMMBN_TALL_SIZES:-65536 1024 1024;32768 1024 4096;16384 1024 2048;16384 1024 1024}" \
          --configs "$config" --providers gemmbn --no-compile --iters 30
      done ;;
    multi-wave-x)
      sizes=${GEMMBN_MULTI_WAVE_SIZES:-16384 4096 4096;65536 4096 4096;16384 2048 8192}
      size_args "$sizes"
      for run in "float32 0,4,10" "bfloat16 0,4,9"; do
        read -r dtype rows <<< "$run"
        # raster 0 is the heuristic order (rows 0 and 4's), 1 along M (the x row's)
        timeout $(limit 120) python3 perf/tune_gemm.py --dtypes "$dtype" --rows "$rows" --rasters 0,1 --swizzles 0 \
          --iters 20 "${size_args[@]}" --out "$out/tune-multi-wave-x-$dtype.csv" 2>&1 \
          | tee "$out/tune-multi-wave-x-$dtype.txt" | awk '/:/{c=0} {c++; if (c<=7) print}'
      done
      bench_ab multi-wave-x-ab 200 2 rule:GEMMBN_STATISTICS_ROW= row10:GEMMBN_STATISTICS_ROW=10 -- --sizes "$sizes" \
        --configs tf32 --providers gemmbn,eager,cublas --no-compile --iters 20 ;;
    anatomy)
      IFS=';' read -r -a cases <<< "${GEMMBN_ANATOMY_CASES:-16384 8192 512 bfloat16;16384 512 8192 bfloat16;4096 8192 2048 bfloat16;65536 512 512 bfloat16;1024 1024 1024 bfloat16}"
      for case in "${cases[@]}"; do
        (( $(limit 20) < 20 )) && break
        read -r M K N dtype <<< "$case"
        timeout $(limit 60) python3 perf/anatomy.py --size $M $K $N --dtype $dtype --providers gemmbn,eager 2>&1 \
          | tee -a "$out/anatomy.txt" | grep -E "x[0-9]|kernels per forward|H200"
      done ;;
    merge-per-tile)
      require_rows bfloat16 "15,16" || continue
      size_args "$merge_sizes"
      for run in "bfloat16 0,4,15,16" "float32 0,4,13"; do
        read -r dtype rows <<< "$run"
        timeout $(limit 120) python3 perf/tune_gemm.py --dtypes "$dtype" --rows "$rows" --rasters 0 --swizzles 0 \
          --iters 20 "${size_args[@]}" --out "$out/tune-merge-per-tile-$dtype.csv" 2>&1 \
          | tee "$out/tune-merge-per-tile-$dtype.txt" | awk '/:/{c=0} {c++; if (c<=8) print}'
      done
      timeout $(limit 90) python3 perf/clocks_under_load.py --dtypes bfloat16 --rows 0,15,16 2>&1 \
        | tee "$out/clocks-merge-per-tile.txt"
      bench_ab merge-per-tile-ab 200 2 rule:GEMMBN_STATISTICS_ROW= \
        row16:GEMMBN_STATISTICS_SOURCE=epilogue,GEMMBN_STATISTICS_ROW=16 \
        row15:GEMMBN_STATISTICS_SOURCE=epilogue,GEMMBN_STATISTICS_ROW=15 -- --sizes "$merge_sizes" --configs bf16 \
        --providers gemmbn,eager,cublas --no-compile --iters 20 ;;
    merge-per-tile-tf32)
      require_rows float32 13 || continue
      bench_ab_both_methods merge-per-tile-tf32-ab 200 2 rule:GEMMBN_STATISTICS_ROW= \
        row0:GEMMBN_STATISTICS_SOURCE=epilogue,GEMMBN_STATISTICS_ROW=0 \
        row13:GEMMBN_STATISTICS_SOURCE=epilogue,GEMMBN_STATISTICS_ROW=13 -- \
        --sizes "$merge_sizes" --configs tf32 --providers gemmbn,eager,cublas --no-compile --iters 20 ;;
    ragged-tests)
      [[ -f $ragged/_operators.so ]] || { echo "$name: carry $ragged/_operators.so"; continue; }
      stage=$(mktemp -d) && cp -r python/gemmbn "$stage/" && cp "$ragged/_operators.so" "$stage/gemmbn/"
      PYTHONPATH=$stage python3 -c "from gemmbn import debug; assert debug.ragged_tile_from_y(), 'not that build'" \
        || continue
      # memcheck first (a minute): ragged training forwards with the epilogue's statistics, through both walks
      forwards="import torch, gemmbn
for dtype in (torch.bfloat16, torch.float32):
    for M, K, N in ((1000, 512, 264), (8200, 512, 1032)):
        layer = gemmbn.GemmScaleBatchNorm(K, N, (N,)).cuda().to(dtype).train()
        assert layer(torch.randn(M, K, device='cuda', dtype=dtype)).isfinite().all()
print('forwards ran')"
      for walk in 0 1; do
        timeout $(limit 100) env PYTHONPATH="$stage" GEMMBN_STATISTICS_SOURCE=epilogue GEMMBN_FINISH_DATAFLOW=$walk \
          compute-sanitizer --tool memcheck --error-exitcode 1 python3 -c "$forwards" 2>&1 \
          | tee -a "$out/ragged-memcheck.log" | tail -3
        # racecheck on the finish alone (its shared memory; CUTLASS's mbarrier pipelines are not what changed)
        timeout $(limit 60) env PYTHONPATH="$stage" GEMMBN_STATISTICS_SOURCE=epilogue GEMMBN_FINISH_DATAFLOW=$walk \
          compute-sanitizer --tool racecheck --kernel-name kns=finish_normalize --error-exitcode 1 \
          python3 -c "$forwards" 2>&1 | tee -a "$out/ragged-racecheck.log" | tail -3
      done
      timeout $(limit 540) env PYTHONPATH="$stage" python3 -m pytest -q -rs tests/test_native_gpu.py \
        tests/test_fused_gpu.py tests/test_operators_gpu.py 2>&1 | tee "$out/ragged-tests.log" | tail -8 ;;
    ragged-ab)
      [[ -f $tile_partials/_operators.so ]] || { echo "$name: carry $tile_partials/_operators.so"; continue; }
      sizes="16384 4096 4096;65536 1024 1024;4096 4096 4096;16400 4096 4096;65600 1024 1024;4000 4096 4096"
      bench_ab_both_methods ragged-ab 260 3 "$tile_partials" default:GEMMBN_AB_SIDE=default -- \
        --sizes "${GEMMBN_RAGGED_SIZES:-$sizes}" --configs tf32,bf16 --providers gemmbn,cublas --no-compile \
        --iters 30 ;;
    y-claims)
      timeout $(limit 150) python3 -m pytest -q -rs tests/test_fused_gpu.py -k "statistics_sources or y_pass_claims" \
        2>&1 | tee "$out/y-claims-tests.log" | tail -3
      sizes="65536 1024 1024;16384 512 8192;65536 512 512;16384 1024 1024;4096 512 8192;16384 2048 8192;4096 1024 1024"
      bench_ab_both_methods y-claims 250 3 static:GEMMBN_FINISH_Y_CLAIMS=0 claims:GEMMBN_FINISH_Y_CLAIMS=1 \
        half:GEMMBN_FINISH_Y_CLAIMS=1,GEMMBN_FINISH_Y_CLAIM_SHARE=50 -- \
        --sizes "${GEMMBN_Y_CLAIMS_SIZES:-$sizes}" --configs tf32,bf16 --providers gemmbn,eager --no-compile \
        --iters 30 ;;
    *) echo "unknown step '$name'" ;;
  esac
done
