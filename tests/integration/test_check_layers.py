"""scripts/check_layers.py: the layer check that scripts/test.sh runs first. Each test builds a
small fake tree (src/ folders with one-line headers) and runs the script on it as test.sh does;
the last one runs it on the real tree."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def run(root):
    r = subprocess.run(["/usr/bin/python3", str(SCRIPT), "--root", str(root)],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def tree(tmp_path, files):
    """Writes the lawful skeleton plus `files` ({path: text})."""
    base = {
        "src/common/status.h": "#pragma once\n",
        "src/core/infer_request.h": '#include "common/status.h"\n',
        "src/config/model_config_util.h": '#include "common/status.h"\n#include "model_config.pb.h"\n',
        "src/backends/backend.h": '#include "core/infer_request.h"\n#include "config/model_config_util.h"\n',
        "src/backends/onnxruntime/ort.cc": '#include "backends/backend.h"\n#include "onnxruntime_cxx_api.h"\n',
        "src/backends/identity/identity.cc": '#include "backends/backend.h"\n',
        "src/scheduling/scheduler.h": '#include "backends/backend.h"\n',
        "src/repository/model.h": '#include "scheduling/scheduler.h"\n',
        "src/server/server.h": '#include "repository/model.h"\n#include <vector>\n',
        "src/frontends/http/http.h": '#include "server/server.h"\n#include "core/infer_request.h"\n',
        "src/frontends/sagemaker/sm.cc": '#include "frontends/http/http.h"\n',
        "src/app/main.cc": '#include "frontends/http/http.h"\n#include "backends/identity/identity.cc"\n',
        "tools/perf/perf.cc": '#include "tools/perf/perf.h"\n#include "grpc_service.grpc.pb.h"\n',
        "tools/perf/perf.h": "#pragma once\n",
    }
    base.update(files)
    for path, text in base.items():
        p = tmp_path / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_lawful_tree_passes(tmp_path):
    rc, out = run(tree(tmp_path, {}))
    assert rc == 0, out
    assert "check_layers: OK 14 files" in out


def test_include_up_a_layer_fails_naming_file_line_and_layers(tmp_path):
    rc, out = run(tree(tmp_path, {"src/common/logging.h":
                                  '#pragma once\n#include <string>\n#include "server/server.h"\n'}))
    assert rc == 1, out
    assert 'src/common/logging.h:3: #include "server/server.h": src/common (level 0) must not ' \
           "include src/server (level 7), which is above it" in out
    assert "check_layers: FAIL 1 include(s)" in out


def test_relative_include_is_resolved(tmp_path):
    rc, out = run(tree(tmp_path, {"src/core/tensor.h": '#include "../scheduling/scheduler.h"\n'}))
    assert rc == 1, out
    assert "src/core (level 1) must not include src/scheduling" in out


def test_sibling_backends_and_subfolders(tmp_path):
    # A backend's sub-folder belongs to that backend; one backend never includes another.
    rc, out = run(tree(tmp_path, {"src/backends/python/stub/stub.cc":
                                  '#include "backends/backend.h"\n#include "backends/identity/identity.cc"\n'}))
    assert rc == 1, out
    assert ("src/backends/python (level 4) must not include src/backends/identity (level 4), "
            "which is on its own level") in out
    assert out.count("src/backends/python/stub/stub.cc") == 1


def test_frontend_never_sees_a_scheduler_or_backend(tmp_path):
    rc, out = run(tree(tmp_path, {"src/frontends/grpc/g.cc":
                                  '#include "server/server.h"\n#include "scheduling/scheduler.h"\n'
                                  '#include "backends/backend.h"\n'}))
    assert rc == 1, out
    assert "src/frontends/grpc must not include src/scheduling: frontends see server" in out
    assert "src/frontends/grpc must not include src/backends: frontends never see a backend" in out
    assert "check_layers: FAIL 2 include(s)" in out


def test_exceptions_and_only(tmp_path):
    # frontends/sagemaker -> frontends/http is a listed exception; grpc -> http is not.
    rc, out = run(tree(tmp_path, {"src/frontends/grpc/g.cc": '#include "frontends/http/http.h"\n',
                                  "tools/perf/bad.cc": '#include "common/status.h"\n'}))
    assert rc == 1, out
    assert "src/frontends/sagemaker" not in out
    assert "src/frontends/grpc (level 8) must not include src/frontends/http (level 8)" in out
    assert "tools/perf may include only grpc_proto" in out


def test_confined_third_party_headers(tmp_path):
    rc, out = run(tree(tmp_path, {"src/server/x.cc": '#include "onnxruntime_cxx_api.h"\n',
                                  "src/scheduling/y.cc": "#include <torch/script.h>\n"}))
    assert rc == 1, out
    assert "src/server must not include it: ONNX Runtime headers appear only in src/backends/onnxruntime" in out
    assert "src/scheduling must not include it: LibTorch stays inside its backend module" in out


def test_unplaced_folder_fails(tmp_path):
    rc, out = run(tree(tmp_path, {"src/cache/cache.h": '#include "common/status.h"\n'}))
    assert rc == 1, out
    assert "folder src/cache is not in the layer table" in out


def test_real_tree_passes():
    rc, out = run(ROOT)
    assert rc == 0, out
