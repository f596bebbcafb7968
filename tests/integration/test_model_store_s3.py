"""The model store with an S3 repository (npm s3rver on loopback, installed by
scripts/setup.sh): `--model-repository=s3://bucket/prefix` at start, poll mode noticing a
changed ETag, on-demand loads from S3 and the ETag-keyed cache surviving a restart, S3 going
down during a load (a clear 503, the server stays up, the model loads once S3 is back), and a
bucket that does not exist failing the start."""

import time
from pathlib import Path

import numpy as np
import requests

from conftest import launch
from v2client import infer, make_input, parse_response

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 9, dtype=np.int32)


def simple_inputs():
    return [make_input("INPUT0", A, "INT32", binary=True), make_input("INPUT1", B, "INT32", binary=True)]


def check_simple(r):
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def metric(srv, name):
    text = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the metrics")


def test_s3_repository_at_start_and_poll_notices_a_changed_etag(s3, server_factory, example_models,
                                                                tmp_path):
    for name in ("a", "b"):
        s3.put_model(f"repo/{name}", Path(example_models) / "simple", name=name)
    srv = server_factory("s3://models/repo", ["--model-control-mode=poll", "--repository-poll-secs=1",
                                              f"--model-cache-dir={tmp_path / 'cache'}"])
    for name in ("a", "b"):
        srv.wait_until(lambda: srv.get(f"/v2/models/{name}/ready").status_code == 200, 60, f"{name} ready")
        check_simple(infer(srv, name, simple_inputs()))
    assert srv.get("/v2/models/a/config").json()["max_batch_size"] == 8
    # A new config.pbtxt (a new ETag): the poll reloads `a` with it.
    cfg = (Path(example_models) / "simple" / "config.pbtxt").read_text()
    s3.put("repo/a/config.pbtxt", cfg.replace('"simple"', '"a"').replace("max_batch_size: 8", "max_batch_size: 4").encode())
    srv.wait_until(lambda: srv.get("/v2/models/a/config").json().get("max_batch_size") == 4, 30,
                   "a reloaded with the new config")
    check_simple(infer(srv, "a", simple_inputs()))
    # A model added to the bucket is loaded; one removed is unloaded.
    s3.put_model("repo/c", Path(example_models) / "simple", name="c")
    srv.wait_until(lambda: srv.get("/v2/models/c/ready").status_code == 200, 30, "c loaded")
    for key in ("repo/b/config.pbtxt", "repo/b/1/model.onnx"):
        requests.delete(f"{s3.endpoint}/models/{key}", timeout=10)
    srv.wait_until(lambda: srv.get("/v2/models/b/ready").status_code != 200, 30, "b unloaded")
    assert metric(srv, "inferd_model_download_bytes_total") > 0


def test_on_demand_from_s3_and_the_cache_survives_a_restart(s3, server_factory, example_models,
                                                            tmp_path, logs_dir):
    s3.put_model("p/m", Path(example_models) / "simple", name="m")
    args = ["--model-control-mode=on-demand", f"--model-cache-dir={tmp_path / 'cache'}"]
    srv = server_factory("s3://models/p", args)
    check_simple(infer(srv, "m", simple_inputs()))
    assert metric(srv, "inferd_model_fetch_cache_hits_total") == 0
    assert srv.stop() == 0
    # Restarted on the same cache: the same ETags, nothing downloaded again.
    srv = server_factory("s3://models/p", args)
    check_simple(infer(srv, "m", simple_inputs()))
    assert metric(srv, "inferd_model_fetch_cache_hits_total") == 1
    assert metric(srv, "inferd_model_download_bytes_total") == 0


def test_s3_down_during_a_load_then_back(s3, server_factory, example_models, tmp_path):
    s3.put_model("p/m", Path(example_models) / "simple", name="m")
    srv = server_factory("s3://models/p", ["--model-control-mode=on-demand",
                                           f"--model-cache-dir={tmp_path / 'cache'}"])
    s3.stop()
    r = infer(srv, "m", simple_inputs())
    assert r.status_code == 503, r.text
    assert "s3://models/p" in r.json()["error"], r.text
    assert srv.get("/v2/health/live").status_code == 200
    s3.start()
    time.sleep(5.2)  # a failed load is tried again after 5 s
    check_simple(infer(srv, "m", simple_inputs()))


def test_a_bucket_that_does_not_exist_fails_the_start(s3, tmp_path, logs_dir):
    srv = launch(["s3://no-such-bucket/models"], [f"--model-cache-dir={tmp_path / 'cache'}"], logs_dir)
    assert srv.proc.wait(timeout=60) == 1
    assert "s3://no-such-bucket" in srv.log(), srv.log()
