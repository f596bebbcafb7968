"""Statistics extension: GET v2/models[/${MODEL_NAME}[/versions/${MODEL_VERSION}]]/stats."""

import time

import numpy as np

from v2client import assert_4xx, infer, make_input

DURATION_KEYS = ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output"]


# Triton's keys, in its order (tritonserver.cc TRITONSERVER_ServerModelStatistics).
MODEL_STAT_KEYS = ["name", "version", "last_inference", "inference_count", "execution_count",
                   "inference_stats", "response_stats", "batch_stats", "memory_usage"]


def check_model_stat_format(st):
    assert list(st) == MODEL_STAT_KEYS, list(st)
    # Per response index, as a backend reports them; Triton's ONNX Runtime and PyTorch backends
    # report none, and neither do inferd's.
    assert st["response_stats"] == {}, st["response_stats"]
    assert isinstance(st["name"], str)
    assert isinstance(st["version"], str)
    for k in ("last_inference", "inference_count", "execution_count"):
        assert isinstance(st[k], int) and st[k] >= 0, (k, st)
    for k in DURATION_KEYS:
        d = st["inference_stats"][k]
        assert isinstance(d["count"], int) and isinstance(d["ns"], int), (k, d)
    assert isinstance(st["batch_stats"], list)
    for b in st["batch_stats"]:
        assert isinstance(b["batch_size"], int)
        for k in ("compute_input", "compute_infer", "compute_output"):
            assert isinstance(b[k]["count"], int) and isinstance(b[k]["ns"], int)


def get_stat(server, model, version=None):
    path = f"/v2/models/{model}"
    if version is not None:
        path += f"/versions/{version}"
    r = server.get(path + "/stats")
    assert r.status_code == 200, r.text
    stats = r.json()["model_stats"]
    assert len(stats) == 1, stats
    check_model_stat_format(stats[0])
    assert stats[0]["name"] == model
    return stats[0]


def batch_counts(st):
    return {b["batch_size"]: b["compute_infer"]["count"] for b in st["batch_stats"]}


def test_model_stats_counts(server):
    model = "onnx_identity_int16"
    before = get_stat(server, model)
    assert before["version"] == "1"
    t0_ms = int(time.time() * 1000)
    batches = [1, 2, 3, 2]
    for bs in batches:
        x = np.arange(bs * 5, dtype=np.int16).reshape(bs, 5)
        r = infer(server, model, [make_input("INPUT0", x, "INT16")])
        assert r.status_code == 200, r.text
    after = get_stat(server, model, version=1)
    n = len(batches)
    assert after["inference_count"] - before["inference_count"] == sum(batches)
    assert after["execution_count"] - before["execution_count"] == n
    isb, isa = before["inference_stats"], after["inference_stats"]
    assert isa["success"]["count"] - isb["success"]["count"] == n
    assert isa["fail"]["count"] == isb["fail"]["count"]
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert isa[k]["count"] - isb[k]["count"] == n, k
    assert isa["success"]["ns"] > isb["success"]["ns"]
    assert after["last_inference"] >= t0_ms - 1000
    assert after["last_inference"] <= int(time.time() * 1000) + 1000
    bb, ba = batch_counts(before), batch_counts(after)
    for bs in set(batches):
        assert ba.get(bs, 0) - bb.get(bs, 0) == batches.count(bs), (bs, ba, bb)


def test_failed_request_does_not_count_as_success(server):
    model = "onnx_identity_int8"
    before = get_stat(server, model)
    r = server.post(f"/v2/models/{model}/infer",
                    json={"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "INT8",
                                      "data": [1, 2]}]})
    assert r.status_code == 400
    after = get_stat(server, model)
    assert after["inference_count"] == before["inference_count"]
    assert after["execution_count"] == before["execution_count"]
    assert (after["inference_stats"]["success"]["count"]
            == before["inference_stats"]["success"]["count"])


def test_all_models_stats(server):
    r = server.get("/v2/models/stats")
    assert r.status_code == 200, r.text
    stats = r.json()["model_stats"]
    for st in stats:
        check_model_stat_format(st)
    pairs = {(s["name"], s["version"]) for s in stats}
    for expected in [("simple", "1"), ("identity_fp32", "1"), ("onnx_identity_int16", "1"),
                     ("two_versions_all", "1"), ("two_versions_all", "2"),
                     ("two_versions", "2")]:
        assert expected in pairs, (expected, sorted(pairs))


def test_stats_all_versions_of_model(server):
    r = server.get("/v2/models/two_versions_all/stats")
    assert r.status_code == 200
    versions = sorted(s["version"] for s in r.json()["model_stats"])
    assert versions == ["1", "2"]


def test_stats_unknown_model(server):
    r = server.get("/v2/models/no_such_model/stats")
    assert_4xx(r)
    assert "error" in r.json()


def test_stats_single_version(server):
    r = server.get("/v2/models/two_versions_all/versions/2/stats")
    assert r.status_code == 200, r.text
    stats = r.json()["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("two_versions_all", "2")]


def test_identity_backend_time_is_compute_infer(server, server_factory, tmp_path):
    """perf_analyzer's "Server:" line splits the backend's time into compute input / infer /
    output. The identity backend's work (the copy, and `execute_delay_ms` standing for a slow
    model) is its inference, as Triton's identity backend stamps it: compute_infer, which was
    always 0 ns here."""
    x = np.arange(256 * 1024, dtype=np.float32).reshape(1, -1)
    before = get_stat(server, "identity_fp32")["inference_stats"]
    r = infer(server, "identity_fp32", [make_input("INPUT0", x, "FP32")])
    assert r.status_code == 200, r.text
    after = get_stat(server, "identity_fp32")["inference_stats"]
    assert after["compute_infer"]["count"] - before["compute_infer"]["count"] == 1
    assert after["compute_infer"]["ns"] > before["compute_infer"]["ns"], (before, after)

    d = tmp_path / "repo" / "slow_identity"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(
        'name: "slow_identity"\nbackend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'parameters { key: "execute_delay_ms" value: { string_value: "40" } }\n')
    srv = server_factory(tmp_path / "repo")
    srv.wait_until(lambda: srv.get("/v2/models/slow_identity/ready").status_code == 200, 60,
                   "slow_identity ready")
    r = infer(srv, "slow_identity", [make_input("INPUT0", np.ones(4, np.float32), "FP32")])
    assert r.status_code == 200, r.text
    st = get_stat(srv, "slow_identity")["inference_stats"]
    # The delay is a lower bound whatever the machine's load; it is not compute input.
    assert st["compute_infer"]["ns"] >= 40_000_000, st
    assert st["compute_input"]["ns"] < 40_000_000, st
