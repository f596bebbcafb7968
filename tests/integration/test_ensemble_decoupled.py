"""Decoupled models inside ensembles, as Triton runs them: preprocess (Python, answers once) ->
a decoupled Python model that sends one response per element -> postprocess (Python, answers
once). Each response of the decoupled step is its own flow through the postprocess, and the
ensemble (decoupled itself) streams one response per flow, then the final flag, over gRPC
ModelStreamInfer and HTTP generate_stream. Expected values are computed here with numpy.
Also: zero responses, an error in one flow, /infer refusing the ensemble, and Triton's
"decoupled branching" refusal at load."""

import json

import numpy as np
import pytest
import requests

from conftest import NO_GRPC
from test_decoupled import Stream, final_flag

PRE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PRE", (x + 1).astype(np.int32))]))
        return out
'''

# One response per element i of X: Y = X[i] * 10 + i; then the final flag alone (an empty X
# sends only the flag).
GEN_PY = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            def respond(x=x, sender=sender):
                for i, v in enumerate(x):
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("Y", np.array([v * 10 + i], dtype=np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            t = threading.Thread(target=respond)
            t.start()
            self.threads.append(t)
        return None
'''

# OUT = Z * 2 + 3; a negative Z is an error (one flow failing).
POST_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            z = pb_utils.get_input_tensor_by_name(r, "Z").as_numpy()
            if (z < 0).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "postprocess got a negative value %d" % int(z[0]))))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (z * 2 + 3).astype(np.int32))]))
        return out
'''

JOIN_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("S", (a + b).astype(np.int32))]))
        return out
'''


def py_model(repo, name, code, inputs, outputs, decoupled=False):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(code)
    tensors = lambda ts: ", ".join(
        f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ {dims} ] }}' for n, dims in ts)
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        + ("model_transaction_policy { decoupled: true }\n" if decoupled else "")
        + f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n"
        + 'instance_group [ { kind: KIND_CPU count: 1 } ]\n')


def step(model, inputs, outputs):
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def ensemble(repo, name, inputs, outputs, steps):
    (repo / name / "1").mkdir(parents=True)
    tensors = lambda ts: ", ".join(
        f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ {dims} ] }}' for n, dims in ts)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n")


@pytest.fixture(scope="module")
def eserver(tmp_path_factory, logs_dir):
    from conftest import start_server
    repo = tmp_path_factory.mktemp("ens_decoupled_repo")
    py_model(repo, "pre", PRE_PY, [("IN", "-1")], [("PRE", "-1")])
    py_model(repo, "gen", GEN_PY, [("X", "-1")], [("Y", "1")], decoupled=True)
    py_model(repo, "post", POST_PY, [("Z", "1")], [("OUT", "1")])
    py_model(repo, "join", JOIN_PY, [("A", "1"), ("B", "1")], [("S", "1")])
    ensemble(repo, "ens_stream", [("IN", "-1")], [("OUT", "1")], [
        step("pre", {"IN": "IN"}, {"PRE": "pre_out"}),
        step("gen", {"X": "pre_out"}, {"Y": "gen_out"}),
        step("post", {"Z": "gen_out"}, {"OUT": "OUT"})])
    # Triton's qa/L0_model_config invalid_decoupled_branching: a step joins the responses of
    # two decoupled steps.
    ensemble(repo, "ens_branching", [("IN", "-1")], [("S", "1")], [
        step("gen", {"X": "IN"}, {"Y": "g1"}),
        step("gen", {"X": "IN"}, {"Y": "g2"}),
        step("join", {"A": "g1", "B": "g2"}, {"S": "S"})])
    # invalid_decoupled_branching_2: the ensemble's outputs follow two decoupled steps.
    ensemble(repo, "ens_branching_2", [("IN", "-1")], [("O1", "1"), ("O2", "1")], [
        step("gen", {"X": "IN"}, {"Y": "O1"}),
        step("gen", {"X": "IN"}, {"Y": "O2"})])
    # A decoupled ensemble cannot cache its responses, like any decoupled model.
    ensemble(repo, "ens_cached", [("IN", "-1")], [("OUT", "1")], [
        step("gen", {"X": "IN"}, {"Y": "OUT"})])
    with open(repo / "ens_cached" / "config.pbtxt", "a") as f:
        f.write("response_cache { enable: true }\n")
    srv = start_server(repo, ["--exit-on-error=false"], logs_dir)
    for m in ("pre", "gen", "post"):
        srv.wait_until(lambda m=m: srv.get(f"/v2/models/{m}/ready").status_code == 200, 90,
                       f"{m} to be ready")
    srv.wait_until(lambda: srv.get("/v2/models/ens_stream/ready").status_code == 200, 90,
                   "ens_stream to be ready")
    yield srv
    rc = srv.stop()
    assert rc == 0, f"inferd exited with {rc} after SIGTERM\n{srv.log()}"


