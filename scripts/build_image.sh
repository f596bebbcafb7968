#!/usr/bin/env bash
# Builds the container image (Dockerfile) with buildah, without a registry or a Docker daemon,
# and leaves it in buildah's local storage as localhost/inferd:latest; prints its size.
#
#   scripts/build_image.sh            # build (a second run reuses the base, layers and caches)
#   scripts/build_image.sh --check    # exit 0 when buildah can build and run containers here
#
# The base, localhost/debian:bookworm-slim, is made offline: `debootstrap --variant=minbase
# bookworm` from Debian's mirror, slimmed the way Debian's official slim images are, imported
# with `buildah from scratch`. It is made once: the rootfs tarball is cached and the image kept.
# The Dockerfile's build stage gets two bind mounts: the host's ccache (its source and ONNX
# Runtime paths are set to the host build's, so the host build's objects are hits) and the
# download cache holding the ONNX Runtime npm tarball.
#
# Environment: INFERD_IMAGE (localhost/inferd:latest), INFERD_CACHE_DIR (~/.cache/inferd),
# DEBIAN_MIRROR (http://deb.debian.org/debian), INFERD_IMAGE_REBUILD_BASE=1 makes the base again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${INFERD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferd}"
IMAGE="${INFERD_IMAGE:-localhost/inferd:latest}"
BASE_IMAGE=localhost/debian:bookworm-slim
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The same pins as scripts/setup.sh and the Dockerfile.
ORT_PKG=com.github.asus4.onnxruntime@0.4.9
ORT_TGZ=com.github.asus4.onnxruntime-0.4.9.tgz
ORT_SHA256=e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d
ORT_DIR="$CACHE_DIR/onnxruntime-1.29.0"   # where scripts/setup.sh puts it for the host build

# Rootful buildah with the vfs driver and chroot isolation: no overlay, fuse or runc needed.
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
bh() { buildah --storage-driver vfs "$@"; }
log() { echo "build_image: $*"; }

# Whether buildah can build and run here; prints the reason when not.
check() {
  if ! command -v buildah >/dev/null 2>&1; then echo "buildah is not installed"; return 1; fi
  if ! command -v debootstrap >/dev/null 2>&1; then echo "debootstrap is not installed"; return 1; fi
  if [[ $(id -u) -ne 0 ]]; then echo "not root (this script drives rootful buildah)"; return 1; fi
  local out
  if ! out="$(bh info 2>&1)"; then echo "buildah info failed: ${out##*$'\n'}"; return 1; fi
  # chroot isolation runs each command in new mount, UTS and IPC namespaces.
  if ! out="$(unshare --mount --uts --ipc true 2>&1)"; then
    echo "cannot create namespaces for buildah's chroot isolation: $out"; return 1
  fi
}
if [[ "${1:-}" == "--check" ]]; then
  if reason="$(check)"; then exit 0; fi
  echo "$reason"; exit 1
fi
if ! reason="$(check)"; then log "cannot build: $reason" >&2; exit 1; fi

start=$SECONDS
mkdir -p "$CACHE_DIR/image" "$CACHE_DIR/downloads"

