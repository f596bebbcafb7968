"""A model repository in S3 (npm s3rver on loopback, installed by scripts/setup.sh): start-up,
the ETag-keyed cache across a restart, Triton's s3://host:port/bucket/prefix form, poll mode
noticing a changed object, and S3 failures that leave the server up and the model loadable
once S3 is back. The S3 code itself is unit-tested in tests/unit/sources_test.cc."""

from pathlib import Path

import numpy as np
import pytest

from conftest import free_port, launch

def check_simple(srv):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()}]}
    r = srv.post("/v2/models/simple/infer", json=body)
    assert r.status_code == 200, r.text
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def wait_ready(srv, model="simple", timeout=60):
    srv.wait_until(lambda: srv.get(f"/v2/models/{model}/ready").status_code == 200, timeout,
                   f"model {model} to be ready")


def snapshots(cache):
    """{relative path: (inode, mtime)} of every file under the cache's S3 folder."""
    root = Path(cache) / "s3"
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def test_serves_from_s3_and_a_restart_reuses_the_cache(s3, server_factory, example_models, tmp_path):
    s3.put_model("repo/simple", Path(example_models) / "simple")
    cache = tmp_path / "cache"
    srv = server_factory("s3://models/repo", [f"--model-cache-dir={cache}"])
    wait_ready(srv)
    check_simple(srv)
    before = snapshots(cache)
    assert any(k.endswith("/1/model.onnx") and "simple@" in k for k in before), before
    assert srv.stop() == 0
    # The same cache after a restart: the snapshot is used as it is, nothing downloaded again.
    srv = server_factory("s3://models/repo", [f"--model-cache-dir={cache}"])
    wait_ready(srv)
    check_simple(srv)
    assert snapshots(cache) == before


def test_tritons_host_port_form(s3, server_factory, example_models, tmp_path, monkeypatch):
    s3.put_model("repo/simple", Path(example_models) / "simple")
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the URL names the endpoint
    srv = server_factory(f"s3://127.0.0.1:{s3.port}/models/repo",
                         [f"--model-cache-dir={tmp_path / 'cache'}"])
    wait_ready(srv)
    check_simple(srv)


@pytest.mark.parametrize("case", ["no such bucket", "nothing listening"])
def test_a_repository_that_is_missing_or_unreachable_fails_the_start(
        s3, logs_dir, tmp_path, monkeypatch, case):
    url = "s3://models/repo"
    if case == "no such bucket":
        url = "s3://nosuchbucket/repo"
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    srv = launch([url], [f"--model-cache-dir={tmp_path / 'cache'}"], logs_dir)
    assert srv.proc.wait(timeout=60) != 0, srv.log()
    assert f"'{url}'" in srv.log(), srv.log()
    assert ("NoSuchBucket" if case == "no such bucket" else "cannot reach http://127.0.0.1:") \
        in srv.log(), srv.log()


def test_poll_mode_notices_a_changed_object(s3, server_factory, example_models, tmp_path):
    src = Path(example_models) / "simple"
    s3.put_model("repo/simple", src)
    srv = server_factory("s3://models/repo", [f"--model-cache-dir={tmp_path / 'cache'}",
                                             "--model-control-mode=poll",
                                             "--repository-poll-secs=1"])
    wait_ready(srv)
    assert srv.get("/v2/models/simple/config").json()["max_batch_size"] == 8
    # Only the config changes (a new ETag); the poller reloads the model from a new snapshot.
    config = (src / "config.pbtxt").read_text().replace("max_batch_size: 8", "max_batch_size: 4")
    s3.put("repo/simple/config.pbtxt", config.encode())
    srv.wait_until(lambda: srv.get("/v2/models/simple/config").json().get("max_batch_size") == 4,
                   30, "the poller to load the changed config")
    check_simple(srv)


def test_s3_down_fails_the_load_the_server_stays_up_and_the_load_works_once_it_is_back(
        s3, server_factory, example_models, tmp_path):
    s3.put_model("repo/simple", Path(example_models) / "simple")
    srv = server_factory("s3://models/repo", [f"--model-cache-dir={tmp_path / 'cache'}",
                                             "--model-control-mode=explicit"])
    s3.stop()
    r = srv.post("/v2/repository/models/simple/load")
    assert 400 <= r.status_code < 600 and "simple" in r.json()["error"], r.text
    assert srv.is_live()
    s3.start()
    r = srv.post("/v2/repository/models/simple/load")
    assert r.status_code == 200, r.text
    check_simple(srv)


def test_s3_down_is_a_5xx_naming_the_repository(s3, server_factory, example_models, tmp_path):
    s3.put_model("repo/simple", Path(example_models) / "simple")
    srv = server_factory("s3://models/repo", [f"--model-cache-dir={tmp_path / 'cache'}",
                                             "--model-control-mode=explicit"])
    s3.stop()
    r = srv.post("/v2/repository/models/simple/load")
    assert r.status_code == 503, r.text
    assert "s3://models/repo" in r.json()["error"] and "cannot reach" in r.json()["error"], r.text
