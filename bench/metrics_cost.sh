#!/usr/bin/env bash
# What the latency metrics cost: identity_fp32 (binary, wrk c=64) on a server with Triton's
# latency histograms and summaries on (--metrics-config histogram_latencies=true,
# summary_latencies=true, counters on) ÷ a server with every latency metric off, same run.
# The two servers run side by side, idle but for the segment being measured; segments alternate
# ABBA so drift on the shared machine falls on both sides. /metrics is scraped once a second
# during the "on" segments, as Prometheus would, so the scrape-time quantile merge is counted.
# The server started first measured faster here whichever it was (by up to 5-10%), so the run
# has two halves, one per start order, with fresh servers; the ratio is over both.
# Goal: >= 0.99 (Triton loses a third of its throughput with summaries on: server#8561).
# --smoke: 1 s segments, one round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=5s; ROUNDS=4; C=64
[[ "${1:-}" == "--smoke" ]] && { DURATION=1s; ROUNDS=1; }

start() {  # <http port> <metrics port> <extra flags...>
  local http=$1 metrics=$2; shift 2
  "$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
    --load-model=identity_fp32 --http-port="$http" --allow-grpc=false --metrics-port="$metrics" "$@" \
    2>>/tmp/inferd_bench_metrics_cost.log & PIDS+=($!)
  wait_http "http://127.0.0.1:$http/v2/health/ready"
}
ON_FLAGS=(--metrics-config=histogram_latencies=true --metrics-config=summary_latencies=true
          --metrics-config=counter_latencies=true)
OFF_FLAGS=(--metrics-config=histogram_latencies=false --metrics-config=summary_latencies=false
           --metrics-config=counter_latencies=false)
export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64
url() { echo "http://127.0.0.1:$1/v2/models/identity_fp32/infer"; }
scrape_while() {  # <metrics port> <command...>: runs the command, scraping every second
  local port=$1; shift
  ( while true; do curl -s -o /dev/null "http://127.0.0.1:$port/metrics"; sleep 1; done ) & local s=$!
  "$@"; kill "$s"; wait "$s" 2>/dev/null || true
}
: >/tmp/inferd_bench_metrics_cost.log
on_sum=0; off_sum=0
for first in on off; do
  ON=$(free_port); ON_M=$(free_port); OFF=$(free_port); OFF_M=$(free_port)
  if [[ $first == on ]]; then
    start "$ON" "$ON_M" "${ON_FLAGS[@]}"; start "$OFF" "$OFF_M" "${OFF_FLAGS[@]}"
  else
    start "$OFF" "$OFF_M" "${OFF_FLAGS[@]}"; start "$ON" "$ON_M" "${ON_FLAGS[@]}"
  fi
  # The "on" server must really export them, the "off" one not.
  text=$(curl -s "http://127.0.0.1:$ON_M/metrics")
  for family in nv_inference_request_summary_us nv_inference_first_response_histogram_ms; do
    grep -q "^# TYPE $family" <<<"$text" || { echo "the 'on' server does not export $family" >&2; exit 1; }
  done
  ! grep -q '^nv_inference_request_summary_us' <(curl -s "http://127.0.0.1:$OFF_M/metrics") ||
    { echo "the 'off' server exports summaries" >&2; exit 1; }
  wrk_rps "$C" 1s "$ROOT/bench/binary_request.lua" "$(url "$ON")" >/dev/null   # warm-up
  wrk_rps "$C" 1s "$ROOT/bench/binary_request.lua" "$(url "$OFF")" >/dev/null
  for r in $(seq 1 "$ROUNDS"); do
    if ((r % 2)); then order="on off"; else order="off on"; fi
    for side in $order; do
      if [[ $side == on ]]; then
        v=$(scrape_while "$ON_M" wrk_rps "$C" "$DURATION" "$ROOT/bench/binary_request.lua" "$(url "$ON")")
        on_sum=$(awk -v a="$on_sum" -v b="$v" 'BEGIN{print a + b}')
      else
        v=$(wrk_rps "$C" "$DURATION" "$ROOT/bench/binary_request.lua" "$(url "$OFF")")
        off_sum=$(awk -v a="$off_sum" -v b="$v" 'BEGIN{print a + b}')
      fi
      echo "$first started first, round $r: metrics $side ${v} infer/s"
    done
  done
  cleanup; PIDS=()
done
echo "metrics cost, identity_fp32 c=$C: histograms+summaries on / off (goal >= 0.99): $(awk -v a="$on_sum" -v b="$off_sum" 'BEGIN{printf "%.3f", a / b}')"
