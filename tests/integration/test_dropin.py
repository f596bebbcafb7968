"""Where Triton accepts a user's files and requests, inferd accepts them too (issue 26).

The rule: never refuse what Triton accepts unless serving it would compute a wrong answer; what
has no effect here loads with one WARNING line that names it. Each case is what Triton 2.59.1
does (checked on a live Triton or in its sources): JSON `data` nested in any way, backend
`parameters` keys a backend does not read, a Python model's own keys, a Python model with no
config.pbtxt, load and unload log lines in Triton's wording, SageMaker multi-model errors naming
the target model. Outputs are checked against numpy, never echoed from a config."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import free_port
from v2client import assert_error, infer, make_input, parse_response

REPO_ROOT = Path(__file__).resolve().parents[2]

# An identity model (inferd's identity backend, as Triton's) with a batch dimension and a
# three-dimensional image-like tensor: shape [1, 3, 2, 2], 12 elements.
IDENTITY = """name: "{name}"
backend: "identity"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, 2, 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3, 2, 2 ] }} ]
"""

X = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2)
FLAT = X.reshape(-1).tolist()

# Every form Triton 2.59.1 answers 200 for: the notebooks' 3-deep image list for a 4-dimension
# shape (no batch level), exact, deeper, flat, two-deep, ragged, with empty arrays.
NESTINGS = {
    "flat": FLAT,
    "exact": X.tolist(),
    "shallower-by-one": X[0].tolist(),
    "two-deep": X.reshape(3, 4).tolist(),
    "deeper": [X.tolist()],
    "ragged": [FLAT[:5], [FLAT[5:7], [FLAT[7]]], FLAT[8], [], FLAT[9:]],
}


def write_identity(repo, name="ident"):
    d = Path(repo) / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(IDENTITY.format(name=name))
    return repo


def body(data, shape=(1, 3, 2, 2)):
    return {"inputs": [{"name": "INPUT0", "shape": list(shape), "datatype": "FP32", "data": data}]}


def output_of(r):
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.array(out["data"], dtype=np.float32).reshape(out["shape"])


def full_log(srv):
    """The server's whole log (Server.log() keeps only its tail, for failure messages)."""
    return Path(srv.log_path).read_text(errors="replace")


def start_sagemaker(server_factory, repo, *extra):
    port = free_port()
    srv = server_factory(repo, ["--allow-sagemaker=true", f"--sagemaker-port={port}",
                                "--sagemaker-address=127.0.0.1", *extra])
    url = f"http://127.0.0.1:{port}"
    srv.wait_until(lambda: _pings(url), 30, "the SageMaker port to open")
    return srv, url


def _pings(url):
    try:
        requests.get(url + "/ping", timeout=5)
        return True
    except requests.ConnectionError:
        return False


# ---- JSON data nested in any way ------------------------------------------------------------


def test_json_data_nested_any_way_kserve_and_sagemaker(server_factory, tmp_path):
    # One model in the repository: SageMaker's /invocations serves it.
    srv, url = start_sagemaker(server_factory, write_identity(tmp_path))
    srv.wait_until(lambda: srv.get("/v2/models/ident/ready").status_code == 200, 60, "ident")
    for form, data in NESTINGS.items():
        r = srv.post("/v2/models/ident/infer", json=body(data))
        np.testing.assert_array_equal(output_of(r), X, err_msg=form)
        # The SageMaker /invocations JSON path uses the same codec.
        r = requests.post(url + "/invocations", data=json.dumps(body(data)),
                          headers={"Content-Type": "application/json"}, timeout=60)
        np.testing.assert_array_equal(output_of(r), X, err_msg=form)


def test_json_data_count_that_disagrees_is_400_naming_the_input(server_factory, tmp_path):
    srv, url = start_sagemaker(server_factory, write_identity(tmp_path))
    srv.wait_until(lambda: srv.get("/v2/models/ident/ready").status_code == 200, 60, "ident")
    for data in (X[0, :2].tolist(), [X.tolist(), [1.0]], FLAT[:11]):
        assert_error(srv.post("/v2/models/ident/infer", json=body(data)), 400, "INPUT0",
                     "needs 12 elements")
        r = requests.post(url + "/invocations", data=json.dumps(body(data)),
                          headers={"Content-Type": "application/json"}, timeout=60)
        assert_error(r, 400, "INPUT0", "needs 12 elements")
    # Malformed stays malformed.
    r = srv.post("/v2/models/ident/infer",
                 data='{"inputs":[{"name":"INPUT0","shape":[1,3,2,2],"datatype":"FP32",'
                      '"data":[[1,2],[3,]]}]}')
    assert r.status_code == 400, r.text


# ---- backend parameters keys a backend does not read ----------------------------------------

SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def param(key, value):
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


