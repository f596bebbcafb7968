"""Protocol details Triton has (issue 16): dynamic batching of a model with BYTES outputs, the
classification extension on FP16 outputs."""

import concurrent.futures as futures

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
