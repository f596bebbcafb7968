#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks, then configures and builds inferd.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#
#   scripts/setup.sh            # release build into build/
#   BUILD_DIR=build-asan CC=clang CXX=clang++ INFERD_SANITIZE=address,undefined \
#     EXTRA_CMAKE_ARGS="-DINFERD_FUZZ=ON -DINFERD_WITH_LIBTORCH=OFF" scripts/setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
CACHE_DIR="${INFERD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferd}"

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git curl ca-certificates
  libabsl-dev libprotobuf-dev protobuf-compiler rapidjson-dev libfast-float-dev libarchive-dev libcurl4-openssl-dev
  libgrpc++-dev protobuf-compiler-grpc python3-grpcio python3-grpc-tools python3-prometheus-client
  libgtest-dev libgmock-dev
  python3-numpy python3-onnx python3-requests python3-pytest python3-sentencepiece
  libonnx-testdata
  python3-torch python3-torchvision libtorch-dev
  wrk clang libclang-rt-14-dev
  chromium
  libjpeg62-turbo-dev libpng-dev python3-pil python3-protobuf
  libgoogle-perftools-dev zlib1g-dev
  buildah debootstrap
  nginx python3-kubernetes
  heaptrack patchelf valgrind
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# npm fetches ONNX Runtime; the machine image may already ship it outside apt.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ONNX Runtime 1.29.0 (CPU) from the pinned npm package: headers (ORT_API_VERSION 29) and the
# matching Linux x64 shared library.
ORT_VERSION=1.29.0
ORT_PKG=com.github.asus4.onnxruntime@0.4.9
ORT_SHA256=e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d
ORT_DIR="$CACHE_DIR/onnxruntime-$ORT_VERSION"
if [[ ! -f "$ORT_DIR/.complete" ]]; then
  echo "setup: fetching ONNX Runtime $ORT_VERSION ($ORT_PKG)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$ORT_PKG" >/dev/null)
  tgz="$(ls "$tmp"/*.tgz)"
  echo "$ORT_SHA256  $tgz" | sha256sum -c --quiet -
  hdr='package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers'
  lib='package/Plugins/Linux/x64/libonnxruntime.so'
  tar -xzf "$tgz" -C "$tmp" "$hdr" "$lib"
  rm -rf "$ORT_DIR"
  mkdir -p "$ORT_DIR/include" "$ORT_DIR/lib"
  cp "$tmp/$hdr"/*.h "$ORT_DIR/include/"
  cp "$tmp/$lib" "$ORT_DIR/lib/libonnxruntime.so.$ORT_VERSION"
  ln -sf "libonnxruntime.so.$ORT_VERSION" "$ORT_DIR/lib/libonnxruntime.so.1"
  ln -sf "libonnxruntime.so.1" "$ORT_DIR/lib/libonnxruntime.so"
  touch "$ORT_DIR/.complete"
fi

# ONNX Runtime's CUDA execution provider for the same 1.29 core, only when asked
# (INFERD_FETCH_ORT_CUDA=1: 171 MiB, so CI never fetches it): the pinned npm package's
# libonnxruntime_providers_cuda.so (CUDA 13, cuDNN 9; sm_75 to sm_120) and
# libonnxruntime_providers_shared.so, put beside libonnxruntime where the onnxruntime backend
# looks for them (INFERD_ORT_CUDA_EP_LIBRARY overrides). Without it, KIND_GPU ONNX models say so.
ORT_CUDA_PKG=com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9
ORT_CUDA_SHA256=2b459e0c17f340c92970c10ed86de4f37a3009f93c14053e6ad4334cbb6be412
if [[ "${INFERD_FETCH_ORT_CUDA:-0}" == 1 && ! -f "$ORT_DIR/lib/.cuda-ep-complete" ]]; then
  echo "setup: fetching ONNX Runtime's CUDA execution provider ($ORT_CUDA_PKG, 171 MiB)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$ORT_CUDA_PKG" >/dev/null)
  tgz=$(ls "$tmp"/*.tgz)
  echo "$ORT_CUDA_SHA256  $tgz" | sha256sum -c --quiet -
  for so in libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so; do
    tar -xzf "$tgz" -C "$tmp" "package/Plugins/Linux/x64/$so"
    cp "$tmp/package/Plugins/Linux/x64/$so" "$ORT_DIR/lib/$so"
  done
  rm -rf "$tmp"
  touch "$ORT_DIR/lib/.cuda-ep-complete"
fi

# s3rver 3.7.1 (npm), the S3-compatible server the SageMaker tests run on loopback.
S3RVER_DIR="$CACHE_DIR/s3rver-3.7.1"
if [[ ! -x "$S3RVER_DIR/node_modules/.bin/s3rver" ]]; then
  echo "setup: installing s3rver 3.7.1 (npm) for the S3 tests"
  mkdir -p "$S3RVER_DIR"
  (cd "$S3RVER_DIR" && npm install --silent --no-audit --no-fund s3rver@3.7.1 >/dev/null)
fi

mkdir -p "$BUILD_DIR"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" \
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DINFERD_SANITIZE="${INFERD_SANITIZE:-}" \
    -DONNXRUNTIME_ROOT="$ORT_DIR" ${EXTRA_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
