"""The response cache (--cache-config local,size=N and response_cache { enable: true }) against
the real server: a hit answers without running the model (the model's execution_count does not
move), a changed input byte misses, LRU eviction under a small size, hit/miss statistics over
HTTP and gRPC, Triton's nv_cache_* metrics, a cached ensemble, the flags."""

import re
import subprocess

import numpy as np
import pytest
import requests

from conftest import INFERD_BIN
from test_ensemble import CHAIN, write_ensemble
from v2client import infer, make_input, parse_response

CACHE_ON = "\nresponse_cache { enable: true }\n"


def cached_repo(make_repo, names=("simple",)):
    repo = make_repo({n: n for n in names})
    for n in names:
        cfg = repo / n / "config.pbtxt"
        cfg.write_text(cfg.read_text() + CACHE_ON)
    return repo


def stats(srv, model):
    r = srv.get(f"/v2/models/{model}/stats")
    assert r.status_code == 200, r.text
    s = r.json()["model_stats"][0]
    i = s["inference_stats"]
    return {"exec": s["execution_count"], "inferences": s["inference_count"],
            "success": i["success"]["count"], "hit": i["cache_hit"]["count"],
            "miss": i["cache_miss"]["count"], "hit_ns": i["cache_hit"]["ns"],
            "miss_ns": i["cache_miss"]["ns"]}


def call_simple(srv, a, b, binary=True):
    r = infer(srv, "simple", [make_input("INPUT0", a, "INT32", binary=binary),
                              make_input("INPUT1", b, "INT32", binary=binary)])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    return out


def ab(seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32),
            rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32))


def metric(srv, name, model):
    text = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text
    m = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', text, re.M)
    assert m, f"{name} for {model} not in /metrics:\n{text[:3000]}"
    return float(m.group(1))


def test_hit_does_not_run_the_model_and_a_changed_byte_misses(make_repo, server_factory):
    srv = server_factory(cached_repo(make_repo), ["--cache-config=local,size=1048576"])
    a, b = ab(1)
    call_simple(srv, a, b)
    s1 = stats(srv, "simple")
    assert (s1["exec"], s1["miss"], s1["hit"]) == (1, 1, 0)
    for binary in (True, False):  # the JSON form of the same tensors is the same request
        call_simple(srv, a, b, binary=binary)
    s2 = stats(srv, "simple")
    assert s2["exec"] == 1, "a cache hit ran the model"
    assert (s2["hit"], s2["miss"], s2["success"]) == (2, 1, 3)
    assert s2["inferences"] == 1  # Triton: inference_count leaves cached requests out
    assert s2["hit_ns"] > 0 and s2["miss_ns"] > 0
    # One byte of one input differs: a miss that runs the model.
    a2 = a.copy()
    a2[0, 7] ^= 1
    call_simple(srv, a2, b)
    s3 = stats(srv, "simple")
    assert (s3["exec"], s3["miss"], s3["hit"]) == (2, 2, 2)
    # Asking for one output only is a different request (not answered with both).
    r = infer(srv, "simple", [make_input("INPUT0", a, "INT32", binary=True),
                              make_input("INPUT1", b, "INT32", binary=True)],
              outputs=[{"name": "OUTPUT1"}])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    assert list(out) == ["OUTPUT1"]
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    assert stats(srv, "simple")["exec"] == 3
    # Triton's per-model cache metrics.
    assert metric(srv, "nv_cache_num_hits_per_model", "simple") == 2
    assert metric(srv, "nv_cache_num_misses_per_model", "simple") == 3
    assert metric(srv, "nv_cache_hit_duration_per_model", "simple") >= 0
    assert metric(srv, "nv_inference_exec_count", "simple") == 3


