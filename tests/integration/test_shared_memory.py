"""The system shared-memory extension against the real server: regions created the way
tritonclient creates them (shm_open + ftruncate + mmap: Python's multiprocessing.shared_memory),
registered over HTTP and gRPC, inputs read from and outputs written to them (checked against
numpy), status and unregister, a region unregistered while a request uses it, and every bad
input answered 400 naming what was wrong while the server stays up. CUDA shared memory is
refused as not supported (501 / UNIMPLEMENTED)."""

import base64
import json
import random
import re
import threading
import time
from multiprocessing import shared_memory

import numpy as np
import pytest

from v2client import assert_error, infer, make_input

SLOW = """
name: "slow"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "execute_delay_ms" value: { string_value: "600" } }
"""


@pytest.fixture
def srv(make_repo, server_factory):
    repo = make_repo({"simple": "simple", "identity_fp32": "identity_fp32"})
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW)
    s = server_factory(repo)
    for m in ("simple", "identity_fp32", "slow"):
        s.wait_until(lambda: s.get(f"/v2/models/{m}/ready").status_code == 200, 60, m)
    return s


@pytest.fixture
def regions():
    made = []

    def make(size):
        shm = shared_memory.SharedMemory(create=True, size=size)
        made.append(shm)
        return shm, "/" + shm.name

    yield make
    for shm in made:
        shm.close()
        shm.unlink()


def register(srv, name, key, byte_size, offset=0):
    return srv.post(f"/v2/systemsharedmemory/region/{name}/register",
                    json={"key": key, "offset": offset, "byte_size": byte_size})


def shm_param(region, byte_size, offset=0):
    return {"shared_memory_region": region, "shared_memory_byte_size": byte_size,
            "shared_memory_offset": offset}


def simple_request(a_off=0, b_off=64, out_region="out", out_size=64, in_region="in"):
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16],
             "parameters": shm_param(in_region, 64, a_off)},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16],
             "parameters": shm_param(in_region, 64, b_off)},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": shm_param(out_region, out_size, 0)},
            {"name": "OUTPUT1", "parameters": shm_param(out_region, out_size, 64)},
        ],
    }


def put_inputs(shm, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=16, dtype=np.int32)
    b = rng.integers(-1000, 1000, size=16, dtype=np.int32)
    shm.buf[0:64] = a.tobytes()
    shm.buf[64:128] = b.tobytes()
    return a, b


def test_http_round_trip_status_and_unregister(srv, regions):
    shm_in, key_in = regions(128)
    shm_out, key_out = regions(4096 + 128)
    a, b = put_inputs(shm_in)
    assert register(srv, "in", key_in, 128).status_code == 200
    # The output region starts at a non-page-aligned offset of its object.
    assert register(srv, "out", key_out, 128, offset=100).status_code == 200
    r = srv.post("/v2/models/simple/infer", json=simple_request())
    assert r.status_code == 200, r.text
    outs = {o["name"]: o for o in r.json()["outputs"]}
    assert outs["OUTPUT0"]["shape"] == [1, 16] and outs["OUTPUT0"]["datatype"] == "INT32"
    assert "data" not in outs["OUTPUT0"], "an output in shared memory came back in the body too"
    got0 = np.frombuffer(bytes(shm_out.buf[100:164]), dtype=np.int32)
    got1 = np.frombuffer(bytes(shm_out.buf[164:228]), dtype=np.int32)
    np.testing.assert_array_equal(got0, a + b)
    np.testing.assert_array_equal(got1, a - b)
    # Inputs from shared memory, outputs in the body; and the reverse.
    req = simple_request()
    del req["outputs"]
    r = srv.post("/v2/models/simple/infer", json=req)
    assert r.status_code == 200, r.text
    body = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert body["OUTPUT0"] == (a + b).tolist()

    st = srv.get("/v2/systemsharedmemory/status")
    assert st.status_code == 200
    assert sorted(st.json(), key=lambda x: x["name"]) == [
        {"name": "in", "key": key_in, "offset": 0, "byte_size": 128},
        {"name": "out", "key": key_out, "offset": 100, "byte_size": 128}]
    one = srv.get("/v2/systemsharedmemory/region/out/status")
    assert one.status_code == 200 and [x["name"] for x in one.json()] == ["out"]
    assert_error(srv.get("/v2/systemsharedmemory/region/nope/status"), 404, "nope")
    assert srv.post("/v2/systemsharedmemory/region/in/unregister").status_code == 200
    assert [x["name"] for x in srv.get("/v2/systemsharedmemory/status").json()] == ["out"]
    assert_error(srv.post("/v2/models/simple/infer", json=simple_request()), 400, "'in'", "INPUT0")
    assert srv.post("/v2/systemsharedmemory/unregister").status_code == 200
    assert srv.get("/v2/systemsharedmemory/status").json() == []
    md = srv.get("/v2").json()
    assert "system_shared_memory" in md["extensions"]
    # Advertised by a build with CUDA (as Triton built with GPU support), even without a GPU.
    assert ("cuda_shared_memory" in md["extensions"]) == cuda_build(srv)


