#!/usr/bin/env bash
# Memory: inferd's resident set (VmRSS) idle with nothing loaded (explicit mode, nothing
# loaded yet), then the RSS each small loaded model adds: 20 copies of the example
# `identity_fp32` model loaded one by one through the repository API, RSS delta / 20 (the
# server's own per-model cost: config, scheduler, instance thread, statistics). Then the same
# for 20 copies of the example `simple` ONNX model (an ONNX Runtime session each).
# The last line is the figure. --smoke: 5 copies.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
COPIES=20; [[ "${1:-}" == "--smoke" ]] && COPIES=5
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT
for i in $(seq 1 "$COPIES"); do
  cp -r "$ROOT/examples/model_repository/simple" "$W/simple_$i"
  sed -i "s/^name: \"simple\"/name: \"simple_$i\"/" "$W/simple_$i/config.pbtxt"
  cp -r "$ROOT/examples/model_repository/identity_fp32" "$W/identity_$i"
  sed -i "s/^name: \"identity_fp32\"/name: \"identity_$i\"/" "$W/identity_$i/config.pbtxt" 2>/dev/null || true
done

P=$(free_port)
"$BUILD/inferd" --model-repository="$W" --model-control-mode=explicit --http-port="$P" \
  --allow-grpc=false --allow-metrics=false 2>/tmp/inferd_bench_memory.log & PIDS+=($!)
PID=${PIDS[-1]}
wait_http "http://127.0.0.1:$P/v2/health/live"
rss_kib() { sleep 1; awk '/^VmRSS/ {print $2}' "/proc/$PID/status"; }
load_all() {  # prefix
  for i in $(seq 1 "$COPIES"); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$P/v2/repository/models/$1_$i/load")
    [[ "$code" == 200 ]] || { echo "load $1_$i answered $code"; exit 1; }
  done
}
idle=$(rss_kib)
load_all identity; after_identity=$(rss_kib)
load_all simple; after_simple=$(rss_kib)
per_identity=$(( (after_identity - idle) / COPIES ))
per_simple=$(( (after_simple - after_identity) / COPIES ))
echo "idle RSS ${idle} KiB; +${COPIES} identity models ${after_identity} KiB; +${COPIES} ONNX simple models ${after_simple} KiB"
echo "idle RSS $(awk -v k="$idle" 'BEGIN{printf "%.1f", k/1024}') MiB, per small model ${per_identity} KiB (identity_fp32; small ONNX model ${per_simple} KiB)"
