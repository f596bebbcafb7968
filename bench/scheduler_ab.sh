#!/usr/bin/env bash
# The instance executor's cost, A/B in one run: c=64 throughput of identity_fp32 (default
# scheduler) and of the example `simple` ONNX model with `dynamic_batching`, over HTTP with the
# binary extension, for two inferd binaries, alternated round by round so both see the same
# machine. Prints each round and the medians.
#   bench/scheduler_ab.sh BEFORE_BINARY [AFTER_BINARY (default build/inferd)] [--smoke]
# Needs the example models (tests/models/gen_models.py --example examples/model_repository).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
A="$1"; B="${2:-$BUILD/inferd}"
DURATION=${DURATION:-10s}; ROUNDS=${ROUNDS:-5}
[[ "${3:-}" == "--smoke" ]] && { DURATION=2s; ROUNDS=1; }

REPO=$(mktemp -d); trap 'cleanup; rm -rf "$REPO"' EXIT
mkdir -p "$REPO/identity_fp32/1" "$REPO/simple/1"
cp "$ROOT/examples/model_repository/identity_fp32/config.pbtxt" "$REPO/identity_fp32/"
cp "$ROOT/examples/model_repository/simple/config.pbtxt" "$REPO/simple/"
cp "$ROOT/examples/model_repository/simple/1/model.onnx" "$REPO/simple/1/"
echo 'dynamic_batching { }' >> "$REPO/simple/config.pbtxt"

# Two INT32 [1,16] inputs for `simple`, one FP32 [1,16] for identity_fp32.
LUA2="$REPO/simple_request.lua"
cat > "$LUA2" <<'LUA'
local header = '{"inputs":[' ..
  '{"name":"INPUT0","shape":[1,16],"datatype":"INT32","parameters":{"binary_data_size":64}},' ..
  '{"name":"INPUT1","shape":[1,16],"datatype":"INT32","parameters":{"binary_data_size":64}}],' ..
  '"parameters":{"binary_data_output":true}}'
wrk.method = "POST"
wrk.body = header .. string.rep("\1", 128)
wrk.headers["Inference-Header-Content-Length"] = tostring(#header)
wrk.headers["Content-Type"] = "application/octet-stream"
LUA
export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64

declare -A got
for r in $(seq 1 "$ROUNDS"); do
  order="A B"; (( r % 2 == 0 )) && order="B A"  # ABBA: neither side always goes first
  for side in $order; do
    bin=$A; [[ $side == B ]] && bin=$B
    P=$(free_port)
    "$bin" --model-repository="$REPO" --http-port="$P" --allow-grpc=false --allow-metrics=false \
      2>/dev/null & PIDS+=($!)
    wait_http "http://127.0.0.1:$P/v2/health/ready"
    id=$(wrk_rps 64 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/identity_fp32/infer")
    sp=$(wrk_rps 64 "$DURATION" "$LUA2" "http://127.0.0.1:$P/v2/models/simple/infer")
    batch=$(curl -s "http://127.0.0.1:$P/v2/models/simple/stats" | /usr/bin/python3 -c \
      'import json,sys; s=json.load(sys.stdin)["model_stats"][0]; print("%.2f" % (s["inference_count"]/max(1,s["execution_count"])))')
    echo "round $r $side: identity_fp32 $id infer/s, simple (dynamic batching) $sp infer/s (average batch $batch)"
    got[$side.id]+="$id "; got[$side.sp]+="$sp "
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
  done
done
med() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
for m in id sp; do
  a=$(med "${got[A.$m]}"); b=$(med "${got[B.$m]}")
  name=identity_fp32; [[ $m == sp ]] && name="simple (dynamic batching)"
  echo "$name c=64 median: before $a, after $b infer/s, after/before $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", b/a}')"
done
