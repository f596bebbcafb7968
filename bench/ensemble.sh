#!/usr/bin/env bash
# The image_classifier ensemble (JPEG -> image_preprocess -> resnet50 -> top-5) called once,
# vs the client chaining the two calls itself (the 602 KB FP32 tensor goes back and forth),
# on the same server in the same run: images/s at c=1 and c=4, alternating rounds
# (bench/ensemble_client.py). 640x480 JPEGs generated with PIL. The last line is the figure.
# --smoke: 2 s rounds, c=1 only.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SECONDS_PER_ROUND=10; CONCURRENCY="1 4"
[[ "${1:-}" == "--smoke" ]] && { SECONDS_PER_ROUND=2; CONCURRENCY="1"; }

WORK="$(mktemp -d)"
trap 'cleanup; rm -rf "$WORK"' EXIT
make_jpegs "$WORK" 8

PORT=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=image_classifier --http-port="$PORT" --allow-grpc=false --allow-metrics=false \
  2>/tmp/inferd_bench_ensemble.log & PIDS+=($!)
wait_http "http://127.0.0.1:$PORT/v2/models/image_classifier/ready"

ratios=()
for c in $CONCURRENCY; do
  out=$(/usr/bin/python3 "$ROOT/bench/ensemble_client.py" "http://127.0.0.1:$PORT" \
        "$SECONDS_PER_ROUND" "$c" "$WORK"/img*.jpg)
  echo "$out" | head -n -1
  ratios+=("c=$c $(echo "$out" | tail -1 | awk '{print $NF}')")
done
echo "ensemble / client-chained throughput (goal > 1): ${ratios[*]}"
