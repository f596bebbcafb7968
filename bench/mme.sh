#!/usr/bin/env bash
# SageMaker multi-model figures, measured side by side in one run:
#  1. cold load of a ~100 MB ONNX model .tar.gz from S3 (npm s3rver on loopback) through
#     inferd (POST /models until 200, download cache emptied first) divided by the same steps
#     done by hand: download with curl, untar, create the ONNX Runtime session (ort_inprocess).
#     Alternating rounds; the median ratio is the figure (goal <= 1.10).
#  2. invoke overhead: identity_fp32 through POST /models/<name>/invoke vs the KServe route on
#     the same server, c=8, as a ratio of throughputs.
# --smoke: a 4 MB model, one round, short runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=3; N=5000; DURATION=8s
[[ "${1:-}" == "--smoke" ]] && { ROUNDS=1; N=1000; DURATION=2s; }
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT
CACHE="${INFERD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferd}"
S3RVER="$CACHE/s3rver-3.7.1/node_modules/.bin/s3rver"

# A MatMul with an N x N FP32 weight: N=5000 is 100 MB of weights that do not compress.
/usr/bin/python3 - "$W/big" "$N" <<'PY'
import os, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
out, n = sys.argv[1], int(sys.argv[2])
w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32), "W")
graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "big",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])], [w])
os.makedirs(f"{out}/1", exist_ok=True)
save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), f"{out}/1/model.onnx")
open(f"{out}/config.pbtxt", "w").write('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
PY
tar czf "$W/big.tar.gz" -C "$W" big
SIZE=$(stat -c %s "$W/big.tar.gz")

S3P=$(free_port)
mkdir -p "$W/s3"
"$S3RVER" -d "$W/s3" -a 127.0.0.1 -p "$S3P" --configure-bucket models --silent & PIDS+=($!)
wait_http "http://127.0.0.1:$S3P/models"
curl -sf -X PUT -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" --data-binary @"$W/big.tar.gz" \
  "http://127.0.0.1:$S3P/models/big.tar.gz" >/dev/null

mkdir -p "$W/repo"
cp -r "$ROOT/examples/model_repository/identity_fp32" "$W/repo/"
P=$(free_port); SM=$(free_port)
AWS_ENDPOINT_URL="http://127.0.0.1:$S3P" AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER \
  "$BUILD/inferd" --model-repository="$W/repo" --model-control-mode=explicit \
  --load-model=identity_fp32 --http-port="$P" --allow-grpc=false --allow-metrics=false \
  --allow-sagemaker=true --sagemaker-port="$SM" --sagemaker-model-cache-dir="$W/cache" \
  2>"$W/inferd.log" & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/health/ready"

now_ms() { date +%s%3N; }
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  rm -rf "$W/hand"; mkdir -p "$W/hand"
  t0=$(now_ms)
  curl -sf -o "$W/hand/big.tar.gz" "http://127.0.0.1:$S3P/models/big.tar.gz"
  tar xzf "$W/hand/big.tar.gz" -C "$W/hand"
  t1=$(now_ms)
  fetch_ms=$((t1 - t0))
  session=$(env $(ref_env) "$BUILD/ort_inprocess" "$W/hand/big/1/model.onnx" X 1 1 "$N" | awk '/session_ms/ {print $2}')
  hand=$(awk -v a="$fetch_ms" -v b="$session" 'BEGIN{printf "%.1f", a+b}')

  rm -rf "$W/cache/s3"
  t0=$(now_ms)
  code=$(curl -s -o "$W/load.out" -w '%{http_code}' -X POST "http://127.0.0.1:$SM/models" \
    -d "{\"model_name\": \"big$r\", \"url\": \"s3://models/big.tar.gz\"}")
  t1=$(now_ms)
  [[ "$code" == 200 ]] || { echo "load failed: HTTP $code $(cat "$W/load.out")"; exit 1; }
  got=$((t1 - t0))
  curl -sf -X DELETE "http://127.0.0.1:$SM/models/big$r" >/dev/null
  ratio=$(awk -v a="$got" -v b="$hand" 'BEGIN{printf "%.3f", a/b}')
  echo "round $r: by hand ${hand} ms (download+untar ${fetch_ms} ms + session ${session} ms), inferd ${got} ms, ratio ${ratio}"
  ratios+=("$ratio")
done

# Invoke overhead on a loaded model: the same server, the two routes.
curl -sf -X POST "http://127.0.0.1:$SM/models" \
  -d "{\"model_name\": \"id\", \"url\": \"$W/repo/identity_fp32\"}" >/dev/null
export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64
kserve=$(wrk_rps 8 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/identity_fp32/infer")
mme=$(SAGEMAKER=1 wrk_rps 8 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$SM/models/id/invoke")
echo "invoke c=8: KServe route ${kserve} infer/s, MME route ${mme} infer/s, MME/KServe $(awk -v a="$mme" -v b="$kserve" 'BEGIN{printf "%.3f", a/b}')"
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
echo "mme cold-load ratio ($(awk -v s="$SIZE" 'BEGIN{printf "%.0f", s/1048576}') MB archive, inferd / by hand, median of rounds, goal <= 1.10): $median"
