"""CUDA shared memory on a real GPU (issue 30): a region a client process allocates with CuPy and
exports with cudaIpcGetMemHandle is registered over HTTP as Triton's clients do, and inference
reads its input from it and writes its output into it; the result is compared with numpy.

Self-contained, for a GPU machine (tests/gpu/check.sh runs every tests/gpu/test_*.py): starts
its own inferd from $INFERD_BIN (default build/inferd) with a model repository it writes into a
temporary folder (the identity backend, and an ONNX model y = x * 2 + 1 on the CPU and, when the
CUDA execution provider is installed, on the GPU). Speaks HTTP with `requests` (tritonclient is
not needed). Skipped where there is no nvidia-smi, or neither CuPy nor libcudart
(cuda_ipc.py). The GPU data path: the ONNX model on the CUDA provider takes its input from the
region on the GPU (no host copy) and must answer what it answers for the same input in the
request body; with $GPU_MODELS_DIR (make_models.py's), ResNet-50 likewise.

    INFERD_BIN=build/inferd python3 -m pytest -q tests/gpu/test_cuda_shm.py
"""

import base64
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

if shutil.which("nvidia-smi") is None:
    pytest.skip("no nvidia-smi: not a GPU machine", allow_module_level=True)
requests = pytest.importorskip("requests")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_ipc  # noqa: E402
from cuda_ipc import DeviceRegion  # noqa: E402

if cuda_ipc.available():
    pytest.skip(cuda_ipc.available(), allow_module_level=True)

REPO_ROOT = Path(__file__).resolve().parents[2]
INFERD_BIN = Path(os.environ.get("INFERD_BIN", REPO_ROOT / "build" / "inferd"))
N = 16  # FP32 elements per tensor
NBYTES = N * 4

IDENTITY_CONFIG = """backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def onnx_config(kind):
    return f"""backend: "onnxruntime"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ kind: {kind} count: 1 }} ]
"""


ENSEMBLE_TWICE = """platform: "ensemble"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "affine_gpu" model_version: -1
    input_map { key: "x" value: "x" } output_map { key: "y" value: "mid" } },
  { model_name: "affine_gpu" model_version: -1
    input_map { key: "x" value: "mid" } output_map { key: "y" value: "y" } } ] }
