#!/usr/bin/env bash
# Image preprocessing throughput: 640x480 JPEGs (quality 90, generated with PIL) through the
# image_preprocess example model (decode, shorter side 256, centre crop 224, ImageNet
# normalization, FP32 NCHW) over HTTP with the binary extension, wrk at concurrency 8, one
# image per request (the dynamic batcher forms batches, decoded on the instance's 2 threads),
# on the machine's 2 cores shared with wrk. Reference: the same steps with PIL + numpy
# in-process on one core (bench/image_reference.py). The last line is the figure.
# --smoke: 3 s runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=20; [[ "${1:-}" == "--smoke" ]] && DURATION=3

WORK="$(mktemp -d)"
trap 'cleanup; rm -rf "$WORK"' EXIT
make_jpegs "$WORK" 16
FILES=$(ls "$WORK"/img*.jpg | paste -sd:)
BYTES=$(cat "$WORK"/img*.jpg | wc -c)
echo "16 JPEGs 640x480, average $((BYTES / 16)) bytes"

PORT=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=image_preprocess --http-port="$PORT" --allow-grpc=false --allow-metrics=false \
  2>/tmp/inferd_bench_image.log & PIDS+=($!)
wait_http "http://127.0.0.1:$PORT/v2/models/image_preprocess/ready"
URL="http://127.0.0.1:$PORT/v2/models/image_preprocess/infer"

export IMAGE_FILES="$FILES" INPUT_NAME=IMAGE
wrk -t2 -c8 -d2s -s "$ROOT/bench/image_request.lua" "$URL" >/dev/null  # warm up
served=$(wrk_rps 8 "${DURATION}s" "$ROOT/bench/image_request.lua" "$URL")
stats=$(curl -s "http://127.0.0.1:$PORT/v2/models/image_preprocess/stats")
/usr/bin/python3 - "$stats" <<'PY'
import json, sys
m = json.loads(sys.argv[1])["model_stats"][0]
s, b = m["inference_stats"], m["batch_stats"]
n = s["success"]["count"]
execs = sum(x["compute_infer"]["count"] for x in b)
print(f"server side: {n} images in {execs} executions (average batch {n / max(execs, 1):.2f}), "
      f"compute {s['compute_infer']['ns'] / n / 1e6:.2f} ms per image, "
      f"queue {s['queue']['ns'] / n / 1e6:.2f} ms")
PY
cleanup; PIDS=()

ref=$(taskset -c 0 /usr/bin/python3 "$ROOT/bench/image_reference.py" "$DURATION" "$WORK"/img*.jpg)
numpy_rate=$(awk '$1=="numpy" {print $2}' <<<"$ref")
pil_rate=$(awk '$1=="pil" {print $2}' <<<"$ref")
echo "in-process, 1 core: PIL decode + numpy bilinear ${numpy_rate} images/s; PIL decode + PIL resize ${pil_rate} images/s"
echo "inferd vs PIL+PIL-resize: $(awk -v a="$served" -v b="$pil_rate" 'BEGIN{printf "%.2f", a/b}')"
echo "image preprocess 640x480 JPEG -> 3x224x224: inferd ${served} images/s (2 cores, HTTP, c=8), PIL+numpy ${numpy_rate} images/s (1 core), ratio $(awk -v a="$served" -v b="$numpy_rate" 'BEGIN{printf "%.2f", a/b}')"
