"""Health, server metadata, model metadata, readiness and configuration (KServe v2 + Triton)."""

from pathlib import Path

import numpy as np
import pytest

from v2client import (assert_4xx, assert_error, assert_unavailable, infer, make_input,
                      parse_response)

REQUIRED_EXTENSIONS = {"binary_tensor_data", "classification", "model_repository", "statistics"}
# Triton's list (core's InferenceServer constructor), in its order; cuda_shared_memory is listed
# by a build with CUDA (as Triton built with GPU support lists it, GPU or not), not without.
TRITON_EXTENSIONS = ["classification", "sequence", "model_repository",
                     "model_repository(unload_dependents)", "schedule_policy", "model_configuration",
                     "system_shared_memory", "cuda_shared_memory", "binary_tensor_data",
                     "parameters", "statistics", "trace", "logging"]


def test_server_live(server):
    r = server.get("/v2/health/live")
    assert r.status_code == 200


def test_server_ready(server):
    r = server.get("/v2/health/ready")
    assert r.status_code == 200


def test_server_metadata(server):
    r = server.get("/v2")
    assert r.status_code == 200
    md = r.json()
    assert md["name"] == "triton"  # tritonserver's default --id: tritonclient's examples check it
    assert isinstance(md["version"], str) and md["version"]
    assert isinstance(md["extensions"], list)
    assert REQUIRED_EXTENSIONS <= set(md["extensions"]), md["extensions"]
    # Issue 26: 'sequence' and 'parameters' were missing, which inferd implements.
    # The whole log: the start-up line that says so is long gone from log()'s tail on the
    # shared server by the time this test runs.
    start_log = Path(server.log_path).read_text(errors="replace")
    expected = [e for e in TRITON_EXTENSIONS
                if e != "cuda_shared_memory" or "built without CUDA" not in start_log]
    assert md["extensions"] == expected


def _tensor(md_list, name):
    for t in md_list:
        if t["name"] == name:
            return t
    raise AssertionError(f"no tensor {name} in {md_list}")