def test_region_unregistered_while_a_request_uses_it(srv, regions):
    shm, key = regions(256)
    x = np.arange(16, dtype=np.float32) * 1.5
    shm.buf[0:64] = x.tobytes()
    assert register(srv, "r", key, 256).status_code == 200
    req = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                       "parameters": shm_param("r", 64, 0)}],
           "outputs": [{"name": "OUTPUT0", "parameters": shm_param("r", 64, 128)}]}
    result = {}
    t = threading.Thread(target=lambda: result.update(r=srv.post("/v2/models/slow/infer", json=req)))
    t.start()
    time.sleep(0.2)  # the request is in the model (600 ms)
    assert srv.post("/v2/systemsharedmemory/region/r/unregister").status_code == 200
    assert srv.get("/v2/systemsharedmemory/status").json() == []
    t.join(10)
    assert result["r"].status_code == 200, result["r"].text
    np.testing.assert_array_equal(np.frombuffer(bytes(shm.buf[128:192]), dtype=np.float32), x)
    assert srv.is_live()


def test_register_rejects_bad_regions(srv, regions):
    shm, key = regions(1000)
    assert_error(register(srv, "a", "/inferd-no-such-object", 16), 400, "/inferd-no-such-object")
    assert_error(register(srv, "a", key, 1001), 400, "past the end", key)
    assert_error(register(srv, "a", key, 16, offset=990), 400, "past the end")
    assert_error(register(srv, "a", key, 16, offset=5000), 400, "past the end")
    assert_error(register(srv, "a", key, 0), 400, "byte_size")
    assert register(srv, "a", key, 1000).status_code == 200
    # Triton's ALREADY_EXISTS, which its HTTP frontend answers 400 (HttpCodeFromError has no
    # 409), so tritonclient's InferenceServerException.status() is "400".
    assert_error(register(srv, "a", key, 10), 400, "shared memory region 'a' already in manager")
    p = "/v2/systemsharedmemory/region/b/register"
    assert_error(srv.post(p, json={"offset": 0, "byte_size": 8}), 400, "'key'")
    assert_error(srv.post(p, json={"key": key}), 400, "'byte_size'")
    assert_error(srv.post(p, json={"key": 5, "byte_size": 8}), 400, "'key'")
    assert_error(srv.post(p, json={"key": key, "byte_size": -8}), 400, "'byte_size'")
    assert_error(srv.post(p, json={"key": key, "byte_size": 8, "offset": "x"}), 400, "'offset'")
    assert_error(srv.post(p, data=b"{not json"), 400, "JSON")
    assert_error(srv.get(p), 405)
    assert_error(srv.post("/v2/systemsharedmemory/status"), 405)
    # Garbage bodies and names: always a 400 (or 404 for no route), never a crash.
    rng = random.Random(7)
    for i in range(200):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        if i % 3 == 0:
            body = json.dumps({"key": rng.choice([key, "", "/", "x" * 300, None, 1.5]),
                               "offset": rng.choice([0, -1, 2**64 - 1, 10**30, "0", None]),
                               "byte_size": rng.choice([1, 0, 2**63, -5, [], {}])}).encode()
        r = srv.post(f"/v2/systemsharedmemory/region/g{i}/register", data=body)
        assert r.status_code in (200, 400), (body, r.status_code, r.text)
    assert srv.is_live()
    assert srv.post("/v2/systemsharedmemory/unregister").status_code == 200


def test_infer_rejects_bad_references(srv, regions):
    shm_in, key_in = regions(128)
    shm_out, key_out = regions(128)
    put_inputs(shm_in)
    assert register(srv, "in", key_in, 128).status_code == 200
    assert register(srv, "out", key_out, 128).status_code == 200
    post = lambda req: srv.post("/v2/models/simple/infer", json=req)
    assert_error(post(simple_request(in_region="ghost")), 400, "'ghost'", "INPUT0")
    assert_error(post(simple_request(out_region="ghost")), 400, "'ghost'", "OUTPUT0")
    assert_error(post(simple_request(b_off=100)), 400, "INPUT1", "past the end")
    # An output region too small for the output (64 bytes) fails the request, naming it.
    assert_error(post(simple_request(out_size=32)), 400, "OUTPUT0", "64", "32")
    req = simple_request()
    req["inputs"][0]["parameters"]["shared_memory_byte_size"] = 60
    assert_error(post(req), 400, "INPUT0")
    req = simple_request()
    req["inputs"][0]["data"] = [0] * 16
    assert_error(post(req), 400, "INPUT0", "only one")
    req = simple_request()
    del req["inputs"][1]["parameters"]["shared_memory_byte_size"]
    assert_error(post(req), 400, "INPUT1", "shared_memory_byte_size")
    req = simple_request()
    req["inputs"][1]["parameters"]["shared_memory_offset"] = -3
    assert_error(post(req), 400, "INPUT1", "shared_memory_offset")
    req = simple_request()
    req["outputs"][0]["parameters"]["binary_data"] = True
    assert_error(post(req), 400, "OUTPUT0", "binary_data")
    req = simple_request()
    req["outputs"][0]["parameters"]["classification"] = 2
    assert_error(post(req), 400, "OUTPUT0", "classification")
    assert srv.post("/v2/models/simple/infer", json=simple_request()).status_code == 200


