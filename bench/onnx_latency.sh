#!/usr/bin/env bash
# ResNet-50 batch 1, concurrency 1: inferd's p50 latency (binary HTTP) divided by ONNX Runtime
# called in-process with the same session options. This machine's speed drifts by 10-50% over
# seconds, so the two are measured in alternating rounds and the median of the per-round ratios
# is reported; the server-side overhead (request time minus compute) comes from the statistics
# extension and does not drift. --smoke: one short round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=3; DURATION=8s; ITER=10; [[ "${1:-}" == "--smoke" ]] && { ROUNDS=1; DURATION=2s; ITER=2; }
MODEL="$ROOT/examples/model_repository/resnet50/1/model.onnx"

P=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=resnet50 --http-port="$P" --allow-grpc=false --allow-metrics=false \
  2>/tmp/inferd_bench_onnx.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/health/ready"
export INPUT_NAME=input DATATYPE=FP32 SHAPE=1,3,224,224 BYTES=602112
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  ref=$(env $(ref_env) "$BUILD/ort_inprocess" "$MODEL" input "$ITER" 1 3 224 224 | awk '/p50_ms/ {print $2}')
  got=$(wrk_p50_ms 1 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/resnet50/infer")
  ratio=$(awk -v a="$got" -v b="$ref" 'BEGIN{printf "%.3f", a/b}')
  echo "round $r: ONNX Runtime in-process p50 ${ref} ms, inferd p50 ${got} ms, ratio ${ratio}"
  ratios+=("$ratio")
done
stats=$(curl -s "http://127.0.0.1:$P/v2/models/resnet50/stats")
/usr/bin/python3 - "$stats" <<'PY'
import json, sys
s = json.loads(sys.argv[1])["model_stats"][0]["inference_stats"]
n = s["success"]["count"]
total = s["success"]["ns"] / n / 1e6
compute = (s["compute_input"]["ns"] + s["compute_infer"]["ns"] + s["compute_output"]["ns"]) / n / 1e6
print(f"server side per request: {total:.2f} ms, of which compute {compute:.2f} ms; overhead {total-compute:.3f} ms ({(total/compute-1)*100:.2f}%)")
PY
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
echo "onnx latency ratio (median of rounds, inferd / in-process, goal <= 1.03): $median"
