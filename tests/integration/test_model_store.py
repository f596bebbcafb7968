"""The model store against the real server: --model-control-mode=on-demand (a model's first
request loads it; racing first requests share one load; the wait limit), one memory budget
over every model (the eviction policy's choices, pinned and in-flight models never evicted,
the 507 message), a failed reload that leaves the serving version in place, an archive that
holds an ensemble and its parts, and start-up errors for repositories that do not exist.
Answers are checked against numpy; what the store did is read from its metrics and index."""

import concurrent.futures as futures
import re
import shutil
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import free_port, launch
from test_ensemble import CHAIN
from v2client import infer, make_input, parse_response

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)

WARMUP = """
model_warmup [ {{ name: "slow" batch_size: 1 count: {count}
  inputs {{ key: "INPUT0" value: {{ data_type: TYPE_INT32 dims: [ 16 ] zero_data: true }} }}
  inputs {{ key: "INPUT1" value: {{ data_type: TYPE_INT32 dims: [ 16 ] zero_data: true }} }}
}} ]
"""


def simple_inputs():
    return [make_input("INPUT0", A, "INT32", binary=True), make_input("INPUT1", B, "INT32", binary=True)]


def check_simple(r):
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def add_simple(repo, example_models, name, warmup=0, pad_bytes=0, extra=""):
    """A copy of the example `simple` as `name`; `warmup` runs make its load slow (about 20 us
    each), `pad_bytes` makes it bigger on disk (for disk accounting)."""
    d = Path(repo) / name
    shutil.copytree(Path(example_models) / "simple", d)
    cfg = (d / "config.pbtxt").read_text().replace('name: "simple"', f'name: "{name}"')
    if warmup:
        cfg += WARMUP.format(count=warmup)
    (d / "config.pbtxt").write_text(cfg + extra)
    if pad_bytes:
        (d / "1" / "padding.bin").write_bytes(b"\0" * pad_bytes)
    return d


def metrics(srv):
    return requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text


def metric(srv, name):
    for line in metrics(srv).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the metrics")


def resident(srv):
    return sorted(set(re.findall(r'inferd_model_memory_bytes\{model="([^"]+)"', metrics(srv))))


def index(srv):
    r = srv.post("/v2/repository/index", json={})
    assert r.status_code == 200, r.text
    return {e["name"]: e for e in r.json()}


@pytest.fixture(scope="module")
def warmup_rate(tmp_path_factory, example_models, logs_dir):
    """Warmup runs per second of load on this machine and build (sanitizers are slower), so a
    test can make a load that takes a given time."""
    repo = tmp_path_factory.mktemp("calibrate")
    add_simple(repo, example_models, "probe", warmup=20000)
    srv = launch(repo, ["--model-control-mode=explicit", "--load-model=probe"], logs_dir)
    try:
        deadline = time.monotonic() + 300
        while "loaded model 'probe' in" not in srv.log():
            assert srv.proc.poll() is None and time.monotonic() < deadline, srv.log()
            time.sleep(0.1)
        seconds = float(re.search(r"loaded model 'probe' in (\S+) s", srv.log()).group(1))
    finally:
        srv.stop()
    return 20000 / max(seconds, 1e-3)


def slow_count(warmup_rate, seconds):
    return max(1000, int(warmup_rate * seconds))


def simple_size(example_models):
    return sum(f.stat().st_size for f in (Path(example_models) / "simple" / "1").rglob("*")
               if f.is_file())


# ---- on demand --------------------------------------------------------------------------------


