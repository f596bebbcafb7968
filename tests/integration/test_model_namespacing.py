"""--model-namespacing, as Triton defines it: with it, a model name that several
--model-repository folders hold is one model per repository (its namespace); an ensemble's
steps run the copy in the ensemble's own repository; a request by the shared name is refused
as ambiguous with Triton's message; the repository index lists each copy under its name.
Without it (tritonserver's default) the shared name is unavailable, with Triton's reason.

Two repositories each hold a model `m` (an ONNX affine map, different in each) and an
ensemble that runs `m`; the answers are checked against the graph evaluated with numpy."""

import textwrap

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from v2client import infer, make_input, parse_response

X = np.array([[0.5, -1.0, 2.0, 3.25], [1.0, 2.0, -4.0, 0.0]], dtype=np.float32)


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


def run_direct(onnx_bytes, x):
    """The graph evaluated with numpy from the model bytes (Mul, then Add, by initializers)."""
    model = onnx.load_from_string(onnx_bytes)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {"INPUT0": x}
    for node in model.graph.node:
        a, b = (values.get(n, init.get(n)) for n in node.input)
        values[node.output[0]] = {"Mul": np.multiply, "Add": np.add}[node.op_type](a, b)
    return values["OUTPUT0"].astype(np.float32)


M_CONFIG = """
name: "m"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def ensemble_config(name):
    return textwrap.dedent(f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        ensemble_scheduling {{ step [ {{
          model_name: "m" model_version: -1
          input_map {{ key: "INPUT0" value: "X" }}
          output_map {{ key: "OUTPUT0" value: "Y" }} }} ] }}
        """)


MODELS = {"a": affine_onnx(2.0, 1.0), "b": affine_onnx(-3.0, 0.5)}


@pytest.fixture
def repos(tmp_path):
    """Two repositories: repo_a holds m (2x+1) and ens_a; repo_b holds m (-3x+0.5) and ens_b."""
    out = []
    for tag, onnx_bytes in MODELS.items():
        root = tmp_path / f"repo_{tag}"
        (root / "m" / "1").mkdir(parents=True)
        (root / "m" / "1" / "model.onnx").write_bytes(onnx_bytes)
        (root / "m" / "config.pbtxt").write_text(M_CONFIG)
        ens = f"ens_{tag}"
        (root / ens / "1").mkdir(parents=True)
        (root / ens / "config.pbtxt").write_text(ensemble_config(ens))
        out.append(root)
    return out


def run(srv, name, input_name):
    return infer(srv, name, [make_input(input_name, X, "FP32")])


def ensemble_output(srv, name):
    r = run(srv, name, "X")
    assert r.status_code == 200, r.text
    return parse_response(r)[1]["Y"]


def index(srv):
    r = srv.post("/v2/repository/index", json={})
    assert r.status_code == 200, r.text
    return r.json()


AMBIGUOUS = ("There are 2 identifiers of model 'm' in global map, model namespace must be "
             "provided to resolve ambiguity.")


