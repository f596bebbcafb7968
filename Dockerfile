# inferd, CPU build: the SageMaker container contract (`serve` on :8080, /opt/ml/model, the
# multi-model API) over a Triton model repository. docs/container.md describes the image.
#
#   docker build -t inferd .                    # where debian:bookworm-slim can be pulled
#   scripts/build_image.sh                      # here: buildah, a debootstrapped base, host caches
#
# Stages: `build-deps` (compilers, -dev packages, ONNX Runtime from its pinned npm package),
# `build` (inferd, Release, without the LibTorch backend), then the runtime stage: Debian 12 slim
# with only the shared libraries inferd links (found with ldd and dpkg -S in `build`) and ONNX
# Runtime.

ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build-deps
# Few instructions: with buildah's vfs driver every one is a full copy of the file system.
# ORT_*: ONNX Runtime 1.29.0 (CPU), headers and libonnxruntime.so from the pinned npm package,
# checked against its sha256. scripts/build_image.sh bind-mounts its download cache at
# DOWNLOADS; under a plain `docker build` that folder is empty and npm fetches the package.
ARG ORT_VERSION=1.29.0 \
    ORT_PKG=com.github.asus4.onnxruntime@0.4.9 \
    ORT_TGZ=com.github.asus4.onnxruntime-0.4.9.tgz \
    ORT_SHA256=e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d \
    ORT_DIR=/opt/onnxruntime \
    DOWNLOADS=/var/cache/inferd-downloads
# The build dependencies of scripts/setup.sh, less what only the tests, benchmarks, sanitizers
# and the PyTorch backend need (clang, python3-*, libtorch-dev, wrk, chromium). GTest stays:
# the top-level CMakeLists.txt requires it at configure time.
RUN export DEBIAN_FRONTEND=noninteractive \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build ccache pkg-config ca-certificates \
      libabsl-dev libprotobuf-dev protobuf-compiler rapidjson-dev libfast-float-dev libarchive-dev \
      libcurl4-openssl-dev libgrpc++-dev protobuf-compiler-grpc libgtest-dev libgmock-dev \
      libjpeg62-turbo-dev libpng-dev libgoogle-perftools-dev \
 && rm -rf /var/lib/apt/lists/*
RUN set -eu; \
    tgz="$DOWNLOADS/$ORT_TGZ"; \
    if [ ! -f "$tgz" ]; then \
      apt-get update; DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm; \
      mkdir -p /tmp/ort-dl; (cd /tmp/ort-dl && npm pack --silent "$ORT_PKG" >/dev/null); \
      tgz="/tmp/ort-dl/$ORT_TGZ"; \
    fi; \
    echo "$ORT_SHA256  $tgz" | sha256sum -c -; \
    hdr='package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers'; \
    lib='package/Plugins/Linux/x64/libonnxruntime.so'; \
    mkdir -p /tmp/ort "$ORT_DIR/include" "$ORT_DIR/lib"; \
    tar -xzf "$tgz" -C /tmp/ort "$hdr" "$lib"; \
    cp /tmp/ort/"$hdr"/*.h "$ORT_DIR/include/"; \
    cp /tmp/ort/"$lib" "$ORT_DIR/lib/libonnxruntime.so.$ORT_VERSION"; \
    ln -s "libonnxruntime.so.$ORT_VERSION" "$ORT_DIR/lib/libonnxruntime.so.1"; \
    ln -s libonnxruntime.so.1 "$ORT_DIR/lib/libonnxruntime.so"; \
    rm -rf /tmp/ort /tmp/ort-dl /var/lib/apt/lists/*

FROM build-deps AS build
# SRC_DIR and ORT_DIR are plain paths here; scripts/build_image.sh sets them to the host's, so
# the compile commands are the host build's and its ccache (mounted at CCACHE_DIR) answers them.
ARG ORT_DIR=/opt/onnxruntime SRC_DIR=/src CCACHE_DIR=/root/.cache/ccache
COPY . ${SRC_DIR}
# Then what the runtime stage gets, in /out: the stripped binary, ONNX Runtime, and the list of
# the Debian packages that own every other shared library inferd loads.
RUN set -eu; \
    cd "$SRC_DIR"; \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFERD_WITH_LIBTORCH=OFF \
      -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DCMAKE_SKIP_RPATH=ON -DONNXRUNTIME_ROOT="$ORT_DIR" >/dev/null; \
    ccache --zero-stats >/dev/null; \
    cmake --build build --target inferd; \
    ccache --show-stats | grep -E '^ *(Hits|Misses)' || true; \
    mkdir -p /out/usr/bin /out/usr/local/lib /out/usr/share/inferd; \
    strip -o /out/usr/bin/inferd build/inferd; \
    mkdir -p /out/usr/lib/inferd; cp -r build/python_backend /out/usr/lib/inferd/python_backend; \
    cp -r src/backends/dali/pydali /out/usr/lib/inferd/dali_python; \
    cp -P "$ORT_DIR"/lib/libonnxruntime.so.* /out/usr/local/lib/; \
    LD_LIBRARY_PATH="$ORT_DIR/lib" ldd build/inferd | awk '/=> \// {print $3}' | while read -r p; do \
      case "$p" in "$ORT_DIR"/*) continue;; esac; \
      r="$(readlink -f "$p")"; \
      pkg="$(dpkg -S "$p" 2>/dev/null || dpkg -S "$r" 2>/dev/null || dpkg -S "${r#/usr}")"; \
      echo "${pkg%%:*}"; \
    done | sort -u > /out/usr/share/inferd/runtime-packages; \
    echo python3-numpy >> /out/usr/share/inferd/runtime-packages; \
    echo "runtime packages: $(tr '\n' ' ' < /out/usr/share/inferd/runtime-packages)"; \
    rm -rf build

FROM ${BASE}
COPY --from=build /out/ /
# ca-certificates: multi-model loads from s3:// go over TLS. /etc/machine-id: ONNX Runtime 1.29
# crashes creating its first session without it, and slim/debootstrap bases lack it. The
# `inferd` user (uid 1000) is for platforms that run images as non-root (Kubernetes
# runAsUser); SageMaker expects containers to run as root, so root stays the default user.
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates $(cat /usr/share/inferd/runtime-packages); \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old \
           /var/log/apt /var/log/dpkg.log /var/log/alternatives.log; \
    ldconfig; \
    if ldd /usr/bin/inferd | grep 'not found'; then exit 1; fi; \
    [ -s /etc/machine-id ] || tr -d '-' < /proc/sys/kernel/random/uuid > /etc/machine-id; \
    useradd --uid 1000 --user-group --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin inferd; \
    inferd --version
COPY scripts/serve /usr/bin/serve

LABEL com.amazonaws.sagemaker.capabilities.multi-models=true \
      com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      org.opencontainers.image.title=inferd \
      org.opencontainers.image.description="inferd (CPU): Triton model repositories over KServe v2 and the SageMaker container contract"
EXPOSE 8080
ENTRYPOINT ["serve"]
