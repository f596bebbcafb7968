"""Bad requests: exact 4xx status, a JSON {"error": "..."} body naming the culprit, and the
server keeps serving afterwards."""

import json
import socket
import struct

import numpy as np
import pytest

from v2client import (HEADER_LEN, assert_4xx, assert_error, build_request, infer, make_input,
                      parse_response)

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def good_simple_request(server, session=None):
    r = infer(server, "simple", [make_input("INPUT0", A, "INT32"), make_input("INPUT1", B, "INT32")],
              session=session)
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    assert server.proc.poll() is None, f"server died:\n{server.log()}"
    good_simple_request(server)


def post_json(server, model, obj, **kw):
    body = obj if isinstance(obj, (bytes, str)) else json.dumps(obj)
    return server.post(f"/v2/models/{model}/infer", data=body,
                       headers={"Content-Type": "application/json"}, **kw)


def simple_inputs(**override):
    ins = [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.reshape(-1).tolist()},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.reshape(-1).tolist()},
    ]
    for i, kv in override.items():
        ins[int(i[-1])].update(kv)
    return ins


def test_malformed_json(server):
    r = post_json(server, "simple", b'{"inputs": [ {"name": "INPUT0", "shape": [1,')
    assert_error(r, 400)


def test_json_not_an_object(server):
    assert_error(post_json(server, "simple", b"[1, 2, 3]"), 400)


def test_missing_inputs_field(server):
    assert_error(post_json(server, "simple", {"id": "1"}), 400, "inputs")


# Triton's words (ModelRepositoryManager::GetModel), which tritonclient's own examples check:
# simple_http_infer_client.py exits 1 unless the message starts with "Request for unknown model".
UNKNOWN = "Request for unknown model: 'no_such_model' is not found"


def test_unknown_model(server):
    r = post_json(server, "no_such_model", {"inputs": simple_inputs()})
    assert assert_error(r, 404, "no_such_model").startswith(UNKNOWN)
    for path in ("", "/config", "/stats", "/versions/1", "/versions/1/config"):
        assert assert_error(server.get("/v2/models/no_such_model" + path), 404) == UNKNOWN, path


def test_unknown_version(server):
    r = server.post("/v2/models/simple/versions/7/infer", data=json.dumps({"inputs": simple_inputs()}),
                    headers={"Content-Type": "application/json"})
    assert assert_error(r, 404) == "Request for unknown model: 'simple' version 7 is not found"
    for path in ("", "/config", "/stats"):
        assert (assert_error(server.get("/v2/models/simple/versions/7" + path), 404)
                == "Request for unknown model: 'simple' version 7 is not found"), path


def test_missing_input(server):
    r = post_json(server, "simple", {"inputs": simple_inputs()[:1]})
    assert_error(r, 400, "INPUT1")


def test_extra_unknown_input(server):
    ins = simple_inputs() + [{"name": "BOGUS", "shape": [1, 16], "datatype": "INT32",
                              "data": [0] * 16}]
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "BOGUS")


def test_duplicate_input(server):
    ins = simple_inputs() + simple_inputs()[:1]
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT0")


def test_wrong_datatype(server):
    ins = simple_inputs(in0={"datatype": "FP32", "data": [float(v) for v in range(16)]})
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT0")


def test_invalid_datatype_name(server):
    ins = simple_inputs(in1={"datatype": "FLOAT"})
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT1")


def test_shape_does_not_match_element_count(server):
    ins = simple_inputs(in0={"data": list(range(15))})
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT0")


def test_shape_does_not_match_model(server):
    ins = simple_inputs(in1={"shape": [1, 15], "data": list(range(15))})
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT1")


def test_batch_larger_than_max_batch_size(server):
    ins = simple_inputs(in0={"shape": [9, 16], "data": list(range(16 * 9))},
                        in1={"shape": [9, 16], "data": list(range(16 * 9))})
    assert_error(post_json(server, "simple", {"inputs": ins}), 400)


def test_non_numeric_data(server):
    ins = simple_inputs(in0={"data": ["abc"] * 16})
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT0")


def test_input_without_data(server):
    ins = simple_inputs()
    del ins[0]["data"]
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT0")


def test_unknown_requested_output(server):
    r = post_json(server, "simple", {"inputs": simple_inputs(), "outputs": [{"name": "NOPE"}]})
    assert_error(r, 400, "NOPE")


def test_binary_data_size_past_end_of_body(server):
    """INPUT1 declares 64 bytes but only 60 follow."""
    body, headers = build_request([make_input("INPUT0", A, "INT32", binary=True),
                                   make_input("INPUT1", B, "INT32", binary=True)])
    r = server.post("/v2/models/simple/infer", data=body[:-4], headers=headers)
    assert_error(r, 400)


def test_binary_data_size_disagrees_with_shape(server):
    """binary_data_size 60 for a [1,16] INT32 tensor (64 bytes), body consistent with 60."""
    t0 = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
          "parameters": {"binary_data_size": 60}}
    t1, _ = make_input("INPUT1", B, "INT32")
    header = json.dumps({"inputs": [t0, t1]}).encode()
    body = header + A.tobytes()[:60]
    r = server.post("/v2/models/simple/infer", data=body,
                    headers={"Content-Type": "application/octet-stream",
                             HEADER_LEN: str(len(header))})
    assert_error(r, 400, "INPUT0")


