#!/usr/bin/env bash
# Response cache: throughput of cache hits against the same identity model uncached, one server
# (--cache-config local,size=64 MiB), same run, measured with inferd-perf (HTTP binary, closed
# loop, stable windows) at c=1 and c=8. Every request carries the same zero input, so after the
# first request the cached model answers from the cache without running. The last line is the
# figure (cached / uncached infer/s at c=8; goal >= 0.9). --smoke: short windows, 3 trials.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PERF="$BUILD/tools/perf/inferd-perf"
WINDOW=3000; TRIALS=6
[[ "${1:-}" == "--smoke" ]] && { WINDOW=700; TRIALS=3; }
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT

for m in uncached cached; do
  mkdir -p "$W/repo/$m/1"
  cat > "$W/repo/$m/config.pbtxt" <<'PB'
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
PB
done
echo 'response_cache { enable: true }' >> "$W/repo/cached/config.pbtxt"

P=$(free_port)
"$BUILD/inferd" --model-repository="$W/repo" --http-port="$P" --allow-grpc=false \
  --allow-metrics=false --cache-config=local,size=67108864 2>/tmp/inferd_bench_cache.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/models/cached/ready"

perf() {  # <model> <csv>
  "$PERF" -m "$1" -u "127.0.0.1:$P" --concurrency-range 1:8:7 --input-data zero \
    --measurement-interval "$WINDOW" --max-trials "$TRIALS" --warmup-request-count 3 \
    -f "$2" >"$2.log" 2>&1 || { cat "$2.log"; exit 1; }
}
# ABBA order: load on this shared machine drifts between steps; each model gets a step early
# and a step late, and the figure sums both.
perf uncached "$W/uncached1.csv"
perf cached "$W/cached1.csv"
perf cached "$W/cached2.csv"
perf uncached "$W/uncached2.csv"
col() { awk -F, -v c="$2" -v k="$3" 'NR > 1 && $1 == c {print $k}' "$1"; }
for c in 1 8; do
  a=$(awk -v x="$(col "$W/cached1.csv" "$c" 2)" -v y="$(col "$W/cached2.csv" "$c" 2)" 'BEGIN{printf "%.0f", (x+y)/2}')
  b=$(awk -v x="$(col "$W/uncached1.csv" "$c" 2)" -v y="$(col "$W/uncached2.csv" "$c" 2)" 'BEGIN{printf "%.0f", (x+y)/2}')
  ap="$(col "$W/cached1.csv" "$c" 10)/$(col "$W/cached2.csv" "$c" 10)"
  bp="$(col "$W/uncached1.csv" "$c" 10)/$(col "$W/uncached2.csv" "$c" 10)"
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", a/b}')
  echo "c=$c cache hits $a infer/s (p50 $ap us), uncached $b infer/s (p50 $bp us), ratio $ratio"
  [[ $c == 1 ]] && ratio1=$ratio
done
# The cached model ran once: every later request was a hit.
/usr/bin/python3 - "$(curl -s "http://127.0.0.1:$P/v2/models/cached/stats")" <<'PY'
import json, sys
s = json.loads(sys.argv[1])["model_stats"][0]
i = s["inference_stats"]
print(f"cached model: execution_count {s['execution_count']}, cache hits {i['cache_hit']['count']}, misses {i['cache_miss']['count']}, "
      f"{i['cache_hit']['ns'] / max(1, i['cache_hit']['count']) / 1000:.2f} us per lookup")
assert s["execution_count"] == 1, "cache hits ran the model"
PY
echo "response cache hit / uncached throughput ratio c=1: $ratio1, c=8: $ratio (goal >= 0.9)"
