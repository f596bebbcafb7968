#!/usr/bin/env bash
# Protocol overhead: identity_fp32 over HTTP with the binary extension (keep-alive), against a
# hello-world server on the same HTTP library, same load generator (wrk, 2 threads), same run.
# Both servers stay up; each concurrency runs ROUNDS rounds (default 5) alternating the two, and
# the ratio is the median of the rounds' ratios (this host's speed drifts within seconds).
# Prints one line per round, one per concurrency, and the worst median last. --smoke: 2 s, 1 round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=${DURATION:-5s}; ROUNDS=${ROUNDS:-5}
[[ "${1:-}" == "--smoke" ]] && { DURATION=2s; ROUNDS=1; }

P1=$(free_port); P2=$(free_port)
"$BUILD/inferd" --model-repository="$ROOT/examples/model_repository" --model-control-mode=explicit \
  --load-model=identity_fp32 --http-port="$P1" --allow-grpc=false --allow-metrics=false \
  2>/tmp/inferd_bench_protocol.log & PIDS+=($!)
"$BUILD/hello_http" "$P2" 2 & PIDS+=($!)
wait_http "http://127.0.0.1:$P1/v2/health/ready"; wait_http "http://127.0.0.1:$P2/"

export INPUT_NAME=INPUT0 DATATYPE=FP32 SHAPE=1,16 BYTES=64
worst=""
med() { printf '%s\n' $1 | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
for c in 1 8 64; do
  ratios=""
  for r in $(seq 1 "$ROUNDS"); do
    a=$(wrk_rps "$c" "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P1/v2/models/identity_fp32/infer")
    b=$(wrk_rps "$c" "$DURATION" "$ROOT/bench/binary_request.lua" "http://127.0.0.1:$P2/")
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", a/b}')
    echo "c=$c round $r: inferd ${a} infer/s, hello-world ${b} req/s, ratio ${ratio}"
    ratios+="$ratio "
  done
  m=$(med "$ratios")
  echo "c=$c median ratio ${m} (rounds: ${ratios% })"
  worst=$(awk -v w="$worst" -v r="$m" 'BEGIN{if (w=="" || r<w) print r; else print w}')
done
stats=$(curl -s "http://127.0.0.1:$P1/v2/models/identity_fp32/stats")
/usr/bin/python3 - "$stats" <<'PY'
import json, sys
s = json.loads(sys.argv[1])["model_stats"][0]["inference_stats"]
n = s["success"]["count"]
compute = (s["compute_input"]["ns"] + s["compute_infer"]["ns"] + s["compute_output"]["ns"]) / n
print(f"server-side per request: total {s['success']['ns']/n/1000:.1f} us, queue {s['queue']['ns']/n/1000:.1f} us, compute {compute/1000:.1f} us, overhead {(s['success']['ns']/n-compute)/1000:.1f} us")
PY
echo "protocol ratio (worst median of c=1,8,64; goal >= 0.5, c=64 >= 0.8 in issue 32): $worst"
