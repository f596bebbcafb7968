#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), generates the example models, and runs inferd on the
# bundled example repository. Extra arguments go to inferd, e.g. --http-port=9000.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
/usr/bin/python3 "$ROOT/tests/models/gen_models.py" --example "$ROOT/examples/model_repository"
exec "$ROOT/build/inferd" --model-repository="$ROOT/examples/model_repository" "$@"
