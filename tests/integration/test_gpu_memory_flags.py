"""--model-load-gpu-limit (tritonserver's <device_id>:<fraction>) and the statistics'
memory_usage on a host without a GPU: bad values stop the server naming what was wrong, a
valid one does not stop a CPU-only server (one WARNING naming it), and memory_usage has
Triton's shape over HTTP and gRPC. The GPU side (the limit refusing, eviction on one GPU, GPU
byte sizes) is tests/unit/gpu_memory_test.cc with fake GPUs and tests/gpu/test_gpu_memory.py
on a real one."""

import re
import subprocess
from pathlib import Path

import pytest

from conftest import INFERD_BIN, free_port


def run_to_exit(args, timeout=30):
    p = subprocess.run([str(INFERD_BIN)] + args, capture_output=True, timeout=timeout)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


@pytest.mark.parametrize("value,message", [
    ("0.8", "--model-load-gpu-limit takes <device_id>:<fraction> (e.g. 0:0.8), got '0.8'"),
    ("gpu0:0.5", "the device id 'gpu0' is not a GPU number"),
    ("-1:0.5", "the device id '-1' is not a GPU number"),
    (":0.5", "the device id '' is not a GPU number"),
    ("0:1.5", "the fraction '1.5' must be a number in [0.0, 1.0]"),
    ("0:-0.1", "the fraction '-0.1' must be a number in [0.0, 1.0]"),
    ("0:half", "the fraction 'half' must be a number in [0.0, 1.0]"),
    ("0:nan", "the fraction 'nan' must be a number in [0.0, 1.0]"),
])
def test_bad_limit_exits_2_naming_it(make_repo, value, message):
    repo = make_repo({"simple": "simple"})
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={free_port()}",
                           f"--model-load-gpu-limit={value}"])
    assert rc == 2, out
    assert message in out, out


def test_limit_on_a_host_without_gpu_starts_with_one_warning(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--model-load-gpu-limit=0:0.8", "--model-load-gpu-limit=1:0.5",
                                "--model-load-gpu-limit=0:0.3"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30, "ready")
    log = Path(srv.log_path).read_text()
    lines = [l for l in log.splitlines() if "--model-load-gpu-limit" in l]
    assert len(lines) == 1, lines
    # One WARNING naming each GPU's limit (the first one given for GPU 0, as tritonserver).
    assert re.match(r"W\d{4} ", lines[0]), lines
    assert "--model-load-gpu-limit 0:0.8, 1:0.5 names a GPU this host does not have" in lines[0]
    assert "0.3" not in lines[0]
    assert "no GPU" in lines[0]


def check_usage_entries(entries):
    assert isinstance(entries, list), entries
    for e in entries:
        assert set(e) == {"type", "id", "byte_size"}, e
        assert e["type"] in ("CPU", "CPU_PINNED", "GPU"), e
        assert isinstance(e["id"], int) and isinstance(e["byte_size"], int), e
    cpu = [e for e in entries if e["type"] == "CPU"]
    assert len(cpu) == 1 and cpu[0]["id"] == 0 and cpu[0]["byte_size"] > 0, entries
    assert not [e for e in entries if e["type"] == "GPU"], entries  # no GPU here


def test_memory_usage_has_tritons_shape_for_cpu_models(server_factory, make_repo, pb):
    import grpc
    pb2, pb2_grpc = pb
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30, "ready")
    # Every model's statistics and one model's.
    for path in ("/v2/models/stats", "/v2/models/simple/stats",
                 "/v2/models/simple/versions/1/stats"):
        r = srv.get(path)
        assert r.status_code == 200, r.text
        stats = [m for m in r.json()["model_stats"] if m["name"] == "simple"]
        assert stats, r.text
        check_usage_entries(stats[0]["memory_usage"])
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as ch:
        stub = pb2_grpc.GRPCInferenceServiceStub(ch)
        stats = stub.ModelStatistics(pb2.ModelStatisticsRequest(name="simple"), timeout=60)
        usage = [{"type": u.type, "id": u.id, "byte_size": u.byte_size}
                 for u in stats.model_stats[0].memory_usage]
        check_usage_entries(usage)