@pytest.mark.parametrize("path", ["/v2/models/simple", "/v2/models/simple/versions/1"])
def test_model_metadata_simple(server, path):
    r = server.get(path)
    assert r.status_code == 200, r.text
    md = r.json()
    assert md["name"] == "simple"
    assert md["versions"] == ["1"]
    assert md["platform"] == "onnxruntime_onnx"
    assert [t["name"] for t in md["inputs"]] == ["INPUT0", "INPUT1"]
    assert [t["name"] for t in md["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    for t in md["inputs"] + md["outputs"]:
        assert t["datatype"] == "INT32"
        assert t["shape"] == [-1, 16]  # batch dimension first, variable


def test_model_metadata_nobatch(server):
    md = server.get("/v2/models/add_sub_nobatch").json()
    assert md["name"] == "add_sub_nobatch"
    for name in ("INPUT0", "INPUT1"):
        t = _tensor(md["inputs"], name)
        assert t == {"name": name, "datatype": "FP32", "shape": [4]}
    for name in ("OUTPUT0", "OUTPUT1"):
        assert _tensor(md["outputs"], name)["shape"] == [4]


def test_model_metadata_identity_backend(server):
    md = server.get("/v2/models/identity_fp32").json()
    assert md["name"] == "identity_fp32"
    # Triton reports the platform, or the backend name when the config has no platform.
    assert md["platform"] == "identity"
    assert _tensor(md["inputs"], "INPUT0") == {"name": "INPUT0", "datatype": "FP32",
                                               "shape": [-1, -1]}
    assert _tensor(md["outputs"], "OUTPUT0") == {"name": "OUTPUT0", "datatype": "FP32",
                                                 "shape": [-1, -1]}


def test_model_metadata_bytes_datatype(server):
    md = server.get("/v2/models/onnx_identity_bytes").json()
    # TYPE_STRING in the config is the protocol's BYTES.
    assert _tensor(md["inputs"], "INPUT0")["datatype"] == "BYTES"
    assert _tensor(md["outputs"], "OUTPUT0")["datatype"] == "BYTES"


def test_model_metadata_unknown_model(server):
    r = server.get("/v2/models/no_such_model")
    assert_error(r, 404, "no_such_model")


def test_model_metadata_unknown_version(server):
    r = server.get("/v2/models/simple/versions/7")
    assert_error(r, 404, "simple")


def test_model_ready(server):
    assert server.get("/v2/models/simple/ready").status_code == 200
    assert server.get("/v2/models/simple/versions/1/ready").status_code == 200
    assert_4xx(server.get("/v2/models/simple/versions/2/ready"))
    assert_4xx(server.get("/v2/models/no_such_model/ready"))


def _dims(io):
    return [int(d) for d in io["dims"]]


def test_model_config_simple(server):
    r = server.get("/v2/models/simple/config")
    assert r.status_code == 200, r.text
    cfg = r.json()
    assert cfg["name"] == "simple"
    assert cfg["platform"] == "onnxruntime_onnx"
    assert int(cfg["max_batch_size"]) == 8
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
    for io in cfg["input"] + cfg["output"]:
        assert io["data_type"] == "TYPE_INT32"
        assert _dims(io) == [16]


def test_model_config_versioned_path(server):
    r = server.get("/v2/models/simple/versions/1/config")
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "simple"


def test_model_config_unknown_model(server):
    assert_error(server.get("/v2/models/no_such_model/config"), 404, "no_such_model")


def test_autocomplete_config(server):
    """No config.pbtxt: every input/output has a variable first dim => max_batch_size 4."""
    r = server.get("/v2/models/add_sub_autocomplete/config")
    assert r.status_code == 200, r.text
    cfg = r.json()
    assert cfg["name"] == "add_sub_autocomplete"
    assert int(cfg["max_batch_size"]) == 4
    assert cfg.get("platform") == "onnxruntime_onnx" or cfg.get("backend") == "onnxruntime"
    assert sorted(i["name"] for i in cfg["input"]) == ["INPUT0", "INPUT1"]
    assert sorted(o["name"] for o in cfg["output"]) == ["OUTPUT0", "OUTPUT1"]
    for io in cfg["input"] + cfg["output"]:
        assert io["data_type"] == "TYPE_FP32"
        assert _dims(io) == [4]


def test_autocomplete_metadata_and_infer(server):
    md = server.get("/v2/models/add_sub_autocomplete").json()
    for t in md["inputs"] + md["outputs"]:
        assert t["datatype"] == "FP32" and t["shape"] == [-1, 4]
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    r = infer(server, "add_sub_autocomplete",
              [make_input("INPUT0", a, "FP32"), make_input("INPUT1", b, "FP32")])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


# ---- versions ---------------------------------------------------------------------------


def _add_const(server, model, version=None):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = infer(server, model, [make_input("INPUT0", x, "FP32")], version=version)
    if r.status_code != 200:
        return r, None
    hdr, out = parse_response(r)
    diff = out["OUTPUT0"] - x
    assert np.all(diff == diff.flat[0]), diff
    return r, (hdr, float(diff.flat[0]))


def test_versions_default_policy_latest(server):
    """Default version policy is latest { num_versions: 1 }: only version 2 is served."""
    md = server.get("/v2/models/two_versions").json()
    assert md["versions"] == ["2"]
    assert server.get("/v2/models/two_versions/versions/2/ready").status_code == 200
    assert_4xx(server.get("/v2/models/two_versions/versions/1/ready"))
    r, (hdr, added) = _add_const(server, "two_versions")
    assert added == 2.0 and hdr["model_version"] == "2"
    r, _ = _add_const(server, "two_versions", version=1)
    assert_unavailable(r)


def test_versions_policy_all(server):
    md = server.get("/v2/models/two_versions_all").json()
    assert sorted(md["versions"]) == ["1", "2"]
    for v in (1, 2):
        assert server.get(f"/v2/models/two_versions_all/versions/{v}/ready").status_code == 200
        r, (hdr, added) = _add_const(server, "two_versions_all", version=v)
        assert added == float(v)
        assert hdr["model_version"] == str(v)
    # No version in the URL: the highest ready version.
    r, (hdr, added) = _add_const(server, "two_versions_all")
    assert added == 2.0 and hdr["model_version"] == "2"


def test_versions_policy_specific(server):
    md = server.get("/v2/models/two_versions_specific").json()
    assert md["versions"] == ["1"]
    assert server.get("/v2/models/two_versions_specific/versions/1/ready").status_code == 200
    assert_4xx(server.get("/v2/models/two_versions_specific/versions/2/ready"))
    r, (hdr, added) = _add_const(server, "two_versions_specific")
    assert added == 1.0 and hdr["model_version"] == "1"
