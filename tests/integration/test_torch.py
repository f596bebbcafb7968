"""The PyTorch (LibTorch / TorchScript) backend against the real server.

tests/models/gen_torch_models.py writes the models into a temporary repository; one server
serves all of them (--exit-on-error=false: torch_bad_file must not stop the others). Every
output is compared with the same model.pt loaded by torch.jit.load in this process.

    cd /work/main && /usr/bin/python3 -m pytest -q tests/integration/test_torch.py
    ... -m "not resnet"   # without the ResNet-50 tests
"""

import concurrent.futures as futures
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from conftest import GEN_MODELS, start_server
from v2client import assert_error, infer, make_input, parse_response

GEN_TORCH = GEN_MODELS.parent / "gen_torch_models.py"

RTOL, ATOL = 1e-5, 1e-6

# name -> inputs in config.pbtxt order (name, datatype, dims), forward() argument order,
# outputs (name, datatype, dims), max_batch_size, how forward() takes its inputs.
SPECS = {
    "torch_linear": dict(
        inputs=[("INPUT__0", "FP32", [8])], outputs=[("OUTPUT__0", "FP32", [4])], mbs=8),
    "torch_two_io": dict(
        inputs=[("INPUT__0", "FP32", [4]), ("INPUT__1", "FP32", [4])],
        outputs=[("OUTPUT__0", "FP32", [4]), ("OUTPUT__1", "FP32", [4])], mbs=4),
    "torch_named_args": dict(
        inputs=[("y", "INT64", [3]), ("x", "INT64", [3])], forward=["x", "y"],
        outputs=[("OUTPUT__0", "INT64", [3])], mbs=0),
    "torch_dict_out": dict(
        inputs=[("INPUT__0", "FP32", [5])],
        outputs=[("sum", "FP32", [1]), ("double", "FP32", [5])], mbs=8),
    "torch_dict_in": dict(
        inputs=[("A", "FP32", [2]), ("B", "FP32", [2])], outputs=[("OUTPUT__0", "FP32", [2])],
        mbs=4, dict_input=True),
    "torch_raises": dict(
        inputs=[("INPUT__0", "FP32", [2])], outputs=[("OUTPUT__0", "FP32", [2])], mbs=4,
        positive=True),
    "torch_params": dict(
        inputs=[("INPUT__0", "FP32", [8])], outputs=[("OUTPUT__0", "FP32", [4])], mbs=8),
    "torch_resnet50": dict(
        inputs=[("INPUT__0", "FP32", [3, 224, 224])], outputs=[("OUTPUT__0", "FP32", [1000])],
        mbs=8),
}
SMALL_MODELS = [m for m in SPECS if m != "torch_resnet50"]
READY_MODELS = list(SPECS)
NP = {"FP32": np.float32, "INT64": np.int64}


