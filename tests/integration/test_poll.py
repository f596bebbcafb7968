"""Poll control mode: new models, new versions and removed models are picked up."""

import shutil

import numpy as np

from v2client import assert_unavailable, infer, make_input, parse_response

POLL_WAIT_S = 15  # --repository-poll-secs=1: a few poll periods plus load time


def ready(srv, path):
    return srv.get(path).status_code == 200


def not_ready(srv, path):
    return 400 <= srv.get(path).status_code < 500


def test_poll_mode(server_factory, make_repo, test_models, tmp_path):
    repo = make_repo({"onnx_identity_int32": "onnx_identity_int32",
                      "two_versions": "two_versions"})
    # Start with only version 1 of two_versions.
    staged_v2 = tmp_path / "staged_v2"
    shutil.move(str(repo / "two_versions" / "2"), staged_v2)
    srv = server_factory(repo, ["--model-control-mode=poll", "--repository-poll-secs=1"])
    srv.wait_until(lambda: ready(srv, "/v2/models/two_versions/versions/1/ready"), 30,
                   "two_versions v1 ready")
    assert srv.get("/v2/models/two_versions").json()["versions"] == ["1"]

    # A new model directory appears (staged elsewhere, then renamed in atomically).
    staged = tmp_path / "staged_model"
    shutil.copytree(test_models / "onnx_identity_fp32", staged)
    shutil.move(str(staged), str(repo / "onnx_identity_fp32"))
    srv.wait_until(lambda: ready(srv, "/v2/models/onnx_identity_fp32/ready"), POLL_WAIT_S,
                   "the added model to be loaded by the poller")
    x = np.array([[0.5, -1.5]], dtype=np.float32)
    r = infer(srv, "onnx_identity_fp32", [make_input("INPUT0", x, "FP32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], x)

    # A new version appears: latest policy switches to it.
    shutil.move(str(staged_v2), str(repo / "two_versions" / "2"))
    srv.wait_until(lambda: ready(srv, "/v2/models/two_versions/versions/2/ready"), POLL_WAIT_S,
                   "two_versions v2 to be loaded by the poller")
    srv.wait_until(lambda: not_ready(srv, "/v2/models/two_versions/versions/1/ready"),
                   POLL_WAIT_S, "two_versions v1 to be unloaded (latest policy)")
    r = infer(srv, "two_versions", [make_input("INPUT0", x, "FP32")])
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert hdr["model_version"] == "2"
    np.testing.assert_array_equal(out["OUTPUT0"], x + 2)

    # The config changes (version policy all): the model is reloaded with both versions.
    cfg_path = repo / "two_versions" / "config.pbtxt"
    cfg = cfg_path.read_text() + "version_policy: { all { } }\n"
    tmp_cfg = tmp_path / "config.pbtxt.new"
    tmp_cfg.write_text(cfg)
    shutil.move(str(tmp_cfg), str(cfg_path))
    srv.wait_until(lambda: ready(srv, "/v2/models/two_versions/versions/1/ready"), POLL_WAIT_S,
                   "two_versions v1 to be reloaded after the config change")
    assert ready(srv, "/v2/models/two_versions/versions/2/ready")
    r = infer(srv, "two_versions", [make_input("INPUT0", x, "FP32")], version=1)
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], x + 1)

    # A model directory disappears: the model is unloaded.
    shutil.rmtree(repo / "onnx_identity_fp32")
    srv.wait_until(lambda: not_ready(srv, "/v2/models/onnx_identity_fp32/ready"), POLL_WAIT_S,
                   "the removed model to be unloaded")
    assert_unavailable(infer(srv, "onnx_identity_fp32", [make_input("INPUT0", x, "FP32")]))
    # The untouched model kept serving throughout.
    assert ready(srv, "/v2/models/onnx_identity_int32/ready")


def test_poll_mode_rejects_explicit_load(server_factory, make_repo):
    repo = make_repo({"onnx_identity_int32": "onnx_identity_int32"})
    srv = server_factory(repo, ["--model-control-mode=poll", "--repository-poll-secs=1"])
    r = srv.post("/v2/repository/models/onnx_identity_int32/unload", json={})
    assert 400 <= r.status_code < 500 or r.status_code == 503, (r.status_code, r.text)
    assert ready(srv, "/v2/models/onnx_identity_int32/ready")
