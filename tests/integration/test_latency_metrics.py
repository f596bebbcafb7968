"""--metrics-config: tritonserver's latency histogram and summaries (names, labels, buckets), the
counts adding up to the requests sent, summary quantiles against the latencies the client saw,
the pending / in-flight gauges, and refused settings.

The model is the identity backend with a fixed execute delay and one instance, so N requests sent
at once finish after 1, 2, ..., N delays: a latency distribution known in advance."""

import json
import re
import selectors
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import INFERD_BIN

DELAY_MS = 25
N = 10

SLOW = """
name: "slow"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 } ]
parameters { key: "execute_delay_ms" value: { string_value: "%d" } }
%s
""" % (DELAY_MS, "%s")

BUCKETS = """model_metrics { metric_control: [ { metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                                 histogram_options: { buckets: [ 35, 160, 1000 ] } } ] }"""

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                               "data": [1, 2, 3, 4]}]}).encode()
LBL = (("model", "slow"), ("version", "1"))


def QL(q):
    return tuple(sorted(LBL + (("quantile", q),)))


def make_slow_repo(tmp_path, extra=""):
    repo = tmp_path / "latency_repo"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW % extra)
    return repo


def scrape(srv):
    r = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10)
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    return r.text, families


def samples(families, name):
    """{(sample name, labels tuple): value} of one family."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in families[name].samples}


def send_concurrently(srv, n):
    """n requests on n open connections, sent together from one thread (no thread scheduling
    in the measurement); returns each one's latency (s) as the client saw it."""
    req = (b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(BODY)) + BODY
    socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(n)]
    sel = selectors.DefaultSelector()
    bufs = {}
    start = time.perf_counter()
    for s in socks:
        s.sendall(req)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        bufs[s] = b""
    latencies = {}
    deadline = start + 30
    while len(latencies) < n and time.perf_counter() < deadline:
        for key, _ in sel.select(timeout=1):
            s = key.fileobj
            bufs[s] += s.recv(65536)
            head, sep, body = bufs[s].partition(b"\r\n\r\n")
            if sep:
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                if len(body) >= length:
                    latencies[s] = time.perf_counter() - start
                    assert head.startswith(b"HTTP/1.1 200"), head
                    sel.unregister(s)
    for s in socks:
        s.close()
    assert len(latencies) == n
    return list(latencies.values())


def test_histogram_and_summaries_follow_the_requests(tmp_path, server_factory):
    srv = server_factory(make_slow_repo(tmp_path, BUCKETS),
                         ["--metrics-config=histogram_latencies=true",
                          "--metrics-config=summary_latencies=true",
                          "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01"])
    srv.wait_until(lambda: srv.get("/v2/models/slow/ready").status_code == 200, 30, "slow ready")
    client = send_concurrently(srv, N)
    text, fam = scrape(srv)

    # The histogram: Triton's family, _bucket/_count/_sum, le bounds from model_metrics.
    assert "# TYPE nv_inference_first_response_histogram_ms histogram" in text
    h = samples(fam, "nv_inference_first_response_histogram_ms")
    name = "nv_inference_first_response_histogram_ms"
    assert h[(name + "_count", LBL)] == N
    # Finishing after 1..N delays of 25 ms: about 1 request <= 35 ms, 6 <= 160, all <= 1000. The
    # server's time is the client's less the network and HTTP parsing (a few ms at most).
    buckets = {dict(k[1])["le"]: v for k, v in h.items() if k[0] == name + "_bucket"}
    assert set(buckets) == {"35", "160", "1000", "+Inf"}, buckets
    client_ms = np.array(client) * 1000
    for le in ("35", "160", "1000"):
        assert (client_ms <= float(le)).sum() <= buckets[le] <= (client_ms <= float(le) + 20).sum(), \
            (le, buckets, sorted(client_ms))
    assert buckets["+Inf"] == N
    assert client_ms.sum() - 20 * N <= h[(name + "_sum", LBL)] <= client_ms.sum()

    # Summaries: every family Triton exports, count == requests, the quantiles asked for.
    for fam_name in ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
                     "nv_inference_compute_input_summary_us",
                     "nv_inference_compute_infer_summary_us",
                     "nv_inference_compute_output_summary_us"):
        assert f"# TYPE {fam_name} summary" in text
        s = samples(fam, fam_name)
        assert s[(fam_name + "_count", LBL)] == N, fam_name
        qs = sorted(dict(k[1])["quantile"] for k in s if k[0] == fam_name)
        assert qs == ["0.5", "0.9"], (fam_name, qs)
    s = samples(fam, "nv_inference_request_summary_us")
    lat = np.array(client) * 1e6
    for q in ("0.5", "0.9"):
        server_us = s[("nv_inference_request_summary_us", QL(q))]
        client_us = np.quantile(lat, float(q), method="inverted_cdf")
        # The server's time excludes the network and HTTP parsing; its sketch is within 1.6%.
        assert abs(server_us - client_us) <= 0.1 * client_us + 10000, (q, server_us, client_us)
    # The backend's time (the identity backend sleeps in compute infer): the delay, each time.
    median = sum(samples(fam, f)[(f, QL("0.5"))]
                 for f in ("nv_inference_compute_input_summary_us",
                           "nv_inference_compute_infer_summary_us",
                           "nv_inference_compute_output_summary_us"))
    assert DELAY_MS * 1000 * 0.98 <= median <= DELAY_MS * 1000 * 1.3, median
    # Summary sums agree with the duration counters.
    counters = samples(fam, "nv_inference_queue_duration_us")
    queue_counter = list(counters.values())[0]
    queue_sum = samples(fam, "nv_inference_queue_summary_us")[("nv_inference_queue_summary_us_sum", LBL)]
    assert abs(queue_counter - queue_sum) <= N


