#!/usr/bin/env bash
# The GPU machine's checks (issue 29) in one command, for a session that is lent one:
#
#   run(command="bash tests/gpu/check.sh", carry=["gpu-bundle"], timeout_s=600)
#
# after scripts/gpu_bundle.sh filled gpu-bundle/ here (docs/gpu.md). Every step runs under
# `timeout`, prints its status and the tail of its log, and the run goes on past a failed step;
# a summary table of PASS/FAIL/SKIP and the figures comes last. The whole run stays inside
# GPU_CHECK_BUDGET_S (480 s): a step that would start past it is skipped. Where $OUT is set (the
# device machine), summary.txt and logs.tar.gz are written there and come back.
#
# Steps: env (GPU, driver, torch/CUDA, glibc), unpack (the bundle), inferd_starts (the bundled
# binaries run here: no library missing, --help answers), build_module (the PyTorch module
# against this machine's LibTorch, CUDA if it has it), models (tests/gpu/make_models.py),
# kernel_tests (the image preprocessing kernel against the CPU path, bit for bit: the bundled
# image_preprocess_math_test), kernel_sanitizer (the same under compute-sanitizer's memcheck
# and initcheck), module_loads (the built module loads into the bundled inferd and serves a
# TorchScript model on the CPU), pytest (every tests/gpu/test_*.py), figures
# (tests/gpu/figures.py).
#
# Without a GPU (here, CI never runs it) it still unpacks, runs the binaries and builds the
# module; the GPU steps skip. The module's LibTorch can be pointed elsewhere:
#   GPU_CHECK_TORCH_INCLUDE="dir ..." GPU_CHECK_TORCH_LIB=dir GPU_CHECK_TORCH_CUDA=0|1
#   GPU_CHECK_TORCH_ABI=0|1   (default: asked of $GPU_PYTHON's torch)
# e.g. Debian's CPU LibTorch:
#   GPU_PYTHON=/usr/bin/python3 GPU_CHECK_TORCH_INCLUDE=/usr/include/torch/csrc/api/include \
#   GPU_CHECK_TORCH_LIB=/usr/lib/x86_64-linux-gnu bash tests/gpu/check.sh
set -uo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$(dirname "$SELF")/../.." && pwd)"
export ROOT
export BUNDLE="${GPU_BUNDLE_DIR:-$ROOT/gpu-bundle}"
export WORK="${GPU_CHECK_WORK:-/tmp/inferd-gpu-check}"
export GPU_PYTHON="${GPU_PYTHON:-python3}"
export LOGS="$WORK/logs"
export PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1

# ---- one step's body, run by the driver below as `check.sh --step <name>` under timeout ----
step_env() {
  echo "host: $(uname -srm), $(nproc) cores, $(ldd --version | head -1)"
  [[ -r /etc/os-release ]] && grep PRETTY_NAME /etc/os-release
  echo "compiler: $(${CXX:-g++} --version | head -1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi || true
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
  else
    echo "nvidia-smi: not installed"
  fi
  command -v nvcc >/dev/null && nvcc --version | tail -2
  "$GPU_PYTHON" - <<'EOF' || echo "$GPU_PYTHON: no torch"
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available(),
      "cxx11 abi", torch.compiled_with_cxx11_abi())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("GPU 0:", p.name, f"sm_{p.major}{p.minor}", p.total_memory // 2**20, "MiB")
EOF
  return 0
}