def test_header_length_larger_than_body(server):
    body, headers = build_request([make_input("INPUT0", A, "INT32", binary=True),
                                   make_input("INPUT1", B, "INT32", binary=True)])
    headers[HEADER_LEN] = str(len(body) + 10)
    assert_error(server.post("/v2/models/simple/infer", data=body, headers=headers), 400)


def test_header_length_not_a_number(server):
    body, headers = build_request([make_input("INPUT0", A, "INT32"),
                                   make_input("INPUT1", B, "INT32")])
    headers[HEADER_LEN] = "abc"
    assert_error(server.post("/v2/models/simple/infer", data=body, headers=headers), 400)


def test_bytes_element_length_past_end(server):
    raw = struct.pack("<I", 100) + b"short"
    t = {"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES",
         "parameters": {"binary_data_size": len(raw)}}
    header = json.dumps({"inputs": [t]}).encode()
    r = server.post("/v2/models/onnx_identity_bytes/infer", data=header + raw,
                    headers={"Content-Type": "application/octet-stream",
                             HEADER_LEN: str(len(header))})
    assert_error(r, 400, "INPUT0")


def test_raw_binary_request_for_two_input_model(server):
    """Raw binary requests (header length 0) are only valid for single-input models."""
    r = server.post("/v2/models/simple/infer", data=A.tobytes() + B.tobytes(),
                    headers={"Content-Type": "application/octet-stream", HEADER_LEN: "0"})
    assert_error(r, 400)


def test_metadata_unknown_model_json_error(server):
    assert_error(server.get("/v2/models/nope_model"), 404, "nope_model")


def test_unknown_endpoint(server):
    assert_4xx(server.get("/v2/this/is/not/an/endpoint"))


def test_errors_keep_connection_usable(server):
    """Errors on a keep-alive session do not break the following requests."""
    import requests
    s = requests.Session()
    for _ in range(5):
        assert_error(post_json(server, "simple", b"{not json", session=s), 400)
        good_simple_request(server, session=s)
    s.close()


# ---- --http-max-input-size ---------------------------------------------------------------


def raw_http_post(port, path, headers, body, timeout=20):
    """POST over a raw socket: tolerates the server answering (and closing) before the
    whole body has been sent. Returns (status, headers dict, body bytes)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        head += f"Content-Length: {len(body)}\r\n"
        for k, v in headers.items():
            head += f"{k}: {v}\r\n"
        head += "Connection: close\r\n\r\n"
        sock.sendall(head.encode())
        try:
            for off in range(0, len(body), 65536):
                sock.sendall(body[off:off + 65536])
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                # stop once a complete response with Content-Length has arrived
                if b"\r\n\r\n" in data:
                    hdr, _, rest = data.partition(b"\r\n\r\n")
                    for line in hdr.split(b"\r\n")[1:]:
                        k, _, v = line.partition(b":")
                        if k.strip().lower() == b"content-length" and len(rest) >= int(v):
                            raise StopIteration
        except StopIteration:
            pass
        except ConnectionResetError:
            if not data:
                raise
    finally:
        sock.close()
    hdr, _, rest = data.partition(b"\r\n\r\n")
    lines = hdr.split(b"\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        hdrs[k.strip().decode().lower()] = v.strip().decode()
    if "content-length" in hdrs:
        rest = rest[:int(hdrs["content-length"])]
    return status, hdrs, rest


def test_body_over_max_input_size(server_factory, make_repo):
    repo = make_repo({"identity_fp32": "identity_fp32"})
    srv = server_factory(repo, ["--http-max-input-size=1048576"])
    srv.wait_until(lambda: srv.get("/v2/models/identity_fp32/ready").status_code == 200, 30,
                   "identity_fp32 ready")
    big = np.zeros((1, 2 * 1024 * 1024 // 4), dtype=np.float32)  # 2 MiB of tensor data
    body, headers = build_request([make_input("INPUT0", big, "FP32", binary=True)])
    status, _, resp_body = raw_http_post(srv.port, "/v2/models/identity_fp32/infer", headers, body)
    assert status == 413, resp_body[:300]
    err = json.loads(resp_body)
    assert isinstance(err.get("error"), str) and err["error"]
    # Under the limit still works, and the server keeps serving.
    ok = np.arange(1000, dtype=np.float32).reshape(1, 1000)
    r = infer(srv, "identity_fp32", [make_input("INPUT0", ok, "FP32", binary=True)])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], ok)


def test_nobatch_model_given_batched_shape(server):
    ins = [{"name": n, "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
           for n in ("INPUT0", "INPUT1")]
    assert_error(post_json(server, "add_sub_nobatch", {"inputs": ins}), 400, "INPUT0")


def test_negative_dimension_in_request_shape(server):
    ins = simple_inputs(in0={"shape": [-1, 16]})
    assert_error(post_json(server, "simple", {"inputs": ins}), 400, "INPUT0")


def test_non_numeric_version_in_url(server):
    assert_4xx(server.get("/v2/models/simple/versions/abc"))
    r = server.post("/v2/models/simple/versions/abc/infer",
                    data=json.dumps({"inputs": simple_inputs()}))
    assert_4xx(r)
    assert "error" in r.json()
