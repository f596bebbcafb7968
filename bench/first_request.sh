#!/usr/bin/env bash
# First-request latency of a small on-demand model from S3 (npm s3rver on loopback), issue 14:
# 200 copies of the example `simple` ONNX model (config.pbtxt with its name changed + a 222-byte
# model.onnx) under one prefix, inferd in on-demand mode on s3://models/<prefix> with a fresh
# cache dir. bench/first_request.py sends each model in turn a first request (list the model's
# folder, download both objects, load it, infer), then a second one (warm), over one keep-alive
# HTTP connection (KServe v2 JSON, INT32 [1,16] INPUT0/INPUT1, each answer checked against
# numpy), and then does the same S3 steps by hand (ListObjectsV2 + 2 GETs over one keep-alive
# connection). Reported: p50/p90/p99 of first requests, p50 of warm ones, first / warm, and
# first / (the S3 steps by hand + the load time the server logged + the warm request).
# A second pass restarts inferd on the same cache dir: every fetch is an ETag cache hit (only
# the list goes to S3, checked in the metrics), so it gives the first-request latency from the
# cache. The last line is the key figure: the p50 first-request latency from S3.
# --smoke: 20 models.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
N=200
[[ "${1:-}" == "--smoke" ]] && N=20
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT
CACHE="${INFERD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferd}"
S3RVER="$CACHE/s3rver-3.7.1/node_modules/.bin/s3rver"
[[ -x "$S3RVER" ]] || { echo "s3rver missing: run scripts/setup.sh" >&2; exit 1; }
[[ -x "$BUILD/inferd" ]] || { echo "build it first: cmake --build build --target inferd" >&2; exit 1; }
PY=/usr/bin/python3
HELPER="$ROOT/bench/first_request.py"
MODEL="$ROOT/examples/model_repository/simple"
[[ -f "$MODEL/1/model.onnx" ]] || $PY "$ROOT/tests/models/gen_models.py" --example "$ROOT/examples/model_repository"

S3P=$(free_port)
mkdir -p "$W/s3"
# --openssl-legacy-provider: s3rver's continuation tokens use DES (see tests/unit/sources_test.cc).
NODE_OPTIONS=--openssl-legacy-provider "$S3RVER" -d "$W/s3" -a 127.0.0.1 -p "$S3P" \
  --configure-bucket models --silent >/dev/null 2>&1 & PIDS+=($!)
wait_http "http://127.0.0.1:$S3P/models"
PREFIX="first-request-$$"
$PY "$HELPER" upload "http://127.0.0.1:$S3P" "$PREFIX" "$N" "$MODEL"

HTTP=$(free_port); GRPC=$(free_port); METRICS=$(free_port)
SERVER=0
start_inferd() {  # log file
  AWS_ENDPOINT_URL="http://127.0.0.1:$S3P" AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER \
  AWS_REGION=us-east-1 "$BUILD/inferd" --model-repository="s3://models/$PREFIX" \
    --model-control-mode=on-demand --model-cache-dir="$W/cache" \
    --http-port="$HTTP" --grpc-port="$GRPC" --metrics-port="$METRICS" >"$1" 2>&1 &
  SERVER=$!; PIDS+=("$SERVER")
  wait_http "http://127.0.0.1:$HTTP/v2/health/ready"
}
stop_inferd() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; }
metric() { curl -sf "http://127.0.0.1:$METRICS/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

echo "== pass 1: $N models from S3, empty cache ($(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg))"
start_inferd "$W/inferd1.log"
$PY "$HELPER" pass "http://127.0.0.1:$HTTP" "$N" "$W/pass1.json" \
  --hand "http://127.0.0.1:$S3P" "$PREFIX" "$W/hand"
# inferd's own fetch time (list + GETs, per model, mean), beside the by-hand S3 steps below.
echo "  server: $(metric inferd_model_download_bytes_total) bytes downloaded," \
  "$(metric inferd_model_fetch_cache_hits_total) cache hits, fetch (list + GETs) mean" \
  "$(awk -v s="$(metric inferd_model_download_seconds_total)" -v n="$N" 'BEGIN {printf "%.2f", s * 1000 / n}') ms," \
  "RSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$SERVER/status")"
pass1=$($PY "$HELPER" report "$W/inferd1.log" "$W/pass1.json")
echo "$pass1" | grep -v '^RESULT'
stop_inferd

echo "== pass 2: inferd restarted on the same cache dir (fetches are ETag cache hits)"
start_inferd "$W/inferd2.log"
$PY "$HELPER" pass "http://127.0.0.1:$HTTP" "$N" "$W/pass2.json"
hits=$(metric inferd_model_fetch_cache_hits_total); bytes=$(metric inferd_model_download_bytes_total)
echo "  server: $bytes bytes downloaded, $hits cache hits"
[[ "$hits" == "$N" && "$bytes" == "0" ]] || { echo "pass 2 was not served from the cache" >&2; exit 1; }
pass2=$($PY "$HELPER" report "$W/inferd2.log" "$W/pass2.json" --hand-from "$W/pass1.json")
echo "$pass2" | grep -v '^RESULT'
stop_inferd

get() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1"; }
echo
echo "from the cache after a restart: p50 $(get "$pass2" p50_first_ms) ms," \
  "p90 $(get "$pass2" p90_first_ms) ms, p99 $(get "$pass2" p99_first_ms) ms;" \
  "first / by hand $(get "$pass2" first_over_hand)"
echo "first-request latency, small on-demand ONNX model from S3 (s3rver on loopback), p50 over $N models:" \
  "$(get "$pass1" p50_first_ms) ms (p90 $(get "$pass1" p90_first_ms), p99 $(get "$pass1" p99_first_ms);" \
  "warm p50 $(get "$pass1" p50_warm_ms) ms, first / warm $(get "$pass1" first_over_warm);" \
  "first / same steps by hand $(get "$pass1" first_over_hand); from the cache after a restart $(get "$pass2" p50_first_ms) ms)"
