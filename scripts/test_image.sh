#!/usr/bin/env bash
# Checks the image scripts/build_image.sh leaves in buildah's storage (localhost/inferd:latest):
# runs its entrypoint with `buildah run --isolation chroot` (host network) the way SageMaker
# runs the container, with the models mounted at /opt/ml/model (single model) or
# /opt/ml/models (multi model), and checks the contract over loopback; measures /ping -> 200
# from the container's start. The checks are tests/image/check_image.py.
#
#   scripts/test_image.sh                    # every scenario
#   scripts/test_image.sh --only single      # one of: config single mme mme-nonroot ping-time
#
# Environment: INFERD_IMAGE (localhost/inferd:latest), INFERD_IMAGE_PING_LIMIT_S (5: the hard
# bound on the median /ping time; the goal, 1 s, is reported).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${INFERD_IMAGE:-localhost/inferd:latest}"
export INFERD_IMAGE="$IMAGE" STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

if ! reason="$("$ROOT/scripts/build_image.sh" --check)"; then
  echo "test_image: cannot run containers here: $reason" >&2; exit 1
fi
if ! buildah --storage-driver vfs inspect --type image "$IMAGE" >/dev/null 2>&1; then
  echo "test_image: no image $IMAGE in buildah's storage; run scripts/build_image.sh first" >&2; exit 1
fi
[[ -f "$ROOT/examples/model_repository/simple/1/model.onnx" ]] ||
  /usr/bin/python3 "$ROOT/tests/models/gen_models.py" --example "$ROOT/examples/model_repository" >/dev/null
start=$SECONDS
/usr/bin/python3 "$ROOT/tests/image/check_image.py" --image "$IMAGE" "$@"
echo "test_image: $((SECONDS - start)) s"