def cuda_build(srv):
    """Whether the server binary has CUDA (its start-up line says "built without CUDA" when not)."""
    return "built without CUDA" not in srv.log()


def test_cuda_shared_memory_without_a_gpu(srv, regions, pb):
    # The real "no GPU" path: register is Triton's 400 for a handle cudaIpcOpenMemHandle cannot
    # open (with CUDA's reason), or "GPUs not supported" in a build without CUDA; status lists
    # no region and unregister succeeds, so perf_analyzer's --shared-memory teardown (which
    # always unregisters CUDA regions) ends cleanly.
    handle = {"b64": base64.b64encode(bytes(64)).decode()}
    r = srv.post("/v2/cudasharedmemory/region/c/register",
                 json={"raw_handle": handle, "device_id": 0, "byte_size": 8})
    if cuda_build(srv):
        why = "failed to register CUDA shared memory region 'c': failed to open CUDA IPC handle: " \
              "this server has no GPU ("
    else:
        why = "failed to register CUDA shared memory region: 'c', GPUs not supported"
    assert_error(r, 400, why)
    if cuda_build(srv):
        assert re.search(r"CUDA error (35|34)", r.json()["error"]), r.text
    for path in ("/v2/cudasharedmemory/unregister", "/v2/cudasharedmemory/region/c/unregister"):
        r = srv.post(path)
        assert r.status_code == 200, (path, r.status_code, r.text)
    r = srv.get("/v2/cudasharedmemory/status")
    assert r.status_code == 200 and r.json() == [], r.text
    assert_error(srv.get("/v2/cudasharedmemory/region/c/status"), 404,
                 "unable to find cuda shared memory region: 'c'")
    # Malformed bodies are 400s naming the field.
    p = "/v2/cudasharedmemory/region/c/register"
    assert_error(srv.post(p, json={"device_id": 0, "byte_size": 8}), 400, "'raw_handle'")
    assert_error(srv.post(p, json={"raw_handle": {"b64": "%%"}, "device_id": 0, "byte_size": 8}),
                 400, "base64")
    assert_error(srv.post(p, json={"raw_handle": handle, "byte_size": 8}), 400, "'device_id'")
    assert_error(srv.post(p, json={"raw_handle": handle, "device_id": 0}), 400, "'byte_size'")
    assert_error(srv.get(p), 405)

    # One name space with the system regions, as Triton's one manager: the clash is found
    # before any handle is opened, so it answers the same with or without a GPU.
    shm, key = regions(64)
    assert register(srv, "sys", key, 64).status_code == 200
    assert_error(srv.post("/v2/cudasharedmemory/region/sys/register",
                          json={"raw_handle": handle, "device_id": 0, "byte_size": 8}),
                 400, "shared memory region 'sys' already in manager")
    assert_error(srv.get("/v2/cudasharedmemory/region/sys/status"), 404,
                 "The region named 'sys' is registered as system shared memory, not CUDA "
                 "shared memory")
    assert srv.post("/v2/cudasharedmemory/region/sys/unregister").status_code == 200
    assert srv.post("/v2/cudasharedmemory/unregister").status_code == 200
    # The system region is untouched by CUDA unregisters.
    assert [x["name"] for x in srv.get("/v2/systemsharedmemory/status").json()] == ["sys"]

    import grpc
    pb2, pb2_grpc = pb
    stub = pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}"))
    with pytest.raises(grpc.RpcError) as e:
        stub.CudaSharedMemoryRegister(pb2.CudaSharedMemoryRegisterRequest(
            name="c", raw_handle=bytes(64), device_id=0, byte_size=8), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert why in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.CudaSharedMemoryRegister(pb2.CudaSharedMemoryRegisterRequest(
            name="sys", raw_handle=bytes(64), device_id=0, byte_size=8), timeout=10)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "shared memory region 'sys' already in manager" in e.value.details()
    stub.CudaSharedMemoryUnregister(pb2.CudaSharedMemoryUnregisterRequest(), timeout=10)
    stub.CudaSharedMemoryUnregister(pb2.CudaSharedMemoryUnregisterRequest(name="c"), timeout=10)
    assert len(stub.CudaSharedMemoryStatus(pb2.CudaSharedMemoryStatusRequest(), timeout=10).regions) == 0
    with pytest.raises(grpc.RpcError) as e:
        stub.CudaSharedMemoryStatus(pb2.CudaSharedMemoryStatusRequest(name="c"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        stub.CudaSharedMemoryStatus(pb2.CudaSharedMemoryStatusRequest(name="sys"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "registered as system shared memory" in e.value.details()
    md = stub.ServerMetadata(pb2.ServerMetadataRequest(), timeout=10)
    assert ("cuda_shared_memory" in md.extensions) == cuda_build(srv)
    assert [x["name"] for x in srv.get("/v2/systemsharedmemory/status").json()] == ["sys"]


def test_grpc_round_trip_and_errors(srv, regions, pb):
    import grpc
    pb2, pb2_grpc = pb
    stub = pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}"))
    shm_in, key_in = regions(128)
    shm_out, key_out = regions(128)
    a, b = put_inputs(shm_in, seed=3)
    stub.SystemSharedMemoryRegister(pb2.SystemSharedMemoryRegisterRequest(
        name="in", key=key_in, offset=0, byte_size=128), timeout=10)
    stub.SystemSharedMemoryRegister(pb2.SystemSharedMemoryRegisterRequest(
        name="out", key=key_out, offset=0, byte_size=128), timeout=10)
    st = stub.SystemSharedMemoryStatus(pb2.SystemSharedMemoryStatusRequest(), timeout=10)
    assert sorted(st.regions) == ["in", "out"]
    assert st.regions["in"].key == key_in and st.regions["in"].byte_size == 128

    def param(region, size, offset):
        return {"shared_memory_region": pb2.InferParameter(string_param=region),
                "shared_memory_byte_size": pb2.InferParameter(int64_param=size),
                "shared_memory_offset": pb2.InferParameter(int64_param=offset)}

    req = pb2.ModelInferRequest(model_name="simple")
    for name, off in (("INPUT0", 0), ("INPUT1", 64)):
        t = req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        for k, v in param("in", 64, off).items():
            t.parameters[k].CopyFrom(v)
    for name, off in (("OUTPUT0", 0), ("OUTPUT1", 64)):
        o = req.outputs.add(name=name)
        for k, v in param("out", 64, off).items():
            o.parameters[k].CopyFrom(v)
    resp = stub.ModelInfer(req, timeout=10)
    assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [len(c) for c in resp.raw_output_contents] == [0, 0]
    np.testing.assert_array_equal(np.frombuffer(bytes(shm_out.buf[0:64]), np.int32), a + b)
    np.testing.assert_array_equal(np.frombuffer(bytes(shm_out.buf[64:128]), np.int32), a - b)

    # One input in shared memory, one raw: the raw entries are the other inputs, in order.
    req2 = pb2.ModelInferRequest(model_name="simple")
    t = req2.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    for k, v in param("in", 64, 0).items():
        t.parameters[k].CopyFrom(v)
    req2.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    req2.raw_input_contents.append(b.tobytes())
    resp = stub.ModelInfer(req2, timeout=10)
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.int32), a + b)

    for bad, words in [
        (pb2.SystemSharedMemoryRegisterRequest(name="x", key="/inferd-none", byte_size=8), "/inferd-none"),
        (pb2.SystemSharedMemoryRegisterRequest(name="x", key=key_in, offset=64, byte_size=65), "past the end"),
    ]:
        with pytest.raises(grpc.RpcError) as e:
            stub.SystemSharedMemoryRegister(bad, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert words in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.SystemSharedMemoryRegister(
            pb2.SystemSharedMemoryRegisterRequest(name="in", key=key_in, byte_size=8), timeout=10)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS, e.value
    assert "shared memory region 'in' already in manager" in e.value.details()
    small = pb2.ModelInferRequest()
    small.CopyFrom(req)
    small.outputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(small, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "OUTPUT0" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.SystemSharedMemoryStatus(pb2.SystemSharedMemoryStatusRequest(name="ghost"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    stub.SystemSharedMemoryUnregister(pb2.SystemSharedMemoryUnregisterRequest(name="in"), timeout=10)
    st = stub.SystemSharedMemoryStatus(pb2.SystemSharedMemoryStatusRequest(), timeout=10)
    assert list(st.regions) == ["out"]
    stub.SystemSharedMemoryUnregister(pb2.SystemSharedMemoryUnregisterRequest(), timeout=10)
    assert srv.is_live()
