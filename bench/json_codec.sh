#!/usr/bin/env bash
# The JSON tensor codec (issue 19): FP32 1x3x224x224 (150,528 random values, printed shortest
# round-trip as numpy/tritonclient do) through an identity model, one server, one run, wrk at
# c=1 (C client, keep-alive). Three bodies: binary both ways (the reference), JSON in + binary
# out, JSON both ways. Prints each mode's mean latency and the ratios to binary.
# Goals: JSON in + binary out <= 8x binary; JSON both ways <= 20x.
# --smoke: 1 s per segment.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DUR=4s  # per segment; each mode runs two (ABBA)
[[ "${1:-}" == "--smoke" ]] && DUR=1s
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT

mkdir -p "$W/repo/image_identity/1"
cat > "$W/repo/image_identity/config.pbtxt" <<'PB'
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
PB

/usr/bin/python3 - "$W" <<'PY'
import json, sys
import numpy as np
w = sys.argv[1]
a = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
data = "[" + ",".join(repr(float(x)) for x in a.ravel()) + "]"
def header(binary_in, binary_out):
    inp = {"name": "INPUT0", "shape": list(a.shape), "datatype": "FP32"}
    if binary_in:
        inp["parameters"] = {"binary_data_size": a.nbytes}
    out = {"name": "OUTPUT0", "parameters": {"binary_data": binary_out}}
    h = json.dumps({"inputs": [inp], "outputs": [out]})
    return h if binary_in else h.replace('"datatype": "FP32"', '"datatype": "FP32", "data": ' + data)
h = header(True, True).encode()
open(f"{w}/binary.body", "wb").write(h + a.tobytes())
open(f"{w}/binary.hlen", "w").write(str(len(h)))
open(f"{w}/json_in.body", "w").write(header(False, True))
open(f"{w}/json_both.body", "w").write(header(False, False))
PY

P=$(free_port)
"$BUILD/inferd" --model-repository="$W/repo" --http-port="$P" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_json_codec.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/models/image_identity/ready"
URL="http://127.0.0.1:$P/v2/models/image_identity/infer"

# mean latency in ms at c=1 of body $1 (HEADER_LENGTH from $2 when given)
mean_ms() {
  local hlen=""; [[ -n "${2:-}" ]] && hlen=$(cat "$2")
  BODY_FILE="$1" HEADER_LENGTH="$hlen" wrk -t1 -c1 -d"$DUR" --timeout 30s \
    -s "$(dirname "${BASH_SOURCE[0]}")/body_request.lua" "$URL" 2>&1 |
    awk '/non-200/ {print "FAIL"; exit} $1=="Latency" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v=v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v=v*1000}; print v}'
}
# ABBA: each mode twice, in the order binary, JSON in, JSON both, JSON both, JSON in, binary,
# half the duration each, so a load that drifts during the run weighs on all modes alike.
seg() {
  local v; v=$(mean_ms "$@")
  [[ "$v" != FAIL && -n "$v" ]] || { echo "failed requests" >&2; exit 1; }
  echo "$v"
}
b1=$(seg "$W/binary.body" "$W/binary.hlen"); ji1=$(seg "$W/json_in.body"); jb1=$(seg "$W/json_both.body")
jb2=$(seg "$W/json_both.body"); ji2=$(seg "$W/json_in.body"); b2=$(seg "$W/binary.body" "$W/binary.hlen")
avg() { awk -v x="$1" -v y="$2" 'BEGIN{printf "%.3f", (x+y)/2}'; }
b=$(avg "$b1" "$b2"); ji=$(avg "$ji1" "$ji2"); jb=$(avg "$jb1" "$jb2")
echo "segments (ms): binary $b1 / $b2, JSON in $ji1 / $ji2, JSON both $jb1 / $jb2"
echo "c=1 mean latency: binary $b ms, JSON in + binary out $ji ms, JSON both ways $jb ms"
awk -v b="$b" -v ji="$ji" -v jb="$jb" \
  'BEGIN{printf "json_in/binary %.2f (goal <= 8), json_both/binary %.2f (goal <= 20)\n", ji/b, jb/b}'
