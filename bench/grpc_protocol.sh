#!/usr/bin/env bash
# identity_fp32 over gRPC (raw contents, C++ async client) at concurrency 1, 8 and 64, beside
# the HTTP binary figure from the same run and the same server. --smoke: 2 s runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=10; [[ "${1:-}" == "--smoke" ]] && DURATION=2

P=$(free_port); G=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=identity_fp32 --http-port="$P" --grpc-port="$G" --allow-metrics=false \
  2>/tmp/inferd_bench_grpc.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/health/ready"
export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64
worst=""
for c in 1 8 64; do
  out=$("$BUILD/grpc_client" "127.0.0.1:$G" identity_fp32 "$c" "$DURATION" INPUT0 FP32 16)
  g=$(echo "$out" | awk '/infer_per_s/ {print $2}')
  p50=$(echo "$out" | awk '/p50_us/ {print $2}')
  h=$(wrk_rps "$c" "${DURATION}s" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/identity_fp32/infer")
  r=$(awk -v a="$g" -v b="$h" 'BEGIN{printf "%.3f", a/b}')
  echo "c=$c gRPC ${g} infer/s (p50 ${p50} us), HTTP binary ${h} infer/s, gRPC/HTTP ${r}"
  worst=$(awk -v w="$worst" -v r="$r" 'BEGIN{if (w=="" || r<w) print r; else print w}')
done
echo "grpc/http ratio (worst of c=1,8,64): $worst"
