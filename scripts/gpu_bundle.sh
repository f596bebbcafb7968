#!/usr/bin/env bash
# Packs into gpu-bundle/ (ignored by git) everything a GPU machine needs that a working-tree
# copy lacks, so that one `run` call of a GPU session (carry ["gpu-bundle"]) can run
# tests/gpu/check.sh there: that machine has CUDA, PyTorch and nothing of Debian's, and what
# travels with a call is at most 64 MiB, the working tree included (docs/gpu.md).
#
#   scripts/gpu_bundle.sh            # after scripts/setup.sh built ./build
#
# The bundle, one xz tarball (inferd-gpu.tar.xz) and MANIFEST.txt:
#   exe/     inferd, inferd-perf, ort_inprocess built here, stripped, and the unit test of the
#            image preprocessing kernel (image_preprocess_math_test: the kernel against the CPU
#            path, which check.sh runs there, also under compute-sanitizer)
#   lib/     the shared libraries they need beyond glibc, libstdc++ and libgcc (Debian 12's
#            sonames: absl 20220623, protobuf 32, gRPC 1.51, ICU 72, ...: none is on another
#            distribution under the same name), ONNX Runtime 1.29's CPU core and
#            libonnxruntime_providers_shared.so; libicudata (31 MB of ICU tables that only
#            libxml2's encoding conversion reads, through libarchive's xar reader) is a stub
#            with its soname and symbol
#   ep/      ONNX Runtime's CUDA execution provider with the device code of one architecture
#            (GPU_BUNDLE_SM, default 90: the H100), the others zeroed in place
#            (scripts/fatbin_keep_arch.py)
#   include/ the headers the PyTorch module's source reaches that the GPU machine lacks:
#            Abseil's and protobuf's (Debian's, the versions inferd's symbols come from) and
#            the generated model_config.pb.h
# Environment: BUILD_DIR (./build), GPU_BUNDLE_DIR (./gpu-bundle), GPU_BUNDLE_SM (90),
# GPU_BUNDLE_LIMIT_MIB (58: the 64 MiB a call carries, less the working tree),
# INFERD_ORT_CUDA_EP_LIBRARY (a copy of the provider; else the one setup.sh fetched with
# INFERD_FETCH_ORT_CUDA=1, else this script fetches the pinned npm package into the cache).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
OUT="${GPU_BUNDLE_DIR:-$ROOT/gpu-bundle}"
SM="${GPU_BUNDLE_SM:-90}"
LIMIT_MIB="${GPU_BUNDLE_LIMIT_MIB:-58}"
CACHE_DIR="${INFERD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferd}"
ORT_DIR="$CACHE_DIR/onnxruntime-1.29.0"
# The same pinned package as scripts/setup.sh's INFERD_FETCH_ORT_CUDA=1.
ORT_CUDA_PKG=com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9
ORT_CUDA_SHA256=2b459e0c17f340c92970c10ed86de4f37a3009f93c14053e6ad4334cbb6be412
EP_CACHE="$CACHE_DIR/ort-cuda-ep-0.4.9"

die() { echo "gpu_bundle: $*" >&2; exit 1; }

KERNEL_TEST="$BUILD_DIR/tests/unit/image_preprocess_math_test"
for exe in "$BUILD_DIR/inferd" "$BUILD_DIR/tools/perf/inferd-perf" "$BUILD_DIR/ort_inprocess" \
    "$KERNEL_TEST"; do
  [[ -x "$exe" ]] || die "$exe is missing: build first (flock /tmp/inferd-build.lock scripts/setup.sh)"
done
PB_H="$BUILD_DIR/src/config/model_config.pb.h"
[[ -f "$PB_H" ]] || die "$PB_H is missing: build first"

# ---- ONNX Runtime's CUDA execution provider ----
ep_dir=""
if [[ -n "${INFERD_ORT_CUDA_EP_LIBRARY:-}" ]]; then
  ep_dir="$(dirname "$INFERD_ORT_CUDA_EP_LIBRARY")"
elif [[ -f "$ORT_DIR/lib/libonnxruntime_providers_cuda.so" ]]; then
  ep_dir="$ORT_DIR/lib"
else
  ep_dir="$EP_CACHE"
  if [[ ! -f "$EP_CACHE/.complete" ]]; then
    # Its own cache folder, not beside libonnxruntime: there it would change what the default
    # build's GPU tests see (setup.sh's INFERD_FETCH_ORT_CUDA=1 puts it there on purpose).
    echo "gpu_bundle: fetching $ORT_CUDA_PKG (171 MiB) into $EP_CACHE"
    tmp="$(mktemp -d)"
    (cd "$tmp" && npm pack --silent "$ORT_CUDA_PKG" >/dev/null)
    tgz="$(ls "$tmp"/*.tgz)"
    echo "$ORT_CUDA_SHA256  $tgz" | sha256sum -c --quiet -
    mkdir -p "$EP_CACHE"
    for so in libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so; do
      tar -xzf "$tgz" -C "$tmp" "package/Plugins/Linux/x64/$so"
      cp "$tmp/package/Plugins/Linux/x64/$so" "$EP_CACHE/$so"
    done
    rm -rf "$tmp"
    touch "$EP_CACHE/.complete"
  fi
