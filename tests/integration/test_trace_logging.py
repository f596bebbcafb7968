"""The trace and logging extensions and their flags (docs/trace_and_logging.md).

Trace: settings through /v2[/models/<m>]/trace/setting and --trace-config change which
requests are written to the trace file, in tritonserver's JSON trace format; the file is read
back and checked (ids, model, request ids picked by the rate, the count, ordered timestamps).
Logging: settings through /v2/logging and the --log-* flags change the lines the server
actually writes (read back from its output)."""

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import INFERD_BIN, NO_GRPC, free_port
from v2client import infer, make_input

MODEL = "identity_fp32"
STAGES = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
          "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


def send(srv, n, model=MODEL, prefix="r"):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for i in range(1, n + 1):
        r = infer(srv, model, [make_input("INPUT0", x, "FP32")], request_id=f"{prefix}{i}")
        assert r.status_code == 200, r.text


def wait_file(path, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass  # still being written
        time.sleep(0.05)
    raise AssertionError(f"no complete trace file {path} after {timeout}s: "
                         f"{sorted(p.name for p in path.parent.iterdir())}")


def traces(entries):
    """tritonserver's layout -> {id: {"model_name", "model_version", "request_id", "ts": [...]}}"""
    out = {}
    for e in entries:
        t = out.setdefault(e["id"], {"ts": []})
        if "model_name" in e:
            t["model_name"] = e["model_name"]
            t["model_version"] = e["model_version"]
            t["request_id"] = e.get("request_id")
        for s in e.get("timestamps", []):
            t["ts"].append((s["name"], s["ns"]))
    for tid, t in out.items():
        assert "model_name" in t, f"trace {tid} has no model object: {entries}"
        names = [n for n, _ in t["ts"]]
        assert names == STAGES, f"trace {tid}: stages {names}"
        ns = [v for _, v in t["ts"]]
        assert all(isinstance(v, int) and v > 0 for v in ns), ns
        assert ns == sorted(ns), f"trace {tid}: timestamps out of order {t['ts']}"
    return out


def post_trace(srv, body, model=None):
    path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
    return srv.post(path, json=body)


@pytest.fixture
def repo(make_repo):
    return make_repo({MODEL: MODEL, "simple": "simple"})


def test_rate_and_count_through_the_api(server_factory, repo, tmp_path):
    tfile = tmp_path / "trace.json"
    srv = server_factory(repo, [f"--trace-config=triton,file={tfile}"])
    r = srv.get("/v2/trace/setting")
    assert r.status_code == 200, r.text
    assert r.json() == {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                        "log_frequency": "0", "trace_file": str(tfile), "trace_mode": "triton"}
    send(srv, 3, prefix="off")  # level OFF: nothing sampled
    r = post_trace(srv, {"trace_level": ["TIMESTAMPS"], "trace_rate": "3", "trace_count": "4"})
    assert r.status_code == 200, r.text
    assert r.json()["trace_level"] == ["TIMESTAMPS"] and r.json()["trace_rate"] == "3"
    send(srv, 20)
    # Every 3rd request from the update on, 4 of them; the count used up writes "<file>.0".
    got = traces(wait_file(Path(f"{tfile}.0")))
    assert sorted(t["request_id"] for t in got.values()) == sorted(["r3", "r6", "r9", "r12"])
    for t in got.values():
        assert t["model_name"] == MODEL and t["model_version"] == 1
    assert srv.get("/v2/trace/setting").json()["trace_count"] == "0"
    send(srv, 6, prefix="after")
    time.sleep(0.3)
    assert not Path(f"{tfile}.1").exists()  # count 0: no more traces


def test_log_frequency_and_model_setting_overrides_global(server_factory, repo, tmp_path):
    tfile = tmp_path / "t.json"
    srv = server_factory(repo, [f"--trace-config=triton,file={tfile}",
                                "--trace-config", "triton,log-frequency=2"])
    r = post_trace(srv, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, model=MODEL)
    assert r.status_code == 200, r.text
    assert r.json()["trace_level"] == ["TIMESTAMPS"] and r.json()["log_frequency"] == "2"
    assert srv.get("/v2/trace/setting").json()["trace_level"] == ["OFF"]
    # The global setting (OFF) applies to simple.
    x = np.ones((1, 16), dtype=np.int32)
    for i in range(3):
        r = infer(srv, "simple", [make_input("INPUT0", x, "INT32"), make_input("INPUT1", x, "INT32")],
                  request_id=f"s{i}")
        assert r.status_code == 200, r.text
    send(srv, 4)
    first = traces(wait_file(Path(f"{tfile}.0")))
    second = traces(wait_file(Path(f"{tfile}.1")))
    assert len(first) == 2 and len(second) == 2
    ids = sorted(t["request_id"] for t in list(first.values()) + list(second.values()))
    assert ids == ["r1", "r2", "r3", "r4"]
    assert {t["model_name"] for t in first.values()} == {MODEL}
    # Clearing every field hands the model back to the global setting (OFF).
    r = post_trace(srv, {"trace_level": None, "trace_rate": None}, model=MODEL)
    assert r.status_code == 200, r.text
    assert r.json()["trace_level"] == ["OFF"]
    send(srv, 4, prefix="x")
    time.sleep(0.3)
    assert not Path(f"{tfile}.2").exists()


def test_flags_trace_and_file_written_at_exit(server_factory, repo, tmp_path):
    tfile = tmp_path / "exit.json"
    srv = server_factory(repo, [f"--trace-config=triton,file={tfile}", "--trace-config=level=TIMESTAMPS",
                                "--trace-config=rate=2", "--trace-config=mode=triton"])
    assert srv.get("/v2/trace/setting").json()["trace_level"] == ["TIMESTAMPS"]
    send(srv, 6)
    assert srv.stop() == 0
    got = traces(json.loads(tfile.read_text()))
    assert sorted(t["request_id"] for t in got.values()) == ["r2", "r4", "r6"]


def test_trace_setting_errors(server_factory, repo, tmp_path):
    srv = server_factory(repo, [])
    # No trace file: a level other than OFF cannot be set.
    r = post_trace(srv, {"trace_level": ["TIMESTAMPS"]})
    assert r.status_code == 400 and "trace file" in r.json()["error"], r.text
    r = post_trace(srv, {"trace_file": "/tmp/x.json"})
    assert r.status_code == 501 and "can not be updated" in r.json()["error"], r.text
    r = post_trace(srv, {"trace_level": ["TENSORS"]})
    assert r.status_code == 400 and "TENSORS" in r.json()["error"], r.text
    r = post_trace(srv, {"trace_rate": "often"})
    assert r.status_code == 400 and "trace_rate" in r.json()["error"], r.text
    r = post_trace(srv, {"trace_count": "-5"})
    assert r.status_code == 400 and "trace_count" in r.json()["error"], r.text
    r = post_trace(srv, {"trace_levle": ["OFF"]})
    assert r.status_code == 400 and "trace_levle" in r.json()["error"], r.text
    r = post_trace(srv, {"trace_rate": "5"}, model="no_such_model")
    assert r.status_code == 400 and "no_such_model" in r.json()["error"], r.text
    r = srv.post("/v2/trace/setting", data=b"{not json")
    assert r.status_code == 400, r.text
    # Nothing above changed the setting.
    assert srv.get("/v2/trace/setting").json()["trace_rate"] == "1000"
    ext = srv.get("/v2").json()["extensions"]
    assert "trace" in ext and "logging" in ext


@pytest.mark.parametrize("args, words", [
    (["--trace-config=mode=opentelemetry"], ["OpenTelemetry", "not supported"]),
    (["--trace-config=opentelemetry,url=localhost:4318"], ["OpenTelemetry", "not supported"]),
    (["--trace-config=level=TENSORS", "--trace-config=triton,file=/tmp/t.json"], ["TENSORS"]),
    (["--trace-config=level=TIMESTAMPS"], ["trace file"]),
    (["--trace-config=rate"], ["format"]),
    (["--trace-config=triton,colour=red"], ["colour"]),
    (["--trace-rate=abc"], ["trace-rate"]),
])
def test_trace_flags_refused(tmp_path, args, words):
    if not INFERD_BIN.exists():
        pytest.skip("no inferd binary")
    p = subprocess.run([str(INFERD_BIN), f"--model-repository={tmp_path}",
                        f"--http-port={free_port()}", "--allow-grpc=false", "--allow-metrics=false"]
                       + args, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stderr)
    for w in words:
        assert w in p.stderr, p.stderr


def log_since(srv, mark):
    return Path(srv.log_path).read_text(errors="replace")[mark:]


def log_mark(srv):
    return len(Path(srv.log_path).read_text(errors="replace"))


def test_logging_settings_change_the_output(server_factory, repo):
    srv = server_factory(repo, ["--model-control-mode=explicit", f"--load-model={MODEL}"])
    r = srv.get("/v2/logging")
    assert r.status_code == 200, r.text
    assert r.json() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                        "log_verbose_level": 0, "log_format": "default"}
    # Verbose lines (one per HTTP request) appear only while the level is above 0.
    m = log_mark(srv)
    srv.get("/v2/health/live?probe=before")
    assert "HTTP request: GET /v2/health/live" not in log_since(srv, m)
    r = srv.post("/v2/logging", json={"log_verbose_level": 1})
    assert r.status_code == 200 and r.json()["log_verbose_level"] == 1, r.text
    m = log_mark(srv)
    srv.get(f"/v2/models/{MODEL}/ready")
    assert f"HTTP request: GET /v2/models/{MODEL}/ready" in log_since(srv, m)
    srv.post("/v2/logging", json={"log_verbose_level": 0})
    m = log_mark(srv)
    srv.get(f"/v2/models/{MODEL}/ready")
    assert "HTTP request" not in log_since(srv, m)
    # log_info=false silences the "loaded model" line; true brings it back.
    r = srv.post("/v2/logging", json={"log_info": False})
    assert r.status_code == 200 and r.json()["log_info"] is False, r.text
    m = log_mark(srv)
    assert srv.post("/v2/repository/models/simple/load").status_code == 200
    assert "loaded model 'simple'" not in log_since(srv, m)
    srv.post("/v2/logging", json={"log_info": True, "log_format": "ISO8601"})
    assert srv.post("/v2/repository/models/simple/unload").status_code == 200
    m = log_mark(srv)
    assert srv.post("/v2/repository/models/simple/load").status_code == 200
    lines = [l for l in log_since(srv, m).splitlines() if "loaded model 'simple'" in l]
    assert lines, log_since(srv, m)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I ", lines[0]), lines[0]
    # Errors: nothing changes.
    r = srv.post("/v2/logging", json={"log_file": "/tmp/other.log"})
    assert r.status_code == 501 and "log file" in r.json()["error"], r.text
    r = srv.post("/v2/logging", json={"log_format": "json", "log_info": False})
    assert r.status_code == 400 and "json" in r.json()["error"], r.text
    r = srv.post("/v2/logging", json={"log_info": "yes"})
    assert r.status_code == 400 and "log_info" in r.json()["error"], r.text
    r = srv.post("/v2/logging", json={"log_colour": True})
    assert r.status_code == 400 and "log_colour" in r.json()["error"], r.text
    assert srv.get("/v2/logging").json()["log_info"] is True


