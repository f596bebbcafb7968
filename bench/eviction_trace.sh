#!/usr/bin/env bash
# The model store's eviction policy on seeded synthetic traces (bench/eviction_trace.cc):
# 60 models of 10 MB - 2 GB, Zipf popularity shuffled against size, 10% of requests to
# one-off models, a budget of a quarter of the catalog. Total time spent loading under the
# cost-aware policy / under plain LRU on the same trace, with references (GDSF, an oracle that
# knows the true popularity, an offline upper bound and a lower bound on the optimum).
# Traces: Zipf 1.0 with seeds 1-5 (the figure), Zipf 0.8 and 1.2, popularity reshuffled
# halfway, budgets of 10% and 50%, and no one-off models (the scan's cost to hot models).
# The last line is the figure: the mean ratio over seeds 1-5, goal <= 0.7.
# --smoke: one trace of 20000 requests.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN="$BUILD/eviction_trace"
[[ -x "$BIN" ]] || { echo "build it first: cmake --build build --target eviction_trace" >&2; exit 1; }

if [[ "${1:-}" == "--smoke" ]]; then
  RUNS=("--seed=1 --requests=20000")
  FIGURE_RUNS=1
else
  RUNS=("--seed=1" "--seed=2" "--seed=3" "--seed=4" "--seed=5"
        "--seed=1 --zipf=0.8" "--seed=1 --zipf=1.2" "--seed=1 --shift" "--seed=2 --shift"
        "--seed=1 --budget=0.1" "--seed=1 --budget=0.5" "--seed=1 --one-off=0")
  FIGURE_RUNS=5
fi

summary=()
figure=()
for i in "${!RUNS[@]}"; do
  args=${RUNS[$i]}
  # shellcheck disable=SC2086  # the arguments are words
  out=$("$BIN" $args)
  echo "== eviction_trace $args"
  echo "$out"
  ratio=$(awk -F' = ' '/^cost-aware \/ lru = / {print $2}' <<<"$out")
  refs=$(awk '/^gdsf \/ lru = / {gsub(/;/, ""); print "gdsf " $5 ", oracle " $11}' <<<"$out")
  optimum=$(sed -n 's/^cost-aware \/ optimum: between \([0-9.]*\) .* and \([0-9.]*\) (\/ lower bound).*/[\1, \2]/p' <<<"$out")
  hot=$(awk '$1 == "lru" {l = $9} $1 == "cost-aware" && $4 == "misses" {c = $11}
             END {print "hot-model reloads: lru " l ", cost-aware " c}' <<<"$out")
  summary+=("$(printf '%-32s cost-aware/lru %s  (%s; cost-aware/optimum in %s; %s)' "$args" "$ratio" "$refs" "$optimum" "$hot")")
  (( i < FIGURE_RUNS )) && figure+=("$ratio")
done

echo
echo "== summary"
printf '%s\n' "${summary[@]}"
mean=$(printf '%s\n' "${figure[@]}" | awk '{s+=$1; if (NR==1||$1<lo) lo=$1; if (NR==1||$1>hi) hi=$1} END {printf "%.3f (%.3f-%.3f)", s/NR, lo, hi}')
echo "eviction load-time ratio (cost-aware / lru, zipf 1.0, mean of $FIGURE_RUNS seed(s), goal <= 0.7): ${mean%% *}"