step_unpack() {
  [[ -f "$BUNDLE/inferd-gpu.tar.xz" ]] || { echo "no $BUNDLE/inferd-gpu.tar.xz: run scripts/gpu_bundle.sh where inferd was built, and carry gpu-bundle"; return 1; }
  cat "$BUNDLE/MANIFEST.txt" | head -8
  want="$(awk '/^sha256:/ {print $2}' "$BUNDLE/MANIFEST.txt")"
  got="$(sha256sum "$BUNDLE/inferd-gpu.tar.xz" | cut -d' ' -f1)"
  [[ "$want" == "$got" ]] || { echo "sha256 mismatch: $got, MANIFEST says $want"; return 1; }
  # The module compiled here against this tree's headers must match the inferd binary's.
  want="$(awk '/^src headers:/ {print $3}' "$BUNDLE/MANIFEST.txt")"
  got="$(cd "$ROOT" && find src -name '*.h' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
  if [[ "$want" != "$got" ]]; then
    echo "the bundle's inferd was built from other src/ headers than this tree's ($want, here $got):"
    echo "rebuild it from this tree (scripts/gpu_bundle.sh) before the run"
    return 1
  fi
  rm -rf "$WORK/bundle"
  mkdir -p "$WORK/bundle"
  if command -v xz >/dev/null; then
    xz -dc -T0 "$BUNDLE/inferd-gpu.tar.xz" | tar -C "$WORK/bundle" -xf - || return 1
  else  # Python's lzma where xz is not installed
    "$GPU_PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$BUNDLE/inferd-gpu.tar.xz" "$WORK/bundle" || return 1
  fi
  # ORT opens libonnxruntime_providers_shared.so beside the provider it loads.
  cp "$WORK/bundle/lib/libonnxruntime_providers_shared.so" "$WORK/bundle/ep/"
  du -sh "$WORK/bundle"/*
}

step_inferd_starts() {
  missing="$(LD_LIBRARY_PATH="$INFERD_LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$WORK/bundle/exe/"* "$WORK/bundle/ep/"*.so 2>&1 | grep 'not found' | sort -u)"
  # The driver's libcuda: a host without a GPU has none, and says so in env.
  [[ "$HAVE_GPU" == 1 ]] || missing="$(grep -v 'libcuda.so.1 ' <<<"$missing")"
  if [[ -n "$missing" ]]; then echo "missing libraries:"; echo "$missing"; return 1; fi
  # Whole outputs to files first: `| head` would end them with SIGPIPE (a failure, pipefail).
  "$INFERD_BIN" --help >"$WORK/inferd_help.txt" 2>&1 || { cat "$WORK/inferd_help.txt"; return 1; }
  head -3 "$WORK/inferd_help.txt"
  "$INFERD_PERF_BIN" --help >"$WORK/perf_help.txt" 2>&1 || { cat "$WORK/perf_help.txt"; return 1; }
  head -2 "$WORK/perf_help.txt"
}

# The image preprocessing kernel's unit test (issue 30): on a GPU its KernelEqualsCpuBitForBit
# must run (not skip) and pass.
step_kernel_tests() {
  [[ "$HAVE_GPU" == 1 ]] || { echo "no GPU: the kernel test would skip"; return 77; }
  local t="$WORK/bundle/exe/image_preprocess_math_test"
  [[ -x "$t" ]] || { echo "no $t: rebuild the bundle (scripts/gpu_bundle.sh)"; return 1; }
  LD_LIBRARY_PATH="$INFERD_LIB_PATH" "$t" >"$WORK/kernel_tests.txt" 2>&1
  local rc=$?
  cat "$WORK/kernel_tests.txt"
  (( rc == 0 )) || return "$rc"
  grep -q '^\[       OK \] ImagePreprocessKernelTest.KernelEqualsCpuBitForBit' "$WORK/kernel_tests.txt" ||
    { echo "KernelEqualsCpuBitForBit did not run on the GPU (skipped?)"; return 1; }
}

# compute-sanitizer (the CUDA toolkit's: \$CUDA_HOME/bin, /usr/local/cuda/bin, PATH, or pip's
# nvidia-cuda-sanitizer-api; SKIP where there is none: it is not in the bundle) on the
# kernel's GPU tests: memcheck (out-of-bounds and misaligned accesses, API errors) and
# initcheck (reads of device memory nothing wrote).
step_kernel_sanitizer() {
  [[ "$HAVE_GPU" == 1 ]] || { echo "no GPU"; return 77; }
  local t="$WORK/bundle/exe/image_preprocess_math_test" cs=""
  [[ -x "$t" ]] || { echo "no $t: rebuild the bundle (scripts/gpu_bundle.sh)"; return 1; }
  # The toolkit's, else pip's nvidia-cuda-sanitizer-api in $GPU_PYTHON's environment.
  for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
           "$(command -v compute-sanitizer 2>/dev/null)" \
           $("$GPU_PYTHON" -c 'import glob, os, nvidia; [print(p) for r in nvidia.__path__ for p in glob.glob(os.path.join(r, "*", "compute-sanitizer", "compute-sanitizer"))]' 2>/dev/null); do
    [[ -n "$c" && -x "$c" ]] && { cs="$c"; break; }
  done
  [[ -n "$cs" ]] || { echo "compute-sanitizer not found (no CUDA toolkit here)"; return 77; }
  "$cs" --version | tail -1
  local tool
  for tool in memcheck initcheck; do
    echo "--- $tool"
    LD_LIBRARY_PATH="$INFERD_LIB_PATH" "$cs" --tool "$tool" --error-exitcode 86 \
      "$t" --gtest_filter='ImagePreprocessKernelTest.*' || return 1
  done
}

step_build_module() {
  local inc lib cuda abi
  if [[ -n "${GPU_CHECK_TORCH_INCLUDE:-}" ]]; then
    inc="$GPU_CHECK_TORCH_INCLUDE"
    lib="${GPU_CHECK_TORCH_LIB:?GPU_CHECK_TORCH_LIB must name the LibTorch library folder}"
    cuda="${GPU_CHECK_TORCH_CUDA:-0}"
    abi="${GPU_CHECK_TORCH_ABI:-1}"
  else
    local where
    where="$("$GPU_PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch.compiled_with_cxx11_abi())); print(int(torch.version.cuda is not None))')" || { echo "$GPU_PYTHON has no torch: set GPU_CHECK_TORCH_INCLUDE/LIB"; return 1; }
    local dir
    dir="$(sed -n 1p <<<"$where")"
    abi="$(sed -n 2p <<<"$where")"
    cuda="$(sed -n 3p <<<"$where")"
    inc="$dir/include $dir/include/torch/csrc/api/include"
    lib="$dir/lib"
  fi
  local flags=(-std=c++20 -O2 -DNDEBUG -fPIC -shared "-D_GLIBCXX_USE_CXX11_ABI=$abi"
               -Wno-deprecated-declarations
               # inferd's headers and the bundle's (Debian's absl/protobuf, model_config.pb.h)
               # come before anything LibTorch ships: inferd's symbols are Debian's.
               -I"$ROOT/src" -I"$WORK/bundle/include")
  for d in $inc; do flags+=(-isystem "$d"); done
  local libs=(-L"$lib" "-Wl,-rpath,$lib" "-Wl,--no-as-needed" -ltorch -ltorch_cpu -lc10)
  if [[ "$cuda" == 1 ]]; then
    # libtorch_cuda registers CUDA with LibTorch when it loads: linked even though no symbol
    # of it is used (--no-as-needed), else LibTorch would report no CUDA.
    libs+=(-ltorch_cuda -lc10_cuda)
    flags+=(-DINFERD_TORCH_CUDA=1)
    # CUDA's headers, which c10/cuda's include (the toolkit's, else the pip runtime's).
    for d in "${CUDA_HOME:-/usr/local/cuda}/include" $("$GPU_PYTHON" -c 'import glob, os, nvidia; [print(p) for p in glob.glob(os.path.join(nvidia.__path__[0], "*", "include"))]' 2>/dev/null); do
      [[ -f "$d/cuda_runtime_api.h" ]] && { flags+=(-isystem "$d"); break; }
    done
  fi
  libs+=("-Wl,--as-needed")
  local cxx="${CXX:-$(command -v g++ || command -v c++ || command -v clang++)}"
  [[ -n "$cxx" ]] || { echo "no C++ compiler (g++, c++, clang++)"; return 1; }
  echo "LibTorch: include $inc; lib $lib; CUDA $cuda; C++11 ABI $abi; compiler $($cxx --version | head -1)"
  set -x
  "$cxx" "${flags[@]}" "$ROOT/src/backends/libtorch/libtorch_backend.cc" \
    -o "$WORK/bundle/exe/libinferd_backend_pytorch.so" "${libs[@]}" || return 1
  set +x
  # inferd's own symbols stay undefined here: the executable provides them at dlopen.
  nm -D --undefined-only "$WORK/bundle/exe/libinferd_backend_pytorch.so" | grep -c inferd |
    sed 's/^/symbols of inferd taken from the executable: /'
  ldd "$WORK/bundle/exe/libinferd_backend_pytorch.so" | grep -E 'torch|c10' || true
}

step_models() {
  "$GPU_PYTHON" -c 'import torch, torchvision, onnx' 2>/dev/null ||
    { echo "$GPU_PYTHON has no torch/torchvision/onnx: no models"; return 77; }
  "$GPU_PYTHON" "$ROOT/tests/gpu/make_models.py" "$WORK/models"
}

step_module_loads() {
  [[ -f "$WORK/bundle/exe/libinferd_backend_pytorch.so" ]] || { echo "no module built"; return 1; }
  [[ -d "$WORK/models/resnet50_torch_cpu" ]] || { echo "no models"; return 77; }
  rm -rf "$WORK/module_repo"
  mkdir -p "$WORK/module_repo"
  cp -al "$WORK/models/resnet50_torch_cpu" "$WORK/module_repo/"
  "$GPU_PYTHON" - <<'EOF'
import os, socket, subprocess, time, json, urllib.request
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
work = os.environ["WORK"]
log = open(f"{work}/module_inferd.log", "wb")
p = subprocess.Popen([os.environ["INFERD_BIN"], f"--model-repository={work}/module_repo",
                      f"--http-port={port}", "--http-address=127.0.0.1", "--allow-grpc=false",
                      "--allow-metrics=false"], stdout=log, stderr=subprocess.STDOUT)
url = f"http://127.0.0.1:{port}"
ok = False
for _ in range(600):
    if p.poll() is not None:
        break
    try:
        ok = urllib.request.urlopen(url + "/v2/health/ready", timeout=2).status == 200
        if ok:
            break
    except Exception:
        pass
    time.sleep(0.3)
if ok:
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                   "data": [0.5] * (3 * 224 * 224)}]}).encode()
    r = urllib.request.urlopen(urllib.request.Request(url + "/v2/models/resnet50_torch_cpu/infer", body),
                               timeout=120)
    out = json.loads(r.read())["outputs"][0]
    print("served", out["name"], out["shape"])
p.terminate(); p.wait(timeout=60)
print(open(f"{work}/module_inferd.log", errors="replace").read()[-3000:])
raise SystemExit(0 if ok else 1)
EOF
}

step_pytest() {
  "$GPU_PYTHON" -c 'import pytest, requests, numpy' 2>/dev/null ||
    { echo "$GPU_PYTHON lacks pytest/requests/numpy"; return 77; }
  local tests=("$ROOT"/tests/gpu/test_*.py)
  [[ -e "${tests[0]}" ]] || { echo "no tests/gpu/test_*.py"; return 77; }
  GPU_MODELS_DIR="$WORK/models" "$GPU_PYTHON" -m pytest -p no:cacheprovider -q -rs \
    --junitxml="$WORK/pytest.xml" "${tests[@]}"
}

step_figures() {
  [[ "$HAVE_GPU" == 1 ]] || { echo "no GPU: no figures"; return 77; }
  [[ -d "$WORK/models/resnet50_onnx_gpu" ]] || { echo "no models"; return 1; }
  "$GPU_PYTHON" "$ROOT/tests/gpu/figures.py" "$WORK/models" "$WORK"
}

if [[ "${1:-}" == "--step" ]]; then
  "step_$2"
  exit $?
fi

# ---- the driver ----
BUDGET_S="${GPU_CHECK_BUDGET_S:-480}"
rm -rf "$WORK"
mkdir -p "$LOGS"
declare -a ROWS=()
record() { ROWS+=("$(printf '%-16s %-14s %6ss  %s' "$1" "$2" "$3" "$4")"); }

run_step() {  # run_step <name> <timeout s>
  local name="$1" limit="$2" left=$(( BUDGET_S - SECONDS ))
  if (( left < 15 )); then
    echo "=== $name: SKIP (the ${BUDGET_S}s budget is spent)"
    record "$name" SKIP 0 "no time left"
    return 1
  fi
  (( limit > left )) && limit=$left
  echo "=== $name (at most ${limit}s)"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" bash "$SELF" --step "$name" >"$LOGS/$name.log" 2>&1
  rc=$?
  local dt=$(( SECONDS - t0 )) status note=""
  case $rc in
    0) status=PASS ;;
    77) status=SKIP ;;
    124|137) status="FAIL(timeout)" ;;
    *) status="FAIL(rc=$rc)" ;;
  esac
  tail -n "${GPU_CHECK_TAIL:-25}" "$LOGS/$name.log" | sed 's/^/    | /'
  # pytest's closing line, where there is one (e.g. "3 passed, 2 skipped in 80s").
  note="$(grep -E '[0-9]+ (passed|failed|skipped|error)' "$LOGS/$name.log" | tail -1 | sed 's/=//g; s/^ *//')"
  echo "=== $name: $status in ${dt}s"
  record "$name" "$status" "$dt" "$note"
  return "$rc"
}

