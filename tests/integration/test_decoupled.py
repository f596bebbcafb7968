"""Decoupled models (model_transaction_policy { decoupled: true }) on the repeat backend, spoken
the way tritonclient speaks them: gRPC ModelStreamInfer with the triton_enable_empty_final_response
request parameter and the triton_final_response response parameter, and HTTP generate_stream
(server-sent events) / generate (Triton's generate extension)."""

import json
import queue
import threading
import time

import numpy as np
import pytest
import requests

from conftest import NO_GRPC

REPEAT_CONFIG = """name: "{name}"
backend: "repeat"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
        {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }},
        {{ name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
"""

ENSEMBLE_CONFIG = """name: "ens_repeat"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "repeat_int32" model_version: -1
  input_map { key: "IN" value: "IN" } input_map { key: "DELAY" value: "DELAY" }
  input_map { key: "WAIT" value: "WAIT" } output_map { key: "OUT" value: "OUT" } } ] }
"""


def write_model(repo, name, config):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def dserver(tmp_path_factory, logs_dir, example_models):
    import shutil

    from conftest import start_server
    repo = tmp_path_factory.mktemp("decoupled_repo")
    write_model(repo, "repeat_int32", REPEAT_CONFIG.format(name="repeat_int32"))
    write_model(repo, "ens_repeat", ENSEMBLE_CONFIG)
    shutil.copytree(example_models / "identity_fp32", repo / "identity_fp32")
    srv = start_server(repo, ["--exit-on-error=false"], logs_dir)
    srv.wait_until(lambda: srv.get("/v2/models/repeat_int32/ready").status_code == 200, 60,
                   "repeat_int32 to be ready")
    srv.wait_until(lambda: srv.get("/v2/models/identity_fp32/ready").status_code == 200, 60,
                   "identity_fp32 to be ready")
    yield srv
    rc = srv.stop()
    assert rc == 0, f"inferd exited with {rc} after SIGTERM\n{srv.log()}"


# --------------------------------------------------------------------------------------------
# gRPC ModelStreamInfer

needs_grpc = pytest.mark.skipif(NO_GRPC, reason="gRPC is off in this run")


def repeat_request(pb, values, delays=None, wait=0, rid="", empty_final=None, model="repeat_int32"):
    m = pb[0]
    values = np.asarray(values, dtype=np.int32)
    delays = np.asarray(delays if delays is not None else [0] * len(values), dtype=np.uint32)
    req = m.ModelInferRequest(model_name=model, id=rid)
    for name, arr, dt in (("IN", values, "INT32"), ("DELAY", delays, "UINT32"),
                          ("WAIT", np.asarray([wait], dtype=np.uint32), "UINT32")):
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend(arr.shape)
        req.raw_input_contents.append(arr.tobytes())
    if empty_final is not None:
        req.parameters["triton_enable_empty_final_response"].bool_param = empty_final
    return req


class Stream:
    """One ModelStreamInfer call: send requests at will, read (arrival time, message)."""

    def __init__(self, server, pb):
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        self.stub = pb[1].GRPCInferenceServiceStub(self.channel)
        self.outbox = queue.Queue()
        self.inbox = queue.Queue()
        self.t0 = time.monotonic()

        def requests_iter():
            while True:
                r = self.outbox.get()
                if r is None:
                    return
                yield r

        self.call = self.stub.ModelStreamInfer(requests_iter())

        def reader():
            try:
                for msg in self.call:
                    self.inbox.put((time.monotonic() - self.t0, msg))
            finally:
                self.inbox.put(None)

        self.thread = threading.Thread(target=reader, daemon=True)
        self.thread.start()

    def send(self, req):
        self.outbox.put(req)

    def close_and_collect(self, timeout=30):
        """Ends the client's side; returns every message until the server finishes the call."""
        self.outbox.put(None)
        out = []
        deadline = time.monotonic() + timeout
        while True:
            item = self.inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            if item is None:
                break
            out.append(item)
        self.channel.close()
        return out


def final_flag(msg):
    p = msg.infer_response.parameters
    assert "triton_final_response" in p, msg
    return p["triton_final_response"].bool_param


def out_values(msg):
    r = msg.infer_response
    names = [o.name for o in r.outputs]
    vals = {}
    for i, o in enumerate(r.outputs):
        dt = np.int32 if o.datatype == "INT32" else np.uint32
        vals[o.name] = np.frombuffer(r.raw_output_contents[i], dtype=dt)
    return names, vals