def test_first_request_loads_and_readiness_never_does(make_repo, server_factory, example_models):
    repo = make_repo({})
    for n in ("a", "b", "c"):
        add_simple(repo, example_models, n)
    srv = server_factory(repo, ["--model-control-mode=on-demand"])
    assert srv.get("/v2/health/ready").status_code == 200  # nothing pinned, nothing failing
    # The index lists every model the repository holds, none loaded.
    assert {n: e.get("state", "") for n, e in index(srv).items()} == {"a": "", "b": "", "c": ""}
    # Readiness never loads.
    assert srv.get("/v2/models/a/ready").status_code == 400
    assert "state" not in index(srv)["a"]
    # An infer loads `a`; a metadata request loads `b`; a config request loads `c`.
    check_simple(infer(srv, "a", simple_inputs()))
    md = srv.get("/v2/models/b")
    assert md.status_code == 200 and md.json()["name"] == "b", md.text
    cfg = srv.get("/v2/models/c/config")
    assert cfg.status_code == 200 and cfg.json()["max_batch_size"] == 8, cfg.text
    assert {n: e["state"] for n, e in index(srv).items()} == {"a": "READY", "b": "READY", "c": "READY"}
    assert srv.get("/v2/models/a/ready").status_code == 200
    # A name no repository holds: 404 naming it; path parts: 400.
    r = infer(srv, "nope", simple_inputs())
    assert r.status_code == 404 and "Request for unknown model: 'nope' is not found" in r.json()["error"], r.text
    assert infer(srv, "..", simple_inputs()).status_code in (400, 404)
    # The statistics carry each version's measured footprint (Triton's memory_usage).
    stats = srv.get("/v2/models/a/stats").json()["model_stats"][0]
    assert stats["memory_usage"][0]["type"] == "CPU" and stats["memory_usage"][0]["byte_size"] > 0


def test_grpc_metadata_loads_on_demand(make_repo, server_factory, example_models, pb):
    import grpc
    pb2, pb2_grpc = pb
    repo = make_repo({})
    add_simple(repo, example_models, "g")
    srv = server_factory(repo, ["--model-control-mode=on-demand"])
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as ch:
        stub = pb2_grpc.GRPCInferenceServiceStub(ch)
        md = stub.ModelMetadata(pb2.ModelMetadataRequest(name="g"), timeout=60)
        assert md.name == "g" and [t.name for t in md.inputs] == ["INPUT0", "INPUT1"]
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelConfig(pb2.ModelConfigRequest(name="missing"), timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        stats = stub.ModelStatistics(pb2.ModelStatisticsRequest(name="g"), timeout=60)
        assert stats.model_stats[0].memory_usage[0].byte_size > 0


def test_fifty_racing_first_requests_share_one_load(make_repo, server_factory, example_models,
                                                    warmup_rate):
    repo = make_repo({})
    add_simple(repo, example_models, "slow", warmup=slow_count(warmup_rate, 1))  # 1 s to load
    srv = server_factory(repo, ["--model-control-mode=on-demand"])
    with futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda _: infer(srv, "slow", simple_inputs()), range(50)))
    for r in results:
        check_simple(r)
    time.sleep(2.5)  # longer than a load: a second one would have finished by now
    assert metric(srv, 'inferd_model_loads_total{result="success"}') == 1
    assert srv.log().count("loaded model 'slow' in") == 1
    assert metric(srv, "inferd_model_load_waits_total") >= 2  # they did race


def test_wait_limit_answers_503_then_the_load_serves(make_repo, server_factory, example_models,
                                                     warmup_rate):
    repo = make_repo({})
    add_simple(repo, example_models, "slow", warmup=slow_count(warmup_rate, 4))  # 4 s
    srv = server_factory(repo, ["--model-control-mode=on-demand", "--model-load-wait-secs=1"])
    t0 = time.monotonic()
    r = infer(srv, "slow", simple_inputs())
    waited = time.monotonic() - t0
    assert r.status_code == 503, r.text
    assert "still loading" in r.json()["error"] and "--model-load-wait-secs" in r.json()["error"]
    assert 0.8 < waited < 3.5, waited
    srv.wait_until(lambda: srv.get("/v2/models/slow/ready").status_code == 200, 120, "slow loaded")
    check_simple(infer(srv, "slow", simple_inputs()))
    assert metric(srv, "inferd_model_load_wait_timeouts_total") == 1


def test_a_slow_load_does_not_hold_up_another(make_repo, server_factory, example_models,
                                              warmup_rate):
    repo = make_repo({})
    add_simple(repo, example_models, "slow", warmup=slow_count(warmup_rate, 3))
    add_simple(repo, example_models, "quick")
    srv = server_factory(repo, ["--model-control-mode=on-demand"])
    with futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(infer, srv, "slow", simple_inputs())
        time.sleep(0.3)
        t0 = time.monotonic()
        check_simple(infer(srv, "quick", simple_inputs()))
        quick_s = time.monotonic() - t0
        check_simple(slow.result())
    slow_line = re.search(r"loaded model 'slow' in (\S+) s", srv.log())
    assert slow_line and float(slow_line.group(1)) > 2 * quick_s, (slow_line, quick_s)