HAVE_GPU=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then HAVE_GPU=1; fi
export HAVE_GPU

# The bundle's libraries for inferd alone (wrappers below), not for python: Debian's libz or
# libcrypto must not replace the host's in torch's process. The CUDA libraries the ORT
# provider needs (cuBLAS, cuBLASLt, cuRAND, cudart 13, cuDNN 9) are pip's, in the venv.
NV_DIRS="$("$GPU_PYTHON" - 2>/dev/null <<'EOF'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "**", "lib*.so*"), recursive=True)})
print(":".join(dirs))
EOF
)"
export INFERD_LIB_PATH="$WORK/bundle/lib${NV_DIRS:+:$NV_DIRS}"
mkdir -p "$WORK/bin"
for exe in inferd inferd-perf ort_inprocess; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
    "$INFERD_LIB_PATH" "$WORK/bundle/exe/$exe" > "$WORK/bin/$exe"
  chmod +x "$WORK/bin/$exe"
done
export INFERD_BIN="$WORK/bin/inferd" INFERD_PERF_BIN="$WORK/bin/inferd-perf"
export ORT_INPROCESS_BIN="$WORK/bin/ort_inprocess"
export INFERD_ORT_CUDA_EP_LIBRARY="$WORK/bundle/ep/libonnxruntime_providers_cuda.so"

