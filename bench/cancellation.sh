#!/usr/bin/env bash
# What cancellation bookkeeping costs on the hot path: identity_fp32 over HTTP (binary
# extension, 64 bytes, wrk -c64), the same binary with --http-cancel-on-disconnect=true (the
# default: a cancellation token per request, its listener installed and cleared by the
# scheduler) and =false (no token). Both servers run the same build; rounds alternate so
# machine noise falls on both alike. The last line is the figure: on/off throughput ratio.
# --smoke: one short round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=${BENCH_DURATION:-8}; ROUNDS=${BENCH_ROUNDS:-5}
[[ "${1:-}" == "--smoke" ]] && { DURATION=1; ROUNDS=1; }
REPO="$ROOT/examples/model_repository"

start() {  # <port> <on|off>
  "$BUILD/inferd" --model-repository="$REPO" --model-control-mode=explicit \
    --load-model=identity_fp32 --http-port="$1" --allow-grpc=false --allow-metrics=false \
    --http-cancel-on-disconnect="$2" 2>"/tmp/inferd_bench_cancel_$2.log" & PIDS+=($!)
}
ON=$(free_port); start "$ON" true
OFF=$(free_port); start "$OFF" false
wait_http "http://127.0.0.1:$ON/v2/models/identity_fp32/ready"
wait_http "http://127.0.0.1:$OFF/v2/models/identity_fp32/ready"

rps() { BYTES=64 SHAPE=1,16 wrk_rps 64 "${DURATION}s" "$ROOT/bench/binary_request.lua" \
          "http://127.0.0.1:$1/v2/models/identity_fp32/infer"; }
rps "$ON" >/dev/null; rps "$OFF" >/dev/null  # warm-up
on=(); off=()
for r in $(seq 1 "$ROUNDS"); do
  on+=("$(rps "$ON")"); off+=("$(rps "$OFF")")
  echo "round $r: cancellation on ${on[-1]} req/s, off ${off[-1]} req/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m_on=$(median "${on[@]}"); m_off=$(median "${off[@]}")
echo "identity_fp32 HTTP c=64 median req/s: on $m_on, off $m_off; on/off ratio $(awk -v a="$m_on" -v b="$m_off" 'BEGIN{printf "%.3f", a/b}')"