def test_defaults_and_counter_latencies_false(tmp_path, server_factory):
    repo = make_slow_repo(tmp_path)
    plain = server_factory(repo)
    off = server_factory(repo, ["--metrics-config=counter_latencies=false"])
    for srv in (plain, off):
        srv.wait_until(lambda: srv.get("/v2/models/slow/ready").status_code == 200, 30, "ready")
        send_concurrently(srv, 2)
    text, fam = scrape(plain)
    assert "nv_inference_first_response_histogram_ms" not in text
    assert "summary_us" not in text
    assert "nv_inference_request_duration_us" in fam
    text, fam = scrape(off)
    assert "nv_inference_request_duration_us" not in fam
    assert "nv_inference_compute_infer_duration_us" not in fam
    assert samples(fam, "nv_inference_request_success")[("nv_inference_request_success_total", LBL)] == 2


def test_pending_and_in_flight_gauges(tmp_path, server_factory):
    srv = server_factory(make_slow_repo(tmp_path))
    srv.wait_until(lambda: srv.get("/v2/models/slow/ready").status_code == 200, 30, "ready")
    seen = []
    sender = threading.Thread(target=send_concurrently, args=(srv, N))
    sender.start()
    while sender.is_alive():
        _, fam = scrape(srv)
        pending = samples(fam, "nv_inference_pending_request_count")[
            ("nv_inference_pending_request_count", LBL)]
        in_flight = samples(fam, "inferd_inference_in_flight_request_count")[
            ("inferd_inference_in_flight_request_count", LBL)]
        seen.append((pending, in_flight))
        time.sleep(0.01)
    sender.join()
    # One instance executes one request; the rest are pending, and in flight is one more.
    assert any(p >= 2 and f == p + 1 for p, f in seen), seen
    _, fam = scrape(srv)
    assert samples(fam, "nv_inference_pending_request_count")[
        ("nv_inference_pending_request_count", LBL)] == 0


@pytest.mark.parametrize("setting,named", [
    ("summary_max_age=30", "summary_max_age"),
    ("histogram_latencies=yes", "histogram_latencies=yes"),
    ("summary_quantiles=0.5", "0.5"),
    ("nokey", "nokey"),
])
def test_bad_metrics_config_is_refused(tmp_path, setting, named):
    proc = subprocess.run([str(INFERD_BIN), f"--model-repository={tmp_path}",
                           f"--metrics-config={setting}"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode != 0
    assert named in proc.stderr + proc.stdout


def test_unknown_histogram_family_in_model_metrics_loads_with_a_warning(tmp_path, server_factory):
    # As tritonserver (qa/L0_model_config model_metrics/valid_config_with_warn): a family that
    # is not customizable changes nothing, and one WARNING names it.
    bad = """model_metrics { metric_control: [ { metric_identifier: { family: "nv_nope" }
             histogram_options: { buckets: [ 1 ] } } ] }"""
    srv = server_factory(make_slow_repo(tmp_path, bad), ["--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/slow/ready").status_code == 200, 60, "slow to load")
    assert "Metric family 'nv_nope' in 'metric_identifier' is not a customizable metric" in srv.log()


@pytest.mark.parametrize("control,named", [
    ('histogram_options: { buckets: [ 1 ] }', "must specify 'metric_identifier'"),
    ('metric_identifier: { } histogram_options: { buckets: [ 1 ] }', "non-empty 'family'"),
    ('metric_identifier: { family: "nv_inference_first_response_histogram_ms" }',
     "must specify 'histogram_options'"),
    ('metric_identifier: { family: "nv_inference_first_response_histogram_ms" } '
     'histogram_options: { }', "non-empty 'buckets'"),
])
def test_incomplete_model_metrics_fails_the_load(tmp_path, server_factory, control, named):
    # Triton's ValidateModelMetrics (qa/L0_model_config model_metrics/invalid_config).
    bad = "model_metrics { metric_control: [ { " + control + " } ] }"
    srv = server_factory(make_slow_repo(tmp_path, bad), ["--exit-on-error=false"])

    def reason():
        index = srv.post("/v2/repository/index", json={}).json()
        return next((e.get("reason", "") for e in index if e["name"] == "slow"), "")
    srv.wait_until(reason, 60, "the refusal")
    assert named in reason(), reason()
    assert srv.get("/v2/models/slow/ready").status_code != 200