# ---- one memory budget ------------------------------------------------------------------------


def test_pinned_models_stay_and_the_507_names_the_budget(make_repo, server_factory, example_models):
    repo = make_repo({})
    add_simple(repo, example_models, "pinned")
    add_simple(repo, example_models, "other")
    size = simple_size(example_models)
    srv = server_factory(repo, ["--model-control-mode=on-demand", "--load-model=pinned",
                                f"--model-memory-budget={int(size * 1.5)}",
                                "--model-memory-accounting=disk"])
    r = infer(srv, "other", simple_inputs())
    assert r.status_code == 507, r.text
    msg = r.json()["error"]
    assert f"memory budget (--model-memory-budget) is {int(size * 1.5)} bytes" in msg
    assert "pinned" in msg and f"needs about {size} bytes" in msg
    check_simple(infer(srv, "pinned", simple_inputs()))
    assert resident(srv) == ["pinned"]


def test_cost_aware_policy_keeps_the_big_slow_model(make_repo, server_factory, example_models,
                                                    warmup_rate):
    """A big model that takes long to load and is used steadily, and small ones used once each,
    in a budget that holds the big one and one small one. The cost-aware policy evicts the
    small ones for each other; LRU throws the big one out for the first small one."""
    size = simple_size(example_models)
    big = size * 4

    def run(policy):
        repo = make_repo({})
        add_simple(repo, example_models, "big", warmup=slow_count(warmup_rate, 0.5),
                   pad_bytes=big - size)
        for i in range(3):
            add_simple(repo, example_models, f"small{i}")
        srv = server_factory(repo, ["--model-control-mode=on-demand", "--model-memory-accounting=disk",
                                    f"--model-memory-budget={big + int(size * 1.5)}",
                                    f"--model-eviction-policy={policy}"])
        for _ in range(5):
            check_simple(infer(srv, "big", simple_inputs()))
        for i in range(3):
            check_simple(infer(srv, f"small{i}", simple_inputs()))
            # The budget holds after every load.
            assert metric(srv, "inferd_model_store_resident_bytes") <= big + size * 1.5
        check_simple(infer(srv, "big", simple_inputs()))
        return resident(srv), metric(srv, 'inferd_model_loads_total{result="success"}')

    kept, loads = run("cost-aware")
    assert kept == ["big", "small2"] and loads == 4
    kept, loads = run("lru")
    assert "big" in kept and loads == 5  # LRU evicted big for small0, then had to load it again


def test_a_model_with_requests_in_flight_is_never_evicted(make_repo, server_factory, example_models):
    size = simple_size(example_models)
    repo = make_repo({})
    # `held` keeps a lone request queued for 3 s (it waits for a batch of 8 that never comes).
    add_simple(repo, example_models, "held", extra="""
dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 3000000 }
""")
    add_simple(repo, example_models, "idle")
    # `newcomer` needs both out: with `held` busy, there is no room for it.
    add_simple(repo, example_models, "newcomer", pad_bytes=size)
    srv = server_factory(repo, ["--model-control-mode=on-demand", "--model-memory-accounting=disk",
                                f"--model-memory-budget={int(size * 2.5)}"])
    check_simple(infer(srv, "held", simple_inputs()))  # loads it (and waits the 3 s once)
    check_simple(infer(srv, "idle", simple_inputs()))

    def timed(name):
        r = infer(srv, name, simple_inputs())
        return r, time.monotonic()

    with futures.ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(timed, "held")
        time.sleep(0.5)
        # The budget is full only for now: the newcomer's load waits for room (within the
        # load-wait limit) instead of failing, and gets it once `held` is idle.
        newcomer = pool.submit(timed, "newcomer")
        held_r, held_done = in_flight.result()
        check_simple(held_r)
        new_r, new_done = newcomer.result()
        check_simple(new_r)
    assert new_done >= held_done, "room was made while `held` still had a request"
    assert resident(srv) == ["newcomer"]


