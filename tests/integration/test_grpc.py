"""The KServe v2 gRPC frontend, spoken with stubs generated at test time from the project's own
proto (grpc_tools.protoc). Every RPC is exercised; outputs are compared with numpy and with the
HTTP path; error codes are checked exactly."""

import concurrent.futures as futures
import subprocess
import sys

import grpc
import numpy as np
import pytest

from conftest import REPO_ROOT
from v2client import infer, make_input, parse_response


@pytest.fixture(scope="module")
def stub(server, pb):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    grpc.channel_ready_future(channel).result(timeout=10)
    yield pb[1].GRPCInferenceServiceStub(channel)
    channel.close()


def simple_request(pb, a, b, raw=True, version=""):
    m = pb[0]
    req = m.ModelInferRequest(model_name="simple", model_version=version, id="rq")
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        t = req.inputs.add(name=name, datatype="INT32", shape=list(arr.shape))
        if raw:
            req.raw_input_contents.append(arr.tobytes())
        else:
            t.contents.int_contents.extend(arr.reshape(-1).tolist())
    return req


def outputs(resp):
    return {o.name: np.frombuffer(resp.raw_output_contents[i], dtype=np.int32).reshape(o.shape)
            for i, o in enumerate(resp.outputs)}


def test_health_and_server_metadata(stub, pb):
    m = pb[0]
    assert stub.ServerLive(m.ServerLiveRequest()).live
    assert stub.ServerReady(m.ServerReadyRequest()).ready
    md = stub.ServerMetadata(m.ServerMetadataRequest())
    assert md.name == "triton"  # tritonserver's default --id, which its clients check
    assert {"binary_tensor_data", "statistics", "model_repository"} <= set(md.extensions)
    assert {"sequence", "parameters"} <= set(md.extensions)  # issue 26
    assert stub.ModelReady(m.ModelReadyRequest(name="simple")).ready
    assert stub.ModelReady(m.ModelReadyRequest(name="simple", version="1")).ready
    assert not stub.ModelReady(m.ModelReadyRequest(name="nope")).ready


def test_model_metadata_and_config(stub, pb):
    m = pb[0]
    md = stub.ModelMetadata(m.ModelMetadataRequest(name="simple"))
    assert md.name == "simple" and list(md.versions) == ["1"]
    assert md.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == \
        [("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    cfg = stub.ModelConfig(m.ModelConfigRequest(name="add_sub_autocomplete")).config
    assert cfg.max_batch_size == 4
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("INPUT0", [4]), ("INPUT1", [4])]
    assert cfg.input[0].data_type == 11  # TYPE_FP32


def test_infer_raw_and_typed_match_numpy_and_http(stub, pb, server):
    rng = np.random.default_rng(5)
    a = rng.integers(-100, 100, size=(3, 16), dtype=np.int32)
    b = rng.integers(-100, 100, size=(3, 16), dtype=np.int32)
    raw = stub.ModelInfer(simple_request(pb, a, b, raw=True))
    typed = stub.ModelInfer(simple_request(pb, a, b, raw=False))
    assert raw.model_name == "simple" and raw.model_version == "1" and raw.id == "rq"
    for resp in (raw, typed):
        out = outputs(resp)
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    http = infer(server, "simple", [make_input("INPUT0", a, "INT32", binary=True),
                                    make_input("INPUT1", b, "INT32", binary=True)])
    _, http_out = parse_response(http)
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_array_equal(outputs(raw)[name], http_out[name])


def test_fp16_only_through_raw_contents(stub, pb):
    m = pb[0]
    x = np.array([[1.5, -2.25, 65504.0]], dtype=np.float16)
    req = m.ModelInferRequest(model_name="onnx_identity_fp16")
    req.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 3])
    req.raw_input_contents.append(x.tobytes())
    resp = stub.ModelInfer(req)
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.float16), x.reshape(-1))
    bad = m.ModelInferRequest(model_name="onnx_identity_fp16")
    t = bad.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 1])
    t.contents.fp32_contents.append(1.0)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(bad)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents" in e.value.details()


def test_bytes_typed_contents(stub, pb):
    m = pb[0]
    req = m.ModelInferRequest(model_name="onnx_identity_bytes")
    t = req.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2])
    t.contents.bytes_contents.extend([b"hello", b"\x00\xff"])
    resp = stub.ModelInfer(req)
    raw = resp.raw_output_contents[0]
    assert raw == b"\x05\x00\x00\x00hello\x02\x00\x00\x00\x00\xff"


