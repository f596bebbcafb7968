"""Inference over JSON and over Triton's binary tensor data extension; results checked with numpy."""

import http.client
import json

import numpy as np
import pytest
import requests

from v2client import (HEADER_LEN, build_request, infer, make_input, parse_response,
                      serialize_bytes_tensor, tensor_to_raw)

ALL_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]
JSON_TYPES = [t for t in ALL_TYPES if t != "FP16"]  # FP16 has no JSON representation


def sample(datatype, shape=(2, 3), seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if datatype == "BOOL":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if datatype == "BYTES":
        pool = [b"hello", b"", b"w\xc3\xb6rld", b"with space", b"x" * 300, b"{\"json\": 1}"]
        return np.array([pool[i % len(pool)] for i in range(n)], dtype=np.object_).reshape(shape)
    if datatype.startswith("FP"):
        dt = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
        return (rng.standard_normal(n) * 100).astype(dt).reshape(shape)
    dt = np.dtype(datatype.lower())
    info = np.iinfo(dt)
    vals = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    vals[0] = info.min  # the extremes must survive the round trip
    vals[-1] = info.max
    return vals.reshape(shape)


def model_for(datatype):
    return f"onnx_identity_{datatype.lower()}"


def check_equal(got, expected, datatype):
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if datatype == "BYTES":
        assert got.reshape(-1).tolist() == expected.reshape(-1).tolist()
    else:
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        np.testing.assert_array_equal(got, expected)


# ---- JSON -------------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_simple_json(server, nested):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 7, dtype=np.int32) - a * 3
    r = infer(server, "simple", [make_input("INPUT0", a, "INT32", nested=nested),
                                 make_input("INPUT1", b, "INT32", nested=nested)],
              request_id="req-42")
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert hdr["id"] == "req-42"
    assert hdr["model_name"] == "simple"
    assert hdr["model_version"] == "1"
    assert HEADER_LEN not in r.headers  # nothing binary was asked for
    assert r.headers.get("Content-Type", "").startswith("application/json")
    names = [o["name"] for o in hdr["outputs"]]
    assert sorted(names) == ["OUTPUT0", "OUTPUT1"]
    for o in hdr["outputs"]:
        assert o["datatype"] == "INT32" and o["shape"] == [2, 16]
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_simple_json_versioned_url(server):
    a = np.ones((1, 16), dtype=np.int32)
    r = infer(server, "simple", [make_input("INPUT0", a, "INT32"),
                                 make_input("INPUT1", a, "INT32")], version=1)
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], a * 2)


