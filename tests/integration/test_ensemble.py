"""Ensembles (`platform: "ensemble"`) against the real server: results compared with numpy
(the composing ONNX models are the example `simple`, INT32 add/sub, and the `labelled` FP32
identity), over HTTP (JSON and binary) and gRPC; composing models batching requests from many
ensemble calls together; statistics for the ensemble and its models; load-time errors with the
step, model and tensor named; step failures at run time; readiness following the composing
models."""

import concurrent.futures as futures
import textwrap

import grpc
import numpy as np
import pytest

from v2client import assert_error, infer, make_input, parse_response

# Two `simple` steps: (a+b, a-b), then (sum+diff, sum-diff) = (2a, 2b). SUM is both read by
# step 1 and returned.
CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "TWICE_A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "TWICE_B" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "simple"
      model_version: -1
      input_map { key: "INPUT0" value: "A" }
      input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "SUM" }
      output_map { key: "OUTPUT1" value: "diff" }
    },
    {
      model_name: "simple"
      model_version: -1
      input_map { key: "INPUT0" value: "SUM" }
      input_map { key: "INPUT1" value: "diff" }
      output_map { key: "OUTPUT0" value: "TWICE_A" }
      output_map { key: "OUTPUT1" value: "TWICE_B" }
    }
  ]
}
"""


def write_ensemble(repo, name, config, files=None):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(textwrap.dedent(config))
    for fname, text in (files or {}).items():
        (d / fname).write_text(text)


def chain_inputs(rng, batch, binary):
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    return a, b, [make_input("A", a, "INT32", binary=binary), make_input("B", b, "INT32", binary=binary)]


def stats_of(srv, model):
    r = srv.get(f"/v2/models/{model}/stats")
    assert r.status_code == 200, r.text
    return r.json()["model_stats"][0]


@pytest.fixture
def chain_server(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    write_ensemble(repo, "chain", CHAIN)
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/chain/ready").status_code == 200, 60, "chain ready")
    return srv


@pytest.mark.parametrize("binary", [False, True])
def test_chain_matches_numpy(chain_server, binary):
    rng = np.random.default_rng(1)
    a, b, inputs = chain_inputs(rng, 3, binary)
    outputs = [{"name": n, "parameters": {"binary_data": binary}} for n in ("SUM", "TWICE_A", "TWICE_B")]
    r = infer(chain_server, "chain", inputs, outputs=outputs, request_id="e-1")
    assert r.status_code == 200, r.text
    header, out = parse_response(r)
    assert header["model_name"] == "chain"
    assert header["model_version"] == "1"
    assert header["id"] == "e-1"
    np.testing.assert_array_equal(out["SUM"], a + b)
    np.testing.assert_array_equal(out["TWICE_A"], 2 * a)
    np.testing.assert_array_equal(out["TWICE_B"], 2 * b)
    assert [o["shape"] for o in header["outputs"]] == [[3, 16]] * 3


def test_requested_output_subset_and_statistics(chain_server):
    rng = np.random.default_rng(2)
    before = stats_of(chain_server, "simple")["inference_stats"]["success"]["count"]
    for _ in range(5):
        a, b, inputs = chain_inputs(rng, 1, True)
        r = infer(chain_server, "chain", inputs, outputs=[{"name": "TWICE_B"}])
        assert r.status_code == 200, r.text
        header, out = parse_response(r)
        assert list(out) == ["TWICE_B"]
        np.testing.assert_array_equal(out["TWICE_B"], 2 * b)
    chain = stats_of(chain_server, "chain")
    assert chain["inference_stats"]["success"]["count"] == 5
    assert int(chain["inference_stats"]["success"]["ns"]) > 0
    # Each ensemble call ran two `simple` steps, counted in simple's own statistics.
    after = stats_of(chain_server, "simple")["inference_stats"]["success"]["count"]
    assert after - before == 10


def test_metadata_config_and_index(chain_server):
    md = chain_server.get("/v2/models/chain").json()
    assert md["platform"] == "ensemble"
    assert [i["name"] for i in md["inputs"]] == ["A", "B"]
    assert [o["name"] for o in md["outputs"]] == ["SUM", "TWICE_A", "TWICE_B"]
    assert md["inputs"][0]["shape"] == [-1, 16]
    cfg = chain_server.get("/v2/models/chain/config").json()
    steps = cfg["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["simple", "simple"]
    assert steps[0]["output_map"] == {"OUTPUT0": "SUM", "OUTPUT1": "diff"}
    index = chain_server.post("/v2/repository/index", json={}).json()
    states = {e["name"]: e.get("state") for e in index}
    assert states["chain"] == "READY" and states["simple"] == "READY"


def test_composing_model_batches_requests_from_many_ensemble_calls(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    cfg = (repo / "simple" / "config.pbtxt").read_text()
    (repo / "simple" / "config.pbtxt").write_text(
        cfg + "\ndynamic_batching { max_queue_delay_microseconds: 50000 }\n")
    write_ensemble(repo, "chain", CHAIN)
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/chain/ready").status_code == 200, 60, "chain ready")
    rng = np.random.default_rng(3)
    cases = [chain_inputs(rng, 1, True) for _ in range(16)]

    def call(case):
        a, b, inputs = case
        import requests
        with requests.Session() as s:
            r = infer(srv, "chain", inputs, session=s)
        assert r.status_code == 200, r.text
        _, out = parse_response(r)
        np.testing.assert_array_equal(out["TWICE_A"], 2 * a)
        np.testing.assert_array_equal(out["SUM"], a + b)

    with futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(call, cases))
    st = stats_of(srv, "simple")
    assert st["inference_count"] == 32  # two steps per call
    # Steps of different ensemble calls ran in shared batches.
    assert st["execution_count"] < st["inference_count"], st


def test_grpc_ensemble(chain_server, pb):
    m, svc = pb
    channel = grpc.insecure_channel(f"127.0.0.1:{chain_server.grpc_port}")
    stub = svc.GRPCInferenceServiceStub(channel)
    rng = np.random.default_rng(4)
    a = rng.integers(-50, 50, size=(2, 16), dtype=np.int32)
    b = rng.integers(-50, 50, size=(2, 16), dtype=np.int32)
    req = m.ModelInferRequest(model_name="chain", id="g1")
    for name, arr in (("A", a), ("B", b)):
        req.inputs.add(name=name, datatype="INT32", shape=list(arr.shape))
        req.raw_input_contents.append(arr.tobytes())
    resp = stub.ModelInfer(req, timeout=30)
    out = {o.name: np.frombuffer(resp.raw_output_contents[i], np.int32).reshape(o.shape)
           for i, o in enumerate(resp.outputs)}
    np.testing.assert_array_equal(out["TWICE_A"], 2 * a)
    np.testing.assert_array_equal(out["TWICE_B"], 2 * b)
    assert resp.model_name == "chain" and resp.id == "g1"
    md = stub.ModelMetadata(m.ModelMetadataRequest(name="chain"), timeout=10)
    assert md.platform == "ensemble"
    channel.close()


def test_step_failure_names_the_step_and_leaves_other_requests_alone(make_repo, server_factory):
    # The ensemble accepts any length; `simple` needs 16, so step 0 rejects short rows.
    loose = CHAIN.replace('name: "chain"', 'name: "loose"').replace(
        'name: "A" data_type: TYPE_INT32 dims: [ 16 ]', 'name: "A" data_type: TYPE_INT32 dims: [ -1 ]')
    repo = make_repo({"simple": "simple"})
    write_ensemble(repo, "loose", loose)
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/loose/ready").status_code == 200, 60, "ready")
    a = np.ones((1, 5), np.int32)
    b = np.ones((1, 16), np.int32)
    r = infer(srv, "loose", [make_input("A", a, "INT32"), make_input("B", b, "INT32")])
    assert_error(r, 400, "in ensemble 'loose' step 0 (model 'simple'):", "INPUT0")
    good = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, "loose", [make_input("A", good, "INT32"), make_input("B", b, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["TWICE_A"], 2 * good)
    st = stats_of(srv, "loose")["inference_stats"]
    assert st["fail"]["count"] == 1 and st["success"]["count"] == 1


def test_classification_on_an_ensemble_output(make_repo, server_factory):
    labels = ["cat", "dog", "bird", "fish", "horse"]
    repo = make_repo({"labelled": "labelled"})
    write_ensemble(repo, "classify", """
        name: "classify"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 5 ] } ]
        output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]
        ensemble_scheduling {
          step [ { model_name: "labelled" model_version: -1
                   input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "SCORES" } } ]
        }""", files={"labels.txt": "\n".join(labels) + "\n"})
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/classify/ready").status_code == 200, 60, "ready")
    x = np.array([[0.1, 0.9, 0.3, 0.7, 0.2]], dtype=np.float32)
    r = infer(srv, "classify", [make_input("X", x, "FP32")],
              outputs=[{"name": "SCORES", "parameters": {"classification": 3}}])
    assert r.status_code == 200, r.text
    o = r.json()["outputs"][0]
    assert o["shape"] == [1, 3]
    top = np.argsort(-x[0])[:3]
    parsed = [s.split(":") for s in o["data"]]
    assert [(int(p[1]), p[2]) for p in parsed] == [(int(i), labels[i]) for i in top]
    assert [float(p[0]) for p in parsed] == pytest.approx([float(x[0, i]) for i in top], rel=1e-5)


BAD_ENSEMBLES = {
    # name: (config body after the header, substrings of the load error)
    "unknown_model": ("""
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "nope" model_version: -1
          input_map { key: "INPUT0" value: "A" } output_map { key: "OUTPUT0" value: "OUT" } } ] }""",
        ["ensemble 'unknown_model' step 0 (model 'nope'): the model is not available"]),
    "wrong_type": ("""
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "simple" model_version: -1
          input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
          output_map { key: "OUTPUT0" value: "OUT" } } ] }""",
        ["ensemble 'wrong_type' step 0 (model 'simple'): input 'INPUT0' is TYPE_INT32 but tensor "
         "'A' (ensemble input 'A') is TYPE_FP32"]),
    "wrong_shape": ("""
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 8 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "simple" model_version: -1
          input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
          output_map { key: "OUTPUT0" value: "OUT" } } ] }""",
        ["input 'INPUT0' has shape [-1,16] but tensor 'A' (ensemble input 'A') has shape [-1,8]"]),
    "no_such_input": ("""
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "simple" model_version: -1
          input_map { key: "IN" value: "A" } output_map { key: "OUTPUT0" value: "OUT" } } ] }""",
        ["input_map names input 'IN', which model 'simple' does not have (its inputs: INPUT0, INPUT1)"]),
    "missing_tensor": ("""
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "simple" model_version: -1
          input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "ghost" }
          output_map { key: "OUTPUT0" value: "OUT" } } ] }""",
        ["step 0 (model 'simple'): input 'INPUT1' reads tensor 'ghost', which is neither an "
         "ensemble input nor written by any step"]),
    "cycle": ("""
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
        ensemble_scheduling { step [
          { model_name: "simple" input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "t2" }
            output_map { key: "OUTPUT0" value: "t1" } output_map { key: "OUTPUT1" value: "OUT" } },
          { model_name: "simple" input_map { key: "INPUT0" value: "t1" } input_map { key: "INPUT1" value: "A" }
            output_map { key: "OUTPUT0" value: "t2" } } ] }""",
        ["ensemble 'cycle' has a cycle"]),
    "too_big_batch": ("""
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "simple" model_version: -1
          input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
          output_map { key: "OUTPUT0" value: "OUT" } } ] }""",
        ["the ensemble allows max_batch_size 64 but model 'simple' allows only 8"]),
}


def test_load_errors_name_the_step_model_and_tensor(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    for name, (body, _) in BAD_ENSEMBLES.items():
        mbs = 64 if name == "too_big_batch" else 8
        write_ensemble(repo, name, f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {mbs}\n'
                       + textwrap.dedent(body))
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    for name, (_, expected) in BAD_ENSEMBLES.items():
        r = srv.post(f"/v2/repository/models/{name}/load", json={})
        assert_error(r, 400, *expected)
        assert srv.get(f"/v2/models/{name}/ready").status_code != 200
    index = {e["name"]: e for e in srv.post("/v2/repository/index", json={}).json()}
    assert index["wrong_type"]["state"] == "UNAVAILABLE"
    assert "is TYPE_INT32 but tensor 'A'" in index["wrong_type"]["reason"]
    assert srv.is_live()


def test_explicit_load_brings_composing_models_and_readiness_follows_them(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    write_ensemble(repo, "chain", CHAIN)
    srv = server_factory(repo, ["--model-control-mode=explicit", "--strict-readiness=false"])
    assert srv.get("/v2/models/simple/ready").status_code != 200
    r = srv.post("/v2/repository/models/chain/load", json={})
    assert r.status_code == 200, r.text
    # Loading the ensemble loaded the model it runs, as tritonserver does.
    assert srv.get("/v2/models/simple/ready").status_code == 200
    assert srv.get("/v2/models/chain/ready").status_code == 200
    rng = np.random.default_rng(5)
    _, _, inputs = chain_inputs(rng, 1, True)
    assert infer(srv, "chain", inputs).status_code == 200

    r = srv.post("/v2/repository/models/simple/unload", json={})
    assert r.status_code == 200, r.text
    # The ensemble is not ready without its composing model, and its calls fail naming the step.
    assert srv.get("/v2/models/chain/ready").status_code != 200
    r = infer(srv, "chain", inputs)
    assert_error(r, 503, "in ensemble 'chain' step 0 (model 'simple')", "not loaded")
    r = srv.post("/v2/repository/models/simple/load", json={})
    assert r.status_code == 200, r.text
    assert srv.get("/v2/models/chain/ready").status_code == 200
    assert infer(srv, "chain", inputs).status_code == 200


def test_none_mode_loads_each_composing_model_once(make_repo, server_factory):
    repo = make_repo({"simple": "simple"})
    write_ensemble(repo, "a_chain", CHAIN.replace('name: "chain"', 'name: "a_chain"'))
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/a_chain/ready").status_code == 200, 60, "ready")
    assert srv.get("/v2/health/ready").status_code == 200
    # "a_chain" sorts before "simple": it loads simple itself, and the pass does not reload it.
    assert srv.log().count("loaded model 'simple' version 1") == 1, srv.log()


# An ensemble whose step is a sequence model (the accumulator of test_sequence.py): the client
# speaks the sequence to the ensemble, and every step carries its correlation ID and START/END
# flags, as Triton's ensemble scheduler does. perf_analyzer drives such an ensemble this way
# (it calls it ENSEMBLE_SEQUENCE: sequence_id/sequence_start/sequence_end on every request).
ACC_ENSEMBLE = """
name: "acc_ens"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CORRID" data_type: TYPE_UINT64 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "acc" model_version: -1
  input_map { key: "INPUT" value: "IN" }
  output_map { key: "OUTPUT" value: "SUM" } output_map { key: "CORRID_OUT" value: "CORRID" } } ] }
