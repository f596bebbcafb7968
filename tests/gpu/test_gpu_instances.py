"""GPU instances on a GPU machine (issue 29): ResNet-50 (ONNX on ONNX Runtime's CUDA execution
provider, TorchScript on LibTorch's CUDA) and a BERT-like ONNX encoder give the outputs the same
model gives on the CPU, with dynamic batching (concurrent requests), and the GPU memory a model
takes shows in nvidia-smi while it is loaded and goes back when it unloads.

Self-contained (tests/gpu/check.sh runs every tests/gpu/test_*.py): it starts its own inferd from
$INFERD_BIN (check.sh points it at the bundle's, with the library path and
INFERD_ORT_CUDA_EP_LIBRARY set), uses the models in $GPU_MODELS_DIR or generates them
(make_models.py beside this file), and skips where there is no GPU.

Agreement: ‖gpu − cpu‖ / ‖cpu‖ ≤ 1e-3 per request, FP32 (cuDNN may use TF32 for convolutions,
which the device notes put near 3e-4; plain FP32 lands far below). Each request gets fresh
random data; the measured errors are printed.
"""

import concurrent.futures
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

HERE = Path(__file__).resolve().parent
INFERD_BIN = Path(os.environ.get("INFERD_BIN", HERE.parent.parent / "build" / "inferd"))
TOLERANCE = 1e-3
CONCURRENT = 16


def _has_gpu():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


