"""Residency behind the server facade (server/model_resolver.h): a request for a model that must
load first waits within its own limits, whichever frontend it came through. The request's
`timeout` and the client's deadline end the wait over HTTP, gRPC and SageMaker alike, with the
same DEADLINE_EXCEEDED (504) naming the load, and the load goes on for the requests after it.
Also the request parameters the protocols share (core/request_parameters.h)."""

import time

import grpc
import numpy as np
import pytest

from test_cancellation import (body_with, grpc_request, grpc_stub, post_infer, slow_loading_model,
                               slow_model, stats, wait_loaded)
from test_sagemaker import start as start_sagemaker


def test_grpc_timeout_parameter_ends_the_load_wait(server_factory, tmp_path, pb):
    srv = server_factory([slow_loading_model(tmp_path)], ["--model-control-mode=on-demand"])
    _, stub = grpc_stub(srv, pb)
    req = grpc_request(pb, "lazy")
    req.parameters["timeout"].int64_param = 300000
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=60)
    waited = time.monotonic() - t0
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
    msg = e.value.details()
    assert "request for model 'lazy' timed out" in msg, msg
    assert "timeout 300000 us, waiting for the model to load" in msg, msg
    assert waited < 1.5, f"answered after {waited:.2f}s; the load takes 2 s"
    wait_loaded(srv)  # the load went on
    assert stats(srv, "lazy")["inference_count"] == 0
    ok = stub.ModelInfer(grpc_request(pb, "lazy"), timeout=60)
    assert np.frombuffer(ok.raw_output_contents[0], dtype=np.float32).tolist() == [0, 1, 2, 3]


def test_grpc_deadline_ends_the_load_wait_and_the_request_never_runs(server_factory, tmp_path, pb):
    srv = server_factory([slow_loading_model(tmp_path)], ["--model-control-mode=on-demand"])
    _, stub = grpc_stub(srv, pb)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(grpc_request(pb, "lazy"), timeout=0.4)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
    wait_loaded(srv)
    # The waiting request left the wait at its deadline: it never reached the model.
    s = stats(srv, "lazy")
    assert s["inference_count"] == 0 and s["inference_stats"]["fail"]["count"] == 0, s


def test_sagemaker_invoke_timeout_bounds_the_load_wait(server_factory, tmp_path):
    # The multi-model invoke waited for the load without the request's limits, then counted its
    # `timeout` from after the load: the same request over /v2 got 504 at once.
    sm = start_sagemaker(server_factory, [slow_loading_model(tmp_path)],
                         "--model-control-mode=on-demand")
    t0 = time.monotonic()
    r = sm.post("/models/lazy/invoke", data=body_with({"timeout": 300000}),
                headers={"Content-Type": "application/json"})
    waited = time.monotonic() - t0
    assert r.status_code == 504, r.text
    msg = r.json()["error"]
    assert "request for model 'lazy' timed out" in msg, msg
    assert "timeout 300000 us, waiting for the model to load" in msg, msg
    assert waited < 1.5, f"answered after {waited:.2f}s; the load takes 2 s"
    wait_loaded(sm.srv)
    r = sm.post("/models/lazy/invoke", data=body_with({}),
                headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_http_and_grpc_give_one_answer_for_a_load_that_outlives_the_timeout(
        server_factory, tmp_path, pb):
    srv = server_factory([slow_loading_model(tmp_path, load_s=3)],
                         ["--model-control-mode=on-demand"])
    r = post_infer(srv, "lazy", body=body_with({"timeout": 200000}))
    assert r.status_code == 504, r.text
    _, stub = grpc_stub(srv, pb)
    req = grpc_request(pb, "lazy")
    req.parameters["timeout"].uint64_param = 200000
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=60)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    http_msg, grpc_msg = r.json()["error"], e.value.details()
    strip = lambda m: m.split(" timed out: waited ")[0] + m.split(" ms ")[1]  # noqa: E731
    assert strip(http_msg) == strip(grpc_msg), (http_msg, grpc_msg)


def test_grpc_priority_above_32_bits_is_refused_not_truncated(server_factory, tmp_path, pb):
    srv = server_factory([slow_model(tmp_path, name="fast", delay_ms=0)])
    _, stub = grpc_stub(srv, pb)
    req = grpc_request(pb, "fast")
    req.parameters["priority"].uint64_param = (1 << 32) + 1
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert e.value.details() == "parameter 'priority' must be a non-negative integer"
    req.parameters["priority"].uint64_param = 1
    stub.ModelInfer(req, timeout=60)
