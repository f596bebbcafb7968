"""Model repository extension (index / load / unload), control modes, broken models."""

import json
import subprocess

import numpy as np

from v2client import assert_4xx, assert_unavailable, infer, make_input, parse_response


def index(srv, ready=None):
    body = {} if ready is None else {"ready": ready}
    r = srv.post("/v2/repository/index", json=body)
    assert r.status_code == 200, r.text
    entries = r.json()
    assert isinstance(entries, list)
    for e in entries:
        assert isinstance(e["name"], str)
    return entries


def entries_for(entries, name):
    return [e for e in entries if e["name"] == name]


def add_const(srv, model, version=None):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    r = infer(srv, model, [make_input("INPUT0", x, "FP32")], version=version)
    assert r.status_code == 200, r.text
    return float((parse_response(r)[1]["OUTPUT0"] - x).flat[0])


# ---- index on the main server (control mode none) ------------------------------------------


def test_index_lists_models_with_state(server):
    entries = index(server)
    names = {e["name"] for e in entries}
    for m in ("simple", "identity_fp32", "add_sub_autocomplete", "two_versions_all"):
        assert m in names, names
    simple = entries_for(entries, "simple")
    assert [(e.get("version"), e.get("state")) for e in simple] == [("1", "READY")]
    versions = sorted((e.get("version"), e.get("state"))
                      for e in entries_for(entries, "two_versions_all"))
    assert versions == [("1", "READY"), ("2", "READY")]
    for e in entries:
        assert "reason" not in e or isinstance(e["reason"], str)


def test_index_ready_only(server):
    entries = index(server, ready=True)
    assert entries, "no ready models"
    assert all(e.get("state") == "READY" for e in entries), entries


def test_index_empty_body(server):
    r = server.post("/v2/repository/index", data=b"")
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), list)


def assert_rejected(r):
    # Triton answers UNAVAILABLE for load/unload outside explicit mode: 4xx or 503.
    assert 400 <= r.status_code < 500 or r.status_code == 503, (r.status_code, r.text)
    assert isinstance(r.json().get("error"), str)


def test_load_unload_rejected_when_not_explicit(server):
    assert_rejected(server.post("/v2/repository/models/simple/unload", json={}))
    assert_rejected(server.post("/v2/repository/models/simple/load", json={}))
    # Nothing was unloaded.
    assert server.get("/v2/models/simple/ready").status_code == 200


# ---- explicit control mode -----------------------------------------------------------------


def two_versions_config_json(policy):
    return json.dumps({
        "name": "two_versions",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 8,
        "version_policy": policy,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    })


def test_explicit_load_unload(server_factory, make_repo):
    repo = make_repo({"onnx_identity_int32": "onnx_identity_int32",
                      "two_versions": "two_versions",
                      "simple": "simple"})
    srv = server_factory(repo, ["--model-control-mode=explicit",
                                "--load-model=onnx_identity_int32"])
    srv.wait_until(lambda: srv.get("/v2/models/onnx_identity_int32/ready").status_code == 200,
                   30, "onnx_identity_int32 to be ready")
    assert_4xx(srv.get("/v2/models/two_versions/ready"))
    assert_4xx(srv.get("/v2/models/simple/ready"))
    # The index lists every model in the repository, loaded or not.
    entries = index(srv)
    assert {"onnx_identity_int32", "two_versions", "simple"} <= {e["name"] for e in entries}
    assert [e.get("state") for e in entries_for(entries, "onnx_identity_int32")] == ["READY"]
    assert all(e.get("state") != "READY" for e in entries_for(entries, "two_versions"))
    # Inference on a model that is not loaded fails.
    x = np.ones((1, 4), dtype=np.float32)
    assert_unavailable(infer(srv, "two_versions", [make_input("INPUT0", x, "FP32")]))

    # Load (empty body allowed).
    r = srv.post("/v2/repository/models/two_versions/load")
    assert r.status_code == 200, r.text
    assert srv.get("/v2/models/two_versions/ready").status_code == 200
    assert add_const(srv, "two_versions") == 2.0
    assert_4xx(srv.get("/v2/models/two_versions/versions/1/ready"))

    # Reload with a config override: version_policy all -> both versions.
    r = srv.post("/v2/repository/models/two_versions/load",
                 json={"parameters": {"config": two_versions_config_json({"all": {}})}})
    assert r.status_code == 200, r.text
    for v in (1, 2):
        assert srv.get(f"/v2/models/two_versions/versions/{v}/ready").status_code == 200
        assert add_const(srv, "two_versions", version=v) == float(v)
    cfg = srv.get("/v2/models/two_versions/config").json()
    assert "all" in cfg["version_policy"], cfg

    # Unload.
    r = srv.post("/v2/repository/models/two_versions/unload", json={})
    assert r.status_code == 200, r.text
    assert_4xx(srv.get("/v2/models/two_versions/ready"))
    assert_unavailable(infer(srv, "two_versions", [make_input("INPUT0", x, "FP32")]))
    states = {e.get("state") for e in entries_for(index(srv), "two_versions")}
    assert "READY" not in states, states
    # The other model is untouched.
    assert srv.get("/v2/models/onnx_identity_int32/ready").status_code == 200

    # Load a model that does not exist: Triton's words, which scripts written against Triton
    # look for (its L0_lifecycle does), then what is missing.
    r = srv.post("/v2/repository/models/not_in_repo/load", json={})
    assert_4xx(r)
    assert ("failed to load 'not_in_repo', failed to poll from model repository"
            in r.json()["error"]), r.text
    assert "no model folder 'not_in_repo'" in r.json()["error"], r.text

    # Load with a config that is not valid JSON.
    r = srv.post("/v2/repository/models/simple/load",
                 json={"parameters": {"config": "{this is not json"}})
    assert_4xx(r)
    # Triton's words: tritonclient's simple_http_model_control.py looks for "failed to load".
    assert r.json()["error"].startswith("failed to load 'simple': Invalid config override: "), r.text
    assert_4xx(srv.get("/v2/models/simple/ready"))

    # And a plain load of simple works afterwards.
    r = srv.post("/v2/repository/models/simple/load", json={})
    assert r.status_code == 200, r.text
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], a * 2)


