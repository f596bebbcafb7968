"""Default thread counts follow the CPUs the process may use, not the host's cores: inferd
run with an affinity mask of one CPU (taskset), and inside a cgroup with a CPU quota of one CPU
(cgroup v1 `cpu` or v2 `cpu.max`, where this machine lets the test make one), starts one HTTP
event loop and gives an ONNX model one intra-op thread, and says why in its start-up log."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import INFERD_BIN, free_port

NEEDS_TWO = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                               reason="this machine gives the tests one CPU: nothing to limit")


def run_until_loaded(prefix, repo, log_path):
    """Starts inferd under `prefix` (a command list), waits until `simple` is loaded, stops it;
    returns the log."""
    args = [*prefix, str(INFERD_BIN), f"--model-repository={repo}", f"--http-port={free_port()}",
            "--http-address=127.0.0.1", "--allow-grpc=false", "--allow-metrics=false"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "started HTTP service" not in Path(log_path).read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, Path(log_path).read_text()
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return Path(log_path).read_text(errors="replace")


@pytest.fixture
def simple_repo(tmp_path, example_models):
    repo = tmp_path / "repo"
    shutil.copytree(Path(example_models) / "simple", repo / "simple")
    return repo


@NEEDS_TWO
def test_affinity_of_one_cpu(simple_repo, tmp_path):
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    log = run_until_loaded(["taskset", "-c", "0"], simple_repo, tmp_path / "taskset.log")
    assert "CPU budget: 1 CPU(s): 1 in the affinity mask" in log, log
    assert "(1 event loops)" in log, log
    assert "intra_op_thread_count=1 " in log, log
    # Unconstrained, the same start uses every CPU it may.
    n = len(os.sched_getaffinity(0))
    log = run_until_loaded([], simple_repo, tmp_path / "free.log")
    assert f"CPU budget: {n} CPU(s)" in log and f"({n} event loops)" in log, log


def make_cgroup(name):
    """A cgroup with a quota of one CPU; returns (procs file, cleanup) or skips."""
    v1 = Path("/sys/fs/cgroup/cpu")
    v2 = Path("/sys/fs/cgroup")
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            d = v1 / name
            d.mkdir(exist_ok=True)
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text("100000")
        elif (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.controllers").read_text():
            d = v2 / name
            d.mkdir(exist_ok=True)
            (d / "cpu.max").write_text("100000 100000")
        else:
            pytest.skip("no cgroup cpu controller this test can write to")
    except OSError as e:
        pytest.skip(f"cannot make a cgroup here ({e})")
    return d / "cgroup.procs", lambda: d.rmdir()


@NEEDS_TWO
def test_cgroup_quota_of_one_cpu(simple_repo, tmp_path):
    procs, cleanup = make_cgroup(f"inferd-test-{os.getpid()}")
    try:
        # The shell moves itself into the cgroup, then becomes inferd.
        log = run_until_loaded(["sh", "-c", f'echo $$ > {procs} && exec "$0" "$@"'],
                               simple_repo, tmp_path / "cgroup.log")
    finally:
        time.sleep(0.2)
        cleanup()
    assert "CPU budget: 1 CPU(s)" in log and "a cgroup CPU quota of 1" in log, log
    assert "(1 event loops)" in log, log
    assert "intra_op_thread_count=1 " in log, log


def json_slice_threads(prefix, tmp_path, tag):
    """Starts inferd under `prefix` with an identity model, sends one large JSON request
    (~1 MB of numbers: parsed and written in slices where more than one CPU is usable), checks
    the answer, and returns how many JSON slice helper threads the process has."""
    import numpy as np
    import requests
    repo = tmp_path / f"repo_{tag}"
    (repo / "ident" / "1").mkdir(parents=True)
    (repo / "ident" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    port = free_port()
    with open(tmp_path / f"{tag}.log", "wb") as log:
        proc = subprocess.Popen([*prefix, str(INFERD_BIN), f"--model-repository={repo}",
                                 f"--http-port={port}", "--http-address=127.0.0.1",
                                 "--allow-grpc=false", "--allow-metrics=false"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if requests.get(f"{url}/v2/models/ident/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        x = np.random.default_rng(1).standard_normal(100_000).astype(np.float32)
        body = {"inputs": [{"name": "X", "shape": [x.size], "datatype": "FP32",
                            "data": [float(v) for v in x]}]}
        r = requests.post(f"{url}/v2/models/ident/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text
        y = np.array(r.json()["outputs"][0]["data"], dtype=np.float32)
        assert np.array_equal(y, x)
        return sum(1 for t in Path(f"/proc/{proc.pid}/task").iterdir()
                   if (t / "comm").read_text().strip() == "json-slices")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@NEEDS_TWO
def test_json_codec_threads_follow_the_budget(tmp_path):
    # One CPU in the mask: the large array is parsed and written on the request's own thread,
    # no helper is started; with the machine's CPUs, helpers take slices (up to 4 slices).
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    assert json_slice_threads(["taskset", "-c", "0"], tmp_path, "one") == 0
    n = len(os.sched_getaffinity(0))
    assert json_slice_threads([], tmp_path, "all") == min(n, 4) - 1