echo "inferd GPU checks: GPU $([[ $HAVE_GPU == 1 ]] && echo present || echo absent), budget ${BUDGET_S}s, work $WORK"
run_step env 60
run_step unpack 120 && bundle_ok=1 || bundle_ok=0
if [[ $bundle_ok == 1 ]]; then
  run_step inferd_starts 60
  run_step kernel_tests 60
  run_step kernel_sanitizer 90
  run_step build_module 300
else
  for s in inferd_starts kernel_tests kernel_sanitizer build_module; do record "$s" SKIP 0 "no bundle"; done
fi
run_step models 240
if [[ $bundle_ok == 1 ]]; then
  run_step module_loads 180
  run_step pytest 360
  run_step figures 300
else
  for s in module_loads pytest figures; do record "$s" SKIP 0 "no bundle"; done
fi

summary="$WORK/summary.txt"
{
  echo
  echo "==== inferd GPU checks: summary ($(date -u +%H:%M:%SZ), ${SECONDS}s) ===="
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /' || true
  [[ $HAVE_GPU == 1 ]] || echo "GPU: none"
  printf '%-16s %-14s %7s  %s\n' step status time note
  printf '%s\n' "${ROWS[@]}"
  grep -h '^FIGURE' "$LOGS"/*.log 2>/dev/null | sed 's/^FIGURE /figure  /'
  grep -h -E '^(resnet50|bert_like)_[a-z_]+: (GPU vs CPU|nvidia-smi)' "$LOGS/pytest.log" 2>/dev/null
} | tee "$summary"
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  cp "$summary" "$OUT/summary.txt"
  (cd "$WORK" && find . -maxdepth 2 \( -path ./logs/\* -o -name '*.log' -o -name '*.csv' -o -name '*.xml' \) -type f -print0 |
    tar -czf "$OUT/logs.tar.gz" --null -T -) || true
fi
grep -q -E 'FAIL|no time left' "$summary" && exit 1
exit 0
