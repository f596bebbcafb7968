#!/usr/bin/env bash
# Scale-out figures (scripts/scale_out.sh: inferd replicas behind nginx), measured in one run:
#  1. loads per 1,000 requests of one skewed trace (Zipf s=1 over 30 copies of `simple`, fixed
#     seed, one request at a time) with 3 replicas vs 1 replica, every replica's budget holding
#     10 models (goal: <= 0.2x). Each copy carries a 1 MiB weights file and the replicas count
#     footprints by size on disk (--model-memory-accounting=disk), so a budget is an exact
#     number of models. The replicas listen on fixed ports (--replica-base-port), so nginx's
#     hash ring, and with it which replica holds which model, is the same on every run.
#  2. router overhead: requests/s of a loaded model through nginx divided by the same straight
#     to the replica (one replica behind nginx; wrk; alternating segments, median of the rounds;
#     goal: >= 0.8): `simple` (binary request, c=16), where a request is almost all HTTP, and
#     the example ResNet-50 (c=2), where it is almost all compute. Everything shares this
#     machine's cores: wrk, nginx and inferd; other load on the machine moves single segments
#     a lot, hence five alternating rounds and their median.
#     Then the same for `simple` with the router on a CPU of its own, as it is in a deployment
#     (nginx or an ingress on other machines or pods): nginx pinned to the last CPU, the replica
#     and wrk to the others, for both the direct and the routed segments (needs 2+ CPUs).
# The ratios are the last lines. --smoke: a short trace, one 1 s round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REQUESTS=5000; DURATION=5s; ROUNDS=5
[[ "${1:-}" == "--smoke" ]] && { REQUESTS=600; DURATION=1s; ROUNDS=1; }
BASE_PORT="${SCALE_OUT_BASE_PORT:-18100}"
MODELS=30
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT

# 30 copies of `simple` (config names renamed), each with 1 MiB of "weights" beside model.onnx.
mkdir -p "$W/repo"
for ((k = 0; k < MODELS; k++)); do
  m=$(printf 'm%02d' "$k")
  cp -r "$ROOT/examples/model_repository/simple" "$W/repo/$m"
  sed -i "s/\"simple\"/\"$m\"/" "$W/repo/$m/config.pbtxt"
  head -c 1048576 /dev/zero >"$W/repo/$m/1/weights.bin"
done
FOOTPRINT=$(( $(stat -c %s "$W/repo/m00/1/model.onnx") + 1048576 ))
BUDGET=$((10 * FOOTPRINT + FOOTPRINT / 2))  # 10 models fit, 11 do not

# start_fleet <n> <name> [repository]: scripts/scale_out.sh in the background; sets FLEET_PID and sources
# its fleet.env (FRONT_PORT, REPLICA_<i>_*).
start_fleet() {
  local out="$W/$2.out"
  "$ROOT/scripts/scale_out.sh" --front-port=0 --sagemaker-front-port=0 --run-dir="$W/$2" \
    --replica-memory-budget="$BUDGET" --replica-base-port="$BASE_PORT" "$1" "${3:-$W/repo}" \
    --model-memory-accounting=disk >"$out" 2>"$W/$2.err" & FLEET_PID=$!
  PIDS+=("$FLEET_PID")
  for _ in $(seq 1 600); do
    grep -q '^SAGEMAKER_FRONT_PORT=' "$out" 2>/dev/null && break
    kill -0 "$FLEET_PID" 2>/dev/null || { cat "$W/$2.err" >&2; exit 1; }
    sleep 0.1
  done
  # shellcheck disable=SC1090
  source <(tr ' ' '\n' <"$W/$2/fleet.env")
}
stop_fleet() { kill -TERM "$FLEET_PID"; wait "$FLEET_PID" || true; }
metrics_args() {
  local i v
  for ((i = 0; i < $1; i++)); do
    v="REPLICA_${i}_METRICS_PORT"
    echo "--metrics=http://127.0.0.1:${!v}/metrics"
  done
}
trace() {  # <replicas>: the trace through the front; prints its JSON line
  /usr/bin/python3 "$ROOT/bench/scale_out_trace.py" --url "http://127.0.0.1:$FRONT_PORT" \
    $(metrics_args "$1") --models "$MODELS" --requests "$REQUESTS" --zipf 1.0 --seed 1
}
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])$2)" "$1"; }

start_fleet 1 one
ONE=$(trace 1)
echo "1 replica:  $ONE"
stop_fleet

start_fleet 3 three
THREE=$(trace 3)
echo "3 replicas: $THREE"
stop_fleet