def test_lru_eviction_under_a_small_size(make_repo, server_factory):
    # One `simple` response takes about 500 bytes of the budget: two fit in 1,200, not three.
    srv = server_factory(cached_repo(make_repo), ["--cache-config=local,size=1200"])
    A, B, C = ab(1), ab(2), ab(3)

    def run(x):
        before = stats(srv, "simple")["exec"]
        call_simple(srv, *x)
        return "miss" if stats(srv, "simple")["exec"] > before else "hit"

    assert [run(A), run(B), run(A)] == ["miss", "miss", "hit"]
    # C pushes out the least recently used, B; A (used since) stays.
    assert run(C) == "miss"
    assert run(A) == "hit"
    assert run(B) == "miss"


def test_model_enabling_the_cache_runs_uncached_without_a_server_cache(make_repo, server_factory):
    srv = server_factory(cached_repo(make_repo))  # no --cache-config: loads, nothing is cached
    a, b = ab(4)
    for _ in range(3):
        call_simple(srv, a, b)
    s = stats(srv, "simple")
    assert (s["exec"], s["hit"], s["miss"]) == (3, 0, 0)


def test_deprecated_byte_size_flag_and_flag_conflicts(make_repo, server_factory, tmp_path):
    srv = server_factory(cached_repo(make_repo), ["--response-cache-byte-size=65536"])
    a, b = ab(5)
    call_simple(srv, a, b)
    call_simple(srv, a, b)
    s = stats(srv, "simple")
    assert (s["exec"], s["hit"]) == (1, 1)
    for args, why in [
        (["--response-cache-byte-size=1024", "--cache-config=local,size=1024"], "Incompatible flags"),
        (["--cache-config=redis,host=x"], "cache 'redis'"),
        (["--cache-config=local,size=lots"], "'lots'"),
        (["--cache-config=local"], "<cache name>,<setting>=<value>"),
    ]:
        p = subprocess.run([str(INFERD_BIN), f"--model-repository={tmp_path}", *args],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0, args
        assert why in p.stderr + p.stdout, (args, p.stderr)


def test_cached_ensemble_and_grpc_statistics(make_repo, server_factory, pb):
    repo = make_repo({"simple": "simple"})
    write_ensemble(repo, "chain", CHAIN + CACHE_ON)
    srv = server_factory(repo, ["--cache-config=local,size=1048576"])
    srv.wait_until(lambda: srv.get("/v2/models/chain/ready").status_code == 200, 60, "chain")
    a, b = ab(6)
    for _ in range(3):
        r = infer(srv, "chain", [make_input("A", a, "INT32", binary=True),
                                 make_input("B", b, "INT32", binary=True)])
        assert r.status_code == 200, r.text
        _, out = parse_response(r)
        np.testing.assert_array_equal(out["TWICE_A"], 2 * a)
        np.testing.assert_array_equal(out["TWICE_B"], 2 * b)
    # The ensemble ran its two steps once; the two later calls were answered from the cache.
    assert stats(srv, "simple")["exec"] == 2
    s = stats(srv, "chain")
    assert (s["hit"], s["miss"], s["success"]) == (2, 1, 3)
    import grpc
    pb2, pb2_grpc = pb
    stub = pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}"))
    g = stub.ModelStatistics(pb2.ModelStatisticsRequest(name="chain"), timeout=10)
    st = g.model_stats[0].inference_stats
    assert (st.cache_hit.count, st.cache_miss.count) == (2, 1)
    assert st.cache_hit.ns > 0
    # A streaming client gets the cached answer too (through the stream, once, final).
    req = pb2.ModelInferRequest(model_name="chain")
    for name, arr in (("A", a), ("B", b)):
        req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        req.raw_input_contents.append(arr.tobytes())
    answers = list(stub.ModelStreamInfer(iter([req]), timeout=10))
    assert len(answers) == 1 and not answers[0].error_message, answers
    out = answers[0].infer_response
    got = {o.name: np.frombuffer(raw, np.int32) for o, raw in zip(out.outputs, out.raw_output_contents)}
    np.testing.assert_array_equal(got["TWICE_A"], 2 * a.ravel())
    assert stats(srv, "chain")["hit"] == 3 and stats(srv, "simple")["exec"] == 2
