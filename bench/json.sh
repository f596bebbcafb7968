#!/usr/bin/env bash
# JSON vs the binary tensor extension for an image-sized tensor: FP32 1x3x224x224 (150,528
# values, random in [0,1)) through an identity model, same server, same wrk, same run:
# infer/s at c=1 and c=8. The JSON body is about 1.6 MB of decimal text, the binary one 602 KB.
# The last line is the figure (JSON / binary). --smoke: 2 s runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=10s; [[ "${1:-}" == "--smoke" ]] && DURATION=2s
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT

mkdir -p "$W/repo/image_identity/1"
cat > "$W/repo/image_identity/config.pbtxt" <<'PB'
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
PB
HLEN=$(/usr/bin/python3 - "$W" <<'PY'
import json, sys
import numpy as np
w = sys.argv[1]
x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
# JSON: request and response both carry the tensor as JSON numbers.
json_body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                    "data": [float(v) for v in x.reshape(-1)]}]})
open(f"{w}/json.body", "w").write(json_body)
# Binary: the tensor as raw bytes both ways.
raw = x.tobytes()
header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                 "parameters": {"binary_data_size": len(raw)}}],
                     "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
open(f"{w}/binary.body", "wb").write(header + raw)
print(len(header))
PY
)
echo "bodies: JSON $(stat -c %s "$W/json.body") bytes, binary $(stat -c %s "$W/binary.body") bytes"

P=$(free_port)
"$BUILD/inferd" --model-repository="$W/repo" --http-port="$P" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_json.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/models/image_identity/ready"
URL="http://127.0.0.1:$P/v2/models/image_identity/infer"
# Both bodies are answered 200 before anything is timed.
for kind in json binary; do
  h=(); [[ $kind == binary ]] && h=(-H "Inference-Header-Content-Length: $HLEN")
  code=$(curl -s -o /dev/null -w '%{http_code}' "${h[@]}" --data-binary @"$W/$kind.body" "$URL")
  [[ "$code" == 200 ]] || { echo "$kind request answered $code"; exit 1; }
done

ratios=()
for c in 1 8; do
  j=$(BODY_FILE="$W/json.body" HEADER_LENGTH="" wrk_rps "$c" "$DURATION" "$ROOT/bench/body_request.lua" "$URL")
  b=$(BODY_FILE="$W/binary.body" HEADER_LENGTH="$HLEN" wrk_rps "$c" "$DURATION" "$ROOT/bench/body_request.lua" "$URL")
  r=$(awk -v a="$j" -v b="$b" 'BEGIN{printf "%.3f", a/b}')
  echo "c=$c JSON ${j} infer/s, binary ${b} infer/s, JSON/binary ${r}"
  ratios+=("c=$c $r")
done
echo "json/binary throughput ratio, FP32 1x3x224x224: ${ratios[*]}"