fi
for so in libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so; do
  [[ -f "$ep_dir/$so" ]] || die "$ep_dir/$so is missing"
done

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/exe" "$stage/lib" "$stage/ep" "$stage/include"

# ---- executables, stripped (the dynamic symbol table stays: the PyTorch module binds to it) --
strip -o "$stage/exe/inferd" "$BUILD_DIR/inferd"
strip -o "$stage/exe/inferd-perf" "$BUILD_DIR/tools/perf/inferd-perf"
strip -o "$stage/exe/ort_inprocess" "$BUILD_DIR/ort_inprocess"
strip -o "$stage/exe/image_preprocess_math_test" "$KERNEL_TEST"

# ---- their shared libraries, less the C/C++ runtime every Linux has (a newer one there runs
# what Debian 12's glibc 2.36 and GCC 12 built) ----
system_libs='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libmvec|libnsl|libstdc\+\+|libgcc_s|libatomic)\.'
ldd "$BUILD_DIR/inferd" "$BUILD_DIR/tools/perf/inferd-perf" "$BUILD_DIR/ort_inprocess" "$KERNEL_TEST" |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    [[ "$soname" =~ $system_libs ]] && continue
    if [[ "$soname" == libicudata.so.* ]]; then
      # A stub: the soname and the one symbol libicuuc binds to, no tables. ICU would then
      # fail to open its data (an error status, not a crash) if anything asked it to convert.
      sym="$(nm -D --defined-only "$path" | awk '/icudt.*_dat/ {print $3; exit}')"
      [[ -n "$sym" ]] || die "no icudt*_dat symbol in $path"
      echo "const char ${sym}[32] __attribute__((aligned(16))) = {0};" |
        cc -shared -fPIC -x c - -Wl,-soname,"$soname" -o "$stage/lib/$soname"
      continue
    fi
    cp -L "$path" "$stage/lib/$soname"
  done
cp "$ep_dir/libonnxruntime_providers_shared.so" "$stage/lib/"
# Nothing in lib/ may need a library that is not there or on every host.
missing="$(LD_LIBRARY_PATH="$stage/lib" ldd "$stage"/exe/* "$stage"/lib/*.so* 2>/dev/null |
  awk '/not found/ {print $1}' | sort -u)"
[[ -z "$missing" ]] || die "libraries not found: $missing"

# ---- the CUDA execution provider, one architecture's device code ----
/usr/bin/env python3 "$ROOT/scripts/fatbin_keep_arch.py" \
  "$ep_dir/libonnxruntime_providers_cuda.so" "$stage/ep/libonnxruntime_providers_cuda.so" "$SM"

# ---- headers for the PyTorch module's build there ----
cp -r /usr/include/absl "$stage/include/absl"
mkdir -p "$stage/include/google"
cp -r /usr/include/google/protobuf "$stage/include/google/protobuf"
rm -rf "$stage/include/google/protobuf/compiler"  # protoc's plugin API: not reached
cp "$PB_H" "$stage/include/"

# ---- pack ----
rm -rf "$OUT"
mkdir -p "$OUT"
commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -1)"
echo "gpu_bundle: compressing (xz -9)"
tar -C "$stage" -cf - exe lib ep include | xz -9 -T0 > "$OUT/inferd-gpu.tar.xz"
{
  echo "inferd GPU bundle (scripts/gpu_bundle.sh; unpacked by tests/gpu/check.sh)"
  echo "built from: $commit${dirty:+ (with uncommitted changes)}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "ORT CUDA EP: $ORT_CUDA_PKG, device code for sm_$SM only"
  # The PyTorch module built there must see the headers inferd was built with (class layouts,
  # vtables): check.sh refuses a tree whose src/ headers differ.
  echo "src headers: $(cd "$ROOT" && find src -name '*.h' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
  echo "sha256: $(sha256sum "$OUT/inferd-gpu.tar.xz" | cut -d' ' -f1)"
  echo "unpacked sizes (bytes):"
  (cd "$stage" && du -sb exe lib ep include)
  echo "files:"
  (cd "$stage" && find exe lib ep -type f -printf '%10s %p\n' | sort -k2)
} > "$OUT/MANIFEST.txt"

bytes="$(du -sb "$OUT" | cut -f1)"
mib="$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')"
echo "gpu_bundle: $OUT holds $mib MiB (limit $LIMIT_MIB MiB)"
if (( bytes > LIMIT_MIB * 1048576 )); then
  die "the bundle is over $LIMIT_MIB MiB: it would not travel with a run call"
fi
