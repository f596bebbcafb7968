#!/usr/bin/env bash
# The time a Python backend step adds to a request: an ensemble of one identity step vs the same
# ensemble followed by an identity model.py step (FP32[16]), and vs two identity steps (what any
# second step costs), on one server, measured with inferd-perf (HTTP binary) at c=1 and c=8 in
# alternating rounds. Figures are p50 client latencies; the last line is the Python step's cost
# (median over rounds of p50(ens_py) - p50(ens_plain)), also with INFERD_PYTHON_SPIN_US on a
# second server. Goal: <= 60 us at c=1.
# --smoke: one short round per model, c=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=5; WINDOW_MS=2000; CONCURRENCY="1 8"
[[ "${1:-}" == "--smoke" ]] && { ROUNDS=1; WINDOW_MS=300; CONCURRENCY="1"; }

WORK="$(mktemp -d)"
trap 'cleanup; rm -rf "$WORK"' EXIT
io='input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]'
for m in ident ident2; do
  mkdir -p "$WORK/$m/1"
  printf 'name: "%s"\nbackend: "identity"\n%s\n' "$m" "$io" > "$WORK/$m/config.pbtxt"
done
mkdir -p "$WORK/py_identity/1"
printf 'name: "py_identity"\nbackend: "python"\n%s\n' "$io" > "$WORK/py_identity/config.pbtxt"
cat > "$WORK/py_identity/1/model.py" <<'PY'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
PY
ensemble() {  # name step...
  local name=$1; shift
  local steps="" prev="INPUT0" i=0
  for s in "$@"; do
    i=$((i + 1))
    local out="t$i"; [[ $i -eq $# ]] && out="OUTPUT0"
    [[ -n "$steps" ]] && steps+=", "
    steps+="{ model_name: \"$s\" model_version: -1 input_map { key: \"INPUT0\" value: \"$prev\" } output_map { key: \"OUTPUT0\" value: \"$out\" } } "
    prev=$out
  done
  mkdir -p "$WORK/$name/1"
  printf 'name: "%s"\nplatform: "ensemble"\n%s\nensemble_scheduling { step [ %s ] }\n' \
    "$name" "$io" "$steps" > "$WORK/$name/config.pbtxt"
}
ensemble ens_plain ident
ensemble ens_py ident py_identity
ensemble ens_two ident ident2

PORT=$(free_port)
"$BUILD/inferd" --model-repository="$WORK" --http-port="$PORT" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_python_step.log & PIDS+=($!)
for m in ens_plain ens_py ens_two; do wait_http "http://127.0.0.1:$PORT/v2/models/$m/ready"; done
# A second server whose instance threads poll for the Python process's answer (SPIN_US, default
# 100) before sleeping, measured in the same rounds.
SPIN_PORT=$(free_port)
INFERD_PYTHON_SPIN_US="${SPIN_US:-100}" "$BUILD/inferd" --model-repository="$WORK" \
  --http-port="$SPIN_PORT" --allow-grpc=false --allow-metrics=false \
  2>/tmp/inferd_bench_python_step_spin.log & PIDS+=($!)
wait_http "http://127.0.0.1:$SPIN_PORT/v2/models/ens_py/ready"

p50() {  # model concurrency [port] -> p50 us
  "$BUILD/tools/perf/inferd-perf" -m "$1" -u "127.0.0.1:${3:-$PORT}" --concurrency-range "$2:$2" \
    --measurement-interval "$WINDOW_MS" --max-trials 3 --warmup-request-count 200 2>&1 |
    awk '/^  Client:/ { for (i = 1; i <= NF; i++) if ($i == "p50") { v = $(i + 1); sub(/,/, "", v); print v } }'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

summary=()
for c in $CONCURRENCY; do
  py=(); two=(); spin=()
  for r in $(seq 1 "$ROUNDS"); do
    if (( r % 2 )); then  # ABBA: the order flips every round
      a=$(p50 ens_plain "$c"); b=$(p50 ens_py "$c"); s=$(p50 ens_py "$c" "$SPIN_PORT"); t=$(p50 ens_two "$c")
    else
      t=$(p50 ens_two "$c"); s=$(p50 ens_py "$c" "$SPIN_PORT"); b=$(p50 ens_py "$c"); a=$(p50 ens_plain "$c")
    fi
    echo "c=$c round $r: p50 ens_plain $a us, ens_py $b us, ens_py (spin) $s us, ens_two $t us"
    py+=($((b - a))); two+=($((t - a))); spin+=($((s - a)))
  done
  dpy=$(printf '%s\n' "${py[@]}" | median); dtwo=$(printf '%s\n' "${two[@]}" | median)
  dspin=$(printf '%s\n' "${spin[@]}" | median)
  summary+=("c=$c: +${dpy} us (spinning ${SPIN_US:-100} us: +${dspin} us; a second identity step: +${dtwo} us)")
done
echo "python step adds (p50, goal <= 60 us at c=1): ${summary[*]}"
