#!/usr/bin/env bash
# Same-call A/B of two builds or package trees, alternating A, B, A, B, ... so that the host's speed and the
# GPU's clocks and power state fall on both alike:
#   bash perf/ab.sh OUT_DIR A B ROUNDS -- SCRIPT [ARGS...]
# A and B are folders (of different names) holding either
#   - a gemmbn/ package with its _operators.so: a host-side change (a commit's python/gemmbn from `git archive`,
#     plus that commit's build output), or
#   - only an _operators.so: a kernel variant (gpu_session.sh's build output), staged with this tree's
#     python/gemmbn, so it must register this tree's operator schemas.
# Runs `python3 SCRIPT ARGS` ROUNDS times per side with PYTHONPATH at that side's package; "{side}" and "{round}"
# in ARGS become the folder's name and the round number. Output: OUT_DIR/<side>_<round>.txt. For example
#   bash perf/ab.sh $OUT a b 3 -- perf/tune_gemm.py --size 16384 4096 4096 --out $OUT/tune_{side}_{round}.csv
set -euo pipefail
out=${1:?usage: bash perf/ab.sh OUT_DIR A B ROUNDS -- SCRIPT [ARGS...]} side_a=$2 side_b=$3 rounds=$4
shift 4
[[ ${1:-} == -- ]] && shift
(($#)) || { echo "no SCRIPT given" >&2; exit 2; }
[[ $(basename "$side_a") != $(basename "$side_b") ]] || { echo "A and B need different folder names" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
declare -A package_path
for side in "$side_a" "$side_b"; do
  name=$(basename "$side")
  if [[ -f $side/gemmbn/_operators.so ]]; then
    package_path[$name]=$(cd "$side" && pwd)
  elif [[ -f $side/_operators.so ]]; then
    mkdir -p "$stage/$name"
    cp -r python/gemmbn "$stage/$name/"
    cp "$side/_operators.so" "$stage/$name/gemmbn/_operators.so"
    package_path[$name]=$stage/$name
  else
    echo "neither gemmbn/_operators.so nor _operators.so in $side" >&2
    exit 2
  fi
done
for ((round = 0; round < rounds; ++round)); do
  for side in "$side_a" "$side_b"; do
    name=$(basename "$side")
    args=()
    for arg in "$@"; do
      arg=${arg//\{side\}/$name}
      args+=("${arg//\{round\}/$round}")
    done
    echo "== $name round $round"
    PYTHONPATH=${package_path[$name]} python3 "${args[@]}" 2>&1 | tee "$out/${name}_${round}.txt"
  done
done
