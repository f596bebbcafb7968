#!/usr/bin/python3
"""The memory budget under concurrent on-demand loads (issue 27).

    budget_concurrency.py [--bin build/inferd] [--models 20] [--fit 3] [--clients 8]
                          [--requests 40] [--delay-ms 50] [--smoke]

Generates --models ONNX models (OUTPUT0 = INPUT0 x W, W a 262144 x 16 FP32 matrix: 16 MiB of
weights each), measures one model's footprint on a server without a budget, then starts
`inferd --model-control-mode=on-demand --model-memory-budget=B` with B = (fit + 0.5) footprints
+ warm's (RSS accounting, the default) and runs --clients threads, each sending --requests requests to
models picked at random (seeded). Prints one line of JSON:

    peak_ratio   the server's peak RSS (VmHWM) / (budget + its RSS with nothing loaded)
    share_503    the share of answers that were 503 (share_507: 507)
    wrong        other answers, or 200 with wrong values

A tiny model, `warm`, is loaded at start (pinned) so that ONNX Runtime's one-time set-up is
not charged to the first model a client asks for; the budget holds it too, and the RSS "with
nothing loaded" is the RSS after start less its footprint.

Run it on the build before and after a change in the same conditions (one run each).
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
ROWS, COLS = 262144, 16


def make_model(path, seed):
    w = np.random.default_rng(seed).standard_normal((ROWS, COLS), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "W"], ["OUTPUT0"])], "matmul",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", ROWS])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", COLS])],
        initializer=[numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return w


def make_model_small(path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def http(url, body=None, timeout=300):
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if body is not None:
        req.add_header("Content-Type", "application/octet-stream")
        req.add_header("Inference-Header-Content-Length", str(len(body) - ROWS * 4))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


class Server:
    def __init__(self, binary, repo, args, log):
        self.port, self.metrics = free_port(), free_port()
        self.proc = subprocess.Popen(
            [binary, f"--model-repository={repo}", f"--http-port={self.port}",
             "--http-address=127.0.0.1", "--allow-grpc=false", f"--metrics-port={self.metrics}",
             "--metrics-address=127.0.0.1", *args], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if http(f"http://127.0.0.1:{self.port}/v2/health/live", timeout=2)[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def metric(self, pattern):
        text = http(f"http://127.0.0.1:{self.metrics}/metrics")[1].decode()
        m = re.search(r"(?m)^" + pattern + r" (\S+)", text)
        return float(m.group(1)) if m else None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def request_body(x):
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, ROWS], "datatype": "FP32",
                                     "parameters": {"binary_data_size": ROWS * 4}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]})
    return header.encode() + x.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "inferd"))
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--fit", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--delay-ms", type=int, default=50)
    ap.add_argument("--smoke", action="store_true", help="6 models, 2 clients, 5 requests each")
    args = ap.parse_args()
    if args.smoke:
        args.models, args.clients, args.requests = 6, 2, 5
    work = Path(tempfile.mkdtemp(prefix="inferd-budget-"))
    try:
        repo = work / "repo"
        weights = {}
        for i in range(args.models):
            name = f"w{i}"
            weights[name] = make_model(repo / name / "1" / "model.onnx", i)
            # A request stays in flight about --delay-ms (it waits for a batch that does not
            # come): the models clients use are busy, as under real traffic.
            (repo / name / "config.pbtxt").write_text(
                f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {ROWS} ] }} ]\n'
                f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {COLS} ] }} ]\n'
                f'dynamic_batching {{ preferred_batch_size: [ 8 ] '
                f'max_queue_delay_microseconds: {args.delay_ms * 1000} }}\n')
        x = np.random.default_rng(99).standard_normal((1, ROWS), dtype=np.float32)
        body = request_body(x)
        log = open(work / "server.log", "wb")

        # `warm`, a tiny model loaded at start (pinned), pays ONNX Runtime's one-time set-up,
        # which the store would otherwise charge to the first model a client asks for.
        warm = repo / "warm"
        make_model_small(warm / "1" / "model.onnx")
        (warm / "config.pbtxt").write_text(
            'name: "warm"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
        # One model's footprint, measured alone.
        start_args = ["--model-control-mode=on-demand", "--load-model=warm"]
        calib = Server(args.bin, repo, start_args + ["--model-memory-budget=100G"], log)
        assert http(f"http://127.0.0.1:{calib.port}/v2/models/w1/infer", body)[0] == 200
        footprint = calib.metric(r'inferd_model_memory_bytes\{model="w1",version="1"\}')
        warm_bytes = calib.metric(r'inferd_model_memory_bytes\{model="warm",version="1"\}')
        calib.stop()
        budget = int(footprint * (args.fit + 0.5) + warm_bytes)

        srv = Server(args.bin, repo, start_args + [f"--model-memory-budget={budget}"], log)
        # The server's RSS with nothing loaded: after start, less what `warm` is charged for.
        idle_kib = rss_kib(srv.proc.pid, "VmRSS") - warm_bytes / 1024
        counts = {"ok": 0, "503": 0, "507": 0, "wrong": 0}
        mu = threading.Lock()
        names = sorted(weights)

        def client(k):
            rng = random.Random(k)
            for _ in range(args.requests):
                name = rng.choice(names)
                status, data, _ = http(f"http://127.0.0.1:{srv.port}/v2/models/{name}/infer", body)
                with mu:
                    if status == 200:
                        out = np.array(json.loads(data)["outputs"][0]["data"], dtype=np.float32)
                        good = np.allclose(out, (x @ weights[name]).ravel(), rtol=1e-3, atol=1e-2)
                        counts["ok" if good else "wrong"] += 1
                    elif status in (503, 507):
                        counts[str(status)] += 1
                        print(f"{name}: HTTP {status} {data[:160]!r}", file=sys.stderr)
                    else:
                        counts["wrong"] += 1
                        print(f"{name}: HTTP {status} {data[:200]!r}", file=sys.stderr)

        # What the store accounts for (footprints + reservations) against the RSS, sampled.
        sampled = {"resident_max": 0.0, "unaccounted_max": 0.0}
        done = threading.Event()

        def sampler():
            while not done.is_set():
                resident = srv.metric(r"inferd_model_store_resident_bytes") or 0.0
                rss = rss_kib(srv.proc.pid, "VmRSS") * 1024
                sampled["resident_max"] = max(sampled["resident_max"], resident)
                sampled["unaccounted_max"] = max(sampled["unaccounted_max"],
                                                 rss - idle_kib * 1024 - resident)
                time.sleep(0.01)

        watcher = threading.Thread(target=sampler)
        watcher.start()
        start = time.monotonic()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - start
        done.set()
        watcher.join()
        peak_kib = rss_kib(srv.proc.pid, "VmHWM")
        loads = srv.metric(r'inferd_model_loads_total\{result="success"\}')
        srv.stop()
        total = sum(counts.values())
        print(json.dumps({
            "models": args.models, "clients": args.clients, "requests": total,
            "footprint_mib": round(footprint / 2**20, 1), "budget_mib": round(budget / 2**20, 1),
            "idle_rss_mib": round(idle_kib / 1024, 1), "peak_rss_mib": round(peak_kib / 1024, 1),
            "peak_ratio": round(peak_kib * 1024 / (budget + idle_kib * 1024), 3),
            "over_mib": round((peak_kib * 1024 - budget - idle_kib * 1024) / 2**20, 1),
            "accounted_max_mib": round(sampled["resident_max"] / 2**20, 1),
            "unaccounted_max_mib": round(sampled["unaccounted_max"] / 2**20, 1),
            "share_503": round(counts["503"] / total, 3),
            "share_507": round(counts["507"] / total, 3), "wrong": counts["wrong"],
            "loads": loads, "seconds": round(seconds, 1)}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
