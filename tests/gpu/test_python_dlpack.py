"""The Python backend's DLPack with CUDA tensors on a real GPU (issue 30), with PyTorch.

model.py does what Triton users write: `torch.from_dlpack(input.to_dlpack())`, moves it to
CUDA, computes, and answers `pb_utils.Tensor.from_dlpack("Y", cuda_tensor)`; inferd copies the
output to the host once (cudaMemcpy through the process's own libcudart) and the client gets the
values numpy computes. Also: to_dlpack() of a GPU tensor gives torch the same device memory,
as_numpy() on it is refused with Triton's message, BF16 and INT64 outputs, a 4 MiB output (the
shared mapping grows), a BLS request whose input is a CUDA tensor, and
FORCE_CPU_ONLY_INPUT_TENSORS 'no': an ensemble's GPU step (ONNX Runtime's CUDA provider) feeds a
Python model whose input arrives on the GPU (a CUDA IPC handle the stub opens), which torch reads
in place; a request's own (host) input stays a host tensor.

The CPU-only version of these checks (a fake CUDA producer) is
tests/integration/test_python_dlpack.py; of the GPU inputs, tests/unit/python_gpu_inputs_test.cc
and GpuDataPathPythonTest. Self-contained like test_gpu_instances.py (whose Server it uses):
$INFERD_BIN; the Python processes run this interpreter (it has torch), with the stub from this
tree. Skips without a GPU or without torch built with CUDA.

    INFERD_BIN=build/inferd python3 -m pytest -q tests/gpu/test_python_dlpack.py
"""

import json

import numpy as np
import pytest
import requests

from test_gpu_instances import _has_gpu, start_with_python_stub

pytestmark = pytest.mark.skipif(not _has_gpu(), reason="no GPU (nvidia-smi lists none)")


ADD_CONFIG = """name: "torch_gpu_add"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "M" data_type: TYPE_FP32 dims: [ 4, 4 ] },
         { name: "I" data_type: TYPE_INT64 dims: [ -1 ] },
         { name: "BF" data_type: TYPE_BF16 dims: [ -1 ] },
         { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ADD_PY = '''
import json
import numpy as np
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            info = {"input_is_cpu": x.is_cpu()}
            t = torch.from_dlpack(x.to_dlpack()).to("cuda")
            y = t * 2 + 1
            out = pb_utils.Tensor.from_dlpack("Y", y)
            info["is_cpu"] = out.is_cpu()
            info["device"] = list(out.__dlpack_device__())
            try:
                out.as_numpy()
            except pb_utils.TritonModelException as e:
                info["as_numpy"] = str(e)
            # the same device memory, read back by torch (both of its entry points)
            back = torch.utils.dlpack.from_dlpack(out.to_dlpack())
            again = torch.from_dlpack(out)
            info["same_memory"] = (back.data_ptr() == y.data_ptr() == again.data_ptr()
                                   and back.device == y.device)
            info["cudart"] = getattr(pb_utils._cudart, "_name", None)
            head = t[:16] if t.numel() >= 16 else torch.arange(16, device="cuda", dtype=torch.float32)
            m = head.reshape(4, 4) @ head.reshape(4, 4).T
            responses.append(pb_utils.InferenceResponse([
                out,
                pb_utils.Tensor.from_dlpack("M", m),
                pb_utils.Tensor.from_dlpack("I", (t * 3).to(torch.int64)),
                pb_utils.Tensor.from_dlpack("BF", t.to(torch.bfloat16)),
                pb_utils.Tensor("INFO", np.array([json.dumps(info)], dtype=np.object_))]))
        return responses
'''

BLS_CONFIG = """name: "torch_gpu_bls"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

