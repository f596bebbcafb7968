"""GPU metrics with Triton's names from NVML, through tests/fakes/fake_nvml.cc (two GPUs with fixed
figures) loaded in place of libnvidia-ml.so.1 by the INFERD_NVML_LIBRARY test seam; and, with no
NVML (this machine has no driver), no GPU metrics, one INFO line and no error."""

import os
import re

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import INFERD_BIN

FAKE_NVML = INFERD_BIN.parent / "tests" / "fakes" / "libfake_nvml.so"
A10G = "GPU-00000000-1111-2222-3333-444444444444"
T4 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
GPU_FAMILIES = {
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
    "nv_energy_consumption": ("counter", "GPU energy consumption in joules since the Triton Server started"),
}


@pytest.fixture
def fake_nvml(monkeypatch):
    if not FAKE_NVML.exists():
        pytest.skip(f"{FAKE_NVML} not built")
    monkeypatch.setenv("INFERD_NVML_LIBRARY", str(FAKE_NVML))  # inherited by the server


def scrape_text(srv):
    r = requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10)
    assert r.status_code == 200
    return r.text


def samples(text):
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name.removesuffix("_total"), s.labels.get("gpu_uuid"))] = s.value
    return out


def test_six_metrics_with_values_units_and_labels(server_factory, make_repo, fake_nvml):
    srv = server_factory(make_repo({"simple": "simple"}), ["--metrics-interval-ms=100"])
    text = scrape_text(srv)
    for name, (kind, help_text) in GPU_FAMILIES.items():
        assert f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n" in text, name
    s = samples(text)
    assert s[("nv_gpu_utilization", A10G)] == 0.37 and s[("nv_gpu_utilization", T4)] == 1.0
    assert s[("nv_gpu_memory_total_bytes", A10G)] == 24 << 30
    assert s[("nv_gpu_memory_used_bytes", A10G)] == 1 << 30
    assert s[("nv_gpu_memory_total_bytes", T4)] == 16 << 30
    assert s[("nv_gpu_memory_used_bytes", T4)] == 512 << 20
    assert s[("nv_gpu_power_usage", A10G)] == 61.234  # watts (NVML: 61234 mW)
    assert s[("nv_gpu_power_limit", A10G)] == 300.0
    assert ("nv_gpu_power_limit", T4) not in s  # the fake T4 answers NOT_SUPPORTED
    # Joules since start: the fake's count grows 2.5 J a reading, read every 100 ms.
    first = s[("nv_energy_consumption", A10G)]
    assert first >= 0 and first % 2.5 == 0
    srv.wait_until(lambda: samples(scrape_text(srv))[("nv_energy_consumption", A10G)] > first,
                   30, "the energy counter to grow")
    log = srv.log()
    assert "Collecting metrics for GPU 0: Fake A10G" in log, log
    assert "Collecting metrics for GPU 1: Fake T4" in log, log
    # The CPU metrics are still there.
    assert "# TYPE nv_cpu_utilization gauge" in text


def test_allow_gpu_metrics_false_removes_them(server_factory, make_repo, fake_nvml):
    srv = server_factory(make_repo({"simple": "simple"}), ["--allow-gpu-metrics=false"])
    text = scrape_text(srv)
    for name in GPU_FAMILIES:
        assert name not in text, name
    assert "# TYPE nv_cpu_utilization gauge" in text
    assert "has no effect" not in srv.log()


def test_no_nvml_no_gpu_metrics_one_info_line(server_factory, make_repo, monkeypatch):
    monkeypatch.setenv("INFERD_NVML_LIBRARY", "/no/such/dir/libnvidia-ml.so.1")
    srv = server_factory(make_repo({"simple": "simple"}))
    text = scrape_text(srv)
    for name in GPU_FAMILIES:
        assert name not in text, name
    lines = [l for l in srv.log().splitlines() if "GPU metrics" in l]
    assert len(lines) == 1 and lines[0].startswith("I"), lines
    assert "no GPU metrics: cannot load /no/such/dir/libnvidia-ml.so.1" in lines[0]
    assert srv.get("/v2/health/ready").status_code == 200