@needs_grpc
def test_stream_one_response_per_element_then_empty_final(dserver, pb):
    values = [4, -2, 9, 0, 2147483647]
    s = Stream(dserver, pb)
    s.send(repeat_request(pb, values, rid="r1", empty_final=True))
    msgs = [m for _, m in s.close_and_collect()]
    assert len(msgs) == len(values) + 1, msgs
    for i, m in enumerate(msgs[:-1]):
        assert m.error_message == ""
        assert m.infer_response.id == "r1" and m.infer_response.model_name == "repeat_int32"
        assert final_flag(m) is False
        names, vals = out_values(m)
        assert sorted(names) == ["IDX", "OUT"]
        assert vals["OUT"].tolist() == [values[i]]
        assert vals["IDX"].tolist() == [i]
    last = msgs[-1]
    assert final_flag(last) is True
    assert len(last.infer_response.outputs) == 0
    assert last.infer_response.id == "r1" and last.infer_response.model_name == "repeat_int32"


@needs_grpc
def test_stream_without_empty_final_sends_only_the_responses(dserver, pb):
    s = Stream(dserver, pb)
    s.send(repeat_request(pb, [7, 8, 9]))
    msgs = [m for _, m in s.close_and_collect()]
    assert [out_values(m)[1]["OUT"].tolist() for m in msgs] == [[7], [8], [9]]
    assert [final_flag(m) for m in msgs] == [False, False, False]


@needs_grpc
def test_stream_requested_output_only(dserver, pb):
    req = repeat_request(pb, [5, 6], empty_final=False)
    req.outputs.add().name = "IDX"
    s = Stream(dserver, pb)
    s.send(req)
    msgs = [m for _, m in s.close_and_collect()]
    assert [out_values(m)[0] for m in msgs] == [["IDX"], ["IDX"]]
    assert [out_values(m)[1]["IDX"].tolist() for m in msgs] == [[0], [1]]


@needs_grpc
def test_stream_empty_in(dserver, pb):
    s = Stream(dserver, pb)
    s.send(repeat_request(pb, [], rid="empty", empty_final=True))
    msgs = [m for _, m in s.close_and_collect()]
    assert len(msgs) == 1, msgs
    assert final_flag(msgs[0]) is True
    assert len(msgs[0].infer_response.outputs) == 0 and msgs[0].infer_response.id == "empty"
    # Without the parameter the final flag alone is not written: nothing at all.
    s = Stream(dserver, pb)
    s.send(repeat_request(pb, []))
    assert s.close_and_collect() == []


@needs_grpc
def test_stream_delay_spreads_responses(dserver, pb):
    s = Stream(dserver, pb)
    t_send = time.monotonic() - s.t0
    s.send(repeat_request(pb, [1, 2, 3], delays=[300, 300, 300], empty_final=True))
    got = s.close_and_collect()
    times = [t - t_send for t, _ in got]
    assert len(times) == 4
    # Response i comes no earlier than (i + 1) DELAYs, and they are spread out rather than all
    # sent at the end (a loaded machine can only add to each time, and seldom bunches them).
    assert all(times[i] >= 0.3 * (i + 1) - 0.02 for i in range(3)), times
    assert times[2] - times[0] >= 0.4, times


@needs_grpc
def test_stream_concurrent_requests_interleave(dserver, pb):
    s = Stream(dserver, pb)
    t_send = time.monotonic() - s.t0
    s.send(repeat_request(pb, [1, 2, 3], delays=[200, 200, 200], rid="a", empty_final=True))
    s.send(repeat_request(pb, [10, 20, 30], delays=[200, 200, 200], rid="b", empty_final=True))
    got = s.close_and_collect()
    ids = [m.infer_response.id for _, m in got]
    assert sorted(ids) == ["a"] * 4 + ["b"] * 4
    # Both requests run at once: their responses alternate instead of a's then b's.
    assert ids[:4] != ["a"] * 4, ids
    elapsed = got[-1][0] - t_send
    assert elapsed < 1.1, elapsed  # one after the other would take 1.2 s
    for rid, vals in (("a", [1, 2, 3]), ("b", [10, 20, 30])):
        mine = [m for _, m in got if m.infer_response.id == rid]
        assert [out_values(m)[1]["OUT"].tolist()[0] for m in mine[:-1]] == vals
        assert [final_flag(m) for m in mine] == [False, False, False, True]


