"""Protocol details Triton has (issue 16): dynamic batching of a model with BYTES outputs, the
classification extension on FP16 outputs."""

import concurrent.futures as futures
import json

import numpy as np
import requests

from v2client import infer, make_input, parse_response


def stats(srv, model):
    r = srv.get(f"/v2/models/{model}/stats")
    assert r.status_code == 200, r.text
    return r.json()["model_stats"][0]


def test_bytes_outputs_split_per_request_in_a_batch(server_factory, make_repo):
    """Requests of different batch sizes and string lengths are run as one batch; each gets
    back exactly its own strings (the BYTES output is split at request boundaries)."""
    repo = make_repo({"strings": "onnx_identity_bytes"})
    cfg = repo / "strings" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "onnx_identity_bytes"', 'name: "strings"') +
                   "\ndynamic_batching { preferred_batch_size: [ 6 ] "
                   "max_queue_delay_microseconds: 2000000 }\n")
    srv = server_factory([repo])

    def send(i):
        batch = 1 + i % 2  # 1, 2, 1, 2: six items, the preferred batch
        arr = np.array([[f"req{i}-row{b}-" + "x" * (i * 7 + b * 3 + j) for j in range(3)]
                        for b in range(batch)], dtype=np.object_)
        with requests.Session() as s:
            r = infer(srv, "strings", [make_input("INPUT0", arr, "BYTES", binary=i % 2 == 0)],
                      session=s)
        assert r.status_code == 200, r.text
        out = parse_response(r)[1]["OUTPUT0"]
        got = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v)(out)
        np.testing.assert_array_equal(got.reshape(arr.shape), arr)
        return batch

    with futures.ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(send, range(4)))
    st = stats(srv, "strings")
    assert st["inference_count"] == sum(sizes)
    assert st["execution_count"] == 1, st  # one batch of all four requests


def test_classification_of_fp16_output_matches_numpy(server):
    x = np.array([[0.5, -2.0, 3.25, 3.0, 65504.0, 1e-7, -0.0, 0.125]], dtype=np.float16)
    r = infer(server, "onnx_identity_fp16", [make_input("INPUT0", x, "FP16")],
              outputs=[{"name": "OUTPUT0", "parameters": {"classification": 4}}])
    assert r.status_code == 200, r.text
    out = parse_response(r)[1]["OUTPUT0"].reshape(-1)
    entries = [(v.decode() if isinstance(v, bytes) else v).split(":") for v in out]
    order = np.argsort(-x[0].astype(np.float64), kind="stable")[:4]
    assert [int(e[1]) for e in entries] == list(order), entries
    np.testing.assert_allclose([float(e[0]) for e in entries],
                               x[0][order].astype(np.float64), rtol=1e-6)


def test_compressed_request_and_response_bodies(server):
    """Content-Encoding gzip/deflate bodies are inflated (binary tensors too: the header length
    counts the uncompressed JSON); Accept-Encoding answers compressed, as Triton does."""
    import gzip
    import zlib

    from v2client import build_request

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, np.int32)
    body, headers = build_request([make_input("INPUT0", a, "INT32", binary=True),
                                   make_input("INPUT1", b, "INT32")],
                                  outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                                           {"name": "OUTPUT1"}])
    for coding, packed in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))]:
        for accept in ["gzip", "deflate;q=0.9, gzip;q=0.1", "identity"]:
            r = requests.post(f"{server.url}/v2/models/simple/infer", data=packed,
                              headers={**headers, "Content-Encoding": coding,
                                       "Accept-Encoding": accept})
            assert r.status_code == 200, (coding, accept, r.text)
            want = {"gzip": "gzip", "identity": None}.get(accept, "deflate")
            assert r.headers.get("Content-Encoding") == want, (accept, r.headers)
            if want:  # requests inflated it; the wire length says it was compressed
                assert int(r.headers["Content-Length"]) < len(r.content)
            out = parse_response(r)[1]
            np.testing.assert_array_equal(out["OUTPUT0"], a + b)
            np.testing.assert_array_equal(out["OUTPUT1"], a - b)

    # A body that is not what its Content-Encoding says, or a coding Triton does not take: 400
    # naming it, and the server serves on.
    r = requests.post(f"{server.url}/v2/models/simple/infer", data=gzip.compress(body)[:-12],
                      headers={**headers, "Content-Encoding": "gzip"})
    assert r.status_code == 400 and "gzip" in r.text, r.text
    r = requests.post(f"{server.url}/v2/models/simple/infer", data=body,
                      headers={**headers, "Content-Encoding": "br"})
    assert r.status_code == 400 and "'br'" in r.text, r.text
    assert server.get("/v2/health/ready").status_code == 200


def test_error_answers_are_never_compressed(server):
    """Triton compresses a successful infer response only; its errors are plain JSON whatever
    the Accept-Encoding. tritonclient json-decodes an error body as it comes (tritonclient.http.aio
    asks for gzip on every request), so a compressed error reached users as "an exception
    occurred in the client while decoding the response"."""
    import gzip

    from v2client import build_request

    a = np.zeros((1, 16), np.int32)
    good, headers = build_request([make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    bad, _ = build_request([make_input("INPUT0", a, "INT32")])  # INPUT1 missing
    cases = [("/v2/models/simple/infer", bad, 400), ("/v2/models/no_such_model/infer", good, 404),
             ("/v2/models/simple/versions/9/infer", good, 404)]
    for path, body, status in cases:
        for coding, data in [(None, body), ("gzip", gzip.compress(body))]:
            h = {**headers, "Accept-Encoding": "gzip, deflate"}
            if coding:
                h["Content-Encoding"] = coding
            r = requests.post(server.url + path, data=data, headers=h, stream=True)
            raw = r.raw.read(decode_content=False)
            assert r.status_code == status, (path, r.status_code, raw[:200])
            assert "Content-Encoding" not in r.headers, (path, r.headers)
            assert isinstance(json.loads(raw)["error"], str), raw[:200]
    r = requests.post(server.url + "/v2/models/simple/infer", data=good,
                      headers={**headers, "Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers.get("Content-Encoding") == "gzip", r.headers