def test_each_ensemble_runs_its_own_repositorys_m(repos, server_factory, pb):
    srv = server_factory(repos, ["--model-namespacing=true"])
    want_a, want_b = run_direct(MODELS["a"], X), run_direct(MODELS["b"], X)
    assert not np.allclose(want_a, want_b)
    np.testing.assert_allclose(ensemble_output(srv, "ens_a"), want_a, rtol=1e-6)
    np.testing.assert_allclose(ensemble_output(srv, "ens_b"), want_b, rtol=1e-6)

    # A request by the shared name names no one model: Triton's error, a client error.
    r = run(srv, "m", "INPUT0")
    assert r.status_code == 400, r.text
    assert r.json()["error"] == AMBIGUOUS
    assert srv.get("/v2/models/m").status_code == 400
    assert srv.get("/v2/models/m/ready").status_code != 200
    m, stubs = pb
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    s = stubs.GRPCInferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        s.ModelMetadata(m.ModelMetadataRequest(name="m"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == AMBIGUOUS
    channel.close()

    # The index lists both copies under their own name, each READY.
    entries = [e for e in index(srv) if e["name"] == "m"]
    assert [(e.get("version"), e.get("state")) for e in entries] == [("1", "READY")] * 2, entries
    # Metrics tell the copies apart by Triton's "namespace" label (the repository); no series
    # is written twice.
    import requests
    text = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text
    series = [ln.rsplit(" ", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(series) == len(set(series)), "a metric series is written twice"
    for root in repos:
        want = f'nv_inference_request_success{{namespace="{root}",model="m",version="1"}} 1'
        assert want in text, [ln for ln in text.splitlines() if "request_success" in ln]
    # The ensembles still report the step they run as "m".
    cfg = srv.get("/v2/models/ens_a/config").json()
    assert cfg["ensemble_scheduling"]["step"][0]["model_name"] == "m"
    assert srv.get("/v2/models/ens_b/ready").status_code == 200
    assert srv.stop() == 0


def test_an_ensemble_outside_both_namespaces_finds_m_ambiguous(repos, tmp_path, server_factory):
    # repo_c holds only an ensemble that runs m: neither copy is in its own repository.
    root = tmp_path / "repo_c"
    (root / "ens_c" / "1").mkdir(parents=True)
    (root / "ens_c" / "config.pbtxt").write_text(ensemble_config("ens_c"))
    srv = server_factory(repos + [root], ["--model-namespacing=true",
                                          "--model-control-mode=explicit"])
    r = srv.post("/v2/repository/models/ens_c/load", json={})
    assert r.status_code == 400, r.text
    assert "ensemble 'ens_c' step 0 (model 'm')" in r.json()["error"], r.text
    assert AMBIGUOUS in r.json()["error"], r.text
    # With one copy loaded the others' ensembles still run their own.
    r = srv.post("/v2/repository/models/ens_a/load", json={})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(ensemble_output(srv, "ens_a"), run_direct(MODELS["a"], X), rtol=1e-6)
    assert srv.stop() == 0


def test_on_demand_loads_resolve_in_the_namespace(repos, server_factory):
    srv = server_factory(repos, ["--model-namespacing=true", "--model-control-mode=on-demand"])
    assert run(srv, "m", "INPUT0").json()["error"] == AMBIGUOUS
    np.testing.assert_allclose(ensemble_output(srv, "ens_b"), run_direct(MODELS["b"], X), rtol=1e-6)
    np.testing.assert_allclose(ensemble_output(srv, "ens_a"), run_direct(MODELS["a"], X), rtol=1e-6)
    assert run(srv, "m", "INPUT0").json()["error"] == AMBIGUOUS
    assert srv.stop() == 0


def test_explicit_loads_resolve_in_the_namespace(repos, server_factory):
    srv = server_factory(repos, ["--model-namespacing=true", "--model-control-mode=explicit"])
    r = srv.post("/v2/repository/models/ens_b/load", json={})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(ensemble_output(srv, "ens_b"), run_direct(MODELS["b"], X), rtol=1e-6)
    # Only repo_b's m is loaded: the name is unique among the loaded models and resolves to it.
    r = run(srv, "m", "INPUT0")
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(parse_response(r)[1]["OUTPUT0"], run_direct(MODELS["b"], X),
                               rtol=1e-6)
    r = srv.post("/v2/repository/models/ens_a/load", json={})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(ensemble_output(srv, "ens_a"), run_direct(MODELS["a"], X), rtol=1e-6)
    assert run(srv, "m", "INPUT0").json()["error"] == AMBIGUOUS
    # A load by the shared name loads each repository's copy (Triton), an unload unloads both.
    r = srv.post("/v2/repository/models/m/load", json={})
    assert r.status_code == 200, r.text
    r = srv.post("/v2/repository/models/m/unload", json={})
    assert r.status_code == 200, r.text
    states = [e.get("state") for e in index(srv) if e["name"] == "m"]
    assert states == ["UNAVAILABLE", "UNAVAILABLE"], states
    assert srv.get("/v2/models/ens_a/ready").status_code != 200
    assert srv.stop() == 0


def test_without_namespacing_the_shared_name_is_unavailable(repos, server_factory):
    # --model-namespacing=false, tritonserver's default: the start fails naming the duplicate
    # (a model that cannot load, with --exit-on-error=true)...
    srv = server_factory(repos, [], wait_live=False)
    assert srv.proc.wait(timeout=30) == 1
    assert "model appears in two or more repositories: 'm'" in srv.log()
    # ... and, with --exit-on-error=false, the index shows it UNAVAILABLE with Triton's reason.
    srv = server_factory(repos, ["--model-namespacing=false", "--exit-on-error=false"])
    entries = [e for e in index(srv) if e["name"] == "m"]
    assert len(entries) == 1, entries
    assert entries[0]["state"] == "UNAVAILABLE"
    # Triton's reason (MODEL_READY_REASON_DUPLICATE), then the two repositories.
    assert entries[0]["reason"].startswith("model appears in two or more repositories")
    assert str(repos[0]) in entries[0]["reason"] and str(repos[1]) in entries[0]["reason"]
    r = run(srv, "m", "INPUT0")
    assert r.status_code in (400, 404, 503), r.text
    # The ensembles cannot run a model that is not available.
    assert run(srv, "ens_a", "X").status_code != 200
    assert srv.get("/v2/models/ens_b/ready").status_code != 200
    srv.stop()


def test_poll_a_second_copy_appearing_rebinds_the_ensembles(repos, server_factory):
    # repo_b starts without its m: both ensembles run repo_a's, the only one.
    repo_a, repo_b = repos
    moved = repo_b.parent / "m_of_b"
    (repo_b / "m").rename(moved)
    srv = server_factory(repos, ["--model-namespacing=true", "--model-control-mode=poll",
                                 "--repository-poll-secs=1"])
    want_a, want_b = run_direct(MODELS["a"], X), run_direct(MODELS["b"], X)
    np.testing.assert_allclose(ensemble_output(srv, "ens_b"), want_a, rtol=1e-6)
    assert run(srv, "m", "INPUT0").status_code == 200
    # repo_b gains its m: the poller loads it, and ens_b now runs its own repository's copy
    # while ens_a keeps repo_a's; the name alone is ambiguous.
    moved.rename(repo_b / "m")

    def rebound():
        r = run(srv, "ens_b", "X")
        return r.status_code == 200 and np.allclose(parse_response(r)[1]["Y"], want_b)
    srv.wait_until(rebound, 20, "ens_b to run repo_b's m")
    np.testing.assert_allclose(ensemble_output(srv, "ens_a"), want_a, rtol=1e-6)
    assert run(srv, "m", "INPUT0").json()["error"] == AMBIGUOUS
    assert srv.stop() == 0