# --------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def torch_repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_models")
    subprocess.run([sys.executable, str(GEN_TORCH), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="module")
def tsrv(torch_repo, logs_dir):
    srv = start_server(torch_repo, ["--exit-on-error=false", "--strict-readiness=false"],
                       logs_dir)
    for name in READY_MODELS:
        srv.wait_until(lambda: srv.get(f"/v2/models/{name}/ready").status_code == 200, 120,
                       f"model {name} to be ready")
    yield srv
    rc = srv.stop()
    assert rc == 0, f"inferd exited with {rc} after SIGTERM\n{srv.log()}"


_loaded = {}


def load(repo, model):
    key = (str(repo), model)
    if key not in _loaded:
        m = torch.jit.load(str(Path(repo) / model / "1" / "model.pt"), map_location="cpu")
        m.eval()
        _loaded[key] = m
    return _loaded[key]


def reference(repo, model, feeds):
    """Runs model.pt in this process on {input name: array}; returns {output name: array}."""
    spec = SPECS[model]
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
    order = spec.get("forward") or [n for n, _, _ in spec["inputs"]]
    with torch.no_grad():
        m = load(repo, model)
        res = m(tensors) if spec.get("dict_input") else m(*[tensors[n] for n in order])
    names = [n for n, _, _ in spec["outputs"]]
    if isinstance(res, torch.Tensor):
        res = {names[0]: res}
    elif isinstance(res, (tuple, list)):
        res = dict(zip(names, res))
    return {n: res[n].numpy() for n in names}


def make_feeds(model, batch, seed):
    """Random inputs; batch None means no batch dimension (max_batch_size 0)."""
    spec = SPECS[model]
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dt, dims in spec["inputs"]:
        shape = dims if batch is None else [batch] + dims
        if dt == "INT64":
            a = rng.integers(-1000, 1000, size=shape, dtype=np.int64)
        elif spec.get("positive"):
            a = (rng.random(shape, dtype=np.float32) + 0.1).astype(np.float32)
        else:
            a = rng.standard_normal(shape).astype(np.float32)
        feeds[name] = a
    return feeds


def run(srv, model, feeds, binary, session=None, request_id=None):
    """Infers over HTTP: binary inputs and outputs, or JSON both ways. Returns (header, outputs)."""
    spec = SPECS[model]
    inputs = [make_input(n, feeds[n], dt, binary=binary) for n, dt, _ in spec["inputs"]]
    outputs = [{"name": n, "parameters": {"binary_data": True}} for n, _, _ in spec["outputs"]] \
        if binary else None
    r = infer(srv, model, inputs, outputs=outputs, session=session, request_id=request_id)
    assert r.status_code == 200, f"{model}: HTTP {r.status_code}: {r.text[:1000]}"
    header, out = parse_response(r)
    if binary:
        assert all("data" not in o for o in header["outputs"]), header
    else:
        assert r.headers.get("Inference-Header-Content-Length") is None
        assert all("data" in o for o in header["outputs"]), header
    return header, out


def check(header, out, model, feeds, ref, batch, rtol=RTOL, atol=ATOL):
    spec = SPECS[model]
    assert header["model_name"] == model
    assert sorted(o["name"] for o in header["outputs"]) == sorted(n for n, _, _ in spec["outputs"])
    for o in header["outputs"]:
        _, dt, dims = [s for s in spec["outputs"] if s[0] == o["name"]][0]
        assert o["datatype"] == dt, o
        assert o["shape"] == (dims if batch is None else [batch] + dims), o
    for name, expected in ref.items():
        assert out[name].dtype == expected.dtype, (name, out[name].dtype, expected.dtype)
        np.testing.assert_allclose(out[name], expected, rtol=rtol, atol=atol, err_msg=name)


def stats(srv, model):
    r = srv.get(f"/v2/models/{model}/stats")
    assert r.status_code == 200, r.text
    return r.json()["model_stats"][0]


# --------------------------------------------------------------------------------------------
# metadata and config


@pytest.mark.parametrize("model", READY_MODELS)
def test_metadata(tsrv, model):
    spec = SPECS[model]
    r = tsrv.get(f"/v2/models/{model}")
    assert r.status_code == 200, r.text
    md = r.json()
    assert md["name"] == model and md["platform"] == "pytorch_libtorch"
    assert md["versions"] == ["1"]
    lead = [-1] if spec["mbs"] > 0 else []
    assert md["inputs"] == [{"name": n, "datatype": dt, "shape": lead + dims}
                            for n, dt, dims in spec["inputs"]]
    assert md["outputs"] == [{"name": n, "datatype": dt, "shape": lead + dims}
                             for n, dt, dims in spec["outputs"]]


@pytest.mark.parametrize("model", READY_MODELS)
def test_config(tsrv, model):
    spec = SPECS[model]
    r = tsrv.get(f"/v2/models/{model}/config")
    assert r.status_code == 200, r.text
    cfg = r.json()
    assert cfg["name"] == model
    assert cfg["platform"] == "pytorch_libtorch" and cfg["backend"] == "pytorch"
    assert cfg["max_batch_size"] == spec["mbs"]
    # As Triton's AutoCompleteBackendFields: named only for a config that gives the backend and
    # no platform (torch_two_io); the backend opens model.pt either way.
    assert cfg["default_model_filename"] == ("model.pt" if model == "torch_two_io" else "")
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == \
        [(n, "TYPE_" + dt, dims) for n, dt, dims in spec["inputs"]]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == \
        [(n, "TYPE_" + dt, dims) for n, dt, dims in spec["outputs"]]


def test_backend_only_config_gets_the_platform(tsrv, torch_repo):
    # torch_two_io's config.pbtxt names only backend: "pytorch".
    text = (torch_repo / "torch_two_io" / "config.pbtxt").read_text()
    assert 'backend: "pytorch"' in text and "platform" not in text
    cfg = tsrv.get("/v2/models/torch_two_io/config").json()
    assert cfg["platform"] == "pytorch_libtorch" and cfg["backend"] == "pytorch"


def test_resnet_and_params_config(tsrv):
    cfg = tsrv.get("/v2/models/torch_resnet50/config").json()
    assert "dynamic_batching" in cfg
    assert cfg["parameters"]["INTRA_OP_THREAD_COUNT"]["string_value"] == "2"
    cfg = tsrv.get("/v2/models/torch_params/config").json()
    assert [(g["count"], g["kind"]) for g in cfg["instance_group"]] == [(2, "KIND_CPU")]
    assert {k: v["string_value"] for k, v in cfg["parameters"].items()} == {
        "INFERENCE_MODE": "false", "DISABLE_OPTIMIZED_EXECUTION": "true",
        "ENABLE_JIT_PROFILING": "false", "ENABLE_TENSOR_FUSER": "false",
        "ENABLE_JIT_EXECUTOR": "false", "INTER_OP_THREAD_COUNT": "1",
        "ENABLE_CACHE_CLEANING": "true", "DISABLE_CUDNN": "true",
        "ENABLE_WEIGHT_SHARING": "true"}


# --------------------------------------------------------------------------------------------
# outputs equal torch.jit.load(model.pt)(inputs)


def _output_cases():
    for model in SMALL_MODELS:
        for binary in (False, True):
            batches = [1, 3] if SPECS[model]["mbs"] > 0 else [None]
            for batch in batches:
                mode = "binary" if binary else "json"
                yield pytest.param(model, binary, batch, id=f"{model}-{mode}-b{batch}")


@pytest.mark.parametrize("model,binary,batch", list(_output_cases()))
def test_outputs_match_torch(tsrv, torch_repo, model, binary, batch):
    feeds = make_feeds(model, batch, seed=zlib.crc32(f"{model}/{batch}".encode()))
    header, out = run(tsrv, model, feeds, binary)
    check(header, out, model, feeds, reference(torch_repo, model, feeds), batch)


def test_named_args_are_matched_by_name_not_position(tsrv, torch_repo):
    # config.pbtxt lists y before x; forward(x, y) returns x - y.
    x = np.array([10, 20, 30], dtype=np.int64)
    y = np.array([1, 2, 3], dtype=np.int64)
    for inputs in ([make_input("x", x, "INT64"), make_input("y", y, "INT64")],
                   [make_input("y", y, "INT64"), make_input("x", x, "INT64")]):
        r = infer(tsrv, "torch_named_args", inputs)
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT__0"], x - y)


def test_dict_output_requested_subset(tsrv, torch_repo):
    feeds = make_feeds("torch_dict_out", 2, seed=3)
    ref = reference(torch_repo, "torch_dict_out", feeds)
    for wanted in (["sum"], ["double"]):
        r = infer(tsrv, "torch_dict_out", [make_input("INPUT__0", feeds["INPUT__0"], "FP32")],
                  outputs=[{"name": n} for n in wanted])
        assert r.status_code == 200, r.text
        header, out = parse_response(r)
        assert [o["name"] for o in header["outputs"]] == wanted
        np.testing.assert_allclose(out[wanted[0]], ref[wanted[0]], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("pad", [1, 2, 3, 5])
def test_unaligned_binary_input(tsrv, torch_repo, pad):
    # The request id shifts the binary input to an offset that is not a multiple of 4.
    feeds = make_feeds("torch_linear", 3, seed=40 + pad)
    header, out = run(tsrv, "torch_linear", feeds, binary=True, request_id="r" * pad)
    assert header.get("id") == "r" * pad
    check(header, out, "torch_linear", feeds, reference(torch_repo, "torch_linear", feeds), 3)


# --------------------------------------------------------------------------------------------
# errors


def test_forward_exception_is_an_error_not_a_crash(tsrv, torch_repo):
    before = stats(tsrv, "torch_raises")
    bad = infer(tsrv, "torch_raises",
                [make_input("INPUT__0", np.array([[-1, 2]], np.float32), "FP32")])
    assert bad.status_code in (400, 500), f"HTTP {bad.status_code}: {bad.text[:500]}"
    assert_error(bad, bad.status_code, "negative input")
    assert tsrv.proc.poll() is None
    # Binary input: a JSON-input identity answer is test_output_that_is_the_input_tensor's topic.
    ok = infer(tsrv, "torch_raises",
               [make_input("INPUT__0", np.array([[1, 2]], np.float32), "FP32", binary=True)])
    assert ok.status_code == 200, ok.text
    np.testing.assert_array_equal(parse_response(ok)[1]["OUTPUT__0"], [[1, 2]])
    after = stats(tsrv, "torch_raises")
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1
    assert after["inference_stats"]["success"]["count"] == \
        before["inference_stats"]["success"]["count"] + 1


def test_wrong_input_datatype_is_refused(tsrv):
    r = infer(tsrv, "torch_linear", [make_input("INPUT__0", np.ones((1, 8), np.int32), "INT32")])
    assert_error(r, 400, "INPUT__0")


def test_bad_model_file_is_unavailable_with_reason(tsrv):
    idx = tsrv.post("/v2/repository/index", json={})
    assert idx.status_code == 200, idx.text
    entries = {e["name"]: e for e in idx.json()}
    entry = entries["torch_bad_file"]
    assert entry["state"] == "UNAVAILABLE"
    assert isinstance(entry.get("reason"), str) and entry["reason"].strip(), entry
    assert tsrv.get("/v2/models/torch_bad_file/ready").status_code != 200
    for name in READY_MODELS:
        assert entries[name]["state"] == "READY", entries[name]
        assert tsrv.get(f"/v2/models/{name}/ready").status_code == 200, name
    r = infer(tsrv, "torch_bad_file", [make_input("INPUT__0", np.ones((1, 2), np.float32), "FP32")])
    assert r.status_code in (400, 404, 503), r.text
    assert isinstance(r.json().get("error"), str)


# --------------------------------------------------------------------------------------------
# backend parameters


def test_parameters_and_weight_sharing(tsrv, torch_repo):
    x = np.random.default_rng(9).standard_normal((8, 8)).astype(np.float32)
    with futures.ThreadPoolExecutor(4) as pool:
        rs = list(pool.map(
            lambda i: infer(tsrv, "torch_params", [make_input("INPUT__0", x[i:i + 1], "FP32")],
                            session=requests.Session()), range(8)))
    ref = reference(torch_repo, "torch_params", {"INPUT__0": x})["OUTPUT__0"]
    # torch_params is a copy of torch_linear: the same weights give the same outputs.
    np.testing.assert_array_equal(ref, reference(torch_repo, "torch_linear", {"INPUT__0": x})["OUTPUT__0"])
    for i, r in enumerate(rs):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(parse_response(r)[1]["OUTPUT__0"], ref[i:i + 1],
                                   rtol=RTOL, atol=ATOL)
    log = Path(tsrv.log_path).read_text(errors="replace")
    # A WARNING line of its own per GPU-only key, saying what it would have done (issue 26).
    for key in ("ENABLE_CACHE_CLEANING", "DISABLE_CUDNN"):
        lines = [l for l in log.splitlines() if f"key '{key}'" in l and "torch_params" in l]
        assert len(lines) == 1 and lines[0].startswith("W"), (key, lines)
        assert "has no effect" in lines[0] and "inferd" in lines[0], lines


# --------------------------------------------------------------------------------------------
# ResNet-50 (dynamic batching, INTRA_OP_THREAD_COUNT)


@pytest.mark.resnet
@pytest.mark.parametrize("binary,batch", [(True, 1), (True, 3), (False, 1)],
                         ids=["binary-b1", "binary-b3", "json-b1"])
def test_resnet50_matches_torch(tsrv, torch_repo, binary, batch):
    rng = np.random.default_rng(batch)
    feeds = {"INPUT__0": rng.random((batch, 3, 224, 224), dtype=np.float32)}
    header, out = run(tsrv, "torch_resnet50", feeds, binary)
    check(header, out, "torch_resnet50", feeds, reference(torch_repo, "torch_resnet50", feeds),
          batch, rtol=1e-3, atol=1e-4)


@pytest.mark.resnet
def test_resnet50_concurrent_requests(tsrv, torch_repo):
    rng = np.random.default_rng(0)
    xs = [rng.random((1, 3, 224, 224), dtype=np.float32) for _ in range(8)]
    before = stats(tsrv, "torch_resnet50")

    def one(x):
        with requests.Session() as s:
            return infer(tsrv, "torch_resnet50", [make_input("INPUT__0", x, "FP32", binary=True)],
                         outputs=[{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
                         session=s)

    with futures.ThreadPoolExecutor(8) as pool:
        rs = list(pool.map(one, xs))
    ref = reference(torch_repo, "torch_resnet50", {"INPUT__0": np.concatenate(xs)})["OUTPUT__0"]
    for i, r in enumerate(rs):
        assert r.status_code == 200, r.text[:500]
        header, out = parse_response(r)
        assert header["outputs"][0]["shape"] == [1, 1000]
        np.testing.assert_allclose(out["OUTPUT__0"], ref[i:i + 1], rtol=1e-3, atol=1e-4)
    after = stats(tsrv, "torch_resnet50")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 8, (before, after)
    assert 1 <= executions <= inferences, (before, after)
    assert after["execution_count"] <= after["inference_count"]


# --------------------------------------------------------------------------------------------
# last: known divergence from Triton (keeps -x runs going through everything above)


def test_output_datatype_differing_from_config_is_an_error(tsrv):
    # forward() returns INT64 but config.pbtxt declares OUTPUT__0 TYPE_FP32. Triton's pytorch
    # backend fails the request ("configuration expects datatype TYPE_FP32 for output
    # 'OUTPUT__0', model provides TYPE_INT64"); answering with a tensor whose datatype contradicts
    # the model metadata is wrong.
    r = infer(tsrv, "torch_wrong_dtype",
              [make_input("INPUT__0", np.array([[1.5, 2.5]], np.float32), "FP32")])
    assert r.status_code in (400, 500), \
        f"expected an error, got HTTP {r.status_code}: {r.text[:500]}"
    assert_error(r, r.status_code, "OUTPUT__0", "FP32")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_output_that_is_the_input_tensor(tsrv, binary):
    # torch_raises returns its input tensor itself: for a single request the backend's input is
    # a view over the request's bytes, so the output aliases memory the request owns. The answer
    # must still carry the input values (JSON inputs are decoded into a buffer that the
    # response must not outlive).
    wrong = []
    for i in range(20):
        feeds = make_feeds("torch_raises", 1 + i % 4, seed=100 + i)
        _, out = run(tsrv, "torch_raises", feeds, binary=binary)
        if not np.array_equal(out["OUTPUT__0"], feeds["INPUT__0"]):
            wrong.append((feeds["INPUT__0"].tolist(), out["OUTPUT__0"].tolist()))
    assert not wrong, f"{len(wrong)}/20 answers differ from the input, e.g. sent/got {wrong[0]}"


# --------------------------------------------------------------------------------------------
# LibTorch is loaded on first use


def mapped_libraries(srv):
    return Path(f"/proc/{srv.proc.pid}/maps").read_text()


def test_libtorch_is_loaded_only_when_a_pytorch_model_loads(torch_repo, server_factory, make_repo):
    import shutil
    repo = make_repo({"simple": "simple"})
    shutil.copytree(torch_repo / "torch_linear", repo / "torch_linear")
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=simple"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 60, "simple")
    # Serving ONNX does not map LibTorch (nor the ~300 libraries Debian's build pulls in).
    assert "libtorch_cpu" not in mapped_libraries(srv)
    r = srv.post("/v2/repository/models/torch_linear/load", json={})
    assert r.status_code == 200, r.text
    assert "libtorch_cpu" in mapped_libraries(srv)
    assert "libinferd_backend_pytorch.so" in mapped_libraries(srv)
    x = np.ones((1, 8), np.float32)
    assert infer(srv, "torch_linear", [make_input("INPUT__0", x, "FP32")]).status_code == 200
    assert "loaded backend 'pytorch' from" in srv.log()


def test_missing_backend_library_fails_the_load_clearly(torch_repo, server_factory, make_repo, tmp_path):
    import shutil
    repo = make_repo({"simple": "simple"})
    shutil.copytree(torch_repo / "torch_linear", repo / "torch_linear")
    empty = tmp_path / "no_backends"
    empty.mkdir()
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=simple",
                                f"--backend-directory={empty}"])
    for _ in range(2):  # the failure is remembered, not retried
        r = srv.post("/v2/repository/models/torch_linear/load", json={})
        assert_error(r, 400, "backend 'pytorch' cannot be loaded from",
                     f"{empty}/libinferd_backend_pytorch.so")
    # Other models keep serving.
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200, r.text


def test_batched_output_that_is_the_input_tensor(torch_repo, server_factory, tmp_path):
    # torch_raises returns its input tensor itself. Under dynamic batching the backend gathers
    # the requests into the instance's batch buffer, which the next batch overwrites; the output
    # aliases that buffer, so each answer must be a copy made before the next batch runs
    # (backends/batch_io.h, LibTorch's AliasesAny).
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(torch_repo / "torch_raises", repo / "torch_raises")
    cfg = repo / "torch_raises" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "dynamic_batching { max_queue_delay_microseconds: 20000 }\n")
    srv = server_factory(repo)

    def one(i):
        rng = np.random.default_rng(1000 + i)
        x = (rng.random((1 + i % 2, 2), dtype=np.float32) + 1).astype(np.float32)  # >= 0
        with requests.Session() as s:
            r = infer(srv, "torch_raises", [make_input("INPUT__0", x, "FP32", binary=True)],
                      outputs=[{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
                      session=s)
        assert r.status_code == 200, r.text
        _, out = parse_response(r)
        return np.array_equal(out["OUTPUT__0"], x), x.shape[0]

    n = 96
    with futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(n)))
    wrong = sum(1 for ok, _ in results if not ok)
    assert wrong == 0, f"{wrong}/{n} answers differ from their input"
    st = srv.get("/v2/models/torch_raises/stats").json()["model_stats"][0]
    assert st["inference_count"] == sum(rows for _, rows in results)
    assert st["execution_count"] < n, st  # requests were batched together
