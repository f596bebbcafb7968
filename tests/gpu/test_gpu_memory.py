"""GPU memory on a real GPU (issues 29 and 30): the statistics' memory_usage "GPU" entry, the
load line, --model-load-gpu-limit refusing a load, and unload giving the memory back.

Self-contained, for the GPU machine (tests/gpu/check.sh runs every tests/gpu/test_*.py): it
starts its own inferd from $INFERD_BIN (default: build/inferd) on a model repository it writes
into a temporary folder, with an ONNX model it generates with torch (a few fully connected
layers, about 256 MiB of FP32 weights, so that its device memory stands out from the CUDA
context). Skipped where `nvidia-smi` is absent, where torch/onnx are missing, and where
inferd's ONNX Runtime has no CUDA provider (the model then fails to load saying so: the
test reports that reason).

What "close to nvidia-smi" means: nvidia-smi's per-process figure includes the CUDA context
(~300-600 MiB on an H100) and ONNX Runtime's arena rounding, which inferd's per-model figure
does not (it is the device memory the load took, measured around the instances' creation); so
the test checks the model's figure is at least its weights and at most the process's total.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INFERD_BIN = Path(os.environ.get("INFERD_BIN", REPO_ROOT / "build" / "inferd"))
MiB = 1 << 20
WEIGHTS_MIB = 256

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: no GPU")


_PORTS_GIVEN = set()


def free_port():
    """Never the same port twice: the kernel may hand a just-closed port out again, and one
    server's HTTP, gRPC and metrics ports must differ (inferd refuses a port in use)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def http(port, method, path, body=None, timeout=120):
    import urllib.error
    import urllib.request
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def write_model(repo, name, mib=WEIGHTS_MIB):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    layers = max(1, mib // 64)  # 4096 x 4096 FP32 = 64 MiB per layer
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(layers)])
    d = Path(repo) / name
    (d / "1").mkdir(parents=True)
    torch.onnx.export(model.eval(), torch.zeros(1, 4096), str(d / "1" / "model.onnx"),
                      input_names=["INPUT0"], output_names=["OUTPUT0"],
                      dynamic_axes={"INPUT0": {0: "b"}, "OUTPUT0": {0: "b"}})
    (d / "config.pbtxt").write_text(f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4096 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4096 ] }} ]
instance_group [ {{ kind: KIND_GPU gpus: [ 0 ] count: 1 }} ]
""")


def gpu_total_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[0])


def process_gpu_mib(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        p, _, used = line.partition(",")
        if p.strip() == str(pid):
            return int(used.strip())
    return 0


class Inferd:
    def __init__(self, repo, extra=()):
        if not INFERD_BIN.exists():
            pytest.skip(f"{INFERD_BIN} is not built")
        self.port = free_port()
        self.log_path = Path(repo).parent / f"inferd-{self.port}.log"
        args = [str(INFERD_BIN), f"--model-repository={repo}", f"--http-port={self.port}",
                f"--grpc-port={free_port()}", f"--metrics-port={free_port()}",
                "--model-control-mode=explicit", "--exit-on-error=false", *extra]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, self.text()
            if http(self.port, "GET", "/v2/health/live", timeout=5)[0] == 200:
                return
            time.sleep(0.2)
        raise AssertionError("inferd not live after 120 s\n" + self.text())

    def text(self):
        return self.log_path.read_text(errors="replace")[-8000:]

    def load(self, name):
        return http(self.port, "POST", f"/v2/repository/models/{name}/load", {})

    def unload(self, name):
        return http(self.port, "POST", f"/v2/repository/models/{name}/unload", {})

    def gpu_usage(self, name):
        code, body = http(self.port, "GET", f"/v2/models/{name}/stats")
        assert code == 200, body
        usage = json.loads(body)["model_stats"][0]["memory_usage"]
        return [u for u in usage if u["type"] == "GPU"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture
def repo():
    d = Path(tempfile.mkdtemp(prefix="inferd_gpu_memory_"))
    (d / "models").mkdir()
    yield d / "models"
    shutil.rmtree(d, ignore_errors=True)


def load_or_skip(srv, name):
    code, body = srv.load(name)
    if code != 200 and "CUDA execution provider" in body:
        pytest.skip(f"inferd's ONNX Runtime cannot run on the GPU here: {body}")
    assert code == 200, body + "\n" + srv.text()


def test_memory_usage_reports_the_models_gpu_memory_and_unload_returns_it(repo):
    write_model(repo, "big")
    srv = Inferd(repo)
    try:
        before = process_gpu_mib(srv.proc.pid)
        load_or_skip(srv, "big")
        usage = srv.gpu_usage("big")
        assert len(usage) == 1 and usage[0]["id"] == 0, usage
        model_bytes = usage[0]["byte_size"]
        process_mib = process_gpu_mib(srv.proc.pid)
        print(f"GPU 0: model {model_bytes / MiB:.0f} MiB, process {process_mib} MiB (before the "
              f"load {before} MiB), weights {WEIGHTS_MIB} MiB")
        assert model_bytes >= WEIGHTS_MIB * MiB * 0.95, usage
        assert model_bytes / MiB <= process_mib + 1, (usage, process_mib)
        # The load line names the GPU and its MiB.
        assert "GPU 0: " in srv.text() and "successfully loaded 'big'" in srv.text()
        code, body = srv.unload("big")
        assert code == 200, body
        deadline = time.time() + 60
        while time.time() < deadline and process_gpu_mib(srv.proc.pid) > process_mib - WEIGHTS_MIB * 0.9:
            time.sleep(0.5)
        after = process_gpu_mib(srv.proc.pid)
        print(f"GPU 0 after unload: process {after} MiB")
        assert after <= process_mib - WEIGHTS_MIB * 0.9, (process_mib, after)
    finally:
        srv.stop()


def test_model_load_gpu_limit_refuses_a_load_above_it(repo):
    write_model(repo, "first")
    write_model(repo, "second")
    total = gpu_total_mib()
    srv0 = Inferd(repo)
    try:
        base = process_gpu_mib(srv0.proc.pid)  # no model: the CUDA context at most
    finally:
        srv0.stop()
    # A limit just above what one model needs (other processes' usage included): the first
    # load finds the GPU under it, the second finds it above.
    used_now = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                   "--format=csv,noheader,nounits", "-i", "0"],
                                  capture_output=True, text=True).stdout.strip().splitlines()[0])
    fraction = min(1.0, (used_now + base + WEIGHTS_MIB * 0.5 + 600) / total)
    srv = Inferd(repo, [f"--model-load-gpu-limit=0:{fraction:.4f}"])
    try:
        load_or_skip(srv, "first")
        code, body = srv.load("second")
        print(f"limit 0:{fraction:.4f} of {total} MiB; second load: {code} {body}")
        assert code == 507, body  # RESOURCE_EXHAUSTED, as the memory budget
        assert "GPU 0" in body and "--model-load-gpu-limit" in body, body
        # Unloading the first makes room again.
        assert srv.unload("first")[0] == 200
        deadline = time.time() + 60
        while True:
            code, body = srv.load("second")
            if code == 200 or time.time() > deadline:
                break
            time.sleep(1)
        assert code == 200, body
    finally:
        srv.stop()
