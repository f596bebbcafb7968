"""The Python backend's DLPack with GPU tensors (issue 30), tested without a GPU.

A "fake GPU" producer stands in for torch.cuda: an object whose __dlpack_device__() says
(kDLCUDA, 0) and whose __dlpack__() gives numpy's capsule over HOST memory with its device field
rewritten to kDLCUDA. The stub's device-to-host copy (pb_utils._device_to_host, cudaMemcpy by
default) is replaced by ctypes.memmove, so the whole path (from_dlpack, the tensor kept on "the
GPU", its one copy when the response is written, the server's answer) runs through the real
server. The same checks on a real GPU with torch are in tests/gpu/test_python_dlpack.py.

The unit tests at the end import the stub's module directly (no server): the capsule parsing,
data types, strides, BYTES, the exported capsule's lifetime.
"""

import ctypes
import gc
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import start_server
from v2client import assert_error, infer, make_input, parse_response

STUB_DIR = Path(__file__).resolve().parents[2] / "src" / "backends" / "python" / "stub"

# Prepended to each model.py: the fake CUDA producer and the copy over host memory.
FAKE_GPU = '''
import ctypes
import json
import numpy as np
import triton_python_backend_utils as pb_utils

pb_utils._device_to_host = lambda dst, src, n, device: ctypes.memmove(dst, src, n)


def _patch(capsule, device_type, dl_code=None):
    addr = pb_utils._capsule_pointer(capsule, b"dltensor")
    t = pb_utils._DLManagedTensor.from_address(addr).dl_tensor
    t.device.device_type = device_type
    if dl_code is not None:
        t.dtype.code = dl_code
    return t


class FakeCuda:
    """numpy memory that says it is on CUDA device 0 (kDLCUDA = 2)."""
    def __init__(self, array, dl_code=None):
        self.array, self.dl_code, self.streams = array, dl_code, []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        capsule = self.array.__dlpack__()
        _patch(capsule, 2, self.dl_code)
        return capsule
'''

OUT_CONFIG = """name: "dl_out"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "I" data_type: TYPE_INT64 dims: [ 2, 2 ] },
         { name: "B" data_type: TYPE_BOOL dims: [ 4 ] },
         { name: "H" data_type: TYPE_FP16 dims: [ 4 ] },
         { name: "BF" data_type: TYPE_BF16 dims: [ 4 ] },
         { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

OUT_PY = FAKE_GPU + '''

def no_runtime_once(dst, src, n, device):
    """The real copy, with a runtime search that finds nothing; the fake copy afterwards."""
    saved = pb_utils._cudart_candidates
    pb_utils._device_to_host = lambda dst, src, n, device: ctypes.memmove(dst, src, n)
    pb_utils._cudart_candidates = lambda: ["/nonexistent/libcudart.so"]
    pb_utils._cudart = pb_utils._cudart_error = None
    try:
        pb_utils._cuda_device_to_host(dst, src, n, device)
    finally:
        pb_utils._cudart_candidates = saved
        pb_utils._cudart = pb_utils._cudart_error = None


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            mode = int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0])
            if mode == 1:  # a transposed (not row-major) tensor: refused, naming it
                pb_utils.Tensor.from_dlpack("Y", FakeCuda(np.arange(6, dtype=np.float32).reshape(2, 3).T))
            if mode == 2:  # no CUDA runtime to copy with: this request fails, naming it
                pb_utils._device_to_host = no_runtime_once
            source = FakeCuda(x * 2 + 1)
            y = pb_utils.Tensor.from_dlpack("Y", source)
            info = {"is_cpu": y.is_cpu(), "device": list(y.__dlpack_device__()),
                    "shape": y.shape(), "dtype": y.triton_dtype(), "streams": source.streams}
            try:
                y.as_numpy()
            except pb_utils.TritonModelException as e:
                info["as_numpy"] = str(e)
            # to_dlpack: a capsule over the same device memory, device (2, 0)
            cap = y.to_dlpack()
            t = pb_utils._DLManagedTensor.from_address(pb_utils._capsule_pointer(cap, b"dltensor")).dl_tensor
            info["exported"] = [t.device.device_type, t.device.device_id,
                                t.data == source.array.ctypes.data]
            # a consumer (numpy, once the capsule says CPU) reads the same values
            _patch(cap, 1)
            info["consumed"] = np.from_dlpack(pb_utils._DLPackCapsule(cap)).tolist()
            # 2-D INT64, BOOL, FP16, BF16 (the bits of 1.5, -2, 0.25, 3 as bfloat16)
            i = pb_utils.Tensor.from_dlpack("I", FakeCuda((x.astype(np.int64) * 3).reshape(2, 2)))
            b = pb_utils.Tensor.from_dlpack("B", FakeCuda((x > 1).view(np.uint8), dl_code=6))  # kDLBool
            h = pb_utils.Tensor.from_dlpack("H", FakeCuda((x / 4).astype(np.float16)))
            bits = (np.array([1.5, -2, 0.25, 3], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
            bf = pb_utils.Tensor.from_dlpack("BF", FakeCuda(bits, dl_code=4))  # kDLBfloat
            info["bf16_dtype"] = bf.triton_dtype()
            del source, cap  # the tensors keep the memory alive on their own
            responses.append(pb_utils.InferenceResponse([
                y, i, b, h, bf, pb_utils.Tensor("INFO", np.array([json.dumps(info)], dtype=np.object_))]))
        return responses
'''

# BLS: a GPU tensor as a BLS input (copied to the host for the request); the answer is a
# host tensor again. The callee also returns a GPU tensor (copied when it answers).
BLS_CONFIG = """name: "dl_bls"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "CALLEE_CPU" data_type: TYPE_BOOL dims: [ 1 ] },
         { name: "BF" data_type: TYPE_BF16 dims: [ 4 ] } ]
