#!/usr/bin/env bash
# Profile the two training-forward kernels with Nsight Compute (clocks left alone).
#   bash perf/ncu/profile.sh OUT_DIR [launch_once.py args]
# Build with -Ccmake.define.GEMMBN_LINEINFO=ON first for source-level attribution.
# Writes OUT_DIR/gemm.ncu-rep and OUT_DIR/finish.ncu-rep plus text pages: details, raw metrics (CSV),
# SASS with stall samples (how to read them: perf/README.md). With --cublas: OUT_DIR/cublas.* only, the range's
# one kernel (torch.addmm's), for a side-by-side with our GEMM.
set -euo pipefail
out=$1; shift
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
# --profile-from-start off: only the launches inside launch_once.py's cudaProfilerStart/Stop (its second forward).
common=(--clock-control none --profile-from-start off --import-source yes --set full -c 1)
if [[ " $* " == *" --cublas "* ]]; then
  reports=(cublas)
  ncu "${common[@]}" -o "$out/cublas" -f python3 "$here/launch_once.py" "$@" > "$out/cublas.ncu.log" 2>&1
else
  reports=(gemm finish)
  ncu "${common[@]}" -k regex:device_kernel -o "$out/gemm" -f python3 "$here/launch_once.py" "$@" \
    > "$out/gemm.ncu.log" 2>&1
  ncu "${common[@]}" -k regex:finish_normalize -o "$out/finish" -f python3 "$here/launch_once.py" "$@" \
    > "$out/finish.ncu.log" 2>&1
fi
for k in "${reports[@]}"; do
  ncu -i "$out/$k.ncu-rep" --page details > "$out/$k.details.txt"
  ncu -i "$out/$k.ncu-rep" --page raw --csv > "$out/$k.raw.csv"  # every metric, stall reasons included
  ncu -i "$out/$k.ncu-rep" --page source --csv --print-source sass > "$out/$k.sass.csv" 2>/dev/null || true
done
