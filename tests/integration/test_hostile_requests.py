"""Requests built to crash the server: deeply nested JSON where only scalars belong (issue 27).

A request parameter is a bool, an integer, a double or a string (Triton, and gRPC's
InferParameter by construction). An object or array is refused with 400 before anything walks
it, so 87,500 levels of nesting (858 bytes gzipped) cannot overflow the stack.
"""

import gzip
import json

import pytest

from test_sagemaker import start

DEPTH = 87_500
INPUTS = [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
          {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]


def nested_body(where="request"):
    """The infer body with a value nested DEPTH levels deep (text built, not json.dumps, which
    would recurse itself)."""
    deep = '{"a":' * DEPTH + "1" + "}" * DEPTH
    inputs = json.dumps(INPUTS)
    if where == "request":
        return '{"parameters":{"p":' + deep + '},"inputs":' + inputs + "}"
    if where == "array":
        return '{"parameters":{"p":' + "[" * DEPTH + "]" * DEPTH + '},"inputs":' + inputs + "}"
    if where == "input":
        first = json.dumps(INPUTS[0])[:-1] + ',"parameters":{"p":' + deep + "}}"
        return '{"inputs":[' + first + "," + json.dumps(INPUTS[1]) + "]}"
    assert where == "output"
    return ('{"inputs":' + inputs + ',"outputs":[{"name":"OUTPUT0","parameters":{"p":' + deep +
            "}}]}")


@pytest.mark.parametrize("where", ["request", "array", "input", "output"])
@pytest.mark.parametrize("gzipped", [False, True])
def test_nested_parameters_are_refused_over_http(server, where, gzipped):
    body = nested_body(where).encode()
    headers = {"Content-Type": "application/json"}
    if gzipped:
        body = gzip.compress(body, 9)
        assert len(body) < 4096
        headers["Content-Encoding"] = "gzip"
    r = server.post("/v2/models/simple/infer", data=body, headers=headers)
    assert r.status_code == 400, r.text
    assert "parameter 'p' has invalid type" in r.json()["error"]
    assert server.proc.poll() is None
    # And the server still answers.
    r = server.post("/v2/models/simple/infer", json={"inputs": INPUTS})
    assert r.status_code == 200, r.text


def test_scalar_parameters_still_pass(server):
    r = server.post("/v2/models/simple/infer",
                    json={"parameters": {"s": "x", "i": -3, "d": 1.5, "b": True}, "inputs": INPUTS})
    assert r.status_code == 200, r.text
    r = server.post("/v2/models/simple/infer", json={"parameters": {"n": None}, "inputs": INPUTS})
    assert r.status_code == 400 and "parameter 'n' has invalid type" in r.json()["error"]


def test_nested_parameters_are_refused_over_sagemaker(server_factory, make_repo):
    sm = start(server_factory, make_repo({"simple": "simple"}))
    for where in ("request", "array", "input"):
        r = sm.post("/invocations", data=nested_body(where).encode(),
                    headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert "parameter 'p' has invalid type" in r.json()["error"]
    assert sm.srv.proc.poll() is None
    r = sm.post("/invocations", data=json.dumps({"inputs": INPUTS}),
                headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_nested_generate_body_is_refused(server):
    """generate's own body: a non-input member is a parameter, scalars only."""
    deep = '{"a":' * DEPTH + "1" + "}" * DEPTH
    body = '{"INPUT0":' + json.dumps(list(range(16))) + ',"INPUT1":' + json.dumps([1] * 16) + \
        ',"p":' + deep + "}"
    r = server.post("/v2/models/simple/generate", data=body,
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert server.proc.poll() is None


@pytest.mark.parametrize("route", ["/v2/repository/index", "/v2/repository/models/simple/load",
                                   "/v2/trace/setting", "/v2/logging",
                                   "/v2/systemsharedmemory/region/r/register"])
def test_nested_json_on_other_routes(server, route):
    """Every other route that reads a JSON body: a deep body is answered, never a crash."""
    deep = '{"parameters":' * DEPTH + "1" + "}" * DEPTH
    r = server.post(route, data=deep, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (route, r.status_code, r.text)
    assert server.proc.poll() is None
    assert server.get("/v2/health/live").status_code == 200


def test_nested_config_on_the_load_api(server_factory, make_repo):
    """The load API's `config` is JSON too: protobuf's parser limits its depth (100)."""
    srv = server_factory(make_repo({"simple": "simple"}), ["--model-control-mode=explicit"])
    deep = '{"name":"simple","parameters":{"k":' + '{"a":' * DEPTH + "1" + "}" * DEPTH + "}}"
    r = srv.post("/v2/repository/models/simple/load", json={"parameters": {"config": deep}})
    assert r.status_code == 400, r.text
    assert srv.proc.poll() is None
    assert srv.post("/v2/repository/models/simple/load", json={}).status_code == 200