def expected(values):
    pre = np.asarray(values, dtype=np.int32) + 1
    return [int(v) for v in (pre * 10 + np.arange(len(pre), dtype=np.int32)) * 2 + 3]


def stream_request(pb, values, rid, empty_final=True):
    m = pb[0]
    arr = np.asarray(values, dtype=np.int32)
    req = m.ModelInferRequest(model_name="ens_stream", id=rid)
    t = req.inputs.add()
    t.name, t.datatype = "IN", "INT32"
    t.shape.extend(arr.shape)
    req.raw_input_contents.append(arr.tobytes())
    if empty_final:
        req.parameters["triton_enable_empty_final_response"].bool_param = True
    return req


def out_of(msg):
    r = msg.infer_response
    assert [o.name for o in r.outputs] == ["OUT"], r
    assert list(r.outputs[0].shape) == [1]
    return int(np.frombuffer(r.raw_output_contents[0], dtype=np.int32)[0])


needs_grpc = pytest.mark.skipif(NO_GRPC, reason="gRPC is off in this run")


@needs_grpc
def test_grpc_stream_one_response_per_decoupled_response_then_final(eserver, pb):
    values = [4, 0, 9, -1, 7, 12]
    s = Stream(eserver, pb)
    s.send(stream_request(pb, values, "e1"))
    msgs = [m for _, m in s.close_and_collect(timeout=60)]
    assert len(msgs) == len(values) + 1, msgs
    for m in msgs[:-1]:
        assert m.error_message == "", m.error_message
        assert m.infer_response.model_name == "ens_stream" and m.infer_response.id == "e1"
        assert final_flag(m) is False
    # The flows run concurrently in the postprocess: compare as a multiset.
    assert sorted(out_of(m) for m in msgs[:-1]) == sorted(expected(values))
    last = msgs[-1]
    assert final_flag(last) is True and len(last.infer_response.outputs) == 0
    assert last.infer_response.id == "e1"


@needs_grpc
def test_grpc_stream_zero_responses_sends_only_the_final_flag(eserver, pb):
    s = Stream(eserver, pb)
    s.send(stream_request(pb, [], "z1"))
    s.send(stream_request(pb, [], "z2", empty_final=False))
    msgs = [m for _, m in s.close_and_collect(timeout=60)]
    # z2 did not ask for the empty final response: nothing at all for it.
    assert len(msgs) == 1, msgs
    assert msgs[0].error_message == "" and msgs[0].infer_response.id == "z1"
    assert final_flag(msgs[0]) is True and len(msgs[0].infer_response.outputs) == 0


@needs_grpc
def test_grpc_stream_error_in_one_flow_ends_the_request_with_it(eserver, pb):
    # -5 at index 1: Z = (-5 + 1) * 10 + 1 = -39, which the postprocess refuses.
    values = [3, -5, 6]
    s = Stream(eserver, pb)
    s.send(stream_request(pb, values, "x1"))
    s.send(stream_request(pb, [1, 2], "ok"))  # the stream goes on for other requests
    msgs = [m for _, m in s.close_and_collect(timeout=60)]
    mine = [m for m in msgs if (m.infer_response.id or "") == "x1"]
    errors = [m for m in mine if m.error_message]
    assert len(errors) == 1, msgs
    assert "postprocess got a negative value -39" in errors[0].error_message
    assert "ensemble 'ens_stream' step 2 (model 'post')" in errors[0].error_message
    assert final_flag(errors[0]) is True
    # Nothing of x1 after its error; responses before it are values of the other flows.
    assert mine[-1] is errors[0]
    good = [out_of(m) for m in mine if not m.error_message]
    assert set(good) <= {expected(values)[0], expected(values)[2]}, good
    ok = [m for m in msgs if m.infer_response.id == "ok"]
    assert sorted(out_of(m) for m in ok if m.infer_response.outputs) == sorted(expected([1, 2]))
    assert final_flag(ok[-1]) is True