def test_no_id_means_no_id_echo(server):
    a = np.ones((1, 16), dtype=np.int32)
    r = infer(server, "simple", [make_input("INPUT0", a, "INT32"),
                                 make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200
    assert r.json().get("id", "") == ""


def test_requested_output_subset(server):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.arange(16, 32, dtype=np.int32).reshape(1, 16)
    r = infer(server, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", b, "INT32")],
              outputs=[{"name": "OUTPUT1"}])
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert [o["name"] for o in hdr["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_identity_json_all_datatypes(server, datatype):
    x = sample(datatype)
    r = infer(server, model_for(datatype), [make_input("INPUT0", x, datatype)])
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert hdr["outputs"][0]["datatype"] == datatype
    assert hdr["outputs"][0]["shape"] == [2, 3]
    assert "data" in hdr["outputs"][0]
    check_equal(out["OUTPUT0"], x, datatype)


def test_bytes_json_are_strings(server):
    x = np.array([["alpha", "béta", ""]], dtype=object)
    r = infer(server, "onnx_identity_bytes", [make_input("INPUT0", x, "BYTES")])
    assert r.status_code == 200, r.text
    o = r.json()["outputs"][0]
    assert o["datatype"] == "BYTES" and o["shape"] == [1, 3]
    assert o["data"] == ["alpha", "béta", ""]


def test_nobatch_model(server):
    a = np.array([1.5, -2.0, 3.25, 0.0], dtype=np.float32)
    b = np.array([0.5, 4.0, -1.0, 8.0], dtype=np.float32)
    r = infer(server, "add_sub_nobatch", [make_input("INPUT0", a, "FP32"),
                                          make_input("INPUT1", b, "FP32")])
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    for o in hdr["outputs"]:
        assert o["shape"] == [4]
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_identity_backend_json(server):
    x = np.random.default_rng(5).standard_normal((3, 7)).astype(np.float32)
    r = infer(server, "identity_fp32", [make_input("INPUT0", x, "FP32")])
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert hdr["outputs"][0]["shape"] == [3, 7]
    check_equal(out["OUTPUT0"], x, "FP32")


# ---- binary tensor data extension --------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_identity_binary_all_datatypes(server, datatype):
    x = sample(datatype, seed=1)
    r = infer(server, model_for(datatype), [make_input("INPUT0", x, datatype, binary=True)],
              outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    assert r.status_code == 200, r.text
    hlen = int(r.headers[HEADER_LEN])
    hdr, out = parse_response(r)
    o = hdr["outputs"][0]
    assert o["datatype"] == datatype and o["shape"] == [2, 3]
    assert "data" not in o
    raw = tensor_to_raw(x, datatype)
    assert o["parameters"]["binary_data_size"] == len(raw)
    assert len(r.content) == hlen + len(raw)
    assert r.content[hlen:] == raw
    check_equal(out["OUTPUT0"], x, datatype)


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_binary_in_json_out(server, datatype):
    x = sample(datatype, seed=2)
    r = infer(server, model_for(datatype), [make_input("INPUT0", x, datatype, binary=True)])
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert "data" in hdr["outputs"][0]
    check_equal(out["OUTPUT0"], x, datatype)


def test_binary_data_output_parameter(server):
    """binary_data_output on the request makes every output binary."""
    x = sample("FP32", seed=3)
    r = infer(server, "onnx_identity_fp32", [make_input("INPUT0", x, "FP32")],
              parameters={"binary_data_output": True})
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert "binary_data_size" in hdr["outputs"][0]["parameters"]
    check_equal(out["OUTPUT0"], x, "FP32")


def test_binary_data_false_overrides_binary_data_output(server):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    r = infer(server, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", b, "INT32")],
              outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": False}},
                       {"name": "OUTPUT1"}],
              parameters={"binary_data_output": True})
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    by_name = {o["name"]: o for o in hdr["outputs"]}
    assert "data" in by_name["OUTPUT0"]
    assert "binary_data_size" in by_name["OUTPUT1"]["parameters"]
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_mixed_binary_and_json_inputs(server):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = (np.arange(32, dtype=np.int32) * -5).reshape(2, 16)
    r = infer(server, "simple", [make_input("INPUT0", a, "INT32", binary=True),
                                 make_input("INPUT1", b, "INT32")],
              outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                       {"name": "OUTPUT1", "parameters": {"binary_data": False}}])
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_json_and_binary_identical(server):
    rng = np.random.default_rng(9)
    a = rng.integers(-1000, 1000, (4, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (4, 16), dtype=np.int32)
    results = []
    for binary in (False, True):
        r = infer(server, "simple", [make_input("INPUT0", a, "INT32", binary=binary),
                                     make_input("INPUT1", b, "INT32", binary=binary)],
                  parameters={"binary_data_output": binary})
        assert r.status_code == 200, r.text
        results.append(parse_response(r)[1])
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_array_equal(results[0][name], results[1][name])
    np.testing.assert_array_equal(results[0]["OUTPUT0"], a + b)


def test_binary_bytes_raw_non_utf8(server):
    x = np.array([[b"\x00\xff\xfe", b"", b"\x80abc"]], dtype=np.object_)
    r = infer(server, "onnx_identity_bytes", [make_input("INPUT0", x, "BYTES", binary=True)],
              outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    assert r.status_code == 200, r.text
    hlen = int(r.headers[HEADER_LEN])
    assert r.content[hlen:] == serialize_bytes_tensor(x)
    _, out = parse_response(r)
    check_equal(out["OUTPUT0"], x, "BYTES")


@pytest.mark.parametrize("model", ["identity_fp32", "onnx_identity_fp32"])
def test_raw_binary_request(server, model):
    """Inference-Header-Content-Length: 0 -> the whole body is the single input, batch 1;
    every output comes back binary."""
    x = np.array([1.0, -2.5, 3.25, 1e-3], dtype=np.float32)
    r = server.post(f"/v2/models/{model}/infer", data=x.tobytes(),
                    headers={"Content-Type": "application/octet-stream", HEADER_LEN: "0"})
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    o = hdr["outputs"][0]
    assert o["name"] == "OUTPUT0" and o["datatype"] == "FP32"
    assert o["shape"] == [1, 4]
    assert o["parameters"]["binary_data_size"] == 16
    check_equal(out["OUTPUT0"], x.reshape(1, 4), "FP32")


def test_raw_binary_request_fixed_dims(server):
    """Raw binary body for a single-input model with fixed dims (labelled: FP32 [5])."""
    x = np.array([0.5, 1.5, -2.0, 4.0, 8.25], dtype=np.float32)
    r = server.post("/v2/models/labelled/infer", data=x.tobytes(),
                    headers={"Content-Type": "application/octet-stream", HEADER_LEN: "0"})
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    o = hdr["outputs"][0]
    assert o["shape"] == [1, 5] and "binary_data_size" in o["parameters"]
    check_equal(out["OUTPUT0"], x.reshape(1, 5), "FP32")


def test_large_binary_tensor(server):
    x = np.random.default_rng(11).standard_normal((8, 100_000)).astype(np.float32)  # 3.2 MB
    r = infer(server, "identity_fp32", [make_input("INPUT0", x, "FP32", binary=True)],
              parameters={"binary_data_output": True})
    assert r.status_code == 200, r.text[:300]
    _, out = parse_response(r)
    check_equal(out["OUTPUT0"], x, "FP32")


# ---- classification extension ------------------------------------------------------------


def _parse_class(s):
    parts = s.decode() if isinstance(s, bytes) else s
    parts = parts.split(":")
    assert len(parts) in (2, 3), s
    return float(parts[0]), int(parts[1]), (parts[2] if len(parts) == 3 else None)


def test_classification_with_labels(server):
    labels = ["cat", "dog", "bird", "fish", "horse"]
    x = np.array([[0.1, 0.9, 0.3, 0.7, 0.2],
                  [5.0, -1.0, 2.5, 0.0, 7.5]], dtype=np.float32)
    r = infer(server, "labelled", [make_input("INPUT0", x, "FP32")],
              outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2}}])
    assert r.status_code == 200, r.text
    o = r.json()["outputs"][0]
    assert o["datatype"] in ("BYTES", "STRING")
    assert o["shape"] == [2, 2]
    data = np.array(o["data"], dtype=object).reshape(2, 2)
    for row in range(2):
        top = np.argsort(-x[row])[:2]
        for k in range(2):
            value, index, label = _parse_class(data[row, k])
            assert index == top[k]
            assert value == pytest.approx(float(x[row, index]), rel=1e-5)
            assert label == labels[index]


def test_classification_without_labels(server):
    x = np.array([[1, 5, 10, 4]], dtype=np.float32)
    r = infer(server, "onnx_identity_fp32", [make_input("INPUT0", x, "FP32")],
              outputs=[{"name": "OUTPUT0", "parameters": {"classification": 3}}])
    assert r.status_code == 200, r.text
    o = r.json()["outputs"][0]
    assert o["shape"] == [1, 3]
    parsed = [_parse_class(s) for s in o["data"]]
    assert [p[1] for p in parsed] == [2, 1, 3]
    assert [p[0] for p in parsed] == [10.0, 5.0, 4.0]
    assert all(p[2] is None for p in parsed)


# ---- connection handling -----------------------------------------------------------------


def test_keep_alive_many_requests_one_connection(server):
    """HTTP/1.1 keep-alive: 100 requests over one TCP connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    try:
        sock = None
        for i in range(100):
            b = np.full((1, 16), i, dtype=np.int32)
            body, headers = build_request([make_input("INPUT0", a, "INT32"),
                                           make_input("INPUT1", b, "INT32")], request_id=str(i))
            conn.request("POST", "/v2/models/simple/infer", body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, data
            js = json.loads(data)
            assert js["id"] == str(i)
            out0 = {o["name"]: o for o in js["outputs"]}["OUTPUT0"]
            assert out0["data"] == (a + b).reshape(-1).tolist()
            assert conn.sock is not None, "server closed the connection"
            if sock is None:
                sock = conn.sock
            assert conn.sock is sock, f"connection was re-opened at request {i}"
            if i % 10 == 0:  # interleave GETs on the same connection
                conn.request("GET", "/v2/health/ready")
                r2 = conn.getresponse()
                r2.read()
                assert r2.status == 200
    finally:
        conn.close()


def test_keep_alive_session(server):
    s = requests.Session()
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    for i in range(50):
        r = infer(server, "identity_fp32", [make_input("INPUT0", x + i, "FP32")], session=s)
        assert r.status_code == 200
        np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], x + i)
    s.close()


def test_concurrent_requests(server):
    """Many clients at once: every response matches its own request."""
    from concurrent.futures import ThreadPoolExecutor

    def worker(k):
        s = requests.Session()
        rng = np.random.default_rng(100 + k)
        try:
            for i in range(20):
                bs = int(rng.integers(1, 9))
                a = rng.integers(-10**6, 10**6, (bs, 16), dtype=np.int32)
                b = rng.integers(-10**6, 10**6, (bs, 16), dtype=np.int32)
                binary = bool(i % 2)
                r = infer(server, "simple", [make_input("INPUT0", a, "INT32", binary=binary),
                                             make_input("INPUT1", b, "INT32", binary=binary)],
                          request_id=f"{k}-{i}", parameters={"binary_data_output": binary},
                          session=s)
                assert r.status_code == 200, r.text
                hdr, out = parse_response(r)
                assert hdr["id"] == f"{k}-{i}"
                np.testing.assert_array_equal(out["OUTPUT0"], a + b)
                np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        finally:
            s.close()
        return True

    with ThreadPoolExecutor(max_workers=8) as ex:
        assert all(ex.map(worker, range(8)))


def test_binary_request_echoes_id(server):
    x = sample("INT32", seed=4)
    r = infer(server, "onnx_identity_int32", [make_input("INPUT0", x, "INT32", binary=True)],
              request_id="bin-id-7", parameters={"binary_data_output": True})
    assert r.status_code == 200, r.text
    hdr, out = parse_response(r)
    assert hdr["id"] == "bin-id-7"
    check_equal(out["OUTPUT0"], x, "INT32")


def test_json_without_content_type(server):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    body, _ = build_request([make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    r = server.post("/v2/models/simple/infer", data=body)
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], a * 2)


def test_chunked_request_body(server):
    """HTTP/1.1 servers must accept Transfer-Encoding: chunked request bodies."""
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    body, headers = build_request([make_input("INPUT0", a, "INT32", binary=True),
                                   make_input("INPUT1", b, "INT32")])

    def chunks():
        for off in range(0, len(body), 37):
            yield body[off:off + 37]

    r = server.post("/v2/models/simple/infer", data=chunks(), headers=headers)
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)


def test_expect_100_continue(server):
    """curl sends 'Expect: 100-continue' for larger bodies; the request must still succeed."""
    import socket
    x = np.arange(2048, dtype=np.float32).reshape(1, 2048)
    body, headers = build_request([make_input("INPUT0", x, "FP32", binary=True)])
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        head = (f"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n"
                f"Content-Type: application/octet-stream\r\n"
                f"{HEADER_LEN}: {headers[HEADER_LEN]}\r\nConnection: close\r\n\r\n")
        sock.sendall(head.encode())
        sock.settimeout(2)
        pre = b""
        try:
            pre = sock.recv(4096)
        except socket.timeout:
            pass  # no interim response: clients send the body after a delay anyway
        if pre:
            assert pre.startswith(b"HTTP/1.1 100"), pre[:200]
        sock.settimeout(10)
        sock.sendall(body)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    if pre and b"\r\n\r\n" in pre and not data:
        data = pre
    status_line = data.split(b"\r\n", 1)[0]
    assert b" 200 " in status_line + b" ", data[:300]
    hdr_blob, _, rest = data.partition(b"\r\n\r\n")
    hl = None
    for line in hdr_blob.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == HEADER_LEN.lower().encode():
            hl = int(v)
    js = json.loads(rest[:hl] if hl else rest)
    assert js["outputs"][0]["shape"] == [1, 2048]
