#!/usr/bin/env bash
# What cancellation bookkeeping costs on the hot path: identity_fp32 over HTTP (binary
# extension, 64 bytes, wrk -c64), the same binary with --http-cancel-on-disconnect=true (the
# default: a cancellation token per request, its listener installed and cleared by the
# scheduler) and =false (no token). Both servers run the same build; rounds alternate so
# machine noise falls on both alike. The figure: on/off throughput ratio.
# Then LibTorch's stop check (the per-operator RecordFunction callback that lets a cancelled
# forward() stop, src/backends/libtorch): a TorchScript model of 200 small adds on [1,16]
# (the callback's worst case: tiny operators), wrk -c1, one server with the check and one with
# INFERD_PYTORCH_STOP_CHECK=0, rounds alternating. Its last line: with/without ratio.
# --smoke: one short round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=${BENCH_DURATION:-8}; ROUNDS=${BENCH_ROUNDS:-5}
[[ "${1:-}" == "--smoke" ]] && { DURATION=1; ROUNDS=1; }
REPO="$ROOT/examples/model_repository"

start() {  # <port> <on|off>
  "$BUILD/inferd" --model-repository="$REPO" --model-control-mode=explicit \
    --load-model=identity_fp32 --http-port="$1" --allow-grpc=false --allow-metrics=false \
    --http-cancel-on-disconnect="$2" 2>"/tmp/inferd_bench_cancel_$2.log" & PIDS+=($!)
}
ON=$(free_port); start "$ON" true
OFF=$(free_port); start "$OFF" false
wait_http "http://127.0.0.1:$ON/v2/models/identity_fp32/ready"
wait_http "http://127.0.0.1:$OFF/v2/models/identity_fp32/ready"

rps() { BYTES=64 SHAPE=1,16 wrk_rps 64 "${DURATION}s" "$ROOT/bench/binary_request.lua" \
          "http://127.0.0.1:$1/v2/models/identity_fp32/infer"; }
rps "$ON" >/dev/null; rps "$OFF" >/dev/null  # warm-up
on=(); off=()
for r in $(seq 1 "$ROUNDS"); do
  on+=("$(rps "$ON")"); off+=("$(rps "$OFF")")
  echo "round $r: cancellation on ${on[-1]} req/s, off ${off[-1]} req/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m_on=$(median "${on[@]}"); m_off=$(median "${off[@]}")
echo "identity_fp32 HTTP c=64 median req/s: on $m_on, off $m_off; on/off ratio $(awk -v a="$m_on" -v b="$m_off" 'BEGIN{printf "%.3f", a/b}')"

# ---- LibTorch stop check ------------------------------------------------------------------
TREPO=$(mktemp -d); trap 'cleanup; rm -rf "$TREPO"' EXIT
mkdir -p "$TREPO/torch_ops200/1"
/usr/bin/python3 - "$TREPO/torch_ops200/1/model.pt" <<'PY'
import sys, torch
class Adds(torch.nn.Module):
    def forward(self, x):
        for _ in range(200):
            x = x + 0.5
        return x
torch.jit.trace(Adds(), torch.zeros(1, 16)).save(sys.argv[1])  # 200 add nodes
PY
cat > "$TREPO/torch_ops200/config.pbtxt" <<'CFG'
name: "torch_ops200"
platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
CFG
tstart() {  # <port> <1|0>
  INFERD_PYTORCH_STOP_CHECK="$2" "$BUILD/inferd" --model-repository="$TREPO" \
    --http-port="$1" --allow-grpc=false --allow-metrics=false \
    2>"/tmp/inferd_bench_torchstop_$2.log" & PIDS+=($!)
}
TON=$(free_port); tstart "$TON" 1
TOFF=$(free_port); tstart "$TOFF" 0
wait_http "http://127.0.0.1:$TON/v2/models/torch_ops200/ready"
wait_http "http://127.0.0.1:$TOFF/v2/models/torch_ops200/ready"
trps() { INPUT_NAME=INPUT__0 BYTES=64 SHAPE=1,16 wrk_rps 1 "${DURATION}s" \
           "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$1/v2/models/torch_ops200/infer"; }
trps "$TON" >/dev/null; trps "$TOFF" >/dev/null  # warm-up (TorchScript's profiling runs)
ton=(); toff=()
for r in $(seq 1 "$ROUNDS"); do  # ABBA
  if (( r % 2 )); then ton+=("$(trps "$TON")"); toff+=("$(trps "$TOFF")")
  else toff+=("$(trps "$TOFF")"); ton+=("$(trps "$TON")"); fi
  echo "round $r: torch stop check on ${ton[-1]} req/s, off ${toff[-1]} req/s"
done
m_ton=$(median "${ton[@]}"); m_toff=$(median "${toff[@]}")
echo "torch_ops200 HTTP c=1 median req/s: stop check on $m_ton, off $m_toff; on/off ratio $(awk -v a="$m_ton" -v b="$m_toff" 'BEGIN{printf "%.3f", a/b}')"