"""

BLS_PY = FAKE_GPU + '''

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            gpu_in = pb_utils.Tensor.from_dlpack("X", FakeCuda(x * 3))
            reply = pb_utils.InferenceRequest(model_name="dl_double", inputs=[gpu_in],
                                              requested_output_names=["Y", "WAS_CPU"]).exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "Y")
            was_cpu = pb_utils.get_output_tensor_by_name(reply, "WAS_CPU")
            # a BF16 answer comes back as BF16 (its bits; as_numpy refused as in Triton)
            reply = pb_utils.InferenceRequest(
                model_name="dl_out", requested_output_names=["BF"],
                inputs=[pb_utils.Tensor("X", x), pb_utils.Tensor("MODE", np.array([0], np.int32))]).exec()
            bf = pb_utils.get_output_tensor_by_name(reply, "BF")
            assert bf.triton_dtype() == 14 and bf.is_cpu(), bf.triton_dtype()
            try:
                bf.as_numpy()
                raise AssertionError("as_numpy() of a BF16 tensor did not raise")
            except pb_utils.TritonModelException:
                pass
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y.as_numpy() + 0), pb_utils.Tensor("CALLEE_CPU", was_cpu.as_numpy()),
                bf]))
        return responses
'''

DOUBLE_CONFIG = """name: "dl_double"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "WAS_CPU" data_type: TYPE_BOOL dims: [ 1 ] } ]
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
instance_group [ { kind: KIND_CPU count: 2 } ]
"""

DOUBLE_PY = FAKE_GPU + '''

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X")
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("Y", FakeCuda(x.as_numpy() * 2)),
                pb_utils.Tensor("WAS_CPU", np.array([x.is_cpu()]))]))
        return out
'''

# Here (no GPU driver) 'no' has nothing to hand over; on a host with a GPU, inputs on it reach
# model.py as CUDA tensors (tests/unit/python_gpu_inputs_test.cc, tests/gpu/test_python_dlpack.py).
WARNING = "parameters FORCE_CPU_ONLY_INPUT_TENSORS 'no' has no effect on this host (no GPU: "


def write_model(repo, name, config, model_py):
    d = Path(repo) / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(config)
    (d / "1" / "model.py").write_text(model_py)


def model_ready(srv, name):
    return srv.get(f"/v2/models/{name}/ready").status_code == 200


@pytest.fixture(scope="module")
def dl_server(tmp_path_factory, logs_dir):
    repo = tmp_path_factory.mktemp("dlpack_repo")
    write_model(repo, "dl_out", OUT_CONFIG, OUT_PY)
    write_model(repo, "dl_bls", BLS_CONFIG, BLS_PY)
    write_model(repo, "dl_double", DOUBLE_CONFIG, DOUBLE_PY)
    srv = start_server(repo, ["--exit-on-error=false"], logs_dir)
    try:
        srv.wait_until(lambda: all(model_ready(srv, m) for m in ("dl_out", "dl_bls", "dl_double")),
                       60, "the DLPack models ready")
        yield srv
    finally:
        if srv.proc.poll() is None:
            assert srv.stop() == 0, srv.log()


def x_input(x):
    return make_input("X", np.asarray(x, dtype=np.float32), "FP32")


def mode_input(mode):
    return make_input("MODE", np.array([mode], dtype=np.int32), "INT32")


def test_gpu_outputs_reach_the_client(dl_server):
    x = np.array([0.5, 1.5, -3.0, 8.0], dtype=np.float32)
    resp = infer(dl_server, "dl_out", [x_input(x), mode_input(0)])
    assert resp.status_code == 200, resp.text[:2000]
    outputs = {o["name"]: o for o in resp.json()["outputs"]}
    _, parsed = parse_response(infer(dl_server, "dl_out", [x_input(x), mode_input(0)],
                                     outputs=[{"name": n} for n in ("Y", "I", "B", "H", "INFO")]))
    np.testing.assert_array_equal(parsed["Y"], x * 2 + 1)
    assert outputs["Y"]["datatype"] == "FP32" and outputs["Y"]["shape"] == [4]
    np.testing.assert_array_equal(parsed["I"], (x.astype(np.int64) * 3).reshape(2, 2))
    assert outputs["I"]["shape"] == [2, 2] and outputs["I"]["datatype"] == "INT64"
    np.testing.assert_array_equal(parsed["B"], x > 1)
    np.testing.assert_array_equal(parsed["H"], (x / 4).astype(np.float16))
    assert outputs["BF"]["datatype"] == "BF16"
    assert outputs["BF"]["data"] == [1.5, -2.0, 0.25, 3.0]
    info = json.loads(parsed["INFO"][0])
    assert info["is_cpu"] is False
    assert info["device"] == [2, 0]
    assert info["shape"] == [4] and info["dtype"] == 11
    assert info["streams"] == [1]  # ordered before the legacy default stream
    assert info["as_numpy"] == "Tensor is stored in GPU and cannot be converted to NumPy."
    assert info["exported"] == [2, 0, True]
    assert info["consumed"] == (x * 2 + 1).tolist()
    assert info["bf16_dtype"] == 14


def test_refusals_name_the_tensor_and_the_server_stays_up(dl_server):
    x = np.arange(4, dtype=np.float32)
    resp = infer(dl_server, "dl_out", [x_input(x), mode_input(1)])
    assert_error(resp, 500, "Tensor.from_dlpack('Y')", "not contiguous")
    resp = infer(dl_server, "dl_out", [x_input(x), mode_input(2)])
    assert_error(resp, 500, "tensor 'Y'", "libcudart", "/nonexistent/libcudart.so")
    # the process is alive and the next request is answered
    assert model_ready(dl_server, "dl_out")
    _, out = parse_response(infer(dl_server, "dl_out", [x_input(x), mode_input(0)],
                                  outputs=[{"name": "Y"}]))
    np.testing.assert_array_equal(out["Y"], x * 2 + 1)


def test_bls_with_a_gpu_input(dl_server):
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    resp = infer(dl_server, "dl_bls", [x_input(x)])
    assert resp.status_code == 200, resp.text[:2000]
    bf = [o for o in resp.json()["outputs"] if o["name"] == "BF"][0]
    assert bf["datatype"] == "BF16" and bf["data"] == [1.5, -2.0, 0.25, 3.0]
    _, out = parse_response(infer(dl_server, "dl_bls", [x_input(x)],
                                  outputs=[{"name": "Y"}, {"name": "CALLEE_CPU"}]))
    np.testing.assert_array_equal(out["Y"], x * 6)
    # the callee was given host memory: the stub copies a BLS request's GPU tensors to the host
    assert out["CALLEE_CPU"].tolist() == [True]


def test_force_cpu_only_input_tensors_no_warns_once(dl_server):
    # two instances, one WARNING line (per version); "yes" and no key: none
    log = Path(dl_server.log_path).read_text(errors="replace")
    lines = [line for line in log.splitlines() if WARNING in line]
    assert len(lines) == 1, lines
    assert "model 'dl_double'" in lines[0] and lines[0].startswith("W")  # glog's WARNING


# ------------------------------------------------------------------------------------------------
# Unit checks of the stub module (no server)


@pytest.fixture(scope="module")
def pbu():
    sys.path.insert(0, str(STUB_DIR))
    try:
        import triton_python_backend_utils as module
    finally:
        sys.path.remove(str(STUB_DIR))
    saved = module._device_to_host
    module._device_to_host = lambda dst, src, n, device: ctypes.memmove(dst, src, n)
    yield module
    module._device_to_host = saved


def fake_cuda(pbu, array, dl_code=None, bits=None, lanes=None, device_type=2):
    class Fake:
        def __dlpack_device__(self):
            return (device_type, 0)

        def __dlpack__(self, stream=None):
            capsule = array.__dlpack__()
            t = pbu._DLManagedTensor.from_address(pbu._capsule_pointer(capsule, b"dltensor")).dl_tensor
            t.device.device_type = device_type
            if dl_code is not None:
                t.dtype.code = dl_code
            if bits is not None:
                t.dtype.bits = bits
            if lanes is not None:
                t.dtype.lanes = lanes
            return capsule
    return Fake()


@pytest.mark.parametrize("dtype,code", [
    (np.bool_, 1), (np.uint8, 2), (np.uint16, 3), (np.uint32, 4), (np.uint64, 5), (np.int8, 6),
    (np.int16, 7), (np.int32, 8), (np.int64, 9), (np.float16, 10), (np.float32, 11),
    (np.float64, 12)])
def test_unit_dtypes_map_as_triton(pbu, dtype, code):
    a = (np.arange(6) % 3).astype(dtype).reshape(2, 3)
    # numpy before 1.25 exports no bool: its bytes, typed kDLBool (6)
    src = a.view(np.uint8) if dtype is np.bool_ else a
    t = pbu.Tensor.from_dlpack("T", fake_cuda(pbu, src, dl_code=6 if dtype is np.bool_ else None))
    assert t.triton_dtype() == code and t.shape() == [2, 3] and not t.is_cpu()
    np.testing.assert_array_equal(pbu._copy_to_host(t).view(dtype).reshape(2, 3), a)
    # the CPU path keeps working and gives the same type
    c = pbu.Tensor.from_dlpack("C", fake_cuda(pbu, src, dl_code=6 if dtype is np.bool_ else None,
                                              device_type=1))
    assert c.is_cpu() and c.triton_dtype() == code
    np.testing.assert_array_equal(c.as_numpy(), a)


def test_unit_bf16_supported_and_other_types_refused(pbu):
    bits = np.array([0x3FC0, 0xC000], dtype=np.uint16)  # 1.5, -2 in bfloat16
    t = pbu.Tensor.from_dlpack("BF", fake_cuda(pbu, bits, dl_code=4))
    assert t.triton_dtype() == 14
    np.testing.assert_array_equal(pbu._copy_to_host(t).view(np.uint16), bits)
    # BF16 on the host: its bits kept, as_numpy refused as Triton does, to_dlpack typed BF16
    h = pbu.Tensor.from_dlpack("BFH", fake_cuda(pbu, bits, dl_code=4, device_type=1))
    assert h.is_cpu() and h.triton_dtype() == 14
    with pytest.raises(pbu.TritonModelException, match="BF16 and cannot be converted to NumPy"):
        h.as_numpy()
    cap = h.to_dlpack()
    dt = pbu._DLManagedTensor.from_address(pbu._capsule_pointer(cap, b"dltensor")).dl_tensor.dtype
    assert (dt.code, dt.bits, dt.lanes) == (4, 16, 1)
    with pytest.raises(pbu.TritonModelException, match=r"code 2, bits 8, lanes 1"):
        pbu.Tensor.from_dlpack("F8", fake_cuda(pbu, np.zeros(2, np.uint8), dl_code=2))  # float8
    with pytest.raises(pbu.TritonModelException, match=r"lanes 2"):
        pbu.Tensor.from_dlpack("V", fake_cuda(pbu, np.zeros(2, np.float32), lanes=2))
    with pytest.raises(pbu.TritonModelException, match="DLDevice type 10 is not supported"):
        pbu.Tensor.from_dlpack("R", fake_cuda(pbu, np.zeros(2, np.float32), device_type=10))


def test_unit_strides(pbu):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(pbu.TritonModelException, match=r"from_dlpack\('T'\).*not contiguous"):
        pbu.Tensor.from_dlpack("T", fake_cuda(pbu, a.T))
    with pytest.raises(pbu.TritonModelException, match="not contiguous"):
        pbu.Tensor.from_dlpack("S", fake_cuda(pbu, a[:, ::2]))
    # compact with strides spelled out, and size-1 dimensions with any stride: accepted
    t = pbu.Tensor.from_dlpack("R", fake_cuda(pbu, a[1:2, :]))
    np.testing.assert_array_equal(pbu._copy_to_host(t).view(np.float32).reshape(1, 4), a[1:2])
    t = pbu.Tensor.from_dlpack("Z", fake_cuda(pbu, np.zeros((0, 3), np.float32)))
    assert t.shape() == [0, 3] and pbu._copy_to_host(t).size == 0


def test_unit_bytes_and_bad_sources_refused(pbu):
    with pytest.raises(pbu.TritonModelException, match="BYTES"):
        pbu.Tensor("S", np.array([b"a"], dtype=np.object_)).to_dlpack()
    with pytest.raises(pbu.TritonModelException, match="__dlpack__"):
        pbu.Tensor.from_dlpack("N", [1, 2])
    cap = np.zeros(2, np.float32).__dlpack__()
    pbu.Tensor.from_dlpack("ONCE", cap)
    with pytest.raises(pbu.TritonModelException, match="consumed already"):
        pbu.Tensor.from_dlpack("TWICE", cap)
    with pytest.raises(pbu.TritonModelException, match="name"):
        pbu.Tensor.from_dlpack("", np.zeros(1))


def test_unit_raw_capsule_and_lifetime(pbu):
    a = np.arange(5, dtype=np.int32)
    cap = fake_cuda(pbu, a).__dlpack__()
    t = pbu.Tensor.from_dlpack("RAW", cap)
    assert not t.is_cpu() and t.__dlpack_device__() == (2, 0)
    assert not pbu._capsule_is_valid(cap, b"dltensor")  # consumed, as DLPack consumers do
    exported = t.to_dlpack()
    before = len(pbu._EXPORTED)
    # the consumer (numpy here) calls the deleter when done; the capsule never consumed is
    # freed by its destructor
    t2 = pbu.Tensor.from_dlpack("AGAIN", exported)
    del exported, t
    gc.collect()
    np.testing.assert_array_equal(pbu._copy_to_host(t2).view(np.int32), a)
    unused = t2.to_dlpack()
    assert len(pbu._EXPORTED) == before + 1
    del unused
    gc.collect()
    assert len(pbu._EXPORTED) == before
    del t2
    gc.collect()
    assert len(pbu._EXPORTED) == before - 1


def test_unit_with_torch(pbu):
    """torch as producer and consumer (Debian's CPU torch here; a CPU capsule whose device says
    CUDA stands in for the GPU one, and ours is told CPU again before torch takes it)."""
    torch = pytest.importorskip("torch")

    def as_cuda(t):
        class Producer:
            def __dlpack_device__(self):
                return (2, 0)

            def __dlpack__(self, stream=None):
                c = torch.utils.dlpack.to_dlpack(t)
                pbu._DLManagedTensor.from_address(
                    pbu._capsule_pointer(c, b"dltensor")).dl_tensor.device.device_type = 2
                return c
        return Producer()

    src = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 1.5
    g = pbu.Tensor.from_dlpack("G", as_cuda(src))
    np.testing.assert_array_equal(pbu._copy_to_host(g).view(np.float32).reshape(3, 4),
                                  src.numpy())
    b = pbu.Tensor.from_dlpack("B", as_cuda(torch.tensor([1.5, -2.0], dtype=torch.bfloat16)))
    assert b.triton_dtype() == 14
    assert pbu._copy_to_host(b).view(np.uint16).tolist() == [0x3FC0, 0xC000]
    with pytest.raises(pbu.TritonModelException, match="not contiguous"):
        pbu.Tensor.from_dlpack("T", as_cuda(src[:, 1:2]))
    # our capsule over the "device" memory: torch reads the same memory and frees it through
    # our deleter
    cap = g.to_dlpack()
    pbu._DLManagedTensor.from_address(
        pbu._capsule_pointer(cap, b"dltensor")).dl_tensor.device.device_type = 1
    count = len(pbu._EXPORTED)
    back = torch.utils.dlpack.from_dlpack(cap)
    assert back.data_ptr() == src.data_ptr() and torch.equal(back, src)
    del cap, g
    gc.collect()
    assert len(pbu._EXPORTED) == count
    del back
    gc.collect()
    assert len(pbu._EXPORTED) == count - 1
    # host tensors from torch go back to torch: BF16, and numpy's read-only import
    hb = pbu.Tensor.from_dlpack("HB", torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16))
    assert hb.is_cpu() and hb.triton_dtype() == 14
    assert torch.from_dlpack(hb).tolist() == [1.5, -2.0, 3.0]
    f = pbu.Tensor.from_dlpack("F", torch.ones(3) * 2)
    assert torch.utils.dlpack.from_dlpack(f.to_dlpack()).tolist() == [2.0, 2.0, 2.0]