def test_log_flags_take_effect(server_factory, repo, tmp_path):
    logfile = tmp_path / "inferd.log"
    srv = server_factory(repo, ["--log-verbose=1", "--log-info=false", f"--log-file={logfile}",
                                "--log-format=ISO8601"])
    assert srv.get("/v2/logging").json() == {
        "log_file": str(logfile), "log_info": False, "log_warning": True, "log_error": True,
        "log_verbose_level": 1, "log_format": "ISO8601"}
    srv.get(f"/v2/models/{MODEL}/ready")
    text = logfile.read_text()
    assert f"HTTP request: GET /v2/models/{MODEL}/ready" in text
    assert "loaded model" not in text  # --log-info=false
    assert all(re.match(r"\d{4}-\d\d-\d\dT", l) for l in text.splitlines() if " V " in l)
    assert "HTTP request" not in srv.log()  # the lines went to the file, not stderr


@pytest.mark.skipif(NO_GRPC, reason="gRPC is off in this run")
def test_grpc_trace_and_log_settings(server_factory, repo, tmp_path, pb):
    import grpc
    tfile = tmp_path / "g.json"
    srv = server_factory(repo, [f"--trace-config=triton,file={tfile}"])
    stub = pb[1].GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}"))
    req = pb[0].TraceSettingRequest(model_name=MODEL)
    req.settings["trace_level"].value.append("TIMESTAMPS")
    req.settings["trace_rate"].value.append("1")
    req.settings["trace_count"].value.append("2")
    resp = stub.TraceSetting(req)
    assert list(resp.settings["trace_level"].value) == ["TIMESTAMPS"]
    assert list(resp.settings["trace_count"].value) == ["2"]
    assert list(resp.settings["trace_file"].value) == [str(tfile)]
    send(srv, 3)
    got = traces(wait_file(Path(f"{tfile}.0")))
    assert sorted(t["request_id"] for t in got.values()) == ["r1", "r2"]
    bad = pb[0].TraceSettingRequest()
    bad.settings["trace_level"].value.append("TENSORS")
    with pytest.raises(grpc.RpcError) as e:
        stub.TraceSetting(bad)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    lreq = pb[0].LogSettingsRequest()
    lreq.settings["log_verbose_level"].uint32_param = 1
    resp = stub.LogSettings(lreq)
    assert resp.settings["log_verbose_level"].uint32_param == 1
    m = log_mark(srv)
    srv.get("/v2/health/ready")
    assert "HTTP request: GET /v2/health/ready" in log_since(srv, m)
    lreq = pb[0].LogSettingsRequest()
    lreq.settings["log_format"].string_param = "xml"
    with pytest.raises(grpc.RpcError) as e:
        stub.LogSettings(lreq)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_restricted_trace_and_logging(server_factory, repo):
    srv = server_factory(repo, ["--http-restricted-api=trace,logging:admin-key=secret"])
    for path in ["/v2/trace/setting", f"/v2/models/{MODEL}/trace/setting", "/v2/logging"]:
        r = srv.get(path)
        assert r.status_code == 403 and "admin-key" in r.json()["error"], (path, r.text)
        assert srv.get(path, headers={"admin-key": "secret"}).status_code == 200, path
