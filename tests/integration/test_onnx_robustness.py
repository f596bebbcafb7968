"""A model can fail; the server cannot (issue 16, Triton server#3786).

One repository holds a good model beside models whose files are unusual or broken: inputs or
outputs that are not plain tensors (an ONNX sequence input, sklearn's ZipMap output — a sequence
of maps —, a map input, an optional input), an unknown operator, an unknown opset version and
domain, a truncated file, random bytes, and configs whose data type or dims contradict the file.
The server starts, the good model serves, and each bad model is UNAVAILABLE in the repository
index with a reason naming its problem. Triton's onnxruntime backend likewise refuses
non-tensor inputs and outputs at load (ModelState::AutoCompleteConfig / ValidateInputs)."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from v2client import infer, make_input, parse_response

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import onnx_odd_models as odd  # noqa: E402

ADD_CONFIG = ('name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
              'input [ {{ name: "X" data_type: {dtype} dims: [ {dims} ] }} ]\n'
              'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]\n')

def external_data_model(location):
    """Y = concat(X, W), UINT8, where W's 8 bytes are external data at `location`: a model that
    would hand a client the bytes of any file it could name. ONNX Runtime keeps external data
    inside the model's folder (absolute paths, `..` and symlinks out are refused at load)."""
    w = onnx.helper.make_tensor("W", onnx.TensorProto.UINT8, [8], vals=bytes(8), raw=True)
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "8")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Concat", ["X", "W"], ["Y"], axis=0)], "leak",
        [onnx.helper.make_tensor_value_info("X", onnx.TensorProto.UINT8, [1])],
        [onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.UINT8, [9])], initializer=[w])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


# model name -> (what goes into model.onnx, config.pbtxt or None, words the reason must hold)
CASES = {
    "external_absolute": (lambda: external_data_model("/etc/passwd"), None,
                          ["External data path", "Absolute path not allowed"]),
    "external_parent": (lambda: external_data_model("../../../../../../../../etc/passwd"), None,
                        ["External data path escapes model directory"]),
    "external_symlink": (lambda: external_data_model("link"), None,  # link -> /etc/passwd
                         ["External data path escapes model directory"]),
    "sequence_input": (odd.sequence_input_model, None,
                       ["input 'X' is a sequence type", "tensor inputs only"]),
    "zipmap_output": (odd.zipmap_model, None,
                      ["output 'Z' is a sequence type", "tensor outputs only"]),
    "map_input": (odd.map_input_model, None, ["input 'X' is a map type", "tensor inputs only"]),
    "optional_input": (odd.optional_input_model, None,
                       ["input 'X' is an optional type", "tensor inputs only"]),
    "unknown_operator": (odd.unknown_operator_model, None, ["Frobnicate"]),
    "unknown_opset": (odd.unknown_opset_model, None, ["opset", "99"]),
    "unknown_domain": (odd.unknown_domain_model, None, ["com.example.nowhere"]),
    "truncated": (lambda: odd.conv_relu_model().SerializeToString()[:250], None,
                  ["truncated/1/model.onnx", "Protobuf parsing failed"]),
    "random_bytes": (lambda: np.random.default_rng(7).bytes(3000), None,
                     ["random_bytes/1/model.onnx", "Protobuf parsing failed"]),
    "config_wrong_dtype": (odd.add_model, ADD_CONFIG.format(
        name="config_wrong_dtype", dtype="TYPE_INT32", dims="4"),
        ["input 'X'", "FP32 in the model file", "TYPE_INT32 in config.pbtxt"]),
    "config_wrong_dims": (odd.add_model, ADD_CONFIG.format(
        name="config_wrong_dims", dtype="TYPE_FP32", dims="2, 2"),
        ["input 'X'", "[4] in the model file", "[2,2]"]),
}


def write_model(repo, name, content, config=None):
    (repo / name / "1").mkdir(parents=True)
    data = content() if callable(content) else content
    if isinstance(data, onnx.ModelProto):
        data = data.SerializeToString()
    (repo / name / "1" / "model.onnx").write_bytes(data)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)


def write_folder_model(repo, name):
    """model.onnx as a folder: <folder>/model.onnx with its weights in an external data file
    beside it, as models over ONNX's 2 GB limit ship and Triton's onnxruntime backend loads
    them. No config.pbtxt: auto-complete reads the same file."""
    folder = repo / name / "1" / "model.onnx"
    folder.mkdir(parents=True)
    onnx.save_model(odd.conv_relu_model(), str(folder / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (folder / "weights.bin").stat().st_size > 0


@pytest.fixture(scope="module")
def odd_server(tmp_path_factory, logs_dir):
    from conftest import start_server
    repo = tmp_path_factory.mktemp("odd_repo")
    write_model(repo, "good", odd.conv_relu_model)  # no config.pbtxt: auto-complete
    write_folder_model(repo, "folder_model")
    for name, (content, config, _) in CASES.items():
        write_model(repo, name, content, config)
    (repo / "external_symlink" / "1" / "link").symlink_to("/etc/passwd")
    srv = start_server(repo, ["--exit-on-error=false", "--strict-readiness=false",
                              "--model-control-mode=explicit", "--load-model=*"], logs_dir)
    srv.wait_until(lambda: srv.get("/v2/models/good/ready").status_code == 200, 30, "good")
    yield srv
    assert srv.stop() == 0


def conv_relu_numpy(x):
    m = odd.conv_relu_model()
    w, b = (onnx.numpy_helper.to_array(t) for t in m.graph.initializer)
    n, _, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return np.maximum(out + b.reshape(1, -1, 1, 1), 0).astype(np.float32)


def test_good_model_serves_beside_broken_ones(odd_server):
    x = np.random.default_rng(0).standard_normal((2, 2, 5, 5)).astype(np.float32)
    r = infer(odd_server, "good", [make_input("X", x, "FP32", binary=True)])
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(parse_response(r)[1]["Y"], conv_relu_numpy(x), rtol=1e-5, atol=1e-5)
    assert odd_server.get("/v2/health/live").status_code == 200


def test_model_file_that_is_a_folder_holds_model_onnx_and_its_external_data(odd_server):
    assert odd_server.get("/v2/models/folder_model/ready").status_code == 200, \
        odd_server.post("/v2/repository/index", json={}).text
    x = np.random.default_rng(1).standard_normal((3, 2, 5, 5)).astype(np.float32)
    r = infer(odd_server, "folder_model", [make_input("X", x, "FP32", binary=True)])
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(parse_response(r)[1]["Y"], conv_relu_numpy(x), rtol=1e-5, atol=1e-5)
    config = odd_server.get("/v2/models/folder_model/config").json()
    assert [i["name"] for i in config["input"]] == ["X"], config  # auto-completed from the file


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_model_fails_its_own_load_with_a_reason(odd_server, name):
    entries = {e["name"]: e for e in odd_server.post("/v2/repository/index", json={}).json()}
    assert entries["good"]["state"] == "READY"
    entry = entries[name]
    assert entry["state"] == "UNAVAILABLE", entry
    for words in CASES[name][2]:
        assert words in entry.get("reason", ""), (words, entry)
    r = infer(odd_server, name, [make_input("X", np.ones(4, np.float32), "FP32")])
    assert r.status_code in (400, 404, 503), r.text


def test_reload_of_a_broken_model_fails_again_and_the_server_stays(odd_server):
    """An explicit load request for a model of each kind answers an error and crashes nothing."""
    for name in CASES:
        r = odd_server.post(f"/v2/repository/models/{name}/load", json={})
        assert r.status_code == 400, (name, r.status_code, r.text)
    assert odd_server.get("/v2/models/good/ready").status_code == 200