# Router overhead: one replica (no budget to speak of) behind nginx, `simple` and ResNet-50.
mkdir -p "$W/router"
cp -r "$W/repo/m00" "$W/router/"
RESNET="$ROOT/examples/model_repository/resnet50"
[[ -f "$RESNET/1/model.onnx" ]] && cp -r "$RESNET" "$W/router/"
BUDGET=90%
start_fleet 1 router "$W/router"
/usr/bin/python3 - "$W/body.bin" "$W/resnet.bin" <<'PY' >"$W/hlen"
import json, sys
import numpy as np
def body(path, inputs, outputs):
    hdr = json.dumps({"inputs": [{"name": n, "shape": list(a.shape), "datatype": t,
                                  "parameters": {"binary_data_size": a.nbytes}} for n, t, a in inputs],
                      "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs]}).encode()
    open(path, "wb").write(hdr + b"".join(a.tobytes() for _, _, a in inputs))
    return len(hdr)
s = body(sys.argv[1], [("INPUT0", "INT32", np.arange(16, dtype="<i4").reshape(1, 16)),
                       ("INPUT1", "INT32", np.ones((1, 16), dtype="<i4"))], ["OUTPUT0", "OUTPUT1"])
r = body(sys.argv[2], [("input", "FP32", np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32))],
         ["output"])
print(s, r)
PY
read -r SIMPLE_HLEN RESNET_HLEN <"$W/hlen"
# router_ratio <model> <body> <header length> <connections> -> the median ratio
router_ratio() {
  export BODY_FILE="$2" HEADER_LENGTH="$3"
  local direct="http://127.0.0.1:$REPLICA_0_HTTP_PORT/v2/models/$1/infer"
  local front="http://127.0.0.1:$FRONT_PORT/v2/models/$1/infer"
  local code
  code=$(curl -s -o "$W/answer" -w '%{http_code}' -H "Inference-Header-Content-Length: $3" \
    -H "Content-Type: application/octet-stream" --data-binary @"$2" "$front")
  [[ "$code" == 200 ]] || { echo "$1 through nginx: HTTP $code $(head -c 300 "$W/answer")" >&2; exit 1; }
  wrk_rps "$4" 1s "$ROOT/bench/body_request.lua" "$front" >/dev/null  # warm-up
  local r d n ratio ratios=()
  for r in $(seq 1 "$ROUNDS"); do
    d=$(wrk_rps "$4" "$DURATION" "$ROOT/bench/body_request.lua" "$direct")
    n=$(wrk_rps "$4" "$DURATION" "$ROOT/bench/body_request.lua" "$front")
    ratio=$(awk -v a="$n" -v b="$d" 'BEGIN {printf "%.3f", a / b}')
    echo "$1 c=$4 round $r: direct ${d} req/s, through nginx ${n} req/s, ratio ${ratio}" >&2
    ratios+=("$ratio")
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}
ROUTER_SIMPLE=$(router_ratio m00 "$W/body.bin" "$SIMPLE_HLEN" 16)
ROUTER_RESNET="n/a (examples/model_repository/resnet50 not generated)"
[[ -d "$W/router/resnet50" ]] && ROUTER_RESNET=$(router_ratio resnet50 "$W/resnet.bin" "$RESNET_HLEN" 2)
# The router on a CPU of its own: nginx's processes on the last CPU, the replica's threads and
# wrk (through this shell, whose children inherit its affinity) on the others.
ROUTER_OWN_CPU="n/a (one CPU)"
NCPU=$(nproc)
if ((NCPU >= 2)) && command -v taskset >/dev/null; then
  ALL_CPUS="0-$((NCPU - 1))" CLIENT_CPUS="0-$((NCPU - 2))"
  for p in "$NGINX_PID" $(pgrep -P "$NGINX_PID"); do taskset -a -p -c "$((NCPU - 1))" "$p" >/dev/null; done
  taskset -a -p -c "$CLIENT_CPUS" "$REPLICA_0_PID" >/dev/null
  taskset -p -c "$CLIENT_CPUS" $$ >/dev/null
  ROUTER_OWN_CPU=$(router_ratio m00 "$W/body.bin" "$SIMPLE_HLEN" 16)
  taskset -p -c "$ALL_CPUS" $$ >/dev/null
  taskset -a -p -c "$ALL_CPUS" "$REPLICA_0_PID" >/dev/null
  for p in "$NGINX_PID" $(pgrep -P "$NGINX_PID"); do taskset -a -p -c "$ALL_CPUS" "$p" >/dev/null; done
fi
# Latency nginx adds to one request at a time (p50, wrk c=1).
export BODY_FILE="$W/body.bin" HEADER_LENGTH="$SIMPLE_HLEN"
P_DIRECT=$(wrk_p50_ms 1 "$DURATION" "$ROOT/bench/body_request.lua" "http://127.0.0.1:$REPLICA_0_HTTP_PORT/v2/models/m00/infer")
P_FRONT=$(wrk_p50_ms 1 "$DURATION" "$ROOT/bench/body_request.lua" "http://127.0.0.1:$FRONT_PORT/v2/models/m00/infer")
stop_fleet

for j in "$ONE" "$THREE"; do
  [[ "$(field "$j" '["failures"]')" == 0 ]] || { echo "requests failed: $j" >&2; exit 1; }
done
L1=$(field "$ONE" '["loads"] * 1000 / json.loads(sys.argv[1])["requests"]')
L3=$(field "$THREE" '["loads"] * 1000 / json.loads(sys.argv[1])["requests"]')
echo "per replica (3 replicas): $(field "$THREE" '["replicas"]')"
echo "loads per 1000 requests: 1 replica $(printf '%.1f' "$L1"), 3 replicas $(printf '%.1f' "$L3")"
echo "simple c=1 p50: direct ${P_DIRECT} ms, through nginx ${P_FRONT} ms"
echo "router overhead, ResNet-50 c=2 (nginx / direct, goal >= 0.8): $ROUTER_RESNET"
echo "router overhead, simple c=16, all on the same CPUs (nginx / direct, goal >= 0.8): $ROUTER_SIMPLE"
echo "router overhead, simple c=16, nginx on a CPU of its own (nginx / direct, goal >= 0.8): $ROUTER_OWN_CPU"
echo "loads per 1000 requests, 3 replicas / 1 replica (goal <= 0.2): $(awk -v a="$L3" -v b="$L1" 'BEGIN {printf "%.3f", a / b}')"
