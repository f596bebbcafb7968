"""The configuration a loaded model reports (GET /v2/models/<m>/config) is what tritonserver
reports for the same config.pbtxt: the defaults Triton core's normalization fills in
(NormalizeModelConfig, AutoCompleteBackendFields, ValidateEnsembleConfig), as its
qa/L0_model_config expected files show. Clients compare the two, and paste it back as a config.

The configs here are written for these tests, modeled on that corpus's cases."""

import numpy as np
import pytest

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


# ----------------------------------------------------------------------------------------------
# Ensembles: what Triton's ValidateEnsembleConfig accepts and refuses (qa/L0_model_config
# autofill_noplatform_success/ensemble/inconsistent_shape, autofill_noplatform/ensemble/
# unmapped_input, qa/L0_optional_input).

def identity_config(name, mbs, dims, optional=False):
    opt = " optional: true" if optional else ""
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {mbs}\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims}{opt} }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]\n'
            'instance_group [ { kind: KIND_CPU } ]\n')


def write_model(repo, name, text, files=None):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text)
    for fname, body in (files or {}).items():
        (repo / name / "1" / fname).write_text(body)


CHAIN = """
input [ { name: "data" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "prob" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "batched" model_version: -1
    input_map { key: "INPUT0" value: "data" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "%s" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "prob" } } ] }
"""


def test_batching_ensemble_runs_a_step_that_does_not_batch(make_repo, server_factory):
    """A non-batching step whose dims are the batched tensor's full shape ([-1, 16] for [16])
    takes the ensemble's batch whole; one whose dims do not match it is refused, naming both."""
    repo = make_repo({})
    write_model(repo, "batched", identity_config("batched", 4, "[ 16 ]"))
    write_model(repo, "whole", identity_config("whole", 0, "[ -1, 16 ]"))
    write_model(repo, "narrow", identity_config("narrow", 0, "[ -1, 8 ]"))
    write_model(repo, "ens", 'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 2\n' +
                CHAIN % "whole")
    write_model(repo, "bad", 'name: "bad"\nplatform: "ensemble"\nmax_batch_size: 2\n' +
                CHAIN % "narrow")
    srv = server_factory(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: srv.get("/v2/models/ens/ready").status_code == 200, 60, "ens to load")
    for batch in (1, 2):
        x = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
        r = infer(srv, "ens", [make_input("data", x, "FP32")])
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(parse_response(r)[1]["prob"], x)
    srv.wait_until(lambda: index(srv).get("bad", {}).get("reason"), 60, "bad to be refused")
    reason = index(srv)["bad"]["reason"]
    assert "input 'INPUT0' has shape [-1,8] but tensor 'mid'" in reason, reason


def test_ensemble_step_must_map_every_required_input(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    write_model(repo, "half", 'name: "half"\nplatform: "ensemble"\nmax_batch_size: 8\n' + """
input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "simple" model_version: -1
  input_map { key: "INPUT0" value: "A" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
""")
    srv = server_factory(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: index(srv).get("half", {}).get("reason"), 60, "half to be refused")
    reason = index(srv)["half"]["reason"]
    assert "input 'INPUT1' of model 'simple' is not mapped to any ensemble tensor" in reason, reason


OPTIONAL_PY = '''
import numpy as np
import pytest
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            out = a + (b.as_numpy() if b is not None else 100)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", out)]))
        return responses
'''


def test_ensemble_with_an_optional_input(make_repo, server_factory):
    repo = make_repo({})
    write_model(repo, "adder", """name: "adder"
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] },
        { name: "B" data_type: TYPE_INT32 dims: [ 2 ] optional: true } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
""", {"model.py": OPTIONAL_PY})
    write_model(repo, "opt_ens", """name: "opt_ens"
platform: "ensemble"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] },
        { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] optional: true } ]
output [ { name: "Z" data_type: TYPE_INT32 dims: [ 2 ] } ]
ensemble_scheduling { step [ { model_name: "adder" model_version: -1
  input_map { key: "A" value: "X" } input_map { key: "B" value: "Y" }
  output_map { key: "SUM" value: "Z" } } ] }
""")
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/opt_ens/ready").status_code == 200, 120,
                   "opt_ens to load")
    x = np.array([[1, 2]], dtype=np.int32)
    y = np.array([[10, 20]], dtype=np.int32)
    r = infer(srv, "opt_ens", [make_input("X", x, "INT32"), make_input("Y", y, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["Z"], x + y)
    r = infer(srv, "opt_ens", [make_input("X", x, "INT32")])  # Y left out: the step runs without B
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["Z"], x + 100)
    # The required one still is.
    r = infer(srv, "opt_ens", [make_input("Y", y, "INT32")])
    assert r.status_code == 400, r.text
    assert "X" in r.text


def test_onnx_config_must_declare_every_input_the_file_requires(make_repo, server_factory):
    """Triton refuses it too ("configuration expects 1 inputs, model provides 2"): every request
    would fail in ONNX Runtime for want of the undeclared input."""
    repo = make_repo({"one_input": "simple"})
    (repo / "one_input" / "config.pbtxt").write_text("""name: "one_input"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
""")
    srv = server_factory(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: index(srv).get("one_input", {}).get("reason"), 60, "the refusal")
    reason = index(srv)["one_input"]["reason"]
    assert "input 'INPUT1' of the model file is not in config.pbtxt" in reason, reason


def test_pytorch_config_without_outputs_is_refused(make_repo, server_factory):
    """Triton's PyTorch backend refuses it ("model configuration must contain at least one
    output"; qa/L0_model_config autofill_noplatform/pytorch/too_few_outputs): nothing reads the
    outputs from the file."""
    torch = pytest.importorskip("torch")

    class AddSub(torch.nn.Module):
        def forward(self, a, b):
            return a + b, a - b

    repo = make_repo({})
    (repo / "no_outputs" / "1").mkdir(parents=True)
    torch.jit.script(AddSub()).save(str(repo / "no_outputs" / "1" / "model.pt"))
    (repo / "no_outputs" / "config.pbtxt").write_text("""platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
""")
    srv = server_factory(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: index(srv).get("no_outputs", {}).get("reason"), 120, "the refusal")
    reason = index(srv)["no_outputs"]["reason"]
    if "backend 'pytorch' is not available" in reason:
        pytest.skip("this build has no PyTorch backend (the sanitizer builds)")
    assert "must list at least one output" in reason, reason


def test_grpc_reports_the_same_normalized_config(make_repo, server_factory, pb):
    """Triton's compare_status.py reads the config over both protocols."""
    import grpc
    from google.protobuf import json_format
    m, m_grpc = pb
    repo = make_repo({"batched": "simple"})
    (repo / "batched" / "config.pbtxt").write_text(
        'name: "batched"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + SIMPLE_IO +
        "dynamic_batching { }\n")
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/batched/ready").status_code == 200, 60,
                   "batched to load")
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        got = m_grpc.GRPCInferenceServiceStub(channel).ModelConfig(
            m.ModelConfigRequest(name="batched")).config
    assert list(got.dynamic_batching.preferred_batch_size) == [8]
    assert got.optimization.input_pinned_memory.enable
    http = type(got)()
    json_format.ParseDict(config(srv, "batched"), http)
    assert got == http
