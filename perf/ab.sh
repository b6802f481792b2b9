#!/usr/bin/env bash
# Same-call A/B of builds, package trees or environment switches, alternating A, B, A, B, ... so that the host's speed
# and the GPU's clocks and power state fall on every side alike:
#   bash perf/ab.sh OUT_DIR A B [C ...] ROUNDS -- SCRIPT [ARGS...]
# Each side is one of
#   - a folder holding a gemmbn/ package with its _operators.so: a host-side change (a commit's python/gemmbn from
#     `git archive`, plus that commit's build output);
#   - a folder holding only an _operators.so: a kernel variant (gpu_session.sh's build output), staged with this tree's
#     python/gemmbn, so it must register this tree's operator schemas;
#   - NAME:VAR=VALUE[,VAR=VALUE...]: this tree's python/ (its built _operators.so) with those variables set, for the
#     switches the operators read per call (GEMMBN_FINISH_DATAFLOW, GEMMBN_FLOW_ITEMS_FIRST, ...; README.md).
# Side names (a folder's name, or NAME) must differ. Runs `python3 SCRIPT ARGS` ROUNDS times per side; "{side}" and
# "{round}" in ARGS become the side's name and the round number. Output: OUT_DIR/<side>_<round>.txt. For example
#   bash perf/ab.sh $OUT barrier:GEMMBN_FINISH_DATAFLOW=0 walk:GEMMBN_FINISH_DATAFLOW=1 3 -- perf/bench.py \
#     --sizes "4096 8192 2048" --configs bf16 --providers gemmbn --no-compile --out $OUT/bench_{side}_{round}.csv
set -euo pipefail
usage="usage: bash perf/ab.sh OUT_DIR A B [C ...] ROUNDS -- SCRIPT [ARGS...]"
out=${1:?$usage}
shift
sides=()
while (($#)) && [[ $1 != -- ]]; do sides+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift || { echo "$usage" >&2; exit 2; }
((${#sides[@]} >= 3)) || { echo "$usage" >&2; exit 2; }
rounds=${sides[-1]}
unset 'sides[-1]'
[[ $rounds =~ ^[0-9]+$ ]] || { echo "ROUNDS must be a number: $rounds" >&2; exit 2; }
(($#)) || { echo "no SCRIPT given" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
declare -A package_path side_env
names=()
for side in "${sides[@]}"; do
  if [[ $side == *:*=* ]]; then
    name=${side%%:*}
    [[ -f python/gemmbn/_operators.so ]] || { echo "$side: this tree has no python/gemmbn/_operators.so" >&2; exit 2; }
    package_path[$name]=$(pwd)/python
    side_env[$name]=${side#*:}
  elif [[ -f $side/gemmbn/_operators.so ]]; then
    name=$(basename "$side")
    package_path[$name]=$(cd "$side" && pwd)
  elif [[ -f $side/_operators.so ]]; then
    name=$(basename "$side")
    mkdir -p "$stage/$name"
    cp -r python/gemmbn "$stage/$name/"
    cp "$side/_operators.so" "$stage/$name/gemmbn/_operators.so"
    package_path[$name]=$stage/$name
  else
    echo "$side: neither NAME:VAR=VALUE nor a folder with gemmbn/_operators.so or _operators.so" >&2
    exit 2
  fi
  for seen in "${names[@]}"; do
    [[ $seen != "$name" ]] || { echo "two sides named $name" >&2; exit 2; }
  done
  names+=("$name")
done
for ((round = 0; round < rounds; ++round)); do
  for name in "${names[@]}"; do
    args=()
    for arg in "$@"; do
      arg=${arg//\{side\}/$name}
      args+=("${arg//\{round\}/$round}")
    done
    assignments=()
    [[ -n ${side_env[$name]:-} ]] && IFS=, read -r -a assignments <<< "${side_env[$name]}"
    echo "== $name round $round ${assignments[*]}"
    env "${assignments[@]}" PYTHONPATH="${package_path[$name]}" python3 "${args[@]}" 2>&1 | tee "$out/${name}_${round}.txt"
  done
done