@pytest.mark.parametrize("mutate,code,text", [
    (lambda r: setattr(r, "model_name", "missing"), grpc.StatusCode.NOT_FOUND,
     "Request for unknown model: 'missing' is not found"),
    (lambda r: setattr(r, "model_version", "9"), grpc.StatusCode.NOT_FOUND,
     "Request for unknown model: 'simple' version 9 is not found"),
    (lambda r: setattr(r, "model_version", "x"), grpc.StatusCode.INVALID_ARGUMENT, "invalid model version"),
    (lambda r: r.inputs[0].shape.__setitem__(1, 15), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    (lambda r: setattr(r.inputs[0], "datatype", "FP32"), grpc.StatusCode.INVALID_ARGUMENT, "INPUT0"),
    (lambda r: r.raw_input_contents.pop(), grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents"),
    (lambda r: r.outputs.add(name="NOPE"), grpc.StatusCode.INVALID_ARGUMENT, "NOPE"),
])
def test_errors_have_the_right_codes(stub, pb, mutate, code, text):
    a = np.zeros((1, 16), dtype=np.int32)
    req = simple_request(pb, a, a)
    mutate(req)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req)
    assert e.value.code() == code, e.value.details()
    assert text in e.value.details()
    # The server keeps serving.
    assert stub.ServerLive(pb[0].ServerLiveRequest()).live


def test_stream_infer(stub, pb):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    reqs = []
    for i in range(10):
        r = simple_request(pb, a * i, a)
        r.id = f"s{i}"
        reqs.append(r)
    bad = simple_request(pb, a, a)
    bad.id = "bad"
    bad.model_name = "missing"
    reqs.insert(5, bad)
    got = {}
    for resp in stub.ModelStreamInfer(iter(reqs)):
        got[resp.infer_response.id] = resp
    assert set(got) == {f"s{i}" for i in range(10)} | {"bad"}
    assert got["bad"].error_message.startswith("Request for unknown model: 'missing' is not found")
    for i in range(10):
        r = got[f"s{i}"]
        assert r.error_message == ""
        np.testing.assert_array_equal(outputs(r.infer_response)["OUTPUT0"], a * i + a)


def test_statistics_and_repository_index(stub, pb):
    m = pb[0]
    before = stub.ModelStatistics(m.ModelStatisticsRequest(name="simple")).model_stats[0]
    a = np.ones((2, 16), dtype=np.int32)
    for _ in range(3):
        stub.ModelInfer(simple_request(pb, a, a))
    after = stub.ModelStatistics(m.ModelStatisticsRequest(name="simple", version="1")).model_stats[0]
    assert after.inference_stats.success.count - before.inference_stats.success.count == 3
    assert after.inference_count - before.inference_count == 6
    assert any(b.batch_size == 2 for b in after.batch_stats)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelStatistics(m.ModelStatisticsRequest(name="missing"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    idx = stub.RepositoryIndex(m.RepositoryIndexRequest(ready=True))
    assert ("simple", "1", "READY") in {(x.name, x.version, x.state) for x in idx.models}


def test_classification_over_grpc(stub, pb):
    m = pb[0]
    x = np.array([[0.1, 0.9, 0.3, 0.7, 0.2]], dtype=np.float32)
    req = m.ModelInferRequest(model_name="labelled")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 5])
    req.raw_input_contents.append(x.tobytes())
    out = req.outputs.add(name="OUTPUT0")
    out.parameters["classification"].int64_param = 2
    resp = stub.ModelInfer(req)
    assert resp.outputs[0].datatype == "BYTES" and list(resp.outputs[0].shape) == [1, 2]
    raw = resp.raw_output_contents[0]
    entries, pos = [], 0
    while pos < len(raw):
        n = int.from_bytes(raw[pos:pos + 4], "little")
        entries.append(raw[pos + 4:pos + 4 + n].decode())
        pos += 4 + n
    assert [e.split(":")[1] for e in entries] == ["1", "3"]
    assert entries[0].split(":")[2] == "dog"


def test_cuda_shared_memory_register_is_a_client_error(stub, pb):
    m = pb[0]
    # Every RPC is implemented (system and CUDA shared memory: test_shared_memory.py; trace and
    # logging: test_trace_logging.py). An empty CUDA register is Triton's INVALID_ARGUMENT with
    # its prefix, GPU or not.
    with pytest.raises(grpc.RpcError) as e:
        stub.CudaSharedMemoryRegister(m.CudaSharedMemoryRegisterRequest())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to register CUDA shared memory region" in e.value.details()


def test_load_unload_over_grpc(server_factory, make_repo, pb):
    m = pb[0]
    repo = make_repo({"simple": "simple"})
    srv = server_factory([repo], ["--model-control-mode=explicit"])
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    s = pb[1].GRPCInferenceServiceStub(channel)
    assert not s.ModelReady(m.ModelReadyRequest(name="simple")).ready
    s.RepositoryModelLoad(m.RepositoryModelLoadRequest(model_name="simple"))
    assert s.ModelReady(m.ModelReadyRequest(name="simple")).ready
    with pytest.raises(grpc.RpcError) as e:
        s.RepositoryModelLoad(m.RepositoryModelLoadRequest(model_name="absent"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert ("failed to load 'absent', failed to poll from model repository"
            in e.value.details()), e.value.details()
    s.RepositoryModelUnload(m.RepositoryModelUnloadRequest(model_name="simple"))
    assert not s.ModelReady(m.ModelReadyRequest(name="simple")).ready
    # As Triton: unloading a name that is not loaded (unknown, or unloaded already) is OK.
    s.RepositoryModelUnload(m.RepositoryModelUnloadRequest(model_name="absent"), timeout=30)
    s.RepositoryModelUnload(m.RepositoryModelUnloadRequest(model_name="simple"), timeout=30)
    channel.close()


def test_grpc_messages_are_not_bounded_by_the_http_limit(server_factory, make_repo, pb):
    """tritonserver's gRPC takes messages up to 2 GiB whatever --http-max-input-size says."""
    m = pb[0]
    repo = make_repo({"identity_fp32": "identity_fp32"})
    srv = server_factory([repo], ["--http-max-input-size=1048576"])
    srv.wait_until(lambda: srv.get("/v2/models/identity_fp32/ready").status_code == 200, 30,
                   "identity_fp32 ready")
    x = np.arange(1, 1 + 3 * 1024 * 1024 // 4, dtype=np.float32).reshape(1, -1)  # 3 MiB
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}",
                                    options=[("grpc.max_receive_message_length", -1),
                                             ("grpc.max_send_message_length", -1)])
    s = pb[1].GRPCInferenceServiceStub(channel)
    req = m.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    resp = s.ModelInfer(req, timeout=60)
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.float32), x.ravel())
    channel.close()
    # (The HTTP limit still holds for HTTP: test_errors.py::test_body_over_max_input_size. Not
    # checked here with `requests`: the server may answer 413 and close while the client is
    # still sending, which `requests` reports as a connection reset.)