"""


def write_onnx(path):
    """y = x * 2 + 1 over FP32 [16]."""
    import onnx
    from onnx import TensorProto, helper
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])],
        initializer=[two, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every ONNX Runtime inferd ships
    onnx.save(model, str(path))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    if not INFERD_BIN.exists():
        pytest.skip(f"inferd binary not found at {INFERD_BIN} (set INFERD_BIN)")
    tmp = Path(tempfile.mkdtemp(prefix="inferd_cuda_shm_"))
    repo = tmp / "models"
    (repo / "ident" / "1").mkdir(parents=True)
    (repo / "ident" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    have_onnx = True
    try:
        for name, kind in (("affine_cpu", "KIND_CPU"), ("affine_gpu", "KIND_GPU")):
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(onnx_config(kind))
            write_onnx(repo / name / "1" / "model.onnx")
        # Two GPU steps: the first's output stays on the GPU for the second (no host trip).
        (repo / "affine_gpu_twice" / "1").mkdir(parents=True)
        (repo / "affine_gpu_twice" / "config.pbtxt").write_text(ENSEMBLE_TWICE)
    except ImportError:
        have_onnx = False
    # ResNet-50 on the CUDA provider, when make_models.py's models are here.
    models_dir = os.environ.get("GPU_MODELS_DIR", "")
    resnet = Path(models_dir) / "resnet50_onnx_gpu" if models_dir else None
    if resnet is not None and (resnet / "1" / "model.onnx").exists():
        shutil.copytree(resnet, repo / "resnet50_onnx_gpu")
    port = free_port()
    log_path = tmp / "inferd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(INFERD_BIN), f"--model-repository={repo}", f"--http-port={port}",
             "--http-address=127.0.0.1", "--allow-grpc=false", "--allow-metrics=false",
             "--exit-on-error=false", "--strict-readiness=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"inferd exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if requests.get(url + "/v2/models/ident/ready", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("inferd did not become ready:\n" + log_path.read_text())

    class Server:
        pass
    srv = Server()
    srv.url, srv.log_path, srv.have_onnx = url, log_path, have_onnx
    srv.get = lambda path, **kw: requests.get(url + path, timeout=30, **kw)
    srv.post = lambda path, **kw: requests.post(url + path, timeout=30, **kw)
    srv.log = lambda: log_path.read_text(errors="replace")
    yield srv
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def region():
    made = []

    def make(nbytes):
        r = DeviceRegion(nbytes)
        made.append(r)
        return r
    yield make
    for r in made:
        r.free()


def register(srv, name, reg, byte_size=None):
    return srv.post(f"/v2/cudasharedmemory/region/{name}/register", json={
        "raw_handle": {"b64": base64.b64encode(reg.handle).decode()},
        "device_id": reg.device, "byte_size": byte_size or reg.nbytes})


def shm(region_name, offset, byte_size=NBYTES):
    return {"shared_memory_region": region_name, "shared_memory_offset": offset,
            "shared_memory_byte_size": byte_size}


def infer(srv, model, inp, out, in_params, out_params):
    body = {"inputs": [{"name": inp, "datatype": "FP32", "shape": [N], "parameters": in_params}],
            "outputs": [{"name": out, "parameters": out_params}]}
    return srv.post(f"/v2/models/{model}/infer", json=body)


def test_extension_is_advertised(server):
    assert "cuda_shared_memory" in server.get("/v2").json()["extensions"]


def test_register_status_infer_unregister(server, region):
    reg = region(2 * NBYTES)
    r = register(server, "io", reg)
    assert r.status_code == 200, r.text
    assert server.get("/v2/cudasharedmemory/status").json() == [
        {"name": "io", "device_id": 0, "byte_size": 2 * NBYTES}]
    x = np.arange(N, dtype=np.float32) * 0.5 - 3
    reg.write(0, x)
    r = infer(server, "ident", "INPUT0", "OUTPUT0", shm("io", 0), shm("io", NBYTES))
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert "data" not in out and out["shape"] == [N]
    np.testing.assert_array_equal(reg.read(NBYTES, N), x)
    # The client changes its input in place; the next request sees it.
    reg.write(0, -x)
    assert infer(server, "ident", "INPUT0", "OUTPUT0", shm("io", 0), shm("io", NBYTES)).status_code == 200
    np.testing.assert_array_equal(reg.read(NBYTES, N), -x)
    assert server.post("/v2/cudasharedmemory/region/io/unregister").status_code == 200
    assert server.get("/v2/cudasharedmemory/status").json() == []


@pytest.mark.parametrize("model", ["affine_cpu", "affine_gpu"])
def test_onnx_model_reads_and_writes_the_region(server, region, model):
    if not server.have_onnx:
        pytest.skip("no onnx package to write the model")
    ready = server.get(f"/v2/models/{model}/ready").status_code == 200
    if not ready:
        pytest.skip(f"{model} is not ready here (a GPU model needs ONNX Runtime's CUDA provider): "
                    + str([e for e in server.post("/v2/repository/index", json={}).json()
                           if e["name"] == model]))
    reg = region(2 * NBYTES)
    assert register(server, "onnx_io", reg).status_code == 200
    try:
        x = np.linspace(-4, 4, N, dtype=np.float32)
        reg.write(0, x)
        r = infer(server, model, "x", "y", shm("onnx_io", 0), shm("onnx_io", NBYTES))
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(reg.read(NBYTES, N), x * 2 + 1, rtol=1e-6)
    finally:
        server.post("/v2/cudasharedmemory/region/onnx_io/unregister")


def wait_ready(srv, model, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if srv.get(f"/v2/models/{model}/ready").status_code == 200:
            return True
        time.sleep(0.5)
    return False


def infer_body(srv, model, inp, out, x, shape):
    body = {"inputs": [{"name": inp, "datatype": "FP32", "shape": shape,
                        "data": x.ravel().tolist()}],
            "outputs": [{"name": out}]}
    return srv.post(f"/v2/models/{model}/infer", json=body)


def test_gpu_model_input_in_region_equals_input_in_body(server, region):
    # The CUDA provider's instance takes the input from the region where it is (IoBinding, no
    # host copy); the answer must be the one the same input gives from the request body.
    if not server.have_onnx:
        pytest.skip("no onnx package to write the model")
    if server.get("/v2/models/affine_gpu/ready").status_code != 200:
        pytest.skip("affine_gpu is not ready here (ONNX Runtime's CUDA provider)")
    reg = region(2 * NBYTES)
    assert register(server, "gpu_in", reg).status_code == 200
    try:
        x = np.linspace(-3, 5, N, dtype=np.float32)
        reg.write(0, x)
        from_region = infer(server, "affine_gpu", "x", "y", shm("gpu_in", 0), {})
        assert from_region.status_code == 200, from_region.text
        from_body = infer_body(server, "affine_gpu", "x", "y", x, [N])
        assert from_body.status_code == 200, from_body.text
        a = np.array(from_region.json()["outputs"][0]["data"], np.float32)
        b = np.array(from_body.json()["outputs"][0]["data"], np.float32)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, x * 2 + 1, rtol=1e-6)
        # Both ends in the region: the output goes back into it.
        r = infer(server, "affine_gpu", "x", "y", shm("gpu_in", 0), shm("gpu_in", NBYTES))
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(reg.read(NBYTES, N), b)
    finally:
        server.post("/v2/cudasharedmemory/region/gpu_in/unregister")


def test_ensemble_of_two_gpu_steps(server, region):
    # affine_gpu's output stays on the GPU (IoBinding to device memory) for the next step,
    # which binds it where it is; the ensemble's answer comes to the host at the end.
    if not server.have_onnx:
        pytest.skip("no onnx package to write the model")
    if not wait_ready(server, "affine_gpu", 30) or not wait_ready(server, "affine_gpu_twice", 30):
        pytest.skip("affine_gpu is not ready here (ONNX Runtime's CUDA provider)")
    x = np.linspace(-2, 2, N, dtype=np.float32)
    r = infer_body(server, "affine_gpu_twice", "x", "y", x, [N])
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["outputs"][0]["data"], np.float32),
                               (x * 2 + 1) * 2 + 1, rtol=1e-6)
    # Input from a CUDA region, output into it.
    reg = region(2 * NBYTES)
    assert register(server, "twice", reg).status_code == 200
    try:
        reg.write(0, x)
        r = infer(server, "affine_gpu_twice", "x", "y", shm("twice", 0), shm("twice", NBYTES))
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(reg.read(NBYTES, N), (x * 2 + 1) * 2 + 1, rtol=1e-6)
    finally:
        server.post("/v2/cudasharedmemory/region/twice/unregister")


def test_resnet50_input_in_region_equals_input_in_body(server, region):
    if server.post("/v2/repository/index", json={}).status_code != 200 or not any(
            e["name"] == "resnet50_onnx_gpu"
            for e in server.post("/v2/repository/index", json={}).json()):
        pytest.skip("no resnet50_onnx_gpu (set GPU_MODELS_DIR to make_models.py's folder)")
    if not wait_ready(server, "resnet50_onnx_gpu"):
        pytest.skip("resnet50_onnx_gpu is not ready here (ONNX Runtime's CUDA provider)")
    x = np.random.default_rng(7).standard_normal((1, 3, 224, 224), dtype=np.float32)
    reg = region(x.nbytes)
    assert register(server, "resnet_in", reg).status_code == 200
    try:
        reg.write(0, x)
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224],
                            "parameters": shm("resnet_in", 0, x.nbytes)}],
                "outputs": [{"name": "output"}]}
        from_region = server.post("/v2/models/resnet50_onnx_gpu/infer", json=body)
        assert from_region.status_code == 200, from_region.text
        from_body = infer_body(server, "resnet50_onnx_gpu", "input", "output", x, [1, 3, 224, 224])
        assert from_body.status_code == 200, from_body.text
        a = np.array(from_region.json()["outputs"][0]["data"], np.float32)
        b = np.array(from_body.json()["outputs"][0]["data"], np.float32)
        assert a.shape == (1000,)
        err = np.linalg.norm(a - b) / np.linalg.norm(b)
        print(f"resnet50_onnx_gpu: CUDA shm input vs body input relative error {err:.2e}")
        assert err <= 1e-4, err
    finally:
        server.post("/v2/cudasharedmemory/region/resnet_in/unregister")


def test_out_of_bounds_and_errors(server, region):
    reg = region(NBYTES)
    assert register(server, "small", reg).status_code == 200
    try:
        r = infer(server, "ident", "INPUT0", "OUTPUT0", shm("small", 8), shm("small", 0))
        assert r.status_code == 400 and "'small'" in r.text and "past the end" in r.text, r.text
        r = register(server, "small", reg)
        assert r.status_code == 400 and "already in manager" in r.text, r.text  # Triton's
        r = server.post("/v2/cudasharedmemory/region/bad/register", json={
            "raw_handle": {"b64": base64.b64encode(bytes(64)).decode()},
            "device_id": 0, "byte_size": 8})
        assert r.status_code == 400 and "failed to open CUDA IPC handle" in r.text, r.text
        count = int(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
                    .stdout.count("GPU "))
        r = server.post("/v2/cudasharedmemory/region/bad/register", json={
            "raw_handle": {"b64": base64.b64encode(reg.handle).decode()},
            "device_id": count + 3, "byte_size": 8})
        assert r.status_code == 400 and "'device_id'" in r.text, r.text
    finally:
        server.post("/v2/cudasharedmemory/unregister")
    assert server.get("/v2/cudasharedmemory/status").json() == []


def test_unregister_while_in_flight_then_reuse(server, region):
    # Many requests against the region while it is unregistered and registered again: every
    # answer is either a result or the 400 for an unknown region, and the server stays up.
    import concurrent.futures
    reg = region(2 * NBYTES)
    x = np.arange(N, dtype=np.float32)
    reg.write(0, x)
    assert register(server, "churn", reg).status_code == 200

    def one(_):
        return infer(server, "ident", "INPUT0", "OUTPUT0", shm("churn", 0), shm("churn", NBYTES))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(64)]
        for _ in range(5):
            server.post("/v2/cudasharedmemory/region/churn/unregister")
            register(server, "churn", reg)
        codes = [f.result().status_code for f in futures]
    assert set(codes) <= {200, 400}, codes
    assert server.get("/v2/health/live").status_code == 200
    np.testing.assert_array_equal(reg.read(NBYTES, N), x)
    server.post("/v2/cudasharedmemory/unregister")
