#!/usr/bin/env bash
# Same-call A/B of two built extensions (kernel variants), so clocks and power state are shared:
#   bash perf/ab_extensions.sh OUT_DIR DIR_A DIR_B ROUNDS SIZE... -- [perf/tune_gemm.py arguments]
# DIR_A and DIR_B each hold one _operators.so (e.g. two gpu_session.sh build outputs, carried). For each SIZE
# ("M K N"), runs tune_gemm.py ROUNDS times per variant, alternating A, B, A, B, ... Each variant
# imports this tree's python/gemmbn with its own extension, so both must register this tree's operator schemas (a library built before a schema change fails in
# tune_gemm.py). CSVs: OUT_DIR/ab_<variant>_<MxKxN>_<round>.csv.
set -euo pipefail
out=$1 dir_a=$2 dir_b=$3 rounds=$4
shift 4
sizes=()
while (($#)) && [[ $1 != -- ]]; do sizes+=("$1"); shift; done
(($#)) && shift
cd "$(dirname "$0")/.."
mkdir -p "$out"
for variant_dir in "$dir_a" "$dir_b"; do
  ls "$variant_dir"/_operators.so >/dev/null || { echo "no _operators.so in $variant_dir" >&2; exit 2; }
done
stage=$(mktemp -d)
for variant_dir in "$dir_a" "$dir_b"; do
  name=$(basename "$variant_dir")
  mkdir -p "$stage/$name"
  cp -r python/gemmbn "$stage/$name/"
  rm -f "$stage/$name"/gemmbn/_operators.so
  cp "$variant_dir"/_operators.so "$stage/$name/gemmbn/"
done
for size in "${sizes[@]}"; do
  for ((round = 0; round < rounds; ++round)); do
    for variant_dir in "$dir_a" "$dir_b"; do
      name=$(basename "$variant_dir")
      echo "== $name $size round $round"
      PYTHONPATH=$stage/$name python3 perf/tune_gemm.py --size $size "$@" \
        --out "$out/ab_${name}_${size// /x}_${round}.csv"
    done
  done
done
rm -rf "$stage"
