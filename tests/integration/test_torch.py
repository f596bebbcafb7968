"""The PyTorch backend: TorchScript models generated at test time, outputs compared with the
same model.pt run by torch in this process."""

import concurrent.futures as futures
import subprocess
import sys

import numpy as np
import pytest
import requests
import torch

from conftest import GEN_MODELS, start_server
from v2client import assert_error, infer, make_input, parse_response

GEN_TORCH = GEN_MODELS.parent / "gen_torch_models.py"


@pytest.fixture(scope="module")
def torch_repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_models")
    subprocess.run([sys.executable, str(GEN_TORCH), str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="module")
def tsrv(torch_repo, logs_dir):
    srv = start_server(torch_repo, ["--exit-on-error=false", "--strict-readiness=false"], logs_dir)
    srv.wait_until(lambda: srv.get("/v2/models/torch_linear/ready").status_code == 200, 60,
                   "torch models to load")
    yield srv
    assert srv.stop() == 0


def reference(repo, model, *inputs):
    m = torch.jit.load(str(repo / model / "1" / "model.pt"))
    m.eval()
    with torch.no_grad():
        return m(*[torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_linear_matches_torch(tsrv, torch_repo, binary, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
    r = infer(tsrv, "torch_linear", [make_input("INPUT__0", x, "FP32", binary=binary)])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_allclose(out["OUTPUT__0"], reference(torch_repo, "torch_linear", x).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_metadata_and_config(tsrv):
    md = tsrv.get("/v2/models/torch_two_io").json()
    assert md["platform"] == "pytorch_libtorch"
    assert [i["name"] for i in md["inputs"]] == ["INPUT__0", "INPUT__1"]
    cfg = tsrv.get("/v2/models/torch_two_io/config").json()
    assert cfg["backend"] == "pytorch" and cfg["platform"] == "pytorch_libtorch"
    assert cfg["default_model_filename"] == "model.pt"


def test_tuple_outputs(tsrv, torch_repo):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, dtype=np.float32)
    r = infer(tsrv, "torch_two_io", [make_input("INPUT__0", a, "FP32", binary=True),
                                     make_input("INPUT__1", b, "FP32")])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    s, p = reference(torch_repo, "torch_two_io", a, b)
    np.testing.assert_array_equal(out["OUTPUT__0"], s.numpy())
    np.testing.assert_array_equal(out["OUTPUT__1"], p.numpy())


def test_inputs_by_forward_argument_names(tsrv, torch_repo):
    x = np.array([10, 20, 30], dtype=np.int64)
    y = np.array([1, 2, 3], dtype=np.int64)
    r = infer(tsrv, "torch_named_args", [make_input("x", x, "INT64"), make_input("y", y, "INT64")])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT__0"], reference(torch_repo, "torch_named_args", x, y).numpy())
    np.testing.assert_array_equal(out["OUTPUT__0"], x - y)


def test_dict_output_and_requested_subset(tsrv, torch_repo):
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    r = infer(tsrv, "torch_dict_out", [make_input("INPUT__0", x, "FP32")])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    ref = reference(torch_repo, "torch_dict_out", x)
    np.testing.assert_allclose(out["sum"], ref["sum"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["double"], ref["double"].numpy(), rtol=1e-6)
    only = infer(tsrv, "torch_dict_out", [make_input("INPUT__0", x, "FP32")], outputs=[{"name": "sum"}])
    assert [o["name"] for o in only.json()["outputs"]] == ["sum"]


def test_dict_input(tsrv, torch_repo):
    a = np.array([[1, 2]], dtype=np.float32)
    b = np.array([[3, 4]], dtype=np.float32)
    r = infer(tsrv, "torch_dict_in", [make_input("A", a, "FP32"), make_input("B", b, "FP32")])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT__0"], a * 10 + b)


def test_forward_exception_is_an_error_not_a_crash(tsrv):
    bad = infer(tsrv, "torch_raises", [make_input("INPUT__0", np.array([[-1, 2]], np.float32), "FP32")])
    assert_error(bad, 500, "negative input")
    ok = infer(tsrv, "torch_raises", [make_input("INPUT__0", np.array([[1, 2]], np.float32), "FP32")])
    assert ok.status_code == 200
    _, out = parse_response(ok)
    np.testing.assert_array_equal(out["OUTPUT__0"], [[1, 2]])


def test_bad_model_file_is_unavailable_with_reason(tsrv):
    idx = tsrv.post("/v2/repository/index", json={}).json()
    entry = [e for e in idx if e["name"] == "torch_bad_file"][0]
    assert entry["state"] == "UNAVAILABLE"
    assert "cannot load" in entry["reason"]
    assert tsrv.get("/v2/models/torch_linear/ready").status_code == 200


def test_parameters_and_weight_sharing(tsrv, torch_repo):
    x = np.random.default_rng(9).standard_normal((4, 8)).astype(np.float32)
    with futures.ThreadPoolExecutor(4) as pool:
        rs = list(pool.map(lambda i: infer(tsrv, "torch_params", [make_input("INPUT__0", x[i:i + 1], "FP32")],
                                           session=requests.Session()), range(4)))
    ref = reference(torch_repo, "torch_params", x).numpy()
    for i, r in enumerate(rs):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(parse_response(r)[1]["OUTPUT__0"], ref[i:i + 1], rtol=1e-5, atol=1e-6)
    log = tsrv.log()
    assert "ENABLE_CACHE_CLEANING does not apply on CPU" in log
    assert "DISABLE_CUDNN does not apply on CPU" in log
    assert "ENABLE_WEIGHT_SHARING=1" in log


@pytest.mark.resnet
def test_resnet50_concurrent_batched(tsrv, torch_repo):
    rng = np.random.default_rng(0)
    xs = [rng.random((1, 3, 224, 224), dtype=np.float32) for _ in range(8)]
    with futures.ThreadPoolExecutor(8) as pool:
        rs = list(pool.map(lambda x: infer(tsrv, "torch_resnet50", [make_input("INPUT__0", x, "FP32", binary=True)],
                                           session=requests.Session()), xs))
    ref = reference(torch_repo, "torch_resnet50", np.concatenate(xs)).numpy()
    for i, r in enumerate(rs):
        assert r.status_code == 200, r.text[:200]
        np.testing.assert_allclose(parse_response(r)[1]["OUTPUT__0"], ref[i:i + 1], rtol=1e-3, atol=1e-4)
    st = tsrv.get("/v2/models/torch_resnet50/stats").json()["model_stats"][0]
    assert st["inference_count"] == 8 and st["execution_count"] <= 8
