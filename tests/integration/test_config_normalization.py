"""The configuration a loaded model reports (GET /v2/models/<m>/config) is what tritonserver
reports for the same config.pbtxt: the defaults Triton core's normalization fills in
(NormalizeModelConfig, AutoCompleteBackendFields, ValidateEnsembleConfig), as its
qa/L0_model_config expected files show. Clients compare the two, and paste it back as a config.

The configs here are written for these tests, modeled on that corpus's cases."""

import numpy as np

from v2client import infer, make_input, parse_response

SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def config(srv, name):
    r = srv.get(f"/v2/models/{name}/config")
    assert r.status_code == 200, r.text
    return r.json()


def index(srv):
    r = srv.post("/v2/repository/index", json={})
    assert r.status_code == 200, r.text
    return {e["name"]: e for e in r.json()}


def test_scheduling_and_optimization_defaults(make_repo, server_factory):
    repo = make_repo({"batched": "simple", "sequence": "simple", "pinned_off": "simple"})
    (repo / "batched" / "config.pbtxt").write_text(
        'name: "batched"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + SIMPLE_IO +
        "dynamic_batching { }\n")
    (repo / "sequence" / "config.pbtxt").write_text(
        'name: "sequence"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n' + SIMPLE_IO +
        "sequence_batching { oldest { max_candidate_sequences: 2 } }\n")
    (repo / "pinned_off" / "config.pbtxt").write_text(
        'name: "pinned_off"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + SIMPLE_IO +
        "optimization { input_pinned_memory { enable: false } }\n")
    srv = server_factory(repo)
    for name in ("batched", "sequence", "pinned_off"):
        srv.wait_until(lambda: srv.get(f"/v2/models/{name}/ready").status_code == 200, 60,
                       f"{name} to load")

    cfg = config(srv, "batched")
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [8]
    assert cfg["optimization"]["input_pinned_memory"] == {"enable": True}
    assert cfg["optimization"]["output_pinned_memory"] == {"enable": True}
    assert "model_transaction_policy" not in cfg
    # Serving is unchanged by it: a lone request still runs (a batch below the preferred size
    # goes when the queue has nothing more, max_queue_delay_microseconds being 0).
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, "batched", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], a + a)

    cfg = config(srv, "sequence")
    assert cfg["sequence_batching"]["max_sequence_idle_microseconds"] == 1000000
    assert cfg["sequence_batching"]["oldest"]["preferred_batch_size"] == [4]

    cfg = config(srv, "pinned_off")  # the config's own setting is kept
    assert cfg["optimization"]["input_pinned_memory"] == {"enable": False}
    assert cfg["optimization"]["output_pinned_memory"] == {"enable": True}


def test_ensemble_reports_its_transaction_policy(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text('name: "ens"\nplatform: "ensemble"\n'
                                               'max_batch_size: 8\n' + SIMPLE_IO + """
ensemble_scheduling { step [ { model_name: "simple" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }
""")
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/ens/ready").status_code == 200, 60, "ens to load")
    cfg = config(srv, "ens")
    assert cfg["model_transaction_policy"] == {"decoupled": False}
    assert "optimization" not in cfg and cfg["instance_group"] == []


def test_backend_named_by_the_model_name(make_repo, server_factory):
    """Triton's custom-backend auto-complete: a config that names no backend or platform, for a
    version folder without a model file that tells, is served by the backend after the first
    '.' of the model's name ("<model>.identity")."""
    repo = make_repo({})
    (repo / "echo.identity" / "1").mkdir(parents=True)
    (repo / "echo.identity" / "config.pbtxt").write_text(
        'max_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3 ] } ]\n')
    (repo / "nodot" / "1").mkdir(parents=True)
    (repo / "nodot" / "config.pbtxt").write_text(
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3 ] } ]\n')
    (repo / "other.nosuchbackend" / "1").mkdir(parents=True)
    (repo / "other.nosuchbackend" / "config.pbtxt").write_text("")
    srv = server_factory(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: srv.get("/v2/models/echo.identity/ready").status_code == 200, 60,
                   "echo.identity to load")
    cfg = config(srv, "echo.identity")
    assert cfg["backend"] == "identity"
    assert cfg["default_model_filename"] == "model.identity"
    a = np.array([[1, 2, 3]], dtype=np.int32)
    r = infer(srv, "echo.identity", [make_input("INPUT0", a, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], a)

    def settled():
        idx = index(srv)
        return all(idx.get(n, {}).get("state") == "UNAVAILABLE" and idx[n].get("reason")
                   for n in ("nodot", "other.nosuchbackend"))
    srv.wait_until(settled, 60, "the two refusals")
    idx = index(srv)
    assert "'<model>.<backend>'" in idx["nodot"]["reason"], idx["nodot"]
    assert "backend 'nosuchbackend' is not available" in idx["other.nosuchbackend"]["reason"], \
        idx["other.nosuchbackend"]