def sse_events(resp):
    out, buf = [], b""
    for chunk in resp.iter_content(chunk_size=None):
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    out.append(json.loads(line[6:]))
    assert buf.strip() == b"", buf
    return out


def test_generate_stream_one_event_per_flow(eserver):
    values = [5, 1, 8, 2]
    with requests.post(eserver.url + "/v2/models/ens_stream/generate_stream",
                       json={"IN": values, "id": "g1"}, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        events = sse_events(r)
    assert all(e["model_name"] == "ens_stream" and e["id"] == "g1" for e in events), events
    assert sorted(e["OUT"] for e in events) == sorted(expected(values))
    # Zero responses: the stream opens and ends with no event.
    r = eserver.post("/v2/models/ens_stream/generate_stream", json={"IN": []}, timeout=60)
    assert r.status_code == 200 and r.text == "", r.text
    # One response: generate answers it.
    r = eserver.post("/v2/models/ens_stream/generate", json={"IN": [6]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["OUT"] == expected([6])[0]


def test_generate_stream_error_in_one_flow(eserver):
    with requests.post(eserver.url + "/v2/models/ens_stream/generate_stream",
                       json={"IN": [2, -5, 4]}, stream=True, timeout=60) as r:
        if r.status_code != 200:
            # The failing flow was the first answer: a plain JSON error, as for /infer.
            assert "postprocess got a negative value -39" in r.json()["error"], r.text
            return
        events = sse_events(r)
    assert "postprocess got a negative value -39" in events[-1]["error"], events
    assert all("OUT" in e for e in events[:-1]), events


def test_http_infer_refuses_the_decoupled_ensemble(eserver):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}
    r = eserver.post("/v2/models/ens_stream/infer", json=body)
    assert r.status_code == 501, r.text
    assert "doesn't support models with decoupled transaction policy" in r.json()["error"]
    # As Triton, the ensemble's configuration says it is decoupled.
    cfg = eserver.get("/v2/models/ens_stream/config").json()
    assert cfg["model_transaction_policy"]["decoupled"] is True, cfg


def test_decoupled_branching_is_refused_at_load(eserver):
    index = {e["name"]: e for e in eserver.post("/v2/repository/index", json={}).json()}
    for name, model in (("ens_branching", "join"), ("ens_branching_2", "ens_branching_2")):
        entry = index[name]
        assert entry["state"] == "UNAVAILABLE", entry
        # Triton's words (qa/L0_model_config autofill_noplatform/ensemble/invalid_decoupled_branching*).
        assert (f"in ensemble {name}, step of model '{model}' receives inputs originated from "
                "different decoupled models") in entry["reason"], entry
    assert "step 2 (model 'join') reads tensors that follow the responses of step 0" \
        in index["ens_branching"]["reason"]
    assert index["ens_cached"]["state"] == "UNAVAILABLE"
    assert "response_cache does not support decoupled models, and step 0 (model 'gen') is " \
        "decoupled" in index["ens_cached"]["reason"], index["ens_cached"]


def test_statistics_count_one_request_per_stream(eserver):
    def success():
        r = eserver.get("/v2/models/ens_stream/stats")
        return r.json()["model_stats"][0]["inference_stats"]["success"]["count"]

    before = success()
    for _ in range(2):
        r = eserver.post("/v2/models/ens_stream/generate_stream", json={"IN": [1, 2, 3]}, timeout=60)
        assert r.status_code == 200 and r.text.count("data: ") == 3
    assert success() - before == 2