def test_unload_of_a_model_not_loaded_succeeds_and_changes_nothing(server_factory, make_repo):
    """Triton's unload of a name it has not loaded does nothing and answers 200 (its
    L0_lifecycle: "Unload non-existing model, nothing should happen"); tritonclient's
    unload_model raises on anything else, and clients unload unconditionally in teardown."""
    repo = make_repo({"simple": "simple", "two_versions": "two_versions"})
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=simple"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30,
                   "simple to be ready")
    before = index(srv)
    # A name no repository holds, and a repository model that was never loaded.
    for name in ("not_in_repo", "two_versions"):
        r = srv.post(f"/v2/repository/models/{name}/unload", json={})
        assert r.status_code == 200, r.text
        r = srv.post(f"/v2/repository/models/{name}/unload",
                     json={"parameters": {"unload_dependents": True}})
        assert r.status_code == 200, r.text
    assert index(srv) == before
    assert srv.get("/v2/models/simple/ready").status_code == 200
    # Unloading twice: the second is the same no-op.
    for _ in range(2):
        r = srv.post("/v2/repository/models/simple/unload", json={})
        assert r.status_code == 200, r.text
    assert_4xx(srv.get("/v2/models/simple/ready"))


def test_explicit_unloaded_model_index_state(server_factory, make_repo):
    """Like Triton, an unloaded model stays in the index as UNAVAILABLE (reason "unloaded")."""
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=simple"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30,
                   "simple to be ready")
    r = srv.post("/v2/repository/models/simple/unload", json={})
    assert r.status_code == 200, r.text
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code != 200, 10,
                   "simple to be unloaded")
    entries = entries_for(index(srv), "simple")
    assert [(e.get("version"), e.get("state")) for e in entries] == [("1", "UNAVAILABLE")], \
        entries


def test_explicit_load_model_star(server_factory, make_repo):
    repo = make_repo({"onnx_identity_int32": "onnx_identity_int32", "simple": "simple"})
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=*"])
    for m in ("onnx_identity_int32", "simple"):
        srv.wait_until(lambda: srv.get(f"/v2/models/{m}/ready").status_code == 200, 30,
                       f"{m} to be ready")


def test_explicit_no_models_loaded(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    assert_4xx(srv.get("/v2/models/simple/ready"))
    assert [e["name"] for e in index(srv)] == ["simple"]
    assert index(srv, ready=True) == []
    # Strict readiness only considers models that were asked to load: none, so ready.
    assert srv.get("/v2/health/ready").status_code == 200


def test_explicit_repeated_load_model(server_factory, make_repo):
    repo = make_repo({"onnx_identity_int32": "onnx_identity_int32", "simple": "simple",
                      "two_versions": "two_versions"})
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=simple",
                                "--load-model=two_versions"])
    for m in ("simple", "two_versions"):
        srv.wait_until(lambda: srv.get(f"/v2/models/{m}/ready").status_code == 200, 30,
                       f"{m} to be ready")
    assert_4xx(srv.get("/v2/models/onnx_identity_int32/ready"))


