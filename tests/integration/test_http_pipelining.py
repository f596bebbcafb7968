"""Requests pipelined behind a large one on one keep-alive connection.

The HTTP loop's sockets are edge-triggered and it reads after an answer only when it stopped
reading with bytes possibly left in the socket: a whole large request already buffered, or the
in-flight read limit reached. These tests put the next requests in exactly those places; a loop
that forgot them would leave the client waiting for answers that never come."""

import json
import socket
import threading
import time

import numpy as np

from test_http_lf import Responses


def binary_request(values, input_name="INPUT0"):
    header = json.dumps({
        "inputs": [{"name": input_name, "shape": [1, len(values)], "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * len(values)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + np.asarray(values, dtype=np.float32).tobytes()
    return (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: " + str(len(header)).encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def run_pipeline(port, requests_and_sizes, hold_back=0):
    """Sends the requests back to back and reads their answers. hold_back > 0: the first
    request's last bytes wait until the server has read the rest, then go out in one write with
    all the requests behind it, so they reach the socket together."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        # Send from a thread: the server may stop reading until it has answered the first
        # request, and the answers must be read meanwhile.
        data = b"".join(r for r, _ in requests_and_sizes)

        def send():
            if hold_back:
                s.sendall(data[:len(requests_and_sizes[0][0]) - hold_back])
                time.sleep(0.5)
                s.sendall(data[len(requests_and_sizes[0][0]) - hold_back:])
            else:
                s.sendall(data)

        sender = threading.Thread(target=send)
        sender.start()
        responses = Responses(s)
        got = []
        for _, n in requests_and_sizes:
            status, body = responses.next()
            if n is None:  # a request refused on purpose
                assert status == 400, body[:300]
                got.append(None)
                continue
            assert status == 200, body[:300]
            got.append(np.frombuffer(body[len(body) - 4 * n:], dtype=np.float32))
        sender.join(60)
        assert not sender.is_alive()
        return got


def test_small_requests_pipelined_behind_a_large_one(server_factory, make_repo):
    repo = make_repo({"identity_fp32": "identity_fp32"})
    srv = server_factory(repo, [])
    # A 4 MiB body is read into a buffer of exactly its size; the read that completes it takes
    # its last bytes only and leaves the requests behind it in the socket. Its answer is a short
    # 400 (an input the model does not have): a long answer's partial write would bring an
    # EPOLLOUT event, and with it a read, by chance.
    big = np.arange(1 << 20, dtype=np.float32)
    small = [np.full(16, i, dtype=np.float32) for i in range(3)]
    reqs = [(binary_request(big, "NO_SUCH_INPUT"), None)] + \
        [(binary_request(v), v.size) for v in small]
    got = run_pipeline(srv.port, reqs, hold_back=100)
    assert got[0] is None
    for g, v in zip(got[1:], small):
        np.testing.assert_array_equal(g, v)


def test_requests_pipelined_past_the_in_flight_read_limit(server_factory, make_repo):
    repo = make_repo({"identity_fp32": "identity_fp32"})
    # While a request runs the loop reads at most one more request's worth (body limit plus
    # header limit); five requests of ~200 KiB each go past that with a 256 KiB body limit.
    srv = server_factory(repo, ["--http-max-input-size=262144"])
    values = [np.full(50000, i, dtype=np.float32) for i in range(5)]
    got = run_pipeline(srv.port, [(binary_request(v), v.size) for v in values])
    for g, v in zip(got, values):
        np.testing.assert_array_equal(g, v)
