"""Nothing silent (issue 16): a config.pbtxt field inferd would ignore fails that model's load with
a reason naming the field, in the repository index, while every other model keeps serving.
The whole schema is walked in tests/unit/config_coverage_test.cc; these are the real server's
load paths (start-up, the repository load API with a config override)."""

from pathlib import Path

import numpy as np
import pytest

from v2client import infer, make_input, parse_response

SIMPLE_HEAD = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""

# model name -> (what its config adds to `simple`'s, what the reason must say)
REFUSED = {
    "seq": ("sequence_batching { iterative_sequence: true }\n",
            "config.pbtxt field 'sequence_batching.iterative_sequence' is not supported "
            "by inferd"),
    # KIND_GPU is placed, not refused by the config check: test_gpu_placement.py.
    "shape_tensor": ('input [ { name: "SHAPE" data_type: TYPE_INT32 dims: [ 1 ] '
                     'is_shape_tensor: true } ]\n',
                     "config.pbtxt field 'input.is_shape_tensor' is not supported by inferd"),
}


def write_simple(repo, name, extra):
    cfg = repo / name / "config.pbtxt"
    cfg.write_text(f'name: "{name}"\n' + SIMPLE_HEAD + SIMPLE_IO + extra)


def check_simple(srv, name):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, name, [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], a + a)


def index(srv):
    r = srv.post("/v2/repository/index", json={})
    assert r.status_code == 200, r.text
    return {e["name"]: e for e in r.json()}


@pytest.fixture
def refused_server(make_repo, server_factory):
    models = {"simple": "simple", "copied_from_triton": "simple"}
    models.update({name: "simple" for name in REFUSED})
    repo = make_repo(models)
    for name, (extra, _) in REFUSED.items():
        write_simple(repo, name, extra)
    # What GET /v2/models/<m>/config of tritonserver prints for such a model on a CPU machine,
    # pasted back as a config: auto-complete's pinned-memory settings, default values, a dynamic
    # batcher. None of it may be refused.
    write_simple(repo, "copied_from_triton", """
version_policy { latest { num_versions: 1 } }
optimization { priority: PRIORITY_DEFAULT input_pinned_memory { enable: true }
               output_pinned_memory { enable: true } gather_kernel_buffer_threshold: 0
               eager_batching: false }
dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 0 }
instance_group [ { name: "copied_from_triton" kind: KIND_CPU count: 1 gpus: [ ] passive: false
                   host_policy: "" } ]
default_model_filename: "model.onnx"
response_cache { enable: false }
""")
    return server_factory([repo], ["--exit-on-error=false", "--strict-readiness=false"])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_ignored_field_fails_the_load_naming_it(refused_server, name):
    srv = refused_server
    srv.wait_until(lambda: name in index(srv), 30, f"{name} in the repository index")
    entry = index(srv)[name]
    assert entry["state"] == "UNAVAILABLE", entry
    assert f"model '{name}': " + REFUSED[name][1] in entry["reason"], entry
    assert srv.get(f"/v2/models/{name}/ready").status_code != 200
    # The others serve on.
    check_simple(srv, "simple")


def test_config_copied_from_triton_loads(refused_server):
    srv = refused_server
    srv.wait_until(lambda: srv.get("/v2/models/copied_from_triton/ready").status_code == 200, 30,
                   "copied_from_triton to be ready")
    check_simple(srv, "copied_from_triton")
    assert index(srv)["copied_from_triton"]["state"] == "READY"


def test_refusal_through_the_load_api_with_a_config_override(make_repo, server_factory):
    """The repository extension's `config` parameter goes through the same check."""
    repo = make_repo({"simple": "simple"})
    srv = server_factory([repo], ["--model-control-mode=explicit"])
    cfg = ('{"name": "simple", "platform": "onnxruntime_onnx", "max_batch_size": 8, '
           '"input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]}, '
           '{"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]}], '
           '"output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]}, '
           '{"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]}], '
           '"model_repository_agents": {"agents": [{"name": "checksum"}]}}')
    r = srv.post("/v2/repository/models/simple/load", json={"parameters": {"config": cfg}})
    assert r.status_code == 400, r.text
    assert ("config.pbtxt field 'model_repository_agents' is not supported by inferd"
            in r.json()["error"]), r.text
    # Without the agent the same override loads.
    r = srv.post("/v2/repository/models/simple/load",
                 json={"parameters": {"config": cfg.replace(
                     ', "model_repository_agents": {"agents": [{"name": "checksum"}]}', "")}})
    assert r.status_code == 200, r.text
    check_simple(srv, "simple")


def test_ensemble_parameters_load_with_a_warning(make_repo, server_factory):
    """An ensemble has no backend to read parameters: Triton accepts them, so inferd loads the
    ensemble with one WARNING naming the field (issue 26; refused before)."""
    repo = make_repo({"simple": "simple", "pipe": "simple"})
    (repo / "pipe" / "1" / "model.onnx").unlink()
    (repo / "pipe" / "config.pbtxt").write_text('name: "pipe"\nplatform: "ensemble"\n'
                                                'max_batch_size: 8\n' + SIMPLE_IO + """
ensemble_scheduling { step [ { model_name: "simple" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
""")
    srv = server_factory([repo], ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: srv.get("/v2/models/pipe/ready").status_code == 200, 60, "pipe ready")
    check_simple(srv, "pipe")
    log = Path(srv.log_path).read_text(errors="replace")
    assert log.count("model 'pipe': config.pbtxt field 'parameters' has no effect in inferd "
                     "(an ensemble has no backend to read them)") == 1, log


def test_reshape_a_backend_does_not_apply_is_refused(make_repo, server_factory):
    """reshape is applied by each backend; the identity backend applies none, so a reshape there
    would leave the tensor's shape as it came: refused, naming the backend."""
    repo = make_repo({"simple": "simple", "ident": "identity_fp32"})
    (repo / "ident" / "config.pbtxt").write_text("""name: "ident"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
""")
    srv = server_factory([repo], ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: "ident" in index(srv), 30, "ident in the index")
    entry = index(srv)["ident"]
    assert entry["state"] == "UNAVAILABLE"
    assert ("config.pbtxt field 'input.reshape' is not supported by inferd's identity backend "
            "(input 'INPUT0' would keep its dims") in entry["reason"], entry
    check_simple(srv, "simple")
