"""The malformed-input suite: well over a hundred distinct bad requests over raw HTTP sockets
and gRPC. Each is answered with its exact 4xx status (or gRPC code) and a message naming what
was wrong; the server answers correctly afterwards. Slow, idle and surplus connections are
covered at the end with their own servers."""

import json
import socket
import struct
import time

import grpc
import numpy as np
import pytest
import requests

from test_grpc import simple_request
from v2client import infer, make_input, parse_response

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def good_answer(server, fresh_connection=False):
    # fresh_connection: with a short idle timeout the server may close a pooled keep-alive
    # connection just as the client reuses it (the usual keep-alive race, which clients
    # resolve by retrying); a new connection avoids it.
    session = requests.Session() if fresh_connection else None
    r = infer(server, "simple", [make_input("INPUT0", A, "INT32"), make_input("INPUT1", B, "INT32")],
              session=session)
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], A + B)


def raw_http(port, data, timeout=10.0):
    """Sends raw bytes; returns (status, body) of the first response, or (None, b"") when the
    server closed the connection without answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        buf = b""
        while b"\r\n\r\n" not in buf:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None, buf
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while len(body) < length:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            body += chunk
        return status, body[:length]


def post(path, body, headers=()):
    if isinstance(body, str):
        body = body.encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode() + b"\r\n" + body


def infer_json(doc, model="simple", extra_headers=()):
    body = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    return post(f"/v2/models/{model}/infer", body,
                [("Content-Type", "application/json"), *extra_headers])


def inputs(**override):
    ins = [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()},
           {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.ravel().tolist()}]
    for k, v in override.items():
        ins[int(k[-1])].update(v)
    return ins


GOOD = json.dumps({"inputs": inputs()})
BIN_HEADER = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}}]})


def binary(header, payload, header_len=None):
    h = header.encode()
    n = len(h) if header_len is None else header_len
    return post("/v2/models/simple/infer", h + payload,
                [("Inference-Header-Content-Length", str(n))])


# (id, raw request bytes, expected status, substring the error must contain)
HTTP_CASES = [
    # ---- the request line and headers
    ("garbage-request-line", b"GARBAGE\r\n\r\n", 400, "malformed request line"),
    ("no-target", b"GET  HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    ("http2-version", b"GET /v2 HTTP/2.0\r\n\r\n", 505, "HTTP/1.0 and HTTP/1.1"),
    ("http09-version", b"GET /v2 HTTP/0.9\r\n\r\n", 505, "HTTP/1.0 and HTTP/1.1"),
    ("bad-method-chars", b"G(T /v2 HTTP/1.1\r\n\r\n", 400, "malformed request method"),
    ("relative-target", b"GET v2/health/live HTTP/1.1\r\n\r\n", 400, "absolute path"),
    ("control-char-in-target", b"GET /v2/\x01 HTTP/1.1\r\n\r\n", 400, "control character"),
    ("header-without-colon", b"GET /v2 HTTP/1.1\r\nHost x\r\n\r\n", 400, "malformed header line"),
    ("header-empty-name", b"GET /v2 HTTP/1.1\r\n: x\r\n\r\n", 400, "malformed header line"),
    ("header-bad-name", b"GET /v2 HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "malformed header name"),
    ("header-control-char", b"GET /v2 HTTP/1.1\r\nX-A: a\x00b\r\n\r\n", 400, "control character"),
    ("content-length-letters", b"POST /v2 HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400, "Content-Length"),
    ("content-length-negative", b"POST /v2 HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, "Content-Length"),
    ("content-length-overflow", b"POST /v2 HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
     400, "Content-Length"),
    ("content-length-conflict", b"POST /v2 HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
     400, "conflicting Content-Length"),
    ("length-and-chunked", b"POST /v2 HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
     400, "both Content-Length and chunked"),
    ("transfer-encoding-gzip", b"POST /v2 HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "gzip"),
    ("chunk-size-not-hex", b"POST /v2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunk size"),
    ("chunk-without-crlf", b"POST /v2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n",
     400, "CRLF"),
    ("chunk-size-line-endless", b"POST /v2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000,
     400, "chunk size"),
    ("headers-too-large", b"GET /v2 HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431, "request headers exceed"),
    ("body-too-large", b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 900000000\r\n\r\n",
     413, "exceeds"),
    # ---- routing
    ("unknown-endpoint", b"GET /v3/anything HTTP/1.1\r\n\r\n", 404, "/v3/anything"),
    ("infer-with-get", b"GET /v2/models/simple/infer HTTP/1.1\r\n\r\n", 405, "use POST"),
    ("health-with-post", post("/v2/health/live", ""), 405, "use GET"),
    ("unknown-model", infer_json(GOOD, model="nosuch"), 404, "nosuch"),
    ("model-name-dotdot", infer_json(GOOD, model=".."), 400, "invalid model name '..': it is a path part"),
    ("model-name-encoded-dotdot", infer_json(GOOD, model="%2e%2e"), 400, "invalid model name '..'"),
    ("model-name-with-slash-encoded", infer_json(GOOD, model="a%2Fb"), 400,
     "invalid model name 'a/b': it contains a path separator"),
    ("model-name-backslash", infer_json(GOOD, model="a%5Cb"), 400, "path separator"),
    ("model-name-control-char", infer_json(GOOD, model="a%01b"), 400, "control character"),
    ("model-name-bad-escape", infer_json(GOOD, model="a%zz"), 400, "percent"),
    ("model-name-invalid-utf8", infer_json(GOOD, model="%ff%fe"), 400, "not valid UTF-8"),
    ("metadata-dotdot", b"GET /v2/models/%2e%2e HTTP/1.1\r\n\r\n", 400, "invalid model name"),
    ("version-not-a-number", post("/v2/models/simple/versions/abc/infer", GOOD), 400, "abc"),
    ("version-negative", post("/v2/models/simple/versions/-1/infer", GOOD), 400, "-1"),
    ("version-overflow", post("/v2/models/simple/versions/99999999999999999999/infer", GOOD),
     400, "99999999999999999999"),
    ("version-unknown", post("/v2/models/simple/versions/42/infer", GOOD), 404, "42"),
    ("metadata-unknown-model", b"GET /v2/models/nosuch HTTP/1.1\r\n\r\n", 404, "nosuch"),
    ("config-unknown-model", b"GET /v2/models/nosuch/config HTTP/1.1\r\n\r\n", 404, "nosuch"),
    ("stats-unknown-model", b"GET /v2/models/nosuch/stats HTTP/1.1\r\n\r\n", 404, "nosuch"),
    ("repo-load-dotdot", post("/v2/repository/models/%2e%2e/load", "{}"), 400, "invalid model name '..'"),
    ("repo-unload-slash", post("/v2/repository/models/a%2fb/unload", "{}"), 400, "path separator"),
    ("repo-load-bad-json", post("/v2/repository/models/simple/load", "{oops"), 400, "JSON"),
    ("repo-index-bad-json", post("/v2/repository/index", "[1,"), 400, "JSON"),
    # ---- the JSON body
    ("empty-body", infer_json(b""), 400, "malformed JSON"),
    ("not-json", infer_json(b"hello"), 400, "malformed JSON"),
    ("json-array", infer_json(b"[1,2]"), 400, "JSON object"),
    ("json-string", infer_json(b'"inputs"'), 400, "JSON object"),
    ("json-trailing-garbage", infer_json(GOOD + "}"), 400, "malformed JSON"),
    ("json-nul-inside", infer_json(GOOD[:10] + "\x00" + GOOD[10:]), 400, "malformed JSON"),
    ("json-invalid-utf8-string", infer_json(b'{"id":"\xff\xfe","inputs":[]}'), 400, "Invalid encoding"),
    ("json-deep-nesting", infer_json(b"[" * 100000), 400, "malformed JSON"),
    ("json-deep-object-nesting", infer_json(b'{"a":' * 50000), 400, "malformed JSON"),
    ("json-deep-data", infer_json('{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":'
                                  + "[" * 5000 + "1" + "]" * 5000 + "}]}"), 400, "nest"),
    ("no-inputs", infer_json({"id": "x"}), 400, "'inputs' array"),
    ("inputs-object", infer_json({"inputs": {}}), 400, "'inputs' array"),
    ("inputs-empty", infer_json({"inputs": []}), 400, "INPUT0"),
    ("input-not-object", infer_json({"inputs": [1, 2]}), 400, "object"),
    ("input-without-name", infer_json({"inputs": [{"shape": [1], "datatype": "INT32", "data": [1]}]}),
     400, "no 'name'"),
    ("input-name-number", infer_json({"inputs": inputs(in0={"name": 5})}), 400, "name"),
    ("input-name-empty", infer_json({"inputs": inputs(in0={"name": ""})}), 400, "INPUT0"),
    ("input-name-unknown", infer_json({"inputs": inputs(in0={"name": "BOGUS"})}), 400, "BOGUS"),
    ("input-name-invalid-utf8", infer_json(GOOD.replace('"INPUT0"', '"IN\\udcffPUT0"')), 400, ""),
    ("duplicate-input", infer_json({"inputs": inputs() + inputs()[:1]}), 400, "INPUT0"),
    ("missing-input", infer_json({"inputs": inputs()[1:]}), 400, "INPUT0"),
    ("extra-input", infer_json({"inputs": inputs() + [{"name": "X", "shape": [1], "datatype": "INT32",
                                                       "data": [1]}]}), 400, "X"),
    ("no-datatype", infer_json({"inputs": [{"name": "INPUT0", "shape": [1, 16], "data": [0] * 16}]}),
     400, "datatype"),
    ("datatype-number", infer_json({"inputs": inputs(in0={"datatype": 7})}), 400, "datatype"),
    ("datatype-unknown", infer_json({"inputs": inputs(in0={"datatype": "FLOAT"})}), 400, "FLOAT"),
    ("datatype-lowercase", infer_json({"inputs": inputs(in0={"datatype": "int32"})}), 400, "int32"),
    ("datatype-wrong", infer_json({"inputs": inputs(in0={"datatype": "FP32"})}), 400, "INPUT0"),
    ("no-shape", infer_json({"inputs": [{"name": "INPUT0", "datatype": "INT32", "data": [0] * 16}]}),
     400, "shape"),
    ("shape-not-array", infer_json({"inputs": inputs(in0={"shape": 16})}), 400, "shape"),
    ("shape-string-dim", infer_json({"inputs": inputs(in0={"shape": [1, "16"]})}), 400, "shape"),
    ("shape-float-dim", infer_json({"inputs": inputs(in0={"shape": [1, 16.5]})}), 400, "shape"),
    ("shape-negative", infer_json({"inputs": inputs(in0={"shape": [1, -16]})}), 400, "non-negative"),
    ("shape-overflow", infer_json({"inputs": inputs(in0={"shape": [4611686018427387904, 4]})}),
     400, "too many elements"),
    ("shape-product-overflow", infer_json({"inputs": inputs(in0={"shape": [2**40, 2**40]})}),
     400, "too many elements"),
    ("shape-huge-dim", infer_json({"inputs": inputs(in0={"shape": [1, 2**70]})}), 400, "shape"),
    ("shape-wrong-for-model", infer_json({"inputs": inputs(in0={"shape": [1, 15], "data": [0] * 15})}),
     400, "INPUT0"),
    ("shape-zero-batch", infer_json({"inputs": inputs(in0={"shape": [0, 16], "data": []},
                                                      in1={"shape": [0, 16], "data": []})}), 400, ""),
    ("batch-too-large", infer_json({"inputs": inputs(in0={"shape": [9, 16], "data": [0] * 144},
                                                     in1={"shape": [9, 16], "data": [0] * 144})}),
     400, "batch"),
    ("batch-mismatch", infer_json({"inputs": inputs(in0={"shape": [2, 16], "data": [0] * 32})}),
     400, "batch"),
    ("data-too-short", infer_json({"inputs": inputs(in0={"data": [0] * 15})}), 400, "INPUT0"),
    ("data-too-long", infer_json({"inputs": inputs(in0={"data": [0] * 17})}), 400, "INPUT0"),
    ("data-not-array", infer_json({"inputs": inputs(in0={"data": 5})}), 400, "INPUT0"),
    ("data-strings", infer_json({"inputs": inputs(in0={"data": ["1"] * 16})}), 400, "INPUT0"),
    ("data-null", infer_json({"inputs": inputs(in0={"data": [None] * 16})}), 400, "INPUT0"),
    ("data-bool-for-int", infer_json({"inputs": inputs(in0={"data": [True] * 16})}), 400, "INPUT0"),
    ("data-float-for-int", infer_json({"inputs": inputs(in0={"data": [0.5] * 16})}), 400, "not an integer"),
    ("data-nan-for-int", infer_json(GOOD.replace("[0, 1, 2,", "[NaN, 1, 2,")), 400, "INPUT0"),
    ("data-infinity-for-int", infer_json(GOOD.replace("[0, 1, 2,", "[-Infinity, 1, 2,")), 400, "INPUT0"),
    ("data-int-overflow", infer_json({"inputs": inputs(in0={"data": [2**31] + [0] * 15})}),
     400, "out of range"),
    ("data-int64-overflow", infer_json({"inputs": inputs(in0={"data": [2**64] + [0] * 15})}), 400, "INPUT0"),
    ("data-ragged-nesting", infer_json({"inputs": inputs(in0={"data": [[0] * 8, [0] * 7]})}), 400, "INPUT0"),
    ("data-object", infer_json({"inputs": inputs(in0={"data": [{"a": 1}] * 16})}), 400, "INPUT0"),
    ("data-number-too-big", infer_json(GOOD.replace("[0, 1, 2,", "[1e999, 1, 2,")), 400, "malformed JSON"),
    ("id-number", infer_json({"id": 5, "inputs": inputs()}), 400, "'id' must be a string"),
    ("parameters-array", infer_json({"parameters": [], "inputs": inputs()}), 400, "'parameters'"),
    ("priority-negative", infer_json({"parameters": {"priority": -1}, "inputs": inputs()}), 400, "priority"),
    ("priority-string", infer_json({"parameters": {"priority": "high"}, "inputs": inputs()}), 400, "priority"),
    ("timeout-string", infer_json({"parameters": {"timeout": "1s"}, "inputs": inputs()}), 400, "timeout"),
    ("binary-output-not-bool", infer_json({"parameters": {"binary_data_output": "yes"}, "inputs": inputs()}),
     400, "binary_data_output"),
    ("outputs-object", infer_json({"inputs": inputs(), "outputs": {}}), 400, "outputs"),
    ("output-without-name", infer_json({"inputs": inputs(), "outputs": [{}]}), 400, "name"),
    ("output-unknown", infer_json({"inputs": inputs(), "outputs": [{"name": "NOPE"}]}), 400, "NOPE"),
    ("output-classification-negative", infer_json({"inputs": inputs(), "outputs": [
        {"name": "OUTPUT0", "parameters": {"classification": -3}}]}), 400, "classification"),
    ("output-classification-string", infer_json({"inputs": inputs(), "outputs": [
        {"name": "OUTPUT0", "parameters": {"classification": "3"}}]}), 400, "classification"),
    # ---- the binary tensor extension
    ("binary-size-past-end", binary(BIN_HEADER, b"\0" * 64), 400, ""),
    ("binary-size-short", binary(BIN_HEADER.replace("64}", "60}", 1), b"\0" * 124), 400, "INPUT0"),
    ("binary-size-negative", binary(BIN_HEADER.replace("64}", "-64}", 1), b"\0" * 128), 400, "binary_data_size"),
    ("binary-size-string", binary(BIN_HEADER.replace("64}", '"64"}', 1), b"\0" * 128), 400, "binary_data_size"),
    ("binary-size-huge", binary(BIN_HEADER.replace("64}", "18446744073709551615}", 1), b"\0" * 128), 400, ""),
    ("binary-unclaimed-bytes", binary(BIN_HEADER, b"\0" * 200), 400, "bytes"),
    ("binary-with-data-too", binary(BIN_HEADER.replace('"parameters"', '"data": [1], "parameters"', 1),
                                    b"\0" * 128), 400, "INPUT0"),
    ("header-length-past-body", binary(BIN_HEADER, b"\0" * 128, header_len=100000), 400,
     "Inference-Header-Content-Length"),
    ("header-length-letters", post("/v2/models/simple/infer", GOOD,
                                   [("Inference-Header-Content-Length", "abc")]), 400,
     "Inference-Header-Content-Length"),
    ("header-length-negative", post("/v2/models/simple/infer", GOOD,
                                    [("Inference-Header-Content-Length", "-1")]), 400,
     "Inference-Header-Content-Length"),
    ("header-length-cuts-json", binary(BIN_HEADER, b"\0" * 128, header_len=20), 400, "malformed JSON"),
    ("bytes-length-past-end", post("/v2/models/onnx_identity_bytes/infer",
                                   json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES",
                                                           "parameters": {"binary_data_size": 8}}]}).encode()
                                   + struct.pack("<I", 100) + b"abcd",
                                   [("Inference-Header-Content-Length",
                                     str(len(json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1],
                                                                     "datatype": "BYTES",
                                                                     "parameters": {"binary_data_size": 8}}]}))))]),
     400, "INPUT0"),
    ("raw-body-two-inputs", post("/v2/models/simple/infer", b"\0" * 64,
                                 [("Inference-Header-Content-Length", "0")]), 400, "exactly one input"),
]


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    assert server.proc.poll() is None, f"server died:\n{server.log()}"
    good_answer(server)


def test_there_are_over_a_hundred_cases():
    assert len({c[0] for c in HTTP_CASES}) == len(HTTP_CASES)
    assert len(HTTP_CASES) + len(GRPC_CASES) + len(SAGEMAKER_CASES) >= 100


@pytest.mark.parametrize("name,raw,status,text", HTTP_CASES, ids=[c[0] for c in HTTP_CASES])
def test_http_case(server, name, raw, status, text):
    got, body = raw_http(server.port, raw)
    assert got == status, f"{name}: expected {status}, got {got}: {body[:300]!r}"
    err = json.loads(body)["error"]
    assert isinstance(err, str) and err.strip()
    assert text in err, f"{name}: error {err!r} does not mention {text!r}"


def _set_version(v):
    return lambda r: setattr(r, "model_version", v)


GRPC_CASES = [
    ("unknown-model", lambda r: setattr(r, "model_name", "nosuch"), "NOT_FOUND", "nosuch"),
    ("empty-model-name", lambda r: setattr(r, "model_name", ""), "INVALID_ARGUMENT", "the model name is empty"),
    ("dotdot-model-name", lambda r: setattr(r, "model_name", ".."), "INVALID_ARGUMENT", "path part"),
    ("slash-model-name", lambda r: setattr(r, "model_name", "../simple"), "INVALID_ARGUMENT", "path separator"),
    ("version-letters", _set_version("x"), "INVALID_ARGUMENT", "version"),
    ("version-negative", _set_version("-1"), "INVALID_ARGUMENT", "version"),
    ("version-unknown", _set_version("9"), "NOT_FOUND", "9"),
    ("shape-wrong", lambda r: r.inputs[0].shape.__setitem__(1, 15), "INVALID_ARGUMENT", "INPUT0"),
    ("shape-negative", lambda r: r.inputs[0].shape.__setitem__(1, -16), "INVALID_ARGUMENT", "INPUT0"),
    ("shape-overflow", lambda r: r.inputs[0].shape.extend([2**40, 2**40]), "INVALID_ARGUMENT", "INPUT0"),
    ("datatype-wrong", lambda r: setattr(r.inputs[0], "datatype", "FP32"), "INVALID_ARGUMENT", "INPUT0"),
    ("datatype-unknown", lambda r: setattr(r.inputs[0], "datatype", "FLOAT"), "INVALID_ARGUMENT", "FLOAT"),
    ("raw-missing", lambda r: r.raw_input_contents.pop(), "INVALID_ARGUMENT", "raw_input_contents"),
    ("raw-extra", lambda r: r.raw_input_contents.append(b"\0" * 64), "INVALID_ARGUMENT", "raw_input_contents"),
    ("raw-short", lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 60), "INVALID_ARGUMENT", "INPUT0"),
    ("raw-long", lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 68), "INVALID_ARGUMENT", "INPUT0"),
    ("duplicate-input", lambda r: (r.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16]),
                                   r.raw_input_contents.append(b"\0" * 64)),
     "INVALID_ARGUMENT", "INPUT0"),
    ("unknown-input", lambda r: setattr(r.inputs[0], "name", "BOGUS"), "INVALID_ARGUMENT", "BOGUS"),
    ("unknown-output", lambda r: r.outputs.add(name="NOPE"), "INVALID_ARGUMENT", "NOPE"),
    ("batch-too-large", lambda r: (r.inputs[0].shape.__setitem__(0, 9), r.inputs[1].shape.__setitem__(0, 9),
                                   r.raw_input_contents.__setitem__(0, b"\0" * 576),
                                   r.raw_input_contents.__setitem__(1, b"\0" * 576)),
     "INVALID_ARGUMENT", "batch"),
]


@pytest.mark.parametrize("name,mutate,code,text", GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_grpc_case(server, pb, name, mutate, code, text):  # noqa: F811
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        stub = pb[1].GRPCInferenceServiceStub(channel)
        req = simple_request(pb, A, B)
        mutate(req)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=10)
        assert e.value.code().name == code, f"{name}: {e.value.code()} {e.value.details()}"
        assert text in e.value.details(), f"{name}: {e.value.details()!r} does not mention {text!r}"
    finally:
        channel.close()


# ---- connections ----------------------------------------------------------------------------


def test_slow_client_gets_408_and_others_are_served(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--http-request-timeout-secs=2"])
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    request = infer_json(GOOD)
    start = time.monotonic()
    sent = 0
    status = None
    # One byte every 0.25 s: the request cannot arrive whole within 2 s.
    while time.monotonic() - start < 8:
        try:
            s.sendall(request[sent:sent + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 1
        s.settimeout(0.25)
        try:
            data = s.recv(4096)
        except socket.timeout:
            good_answer(srv)  # everyone else is served meanwhile
            continue
        status = int(data.split(b" ", 2)[1]) if data else None
        assert b"did not arrive whole within 2 seconds" in data, data
        break
    s.close()
    assert status == 408, f"no 408 after {time.monotonic() - start:.1f}s ({sent} bytes sent)"
    assert 1.5 < time.monotonic() - start < 5
    good_answer(srv)


def test_idle_connections_are_closed_after_the_idle_timeout(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--http-idle-timeout-secs=1"])
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    start = time.monotonic()
    assert s.recv(1) == b""  # the server closed it
    assert 0.9 < time.monotonic() - start < 4
    s.close()
    good_answer(srv, fresh_connection=True)


def test_thousands_of_idle_connections_and_a_connection_cap(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--http-max-connections=1500", "--http-thread-count=2"])
    idle = []
    try:
        for _ in range(1500):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
        # Let the server accept them all, then the next one is turned away with 503.
        time.sleep(0.5)
        status, body = raw_http(srv.port, b"GET /v2/health/live HTTP/1.1\r\n\r\n")
        assert status == 503 and b"too many connections" in body, (status, body)
        # Closing idle connections frees room at once.
        for s in idle[:100]:
            s.close()
        time.sleep(0.5)
        good_answer(srv)
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    good_answer(srv)


# ---- restricted APIs ----------------------------------------------------------------------


def test_restricted_http_api_and_grpc_protocol(server_factory, make_repo, pb):  # noqa: F811
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--http-restricted-api=model-repository,inference:infer-key=s3cret",
                                "--http-restricted-api=statistics:admin=1",
                                "--grpc-restricted-protocol=inference:infer-key=s3cret"],
                         wait_live=True)
    ins = [make_input("INPUT0", A, "INT32"), make_input("INPUT1", B, "INT32")]
    # Refused without the header, and with a wrong value: 403 naming the header.
    for headers in ({}, {"infer-key": "wrong"}):
        r = srv.post("/v2/models/simple/infer", json={"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.ravel().tolist()}]},
            headers=headers)
        assert r.status_code == 403, r.text
        assert r.json()["error"] == "This API is restricted, expecting header 'infer-key'"
    r = srv.post("/v2/repository/index", json={})
    assert r.status_code == 403 and "infer-key" in r.json()["error"], r.text
    r = srv.get("/v2/models/stats")
    assert r.status_code == 403 and "'admin'" in r.json()["error"], r.text
    # Open categories stay open.
    assert srv.get("/v2/health/ready").status_code == 200
    assert srv.get("/v2/models/simple").status_code == 200
    # With the header (any case of its name) the call goes through.
    r = infer(srv, "simple", ins)
    assert r.status_code == 403
    from v2client import build_request
    body, headers = build_request(ins)
    headers["Infer-Key"] = "s3cret"
    r = srv.post("/v2/models/simple/infer", data=body, headers=headers)
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], A + B)
    assert srv.get("/v2/models/stats", headers={"admin": "1"}).status_code == 200

    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    stub = pb[1].GRPCInferenceServiceStub(channel)
    req = simple_request(pb, A, B)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert e.value.details() == "This protocol is restricted, expecting header 'infer-key'"
    with pytest.raises(grpc.RpcError) as e:
        list(stub.ModelStreamInfer(iter([req]), timeout=10))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    resp = stub.ModelInfer(req, timeout=10, metadata=[("infer-key", "s3cret")])
    np.testing.assert_array_equal(
        np.frombuffer(resp.raw_output_contents[0], dtype=np.int32).reshape(1, 16), A + B)
    assert stub.ServerLive(pb[0].ServerLiveRequest(), timeout=10).live  # health is open
    channel.close()


@pytest.mark.parametrize("flag,message", [
    ("--http-restricted-api=inference", "takes <category>[,<category>...]:<key>=<value>"),
    ("--http-restricted-api=bogus:k=v", "unknown category 'bogus'"),
    ("--grpc-restricted-protocol=health:=v", "takes <category>"),
])
def test_restricted_api_flag_errors(flag, message):
    import subprocess
    from conftest import INFERD_BIN
    p = subprocess.run([str(INFERD_BIN), "--model-repository=/nonexistent", flag],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p
    assert message in p.stderr, p.stderr


def test_restricting_a_category_twice_is_an_error():
    import subprocess
    from conftest import INFERD_BIN
    p = subprocess.run([str(INFERD_BIN), "--model-repository=/nonexistent",
                        "--http-restricted-api=health:a=1", "--http-restricted-api=health,trace:b=2"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "category 'health' is restricted more than once" in p.stderr, p


# ---- SageMaker routes -------------------------------------------------------------------------

SM_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
SAGEMAKER_CASES = [
    ("sm-invocations-get", b"GET /invocations HTTP/1.1\r\n\r\n", 405, "POST /invocations"),
    ("sm-ping-post", post("/ping", ""), 405, "GET /ping"),
    ("sm-unknown-route", b"GET /v2/models/simple HTTP/1.1\r\n\r\n", 404, "no SageMaker route"),
    ("sm-bad-json", post("/invocations", "{oops", [("Content-Type", "application/json")]), 400, "malformed JSON"),
    ("sm-header-size-letters", post("/invocations", GOOD, [("Content-Type", SM_MIME + "x")]), 400,
     "Unable to parse inference header size"),
    ("sm-header-size-too-big", post("/invocations", GOOD, [("Content-Type", SM_MIME + "999999")]), 400,
     "inference header size should be in range"),
    ("sm-header-size-negative", post("/invocations", GOOD, [("Content-Type", SM_MIME + "-1")]), 400,
     "Unable to parse inference header size"),
    ("sm-mime-not-first", post("/invocations", GOOD, [("Content-Type", "x;" + SM_MIME + "3")]), 400,
     "expect MIME type for binary data starts with"),
    ("sm-header-size-cuts-json", post("/invocations", GOOD, [("Content-Type", SM_MIME + "10")]), 400,
     "malformed JSON"),
    ("sm-load-not-json", post("/models", "nope"), 400, "JSON object"),
    ("sm-load-no-url", post("/models", '{"model_name": "a"}'), 400, "'url'"),
    ("sm-load-dotdot-name", post("/models", '{"model_name": "..", "url": "/tmp"}'), 400, "invalid model name"),
    ("sm-load-proc", post("/models", '{"model_name": "a", "url": "/proc/1/root"}'), 400, "/proc/"),
    ("sm-load-not-archive", post("/models", '{"model_name": "a", "url": "/etc/hostname"}'), 400,
     "not a .tar.gz"),
    ("sm-get-unknown", b"GET /models/nosuch HTTP/1.1\r\n\r\n", 404, "not loaded"),
    ("sm-delete-unknown", b"DELETE /models/nosuch HTTP/1.1\r\n\r\n", 404, "not loaded"),
    ("sm-invoke-unknown", post("/models/nosuch/invoke", GOOD), 404, "not loaded"),
    ("sm-invoke-slash-name", post("/models/a%2Fb/invoke", GOOD), 400, "path separator"),
    ("sm-invoke-bad-escape", post("/models/a%zz/invoke", GOOD), 400, "percent-escape"),
    ("sm-list-bad-token", b"GET /models?next_page_token=abc HTTP/1.1\r\n\r\n", 400, "next_page_token"),
]


def test_sagemaker_cases(server_factory, make_repo):
    from conftest import free_port
    repo = make_repo({"simple": "simple"})
    port = free_port()
    srv = server_factory(repo, ["--allow-sagemaker=true", f"--sagemaker-port={port}",
                                "--sagemaker-address=127.0.0.1"])
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    for name, raw, status, text in SAGEMAKER_CASES:
        got, body = raw_http(port, raw)
        assert got == status, f"{name}: expected {status}, got {got}: {body[:300]!r}"
        err = json.loads(body)["error"]
        assert text in err, f"{name}: error {err!r} does not mention {text!r}"
    # Still serving correct answers on the SageMaker port.
    got, body = raw_http(port, post("/invocations", GOOD, [("Content-Type", "application/json")]))
    assert got == 200, body
    out = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert out["OUTPUT0"] == (A + B).ravel().tolist()