BLS_PY = '''
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "X").to_dlpack())
            gpu_in = pb_utils.Tensor.from_dlpack("X", x.cuda() * 3)
            reply = pb_utils.InferenceRequest(model_name="torch_gpu_add", inputs=[gpu_in],
                                              requested_output_names=["Y"]).exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "Y")
            # the answer is host memory: torch takes it and moves it to the GPU again
            z = torch.from_dlpack(y.to_dlpack()).cuda()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", z)]))
        return responses
'''


# FORCE_CPU_ONLY_INPUT_TENSORS 'no' fed by a GPU step: affine_gpu (ONNX, y = 2x + 1 on the CUDA
# provider) leaves its output on the GPU for the next step, torch_gpu_in gets it there.
N_IN = 16

AFFINE_CONFIG = """name: "affine_gpu"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
"""

GPU_IN_CONFIG = """name: "torch_gpu_in"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "HOST" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

GPU_IN_PY = '''
import json
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            host = pb_utils.get_input_tensor_by_name(request, "HOST")
            assert not x.is_cpu(), "the GPU step's output should reach model.py on the GPU"
            assert host.is_cpu(), "a host input stays a host tensor"
            t = torch.from_dlpack(x.to_dlpack())  # the server's device memory, mapped here
            assert t.is_cuda, t.device
            y = t * 3 - int(host.as_numpy()[0])
            info = {"device": list(x.__dlpack_device__()), "torch_device": str(t.device),
                    "shape": x.shape(), "dtype": x.triton_dtype()}
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("Y", y),
                pb_utils.Tensor("INFO", np.array([json.dumps(info)], dtype=np.object_))]))
        return responses
'''

GPU_INTO_PYTHON = """name: "gpu_into_python"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "HOST" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "affine_gpu" model_version: -1
    input_map { key: "x" value: "X" } output_map { key: "y" value: "mid" } },
  { model_name: "torch_gpu_in" model_version: -1
    input_map [ { key: "X" value: "mid" }, { key: "HOST" value: "HOST" } ]
    output_map [ { key: "Y" value: "Y" }, { key: "INFO" value: "INFO" } ] } ] }