# The ONNX article's tuning block, the GPU-only keys, a key no backend reads, and the TensorRT
# accelerator of the TensorRT article.
ONNX_EXTRA = (param("enable_cpu_mem_arena", "0") + param("gpu_mem_limit", "4294967296")
              + param("cudnn_conv_algo_search", "1") + param("do_copy_in_default_stream", "0")
              + param("arena_extend_strategy", "1") + param("my_own_key", "x")
              + 'optimization { execution_accelerators { gpu_execution_accelerator : [ '
                '{ name : "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }\n')
ONNX_KEYS = ["enable_cpu_mem_arena", "gpu_mem_limit", "cudnn_conv_algo_search",
             "do_copy_in_default_stream", "arena_extend_strategy", "my_own_key"]


def write_simple(repo, name, extra):
    (Path(repo) / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + SIMPLE_IO + extra)


def check_simple(srv, name):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, name, [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], a + a)


def warning_lines(log, model):
    return [line for line in log.splitlines()
            if f"model '{model}'" in line and ("has no effect" in line)]


def assert_one_warning_per_key(log, model, keys):
    lines = warning_lines(log, model)
    for key in keys:
        named = [line for line in lines if f"'parameters' key '{key}'" in line]
        assert len(named) == 1, (key, lines)
    acc = [line for line in lines if "gpu_execution_accelerator 'tensorrt'" in line]
    assert len(acc) == 1, lines
    assert ("has no effect: Triton adds it (the TensorRT or CUDA execution provider) to GPU "
            "instances only; this model's instances run on the CPU") in acc[0], acc


def test_onnx_keys_it_does_not_read_load_with_one_warning_each(server_factory, make_repo, pb):
    """Over every load route: start-up, the HTTP repository API, gRPC RepositoryModelLoad."""
    repo = make_repo({"at_start": "simple", "over_http": "simple", "over_grpc": "simple"})
    for name in ("at_start", "over_http", "over_grpc"):
        write_simple(repo, name, ONNX_EXTRA)
    srv = server_factory([repo], ["--model-control-mode=explicit", "--load-model=at_start"])
    check_simple(srv, "at_start")
    assert srv.post("/v2/repository/models/over_http/load", json={}).status_code == 200
    check_simple(srv, "over_http")
    import grpc
    m, g = pb
    stub = g.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}"))
    stub.RepositoryModelLoad(m.RepositoryModelLoadRequest(model_name="over_grpc"), timeout=120)
    check_simple(srv, "over_grpc")
    log = full_log(srv)
    for name in ("at_start", "over_http", "over_grpc"):
        assert_one_warning_per_key(log, name, ONNX_KEYS)
    # The GPU keys are WARNING lines of their own, no longer inside the settings' INFO line.
    assert "not_applying_without_gpu" not in log
    # Each says what it would have done.
    assert any("gpu_mem_limit' has no effect" in line and "CUDA" in line and "no GPU" in line
               for line in log.splitlines()), log
    assert any("'my_own_key' is not read by inferd's onnxruntime backend" in line
               for line in log.splitlines()), log


def test_strict_flag_restores_the_refusal(server_factory, make_repo):
    repo = make_repo({"keys": "simple", "gpu_keys_only": "simple"})
    write_simple(repo, "keys", param("my_own_key", "x"))
    write_simple(repo, "gpu_keys_only", param("gpu_mem_limit", "1") + param("enable_cpu_mem_arena", "0"))
    srv = server_factory([repo], ["--strict-model-config-parameters=true", "--exit-on-error=false",
                                  "--strict-readiness=false"])
    srv.wait_until(lambda: srv.get("/v2/models/gpu_keys_only/ready").status_code == 200, 60,
                   "gpu_keys_only")
    check_simple(srv, "gpu_keys_only")  # keys Triton's backend knows still load, with a warning
    index = {e["name"]: e for e in srv.post("/v2/repository/index", json={}).json()}
    assert index["keys"]["state"] == "UNAVAILABLE", index
    assert ("config.pbtxt field 'parameters' key 'my_own_key' is not supported by inferd's "
            "onnxruntime backend") in index["keys"]["reason"], index