def test_a_budget_full_for_now_is_not_remembered_as_a_failure(make_repo, server_factory,
                                                              example_models):
    size = simple_size(example_models)
    repo = make_repo({})
    add_simple(repo, example_models, "held", extra="""
dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 3000000 }
""")
    add_simple(repo, example_models, "newcomer", pad_bytes=size)
    srv = server_factory(repo, ["--model-control-mode=on-demand", "--model-memory-accounting=disk",
                                f"--model-memory-budget={int(size * 2.5)}", "--model-load-wait-secs=1"])
    check_simple(infer(srv, "held", simple_inputs()))
    with futures.ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(infer, srv, "held", simple_inputs())
        time.sleep(0.5)
        # Past the load-wait limit with `held` still busy: 503, retry later.
        r = infer(srv, "newcomer", simple_inputs())
        assert r.status_code == 503, r.text
        check_simple(in_flight.result())
    # Not a broken model: the next request (well within the 5 s a failed load is remembered)
    # loads it.
    check_simple(infer(srv, "newcomer", simple_inputs()))
    assert "evicted idle model 'held'" in srv.log()


def test_readiness_probes_do_not_keep_a_model_from_eviction(make_repo, server_factory,
                                                             example_models):
    size = simple_size(example_models)
    repo = make_repo({})
    for n in ("a", "b", "c"):
        add_simple(repo, example_models, n)
    srv = server_factory(repo, ["--model-control-mode=on-demand", "--model-memory-accounting=disk",
                                f"--model-memory-budget={int(size * 2.5)}", "--model-eviction-policy=lru"])
    check_simple(infer(srv, "a", simple_inputs()))
    check_simple(infer(srv, "b", simple_inputs()))
    for _ in range(20):  # a Kubernetes-style probe of `a`: not a use
        assert srv.get("/v2/models/a/ready").status_code == 200
    check_simple(infer(srv, "c", simple_inputs()))
    assert resident(srv) == ["b", "c"]


# ---- reloads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("breakage", ["config", "model_file"])
def test_failed_reload_keeps_the_serving_version(make_repo, server_factory, example_models, breakage):
    repo = make_repo({})
    d = add_simple(repo, example_models, "m")
    srv = server_factory(repo, ["--model-control-mode=explicit", "--load-model=m"])
    check_simple(infer(srv, "m", simple_inputs()))
    if breakage == "config":
        (d / "config.pbtxt").write_text("max_batch_size: oops\n")
    else:
        (d / "1" / "model.onnx").write_bytes(b"not an onnx file")
    r = srv.post("/v2/repository/models/m/load", json={})
    assert r.status_code >= 400, r.text
    # The old version keeps answering, and the index says why the reload failed.
    check_simple(infer(srv, "m", simple_inputs()))
    entry = [e for e in srv.post("/v2/repository/index", json={}).json() if e["name"] == "m"]
    assert entry and entry[0]["state"] == "READY", entry
    assert "reload failed" in entry[0]["reason"], entry


def test_poll_mode_failed_reload_keeps_serving(make_repo, server_factory, example_models):
    repo = make_repo({})
    d = add_simple(repo, example_models, "m")
    srv = server_factory(repo, ["--model-control-mode=poll", "--repository-poll-secs=1"])
    srv.wait_until(lambda: srv.get("/v2/models/m/ready").status_code == 200, 60, "m ready")
    (d / "1" / "model.onnx").write_bytes(b"broken")
    srv.wait_until(lambda: "reload failed" in index(srv)["m"].get("reason", ""), 30, "poll reload")
    check_simple(infer(srv, "m", simple_inputs()))


# ---- archives ---------------------------------------------------------------------------------