"""


def _write_affine_onnx(path):
    """y = x * 2 + 1 over FP32 [16] (as tests/gpu/test_cuda_shm.py's)."""
    from onnx import TensorProto, helper, save
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"]),
         helper.make_node("Add", ["t", "one"], ["y"])],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N_IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N_IN])],
        initializer=[two, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return "torch is not installed in this interpreter"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return ""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    why = _torch_cuda()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("python_dlpack")
    root = tmp / "models"
    names = ["torch_gpu_add", "torch_gpu_bls", "torch_gpu_in"]
    for name, config, py in (("torch_gpu_add", ADD_CONFIG, ADD_PY),
                             ("torch_gpu_bls", BLS_CONFIG, BLS_PY),
                             ("torch_gpu_in", GPU_IN_CONFIG, GPU_IN_PY)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(py)
    try:  # the GPU step before torch_gpu_in (onnx: check.sh's Python has it)
        (root / "affine_gpu" / "1").mkdir(parents=True)
        (root / "affine_gpu" / "config.pbtxt").write_text(AFFINE_CONFIG)
        _write_affine_onnx(root / "affine_gpu" / "1" / "model.onnx")
        (root / "gpu_into_python" / "1").mkdir(parents=True)
        (root / "gpu_into_python" / "config.pbtxt").write_text(GPU_INTO_PYTHON)
        names += ["affine_gpu", "gpu_into_python"]
    except ImportError:
        pass
    srv = start_with_python_stub(root, names, tmp)
    try:
        # importing torch and starting CUDA in each Python process: seconds, not minutes (the
        # pytest step of check.sh has 360 s for every test file; this one runs last)
        srv.wait_ready("torch_gpu_add", timeout=150)
        srv.wait_ready("torch_gpu_bls", timeout=150)
        srv.wait_ready("torch_gpu_in", timeout=150)
        srv.has_gpu_into_python = "gpu_into_python" in names
        yield srv
    finally:
        srv.stop()


def infer(srv, model, x, outputs, host=None):
    """POSTs X (binary; and HOST, INT32 [1], when given) and asks for `outputs` in binary;
    returns {name: (datatype, shape, raw bytes)}."""
    inputs = [{"name": "X", "shape": list(x.shape), "datatype": "FP32",
               "parameters": {"binary_data_size": x.nbytes}}]
    body = x.tobytes()
    if host is not None:
        inputs.append({"name": "HOST", "shape": [1], "datatype": "INT32",
                       "parameters": {"binary_data_size": 4}})
        body += np.array([host], dtype=np.int32).tobytes()
    head = json.dumps({
        "inputs": inputs,
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs]}).encode()
    r = requests.post(f"{srv.url}/v2/models/{model}/infer", data=head + body,
                      headers={"Inference-Header-Content-Length": str(len(head)),
                               "Content-Type": "application/octet-stream"}, timeout=300)
    assert r.status_code == 200, f"{model}: HTTP {r.status_code}: {r.text[:1000]}\n{srv.log()}"
    hlen = int(r.headers["Inference-Header-Content-Length"])
    meta = json.loads(r.content[:hlen])
    got, off = {}, hlen
    for o in meta["outputs"]:
        n = o["parameters"]["binary_data_size"]
        got[o["name"]] = (o["datatype"], o["shape"], r.content[off:off + n])
        off += n
    return got


def info_of(raw):
    (n,) = np.frombuffer(raw[:4], dtype="<u4")
    return json.loads(raw[4:4 + n])


def test_cuda_outputs_reach_the_client(server):
    x = np.array([0.5, 1.5, -3.0, 8.0, 2.25, -0.125, 100.0, 7.0] * 2, dtype=np.float32)
    got = infer(server, "torch_gpu_add", x, ["Y", "M", "I", "BF", "INFO"])
    dt, shape, raw = got["Y"]
    assert (dt, shape) == ("FP32", [16])
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), x * 2 + 1)
    h = x[:16].reshape(4, 4).astype(np.float64)
    np.testing.assert_allclose(np.frombuffer(got["M"][2], np.float32).reshape(4, 4), h @ h.T,
                               rtol=1e-3)  # TF32 may be on for matmuls
    np.testing.assert_array_equal(np.frombuffer(got["I"][2], np.int64),
                                  (x * 3).astype(np.int64))
    assert got["BF"][0] == "BF16"
    # every value of x is exact in bfloat16: its bits are the float's upper half
    np.testing.assert_array_equal(np.frombuffer(got["BF"][2], np.uint16),
                                  (x.view(np.uint32) >> 16).astype(np.uint16))
    info = info_of(got["INFO"][2])
    assert info["input_is_cpu"] is True  # FORCE_CPU_ONLY_INPUT_TENSORS 'no': a host input stays
    assert info["is_cpu"] is False and info["device"][0] == 2
    assert info["as_numpy"] == "Tensor is stored in GPU and cannot be converted to NumPy."
    assert info["same_memory"] is True
    # the second request sees the runtime the first one's copy loaded
    info = info_of(infer(server, "torch_gpu_add", x, ["INFO"])["INFO"][2])
    assert info["cudart"] and "libcudart" in info["cudart"], info
    print(f"python_dlpack: the copies used {info['cudart']}")
    # on a GPU host 'no' takes effect: no "has no effect" WARNING
    assert "FORCE_CPU_ONLY_INPUT_TENSORS 'no' has no effect" not in server.log_path.read_text(
        errors="replace")


def test_large_cuda_output(server):
    x = np.random.default_rng(30).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    got = infer(server, "torch_gpu_add", x, ["Y"])
    np.testing.assert_array_equal(np.frombuffer(got["Y"][2], np.float32), x * 2 + 1)


def test_bls_with_a_cuda_input(server):
    x = np.arange(-5, 11, dtype=np.float32)
    got = infer(server, "torch_gpu_bls", x, ["Y"])
    np.testing.assert_array_equal(np.frombuffer(got["Y"][2], np.float32), x * 3 * 2 + 1)


