#!/usr/bin/env bash
# Cold load of a ~100 MB .tar.gz model from S3 (npm s3rver on loopback), from nothing to the
# extracted model folder: inferd's S3 source (bench/s3_fetch.cc: list, then download, gunzip
# and untar overlapped, ranged parallel GETs) divided by the same steps done by hand one after
# the other (curl into a file, then tar xzf). Both sides start from an empty cache; the order
# alternates between rounds; the median ratio is the figure (the issue's goal: <= 0.75).
# The model is an ONNX MatMul whose weights are normal floats cut to bfloat16 precision, so
# the archive compresses about 2:1 like real weights do, and ONNX Runtime can load it.
# --smoke: a ~6 MB model, one round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=5; N=7000
[[ "${1:-}" == "--smoke" ]] && { ROUNDS=1; N=1700; }
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT
CACHE="${INFERD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferd}"
S3RVER="$CACHE/s3rver-3.7.1/node_modules/.bin/s3rver"

/usr/bin/python3 - "$W/big" "$N" <<'PY'
import os, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
out, n = sys.argv[1], int(sys.argv[2])
w = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
w = (w.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # bfloat16 precision
graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "big",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
                          [numpy_helper.from_array(w, "W")])
os.makedirs(f"{out}/1", exist_ok=True)
save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), f"{out}/1/model.onnx")
open(f"{out}/config.pbtxt", "w").write('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
PY
# gzip -1 only to make the archive quickly; inflating costs about the same at any level.
tar cf - -C "$W" big | gzip -1 >"$W/big.tar.gz"
SIZE=$(stat -c %s "$W/big.tar.gz")
RAW=$(du -sb "$W/big" | cut -f1)

S3P=$(free_port)
mkdir -p "$W/s3"
# --openssl-legacy-provider: s3rver's continuation tokens use DES (see tests/unit/sources_test.cc).
NODE_OPTIONS=--openssl-legacy-provider "$S3RVER" -d "$W/s3" -a 127.0.0.1 -p "$S3P" \
  --configure-bucket models --silent >/dev/null 2>&1 & PIDS+=($!)
wait_http "http://127.0.0.1:$S3P/models"
curl -sf -X PUT -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" --data-binary @"$W/big.tar.gz" \
  "http://127.0.0.1:$S3P/models/repo/big.tar.gz" >/dev/null
export AWS_ENDPOINT_URL="http://127.0.0.1:$S3P" AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER

now_ms() { date +%s%3N; }
by_hand() {
  rm -rf "$W/hand"; mkdir -p "$W/hand"
  local t0; t0=$(now_ms)
  curl -sf -o "$W/hand/big.tar.gz" "http://127.0.0.1:$S3P/models/repo/big.tar.gz"
  mkdir "$W/hand/out"
  tar xzf "$W/hand/big.tar.gz" -C "$W/hand/out"
  echo $(($(now_ms) - t0))
}
# The same steps one after the other with inferd's own extraction code (libarchive's zlib
# inflates faster than gzip(1)), so the overlap's share of the gain shows on its own.
by_hand_same_code() {
  rm -rf "$W/hand"; mkdir -p "$W/hand"
  local t0; t0=$(now_ms)
  curl -sf -o "$W/hand/big.tar.gz" "http://127.0.0.1:$S3P/models/repo/big.tar.gz"
  "$BUILD/s3_fetch" --extract "$W/hand/big.tar.gz" "$W/hand/out" >/dev/null
  echo $(($(now_ms) - t0))
}
inferd() {
  rm -rf "$W/cache"
  local out; out=$("$BUILD/s3_fetch" s3://models/repo big.tar.gz "$W/cache")
  cmp -s "$(awk '/^path/ {print $2}' <<<"$out")/big/1/model.onnx" "$W/big/1/model.onnx" ||
    { echo "s3_fetch extracted something else: $out" >&2; return 1; }
  awk '/fetch_ms/ {printf "%.0f\n", $2}' <<<"$out"
}

# From the extracted folder to the first answer: an ONNX Runtime session on the model and one
# inference (bench/ort_inprocess), the same work on both sides once the files are there.
first_answer() {
  local t0; t0=$(now_ms)
  env $(ref_env) "$BUILD/ort_inprocess" "$W/hand/out/big/1/model.onnx" X 1 1 "$N" >/dev/null
  echo $(($(now_ms) - t0))
}

# Through the server itself: inferd on the S3 repository in on-demand mode with an empty
# cache; the time from sending the first request for `big.tar.gz` to its answer (list, stream,
# extract, config, session, inference).
python3_body() {
  /usr/bin/python3 -c "import json; print(json.dumps({'inputs': [{'name': 'X', 'shape': [1, $N], 'datatype': 'FP32', 'data': [0.5] * $N}]}))"
}
python3_body >"$W/body.json"
server_first() {
  rm -rf "$W/scache"
  local hp gp mp pid t0 code
  hp=$(free_port); gp=$(free_port); mp=$(free_port)
  "$BUILD/inferd" --model-repository=s3://models/repo --model-control-mode=on-demand \
    --model-cache-dir="$W/scache" --http-port="$hp" --grpc-port="$gp" --metrics-port="$mp" \
    --http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 \
    >"$W/inferd.log" 2>&1 &
  pid=$!
  wait_http "http://127.0.0.1:$hp/v2/health/live"
  t0=$(now_ms)
  code=$(curl -s -o "$W/answer.json" -w '%{http_code}' --data-binary @"$W/body.json" \
    "http://127.0.0.1:$hp/v2/models/big.tar.gz/infer")
  local ms=$(($(now_ms) - t0))
  kill "$pid"; wait "$pid" 2>/dev/null || true
  [[ "$code" == 200 ]] || { echo "first request answered $code: $(head -c 300 "$W/answer.json")" >&2; return 1; }
  echo "$ms"
}

ratios=(); same=(); first=(); served=()
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then
    hand=$(by_hand); hand2=$(by_hand_same_code); got=$(inferd)
  else
    got=$(inferd); hand2=$(by_hand_same_code); hand=$(by_hand)
  fi
  answer=$(first_answer)
  server=$(server_first)
  ratio4=$(awk -v a="$server" -v b="$hand" -v s="$answer" 'BEGIN{printf "%.3f", a/(b+s)}')
  served+=("$ratio4")
  echo "round $r: through the server: first request to its answer ${server} ms;" \
    "/ (curl, tar xzf, session + first answer) ${ratio4}"
  ratio=$(awk -v a="$got" -v b="$hand" 'BEGIN{printf "%.3f", a/b}')
  ratio2=$(awk -v a="$got" -v b="$hand2" 'BEGIN{printf "%.3f", a/b}')
  ratio3=$(awk -v a="$got" -v b="$hand" -v s="$answer" 'BEGIN{printf "%.3f", (a+s)/(b+s)}')
  echo "round $r: by hand: curl, then tar xzf ${hand} ms; curl, then inferd's extraction ${hand2} ms;" \
    "inferd streamed ${got} ms; session + first answer ${answer} ms;" \
    "inferd / by hand ${ratio} (same extraction code ${ratio2}, to first answer ${ratio3})"
  ratios+=("$ratio"); same+=("$ratio2"); first+=("$ratio3")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "medians: inferd / (curl, then inferd's extraction) $(median "${same[@]}");" \
  "to the first answer (ONNX Runtime session and one inference added to both) $(median "${first[@]}")"
echo "through the server (inferd on-demand on s3://, first request to its answer) / by hand" \
  "(curl, then tar xzf, then session and first answer): median $(median "${served[@]}")"
median=$(median "${ratios[@]}")
echo "s3 cold-load ratio ($(awk -v s="$SIZE" -v t="$RAW" 'BEGIN{printf "%.0f MB archive, %.0f MB extracted", s/1048576, t/1048576}'), fetch to extracted folder, inferd / by hand, median of $ROUNDS rounds, goal <= 0.75): $median"
