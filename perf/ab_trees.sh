#!/usr/bin/env bash
# Same-call A/B of two gemmbn package trees (Python and extension together: a host-side change), so the
# host's speed and the GPU's clocks are shared:
#   bash perf/ab_trees.sh OUT_DIR TREE_A TREE_B ROUNDS -- SCRIPT [ARGS...]
# TREE_A and TREE_B each hold a gemmbn/ package with its _operators.so (e.g. `git archive` of a commit's
# python/gemmbn plus that commit's gpu_session.sh build output). Runs `python3 SCRIPT ARGS` ROUNDS times
# per tree, alternating A, B, A, B, ..., with PYTHONPATH=TREE; logs OUT_DIR/<tree name>_<round>.txt.
set -euo pipefail
out=$1 tree_a=$2 tree_b=$3 rounds=$4
shift 4
[[ ${1:-} == -- ]] && shift
cd "$(dirname "$0")/.."
mkdir -p "$out"
for tree in "$tree_a" "$tree_b"; do
  ls "$tree"/gemmbn/_operators.so >/dev/null || { echo "no gemmbn/_operators.so in $tree" >&2; exit 2; }
done
for ((round = 0; round < rounds; ++round)); do
  for tree in "$tree_a" "$tree_b"; do
    name=$(basename "$tree")
    echo "== $name round $round"
    PYTHONPATH=$(cd "$tree" && pwd) python3 "$@" 2>&1 | tee "$out/${name}_${round}.txt"
  done
done
