#!/usr/bin/env bash
# ResNet-50 throughput: inferd with dynamic batching at concurrency 8 (binary HTTP, batch-1
# requests), divided by ONNX Runtime called in-process at its best batch size (1, 2, 4, 8) with
# the same session options. Then identity_fp32 at concurrency 64 with and without batching.
# --smoke: short runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=20s; ITER=30; SHORT=10s; [[ "${1:-}" == "--smoke" ]] && { DURATION=3s; ITER=2; SHORT=2s; }
MODEL="$ROOT/examples/model_repository/resnet50/1/model.onnx"

inprocess_best() {
  best=0; best_b=0
  for b in 1 2 4 8; do
    ips=$("$BUILD/ort_inprocess" "$MODEL" input "$ITER" "$b" 3 224 224 | awk '/items_per_s/ {print $2}')
    echo "ONNX Runtime in-process batch $b: $ips images/s" >&2
    if awk -v a="$ips" -v b="$best" 'BEGIN{exit !(a>b)}'; then best=$ips; best_b=$b; fi
  done
  echo "$best $best_b"
}

P=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=resnet50 --http-port="$P" --allow-grpc=false --allow-metrics=false \
  2>/tmp/inferd_bench_onnx_tp.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/health/ready"
export INPUT_NAME=input DATATYPE=FP32 SHAPE=1,3,224,224 BYTES=602112
# Alternate the reference and inferd (this machine's speed drifts), median of per-round ratios.
ROUNDS=2; [[ "${1:-}" == "--smoke" ]] && ROUNDS=1
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  read -r best best_b < <(inprocess_best)
  got=$(wrk_rps 8 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/resnet50/infer")
  ratio=$(awk -v a="$got" -v b="$best" 'BEGIN{printf "%.3f", a/b}')
  echo "round $r: in-process best $best images/s (batch $best_b), inferd c=8 $got images/s, ratio $ratio"
  ratios+=("$ratio")
done
stats=$(curl -s "http://127.0.0.1:$P/v2/models/resnet50/stats")
avg=$(/usr/bin/python3 -c 'import json,sys; s=json.loads(sys.argv[1])["model_stats"][0]; print("%.2f" % (s["inference_count"]/max(1,s["execution_count"])))' "$stats")
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
echo "inferd c=8 dynamic batching: average batch $avg"

# identity_fp32 at c=64, with and without dynamic batching.
REPO=$(mktemp -d)
for v in plain batched; do
  mkdir -p "$REPO/$v/identity_fp32/1"
  cp "$ROOT/examples/model_repository/identity_fp32/config.pbtxt" "$REPO/$v/identity_fp32/"
done
echo 'dynamic_batching { max_queue_delay_microseconds: 0 }' >> "$REPO/batched/identity_fp32/config.pbtxt"
export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64
for v in plain batched; do
  P=$(free_port)
  "$BUILD/inferd" --model-repository="$REPO/$v" --http-port="$P" --allow-grpc=false \
    --allow-metrics=false 2>/dev/null & PIDS+=($!)
  wait_http "http://127.0.0.1:$P/v2/health/ready"
  rps=$(wrk_rps 64 "$SHORT" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/identity_fp32/infer")
  echo "identity_fp32 c=64 $v: $rps infer/s"
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
done
rm -rf "$REPO"
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
echo "onnx throughput ratio (median of rounds, inferd c=8 / in-process best batch, goal >= 0.97): $median"
