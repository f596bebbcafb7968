#!/usr/bin/env bash
# Protocol overhead: identity_fp32 over HTTP with the binary extension (keep-alive), against a
# hello-world server on the same HTTP library, same load generator (wrk, 2 threads), same run.
# Prints one line per concurrency and the worst ratio last. --smoke: 2 s runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=10s; [[ "${1:-}" == "--smoke" ]] && DURATION=2s

P1=$(free_port); P2=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=identity_fp32 --http-port="$P1" --allow-grpc=false --allow-metrics=false \
  2>/tmp/inferd_bench_protocol.log & PIDS+=($!)
"$BUILD/hello_http" "$P2" 2 & PIDS+=($!)
wait_http "http://127.0.0.1:$P1/v2/health/ready"; wait_http "http://127.0.0.1:$P2/"

export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64
worst=""
for c in 1 8 64; do
  a=$(wrk_rps "$c" "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P1/v2/models/identity_fp32/infer")
  b=$(wrk_rps "$c" "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P2/")
  r=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", a/b}')
  echo "c=$c inferd ${a} infer/s, hello-world ${b} req/s, ratio ${r}"
  worst=$(awk -v w="$worst" -v r="$r" 'BEGIN{if (w=="" || r<w) print r; else print w}')
done
stats=$(curl -s "http://127.0.0.1:$P1/v2/models/identity_fp32/stats")
/usr/bin/python3 - "$stats" <<'PY'
import json, sys
s = json.loads(sys.argv[1])["model_stats"][0]["inference_stats"]
n = s["success"]["count"]
compute = (s["compute_input"]["ns"] + s["compute_infer"]["ns"] + s["compute_output"]["ns"]) / n
print(f"server-side per request: total {s['success']['ns']/n/1000:.1f} us, queue {s['queue']['ns']/n/1000:.1f} us, compute {compute/1000:.1f} us, overhead {(s['success']['ns']/n-compute)/1000:.1f} us")
PY
echo "protocol ratio (worst of c=1,8,64; goal >= 0.5): $worst"
