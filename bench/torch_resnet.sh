#!/usr/bin/env bash
# TorchScript ResNet-50 through inferd's PyTorch backend vs torch::jit called in-process with
# the same threads and the same allocator (tcmalloc, preloaded into the reference when inferd
# links it): p50 at c=1 (batch 1), and images/s at c=8 with dynamic batching vs the in-process
# best batch. A short run of each batch size picks the reference batch; then short segments of
# the reference and of inferd alternate (this machine's speed drifts) and the median of the
# per-round ratios is reported. The reference with glibc's malloc is printed for context: it is
# what calling torch::jit from a program that keeps the default allocator gives.
# --smoke: short runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=4; DURATION=10s; ITER=10; [[ "${1:-}" == "--smoke" ]] && { ROUNDS=1; DURATION=5s; ITER=2; }
REPO=$(mktemp -d)
trap 'cleanup; rm -rf "$REPO"' EXIT
/usr/bin/python3 "$ROOT/tests/models/gen_torch_models.py" "$REPO" >/dev/null
MODEL="$REPO/torch_resnet50/1/model.pt"
THREADS=2

# torch_run <metric> <batch> <iterations> [glibc] -> the metric from torch_inprocess
torch_run() {
  local envs; envs=$(ref_env); [[ "${4:-}" == glibc ]] && envs="INFERD_REF_ALLOCATOR=glibc"
  env $envs "$BUILD/torch_inprocess" "$MODEL" "$THREADS" "$3" "$2" 3 224 224 | awk -v m="$1" '$1==m {print $2}'
}

P=$(free_port)
"$BUILD/inferd" --model-repository="$REPO" --model-control-mode=explicit --load-model=torch_resnet50 \
  --http-port="$P" --allow-grpc=false --allow-metrics=false 2>/tmp/inferd_bench_torch.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/health/ready"
export INPUT_NAME=INPUT__0 DATATYPE=FP32 SHAPE=1,3,224,224 BYTES=602112
URL="http://127.0.0.1:$P/v2/models/torch_resnet50/infer"

best=0; best_b=0
for b in 1 2 4 8; do
  ips=$(torch_run items_per_s "$b" "$ITER")
  echo "torch::jit in-process batch $b: $ips images/s" >&2
  if awk -v a="$ips" -v b="$best" 'BEGIN{exit !(a>b)}'; then best=$ips; best_b=$b; fi
done
iters=$(awk -v ips="$best" -v b="$best_b" -v d="${DURATION%s}" 'BEGIN{n=int(d*ips/b); print (n<2?2:n)}')
glibc=$(torch_run items_per_s "$best_b" "$iters" glibc)
echo "torch::jit in-process batch $best_b with glibc malloc: $glibc images/s" >&2

lat=(); tp=()
for r in $(seq 1 "$ROUNDS"); do
  ref=$(torch_run p50_ms 1 "$ITER")
  got=$(wrk_p50_ms 1 "$DURATION" "$ROOT/bench/binary_request.lua" "$URL")
  l=$(awk -v a="$got" -v b="$ref" 'BEGIN{printf "%.3f", a/b}')
  in=$(torch_run items_per_s "$best_b" "$iters")
  ips=$(wrk_rps 8 "$DURATION" "$ROOT/bench/binary_request.lua" "$URL")
  t=$(awk -v a="$ips" -v b="$in" 'BEGIN{printf "%.3f", a/b}')
  echo "round $r: p50 in-process ${ref} ms, inferd ${got} ms (ratio $l); images/s in-process batch $best_b ${in}, inferd c=8 ${ips} (ratio $t)"
  lat+=("$l"); tp+=("$t")
done
stats=$(curl -s "http://127.0.0.1:$P/v2/models/torch_resnet50/stats")
/usr/bin/python3 -c 'import json,sys; s=json.loads(sys.argv[1])["model_stats"][0]; print("inferd average batch %.2f (every request, the c=1 runs included)" % (s["inference_count"]/max(1,s["execution_count"])))' "$stats"
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "torch latency ratio (median, goal <= 1.03): $(med "${lat[@]}")"
echo "torch throughput ratio (median, goal >= 0.97): $(med "${tp[@]}")"
