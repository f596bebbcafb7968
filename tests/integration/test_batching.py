"""Dynamic batching, instance groups and warmup against the real server (issue: batching).

Batched results are checked element by element against numpy; the statistics extension shows
that requests really were combined (execution_count < inference_count)."""

import concurrent.futures as futures

import numpy as np
import pytest
import requests

from v2client import assert_error, infer, make_input, parse_response

SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def simple_repo(make_repo, extra):
    repo = make_repo({"simple": "simple"})
    (repo / "simple" / "config.pbtxt").write_text(
        'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + SIMPLE_IO + extra)
    return repo


def stats(srv, model="simple"):
    r = srv.get(f"/v2/models/{model}/stats")
    assert r.status_code == 200, r.text
    return r.json()["model_stats"][0]


def send(srv, seed, batch=1):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    with requests.Session() as s:
        r = infer(srv, "simple", [make_input("INPUT0", a, "INT32", binary=True),
                                  make_input("INPUT1", b, "INT32")], session=s)
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    return batch


def test_dynamic_batching_combines_concurrent_requests(server_factory, make_repo):
    repo = simple_repo(make_repo, """
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
""")
    srv = server_factory([repo])
    n = 64
    with futures.ThreadPoolExecutor(16) as pool:
        sizes = list(pool.map(lambda i: send(srv, i, batch=1 + i % 3), range(n)))
    st = stats(srv)
    assert st["inference_stats"]["success"]["count"] == n
    assert st["inference_count"] == sum(sizes)
    # Requests were combined: fewer executions than requests, and batch_stats records sizes > 1.
    assert st["execution_count"] < n, st
    assert any(int(b["batch_size"]) > 1 for b in st["batch_stats"]), st["batch_stats"]
    assert all(int(b["batch_size"]) <= 8 for b in st["batch_stats"])
    assert sum(int(b["batch_size"]) * b["compute_infer"]["count"] for b in st["batch_stats"]) \
        == sum(sizes)


def send_filtered(srv, seed, batch, wanted):
    """A request of `batch` rows naming only the outputs in `wanted` (None: every output)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    outputs = None if wanted is None else [{"name": n, "parameters": {"binary_data": True}}
                                           for n in wanted]
    with requests.Session() as s:
        r = infer(srv, "simple", [make_input("INPUT0", a, "INT32", binary=True),
                                  make_input("INPUT1", b, "INT32")], outputs=outputs, session=s)
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    expected = {"OUTPUT0": a + b, "OUTPUT1": a - b}
    assert sorted(out) == sorted(expected if wanted is None else wanted)
    for name, value in out.items():
        np.testing.assert_array_equal(value, expected[name])
        assert value.shape == (batch, 16)
    return batch


def test_combined_batch_answers_each_request_its_rows_and_outputs(server_factory, make_repo):
    # The backend toolkit's slicing (backends/batch_io.h) end to end: requests of 1-3 rows,
    # each naming OUTPUT0, OUTPUT1 or neither, share batches; each gets its own rows of only the
    # outputs it named.
    repo = simple_repo(make_repo, """
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
""")
    srv = server_factory([repo])
    choices = [None, ["OUTPUT0"], ["OUTPUT1"], ["OUTPUT1", "OUTPUT0"]]
    n = 48
    with futures.ThreadPoolExecutor(16) as pool:
        sizes = list(pool.map(
            lambda i: send_filtered(srv, 100 + i, 1 + i % 3, choices[(i // 3) % 4]), range(n)))
    st = stats(srv)
    assert st["inference_count"] == sum(sizes)
    assert st["execution_count"] < n, st


def test_preferred_batch_size_is_used(server_factory, make_repo):
    repo = simple_repo(make_repo, """
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000000 }
""")
    srv = server_factory([repo])
    # Four single requests form the preferred batch long before the 2 s delay.
    with futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: send(srv, 100 + i), range(4)))
    st = stats(srv)
    assert st["execution_count"] == 1, st
    assert [int(b["batch_size"]) for b in st["batch_stats"]] == [4]


def test_several_instance_groups(server_factory, make_repo):
    repo = simple_repo(make_repo, """
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_AUTO } ]
""")
    srv = server_factory([repo])
    cfg = srv.get("/v2/models/simple/config").json()
    assert [g["count"] for g in cfg["instance_group"]] == [2, 1]
    with futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: send(srv, 200 + i), range(24)))
    assert stats(srv)["inference_stats"]["success"]["count"] == 24


def test_kind_gpu_fails_the_load_with_a_reason(server_factory, make_repo):
    repo = simple_repo(make_repo, 'instance_group [ { count: 1 kind: KIND_GPU } ]\n')
    srv = server_factory([repo], ["--exit-on-error=false", "--strict-readiness=false"])
    idx = srv.post("/v2/repository/index", json={}).json()
    entry = [e for e in idx if e["name"] == "simple"][0]
    assert entry["state"] == "UNAVAILABLE"
    assert "has kind KIND_GPU but cannot run on a GPU" in entry["reason"], entry["reason"]


def test_full_queue_answers_503(server_factory, make_repo):
    repo = simple_repo(make_repo, """
dynamic_batching { max_queue_delay_microseconds: 3000000 default_queue_policy { max_queue_size: 2 } }
""")
    srv = server_factory([repo])
    a = np.zeros((1, 16), dtype=np.int32)
    body_inputs = [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")]
    # Three concurrent requests: two wait out the 3 s delay (max_batch_size 8 is never
    # reached), the third finds the queue full and is refused at once.
    with futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(
            lambda _: infer(srv, "simple", body_inputs, session=requests.Session()), range(3)))
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 200, 503], [r.text for r in results]
    assert_error([r for r in results if r.status_code == 503][0], 503, "max_queue_size")


def test_warmup_runs_before_ready(server_factory, make_repo):
    repo = simple_repo(make_repo, """
model_warmup [ { name: "zeros" batch_size: 4 count: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } } } ]
""")
    srv = server_factory([repo])
    assert srv.get("/v2/models/simple/ready").status_code == 200
    send(srv, 7)
    # Warmup executions are not user inferences.
    assert stats(srv)["inference_count"] == 1
    assert "warmup 1 sample" in srv.log()


def test_failing_warmup_fails_the_load(server_factory, make_repo):
    repo = simple_repo(make_repo, """
model_warmup [ { name: "from_file" batch_size: 1
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "missing.bin" } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } } ]
""")
    srv = server_factory([repo], ["--exit-on-error=false", "--strict-readiness=false"])
    idx = srv.post("/v2/repository/index", json={}).json()
    entry = [e for e in idx if e["name"] == "simple"][0]
    assert entry["state"] == "UNAVAILABLE"
    assert "warmup" in entry["reason"] and "missing.bin" in entry["reason"]


def test_warmup_from_file(server_factory, make_repo):
    repo = simple_repo(make_repo, """
model_warmup [ { name: "from_file" batch_size: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "in0.bin" } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } } ]
""")
    (repo / "simple" / "warmup").mkdir()
    (repo / "simple" / "warmup" / "in0.bin").write_bytes(np.arange(16, dtype=np.int32).tobytes())
    srv = server_factory([repo])
    assert srv.get("/v2/models/simple/ready").status_code == 200
