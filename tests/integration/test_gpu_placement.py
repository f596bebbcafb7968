"""Instance placement on a host without a GPU (issue 29), the real "no driver" path.

This project's machines have the CUDA toolkit and no driver: CUDA answers error 35 (34 against
the stub libcuda), and inferd must say so when a KIND_GPU model loads, as Triton fails such a
model; --gpu-fallback-to-cpu runs it on the CPU with one WARNING naming the model. The placement
rules themselves (gpus, count per GPU, KIND_AUTO, compute capability) are tested with fake
devices in tests/unit/placement_test.cc. On a machine with a GPU these tests are skipped."""

import re

import numpy as np
import pytest

from test_batching import send, simple_repo, stats


def gpu_line(srv):
    m = re.search(r"GPUs: none \((.*)\)", srv.log())
    if m is None and re.search(r"GPU \d+: '", srv.log()):
        pytest.skip("this host has a GPU: the no-GPU path is not taken")
    assert m, "no 'GPUs:' line at start-up:\n" + srv.log()
    return m.group(1)


def index_entry(srv, name="simple"):
    idx = srv.post("/v2/repository/index", json={}).json()
    return [e for e in idx if e["name"] == name][0]


def test_start_up_log_says_why_there_is_no_gpu(server_factory, make_repo):
    srv = server_factory([simple_repo(make_repo, "")])
    why = gpu_line(srv)
    # CUDA's own answer, not a guess: no driver (35) or the toolkit's stub driver (34).
    assert re.search(r"CUDA error (35|34)|built without CUDA", why), why


@pytest.mark.parametrize("group", ["{ kind: KIND_GPU }", "{ kind: KIND_GPU gpus: [ 0 ] count: 2 }"])
def test_kind_gpu_fails_the_load_saying_why(server_factory, make_repo, group):
    repo = simple_repo(make_repo, f"instance_group [ {group} ]\n")
    srv = server_factory([repo], ["--exit-on-error=false", "--strict-readiness=false"])
    why = gpu_line(srv)
    entry = index_entry(srv)
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith(
        "instance group simple_0 of model simple has kind KIND_GPU but cannot run on a GPU: "
        + why), entry["reason"]
    assert "--gpu-fallback-to-cpu" in entry["reason"]


def test_fallback_flag_serves_kind_gpu_on_the_cpu_with_one_warning(server_factory, make_repo):
    repo = simple_repo(make_repo,
                       "instance_group [ { kind: KIND_GPU count: 2 }, { kind: KIND_GPU } ]\n")
    srv = server_factory([repo], ["--gpu-fallback-to-cpu=true"])
    gpu_line(srv)
    assert index_entry(srv)["state"] == "READY"
    for i in range(4):
        send(srv, i)
    assert stats(srv)["inference_stats"]["success"]["count"] == 4
    warnings = [l for l in srv.log().splitlines()
                if "ask for KIND_GPU" in l and "model 'simple'" in l]
    assert len(warnings) == 1, srv.log()
    assert "simple_0, simple_1" in warnings[0] and "--gpu-fallback-to-cpu" in warnings[0]
    assert "3 instance(s) (on the CPU)" in srv.log()


def test_kind_auto_runs_on_the_cpu_without_a_gpu(server_factory, make_repo):
    srv = server_factory([simple_repo(make_repo, "instance_group [ { kind: KIND_AUTO } ]\n")])
    gpu_line(srv)
    send(srv, 1)
    assert not [l for l in srv.log().splitlines() if "ask for KIND_GPU" in l]


def test_bad_flag_value_is_refused(server_factory, make_repo):
    import subprocess
    from conftest import INFERD_BIN  # noqa: the binary the fixtures start
    r = subprocess.run([INFERD_BIN, "--model-repository=/nonexistent",
                        "--min-supported-compute-capability=fast"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--min-supported-compute-capability takes a compute capability" in r.stderr + r.stdout


def test_no_instance_group_is_tritons_default_on_a_host_without_a_gpu(server_factory, make_repo,
                                                                       tmp_path):
    """Triton's NormalizeInstanceGroup: no instance_group is one KIND_AUTO group named after the
    model, resolved to KIND_CPU without a GPU, and a group without a count gets
    SetDefaultInstanceCount's: two CPU instances for onnxruntime, one for other backends. The
    config a client reads back says so."""
    repo = simple_repo(make_repo, "")
    (repo / "counted").mkdir()
    (repo / "counted" / "1").mkdir()
    (repo / "counted" / "1" / "model.onnx").write_bytes(
        (repo / "simple" / "1" / "model.onnx").read_bytes())
    (repo / "counted" / "config.pbtxt").write_text(
        (repo / "simple" / "config.pbtxt").read_text().replace('"simple"', '"counted"')
        + "instance_group [ { kind: KIND_CPU }, { kind: KIND_CPU count: 3 } ]\n")
    (repo / "py" / "1").mkdir(parents=True)
    (repo / "py" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    (repo / "py" / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    srv = server_factory([repo])
    gpu_line(srv)
    groups = srv.get("/v2/models/simple/config").json()["instance_group"]
    assert [(g["name"], g["kind"], int(g["count"])) for g in groups] == [
        ("simple", "KIND_CPU", 2)], groups
    groups = srv.get("/v2/models/counted/config").json()["instance_group"]
    assert [(g["name"], g["kind"], int(g["count"])) for g in groups] == [
        ("counted_0", "KIND_CPU", 2), ("counted_1", "KIND_CPU", 3)], groups
    groups = srv.get("/v2/models/py/config").json()["instance_group"]
    assert [(g["name"], g["kind"], int(g["count"])) for g in groups] == [
        ("py", "KIND_CPU", 1)], groups
    assert "'simple' version 1" in srv.log()
    load_lines = [l for l in srv.log().splitlines() if "model 'simple'" in l and "instance(s)" in l]
    assert load_lines and "2 instance(s)" in load_lines[0], srv.log()
    for i in range(4):
        send(srv, i)
