#!/usr/bin/env bash
# ONNX Runtime's thread spinning on ResNet-50 (issue 32): the example config (one CPU instance,
# intra_op_thread_count 2, dynamic batching with no delay) served three ways by one server, in
# rounds that rotate the order, so the machine's drift falls on all three alike:
#   off:       allow_spinning 0 (the pool threads block as soon as they find no work);
#   run-only:  allow_spinning 1 and session.force_spinning_stop 1 (they spin between the
#              operators of a run and stop when the run returns, leaving the cores to the HTTP
#              threads between runs);
#   on:        allow_spinning 1 (ONNX Runtime's own default: they spin after a run too).
# Figures per variant: c=1 p50 (ms) and c=8 images/s (binary HTTP, batch-1 requests), medians
# of the rounds, and c=1 p50 divided by ONNX Runtime in-process with spinning on (its default).
# --smoke: one short round.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=${ROUNDS:-3}; DUR=8s; ITER=20
[[ "${1:-}" == "--smoke" ]] && { ROUNDS=1; DUR=2s; ITER=2; }
MODEL="$ROOT/examples/model_repository/resnet50/1/model.onnx"
REPO=$(mktemp -d)
trap 'cleanup; rm -rf "$REPO"' EXIT

declare -A EXTRA=(
  [off]='parameters { key: "allow_spinning" value: { string_value: "0" } }'
  [run_only]='parameters { key: "allow_spinning" value: { string_value: "1" } }
parameters { key: "session.force_spinning_stop" value: { string_value: "1" } }'
  [on]='parameters { key: "allow_spinning" value: { string_value: "1" } }'
)
VARIANTS=(off run_only on)
for v in "${VARIANTS[@]}"; do
  mkdir -p "$REPO/r_$v/1"
  ln -s "$MODEL" "$REPO/r_$v/1/model.onnx"
  { sed -e "s/^name: .*/name: \"r_$v\"/" "$ROOT/examples/model_repository/resnet50/config.pbtxt"
    echo "${EXTRA[$v]}"; } > "$REPO/r_$v/config.pbtxt"
done

P=$(free_port)
"$BUILD/inferd" --model-repository="$REPO" --http-port="$P" --allow-grpc=false \
  --allow-metrics=false 2>/tmp/inferd_bench_spinning.log & PIDS+=($!)
for v in "${VARIANTS[@]}"; do wait_http "http://127.0.0.1:$P/v2/models/r_$v/ready"; done
export INPUT_NAME=input DATATYPE=FP32 SHAPE=1,3,224,224 BYTES=602112
LUA="$ROOT/bench/binary_request.lua"
declare -A P50 IPS
refs=()
for r in $(seq 1 "$ROUNDS"); do
  ref=$(env $(ref_env) SPIN=1 "$BUILD/ort_inprocess" "$MODEL" input "$ITER" 1 3 224 224 |
        awk '/p50_ms/ {print $2}')
  refs+=("$ref")
  # Rotate the order each round.
  order=("${VARIANTS[@]:$(( (r - 1) % 3 ))}" "${VARIANTS[@]:0:$(( (r - 1) % 3 ))}")
  line="round $r: in-process (spinning) p50 ${ref} ms;"
  for v in "${order[@]}"; do
    p50=$(wrk_p50_ms 1 "$DUR" "$LUA" "http://127.0.0.1:$P/v2/models/r_$v/infer")
    ips=$(wrk_rps 8 "$DUR" "$LUA" "http://127.0.0.1:$P/v2/models/r_$v/infer")
    P50[$v]+="$p50 "; IPS[$v]+="$ips "
    line+=" $v c=1 p50 ${p50} ms, c=8 ${ips}/s;"
  done
  echo "$line"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
ref=$(median "${refs[@]}")
for v in "${VARIANTS[@]}"; do
  # shellcheck disable=SC2086
  p=$(median ${P50[$v]}); i=$(median ${IPS[$v]})
  stats=$(curl -s "http://127.0.0.1:$P/v2/models/r_$v/stats")
  batch=$(/usr/bin/python3 -c 'import json,sys; s=json.loads(sys.argv[1])["model_stats"][0]; print("%.2f" % (int(s["inference_count"]) / max(1, int(s["execution_count"]))))' "$stats")
  echo "$v: c=1 p50 $p ms (÷ in-process $(awk -v a="$p" -v b="$ref" 'BEGIN{printf "%.3f", a/b}')), c=8 $i images/s, average batch $batch"
done
