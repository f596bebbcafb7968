"""Streams repeat_int32 responses (one request = ELEMENTS responses) for SECONDS over gRPC
ModelStreamInfer (one stream, CONCURRENCY requests in flight) and over HTTP generate_stream
(server-sent events; CONCURRENCY connections), alternating rounds; prints responses/s of each
round and, last, the median ratio gRPC / SSE.

usage: decoupled_client.py <http_url> <grpc_addr> <stubs_dir> <seconds> <concurrency> <elements> <rounds>
"""
import http.client
import json
import queue
import statistics
import sys
import threading
import time
import urllib.parse

import numpy as np

http_url, grpc_addr, stubs, seconds, conc, elements, rounds = sys.argv[1:8]
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


ratios = []
for r in range(rounds):
    g = grpc_round()
    s = sse_round()
    ratios.append(g / s)
    print(f"round {r + 1}: gRPC stream {g:,.0f} responses/s, SSE {s:,.0f} responses/s, "
          f"ratio {g / s:.3f}")
print(f"gRPC stream / SSE responses/s (repeat, {elements} responses per request, c={conc}): "
      f"{statistics.median(ratios):.3f}")
