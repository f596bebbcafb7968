#!/usr/bin/python3
"""Load/unload soak: an ONNX model is loaded and unloaded N times (default 10,000) and a
PyTorch model every fifth cycle (2,000) through the repository API (model-control-mode
explicit), under concurrent inference traffic on a model that stays loaded and on the cycled
ones, with SageMaker multi-model churn, gRPC and metadata readers beside it.

Each cycle: POST /v2/repository/models/churn/load, one inference on it (answer checked against
numpy), POST .../unload; every fifth cycle the same for the TorchScript model churn_pt. The
server's RSS and descriptors are sampled once per cycle, at the same point (after the unloads),
so the churned models' own memory is never in a sample.

Growth is a least-squares line through every sample (RSS against cycle number), projected as %
per 1,000 cycles and over the whole run, relative to the RSS after the first 200 cycles (the
median of the samples around cycle 200); the last samples' median is compared with it too.

Traffic (another process, so the cycle driver is not starved of the GIL): HTTP binary and JSON
on `simple` (checked against numpy), gRPC on it, inference on the cycled models (200 with a
correct answer, or 404/503 while unloaded: nothing else), readers of metadata, statistics and
the repository index, and a SageMaker model loaded (POST /models) and deleted every 2 s while a
client invokes it.

Pass: 0 unexpected failures, fitted growth over the run and end-vs-cycle-200 growth both under
--bound (2%), no descriptor growth. The last line is `soak: PASS ...` or `soak: FAIL ...`.

    /usr/bin/python3 bench/soak.py                 # 10,000 + 2,000 cycles
    /usr/bin/python3 bench/soak.py --smoke         # 60 cycles: checks that it runs, no verdict
    /usr/bin/python3 bench/soak.py --csv rss.csv   # also writes cycle,seconds,rss_kib,fds
"""

import argparse
import multiprocessing as mp
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

MLP_IN, MLP_HIDDEN = 16, 512  # churn: 16 -> 512 -> 16 (about 64 KiB of weights)


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


def server_pid(pid):
    """The inferd process: `pid` itself, or its descendant when --binary is a wrapper (heaptrack)."""
    todo = [pid]
    while todo:
        p = todo.pop(0)
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == "inferd":
                return p
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return pid