def test_full_queue_is_unavailable(server_factory, make_repo, pb):
    repo = make_repo({"simple": "simple"})
    cfg = (repo / "simple" / "config.pbtxt").read_text()
    (repo / "simple" / "config.pbtxt").write_text(
        cfg + "\ndynamic_batching { max_queue_delay_microseconds: 3000000 "
              "default_queue_policy { max_queue_size: 2 } }\n")
    srv = server_factory([repo])
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    s = pb[1].GRPCInferenceServiceStub(channel)
    a = np.zeros((1, 16), dtype=np.int32)

    def call(_):
        try:
            s.ModelInfer(simple_request(pb, a, a))
            return "OK"
        except grpc.RpcError as e:
            return (e.code(), e.details())

    with futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(call, range(3)))
    assert results.count("OK") == 2, results
    refused = [r for r in results if r != "OK"][0]
    assert refused[0] == grpc.StatusCode.UNAVAILABLE and "max_queue_size" in refused[1]
    channel.close()


def health_check(port, metadata=None, service=""):
    """grpc.health.v1.Health/Check spoken on the wire, without stubs: the request is
    HealthCheckRequest{service} (field 1, a string), the answer HealthCheckResponse{status}
    (field 1, an enum: 1 SERVING, 2 NOT_SERVING; proto3 leaves 0 UNKNOWN out)."""
    svc = service.encode()
    request = (b"\x0a" + bytes([len(svc)]) + svc) if svc else b""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        answer = check(request, metadata=metadata, timeout=30)
    assert answer in (b"", b"\x08\x01", b"\x08\x02"), answer
    return {b"": "UNKNOWN", b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}[answer]


def test_grpc_health_check_says_whether_the_server_is_ready(server, server_factory, make_repo, pb):
    """tritonserver serves the standard grpc.health.v1 Check beside GRPCInferenceService
    (SERVING when ready, whatever `service` names); Kubernetes `grpc` probes and
    grpc_health_probe use it. Watch it does not serve."""
    assert health_check(server.grpc_port) == "SERVING"
    assert health_check(server.grpc_port, service="inference.GRPCInferenceService") == "SERVING"
    # Not ready: a model failed to load (strict readiness, the default).
    repo = make_repo({"broken_config": "broken_config", "simple": "simple"})
    srv = server_factory(repo, ["--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 60,
                   "simple to be ready")
    assert srv.get("/v2/health/ready").status_code != 200
    assert health_check(srv.grpc_port) == "NOT_SERVING"
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as e:
            list(watch(b"", timeout=30))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # Under the `health` category of --grpc-restricted-protocol, as tritonserver.
    srv = server_factory(make_repo({"simple": "simple"}),
                         ["--grpc-restricted-protocol=health:probe-key=k1"])
    with pytest.raises(grpc.RpcError) as e:
        health_check(srv.grpc_port)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "probe-key" in e.value.details()
    assert health_check(srv.grpc_port, metadata=[("probe-key", "k1")]) == "SERVING"
