"""The model repository extension's load and unload parameters, as Triton defines them:
"file:<version>/<path>" (a model folder sent in the load request: base64 over HTTP,
bytes_param over gRPC; it overrides the repository's copy, and a later load without files goes
back to it), "unload_dependents" (an ensemble's unload takes the models loaded only for it),
and the flag --id (--model-namespacing: test_model_namespacing.py)."""

import base64
import json
import textwrap

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from v2client import infer, make_input, parse_response

# ---- models made here ----------------------------------------------------------------------


def affine_onnx(scale, bias):
    """Y = X * scale + bias over FP32 [batch, 4], as ONNX bytes."""
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", 4])
    s = helper.make_tensor("s", TensorProto.FLOAT, [1], [scale])
    b = helper.make_tensor("b", TensorProto.FLOAT, [1], [bias])
    graph = helper.make_graph([helper.make_node("Mul", ["INPUT0", "s"], ["t"]),
                               helper.make_node("Add", ["t", "b"], ["OUTPUT0"])],
                              "affine", [x], [y], [s, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def config_json(name):
    return json.dumps({
        "name": name, "backend": "onnxruntime", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    })


def run_direct(onnx_bytes, x):
    """The graph evaluated with numpy from the model bytes themselves (Mul by an initializer,
    Add another): the expected answer computed without the server. (Python's onnxruntime is
    not installed here, and onnx 1.12 has no reference evaluator.)"""
    model = onnx.load_from_string(onnx_bytes)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {"INPUT0": x}
    for node in model.graph.node:
        a, b = (values.get(n, init.get(n)) for n in node.input)
        values[node.output[0]] = {"Mul": np.multiply, "Add": np.add}[node.op_type](a, b)
    return values["OUTPUT0"].astype(np.float32)


X = np.array([[0.5, -1.0, 2.0, 3.25], [1.0, 2.0, -4.0, 0.0]], dtype=np.float32)
REQUEST_MODEL = affine_onnx(3.0, 1.0)   # sent in the load request
REPO_MODEL = affine_onnx(-1.0, -5.0)    # the repository's copy of the same name


def served(srv, name):
    r = infer(srv, name, [make_input("INPUT0", X, "FP32")])
    assert r.status_code == 200, r.text
    return parse_response(r)[1]["OUTPUT0"]


def index_states(srv):
    r = srv.post("/v2/repository/index", json={})
    assert r.status_code == 200, r.text
    return {(e["name"], e.get("version", "")): (e.get("state", ""), e.get("reason", ""))
            for e in r.json()}


def b64(data):
    return base64.b64encode(data).decode()


@pytest.fixture
def explicit_server(make_repo, server_factory):
    repo = make_repo({})
    (repo / "affine" / "1").mkdir(parents=True)
    (repo / "affine" / "1" / "model.onnx").write_bytes(REPO_MODEL)
    (repo / "affine" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=affine"])
    srv.wait_until(lambda: loaded(srv, "affine"), 30, "affine ready")
    return srv


# ---- file: parameters ------------------------------------------------------------------------


def test_http_load_from_request_files_overrides_the_repository(explicit_server):
    srv = explicit_server
    np.testing.assert_allclose(served(srv, "affine"), run_direct(REPO_MODEL, X), rtol=1e-6)

    # The request's folder replaces the repository's copy of "affine".
    r = srv.post("/v2/repository/models/affine/load", json={"parameters": {
        "config": config_json("affine"), "file:1/model.onnx": b64(REQUEST_MODEL)}})
    assert r.status_code == 200, r.text
    out = served(srv, "affine")
    np.testing.assert_allclose(out, run_direct(REQUEST_MODEL, X), rtol=1e-6)
    np.testing.assert_allclose(out, X * 3 + 1, rtol=1e-6)
    assert index_states(srv)[("affine", "1")][0] == "READY"

    # A model no repository holds, loaded purely from the request, version 2 only.
    r = srv.post("/v2/repository/models/fresh/load", json={"parameters": {
        "config": config_json("fresh"), "file:2/model.onnx": b64(REQUEST_MODEL)}})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(served(srv, "fresh"), run_direct(REQUEST_MODEL, X), rtol=1e-6)
    assert srv.get("/v2/models/fresh/versions/2/ready").status_code == 200
    assert srv.get("/v2/models/fresh/versions/1/ready").status_code != 200
    assert index_states(srv)[("fresh", "2")][0] == "READY"

    # A later load without files goes back to the repository's copy.
    r = srv.post("/v2/repository/models/affine/load", json={})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(served(srv, "affine"), run_direct(REPO_MODEL, X), rtol=1e-6)


@pytest.mark.parametrize("params,named", [
    ({"file:1/model.onnx": b64(REQUEST_MODEL)}, ["'file:1/model.onnx'", "'config'"]),
    ({"config": config_json("affine"), "file:1/model.onnx": "not base64 !!"},
     ["'file:1/model.onnx'", "base64"]),
    ({"config": config_json("affine"), "file:1/model.onnx": 7}, ["'file:1/model.onnx'"]),
    ({"config": config_json("affine"), "file:../../etc/model.onnx": b64(b"x")},
     ["'file:../../etc/model.onnx'", ".."]),
    ({"config": config_json("affine"), "file:1/../../x": b64(b"x")}, ["'file:1/../../x'"]),
    ({"config": config_json("affine"), "file:/tmp/model.onnx": b64(b"x")},
     ["'file:/tmp/model.onnx'", "relative"]),
    ({"config": config_json("affine"), "file:": b64(b"x")}, ["'file:'"]),
    # A name no file system can hold is the client's mistake (400), not the server's (500).
    ({"config": config_json("affine"), "file:1/" + "n" * 300: b64(b"x")},
     ["'file:1/" + "n" * 300 + "'", "at most 255 bytes"]),
])
def test_http_bad_file_parameters_are_400_naming_the_parameter(explicit_server, params, named):
    srv = explicit_server
    r = srv.post("/v2/repository/models/affine/load", json={"parameters": params})
    assert r.status_code == 400, (r.status_code, r.text)
    for text in named:
        assert text in r.json()["error"], r.json()
    # Nothing changed: the repository's copy still serves.
    np.testing.assert_allclose(served(srv, "affine"), run_direct(REPO_MODEL, X), rtol=1e-6)


def test_grpc_load_from_request_files(explicit_server, pb):
    m, stubs = pb
    srv = explicit_server
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    s = stubs.GRPCInferenceServiceStub(channel)
    req = m.RepositoryModelLoadRequest(model_name="affine")
    req.parameters["config"].string_param = config_json("affine")
    req.parameters["file:1/model.onnx"].bytes_param = REQUEST_MODEL
    s.RepositoryModelLoad(req)
    infer_req = m.ModelInferRequest(model_name="affine")
    infer_req.inputs.add(name="INPUT0", datatype="FP32", shape=list(X.shape))
    infer_req.raw_input_contents.append(X.tobytes())
    resp = s.ModelInfer(infer_req)
    out = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(X.shape)
    np.testing.assert_allclose(out, run_direct(REQUEST_MODEL, X), rtol=1e-6)

    # The file's content must be bytes_param; files need 'config'; paths stay in the folder.
    bad = m.RepositoryModelLoadRequest(model_name="affine")
    bad.parameters["config"].string_param = config_json("affine")
    bad.parameters["file:1/model.onnx"].string_param = b64(REQUEST_MODEL)
    no_config = m.RepositoryModelLoadRequest(model_name="affine")
    no_config.parameters["file:1/model.onnx"].bytes_param = REQUEST_MODEL
    escape = m.RepositoryModelLoadRequest(model_name="affine")
    escape.parameters["config"].string_param = config_json("affine")
    escape.parameters["file:../model.onnx"].bytes_param = REQUEST_MODEL
    for request, text in ((bad, "bytes_param"), (no_config, "'config'"), (escape, "..")):
        with pytest.raises(grpc.RpcError) as e:
            s.RepositoryModelLoad(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert "'file:" in e.value.details() and text in e.value.details(), e.value.details()
    channel.close()


# ---- unload_dependents -----------------------------------------------------------------------


def ensemble_config(name, step_model):
    return textwrap.dedent(f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "A" data_type: TYPE_INT32 dims: [ 16 ] }},
                {{ name: "B" data_type: TYPE_INT32 dims: [ 16 ] }} ]
        output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] }} ]
        ensemble_scheduling {{ step [ {{
          model_name: "{step_model}" model_version: -1
          input_map {{ key: "INPUT0" value: "A" }} input_map {{ key: "INPUT1" value: "B" }}
          output_map {{ key: "OUTPUT0" value: "SUM" }} }} ] }}
        """)


@pytest.fixture
def ensemble_server(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    for name in ("chain", "chain2"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ensemble_config(name, "simple"))
    return server_factory(repo, ["--model-control-mode=explicit"])


def loaded(srv, name):
    return srv.get(f"/v2/models/{name}/ready").status_code == 200


def load(srv, name):
    r = srv.post(f"/v2/repository/models/{name}/load", json={})
    assert r.status_code == 200, r.text


def unload(srv, name, **params):
    r = srv.post(f"/v2/repository/models/{name}/unload", json={"parameters": params})
    assert r.status_code == 200, r.text


def test_unload_dependents_over_http(ensemble_server):
    srv = ensemble_server
    load(srv, "chain")  # loads "simple" because chain runs it
    assert loaded(srv, "chain") and loaded(srv, "simple")

    # Without the parameter (or with it false) only the ensemble goes.
    unload(srv, "chain")
    assert not loaded(srv, "chain") and loaded(srv, "simple")
    load(srv, "chain")
    unload(srv, "chain", unload_dependents=False)
    assert not loaded(srv, "chain") and loaded(srv, "simple")

    # With it, the step model loaded for the ensemble goes too, shown in the index.
    unload(srv, "simple")
    load(srv, "chain")
    assert index_states(srv)[("simple", "1")][0] == "READY"
    unload(srv, "chain", unload_dependents=True)
    assert not loaded(srv, "chain") and not loaded(srv, "simple")
    assert index_states(srv)[("simple", "1")] == ("UNAVAILABLE", "unloaded")

    # Still run by another loaded ensemble: it stays until that one leaves too.
    load(srv, "chain")
    load(srv, "chain2")
    unload(srv, "chain", unload_dependents=True)
    assert loaded(srv, "simple") and loaded(srv, "chain2")
    unload(srv, "chain2", unload_dependents=True)
    assert not loaded(srv, "simple")

    # Loaded by name itself: it stays (Triton unloads only models loaded as dependencies).
    load(srv, "simple")
    load(srv, "chain")
    unload(srv, "chain", unload_dependents=True)
    assert loaded(srv, "simple") and not loaded(srv, "chain")

    r = srv.post("/v2/repository/models/simple/unload",
                 json={"parameters": {"unload_dependents": "yes"}})
    assert r.status_code == 400 and "'unload_dependents'" in r.json()["error"], r.text
    assert loaded(srv, "simple")


def test_unload_dependents_over_grpc(ensemble_server, pb):
    m, stubs = pb
    srv = ensemble_server
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    s = stubs.GRPCInferenceServiceStub(channel)

    def unload_req(name, flag=None):
        req = m.RepositoryModelUnloadRequest(model_name=name)
        if flag is not None:
            req.parameters["unload_dependents"].bool_param = flag
        return req

    s.RepositoryModelLoad(m.RepositoryModelLoadRequest(model_name="chain"))
    s.RepositoryModelUnload(unload_req("chain"))
    assert loaded(srv, "simple") and not loaded(srv, "chain")
    s.RepositoryModelUnload(unload_req("simple"))
    s.RepositoryModelLoad(m.RepositoryModelLoadRequest(model_name="chain"))
    s.RepositoryModelUnload(unload_req("chain", True))
    assert not loaded(srv, "simple") and not loaded(srv, "chain")
    bad = m.RepositoryModelUnloadRequest(model_name="chain")
    bad.parameters["unload_dependents"].string_param = "true"
    with pytest.raises(grpc.RpcError) as e:
        s.RepositoryModelUnload(bad)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'unload_dependents'" in e.value.details()
    channel.close()


# ---- flags -----------------------------------------------------------------------------------


def test_id_names_the_server_in_metadata(make_repo, server_factory, pb):
    m, stubs = pb
    srv = server_factory(make_repo({"simple": "simple"}), ["--id=edge-7"])
    md = srv.get("/v2").json()
    assert md["name"] == "edge-7"
    assert "model_repository(unload_dependents)" in md["extensions"]
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    s = stubs.GRPCInferenceServiceStub(channel)
    assert s.ServerMetadata(m.ServerMetadataRequest()).name == "edge-7"
    channel.close()
