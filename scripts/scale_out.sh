#!/usr/bin/env bash
# Runs inferd as a fleet on this machine: N replicas on loopback, each loading models on demand
# from one repository under its own memory budget, behind nginx (deploy/nginx/), which sends
# each model to one replica (consistent hashing on its name) and retries another when a replica
# fails. Prints the front ports; SIGTERM or SIGINT stops everything.
#
#   scripts/scale_out.sh [options] N REPOSITORY [extra inferd flags...]
#
#   --front-port=P              KServe v2 front (default 8000; 0 picks a free port)
#   --sagemaker-front-port=P    SageMaker front (default 8080; 0 picks a free port)
#   --front-address=A           where the fronts listen (default 127.0.0.1)
#   --replica-memory-budget=S   each replica's --model-memory-budget (bytes, 4G, or N% of
#                               RAM; default: 80/N % of RAM, so the fleet stays within 80%)
#   --replica-base-port=B       replica i listens on B+3i (HTTP), B+3i+1 (SageMaker) and B+3i+2
#                               (metrics); default: ports the kernel picks. nginx's hash ring
#                               is built from the replicas' addresses, so fixed ports give the
#                               same placement of models on every run.
#   --nginx-workers=W           nginx worker_processes (default auto)
#   --run-dir=D                 logs, nginx config, caches (default: a new folder in /tmp)
#
# REPOSITORY is a folder or s3://bucket/prefix (AWS_* variables as inferd reads them). Extra
# flags go to every replica after the script's own, so they win (e.g. --http-thread-count=1,
# --model-eviction-policy=lru). INFERD (default build/inferd) and NGINX (default nginx) name
# the binaries.
#
# Output (stdout), once everything accepts connections:
#   replica <i>: pid <p> http 127.0.0.1:<port> sagemaker 127.0.0.1:<port> metrics 127.0.0.1:<port> log <file>
#   nginx: pid <p> config <file>
#   FRONT_PORT=<port>
#   SAGEMAKER_FRONT_PORT=<port>
# and the same as shell variables in <run dir>/fleet.env. A replica that exits is reported and
# not restarted (nginx routes its models to the others); if nginx exits, everything stops.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
INFERD="${INFERD:-$ROOT/build/inferd}"
NGINX="${NGINX:-nginx}"
TEMPLATE="$ROOT/deploy/nginx/inferd.conf.template"

front_port=8000
sagemaker_front_port=8080
front_address=127.0.0.1
budget=""
workers=auto
run_dir=""
base_port=""
usage() { sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --front-port=*) front_port="${1#*=}" ;;
    --sagemaker-front-port=*) sagemaker_front_port="${1#*=}" ;;
    --front-address=*) front_address="${1#*=}" ;;
    --replica-memory-budget=*) budget="${1#*=}" ;;
    --nginx-workers=*) workers="${1#*=}" ;;
    --replica-base-port=*) base_port="${1#*=}" ;;
    --run-dir=*) run_dir="${1#*=}" ;;
    --help) usage ;;
    *) echo "scale_out: unknown option $1" >&2; usage ;;
  esac
  shift
