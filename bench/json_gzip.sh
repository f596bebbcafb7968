#!/usr/bin/env bash
# Large JSON answers to gzip clients (issue 32): FP32 1x3x224x224 JSON both ways through an
# identity model, sent by a Python `requests` client (which sends `Accept-Encoding: gzip,
# deflate` by default and inflates the answer), against the same client asking for identity.
# c=1, one server, ABBA rounds in one run. Each request is what such a client does: json.dumps
# of the request (the data list made once), POST, and r.json() of the answer (inflated first
# when compressed). Prints each mode's mean time per request, the size on the wire and the
# ratio. Goal: gzip time / identity time <= 2.
# --smoke: 3 requests per segment.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
N=15  # requests per segment; each mode runs four segments (ABBA twice)
[[ "${1:-}" == "--smoke" ]] && N=3
W=$(mktemp -d)
trap 'cleanup; rm -rf "$W"' EXIT

mkdir -p "$W/repo/image_identity/1"
cat > "$W/repo/image_identity/config.pbtxt" <<'PB'
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
PB

P=$(free_port)
"$BUILD/inferd" --model-repository="$W/repo" --http-port="$P" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_json_gzip.log & PIDS+=($!)
wait_http "http://127.0.0.1:$P/v2/models/image_identity/ready"

/usr/bin/python3 - "$P" "$N" <<'PY'
import json, sys, time
import numpy as np
import requests
port, n = int(sys.argv[1]), int(sys.argv[2])
a = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
request = {"inputs": [{"name": "INPUT0", "shape": list(a.shape), "datatype": "FP32",
                       "data": a.ravel().tolist()}]}
body = json.dumps(request).encode()
url = f"http://127.0.0.1:{port}/v2/models/image_identity/infer"
s = requests.Session()
headers = {"gzip": {"Accept-Encoding": "gzip, deflate"}, "identity": {"Accept-Encoding": "identity"}}
sizes = {}
def wire_size(mode):
    r = s.post(url, data=body, headers=headers[mode], stream=True)
    sizes[mode] = len(r.raw.read(decode_content=False))
def seg_full(mode):
    t0 = time.perf_counter()
    for _ in range(n):
        r = s.post(url, data=json.dumps(request), headers=headers[mode])
        assert r.status_code == 200, r.text[:200]
        out = r.json()  # inflated by requests first when compressed
        assert len(out["outputs"][0]["data"]) == a.size
        if mode == "gzip":
            assert r.headers.get("Content-Encoding") == "gzip", r.headers
    return (time.perf_counter() - t0) / n
for mode in headers: wire_size(mode)  # and a warm-up
t = {m: [] for m in headers}
for order in (("identity", "gzip"), ("gzip", "identity")) * 2:
    for m in order:
        t[m].append(seg_full(m))
mean = {m: sum(v) / len(v) * 1000 for m, v in t.items()}
print(f"identity: {mean['identity']:.1f} ms, {sizes['identity']} bytes; "
      f"gzip: {mean['gzip']:.1f} ms, {sizes['gzip']} bytes")
print(f"json_gzip: gzip / identity time {mean['gzip'] / mean['identity']:.2f}x (goal <= 2), "
      f"size {sizes['gzip'] / sizes['identity']:.3f}")
PY
