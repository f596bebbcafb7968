"""Streams repeat_int32 responses (one request = ELEMENTS responses) for SECONDS over gRPC
ModelStreamInfer (one stream, CONCURRENCY requests in flight) and over HTTP generate_stream
(server-sent events; CONCURRENCY connections), alternating rounds; prints responses/s of each
round and the server's CPU time per response (from /proc/<server_pid>/stat), and, last, the
median ratios gRPC / SSE. The Python clients share the two cores with the server; the gRPC
one (grpcio, one message at a time) costs far more CPU per response than the server does, so
responses/s over gRPC measure mostly the client, and server CPU per response is the server's
own figure.

usage: decoupled_client.py <http_url> <grpc_addr> <stubs_dir> <seconds> <concurrency> <elements>
                           <rounds> <server_pid>
"""
import http.client
import json
import os
import queue
import statistics
import sys
import threading
import time
import urllib.parse

import numpy as np

http_url, grpc_addr, stubs, seconds, conc, elements, rounds, server_pid = sys.argv[1:9]
seconds, conc, elements, rounds = float(seconds), int(conc), int(elements), int(rounds)
sys.path.insert(0, stubs)
import grpc  # noqa: E402
import grpc_service_pb2 as pb  # noqa: E402
import grpc_service_pb2_grpc as pbg  # noqa: E402


def grpc_request(i):
    req = pb.ModelInferRequest(model_name="repeat_int32", id=str(i))
    vals = np.arange(elements, dtype=np.int32)
    for name, arr, dt in (("IN", vals, "INT32"), ("DELAY", np.zeros(elements, np.uint32), "UINT32"),
                          ("WAIT", np.zeros(1, np.uint32), "UINT32")):
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend(arr.shape)
        req.raw_input_contents.append(arr.tobytes())
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    return req


def grpc_round():
    channel = grpc.insecure_channel(grpc_addr)
    stub = pbg.GRPCInferenceServiceStub(channel)
    outbox = queue.Queue()
    for i in range(conc):
        outbox.put(grpc_request(i))

    def gen():
        while True:
            r = outbox.get()
            if r is None:
                return
            yield r

    count = 0
    sent = conc
    end = time.monotonic() + seconds
    start = time.monotonic()
    open_requests = conc
    for msg in stub.ModelStreamInfer(gen()):
        if msg.error_message:
            raise SystemExit(msg.error_message)
        if msg.infer_response.parameters["triton_final_response"].bool_param:
            open_requests -= 1
            if time.monotonic() < end:
                outbox.put(grpc_request(sent))
                sent += 1
                open_requests += 1
            elif open_requests == 0:
                outbox.put(None)
        else:
            count += 1
    elapsed = time.monotonic() - start
    channel.close()
    return count / elapsed


def sse_round():
    u = urllib.parse.urlparse(http_url)
    body = json.dumps({"IN": list(range(elements)), "DELAY": [0] * elements, "WAIT": 0})
    counts = [0] * conc
    end = time.monotonic() + seconds

    def worker(k):
        c = http.client.HTTPConnection(u.hostname, u.port)
        while time.monotonic() < end:
            c.request("POST", "/v2/models/repeat_int32/generate_stream", body,
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            n = r.read().count(b"data: ")
            if r.status != 200 or n != elements:
                raise SystemExit(f"status {r.status}, {n} events")
            counts[k] += n
        c.close()

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def server_cpu_s():
    fields = open(f"/proc/{server_pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(round_fn):
    """(responses/s, server CPU microseconds per response)."""
    cpu0 = server_cpu_s()
    start = time.monotonic()
    rate = round_fn()
    elapsed = time.monotonic() - start
    return rate, (server_cpu_s() - cpu0) * 1e6 / (rate * elapsed)


rate_ratios, cpu_ratios = [], []
for r in range(rounds):
    g, g_us = measured(grpc_round)
    s, s_us = measured(sse_round)
    rate_ratios.append(g / s)
    cpu_ratios.append(g_us / s_us)
    print(f"round {r + 1}: gRPC stream {g:,.0f} responses/s ({g_us:.1f} us server CPU each), "
          f"SSE {s:,.0f} responses/s ({s_us:.1f} us)")
print(f"repeat, {elements} responses per request, c={conc}: gRPC stream / SSE responses/s "
      f"{statistics.median(rate_ratios):.3f}, server CPU per response gRPC / SSE "
      f"{statistics.median(cpu_ratios):.3f}")
