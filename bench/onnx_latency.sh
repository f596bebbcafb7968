#!/usr/bin/env bash
# ResNet-50 batch 1, concurrency 1: inferd's p50 latency (binary HTTP) divided by ONNX Runtime
# called in-process with the same session options. --smoke: few iterations.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=20s; ITER=200; [[ "${1:-}" == "--smoke" ]] && { DURATION=3s; ITER=10; }
MODEL="$ROOT/examples/model_repository/resnet50/1/model.onnx"

ref=$("$BUILD/ort_inprocess" "$MODEL" input "$ITER" 1 3 224 224 | awk '/p50_ms/ {print $2}')
P=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=resnet50 --http-port="$P" 2>/tmp/inferd_bench_onnx.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/health/ready"
export INPUT_NAME=input DATATYPE=FP32 SHAPE=1,3,224,224 BYTES=602112
got=$(wrk_p50_ms 1 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/resnet50/infer")
echo "ONNX Runtime in-process p50 ${ref} ms, inferd p50 ${got} ms"
echo "onnx latency ratio (inferd / in-process, goal <= 1.03): $(awk -v a="$got" -v b="$ref" 'BEGIN{printf "%.3f", a/b}')"
