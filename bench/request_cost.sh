#!/usr/bin/env bash
# What one small request costs, this tree against a base commit, in one run (issue 32): for the
# next person who adds a feature to the request path. Fails loudly when this tree costs more than
# 3% above the base.
#
#   bench/request_cost.sh [BASE]      # BASE: a commit (default HEAD~1); builds it in a worktree
#   bench/request_cost.sh --smoke     # this tree only, few requests: checks the machinery
#   BASE_BIN=/path/to/inferd bench/request_cost.sh   # a base built elsewhere
#   CALLS=1 ...                       # also list, per request and per binary, the allocations,
#                                     # locks, wake-ups (callgrind call counts) and syscalls (strace)
#
# The model is Triton's default small case: an ONNX Add FP32[16] (INPUT0 + INPUT1), one CPU
# instance, no dynamic batching, over HTTP with the binary extension, one keep-alive client.
# ONNX Runtime runs on the instance's thread (intra_op_thread_count 1): a pool's threads spin
# for work, and spinning instructions count time, not requests.
#
# Two figures per binary:
# - instructions per request (valgrind --tool=callgrind, every thread of the server), counted
#   over N requests after a warm-up (callgrind_control turns counting on and off). Instruction
#   counts do not move with the machine's noise, so this is the gate: head / base > 1.03 fails.
# - requests/s at c=1, 8 and 64 (wrk), both servers up at once, rounds interleaved A B B A ...:
#   reported with the median ratio per concurrency; it moves with the machine's noise, so it
#   warns (GATE_THROUGHPUT=1 makes a median below 0.97 fail too).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SMOKE=0; BASE="HEAD~1"
case "${1:-}" in
  --smoke) SMOKE=1 ;;
  "") ;;
  *) BASE="$1" ;;
esac
N=${REQUESTS:-2000}; ROUNDS=5; DUR=4s
if ((SMOKE)); then N=${REQUESTS:-50}; ROUNDS=1; DUR=1s; fi
W=$(mktemp -d)
trap 'cleanup; [[ -d "$W/base" ]] && git -C "$ROOT" worktree remove --force "$W/base"; rm -rf "$W"' EXIT

/usr/bin/python3 - "$W/repo" <<'PY'
import os, sys
import onnx
from onnx import TensorProto, helper
root = sys.argv[1]
os.makedirs(f"{root}/add_fp32/1")
x = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 16]) for n in ("INPUT0", "INPUT1")]
y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", 16])
g = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])], "add", x, [y])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8
onnx.save(m, f"{root}/add_fp32/1/model.onnx")
open(f"{root}/add_fp32/config.pbtxt", "w").write('''platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
''')
PY

HEAD_BIN="$BUILD/inferd"
[[ -x "$HEAD_BIN" ]] || { echo "request_cost: build this tree first ($HEAD_BIN)" >&2; exit 1; }
if [[ -n "${BASE_BIN:-}" ]]; then
  echo "request_cost: base binary $BASE_BIN"
elif ((!SMOKE)); then
  base_sha=$(git -C "$ROOT" rev-parse --verify "$BASE^{commit}")
  echo "request_cost: building base $BASE ($base_sha) in a worktree"
  git -C "$ROOT" worktree add --detach "$W/base" "$base_sha" >/dev/null
  BUILD_DIR="$W/base/build" "$W/base/scripts/setup.sh" >"$W/base_build.log" 2>&1 ||
    { tail -30 "$W/base_build.log"; echo "request_cost: the base did not build" >&2; exit 1; }
  BASE_BIN="$W/base/build/inferd"
fi

ARGS=(--model-repository="$W/repo" --allow-grpc=false --allow-metrics=false)

# send <port> <count>: <count> binary requests, one keep-alive connection, checked.
send() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import http.client, json, struct, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
header = json.dumps({"inputs": [
    {"name": k, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
    for k in ("INPUT0", "INPUT1")], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
a = struct.pack("16f", *range(16)); b = struct.pack("16f", *([1.0] * 16))
body = header + a + b
hdrs = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
for _ in range(n):
    c.request("POST", "/v2/models/add_fp32/infer", body, hdrs)
    r = c.getresponse(); data = r.read()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {data[:200]!r}")
    if struct.unpack("16f", data[-64:]) != tuple(float(i + 1) for i in range(16)):
        sys.exit("wrong sums")
PY
}

# per_request <binary>: steady-state instructions per request. Valgrind starts with no
# instrumentation; after the server is ready and 50 warm-up requests, callgrind_control turns it
# on for exactly N requests (start, load, lazy first-request work and shutdown stay out).
per_request() {
  local out="$W/cg.$RANDOM" port; port=$(free_port)
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$1" "${ARGS[@]}" \
    --http-thread-count=1 --http-port="$port" >"$out.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 1200); do curl -sf -o /dev/null "http://127.0.0.1:$port/v2/models/add_fp32/ready" && break; sleep 0.25; done
  send "$port" 50
  callgrind_control -i on "$pid" >/dev/null
  send "$port" "$N"
  callgrind_control -i off "$pid" >/dev/null
  kill -TERM "$pid"; wait "$pid" || true
  cp "$out" "$W/last.callgrind"
  awk -v n="$N" '/^totals:/ {printf "%.0f", $2 / n; exit}' "$out"
}

# calls <binary> <label>: the per-request call list of the last per_request run, and the
# syscalls of the same N requests on a server run without valgrind (strace -f attaches to every
# thread of the process).
calls() {
  echo "--- $2: per request, callgrind call counts"
  /usr/bin/python3 "$ROOT/bench/callgrind_calls.py" "$W/last.callgrind" "$N"
  local port; port=$(free_port)
  "$1" "${ARGS[@]}" --http-thread-count=1 --http-port="$port" 2>"$W/strace_srv.log" &
  local pid=$!
  wait_http "http://127.0.0.1:$port/v2/models/add_fp32/ready"
  send "$port" 50
  strace -f -c -p "$pid" -o "$W/strace.$2" 2>/dev/null & local spid=$!
  sleep 1
  send "$port" "$N"
  kill -INT "$spid"; wait "$spid" || true
  kill -TERM "$pid"; wait "$pid" || true
  echo "--- $2: syscalls per request (strace -c over the same $N requests)"
  awk -v n="$N" '$1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" {
         printf "    %-16s %.2f\n", $NF, $4 / n; sum += $4}
       END {printf "    total            %.2f\n", sum / n}' "$W/strace.$2"
}

