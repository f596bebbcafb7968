"""One name serves one model on the SageMaker port: an invoke's X-Amzn-SageMaker-Target-Model
never loads an archive under the name of another model, nor is ignored for a loaded one (409
naming both); a missing target does not shadow a good one for the same name; what an invoke
loaded is listed by GET /models. Also: --http-restricted-api's model-repository category on the
SageMaker port's /models routes, and S3 fetch failures in inferd_model_loads_total."""

import shutil
import tarfile
from pathlib import Path

import numpy as np
import requests

from conftest import free_port

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
BODY = {"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.ravel().tolist()}]}


def archive(src, dest, arcname):
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(src, arcname=arcname)


def start(server_factory, repo, tmp_path, *extra):
    port = free_port()
    srv = server_factory(repo, ["--allow-sagemaker=true", f"--sagemaker-port={port}",
                                "--sagemaker-address=127.0.0.1", f"--model-cache-dir={tmp_path / 'cache'}",
                                *extra])
    srv.sm = f"http://127.0.0.1:{port}"
    return srv


def invoke(srv, name, target=None):
    headers = {"X-Amzn-SageMaker-Target-Model": target} if target else {}
    return requests.post(f"{srv.sm}/models/{name}/invoke", json=BODY, headers=headers, timeout=120)


def check_simple(r):
    assert r.status_code == 200, r.text
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def metric(srv, name):
    text = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the metrics")


def test_one_name_serves_one_model(server_factory, tmp_path, example_models, test_models):
    repo = tmp_path / "repo"
    repo.mkdir()
    # The repository's own `addc_1` (add/sub), and an archive of another model (identity).
    shutil.copytree(Path(example_models) / "simple", repo / "addc_1")
    text = (repo / "addc_1" / "config.pbtxt").read_text().replace('name: "simple"', 'name: "addc_1"')
    (repo / "addc_1" / "config.pbtxt").write_text(text)
    archive(Path(test_models) / "onnx_identity_int32", repo / "a3.tar.gz", "a3")
    archive(Path(example_models) / "simple", repo / "simple.tar.gz", "simple")
    srv = start(server_factory, repo, tmp_path, "--model-control-mode=on-demand")

    # Not loaded: a3 is never loaded under the repository model's name.
    r = invoke(srv, "addc_1", "a3.tar.gz")
    assert r.status_code == 409, r.text
    assert "'addc_1'" in r.json()["error"] and "'a3.tar.gz'" in r.json()["error"], r.text
    check_simple(srv.post("/v2/models/addc_1/infer", json=BODY))  # KServe clients get addc_1
    meta = srv.get("/v2/models/addc_1")
    assert meta.status_code == 200, meta.text
    assert [i["name"] for i in meta.json()["inputs"]] == ["INPUT0", "INPUT1"]
    # Loaded: the header is not ignored.
    r = invoke(srv, "addc_1", "a3.tar.gz")
    assert r.status_code == 409, r.text
    assert "'addc_1'" in r.json()["error"] and "'a3.tar.gz'" in r.json()["error"], r.text
    check_simple(invoke(srv, "addc_1"))

    # A name of no repository model binds to the target it was first loaded from.
    check_simple(invoke(srv, "h1", "simple.tar.gz"))
    check_simple(invoke(srv, "h1", "simple.tar.gz"))
    check_simple(invoke(srv, "h1"))
    r = invoke(srv, "h1", "a3.tar.gz")
    assert r.status_code == 409, r.text
    assert "'simple.tar.gz'" in r.json()["error"] and "'a3.tar.gz'" in r.json()["error"], r.text
    # ...and is listed with where it came from, as a model loaded by POST /models.
    listed = requests.get(f"{srv.sm}/models", timeout=30).json()["models"]
    assert [m["modelName"] for m in listed] == ["h1"], listed
    assert listed[0]["modelUrl"].endswith("simple.tar.gz"), listed
    got = requests.get(f"{srv.sm}/models/h1", timeout=30)
    assert got.status_code == 200 and got.json()["modelUrl"].endswith("simple.tar.gz"), got.text
    # Unloading it frees the name for another target.
    assert requests.delete(f"{srv.sm}/models/h1", timeout=60).status_code == 200
    r = invoke(srv, "h1", "a3.tar.gz")
    assert r.status_code == 400, r.text  # a3 runs, but has no INPUT1: a3 answers, not simple
    assert "INPUT1" in r.json()["error"], r.text

    # A missing target does not shadow a good one for the same name (no 404 for 2 s).
    r = invoke(srv, "h2", "missing.tar.gz")
    assert r.status_code == 404 and "missing.tar.gz" in r.json()["error"], r.text
    check_simple(invoke(srv, "h2", "simple.tar.gz"))


def test_sagemaker_model_routes_follow_the_restricted_api(server_factory, make_repo, tmp_path,
                                                          example_models):
    repo = make_repo({"simple": "simple"})
    srv = start(server_factory, repo, tmp_path, "--model-control-mode=explicit", "--load-model=simple",
                "--http-restricted-api=model-repository:admin-key=s3cret")
    src = tmp_path / "m"
    shutil.copytree(Path(example_models) / "simple", src / "m")
    load = {"model_name": "m", "url": str(src)}
    for headers in ({}, {"admin-key": "wrong"}):
        r = requests.post(f"{srv.sm}/models", json=load, headers=headers, timeout=60)
        assert r.status_code == 403 and "admin-key" in r.json()["error"], r.text
        r = requests.get(f"{srv.sm}/models", headers=headers, timeout=60)
        assert r.status_code == 403, r.text
    key = {"admin-key": "s3cret"}
    assert requests.post(f"{srv.sm}/models", json=load, headers=key, timeout=120).status_code == 200
    # Invocations are not in the category.
    check_simple(invoke(srv, "m"))
    r = requests.delete(f"{srv.sm}/models/m", timeout=60)
    assert r.status_code == 403 and "admin-key" in r.json()["error"], r.text
    check_simple(invoke(srv, "m"))
    assert requests.delete(f"{srv.sm}/models/m", headers=key, timeout=60).status_code == 200
    assert invoke(srv, "m").status_code == 404


def test_s3_fetch_failures_are_counted(s3, server_factory, make_repo, tmp_path):
    repo = make_repo({"simple": "simple"})
    srv = start(server_factory, repo, tmp_path, "--model-control-mode=explicit", "--load-model=simple")
    failures = 'inferd_model_loads_total{result="failure"}'
    before = metric(srv, failures)
    s3.put("archives/corrupt.tar.gz", b"\x1f\x8b\x08\x00not-a-gzip-stream" * 20)
    for url in ("s3://models/archives/missing.tar.gz", "s3://models/archives/corrupt.tar.gz"):
        r = requests.post(f"{srv.sm}/models", json={"model_name": "x", "url": url}, timeout=120)
        assert r.status_code == 400, r.text
    assert metric(srv, failures) == before + 2