def test_multi_model_archive_with_an_ensemble_and_its_parts(server_factory, make_repo, tmp_path,
                                                           example_models):
    # The archive holds `chain` (an ensemble of two `simple` steps) and `simple`; the server's
    # own repository does not hold `simple`.
    src = tmp_path / "pkg"
    (src / "chain" / "1").mkdir(parents=True)
    (src / "chain" / "config.pbtxt").write_text(textwrap.dedent(CHAIN))
    shutil.copytree(Path(example_models) / "simple", src / "simple")
    archive = tmp_path / "chain.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "chain", arcname="chain")
        tar.add(src / "simple", arcname="simple")
    repo = make_repo({})
    sm_port = free_port()
    srv = server_factory(repo, ["--allow-sagemaker=true", f"--sagemaker-port={sm_port}",
                                "--sagemaker-address=127.0.0.1", f"--model-cache-dir={tmp_path / 'cache'}"])
    url = f"http://127.0.0.1:{sm_port}"
    r = requests.post(f"{url}/models", json={"model_name": "pipeline", "url": str(archive)}, timeout=60)
    assert r.status_code == 200, r.text
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 7, dtype=np.int32)
    body = {"inputs": [{"name": "A", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
                       {"name": "B", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()}]}
    r = requests.post(f"{url}/models/pipeline/invoke", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_array_equal(out["TWICE_A"], 2 * a)
    np.testing.assert_array_equal(out["TWICE_B"], 2 * b)
    # Deleting the ensemble takes its parts with it.
    assert requests.delete(f"{url}/models/pipeline", timeout=60).status_code == 200
    assert srv.get("/v2/models/simple/ready").status_code == 400


def test_two_archives_sharing_a_part_name(server_factory, make_repo, tmp_path, example_models):
    """Two ensemble archives whose parts have the same name share the loaded part; deleting one
    ensemble leaves the part for the other."""
    archives = []
    for n in ("one", "two"):
        src = tmp_path / f"pkg_{n}"
        (src / "chain" / "1").mkdir(parents=True)
        (src / "chain" / "config.pbtxt").write_text(textwrap.dedent(CHAIN))
        shutil.copytree(Path(example_models) / "simple", src / "simple")
        archive = tmp_path / f"{n}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(src / "chain", arcname="chain")
            tar.add(src / "simple", arcname="simple")
        archives.append(archive)
    sm_port = free_port()
    server_factory(make_repo({}), ["--allow-sagemaker=true", f"--sagemaker-port={sm_port}",
                                   "--sagemaker-address=127.0.0.1",
                                   f"--model-cache-dir={tmp_path / 'cache'}"])
    url = f"http://127.0.0.1:{sm_port}"
    for n, archive in zip(("one", "two"), archives):
        r = requests.post(f"{url}/models", json={"model_name": n, "url": str(archive)}, timeout=60)
        assert r.status_code == 200, r.text
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    body = {"inputs": [{"name": "A", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
                       {"name": "B", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()}]}
    assert requests.delete(f"{url}/models/one", timeout=60).status_code == 200
    r = requests.post(f"{url}/models/two/invoke", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_array_equal(out["TWICE_A"], 2 * a)
    # The last ensemble leaving takes the part with it.
    assert requests.delete(f"{url}/models/two", timeout=60).status_code == 200
    r = requests.post(f"{url}/models/two/invoke", json=body, timeout=60)
    assert r.status_code == 404, r.text


def test_sagemaker_invoke_loads_the_target_model_on_demand(server_factory, tmp_path, example_models):
    repo = tmp_path / "archives"
    repo.mkdir()
    with tarfile.open(repo / "simple.tar.gz", "w:gz") as tar:
        tar.add(Path(example_models) / "simple", arcname="simple")
    sm_port = free_port()
    srv = server_factory(repo, ["--allow-sagemaker=true", f"--sagemaker-port={sm_port}",
                                "--sagemaker-address=127.0.0.1", "--model-control-mode=on-demand",
                                f"--model-cache-dir={tmp_path / 'cache'}"])
    url = f"http://127.0.0.1:{sm_port}"
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.ravel().tolist()}]}
    r = requests.post(f"{url}/models/abc123/invoke", json=body,
                      headers={"X-Amzn-SageMaker-Target-Model": "simple.tar.gz"}, timeout=60)
    assert r.status_code == 200, r.text
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    assert r.json()["model_name"] == "abc123"
    # A TargetModel the repository does not hold: 404 naming it.
    r = requests.post(f"{url}/models/other/invoke", json=body,
                      headers={"X-Amzn-SageMaker-Target-Model": "missing.tar.gz"}, timeout=60)
    assert r.status_code == 404 and "missing.tar.gz" in r.json()["error"], r.text
    # The index lists the archive the repository holds.
    assert "simple.tar.gz" in index(srv)


# ---- start-up -----------------------------------------------------------------------------------


def test_a_repository_that_does_not_exist_fails_the_start(tmp_path, logs_dir):
    srv = launch([tmp_path / "missing"], [], logs_dir)
    assert srv.proc.wait(timeout=30) == 1
    assert f"model repository '{tmp_path / 'missing'}' does not exist" in srv.log()
