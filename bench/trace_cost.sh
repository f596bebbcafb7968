#!/usr/bin/env bash
# What the trace extension costs: identity_fp32 (binary, wrk c=64) on a server tracing at
# tritonserver's default rate (--trace-config level=TIMESTAMPS, rate=1000, triton,file=...,
# log-frequency=100) ÷ a server with tracing off, same run. TRACE_RATE=1 traces every request.
# As bench/metrics_cost.sh: the two servers run side by side, segments alternate ABBA, and the
# run has two halves, one per start order, with fresh servers; the ratio is over both.
# Tracing off costs one relaxed atomic load per request (server/trace.h), not measurable here.
# Goal at rate 1000: >= 0.99.
# --smoke: 1 s segments, one round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=5s; ROUNDS=4; C=64; RATE=${TRACE_RATE:-1000}
[[ "${1:-}" == "--smoke" ]] && { DURATION=1s; ROUNDS=1; }
TRACE_DIR=$(mktemp -d)
trap 'cleanup; rm -rf "$TRACE_DIR"' EXIT

start() {  # <http port> <extra flags...>
  local http=$1; shift
  "$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
    --load-model=identity_fp32 --http-port="$http" --allow-grpc=false --allow-metrics=false "$@" \
    2>>/tmp/inferd_bench_trace_cost.log & PIDS+=($!)
  wait_http "http://127.0.0.1:$http/v2/health/ready"
}
export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64
url() { echo "http://127.0.0.1:$1/v2/models/identity_fp32/infer"; }
: >/tmp/inferd_bench_trace_cost.log
on_sum=0; off_sum=0
for first in on off; do
  ON=$(free_port); OFF=$(free_port)
  ON_FLAGS=(--trace-config=level=TIMESTAMPS --trace-config=rate="$RATE"
            --trace-config=triton,file="$TRACE_DIR/$first.json" --trace-config=triton,log-frequency=100)
  if [[ $first == on ]]; then start "$ON" "${ON_FLAGS[@]}"; start "$OFF"
  else start "$OFF"; start "$ON" "${ON_FLAGS[@]}"; fi
  wrk_rps "$C" 1s "$ROOT/bench/binary_request.lua" "$(url "$ON")" >/dev/null   # warm-up
  wrk_rps "$C" 1s "$ROOT/bench/binary_request.lua" "$(url "$OFF")" >/dev/null
  for r in $(seq 1 "$ROUNDS"); do
    if ((r % 2)); then order="on off"; else order="off on"; fi
    for side in $order; do
      port=$OFF; [[ $side == on ]] && port=$ON
      v=$(wrk_rps "$C" "$DURATION" "$ROOT/bench/binary_request.lua" "$(url "$port")")
      if [[ $side == on ]]; then on_sum=$(awk -v a="$on_sum" -v b="$v" 'BEGIN{print a + b}')
      else off_sum=$(awk -v a="$off_sum" -v b="$v" 'BEGIN{print a + b}'); fi
      echo "$first started first, round $r: tracing $side ${v} infer/s"
    done
  done
  cleanup; PIDS=()
  # The "on" server really traced: its files hold traces.
  ls "$TRACE_DIR/$first.json".* >/dev/null 2>&1 || { echo "the 'on' server wrote no trace file" >&2; exit 1; }
done
echo "trace cost, identity_fp32 c=$C: tracing at rate $RATE / off (goal >= 0.99 at rate 1000): $(awk -v a="$on_sum" -v b="$off_sum" 'BEGIN{printf "%.3f", a / b}')"