def mlp_weights():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((MLP_IN, MLP_HIDDEN)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((MLP_HIDDEN, MLP_IN)).astype(np.float32) * 0.1
    return w1, w2


def mlp_reference(x):
    w1, w2 = mlp_weights()
    return np.maximum(x @ w1, 0) @ w2


def write_models(repo, churn_extra=""):
    """churn (ONNX MLP) and churn_pt (TorchScript a+b, a*b), written here so the soak does not
    depend on the test-model generators' full sets."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w1, w2 = mlp_weights()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["OUTPUT0"])], "churn",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, MLP_IN])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, MLP_IN])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (repo / "churn" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "churn" / "1" / "model.onnx"))
    (repo / "churn" / "config.pbtxt").write_text(
        'name: "churn"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {MLP_IN} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {MLP_IN} ] }} ]\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n' + churn_extra)

    import torch

    class TwoIO(torch.nn.Module):
        def forward(self, a, b):
            return a + b, a * b

    (repo / "churn_pt" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(TwoIO()), str(repo / "churn_pt" / "1" / "model.pt"))
    (repo / "churn_pt" / "config.pbtxt").write_text(
        'name: "churn_pt"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = {}
        self.expected = {}
        self.failures = []
        self.failures_total = 0

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
                self.failures_total += 1

    def summary(self):
        with self.lock:
            return {"ok": dict(self.ok), "expected": dict(self.expected),
                    "failures": list(self.failures), "failures_total": self.failures_total}


def traffic(ports, work, mme_src, stop, conn):
    """The client process: runs every traffic thread until `stop` is set, then sends its
    counters back through `conn`."""
    http_port, grpc_port, sm_port = ports
    base = f"http://127.0.0.1:{http_port}"
    sm_base = f"http://127.0.0.1:{sm_port}"
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

    def infer_while_churned(kind, url, inputs, check, pause):
        """Inference on a model that comes and goes: 200 with the right answer, or 404/503."""
        s = requests.Session()
        while not stop.is_set():
            body, headers = build_request(inputs)
            try:
                r = s.post(url, data=body, headers=headers, timeout=30)
                if r.status_code == 200:
                    counters.add(kind, "ok" if check(parse_response(r)[1]) else "fail", "wrong answer")
                elif r.status_code in (404, 503):
                    counters.add(kind, "expected")
                else:
                    counters.add(kind, "fail", f"HTTP {r.status_code} {r.text[:200]}")
            except requests.RequestException as e:
                counters.add(kind, "fail", repr(e))
            time.sleep(pause)

    def mme_churner():
        s = requests.Session()
        loaded = False
        while not stop.wait(2.0):
            try:
                if loaded:
                    r = s.delete(f"{sm_base}/models/mme_churn", timeout=60)
                    kind = "mme-delete"
                else:
                    r = s.post(f"{sm_base}/models", json={"model_name": "mme_churn",
                                                          "url": str(mme_src)}, timeout=60)
                    kind = "mme-load"
                counters.add(kind, "ok" if r.status_code == 200 else "fail",
                             f"HTTP {r.status_code} {r.text[:200]}")
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

    xo = np.linspace(-1, 1, 2 * MLP_IN, dtype=np.float32).reshape(2, MLP_IN)
    xo_ref = mlp_reference(xo)
    pa = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
    pb_ = np.full((1, 4), 3, dtype=np.float32)
    xm = np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8)
    threads = [
        threading.Thread(target=http_simple, args=(True,)),
        threading.Thread(target=http_simple, args=(False,)),
        threading.Thread(target=infer_while_churned, args=(
            "churn-infer", base + "/v2/models/churn/infer",
            [make_input("INPUT0", xo, "FP32", binary=True)],
            lambda out: np.allclose(out["OUTPUT0"], xo_ref, atol=1e-5), 0)),
        threading.Thread(target=infer_while_churned, args=(
            "churn_pt-infer", base + "/v2/models/churn_pt/infer",
            [make_input("INPUT__0", pa, "FP32", binary=False),
             make_input("INPUT__1", pb_, "FP32", binary=False)],
            lambda out: np.allclose(out["OUTPUT__0"], pa + pb_) and np.allclose(out["OUTPUT__1"], pa * pb_),
            0.002)),
        threading.Thread(target=readers), threading.Thread(target=grpc_client),
        threading.Thread(target=mme_churner),
        threading.Thread(target=infer_while_churned, args=(
            "mme-invoke", f"{sm_base}/models/mme_churn/invoke",
            [make_input("INPUT0", xm, "FP32", binary=False)],
            lambda out: np.allclose(out["OUTPUT0"], xm), 0.002)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn.send(counters.summary())
    conn.close()


def fit(cycles, rss):
    """Least-squares line rss = slope * cycle + intercept over all the samples."""
    slope, intercept = np.polyfit(np.asarray(cycles, dtype=np.float64), np.asarray(rss, dtype=np.float64), 1)
    return float(slope), float(intercept)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=10000, help="ONNX load/unload cycles")
    ap.add_argument("--torch-every", type=int, default=5,
                    help="cycle the PyTorch model every Nth cycle (0: never)")
    ap.add_argument("--baseline-cycle", type=int, default=200)
    ap.add_argument("--bound", type=float, default=2.0, help="allowed growth, %%")
    ap.add_argument("--smoke", action="store_true", help="60 cycles, baseline at 20, no verdict on growth")
    ap.add_argument("--csv", help="write cycle,seconds,rss_kib,fds here")
    ap.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    ap.add_argument("--churn-config", default="", help="text appended to the ONNX model's config.pbtxt")
    ap.add_argument("--smaps", help="save the server's /proc/PID/smaps here at the baseline cycle and at the end")
    ap.add_argument("--sigkill", action="store_true",
                    help="end the server with SIGKILL (under heaptrack: what is live is reported as leaked)")
    ap.add_argument("--binary", default=str(Path(os.environ.get("BUILD_DIR", ROOT / "build")) / "inferd"))
    args = ap.parse_args()
    if args.smoke:
        args.cycles, args.baseline_cycle = 60, 20

    work = Path(tempfile.mkdtemp(prefix="inferd-soak-"))
    models = work / "models"
    subprocess.run([sys.executable, str(ROOT / "tests/models/gen_models.py"), "--test", str(models)],
                   check=True, stdout=subprocess.DEVNULL)
    repo = work / "repo"
    repo.mkdir()
    subprocess.run([sys.executable, str(ROOT / "tests/models/gen_models.py"), "--example",
                    str(ROOT / "examples/model_repository")], check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(ROOT / "examples/model_repository/simple", repo / "simple")
    write_models(repo, args.churn_config)
    mme_src = work / "mme_src" / "identity"
    shutil.copytree(models / "onnx_identity_fp32", mme_src)

    http_port, grpc_port, metrics_port, sm_port = free_port(), free_port(), free_port(), free_port()
    log = open(work / "server.log", "w")
    proc = subprocess.Popen([args.binary, f"--model-repository={repo}", "--model-control-mode=explicit",
                             "--load-model=simple", f"--http-port={http_port}",
                             f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
                             "--allow-sagemaker=true", f"--sagemaker-port={sm_port}",
                             f"--sagemaker-model-cache-dir={work / 'sm_cache'}"] + args.server_arg,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
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

    pid = server_pid(proc.pid)
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    client = ctx.Process(target=traffic, args=((http_port, grpc_port, sm_port), work, mme_src,
                                                 stop, child_conn))
    client.start()

    s = requests.Session()
    driver_failures = []
    torch_cycles = 0
    xo = np.linspace(-0.5, 0.5, MLP_IN, dtype=np.float32).reshape(1, MLP_IN)
    xo_ref = mlp_reference(xo)
    pa = np.arange(4, dtype=np.float32).reshape(1, 4)

    def cycle(model, inputs, check):
        for action in ("load", "infer", "unload"):
            try:
                if action == "infer":
                    body, headers = build_request(inputs)
                    r = s.post(f"{base}/v2/models/{model}/infer", data=body, headers=headers, timeout=60)
                    if r.status_code == 200 and not check(parse_response(r)[1]):
                        driver_failures.append(f"{model} infer: wrong answer")
                        continue
                else:
                    r = s.post(f"{base}/v2/repository/models/{model}/{action}", json={}, timeout=120)
                if r.status_code != 200:
                    driver_failures.append(f"{model} {action}: HTTP {r.status_code} {r.text[:200]}")
            except requests.RequestException as e:
                driver_failures.append(f"{model} {action}: {e!r}")

    # Cycle 0, not sampled: the first load of each backend maps its runtime for good (LibTorch's
    # module alone is about 150 MiB), a one-time cost, not growth.
    cycle("churn", [make_input("INPUT0", xo, "FP32", binary=True)],
          lambda out: np.allclose(out["OUTPUT0"], xo_ref, atol=1e-5))
    if args.torch_every:
        cycle("churn_pt", [make_input("INPUT__0", pa, "FP32", binary=True),
                           make_input("INPUT__1", pa, "FP32", binary=True)],
              lambda out: np.allclose(out["OUTPUT__0"], pa + pa) and np.allclose(out["OUTPUT__1"], pa * pa))
    samples = []  # (cycle, seconds, rss KiB, descriptors)
    start = time.monotonic()
    alive = True
    for i in range(1, args.cycles + 1):
        cycle("churn", [make_input("INPUT0", xo, "FP32", binary=True)],
              lambda out: np.allclose(out["OUTPUT0"], xo_ref, atol=1e-5))
        if args.torch_every and i % args.torch_every == 0:
            torch_cycles += 1
            cycle("churn_pt", [make_input("INPUT__0", pa, "FP32", binary=True),
                               make_input("INPUT__1", pa, "FP32", binary=True)],
                  lambda out: np.allclose(out["OUTPUT__0"], pa + pa) and np.allclose(out["OUTPUT__1"], pa * pa))
        if proc.poll() is not None:
            alive = False
            break
        samples.append((i, time.monotonic() - start, rss_kib(pid), fd_count(pid)))
        if args.smaps and i in (args.baseline_cycle, args.cycles):
            shutil.copyfile(f"/proc/{pid}/smaps", f"{args.smaps}.{i}")
        if i % 1000 == 0:
            print(f"  cycle {i}: {samples[-1][1]:.0f} s, RSS {samples[-1][2]} KiB, fds {samples[-1][3]}",
                  flush=True)
        if len(driver_failures) > 50:
            break
    elapsed = time.monotonic() - start
    stop.set()
    summary = parent_conn.recv() if parent_conn.poll(120) else {"ok": {}, "expected": {},
                                                               "failures": ["traffic: no summary"],
                                                               "failures_total": 1}
    client.join(timeout=60)
    alive = alive and proc.poll() is None
    if alive:
        os.kill(pid, 9 if args.sigkill else 15)
    proc.wait(timeout=120)

    if args.csv:
        with open(args.csv, "w") as f:
            f.write("cycle,seconds,rss_kib,fds\n")
            for c, t, r, d in samples:
                f.write(f"{c},{t:.2f},{r},{d}\n")

    failures = summary["failures_total"] + len(driver_failures)
    print(f"{len(samples)} ONNX cycles, {torch_cycles} PyTorch cycles in {elapsed:.0f} s")
    for kind in sorted(set(summary["ok"]) | set(summary["expected"])):
        print(f"  {kind:14s} ok {summary['ok'].get(kind, 0):8d}   expected 404/503 "
              f"{summary['expected'].get(kind, 0):6d}")
    print(f"  unexpected failures: {failures}")
    for f in (driver_failures[:20] + summary["failures"]):
        print(f"    {f}")
    ok = alive and failures == 0 and len(samples) >= 2
    growth_fit = growth_end = 0.0
    if len(samples) >= 2:
        cycles = [x[0] for x in samples]
        rss = [x[2] for x in samples]
        b = args.baseline_cycle
        near = [r for c, r in zip(cycles, rss) if abs(c - b) <= max(1, b // 10)] or rss[:1]
        rss_base = float(np.median(near))
        rss_end = float(np.median(rss[-max(1, min(50, len(rss) // 10)):]))
        slope, _ = fit(cycles, rss)
        span = cycles[-1] - b
        per_1000 = slope * 1000 / rss_base * 100
        growth_fit = slope * span / rss_base * 100
        growth_end = (rss_end - rss_base) / rss_base * 100
        after = [(c, r) for c, r in zip(cycles, rss) if c >= b]
        slope_after = fit([c for c, _ in after], [r for _, r in after])[0] if len(after) >= 2 else slope
        fd_base = [d for c, _, _, d in samples if c >= b][:1] or [samples[0][3]]
        fd_tail = min(x[3] for x in samples[-max(1, len(samples) // 4):])
        print(f"  RSS after {b} cycles {rss_base:.0f} KiB (median of cycles {b}±{max(1, b // 10)}), "
              f"after {cycles[-1]} {rss_end:.0f} KiB (median of the last samples): {growth_end:+.2f}%")
        print(f"  fitted slope (all {len(samples)} samples) {slope:+.3f} KiB/cycle = {per_1000:+.3f}% per "
              f"1,000 cycles, {growth_fit:+.2f}% over cycles {b}-{cycles[-1]}; "
              f"fitted from cycle {b} on: {slope_after:+.3f} KiB/cycle")
        lo, hi = min(rss), max(rss)
        print(f"  RSS range {lo}-{hi} KiB; descriptors at cycle {b} {fd_base[0]}, lowest over the "
              f"last quarter {fd_tail}")
        if not args.smoke:
            ok = ok and abs(growth_fit) < args.bound and growth_end < args.bound and fd_tail <= fd_base[0]
    if not alive:
        print((work / "server.log").read_text()[-3000:])
    verdict = "PASS" if ok else "FAIL"
    print(f"soak: {verdict}{' (smoke: growth not judged)' if args.smoke else ''} failures={failures} "
          f"cycles={len(samples)}+{torch_cycles}pt rss_fit={growth_fit:+.2f}% rss_end={growth_end:+.2f}%"
          f"{'' if alive else ' (server died)'}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
