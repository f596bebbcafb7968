#!/usr/bin/env bash
# System shared memory against the binary tensor extension for an image-sized tensor: FP32
# 1x3x224x224 (602 KB) in and out of an identity model, one server, same run, measured with
# inferd-perf (HTTP, closed loop, stable windows) at c=1: through shared memory the body is the
# JSON header only and the server copies the output into the client's region; binary sends and
# receives the 602 KB in the body. The last line is the figure (shared-memory / binary p50
# latency at c=1; goal <= 0.5). --smoke: short windows, 3 trials.
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
  --allow-metrics=false 2>/tmp/inferd_bench_shm.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/models/image_identity/ready"

perf() {  # <csv> [options]
  local csv="$1"; shift
  "$PERF" -m image_identity -u "127.0.0.1:$P" --concurrency-range 1 --input-data random \
    --measurement-interval "$WINDOW" --max-trials "$TRIALS" --warmup-request-count 3 \
    -f "$csv" "$@" >"$csv.log" 2>&1 || { cat "$csv.log"; exit 1; }
}
perf "$W/binary.csv"
perf "$W/shm.csv" --shared-memory system --output-shared-memory-size 602112
col() { awk -F, -v k="$2" 'NR == 2 {print $k}' "$1"; }
s=$(col "$W/shm.csv" 10); b=$(col "$W/binary.csv" 10)
st=$(col "$W/shm.csv" 2); bt=$(col "$W/binary.csv" 2)
fails=$(( $(col "$W/shm.csv" 17) + $(col "$W/binary.csv" 17) ))
[[ "$fails" == 0 ]] || { echo "failed requests"; exit 1; }
ratio=$(awk -v a="$s" -v b="$b" 'BEGIN{printf "%.3f", a/b}')
echo "c=1 shared memory p50 $s us ($st infer/s), binary p50 $b us ($bt infer/s)"
echo "shared-memory / binary p50 latency ratio, FP32 1x3x224x224, c=1: $ratio (goal <= 0.5)"