head_ir=$(per_request "$HEAD_BIN")
[[ "${CALLS:-0}" == 1 ]] && calls "$HEAD_BIN" head
if ((SMOKE)); then
  echo "request_cost (smoke): this tree ${head_ir} instructions per request"
  exit 0
fi
base_ir=$(per_request "$BASE_BIN")
[[ "${CALLS:-0}" == 1 ]] && calls "$BASE_BIN" base
ir_ratio=$(awk -v h="$head_ir" -v b="$base_ir" 'BEGIN {printf "%.4f", h / b}')
echo "instructions per request: base ${base_ir}, head ${head_ir}, head / base ${ir_ratio}"
if [[ "${SKIP_THROUGHPUT:-0}" == 1 ]]; then
  awk -v r="$ir_ratio" 'BEGIN {exit !(r > 1.03)}' && { echo "!!!!!! request_cost: ${ir_ratio}x the base's instructions (limit 1.03)" >&2; exit 1; }
  exit 0
fi

# Throughput, both servers up, interleaved rounds.
PA=$(free_port); PB=$(free_port)
"$BASE_BIN" "${ARGS[@]}" --http-thread-count=2 --http-port="$PA" 2>"$W/a.log" & PIDS+=($!)
"$HEAD_BIN" "${ARGS[@]}" --http-thread-count=2 --http-port="$PB" 2>"$W/b.log" & PIDS+=($!)
wait_http "http://127.0.0.1:$PA/v2/models/add_fp32/ready"
wait_http "http://127.0.0.1:$PB/v2/models/add_fp32/ready"
cat > "$W/add.lua" <<'LUA'
local header = '{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":64}},' ..
  '{"name":"INPUT1","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":64}}],' ..
  '"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}'
wrk.method = "POST"
wrk.body = header .. string.rep("\0", 128)
wrk.headers["Inference-Header-Content-Length"] = tostring(#header)
wrk.headers["Content-Type"] = "application/octet-stream"
LUA
worst=""
for c in 1 8 64; do
  ratios=()
  for r in $(seq 1 "$ROUNDS"); do
    if ((r % 2)); then
      a=$(wrk_rps "$c" "$DUR" "$W/add.lua" "http://127.0.0.1:$PA/v2/models/add_fp32/infer")
      b=$(wrk_rps "$c" "$DUR" "$W/add.lua" "http://127.0.0.1:$PB/v2/models/add_fp32/infer")
    else
      b=$(wrk_rps "$c" "$DUR" "$W/add.lua" "http://127.0.0.1:$PB/v2/models/add_fp32/infer")
      a=$(wrk_rps "$c" "$DUR" "$W/add.lua" "http://127.0.0.1:$PA/v2/models/add_fp32/infer")
    fi
    ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')")
    echo "  c=$c round $r: base ${a} req/s, head ${b} req/s"
  done
  med=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR + 1) / 2)]}')
  echo "c=$c head / base req/s, median of $ROUNDS rounds: $med"
  worst=$(awk -v w="$worst" -v r="$med" 'BEGIN {if (w == "" || r < w) print r; else print w}')
done

fail=0
if awk -v r="$ir_ratio" 'BEGIN {exit !(r > 1.03)}'; then
  echo "!!!!!! request_cost: this tree costs ${ir_ratio}x the base's instructions per request (limit 1.03)" >&2
  fail=1
fi
if awk -v r="$worst" 'BEGIN {exit !(r < 0.97)}'; then
  echo "!!!!!! request_cost: throughput median ${worst}x the base at some concurrency (noisy; see above)" >&2
  [[ "${GATE_THROUGHPUT:-0}" == 1 ]] && fail=1
fi
echo "request_cost: instructions head / base ${ir_ratio} (gate 1.03), worst throughput median ${worst}"
exit "$fail"
