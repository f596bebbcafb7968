# Shared helpers for the benchmark scripts: free ports, starting and stopping servers, wrk.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
PIDS=()
# Under `set -e` a failing `wait` (a killed server returns 143) must not end the loop early.
cleanup() { for p in "${PIDS[@]:-}"; do [[ -n "$p" ]] && { kill "$p" && wait "$p"; } 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_http() {  # url
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "server at $1 did not come up" >&2; return 1
}

# The allocator inferd runs with (tcmalloc when the build links it), preloaded into the
# in-process references so both sides allocate alike: `env $(ref_env) ort_inprocess ...`.
ref_env() {
  local lib
  lib=$(ldd "$BUILD/inferd" | awk '/libtcmalloc/ {print $3}')
  if [[ -n "$lib" ]]; then echo "LD_PRELOAD=$lib"; else echo "INFERD_REF_ALLOCATOR=glibc"; fi
}

# wrk_rps <connections> <duration> <lua> <url> -> requests/s
wrk_rps() {
  local t=2; [[ "$1" -lt 2 ]] && t=1
  wrk -t"$t" -c"$1" -d"$2" --timeout 30s -s "$3" "$4" | awk '/Requests\/sec/ {print $2}'
}

# wrk_p50_ms <connections> <duration> <lua> <url> -> p50 latency in ms
wrk_p50_ms() {
  wrk -t1 -c"$1" -d"$2" --timeout 30s --latency -s "$3" "$4" | awk '$1=="50%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v=v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v=v*1000}; print v}'
}

# make_jpegs <dir> <count>: 640x480 JPEGs (quality 90) of smooth random sinusoids plus noise,
# <dir>/img00.jpg ... (PIL), so decoders and resizers have real content to work on.
make_jpegs() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
y, x = np.mgrid[0:480, 0:640].astype(np.float64)
for i in range(int(sys.argv[2])):
    chans = [127 + 90 * np.sin(2 * np.pi * (rng.uniform(0.5, 4) * x / 640 + rng.uniform(0.5, 4) * y / 480))
             + rng.normal(0, 10, (480, 640)) for _ in range(3)]
    arr = np.clip(np.stack(chans, -1), 0, 255).astype(np.uint8)
    Image.fromarray(arr).save(f"{sys.argv[1]}/img{i:02d}.jpg", quality=90)
PY
}
