"""A small KServe v2 / Triton HTTP client for the integration tests (requests + numpy).

Implements the JSON tensor encoding and Triton's binary tensor data extension:
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md
"""

import json
import struct

import numpy as np

HEADER_LEN = "Inference-Header-Content-Length"

NP_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


def serialize_bytes_tensor(arr):
    """BYTES elements: 4-byte little-endian unsigned length followed by the bytes."""
    out = bytearray()
    for e in np.asarray(arr, dtype=np.object_).reshape(-1):
        if isinstance(e, str):
            e = e.encode("utf-8")
        out += struct.pack("<I", len(e))
        out += e
    return bytes(out)


def deserialize_bytes_tensor(buf, shape=None):
    elems = []
    off = 0
    while off < len(buf):
        (n,) = struct.unpack_from("<I", buf, off)
        off += 4
        elems.append(bytes(buf[off:off + n]))
        off += n
    arr = np.array(elems, dtype=np.object_)
    if shape is not None:
        arr = arr.reshape(shape)
    return arr


def tensor_to_raw(arr, datatype):
    if datatype == "BYTES":
        return serialize_bytes_tensor(arr)
    return np.ascontiguousarray(arr, dtype=np.dtype(NP_DTYPES[datatype]).newbyteorder("<")).tobytes()


def raw_to_tensor(buf, datatype, shape):
    if datatype == "BYTES":
        return deserialize_bytes_tensor(buf, shape)
    dt = np.dtype(NP_DTYPES[datatype]).newbyteorder("<")
    return np.frombuffer(buf, dtype=dt).astype(NP_DTYPES[datatype]).reshape(shape)


def json_data(arr, datatype, nested=False):
    """Tensor -> JSON 'data' value (flat by default, or nested lists)."""
    a = np.asarray(arr)
    if datatype == "BYTES":
        a = np.array([e.decode("utf-8") if isinstance(e, bytes) else e for e in a.reshape(-1)],
                     dtype=object).reshape(a.shape)
    return a.tolist() if nested else a.reshape(-1).tolist()


def make_input(name, arr, datatype, binary=False, nested=False):
    arr = np.asarray(arr) if datatype != "BYTES" else np.asarray(arr, dtype=np.object_)
    t = {"name": name, "shape": list(arr.shape), "datatype": datatype}
    raw = None
    if binary:
        raw = tensor_to_raw(arr, datatype)
        t["parameters"] = {"binary_data_size": len(raw)}
    else:
        t["data"] = json_data(arr, datatype, nested=nested)
    return t, raw


def build_request(inputs, outputs=None, request_id=None, parameters=None):
    """inputs: list of (tensor_json, raw_or_None) from make_input.

    Returns (body bytes, headers dict)."""
    req = {}
    if request_id is not None:
        req["id"] = request_id
    if parameters is not None:
        req["parameters"] = parameters
    req["inputs"] = [t for t, _ in inputs]
    if outputs is not None:
        req["outputs"] = outputs
    header = json.dumps(req).encode("utf-8")
    raws = [r for _, r in inputs if r is not None]
    if not raws:
        return header, {"Content-Type": "application/json"}
    body = header + b"".join(raws)
    return body, {"Content-Type": "application/octet-stream", HEADER_LEN: str(len(header))}


def parse_response(resp):
    """Returns (json_header, {output name: numpy array}) for an infer response."""
    body = resp.content
    hlen = resp.headers.get(HEADER_LEN)
    if hlen is None:
        header = json.loads(body)
        rest = b""
    else:
        hlen = int(hlen)
        assert 0 < hlen <= len(body), f"bad {HEADER_LEN} {hlen} for body of {len(body)} bytes"
        header = json.loads(body[:hlen])
        rest = body[hlen:]
    outputs = {}
    off = 0
    for out in header.get("outputs", []):
        params = out.get("parameters") or {}
        shape = out["shape"]
        dt = out["datatype"]
        if "binary_data_size" in params:
            n = int(params["binary_data_size"])
            assert off + n <= len(rest), f"output {out['name']} binary data past body end"
            outputs[out["name"]] = raw_to_tensor(rest[off:off + n], dt, shape)
            off += n
        else:
            assert "data" in out, f"output {out['name']} has neither data nor binary_data_size"
            if dt == "BYTES":
                data = [d.encode("utf-8") if isinstance(d, str) else d
                        for d in np.asarray(out["data"], dtype=object).reshape(-1)]
                outputs[out["name"]] = np.array(data, dtype=np.object_).reshape(shape)
            else:
                outputs[out["name"]] = np.array(out["data"], dtype=NP_DTYPES[dt]).reshape(shape)
    assert off == len(rest), f"{len(rest) - off} unexplained bytes after binary outputs"
    return header, outputs


def infer(server, model, inputs, outputs=None, version=None, request_id=None,
          parameters=None, session=None):
    """POSTs an inference request; returns the requests.Response."""
    body, headers = build_request(inputs, outputs, request_id, parameters)
    path = f"/v2/models/{model}"
    if version is not None:
        path += f"/versions/{version}"
    return server.post(path + "/infer", data=body, headers=headers, session=session)


def assert_error(resp, status, *must_contain):
    """Checks an error answer: exact status and a JSON body {"error": "..."} naming things."""
    assert resp.status_code == status, (
        f"expected HTTP {status}, got {resp.status_code}: {resp.text[:500]}")
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(f"error body is not JSON: {resp.text[:500]!r}")
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    assert body["error"].strip(), "empty error message"
    for s in must_contain:
        assert str(s) in body["error"], f"error message {body['error']!r} does not mention {s!r}"
    return body["error"]


def assert_4xx(resp):
    assert 400 <= resp.status_code < 500, f"expected 4xx, got {resp.status_code}: {resp.text[:300]}"


def assert_unavailable(resp):
    """A model (version) that exists but is not loaded: 4xx, or 503 as Triton maps
    UNAVAILABLE errors. Still a JSON error body."""
    assert 400 <= resp.status_code < 500 or resp.status_code == 503, (
        f"expected 4xx/503, got {resp.status_code}: {resp.text[:300]}")
    assert isinstance(resp.json().get("error"), str), resp.text