@needs_grpc
def test_stream_errors_are_final_responses_and_the_stream_goes_on(dserver, pb):
    s = Stream(dserver, pb)
    bad = repeat_request(pb, [1, 2, 3], delays=[0, 0], rid="bad")
    s.send(bad)
    wrong = repeat_request(pb, [1], rid="param")
    wrong.parameters["triton_enable_empty_final_response"].string_param = "yes"
    s.send(wrong)
    s.send(repeat_request(pb, [42], rid="ok"))
    got = {m.infer_response.id: m for _, m in s.close_and_collect()}
    assert "expected IN and DELAY shape to match, got [3] and [2]" in got["bad"].error_message
    assert final_flag(got["bad"]) is True
    assert ("invalid value type for 'triton_enable_empty_final_response' parameter, expected "
            "bool_param") in got["param"].error_message
    assert out_values(got["ok"])[1]["OUT"].tolist() == [42]
    assert dserver.is_live()


@needs_grpc
def test_stream_model_that_is_not_decoupled_answers_once_final(dserver, pb):
    m = pb[0]
    req = m.ModelInferRequest(model_name="identity_fp32", id="x")
    t = req.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    arr = np.arange(16, dtype=np.float32).reshape(1, 16)
    t.shape.extend(arr.shape)
    req.raw_input_contents.append(arr.tobytes())
    s = Stream(dserver, pb)
    s.send(req)
    msgs = [msg for _, msg in s.close_and_collect()]
    assert len(msgs) == 1 and final_flag(msgs[0]) is True
    out = np.frombuffer(msgs[0].infer_response.raw_output_contents[0], dtype=np.float32)
    np.testing.assert_array_equal(out, arr.reshape(-1))


@needs_grpc
def test_unary_model_infer_refuses_decoupled(dserver, pb):
    import grpc
    channel = grpc.insecure_channel(f"127.0.0.1:{dserver.grpc_port}")
    stub = pb[1].GRPCInferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(repeat_request(pb, [1, 2]))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "doesn't support models with decoupled transaction policy" in e.value.details()
    channel.close()


# --------------------------------------------------------------------------------------------
# HTTP


def test_http_infer_refuses_decoupled(dserver):
    body = {"inputs": [
        {"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        {"name": "DELAY", "datatype": "UINT32", "shape": [2], "data": [0, 0]},
        {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]}]}
    r = dserver.post("/v2/models/repeat_int32/infer", json=body)
    assert r.status_code == 501, r.text
    assert "doesn't support models with decoupled transaction policy" in r.json()["error"]
    assert "generate_stream" in r.json()["error"]


def sse_events(resp):
    """(arrival time, parsed JSON) of each `data:` event of a streamed response."""
    t0 = time.monotonic()
    out = []
    buf = b""
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    out.append((time.monotonic() - t0, json.loads(line[6:])))
    assert buf.strip() == b"", buf
    return out