# ---- base: localhost/debian:bookworm-slim -------------------------------------------------------
make_rootfs_tar() {  # $1: the tarball to write
  local work; work="$(mktemp -d "$CACHE_DIR/image/debootstrap.XXXXXX")"
  local rootfs="$work/rootfs"
  log "debootstrap --variant=minbase bookworm ($MIRROR)"
  if ! debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2; rm -rf "$work"; return 1
  fi
  # Debian's own slim images (debuerreotype --slimify): no documentation, manuals or
  # translations, now or in packages installed later; copyright files stay.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/*
  # apt as in Debian's images: no package cache kept, no translations fetched.
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  # The suites Debian's images list: the release, its updates, and security.
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # Nothing of this machine or of the bootstrap: host name, resolver, logs, caches, lists.
  rm -f "$rootfs/etc/hostname" "$rootfs/etc/machine-id"
  : >"$rootfs/etc/resolv.conf"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/var/cache/debconf/*-old \
         "$rootfs"/tmp/* "$rootfs"/debootstrap
  mkdir -p "$rootfs/var/lib/apt/lists/partial"
  tar --numeric-owner --xattrs -C "$rootfs" \
      --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -cf "$1.tmp" .
  mv "$1.tmp" "$1"
  rm -rf "$work"
}

base_tar="$CACHE_DIR/image/debian-bookworm-minbase-slim.tar"
if [[ "${INFERD_IMAGE_REBUILD_BASE:-0}" == 1 ]]; then
  rm -f "$base_tar"; bh rmi -f "$BASE_IMAGE" >/dev/null 2>&1 || true
fi
if ! bh inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  [[ -f "$base_tar" ]] || make_rootfs_tar "$base_tar"
  log "importing $base_tar as $BASE_IMAGE"
  ctr="$(bh from scratch)"
  bh add "$ctr" "$base_tar" / >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
     --cmd bash --os linux --arch amd64 "$ctr"
  bh commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
else
  log "base $BASE_IMAGE present"
fi

# ---- the ONNX Runtime npm tarball -----------------------------------------------------------------
tgz="$CACHE_DIR/downloads/$ORT_TGZ"
if [[ ! -f "$tgz" ]] || ! echo "$ORT_SHA256  $tgz" | sha256sum -c --quiet - 2>/dev/null; then
  log "npm pack $ORT_PKG"
  rm -f "$tgz"
  (cd "$CACHE_DIR/downloads" && npm pack --silent "$ORT_PKG" >/dev/null)
  echo "$ORT_SHA256  $tgz" | sha256sum -c --quiet -
fi

# ---- the image ------------------------------------------------------------------------------------
ccache_dir="$(ccache --get-config cache_dir 2>/dev/null || echo "$HOME/.cache/ccache")"
mkdir -p "$ccache_dir"
bud=(bh bud --layers --isolation chroot --network host
     --build-arg BASE="$BASE_IMAGE"
     --build-arg SRC_DIR="$ROOT" --build-arg ORT_DIR="$ORT_DIR"
     --build-arg CCACHE_DIR=/var/cache/ccache --build-arg DOWNLOADS=/var/cache/inferd-downloads
     -v "$ccache_dir:/var/cache/ccache" -v "$CACHE_DIR/downloads:/var/cache/inferd-downloads:ro"
     -f "$ROOT/Dockerfile")
# The build-deps stage under a tag of its own, so the prune below keeps it (and its layers stay
# the cache of the full build); the build stage's layers, a full copy of its file system apiece
# on vfs, are pruned.
t=$SECONDS
log "buildah bud --target build-deps -> localhost/inferd-build-deps:latest"
"${bud[@]}" --target build-deps -t localhost/inferd-build-deps:latest "$ROOT"
log "build-deps stage: $((SECONDS - t)) s"
t=$SECONDS
log "buildah bud -> $IMAGE"
"${bud[@]}" -t "$IMAGE" "$ROOT"
log "build and runtime stages: $((SECONDS - t)) s"
bh rmi --prune >/dev/null 2>&1 || true

# ---- size: compressed (the gzip layers a registry stores and pulls) and uncompressed -------------
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bh push --quiet "$IMAGE" "oci:$tmp/oci" >/dev/null
read -r gz raw layers < <(/usr/bin/python3 - "$tmp/oci" <<'EOF'
import gzip, json, sys
root = sys.argv[1]
blob = lambda d: f"{root}/blobs/{d.replace(':', '/')}"
index = json.load(open(f"{root}/index.json"))
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
gz = raw = 0
for layer in manifest["layers"]:
    gz += layer["size"]
    with open(blob(layer["digest"]), "rb") as f:
        data = f.read()
    raw += len(gzip.decompress(data)) if "gzip" in layer["mediaType"] else len(data)
print(gz, raw, len(manifest["layers"]))
EOF
)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
log "$IMAGE: $(mib "$gz") compressed (gzip layers), $(mib "$raw") uncompressed, $layers layers; total $((SECONDS - start)) s"
if ((gz > 300 * 1000 * 1000)); then
  log "WARNING: the compressed image is over the 300 MB goal" >&2
fi