def test_sagemaker_multi_model_load_with_unread_keys(server_factory, make_repo, tmp_path,
                                                    example_models):
    repo = make_repo({"simple": "simple"})
    srv, url = start_sagemaker(server_factory, repo, "--model-control-mode=explicit",
                               f"--sagemaker-model-cache-dir={tmp_path / 'cache'}")
    src = tmp_path / "mme_src" / "simple"
    import shutil
    shutil.copytree(Path(example_models) / "simple", src)
    write_simple(src.parent, "simple", ONNX_EXTRA)
    r = requests.post(url + "/models", json={"model_name": "tuned", "url": str(src)}, timeout=120)
    assert r.status_code == 200, r.text
    body_ = json.dumps({"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for n in ("INPUT0", "INPUT1")]})
    r = requests.post(url + "/models/tuned/invoke", data=body_,
                      headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [2 * i for i in range(16)]
    lines = [line for line in full_log(srv).splitlines() if "has no effect" in line]
    for key in ONNX_KEYS:
        assert len([line for line in lines if f"'parameters' key '{key}'" in line]) == 1, (key, lines)


TORCH_EXTRA = (param("ENABLE_NVFUSER", "true") + param("ENABLE_CACHE_CLEANING", "true")
               + param("DISABLE_CUDNN", "true") + param("INFERENCE_MODE", "true"))


def test_pytorch_article_keys_load(server_factory, tmp_path):
    torch = pytest.importorskip("torch")

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    d = tmp_path / "torch_double"
    (d / "1").mkdir(parents=True)
    torch.jit.script(Double()).save(str(d / "1" / "model.pt"))
    (d / "config.pbtxt").write_text(
        'name: "torch_double"\nplatform: "pytorch_libtorch"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' + TORCH_EXTRA)
    srv = server_factory([tmp_path], ["--model-control-mode=explicit"])
    r = srv.post("/v2/repository/models/torch_double/load", json={})
    if "backend 'pytorch' is not available" in r.text:
        pytest.skip("this build has no LibTorch backend")
    assert r.status_code == 200, r.text
    x = np.arange(4, dtype=np.float32)
    r = infer(srv, "torch_double", [make_input("INPUT__0", x, "FP32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT__0"], x * 2)
    lines = warning_lines(full_log(srv), "torch_double")
    for key in ("ENABLE_NVFUSER", "ENABLE_CACHE_CLEANING", "DISABLE_CUDNN"):
        assert len([line for line in lines if f"key '{key}'" in line]) == 1, (key, lines)
    assert not [line for line in lines if "INFERENCE_MODE" in line], lines


# ---- the Python backend ---------------------------------------------------------------------

PY_OWN_KEYS = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.scale = float(params["scale"]["string_value"])
        self.tokenizer = params["tokenizer_path"]["string_value"]

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x * self.scale).astype(np.float32)),
                pb_utils.Tensor("T", np.array([self.tokenizer.encode()], dtype=np.object_))]))
        return out
'''

PY_OWN_KEYS_CONFIG = """name: "own_keys"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "T" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "scale" value: { string_value: "2.5" } }
parameters { key: "tokenizer_path" value: { string_value: "/opt/tok/vocab.json" } }
"""


def write_py(repo, name, config, model_py):
    d = Path(repo) / name
    (d / "1").mkdir(parents=True)
    if config is not None:
        (d / "config.pbtxt").write_text(config)
    (d / "1" / "model.py").write_text(model_py)


def test_python_model_reads_its_own_keys(server_factory, tmp_path):
    write_py(tmp_path, "own_keys", PY_OWN_KEYS_CONFIG, PY_OWN_KEYS)
    srv = server_factory([tmp_path])
    srv.wait_until(lambda: srv.get("/v2/models/own_keys/ready").status_code == 200, 120, "own_keys")
    x = np.array([1, 2, 4], dtype=np.float32)
    r = infer(srv, "own_keys", [make_input("X", x, "FP32")])
    assert r.status_code == 200, r.text
    out = parse_response(r)[1]
    np.testing.assert_allclose(out["Y"], x * 2.5)
    assert [v.decode() if isinstance(v, bytes) else v for v in out["T"].reshape(-1)] == \
        ["/opt/tok/vocab.json"]
    assert not warning_lines(full_log(srv), "own_keys")  # passed through, no warning


PY_AUTO = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT0", pb_utils.get_input_tensor_by_name(r, "IN0").as_numpy() - 1)]) for r in requests]
'''


