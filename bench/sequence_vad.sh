#!/usr/bin/env bash
# Silero VAD v5 (npm @ricky0123/vad-web@0.0.31, cached by tests/models/gen_sequence_models.py):
# per-chunk latency and chunks/s through the sequence batcher (implicit state kept in the
# server) vs the same ONNX file served stateless with the state round-tripped by the client,
# same server, alternating rounds (bench/sequence_vad_client.py). The last line holds the
# median ratios. --smoke: one short round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CHUNKS=200; CLIENTS=8; ROUNDS=3
[[ "${1:-}" == "--smoke" ]] && { CHUNKS=10; ROUNDS=1; }

WORK="$(mktemp -d)"
trap 'cleanup; rm -rf "$WORK"' EXIT
ROOT="$ROOT" /usr/bin/python3 - "$WORK/repo" <<'PY'
import sys
import os; sys.path.insert(0, os.path.join(os.environ["ROOT"], "tests/models"))
import gen_sequence_models as gen
gen.write_vad(sys.argv[1], "vad_seq", stateful=True)
gen.write_vad(sys.argv[1], "vad_plain", stateful=False)
PY
PORT=$(free_port)
"$BUILD/inferd" --model-repository="$WORK/repo" --http-port="$PORT" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_sequence_vad.log & PIDS+=($!)
wait_http "http://127.0.0.1:$PORT/v2/models/vad_seq/ready"
wait_http "http://127.0.0.1:$PORT/v2/models/vad_plain/ready"
/usr/bin/python3 "$ROOT/bench/sequence_vad_client.py" "http://127.0.0.1:$PORT" "$CHUNKS" "$CLIENTS" "$ROUNDS"
