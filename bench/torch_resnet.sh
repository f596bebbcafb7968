#!/usr/bin/env bash
# TorchScript ResNet-50 through inferd's PyTorch backend vs torch::jit called in-process with
# the same threads: p50 at c=1 (batch 1), and images/s at c=8 with dynamic batching vs the
# in-process best batch. Alternating rounds, medians (this machine's speed drifts).
# --smoke: short runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=2; DURATION=10s; ITER=10; [[ "${1:-}" == "--smoke" ]] && { ROUNDS=1; DURATION=5s; ITER=2; }
REPO=$(mktemp -d)
trap 'cleanup; rm -rf "$REPO"' EXIT
/usr/bin/python3 "$ROOT/tests/models/gen_torch_models.py" "$REPO" >/dev/null
MODEL="$REPO/torch_resnet50/1/model.pt"
THREADS=2

P=$(free_port)
"$BUILD/inferd" --model-repository="$REPO" --model-control-mode=explicit --load-model=torch_resnet50 \
  --http-port="$P" --allow-grpc=false --allow-metrics=false 2>/tmp/inferd_bench_torch.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/health/ready"
export INPUT_NAME=INPUT__0 DATATYPE=FP32 SHAPE=1,3,224,224 BYTES=602112
lat=(); tp=()
for r in $(seq 1 "$ROUNDS"); do
  ref=$("$BUILD/torch_inprocess" "$MODEL" "$THREADS" "$ITER" 1 3 224 224 | awk '/p50_ms/ {print $2}')
  got=$(wrk_p50_ms 1 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/torch_resnet50/infer")
  l=$(awk -v a="$got" -v b="$ref" 'BEGIN{printf "%.3f", a/b}')
  best=0
  for b in 1 2 4 8; do
    ips=$("$BUILD/torch_inprocess" "$MODEL" "$THREADS" "$ITER" "$b" 3 224 224 | awk '/items_per_s/ {print $2}')
    if awk -v a="$ips" -v b="$best" 'BEGIN{exit !(a>b)}'; then best=$ips; fi
  done
  ips=$(wrk_rps 8 "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P/v2/models/torch_resnet50/infer")
  t=$(awk -v a="$ips" -v b="$best" 'BEGIN{printf "%.3f", a/b}')
  echo "round $r: p50 in-process ${ref} ms, inferd ${got} ms (ratio $l); images/s in-process best ${best}, inferd c=8 ${ips} (ratio $t)"
  lat+=("$l"); tp+=("$t")
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "torch latency ratio (median, goal <= 1.03): $(med "${lat[@]}")"
echo "torch throughput ratio (median, goal >= 0.97): $(med "${tp[@]}")"
