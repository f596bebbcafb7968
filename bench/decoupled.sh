#!/usr/bin/env bash
# Decoupled streaming: responses/s of the repeat backend (100 responses per request, DELAY 0)
# over gRPC ModelStreamInfer and over HTTP generate_stream (server-sent events), same server,
# alternating rounds (bench/decoupled_client.py, Python clients on the same 2 cores). The last
# line is the median ratios gRPC / SSE of responses/s and of server CPU per response.
# --smoke: one 1 s round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SECONDS_PER_ROUND=5; ROUNDS=3; CONC=4
[[ "${1:-}" == "--smoke" ]] && { SECONDS_PER_ROUND=1; ROUNDS=1; }

WORK="$(mktemp -d)"
trap 'cleanup; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/repo/repeat_int32/1" "$WORK/stubs"
cat > "$WORK/repo/repeat_int32/config.pbtxt" <<'CFG'
name: "repeat_int32"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
CFG
/usr/bin/python3 -m grpc_tools.protoc -I"$ROOT/src/config" -I"$ROOT/src/frontends/grpc" \
  --python_out="$WORK/stubs" --grpc_python_out="$WORK/stubs" grpc_service.proto model_config.proto

PORT=$(free_port); GPORT=$(free_port)
"$BUILD/inferd" --model-repository="$WORK/repo" --http-port="$PORT" --grpc-port="$GPORT" \
  --grpc-address=127.0.0.1 --allow-metrics=false 2>/tmp/inferd_bench_decoupled.log & PIDS+=($!)
SERVER_PID=$!
wait_http "http://127.0.0.1:$PORT/v2/models/repeat_int32/ready"
/usr/bin/python3 "$ROOT/bench/decoupled_client.py" "http://127.0.0.1:$PORT" "127.0.0.1:$GPORT" \
  "$WORK/stubs" "$SECONDS_PER_ROUND" "$CONC" 100 "$ROUNDS" "$SERVER_PID"
