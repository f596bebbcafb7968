"""Requests whose lines end in a bare LF (netcat, hand-written clients): RFC 9112 section 2.2 lets
a server accept LF as a line terminator; inferd answers them at once, as with CRLF, instead of
waiting for an empty CRLF line until the request timeout."""

import json
import socket
import time

import numpy as np

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


class Responses:
    """Reads Content-Length framed responses from one socket, in order."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        chunk = self.sock.recv(65536)
        assert chunk, f"connection closed without an answer: {self.buf!r}"
        self.buf += chunk

    def next(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while len(rest) < length:
            self._fill()
            head, _, rest = self.buf.partition(b"\r\n\r\n")
        self.buf = rest[length:]
        return int(head.split(b" ", 2)[1]), rest[:length]


def test_bare_lf_requests_are_answered_at_once(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    # A long request timeout: an answer that waited for it would take a minute.
    srv = server_factory(repo, ["--http-request-timeout-secs=60"])
    doc = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.ravel().tolist()}]}).encode()
    live = b"GET /v2/health/live HTTP/1.1\nHost: x\n\n"
    infer = (b"POST /v2/models/simple/infer HTTP/1.1\nHost: x\nContent-Type: application/json\n"
             b"Content-Length: " + str(len(doc)).encode() + b"\n\n" + doc)
    chunked = (b"POST /v2/models/simple/infer HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n" +
               f"{len(doc):x}\n".encode() + doc + b"\n0\n\n")
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        # Three requests pipelined on one connection, each answered in turn.
        s.sendall(live + infer + chunked)
        responses = Responses(s)
        status, _ = responses.next()
        assert status == 200
        for _ in range(2):
            status, body = responses.next()
            assert status == 200, body
            out = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
            assert out["OUTPUT0"] == (A + B).ravel().tolist()
    assert time.monotonic() - start < 10
