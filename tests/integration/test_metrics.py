"""Prometheus metrics with Triton's names, parsed by a real Prometheus text parser
(python3-prometheus-client); counters move by exactly the number of requests sent."""

import re

import numpy as np
import requests
from prometheus_client.parser import text_string_to_metric_families

from v2client import infer, make_input


def scrape(srv):
    r = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    # The parser reports a counter's samples with a "_total" suffix; Triton's names have none.
    key = tuple(sorted(labels.items()))
    return samples.get((name, key), samples.get((name + "_total", key), 0.0))


def test_counters_move_by_exactly_the_requests_sent(server):
    before = scrape(server)
    a = np.ones((2, 16), dtype=np.int32)
    n = 7
    for _ in range(n):
        r = infer(server, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
        assert r.status_code == 200
    bad = infer(server, "simple", [make_input("INPUT0", a, "INT32")])  # missing INPUT1
    assert bad.status_code == 400
    after = scrape(server)
    lbl = {"model": "simple", "version": "1"}
    assert value(after, "nv_inference_request_success", **lbl) - \
        value(before, "nv_inference_request_success", **lbl) == n
    assert value(after, "nv_inference_count", **lbl) - value(before, "nv_inference_count", **lbl) == 2 * n
    assert value(after, "nv_inference_exec_count", **lbl) - \
        value(before, "nv_inference_exec_count", **lbl) == n
    assert value(after, "nv_inference_request_failure", reason="OTHER", **lbl) - \
        value(before, "nv_inference_request_failure", reason="OTHER", **lbl) == 1
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                 "nv_inference_compute_output_duration_us"):
        assert value(after, name, **lbl) >= value(before, name, **lbl), name
    assert value(after, "nv_inference_compute_infer_duration_us", **lbl) > 0
    assert ("nv_inference_pending_request_count", tuple(sorted(lbl.items()))) in after
    assert value(after, "nv_model_load_duration_secs", **lbl) > 0


def test_failure_lines_keep_tritons_label_order(server):
    # Triton writes labels in name order (prometheus-cpp), and its clients, its own QA among
    # them, match the whole line: nv_inference_request_failure{model=...,reason=...,version=...}.
    a = np.ones((2, 16), dtype=np.int32)
    assert infer(server, "simple", [make_input("INPUT0", a, "INT32")]).status_code == 400
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    lines = [l for l in text.splitlines() if l.startswith("nv_inference_request_failure{")]
    assert lines
    for l in lines:
        assert re.fullmatch(r'nv_inference_request_failure\{model="[^"]+",reason="[A-Z]+",'
                            r'version="\d+"\} \d+', l), l


def test_system_metrics(server):
    s = scrape(server)
    total = value(s, "nv_cpu_memory_total_bytes")
    used = value(s, "nv_cpu_memory_used_bytes")
    assert total > 0 and 0 < used <= total
    util = value(s, "nv_cpu_utilization")
    assert 0.0 <= util <= 1.0
    assert ("nv_cpu_utilization", ()) in s


def test_exposition_uses_tritons_names(server):
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    for name in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                 "nv_inference_exec_count", "nv_inference_pending_request_count",
                 "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                 "nv_inference_compute_output_duration_us", "nv_model_load_duration_secs",
                 "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert f"# TYPE {name} " in text, name
    assert 'nv_inference_request_success{model="simple",version="1"}' in text


def test_only_metrics_path_is_served(server):
    r = requests.get(f"http://127.0.0.1:{server.metrics_port}/other", timeout=10)
    assert r.status_code == 404