done
[[ $# -ge 2 ]] || usage
replicas="$1"
repository="$2"
shift 2
extra=("$@")
[[ "$replicas" =~ ^[1-9][0-9]*$ ]] || { echo "scale_out: N must be a positive integer, got '$replicas'" >&2; exit 2; }
[[ -x "$INFERD" ]] || { echo "scale_out: $INFERD is not built (scripts/setup.sh)" >&2; exit 1; }
command -v "$NGINX" >/dev/null || { echo "scale_out: nginx is not installed (apt-get install nginx)" >&2; exit 1; }
[[ -f "$TEMPLATE" ]] || { echo "scale_out: $TEMPLATE is missing" >&2; exit 1; }
if [[ -z "$budget" ]]; then
  budget="$((80 / replicas))%"
  [[ "$budget" == "0%" ]] && budget="1%"
fi
if [[ -z "$run_dir" ]]; then
  run_dir="$(mktemp -d /tmp/inferd-fleet.XXXXXX)"
else
  mkdir -p "$run_dir"
fi
run_dir="$(cd "$run_dir" && pwd)"

free_port() {
  local py=/usr/bin/python3
  [[ -x "$py" ]] || py=python3
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
[[ "$front_port" == 0 ]] && front_port="$(free_port)"
[[ "$sagemaker_front_port" == 0 ]] && sagemaker_front_port="$(free_port)"

pids=()
nginx_pid=""
stopping=0
stop() {
  stopping=1
  trap '' TERM INT
  [[ -n "$nginx_pid" ]] && kill -TERM "$nginx_pid" 2>/dev/null || true
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # inferd drains what is in flight; give it 20 s, then end it.
  local deadline=$((SECONDS + 20))
  for p in "${pids[@]}" $nginx_pid; do
    while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
on_signal() {
  echo "scale_out: stopping" >&2
  stop
  exit 0
}
trap on_signal TERM INT
fail() {
  echo "scale_out: $*" >&2
  stop
  exit 1
}

# Replicas: every port picked by the kernel (port 0), read back from the log.
declare -a http_ports sagemaker_ports metrics_ports logs
for ((i = 0; i < replicas; i++)); do
  dir="$run_dir/replica$i"
  mkdir -p "$dir"
  logs[i]="$dir/inferd.log"
  ports=(0 0 0)
  [[ -n "$base_port" ]] && ports=($((base_port + 3 * i)) $((base_port + 3 * i + 1)) $((base_port + 3 * i + 2)))
  "$INFERD" --model-repository="$repository" --model-control-mode=on-demand \
    --model-memory-budget="$budget" --model-cache-dir="$dir/cache" \
    --http-address=127.0.0.1 --http-port="${ports[0]}" --allow-grpc=false \
    --allow-sagemaker=true --sagemaker-address=127.0.0.1 --sagemaker-port="${ports[1]}" \
    --metrics-address=127.0.0.1 --metrics-port="${ports[2]}" \
    "${extra[@]}" >"${logs[i]}" 2>&1 </dev/null &
  pids[i]=$!
done
port_in_log() {  # $1 log, $2 service words ("HTTP service")
  sed -n "s/.*started $2 on [^ ]*:\([0-9][0-9]*\).*/\1/p" "$1" | tail -1
}
for ((i = 0; i < replicas; i++)); do
  deadline=$((SECONDS + 60))
  until grep -q "started HTTP service on" "${logs[i]}" 2>/dev/null; do
    kill -0 "${pids[i]}" 2>/dev/null || fail "replica $i exited during start-up:
$(tail -20 "${logs[i]}")"
    ((SECONDS < deadline)) || fail "replica $i did not start within 60 s (log: ${logs[i]})"
    sleep 0.05
  done
  http_ports[i]="$(port_in_log "${logs[i]}" "HTTP service")"
  sagemaker_ports[i]="$(port_in_log "${logs[i]}" "SageMaker service")"
  metrics_ports[i]="$(port_in_log "${logs[i]}" "Metrics Service")"
done

# nginx, from the template.
ndir="$run_dir/nginx"
mkdir -p "$ndir"
kserve_servers=""
sagemaker_servers=""
for ((i = 0; i < replicas; i++)); do
  kserve_servers+="    server 127.0.0.1:${http_ports[i]} max_fails=2 fail_timeout=5s;"$'\n'
  sagemaker_servers+="    server 127.0.0.1:${sagemaker_ports[i]} max_fails=2 fail_timeout=5s;"$'\n'
done
conf="$(<"$TEMPLATE")"
conf="${conf//@RUN_DIR@/$ndir}"
conf="${conf//@WORKERS@/$workers}"
conf="${conf//@KSERVE_LISTEN@/$front_address:$front_port}"
conf="${conf//@SAGEMAKER_LISTEN@/$front_address:$sagemaker_front_port}"
conf="${conf//@KSERVE_SERVERS@/${kserve_servers%$'\n'}}"
conf="${conf//@SAGEMAKER_SERVERS@/${sagemaker_servers%$'\n'}}"
conf="${conf//@TRIES@/$replicas}"
printf '%s\n' "$conf" >"$ndir/nginx.conf"
"$NGINX" -t -q -p "$ndir" -c "$ndir/nginx.conf" -g 'daemon off;' 2>"$ndir/check.log" ||
  fail "nginx refuses $ndir/nginx.conf: $(cat "$ndir/check.log")"
"$NGINX" -p "$ndir" -c "$ndir/nginx.conf" -g 'daemon off;' </dev/null >>"$ndir/error.log" 2>&1 &
nginx_pid=$!
deadline=$((SECONDS + 30))
until curl -s -o /dev/null "http://$front_address:$front_port/v2/health/live" 2>/dev/null &&
      curl -s -o /dev/null "http://$front_address:$sagemaker_front_port/ping" 2>/dev/null; do
  kill -0 "$nginx_pid" 2>/dev/null || fail "nginx exited: $(tail -5 "$ndir/error.log")"
  ((SECONDS < deadline)) || fail "nginx does not answer on $front_address:$front_port"
  sleep 0.05
done

{
  for ((i = 0; i < replicas; i++)); do
    echo "REPLICA_${i}_PID=${pids[i]} REPLICA_${i}_HTTP_PORT=${http_ports[i]} REPLICA_${i}_SAGEMAKER_PORT=${sagemaker_ports[i]} REPLICA_${i}_METRICS_PORT=${metrics_ports[i]}"
  done
  echo "REPLICAS=$replicas NGINX_PID=$nginx_pid"
  echo "FRONT_PORT=$front_port SAGEMAKER_FRONT_PORT=$sagemaker_front_port"
} >"$run_dir/fleet.env"
for ((i = 0; i < replicas; i++)); do
  echo "replica $i: pid ${pids[i]} http 127.0.0.1:${http_ports[i]} sagemaker 127.0.0.1:${sagemaker_ports[i]} metrics 127.0.0.1:${metrics_ports[i]} log ${logs[i]}"
done
echo "nginx: pid $nginx_pid config $ndir/nginx.conf"
echo "FRONT_PORT=$front_port"
echo "SAGEMAKER_FRONT_PORT=$sagemaker_front_port"

# Until a signal, or nginx exits. `wait -n -p` (bash 5.1) says which child ended.
alive=$replicas
while true; do
  set +e
  wait -n -p ended
  rc=$?
  set -e
  ((stopping)) && exit 0
  [[ -z "${ended:-}" ]] && continue
  if [[ "$ended" == "$nginx_pid" ]]; then
    nginx_pid=""
    fail "nginx exited with $rc: $(tail -5 "$ndir/error.log")"
  fi
  for ((i = 0; i < replicas; i++)); do
    if [[ "${pids[i]}" == "$ended" ]]; then
      alive=$((alive - 1))
      echo "scale_out: replica $i (pid $ended) exited with $rc; $alive of $replicas left" >&2
    fi
  done
  ended=""
done