def test_gpu_step_feeds_python_on_the_gpu(server):
    """FORCE_CPU_ONLY_INPUT_TENSORS 'no': the ONNX step's GPU output reaches model.py as a CUDA
    tensor (model.py asserts it, and fails the request otherwise), torch computes on it in
    place, and the values are numpy's."""
    if not server.has_gpu_into_python:
        pytest.skip("no onnx module in this interpreter")
    # the ONNX step loads the CUDA provider: fails at once, with its reason, if it cannot
    server.wait_ready("gpu_into_python", timeout=120)
    x = (np.arange(N_IN, dtype=np.float32) - 5) * 0.75
    for host in (1, 4):  # twice: the second call maps the (reused) GPU memory again
        got = infer(server, "gpu_into_python", x, ["Y", "INFO"], host=host)
        dt, shape, raw = got["Y"]
        assert (dt, shape) == ("FP32", [N_IN])
        np.testing.assert_allclose(np.frombuffer(raw, np.float32), (x * 2 + 1) * 3 - host,
                                   rtol=1e-6)
        info = info_of(got["INFO"][2])
        assert info["device"] == [2, 0], info  # kDLCUDA, GPU 0
        assert info["torch_device"] == "cuda:0", info
        assert info["shape"] == [N_IN] and info["dtype"] == 11, info
    log = server.log_path.read_text(errors="replace")
    assert "could not be handed to model.py through CUDA IPC" not in log, log[-4000:]


def test_cuda_shm_input_reaches_python_on_the_gpu(server):
    """FORCE_CPU_ONLY_INPUT_TENSORS 'no' with the input in a client's CUDA shared-memory
    region: the server maps the client's allocation, which CUDA will not export again, so the
    Python instance copies it device to device into its own staging buffer and hands that over
    (as Triton's Python backend copies into its CUDA pool); model.py asserts the tensor is on
    the GPU, and there is no host fallback WARNING."""
    import base64

    import cuda_ipc
    if cuda_ipc.available():
        pytest.skip(cuda_ipc.available())
    reg = cuda_ipc.DeviceRegion(4096)
    name = "py_in"
    try:
        r = requests.post(f"{server.url}/v2/cudasharedmemory/region/{name}/register", json={
            "raw_handle": {"b64": base64.b64encode(reg.handle).decode()},
            "device_id": 0, "byte_size": reg.nbytes}, timeout=60)
        assert r.status_code == 200, r.text
        for k, host in ((1, 2), (2, 5)):  # twice: the second batch reuses the staging buffer
            x = (np.arange(N_IN, dtype=np.float32) - 3) * 0.5 * k
            reg.write(256, x)
            body = {"inputs": [
                {"name": "X", "datatype": "FP32", "shape": [N_IN],
                 "parameters": {"shared_memory_region": name, "shared_memory_offset": 256,
                                "shared_memory_byte_size": x.nbytes}},
                {"name": "HOST", "datatype": "INT32", "shape": [1], "data": [host]}],
                "outputs": [{"name": "Y"}, {"name": "INFO"}]}
            r = requests.post(f"{server.url}/v2/models/torch_gpu_in/infer", json=body, timeout=120)
            assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:1000]}\n{server.log()}"
            out = {o["name"]: o for o in r.json()["outputs"]}
            np.testing.assert_allclose(np.array(out["Y"]["data"], np.float32), x * 3 - host,
                                       rtol=1e-6)
            info = json.loads(out["INFO"]["data"][0])
            assert info["device"] == [2, 0] and info["torch_device"] == "cuda:0", info
        log = server.log_path.read_text(errors="replace")
        assert "could not be handed to model.py through CUDA IPC" not in log, log[-4000:]
    finally:
        requests.post(f"{server.url}/v2/cudasharedmemory/region/{name}/unregister", timeout=60)
        reg.free()