def test_python_model_without_config_pbtxt(server_factory, tmp_path):
    """Only 1/model.py: Triton core's AutoCompleteBackendFields picks the Python backend from the
    file, and model.py's auto_complete_config gives the rest."""
    write_py(tmp_path, "no_config", None, PY_AUTO)
    srv = server_factory([tmp_path])
    srv.wait_until(lambda: srv.get("/v2/models/no_config/ready").status_code == 200, 120,
                   "no_config")
    cfg = srv.get("/v2/models/no_config/config").json()
    assert cfg["backend"] == "python", cfg
    assert [i["name"] for i in cfg["input"]] == ["IN0"], cfg
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    r = infer(srv, "no_config", [make_input("IN0", x, "FP32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUT0"], x - 1)


# ---- load and unload log lines --------------------------------------------------------------

LOADED = re.compile(r"successfully loaded '([^']+)' version (\d+) in [0-9.e+-]+ s, memory (\d+) bytes")
UNLOADED = re.compile(r"successfully unloaded '([^']+)' version (\d+) in [0-9.e+-]+ s, freed (\d+) bytes")


def test_load_and_unload_are_logged_on_every_route(server_factory, make_repo, tmp_path, pb,
                                                    example_models):
    repo = make_repo({"simple": "simple", "other": "simple"})
    write_simple(repo, "other", "")
    srv, url = start_sagemaker(server_factory, repo, "--model-control-mode=explicit",
                               f"--sagemaker-model-cache-dir={tmp_path / 'cache'}")
    # HTTP repository API.
    assert srv.post("/v2/repository/models/simple/load", json={}).status_code == 200
    assert srv.post("/v2/repository/models/simple/unload", json={}).status_code == 200
    # gRPC.
    import grpc
    m, g = pb
    stub = g.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}"))
    stub.RepositoryModelLoad(m.RepositoryModelLoadRequest(model_name="other"), timeout=120)
    stub.RepositoryModelUnload(m.RepositoryModelUnloadRequest(model_name="other"), timeout=120)
    # SageMaker multi-model load and delete.
    r = requests.post(url + "/models", json={"model_name": "mme",
                                             "url": str(Path(example_models) / "simple")},
                      timeout=120)
    assert r.status_code == 200, r.text
    assert requests.delete(url + "/models/mme", timeout=120).status_code == 200

    def lines(pattern):
        return [(mm.group(1), mm.group(2), int(mm.group(3))) for mm in pattern.finditer(full_log(srv))]

    # Unloads finish when the last request lets go of the model: wait for the lines.
    srv.wait_until(lambda: len(lines(UNLOADED)) >= 3, 60, "three unload lines")
    loaded, unloaded = lines(LOADED), lines(UNLOADED)
    assert len(loaded) == 3 and len(unloaded) == 3, (loaded, unloaded)
    assert [(n, v) for n, v, _ in loaded[:2]] == [("simple", "1"), ("other", "1")], loaded
    assert [(n, v) for n, v, _ in unloaded[:2]] == [("simple", "1"), ("other", "1")], unloaded
    assert loaded[2][1] == unloaded[2][1] == "1" and loaded[2][0] == unloaded[2][0]
    assert all(b > 0 for _, _, b in loaded + unloaded), (loaded, unloaded)
    # What each unload frees is what its load took.
    assert [b for _, _, b in loaded] == [b for _, _, b in unloaded]


# ---- SageMaker multi-model errors name the target model -------------------------------------


def test_sagemaker_errors_name_the_target_model(server_factory, make_repo, tmp_path, example_models):
    repo = make_repo({"simple": "simple"})
    srv, url = start_sagemaker(server_factory, repo, "--model-control-mode=explicit",
                               f"--sagemaker-model-cache-dir={tmp_path / 'cache'}")
    headers = {"Content-Type": "application/json",
               "X-Amzn-SageMaker-Target-Model": "resnet-v2.tar.gz"}
    ok_body = json.dumps({"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for n in ("INPUT0", "INPUT1")]})
    # Not loaded.
    r = requests.post(url + "/models/absent/invoke", data=ok_body, headers=headers, timeout=60)
    assert_error(r, 404, "model 'absent' is not loaded",
                 "X-Amzn-SageMaker-Target-Model: 'resnet-v2.tar.gz'")
    # An error from the model's own request handling.
    assert requests.post(url + "/models", json={"model_name": "m1",
                                                "url": str(Path(example_models) / "simple")},
                         timeout=120).status_code == 200
    bad = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
                                  "data": list(range(15))},
                                 {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32",
                                  "data": list(range(16))}]})
    r = requests.post(url + "/models/m1/invoke", data=bad, headers=headers, timeout=60)
    assert_error(r, 400, "INPUT0", "X-Amzn-SageMaker-Target-Model: 'resnet-v2.tar.gz'")
    # Without the header, no mention of it; a success is untouched.
    r = requests.post(url + "/models/m1/invoke", data=bad,
                      headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "X-Amzn-SageMaker-Target-Model" not in r.text, r.text
    r = requests.post(url + "/models/m1/invoke", data=ok_body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text


# ---- docs -----------------------------------------------------------------------------------


def test_container_doc_says_what_serve_does_with_the_shm_variables():
    doc = (REPO_ROOT / "docs" / "container.md").read_text()
    row = [line for line in doc.splitlines() if line.startswith("| `SAGEMAKER_TRITON_SHM_")]
    assert len(row) == 1, row
    assert "no effect" not in row[0] and "no Python backend" not in row[0], row[0]
    serve = (REPO_ROOT / "scripts" / "serve").read_text()
    assert "shm-default-byte-size" in serve and "shm-growth-byte-size" in serve