pytestmark = pytest.mark.skipif(not _has_gpu(), reason="no GPU (nvidia-smi lists none)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = os.environ.get("GPU_MODELS_DIR")
    if root and Path(root, "resnet50_onnx_gpu").is_dir():
        return Path(root)
    sys.path.insert(0, str(HERE))
    import make_models  # noqa: E402 (beside this file)

    root = tmp_path_factory.mktemp("gpu_models")
    make_models.generate(str(root))
    return root


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One inferd process on loopback, serving the named models from a repository of links."""

    def __init__(self, models_root, names, tmp, extra=()):
        if not INFERD_BIN.exists():
            pytest.skip(f"inferd not found at {INFERD_BIN} (set INFERD_BIN)")
        self.repo = tmp / "repo"
        self.repo.mkdir()
        for n in names:
            if not (models_root / n).is_dir():
                pytest.skip(f"model {n} was not generated")
            shutil.copytree(models_root / n, self.repo / n, copy_function=_link_or_copy)
        self.port = _free_port()
        self.log_path = tmp / "inferd.log"
        args = [str(INFERD_BIN), f"--model-repository={self.repo}", f"--http-port={self.port}",
                "--http-address=127.0.0.1", "--allow-grpc=false", "--allow-metrics=false",
                *extra]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 300  # loading on a GPU: cuDNN and module load
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"inferd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/v2/health/live", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("inferd is not live after 300 s:\n" + self.log())
            time.sleep(0.2)

    def log(self):
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_ready(self, name, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = requests.get(f"{self.url}/v2/models/{name}/ready", timeout=5)
            if r.status_code == 200:
                return
            index = requests.post(self.url + "/v2/repository/index", json={}, timeout=5).json()
            for e in index:
                if e["name"] == name and e.get("state") == "UNAVAILABLE":
                    raise AssertionError(f"{name}: {e.get('reason')}\n{self.log()}")
            time.sleep(0.5)
        raise AssertionError(f"{name} is not ready after {timeout} s\n{self.log()}")

    def infer(self, name, inputs, output):
        """inputs: {name: ndarray}; returns the named output (binary tensor extension)."""
        header = {"inputs": [], "outputs": [{"name": output, "parameters": {"binary_data": True}}]}
        blobs = []
        for n, a in inputs.items():
            a = np.ascontiguousarray(a)
            dtype = {np.float32: "FP32", np.int64: "INT64"}[a.dtype.type]
            header["inputs"].append({"name": n, "shape": list(a.shape), "datatype": dtype,
                                     "parameters": {"binary_data_size": a.nbytes}})
            blobs.append(a.tobytes())
        head = json.dumps(header).encode()
        r = requests.post(f"{self.url}/v2/models/{name}/infer", data=head + b"".join(blobs),
                          headers={"Inference-Header-Content-Length": str(len(head)),
                                   "Content-Type": "application/octet-stream"}, timeout=120)
        assert r.status_code == 200, f"{name}: HTTP {r.status_code}: {r.text[:500]}"
        hlen = int(r.headers["Inference-Header-Content-Length"])
        meta = json.loads(r.content[:hlen])
        out = meta["outputs"][0]
        return np.frombuffer(r.content[hlen:], dtype=np.float32).reshape(out["shape"])

    def stats(self, name):
        r = requests.get(f"{self.url}/v2/models/{name}/stats", timeout=10)
        return r.json()["model_stats"][0]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_with_python_stub(root, names, tmp):
    """Server(root, names, tmp) whose Python processes run this interpreter (torch), with the
    library path it was started with (check.sh's inferd wrapper puts the bundle's libraries
    first for inferd alone), and the stub from this tree (the bundle has none)."""
    launcher = tmp / "python"
    launcher.write_text("#!/bin/sh\n" + (
        f"export LD_LIBRARY_PATH='{os.environ['LD_LIBRARY_PATH']}'\n"
        if os.environ.get("LD_LIBRARY_PATH") else "unset LD_LIBRARY_PATH\n") +
        f"exec '{sys.executable}' \"$@\"\n")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    saved = {k: os.environ.get(k) for k in ("INFERD_PYTHON", "INFERD_PYTHON_BACKEND_DIR")}
    os.environ["INFERD_PYTHON"] = str(launcher)
    os.environ["INFERD_PYTHON_BACKEND_DIR"] = str(
        HERE.parents[1] / "src" / "backends" / "python" / "stub")
    try:
        return Server(root, names, tmp)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def server_for(models, tmp_path):
    started = []

    def start(names, extra=()):
        srv = Server(models, names, tmp_path, extra)
        started.append(srv)
        for n in names:
            if "--model-control-mode=explicit" not in extra:
                srv.wait_ready(n)
        return srv

    yield start
    for srv in started:
        srv.stop()


def _relative_error(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b.astype(np.float64))
                 / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def _agree_concurrently(srv, name, make_inputs, output, capsys):
    """CONCURRENT requests at once to <name>_gpu, each compared with <name>_cpu on its input."""
    rng = np.random.default_rng()
    cases = [make_inputs(rng, 1 + (i % 2)) for i in range(CONCURRENT)]  # batch sizes 1 and 2
    with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
        gpu = list(pool.map(lambda c: srv.infer(f"{name}_gpu", c, output), cases))
    cpu = [srv.infer(f"{name}_cpu", c, output) for c in cases]
    errors = [_relative_error(g, c) for g, c in zip(gpu, cpu)]
    st = srv.stats(f"{name}_gpu")
    with capsys.disabled():
        print(f"\n{name}: GPU vs CPU relative error max {max(errors):.2e} median "
              f"{float(np.median(errors)):.2e}; GPU executions {st['execution_count']} for "
              f"{st['inference_count']} items")
    for i, (g, c) in enumerate(zip(gpu, cpu)):
        assert g.shape == c.shape
        assert np.isfinite(g).all(), f"request {i}: non-finite GPU output"
        assert errors[i] <= TOLERANCE, f"request {i}: relative error {errors[i]:.2e}"
    return st


def _resnet_inputs(rng, batch):
    return {"input": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}


def test_resnet50_onnx_on_gpu_matches_cpu(server_for, capsys):
    srv = server_for(["resnet50_onnx_gpu", "resnet50_onnx_cpu"])
    assert "(GPU device 0)" in srv.log(), srv.log()  # the load line's instance list
    _agree_concurrently(srv, "resnet50_onnx", _resnet_inputs, "output", capsys)


def test_resnet50_torchscript_on_gpu_matches_cpu(server_for, capsys):
    srv = server_for(["resnet50_torch_gpu", "resnet50_torch_cpu"])
    assert "on cuda:0" in srv.log(), srv.log()  # the PyTorch module's load line

    def inputs(rng, batch):
        return {"INPUT__0": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}

    _agree_concurrently(srv, "resnet50_torch", inputs, "OUTPUT__0", capsys)


def test_bert_like_onnx_on_gpu_matches_cpu(server_for, capsys):
    srv = server_for(["bert_like_onnx_gpu", "bert_like_onnx_cpu"])

    def inputs(rng, batch):
        ids = rng.integers(0, 30522, (batch, 128), dtype=np.int64)
        mask = np.ones((batch, 128), dtype=np.int64)
        mask[:, rng.integers(16, 128):] = 0  # padding, as a tokenizer leaves it
        return {"input_ids": ids, "attention_mask": mask}

    _agree_concurrently(srv, "bert_like_onnx", inputs, "last_hidden_state", capsys)


def _gpu_memory_mib(pid):
    """(MiB nvidia-smi lists for process `pid`, None when it lists no such process; MiB used on
    the whole GPU). A process without a CUDA context yet is not listed; some containers list
    no pids at all, and then the whole GPU's figure is the one to compare."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=30).stdout
    mine = None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            mine = float(parts[1])
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return mine, float(out.splitlines()[0])


@pytest.mark.parametrize("name", ["resnet50_onnx_gpu", "resnet50_torch_gpu"])
def test_gpu_memory_shows_while_loaded_and_returns_after_unload(server_for, name, capsys):
    srv = server_for([name], ["--model-control-mode=explicit"])
    before = _gpu_memory_mib(srv.proc.pid)
    r = requests.post(f"{srv.url}/v2/repository/models/{name}/load", timeout=300)
    assert r.status_code == 200, r.text
    srv.wait_ready(name)
    x = {("INPUT__0" if "torch" in name else "input"):
         np.random.default_rng().standard_normal((4, 3, 224, 224), dtype=np.float32)}
    srv.infer(name, x, "OUTPUT__0" if "torch" in name else "output")
    loaded = _gpu_memory_mib(srv.proc.pid)
    # The process's own figure where nvidia-smi lists it, else the whole GPU's.
    pick = 0 if loaded[0] is not None else 1
    how = "inferd's process" if pick == 0 else "whole GPU"
    mib_before = (before[0] or 0.0) if pick == 0 else before[1]
    mib_loaded = loaded[pick]
    r = requests.post(f"{srv.url}/v2/repository/models/{name}/unload", timeout=300)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while True:  # the unload finishes after its reply
        now = _gpu_memory_mib(srv.proc.pid)
        mib_after = (now[0] or 0.0) if pick == 0 else now[1]
        if mib_after <= mib_loaded - 0.8 * 98 or time.monotonic() > deadline:
            break
        time.sleep(1)
    with capsys.disabled():
        print(f"\n{name}: nvidia-smi ({how}) {mib_before:.0f} MiB before load, {mib_loaded:.0f} "
              f"loaded, {mib_after:.0f} after unload")
    # ResNet-50's FP32 weights alone are 98 MiB.
    assert mib_loaded - mib_before >= 90, f"{mib_loaded - mib_before:.0f} MiB more while loaded"
    # What the model took is back, but for the CUDA context and libraries' handles the first
    # GPU model created (they live as long as the process).
    assert mib_after <= mib_loaded - 0.8 * 98, f"{mib_loaded - mib_after:.0f} MiB returned"
