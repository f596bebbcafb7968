#!/usr/bin/python3
"""Churn soak: mixed traffic for a while (default 10 minutes) while models are loaded and
unloaded every couple of seconds, in explicit mode and through the SageMaker multi-model API.

Clients: HTTP binary and JSON inference on a model that stays loaded (answers checked against
numpy), gRPC inference on it, inference on the model being churned (200 with a correct answer,
or 404/503 while it is unloaded: nothing else), and metadata / statistics / repository-index
readers; on the SageMaker port, a model loaded (POST /models) and deleted in turn while a client
invokes it (200 with a correct answer, or 404/503 while it is not loaded). The server's RSS and
open descriptors are sampled every second.

Pass: 0 unexpected failures, RSS growth after warm-up < 5%, no descriptor growth.
Prints a summary; the last line is `soak: PASS ...` or `soak: FAIL ...` (exit status 1).

    /usr/bin/python3 bench/soak.py --seconds 600
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from v2client import build_request, make_input, parse_response  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = {}
        self.expected = {}
        self.failures = []

    def add(self, kind, outcome, detail=""):
        with self.lock:
            if outcome == "ok":
                self.ok[kind] = self.ok.get(kind, 0) + 1
            elif outcome == "expected":
                self.expected[kind] = self.expected.get(kind, 0) + 1
            else:
                if len(self.failures) < 20:
                    self.failures.append(f"{kind}: {detail}")
                self.ok.setdefault(kind, 0)
                self.failures_total = getattr(self, "failures_total", 0) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--warmup-fraction", type=float, default=0.2)
    ap.add_argument("--churn-every", type=float, default=2.0)
    ap.add_argument("--binary", default=str(Path(os.environ.get("BUILD_DIR", ROOT / "build")) / "inferd"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="inferd-soak-"))
    models = work / "models"
    subprocess.run([sys.executable, str(ROOT / "tests/models/gen_models.py"), "--test", str(models)],
                   check=True, stdout=subprocess.DEVNULL)
    repo = work / "repo"
    repo.mkdir()
    subprocess.run([sys.executable, str(ROOT / "tests/models/gen_models.py"), "--example",
                    str(ROOT / "examples/model_repository")], check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(ROOT / "examples/model_repository/simple", repo / "simple")
    shutil.copytree(models / "onnx_identity_fp32", repo / "churn")
    (repo / "churn" / "config.pbtxt").write_text(
        (repo / "churn" / "config.pbtxt").read_text().replace("onnx_identity_fp32", "churn"))

    mme_src = work / "mme_src"
    shutil.copytree(models / "onnx_identity_fp32", mme_src / "identity")
    http_port, grpc_port, metrics_port, sm_port = free_port(), free_port(), free_port(), free_port()
    log = open(work / "server.log", "w")
    proc = subprocess.Popen([args.binary, f"--model-repository={repo}", "--model-control-mode=explicit",
                             "--load-model=simple", "--load-model=churn", f"--http-port={http_port}",
                             f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
                             "--allow-sagemaker=true", f"--sagemaker-port={sm_port}",
                             f"--sagemaker-model-cache-dir={work / 'sm_cache'}"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
    sm_base = f"http://127.0.0.1:{sm_port}"
    for _ in range(300):
        try:
            if requests.get(base + "/v2/health/ready", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.1)
    else:
        print((work / "server.log").read_text())
        raise SystemExit("soak: FAIL server did not become ready")

    stop = threading.Event()
    counters = Counters()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)

    def http_simple(binary):
        s = requests.Session()
        rng = np.random.default_rng(1 if binary else 2)
        kind = "http-binary" if binary else "http-json"
        while not stop.is_set():
            b = rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)
            body, headers = build_request([make_input("INPUT0", a, "INT32", binary=binary),
                                           make_input("INPUT1", b, "INT32", binary=binary)])
            try:
                r = s.post(base + "/v2/models/simple/infer", data=body, headers=headers, timeout=30)
                if r.status_code != 200:
                    counters.add(kind, "fail", f"HTTP {r.status_code} {r.text[:200]}")
                    continue
                out = parse_response(r)[1]
                if np.array_equal(out["OUTPUT0"], a + b) and np.array_equal(out["OUTPUT1"], a - b):
                    counters.add(kind, "ok")
                else:
                    counters.add(kind, "fail", "wrong answer")
            except requests.RequestException as e:
                counters.add(kind, "fail", repr(e))

    def infer_while_churned(kind, url, x, binary, pause):
        """Inference on a model that comes and goes: 200 with the right answer, or 404/503."""
        s = requests.Session()
        while not stop.is_set():
            body, headers = build_request([make_input("INPUT0", x, "FP32", binary=binary)])
            try:
                r = s.post(url, data=body, headers=headers, timeout=30)
                if r.status_code == 200:
                    ok = np.allclose(parse_response(r)[1]["OUTPUT0"], x)
                    counters.add(kind, "ok" if ok else "fail", "wrong answer")
                elif r.status_code in (404, 503):
                    counters.add(kind, "expected")
                else:
                    counters.add(kind, "fail", f"HTTP {r.status_code} {r.text[:200]}")
            except requests.RequestException as e:
                counters.add(kind, "fail", repr(e))
            time.sleep(pause)

    def churner():
        s = requests.Session()
        loaded = True
        while not stop.wait(args.churn_every):
            action = "unload" if loaded else "load"
            try:
                r = s.post(f"{base}/v2/repository/models/churn/{action}", json={}, timeout=60)
                counters.add("churn-" + action, "ok" if r.status_code == 200 else "fail",
                             f"HTTP {r.status_code} {r.text[:200]}")
                loaded = not loaded
            except requests.RequestException as e:
                counters.add("churn-" + action, "fail", repr(e))

    def mme_churner():
        s = requests.Session()
        loaded = False
        while not stop.wait(args.churn_every):
            try:
                if loaded:
                    r = s.delete(f"{sm_base}/models/mme_churn", timeout=60)
                    kind = "mme-delete"
                else:
                    r = s.post(f"{sm_base}/models", json={"model_name": "mme_churn",
                                                          "url": str(mme_src / "identity")}, timeout=60)
                    kind = "mme-load"
                counters.add(kind, "ok" if r.status_code == 200 else "fail", f"HTTP {r.status_code} {r.text[:200]}")
                loaded = not loaded
            except requests.RequestException as e:
                counters.add("mme-churn", "fail", repr(e))

    def readers():
        s = requests.Session()
        paths = [("get", "/v2/models/simple"), ("get", "/v2/models/simple/config"),
                 ("get", "/v2/models/stats"), ("post", "/v2/repository/index"),
                 ("get", "/v2/health/live")]
        i = 0
        while not stop.is_set():
            method, path = paths[i % len(paths)]
            i += 1
            try:
                r = s.get(base + path, timeout=30) if method == "get" else s.post(base + path, json={}, timeout=30)
                counters.add("readers", "ok" if r.status_code == 200 else "fail", f"{path} HTTP {r.status_code}")
            except requests.RequestException as e:
                counters.add("readers", "fail", repr(e))
            time.sleep(0.01)

    def grpc_client():
        try:
            import grpc
            out = work / "stubs"
            out.mkdir(exist_ok=True)
            subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'src/config'}",
                            f"-I{ROOT / 'src/frontends/grpc'}", f"--python_out={out}",
                            f"--grpc_python_out={out}", "grpc_service.proto", "model_config.proto"],
                           check=True)
            sys.path.insert(0, str(out))
            import grpc_service_pb2 as pb
            import grpc_service_pb2_grpc as pbg
        except Exception as e:  # noqa: BLE001
            counters.add("grpc", "fail", f"setup: {e!r}")
            return
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        stub = pbg.GRPCInferenceServiceStub(channel)
        b = np.full((1, 16), 7, dtype=np.int32)
        while not stop.is_set():
            req = pb.ModelInferRequest(model_name="simple")
            for name, arr in (("INPUT0", a), ("INPUT1", b)):
                req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
                req.raw_input_contents.append(arr.tobytes())
            try:
                resp = stub.ModelInfer(req, timeout=30)
                got = np.frombuffer(resp.raw_output_contents[0], dtype=np.int32).reshape(1, 16)
                counters.add("grpc", "ok" if np.array_equal(got, a + b) else "fail", "wrong answer")
            except grpc.RpcError as e:
                counters.add("grpc", "fail", f"{e.code()} {e.details()}")
        channel.close()

    threads = [threading.Thread(target=http_simple, args=(True,)),
               threading.Thread(target=http_simple, args=(False,)),
               threading.Thread(target=infer_while_churned, args=(
                   "churn-infer", base + "/v2/models/churn/infer",
                   np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8), True, 0)),
               threading.Thread(target=churner),
               threading.Thread(target=readers), threading.Thread(target=grpc_client),
               threading.Thread(target=mme_churner),
               threading.Thread(target=infer_while_churned, args=(
                   "mme-invoke", f"{sm_base}/models/mme_churn/invoke",
                   np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8), False, 0.002))]
    for t in threads:
        t.start()

    start = time.monotonic()
    warm_end = start + args.seconds * args.warmup_fraction
    samples = []
    while time.monotonic() - start < args.seconds:
        time.sleep(1)
        if proc.poll() is not None:
            break
        samples.append((time.monotonic(), rss_kib(proc.pid), fd_count(proc.pid)))
    stop.set()
    for t in threads:
        t.join()
    alive = proc.poll() is None
    proc.terminate()
    proc.wait(timeout=60)

    after_warm = [s for s in samples if s[0] >= warm_end] or samples
    rss_warm, fd_warm = after_warm[0][1], after_warm[0][2]
    rss_end, fd_end = samples[-1][1], samples[-1][2]
    # The end of the run is compared with the warm-up mark; descriptors are compared by their
    # lowest value over the last quarter (a request in flight holds one briefly).
    tail = samples[-max(1, len(samples) // 4):]
    fd_tail = min(s[2] for s in tail)
    growth = (rss_end - rss_warm) / rss_warm * 100 if rss_warm else 0.0
    failures = getattr(counters, "failures_total", 0)
    print(f"duration {args.seconds:.0f} s, churn every {args.churn_every} s")
    for kind in sorted(set(counters.ok) | set(counters.expected)):
        print(f"  {kind:14s} ok {counters.ok.get(kind, 0):8d}   expected 404/503 "
              f"{counters.expected.get(kind, 0):6d}")
    print(f"  unexpected failures: {failures}")
    for f in counters.failures:
        print(f"    {f}")
    print(f"  RSS after warm-up {rss_warm} KiB, at end {rss_end} KiB ({growth:+.2f}%)")
    # Where the RSS went: lowest and highest of each quarter after warm-up. A leak climbs
    # quarter by quarter; an allocator settling, or a sample taken while a churned model is
    # loaded, does not.
    q = max(1, len(after_warm) // 4)
    quarters = [after_warm[i:i + q] for i in range(0, len(after_warm), q)][:4]
    print("  RSS per quarter after warm-up (min-max KiB): " +
          ", ".join(f"{min(x[1] for x in part)}-{max(x[1] for x in part)}" for part in quarters))
    print(f"  descriptors after warm-up {fd_warm}, lowest over the last quarter {fd_tail}, at end {fd_end}")
    ok = alive and failures == 0 and growth < 5.0 and fd_tail <= fd_warm
    verdict = "PASS" if ok else "FAIL"
    if not alive:
        print((work / "server.log").read_text()[-3000:])
    print(f"soak: {verdict} failures={failures} rss_growth={growth:+.2f}% fds={fd_warm}->{fd_tail}"
          f"{'' if alive else ' (server died)'}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
