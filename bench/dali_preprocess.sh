#!/usr/bin/env bash
# The SageMaker article's DALI preprocessing (640x480 JPEG -> 299x299x3 FP32: decode, resize to
# 299x299, ImageNet mean/std, HWC) three ways, images/s on the same 16 JPEGs:
#   * the dali backend serving the article's model.dali (written by tests/models/gen_dali_models.py),
#   * inferd's image backend configured for the same steps (stretch to 299x299, HWC FP32),
#   * numpy/PIL in-process on one core (PIL decode, PIL BILINEAR resize, numpy normalize).
# Both servers over HTTP with the binary extension, wrk at concurrency 8, one image per request,
# dynamic batching, on the machine's 2 cores shared with wrk. The last line is the figure.
# --smoke: 3 s runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=20; [[ "${1:-}" == "--smoke" ]] && DURATION=3

WORK="$(mktemp -d)"
trap 'cleanup; rm -rf "$WORK"' EXIT
make_jpegs "$WORK" 16
FILES=$(ls "$WORK"/img*.jpg | paste -sd:)

REPO="$WORK/repo"
mkdir -p "$REPO/dali/1" "$REPO/image299/1"
/usr/bin/python3 - "$REPO/dali/1/model.dali" "$ROOT" <<'PY'
import sys
sys.path.insert(0, sys.argv[2] + "/tests/models")
import gen_dali_models as gen
open(sys.argv[1], "wb").write(gen.article_pipeline())
PY
cat > "$REPO/dali/config.pbtxt" <<'CFG'
name: "dali"
backend: "dali"
max_batch_size: 256
input [ { name: "DALI_INPUT_0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "DALI_OUTPUT_0" data_type: TYPE_FP32 dims: [ 299, 299, 3 ] } ]
parameters: [ { key: "num_threads" value: { string_value: "12" } } ]
dynamic_batching { }
CFG
cat > "$REPO/image299/config.pbtxt" <<'CFG'
name: "image299"
backend: "image"
max_batch_size: 256
input [ { name: "DALI_INPUT_0" data_type: TYPE_UINT8 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "DALI_OUTPUT_0" data_type: TYPE_FP32 dims: [ 299, 299, 3 ] } ]
parameters { key: "mean" value { string_value: "0.485,0.456,0.406" } }
parameters { key: "std" value { string_value: "0.229,0.224,0.225" } }
dynamic_batching { }
CFG

PORT=$(free_port)
"$BUILD/inferd" --model-repository="$REPO" --http-port="$PORT" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_dali.log & PIDS+=($!)
wait_http "http://127.0.0.1:$PORT/v2/models/dali/ready"
wait_http "http://127.0.0.1:$PORT/v2/models/image299/ready"
export IMAGE_FILES="$FILES" INPUT_NAME=DALI_INPUT_0
rate() {
  local url="http://127.0.0.1:$PORT/v2/models/$1/infer"
  wrk -t2 -c8 -d2s -s "$ROOT/bench/image_request.lua" "$url" >/dev/null  # warm up
  wrk_rps 8 "${DURATION}s" "$ROOT/bench/image_request.lua" "$url"
}
dali_rate=$(rate dali)
image_rate=$(rate image299)
cleanup; PIDS=()

ref_rate=$(taskset -c 0 /usr/bin/python3 - "$DURATION" "$WORK"/img*.jpg <<'PY'
import io, sys, time
import numpy as np
from PIL import Image
mean = np.array([0.485, 0.456, 0.406], np.float32) * 255
std = np.array([0.229, 0.224, 0.225], np.float32) * 255
data = [open(p, "rb").read() for p in sys.argv[2:]]
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < float(sys.argv[1]):
    img = Image.open(io.BytesIO(data[n % len(data)])).convert("RGB").resize((299, 299), Image.BILINEAR)
    out = (np.asarray(img, np.float32) - mean) / std
    n += 1
print(f"{n / (time.perf_counter() - t0):.1f}")
PY
)
echo "dali backend ${dali_rate} images/s, image backend ${image_rate} images/s (2 cores, HTTP, c=8); PIL+numpy ${ref_rate} images/s (1 core)"
echo "article preprocessing 640x480 JPEG -> 299x299x3 FP32: dali/image $(awk -v a="$dali_rate" -v b="$image_rate" 'BEGIN{printf "%.2f", a/b}'), dali/PIL+numpy $(awk -v a="$dali_rate" -v b="$ref_rate" 'BEGIN{printf "%.2f", a/b}')"