def test_generate_stream_sends_one_event_per_response(dserver):
    values = [3, -1, 8, 5]
    with requests.post(dserver.url + "/v2/models/repeat_int32/generate_stream",
                       json={"IN": values, "DELAY": [0] * 4, "WAIT": 0, "id": "g1"},
                       stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [e for _, e in sse_events(r)]
    assert [e["OUT"] for e in events] == values
    assert [e["IDX"] for e in events] == [0, 1, 2, 3]
    assert all(e["model_name"] == "repeat_int32" and e["id"] == "g1" for e in events)


def test_generate_stream_delay_and_empty_in(dserver):
    t_send = time.monotonic()
    with requests.post(dserver.url + "/v2/models/repeat_int32/versions/1/generate_stream",
                       json={"IN": [1, 2, 3], "DELAY": [250, 250, 250], "WAIT": 0},
                       stream=True, timeout=30) as r:
        t_head = time.monotonic() - t_send
        got = sse_events(r)
    times = [t + t_head for t, _ in got]
    assert [e["OUT"] for _, e in got] == [1, 2, 3]
    assert all(times[i] >= 0.25 * (i + 1) - 0.02 for i in range(3)), times
    assert times[2] - times[0] >= 0.35, times
    # An empty IN: the stream opens and ends with no event.
    r = dserver.post("/v2/models/repeat_int32/generate_stream", json={"IN": [], "DELAY": [], "WAIT": 0})
    assert r.status_code == 200 and r.text == ""


def test_generate_stream_errors(dserver):
    r = dserver.post("/v2/models/repeat_int32/generate_stream",
                     json={"IN": [1, 2], "DELAY": [0], "WAIT": 0})
    # An error before any response is a plain JSON error with its status, as for /infer.
    assert r.status_code == 400
    assert "expected IN and DELAY shape to match, got [2] and [1]" in r.json()["error"]
    r = dserver.post("/v2/models/repeat_int32/generate_stream", json={"IN": [1], "DELAY": [0]})
    assert r.status_code == 400 and "WAIT" in r.json()["error"], r.text
    r = dserver.post("/v2/models/repeat_int32/generate_stream", data=b"{nope")
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    r = dserver.post("/v2/models/nope/generate_stream", json={})
    assert r.status_code == 404
    r = dserver.get("/v2/models/repeat_int32/generate_stream")
    assert r.status_code == 405


def test_generate_stream_client_going_away_stops_the_backend(dserver):
    import socket
    body = json.dumps({"IN": [1, 2, 3, 4, 5, 6], "DELAY": [150] * 6, "WAIT": 0}).encode()
    s = socket.create_connection(("127.0.0.1", dserver.port))
    s.sendall(b"POST /v2/models/repeat_int32/generate_stream HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while got.count(b"data: ") < 1:
        got += s.recv(4096)
    s.close()  # after the first event
    dserver.wait_until(lambda: "request cancelled after" in dserver.log(), 10,
                       "the repeat backend to see the cancellation")
    line = next(ln for ln in dserver.log().splitlines() if "request cancelled after" in ln)
    assert "of 6 responses" in line and "after 6 of" not in line, line


def test_generate_exactly_one_response(dserver):
    r = dserver.post("/v2/models/repeat_int32/generate", json={"IN": [77], "DELAY": [0], "WAIT": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["OUT"] == 77 and body["IDX"] == 0 and body["model_version"] == "1"
    r = dserver.post("/v2/models/repeat_int32/generate",
                     json={"IN": [1, 2, 3], "DELAY": [0, 0, 0], "WAIT": 0})
    assert r.status_code == 400
    assert "generate expects model to produce exactly 1 response" in r.json()["error"]
    # A model that is not decoupled: inputs by name, outputs by name; the shape [-1, 16] is
    # filled from the metadata as [1, 16].
    x = (np.arange(16, dtype=np.float32) * 0.5).tolist()
    r = dserver.post("/v2/models/identity_fp32/generate", json={"INPUT0": x, "my_param": "v"})
    assert r.status_code == 200, r.text
    assert r.json()["OUTPUT0"] == x


def test_statistics_count_requests_not_responses(dserver):
    def success():
        r = dserver.get("/v2/models/repeat_int32/stats")
        return r.json()["model_stats"][0]["inference_stats"]["success"]["count"]

    before = success()
    for _ in range(3):
        r = dserver.post("/v2/models/repeat_int32/generate_stream",
                         json={"IN": [1, 2, 3, 4], "DELAY": [0] * 4, "WAIT": 0})
        assert r.status_code == 200 and r.text.count("data: ") == 4
    assert success() - before == 3


def test_ensemble_with_decoupled_step_streams_each_response(dserver):
    # As Triton: an ensemble whose step is decoupled is decoupled; each response of the step
    # is one response of the ensemble (tests/integration/test_ensemble_decoupled.py has more).
    dserver.wait_until(lambda: dserver.get("/v2/models/ens_repeat/ready").status_code == 200, 60,
                       "ens_repeat to be ready")
    with requests.post(dserver.url + "/v2/models/ens_repeat/generate_stream",
                       json={"IN": [7, 8, 9], "DELAY": [0, 0, 0], "WAIT": 0, "id": "e"},
                       stream=True, timeout=30) as r:
        assert r.status_code == 200, r.text
        events = [e for _, e in sse_events(r)]
    assert [e["OUT"] for e in events] == [7, 8, 9]
    assert all(e["model_name"] == "ens_repeat" and "IDX" not in e for e in events), events


def test_repeat_config_checks(server_factory, tmp_path):
    bad = REPEAT_CONFIG.format(name="rep").replace('name: "DELAY" data_type: TYPE_UINT32',
                                                   'name: "DELAY" data_type: TYPE_INT32')
    write_model(tmp_path, "rep", bad)
    write_model(tmp_path, "rep_coupled",
                REPEAT_CONFIG.format(name="rep_coupled").replace("decoupled: true", "decoupled: false"))
    srv = server_factory(tmp_path, ["--exit-on-error=false"])
    index = {e["name"]: e for e in srv.post("/v2/repository/index", json={}).json()}
    assert "expected DELAY datatype to be UINT32, got TYPE_INT32" in index["rep"]["reason"]
    assert "model_transaction_policy { decoupled: true }" in index["rep_coupled"]["reason"]
