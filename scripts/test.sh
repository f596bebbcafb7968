#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test: the C++ unit tests (ctest) and
# the integration tests that start the real server (pytest), then the benchmark smoke run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
/usr/bin/python3 "$ROOT/tests/models/gen_models.py" --example "$ROOT/examples/model_repository"

echo "== unit tests (ctest)"
(cd "$ROOT/build" && ctest --output-on-failure -j "$(nproc)")

echo "== integration tests (pytest)"
cd "$ROOT"
set +e
/usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration
rc=$?
set -e
# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
if [[ $rc -ne 0 ]]; then exit "$rc"; fi