def test_multiple_repositories(server_factory, make_repo):
    repo_a = make_repo({"simple": "simple"})
    repo_b = make_repo({"onnx_identity_int32": "onnx_identity_int32"})
    srv = server_factory([repo_a, repo_b])
    for m in ("simple", "onnx_identity_int32"):
        srv.wait_until(lambda: srv.get(f"/v2/models/{m}/ready").status_code == 200, 30,
                       f"{m} to be ready")


# ---- broken models -------------------------------------------------------------------------


def test_broken_config_is_unavailable_others_serve(server_factory, make_repo):
    repo = make_repo({"broken_config": "broken_config",
                      "mismatched_config": "mismatched_config",
                      "onnx_identity_int32": "onnx_identity_int32"})
    srv = server_factory(repo, ["--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/onnx_identity_int32/ready").status_code == 200,
                   30, "onnx_identity_int32 to be ready")
    entries = index(srv)
    broken = entries_for(entries, "broken_config")
    assert broken, entries
    for e in broken:
        assert e.get("state") == "UNAVAILABLE", e
        assert isinstance(e.get("reason"), str) and e["reason"].strip(), e
    assert_4xx(srv.get("/v2/models/broken_config/ready"))
    # A config that disagrees with the ONNX model (datatype of INPUT0) fails to load too.
    mism = entries_for(entries, "mismatched_config")
    assert mism and all(e.get("state") == "UNAVAILABLE" for e in mism), mism
    assert any("INPUT0" in (e.get("reason") or "") for e in mism), mism
    assert_4xx(srv.get("/v2/models/mismatched_config/ready"))
    r = infer(srv, "broken_config",
              [make_input("INPUT0", np.ones((1, 2), dtype=np.float32), "FP32")])
    assert_unavailable(r)
    # Strict readiness (the default): not every model is ready, so the server is not ready.
    assert_4xx(srv.get("/v2/health/ready"))
    assert srv.get("/v2/health/live").status_code == 200
    # The good model serves.
    x = np.array([[1, -2, 3]], dtype=np.int32)
    r = infer(srv, "onnx_identity_int32", [make_input("INPUT0", x, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], x)


def test_broken_config_without_strict_readiness(server_factory, make_repo):
    repo = make_repo({"broken_config": "broken_config",
                      "onnx_identity_int32": "onnx_identity_int32"})
    srv = server_factory(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    srv.wait_until(lambda: srv.get("/v2/models/onnx_identity_int32/ready").status_code == 200,
                   30, "onnx_identity_int32 to be ready")
    assert srv.get("/v2/health/ready").status_code == 200


def test_broken_config_exit_on_error(server_factory, make_repo):
    """--exit-on-error defaults to true: a model that fails to load stops the server."""
    repo = make_repo({"broken_config": "broken_config",
                      "onnx_identity_int32": "onnx_identity_int32"})
    srv = server_factory(repo, [], wait_live=False)
    try:
        rc = srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"server still running with a broken model\n{srv.log()}")
    assert rc != 0, srv.log()
    assert "broken_config" in srv.log()


def test_model_without_config_or_model_file_names_the_problem(server_factory, make_repo):
    # A folder with a version directory but neither config.pbtxt nor a known model file: Triton
    # cannot tell the backend either. The reason must say so, not name an empty backend.
    repo = make_repo({"onnx_identity_int32": "onnx_identity_int32"})
    (repo / "empty_model" / "1").mkdir(parents=True)
    srv = server_factory(repo, ["--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/onnx_identity_int32/ready").status_code == 200,
                   30, "onnx_identity_int32 to be ready")
    entries = entries_for(index(srv), "empty_model")
    assert entries and all(e.get("state") == "UNAVAILABLE" for e in entries), entries
    assert entries[0]["reason"] == (
        "model 'empty_model': cannot tell which backend serves it: config.pbtxt sets neither "
        "'backend' nor 'platform', no version folder holds model.onnx, model.pt or model.py, "
        "and the model name is not of the form '<model>.<backend>'"), entries