"""


@pytest.fixture
def acc_ensemble_server(tmp_path, server_factory):
    import sys

    from conftest import REPO_ROOT
    sys.path.insert(0, str(REPO_ROOT / "tests" / "models"))
    import gen_sequence_models
    repo = tmp_path / "repo"
    gen_sequence_models.write_accumulator(repo, "acc")
    write_ensemble(repo, "acc_ens", ACC_ENSEMBLE)
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/acc_ens/ready").status_code == 200, 60,
                   "acc_ens ready")
    return srv


def test_sequence_through_an_ensemble_http(acc_ensemble_server):
    srv = acc_ensemble_server

    def step(value, seq_id, start=False, end=False):
        params = {"sequence_id": seq_id, "sequence_start": start, "sequence_end": end}
        body = {"parameters": params, "inputs": [
            {"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
        r = srv.post("/v2/models/acc_ens/infer", json=body)
        assert r.status_code == 200, r.text
        out = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
        return out["SUM"], out["CORRID"]

    # Two sequences interleaved: each keeps its own state in the composing model.
    assert step(5, 71, start=True) == (5, 71)
    assert step(100, 72, start=True) == (100, 72)
    assert step(3, 71) == (8, 71)
    assert step(1, 72, end=True) == (101, 72)
    assert step(2, 71, end=True) == (10, 71)
    # END reached the composing model: the sequence is gone, and a request without START for
    # it is refused there, named by the step.
    body = {"parameters": {"sequence_id": 71}, "inputs": [
        {"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}
    r = srv.post("/v2/models/acc_ens/infer", json=body)
    assert_error(r, 400, "in ensemble 'acc_ens' step 0 (model 'acc')", "START")


def test_sequence_through_an_ensemble_grpc_stream(acc_ensemble_server, pb):
    m, svc = pb
    channel = grpc.insecure_channel(f"127.0.0.1:{acc_ensemble_server.grpc_port}")
    stub = svc.GRPCInferenceServiceStub(channel)
    reqs = []
    for i, v in enumerate([4, 8, 15]):
        req = m.ModelInferRequest(model_name="acc_ens", id=f"r{i}")
        req.parameters["sequence_id"].int64_param = 9001
        req.parameters["sequence_start"].bool_param = i == 0
        req.parameters["sequence_end"].bool_param = i == 2
        req.inputs.add(name="IN", datatype="INT32", shape=[1, 1])
        req.raw_input_contents.append(np.array([[v]], dtype=np.int32).tobytes())
        reqs.append(req)
    sums = {}
    for resp in stub.ModelStreamInfer(iter(reqs), timeout=60):
        assert not resp.error_message, resp.error_message
        r = resp.infer_response
        names = [o.name for o in r.outputs]
        sums[r.id] = int(np.frombuffer(r.raw_output_contents[names.index("SUM")], np.int32)[0])
    assert sums == {"r0": 4, "r1": 12, "r2": 27}
    channel.close()
