#!/usr/bin/env bash
# ResNet-50 throughput: inferd with dynamic batching at concurrency 8 (binary HTTP, batch-1
# requests), divided by ONNX Runtime called in-process at its best batch size (1, 2, 4, 8) with
# the same session options and the same threads. Two thread layouts on this 2-core machine:
#   1x2: one instance with 2 intra-op threads (the example config, best for latency);
#   2x1: two instances with 1 intra-op thread each (best for throughput); the reference runs
#        two sessions at once, one thread each.
# Then identity_fp32 at concurrency 64 with and without batching.
# --smoke: short runs. LAYOUTS="1x2" runs one layout only.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=10s; ITER=30; SHORT=10s; [[ "${1:-}" == "--smoke" ]] && { DURATION=3s; ITER=2; SHORT=2s; }
MODEL="$ROOT/examples/model_repository/resnet50/1/model.onnx"
REPO=$(mktemp -d)
trap 'cleanup; rm -rf "$REPO"' EXIT

# ort_ips <sessions> <threads> <batch> <iterations> [spin] -> images/s in-process
ort_ips() {
  env $(ref_env) SESSIONS=$1 THREADS=$2 SPIN="${5:-0}" "$BUILD/ort_inprocess" "$MODEL" input "$4" "$3" 3 224 224 |
    awk '/items_per_s/ {print $2}'
}
# best_batch <sessions> <threads> -> "<batch> <spin> <images/s>": a short run of each batch
# size, with ONNX Runtime's pool threads spinning and not, picks the reference; the rounds below
# then measure only that one, as long as inferd runs, so the reference is not the luckiest of
# eight short runs.
best_batch() {
  local best=0 best_b=0 best_s=0 b s ips
  for b in 1 2 4 8; do
    for s in 0 1; do
      ips=$(ort_ips "$1" "$2" "$b" "$ITER" "$s")
      echo "ONNX Runtime in-process ${1}x${2} batch $b spin $s: $ips images/s" >&2
      if awk -v a="$ips" -v b="$best" 'BEGIN{exit !(a>b)}'; then best=$ips; best_b=$b; best_s=$s; fi
    done
  done
  echo "$best_b $best_s $best"
}

# The example config as is (1x2), and the same with two one-thread instances (2x1).
for layout in 1x2 2x1; do
  mkdir -p "$REPO/$layout/resnet50/1"
  ln -s "$MODEL" "$REPO/$layout/resnet50/1/model.onnx"
  sed -e "s/count: 1/count: ${layout%x*}/" \
      -e "s/\"intra_op_thread_count\" value: { string_value: \"2\"/\"intra_op_thread_count\" value: { string_value: \"${layout#*x}\"/" \
      "$ROOT/examples/model_repository/resnet50/config.pbtxt" > "$REPO/$layout/resnet50/config.pbtxt"
  grep -q "count: ${layout%x*}" "$REPO/$layout/resnet50/config.pbtxt"
  grep -q "string_value: \"${layout#*x}\" } }" "$REPO/$layout/resnet50/config.pbtxt"
done

export INPUT_NAME=input DATATYPE=FP32 SHAPE=1,3,224,224 BYTES=602112
# Alternate the reference and inferd (this machine's speed drifts), median of per-round ratios.
ROUNDS=${ROUNDS:-6}; [[ "${1:-}" == "--smoke" ]] && ROUNDS=1
declare -A ratios
for layout in ${LAYOUTS:-1x2 2x1}; do
  P=$(free_port)
  "$BUILD/inferd" --model-repository="$REPO/$layout" --http-port="$P" --allow-grpc=false \
    --allow-metrics=false 2>"/tmp/inferd_bench_onnx_tp_$layout.log" & PIDS+=($!)
  wait_http "http://127.0.0.1:$P/v2/health/ready"
  read -r best_b best_s first < <(best_batch "${layout%x*}" "${layout#*x}")
  # Iterations per session for about $DURATION of the reference.
  iters=$(awk -v ips="$first" -v b="$best_b" -v s="${layout%x*}" -v d="${DURATION%s}" \
    'BEGIN{n=int(d*ips/(b*s)); print (n<2?2:n)}')
  for r in $(seq 1 "$ROUNDS"); do
    best=$(ort_ips "${layout%x*}" "${layout#*x}" "$best_b" "$iters" "$best_s")
    got=$(wrk_rps 8 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/resnet50/infer")
    ratio=$(awk -v a="$got" -v b="$best" 'BEGIN{printf "%.3f", a/b}')
    echo "$layout round $r: in-process $best images/s (batch $best_b, spin $best_s), inferd c=8 $got images/s, ratio $ratio"
    ratios[$layout]+="$ratio "
  done
  stats=$(curl -s "http://127.0.0.1:$P/v2/models/resnet50/stats")
  /usr/bin/python3 -c 'import json,sys; s=json.loads(sys.argv[1])["model_stats"][0]; i=s["inference_stats"]; n=max(1,s["inference_count"]); print("%s: average batch %.2f; per request (a batch counts for each of its requests): queue %.2f ms, input copy %.3f ms, infer %.2f ms" % (sys.argv[2], s["inference_count"]/max(1,s["execution_count"]), i["queue"]["ns"]/n/1e6, i["compute_input"]["ns"]/n/1e6, i["compute_infer"]["ns"]/n/1e6))' "$stats" "$layout"
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
done

# identity_fp32 at c=64, with and without dynamic batching.
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
med() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "onnx throughput ratio (median of rounds, inferd c=8 / in-process best batch, same threads; goal >= 0.97): 2x1 $(med "${ratios[2x1]:-}"), 1x2 $(med "${ratios[1x2]:-}")"
