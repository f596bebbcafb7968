#!/usr/bin/env bash
# JSON vs the binary tensor extension for an image-sized tensor: FP32 1x3x224x224 (150,528
# random values) through an identity model, same server, same run, measured with inferd-perf
# (closed loop, stable windows): infer/s at c=1 and c=8. JSON carries the tensor as decimal
# text both ways (about 1.6 MB per body), binary as raw bytes both ways (602 KB).
# The last line is the figure (JSON / binary at c=8). --smoke: short windows, 3 trials.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PERF="$BUILD/tools/perf/inferd-perf"
WINDOW=3000; TRIALS=6
[[ "${1:-}" == "--smoke" ]] && { WINDOW=700; TRIALS=3; }
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT

mkdir -p "$W/repo/image_identity/1"
cat > "$W/repo/image_identity/config.pbtxt" <<'PB'
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
PB

P=$(free_port)
"$BUILD/inferd" --model-repository="$W/repo" --http-port="$P" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_json.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/models/image_identity/ready"

# perf <csv> [--http-json]: c=1 and c=8; inferd-perf exits nonzero when every request failed.
perf() {
  local csv="$1"; shift
  "$PERF" -m image_identity -u "127.0.0.1:$P" --concurrency-range 1:8:7 --input-data random \
    --measurement-interval "$WINDOW" --max-trials "$TRIALS" --warmup-request-count 3 \
    -f "$csv" "$@" >"$csv.log" 2>&1 || { cat "$csv.log"; exit 1; }
}
perf "$W/binary.csv"
perf "$W/json.csv" --http-json
# infer/s and failures of the row for concurrency $2 in CSV $1.
col() { awk -F, -v c="$2" -v k="$3" 'NR > 1 && $1 == c {print $k}' "$1"; }
ratio=""
for c in 1 8; do
  j=$(col "$W/json.csv" "$c" 2); b=$(col "$W/binary.csv" "$c" 2)
  jp=$(col "$W/json.csv" "$c" 10); bp=$(col "$W/binary.csv" "$c" 10)
  fails=$(( $(col "$W/json.csv" "$c" 17) + $(col "$W/binary.csv" "$c" 17) ))
  ratio=$(awk -v a="$j" -v b="$b" 'BEGIN{printf "%.3f", a/b}')
  echo "c=$c JSON $j infer/s (p50 $jp us), binary $b infer/s (p50 $bp us), JSON/binary $ratio, failed $fails"
  [[ "$fails" == 0 ]] || { echo "failed requests at c=$c"; exit 1; }
  [[ $c == 1 ]] && ratio1=$ratio
done
echo "json/binary throughput ratio c=1: $ratio1, c=8: $ratio"
