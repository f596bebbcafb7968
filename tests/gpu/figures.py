#!/usr/bin/env python3
"""The figures of issue 29 on a GPU machine, for tests/gpu/check.sh (one run, name the GPU).

  figures.py <models folder (make_models.py's)> <work folder>

Environment (check.sh sets it): INFERD_BIN, INFERD_PERF_BIN, ORT_INPROCESS_BIN (wrappers with
the bundle's library path), INFERD_ORT_CUDA_EP_LIBRARY. Prints `FIGURE <name> <value>` lines,
which check.sh puts in its summary, and the raw numbers each comes from:

  onnx_b1_p50_ratio     ResNet-50 ONNX, batch 1, concurrency 1: inferd's p50 (inferd-perf, HTTP
                        binary tensors, loopback) / ONNX Runtime's p50 in-process on the CUDA
                        execution provider (bench ort_inprocess CUDA_EP=, same provider library,
                        host input copied by each run as in inferd). Goal <= 1.05.
  onnx_c16_ratio        inferd at concurrency 16 with dynamic batching (items/s) / the best
                        in-process items/s over batches 1, 8, 16, 32. Goal >= 0.95.
  torch_b1_p50_ratio,   the same for TorchScript ResNet-50 against torch.jit in-process
  torch_c16_ratio       (torch_inprocess.py: pinned input, non-blocking copies, one sync).
  gpu_cpu_images_ratio  ResNet-50 ONNX images/s through inferd at concurrency 16, the GPU model
                        over the same model on KIND_CPU (16 cores).
  cuda_shm_b1_p50_ratio ResNet-50 ONNX on the CUDA provider, batch 1, concurrency 1: p50 with the
                        input in a CUDA shared-memory region (bound on the GPU, no host copy) /
                        p50 with the input in the request body (HTTP binary tensor), the same
                        Python client, 300 requests each after 30 to warm up (issue 30).
  mem_loaded_mib, mem_unloaded_mib   nvidia-smi's memory of inferd's process after loading
                        both GPU ResNet-50 models and after unloading them.
  image_classifier_gpu_cpu_preprocess_ratio   image_classifier (one 640x480 JPEG in, scores out)
                        images/s at concurrency 16 with its preprocessing (backend "image",
                        decode on the CPU either way) on the GPU over on the CPU, the classifier
                        the same GPU ResNet-50 (make_models.py's image_classifier_{gpu,cpu});
                        issue 30. Computed last, after the others are printed.
A step that fails prints why and the others go on; exit status 1 when any failed.
"""

import csv
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

MODELS = Path(sys.argv[1])
WORK = Path(sys.argv[2])
INFERD = os.environ["INFERD_BIN"]
PERF = os.environ["INFERD_PERF_BIN"]
ORT_INPROCESS = os.environ["ORT_INPROCESS_BIN"]
EP = os.environ.get("INFERD_ORT_CUDA_EP_LIBRARY", "")
HERE = Path(__file__).resolve().parent
failed = []


def figure(name, value, detail=""):
    print(f"FIGURE {name} {value}" + (f"  ({detail})" if detail else ""), flush=True)


def run(args, timeout, env=None):
    print("$", " ".join(map(str, args)), flush=True)
    p = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                       env=env)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr[-2000:]}{p.stdout[-2000:]}")
    return p.stdout


def link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_inferd(names, extra=()):
    repo = WORK / "figures_repo"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    for n in names:
        shutil.copytree(MODELS / n, repo / n, copy_function=link_or_copy)
    port = free_port()
    log = open(WORK / "figures_inferd.log", "ab")
    proc = subprocess.Popen([INFERD, f"--model-repository={repo}", f"--http-port={port}",
                             "--http-address=127.0.0.1", "--allow-grpc=false",
                             "--allow-metrics=false", *extra], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"inferd exited with {proc.returncode} (figures_inferd.log)")
        try:
            if requests.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return proc, port
        except requests.RequestException:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("inferd not ready after 240 s (figures_inferd.log)")


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def perf(model, port, concurrency, interval_ms=3000, extra=()):
    """(p50 ms, items/s) from inferd-perf at one concurrency, batch 1."""
    out_csv = WORK / f"perf_{model}_c{concurrency}.csv"
    run([PERF, "-m", model, "-u", f"127.0.0.1:{port}", "-b", "1",
         "--concurrency-range", f"{concurrency}:{concurrency}:1",
         "--measurement-interval", str(interval_ms), "--max-trials", "4",
         "--warmup-request-count", str(20 * concurrency), "-f", out_csv, *extra], timeout=120)
    row = list(csv.DictReader(open(out_csv)))[0]
    return float(row["p50 latency"]) / 1000.0, float(row["Inferences/Second"])


def gpu_mem_mib(pid):
    """nvidia-smi's MiB for process `pid`, else (no pids listed, as in some containers) the
    whole GPU's used memory, said so."""
    out = run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
               "--format=csv,noheader,nounits"], timeout=30)
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1]), "inferd's process"
    out = run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
              timeout=30)
    return float(out.splitlines()[0]), "whole GPU"


def attempt(what, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (each figure on its own)
        print(f"FAILED {what}: {e}", flush=True)
        failed.append(what)


results = {}


def inferd_gpu():
    gpu_models = ["resnet50_onnx_gpu", "resnet50_torch_gpu"]
    # Explicit mode: the repository API's unload (refused in the default mode, as Triton's).
    proc, port = start_inferd(gpu_models, ["--model-control-mode=explicit"]
                              + [f"--load-model={m}" for m in gpu_models])
    try:
        results["mem_loaded"] = gpu_mem_mib(proc.pid)
        for name in ("resnet50_onnx_gpu", "resnet50_torch_gpu"):
            p50, _ = perf(name, port, 1)
            _, rate = perf(name, port, 16)
            results[name] = (p50, rate)
            print(f"inferd {name}: c=1 p50 {p50:.3f} ms; c=16 {rate:.1f} images/s", flush=True)
        for name in ("resnet50_onnx_gpu", "resnet50_torch_gpu"):
            requests.post(f"http://127.0.0.1:{port}/v2/repository/models/{name}/unload",
                          timeout=120)
        deadline = time.monotonic() + 60  # unloading finishes after its reply
        while time.monotonic() < deadline:
            index = requests.post(f"http://127.0.0.1:{port}/v2/repository/index", json={},
                                  timeout=10).json()
            if not any(e.get("state") == "READY" for e in index):
                break
            time.sleep(0.5)
        time.sleep(2)
        results["mem_unloaded"] = gpu_mem_mib(proc.pid)
        figure("mem_loaded_mib", f"{results['mem_loaded'][0]:.0f}",
               f"{results['mem_loaded'][1]}, both GPU ResNet-50s loaded")
        figure("mem_unloaded_mib", f"{results['mem_unloaded'][0]:.0f}",
               f"{results['mem_unloaded'][1]}, after unloading them")
    finally:
        stop(proc)


def inferd_cpu():
    proc, port = start_inferd(["resnet50_onnx_cpu"])
    try:
        _, rate = perf("resnet50_onnx_cpu", port, 16, interval_ms=5000)
        results["resnet50_onnx_cpu"] = rate
        print(f"inferd resnet50_onnx_cpu: c=16 {rate:.1f} images/s", flush=True)
    finally:
        stop(proc)


def cuda_shm_p50():
    sys.path.insert(0, str(HERE))
    import cuda_ipc
    import numpy as np
    if cuda_ipc.available():
        raise RuntimeError(cuda_ipc.available())
    proc, port = start_inferd(["resnet50_onnx_gpu"])
    url = f"http://127.0.0.1:{port}/v2/models/resnet50_onnx_gpu/infer"
    session = requests.Session()
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224), dtype=np.float32)
    reg = cuda_ipc.DeviceRegion(x.nbytes)
    try:
        reg.write(0, x)
        import base64
        r = session.post(f"http://127.0.0.1:{port}/v2/cudasharedmemory/region/in/register",
                         json={"raw_handle": {"b64": base64.b64encode(reg.handle).decode()},
                               "device_id": 0, "byte_size": x.nbytes}, timeout=30)
        if r.status_code != 200:
            raise RuntimeError(f"register: {r.status_code} {r.text}")
        shm_body = ('{"inputs":[{"name":"input","datatype":"FP32","shape":[1,3,224,224],'
                    '"parameters":{"shared_memory_region":"in","shared_memory_byte_size":'
                    f'{x.nbytes}}}}}],"outputs":[{{"name":"output","parameters":'
                    '{"binary_data":true}}]}').encode()
        header = ('{"inputs":[{"name":"input","datatype":"FP32","shape":[1,3,224,224],'
                  f'"parameters":{{"binary_data_size":{x.nbytes}}}}}],"outputs":'
                  '[{"name":"output","parameters":{"binary_data":true}}]}').encode()
        body = header + x.tobytes()

        def p50(data, headers):
            times = []
            for i in range(330):
                t0 = time.perf_counter()
                resp = session.post(url, data=data, headers=headers, timeout=30)
                t1 = time.perf_counter()
                if resp.status_code != 200:
                    raise RuntimeError(f"infer: {resp.status_code} {resp.text[:300]}")
                if i >= 30:
                    times.append((t1 - t0) * 1000)
            return float(np.median(times))
        in_body = p50(body, {"Inference-Header-Content-Length": str(len(header)),
                             "Content-Type": "application/octet-stream"})
        in_region = p50(shm_body, {"Content-Type": "application/json"})
        in_body_again = p50(body, {"Inference-Header-Content-Length": str(len(header)),
                                   "Content-Type": "application/octet-stream"})
        base = min(in_body, in_body_again)
        print(f"resnet50_onnx_gpu c=1 p50: input in body {in_body:.3f} / {in_body_again:.3f} ms, "
              f"in CUDA shm {in_region:.3f} ms", flush=True)
        figure("cuda_shm_b1_p50_ratio", f"{in_region / base:.3f}",
               f"CUDA shm {in_region:.3f} ms / body {base:.3f} ms (the better of two runs)")
    finally:
        reg.free()
        stop(proc)


def ort_inprocess():
    model = MODELS / "resnet50_onnx_gpu" / "1" / "model.onnx"
    env = dict(os.environ, CUDA_EP=EP)
    best = 0.0
    for batch, iters in ((1, 300), (8, 60), (16, 40), (32, 20)):
        out = run([ORT_INPROCESS, model, "input", iters, batch, 3, 224, 224], timeout=120, env=env)
        p50 = float(re.search(r"p50_ms ([\d.]+)", out).group(1))
        rate = float(re.search(r"items_per_s ([\d.]+)", out).group(1))
        print(f"ort in-process CUDA batch {batch}: p50 {p50:.3f} ms, {rate:.1f} images/s",
              flush=True)
        if batch == 1:
            results["ort_b1_p50"] = p50
        best = max(best, rate)
    results["ort_best"] = best


def torch_inprocess():
    model = MODELS / "resnet50_torch_gpu" / "1" / "model.pt"
    out = run([sys.executable, HERE / "torch_inprocess.py", model, 100, 1, 8, 16, 32], timeout=180)
    best = 0.0
    for m in re.finditer(r"batch (\d+) p50_ms ([\d.]+) items_per_s ([\d.]+)", out):
        batch, p50, rate = int(m.group(1)), float(m.group(2)), float(m.group(3))
        print(f"torch in-process CUDA batch {batch}: p50 {p50:.3f} ms, {rate:.1f} images/s",
              flush=True)
        if batch == 1:
            results["torch_b1_p50"] = p50
        best = max(best, rate)
    results["torch_best"] = best


attempt("inferd on the GPU", inferd_gpu)
attempt("ONNX Runtime in-process", ort_inprocess)
attempt("torch in-process", torch_inprocess)
attempt("inferd on the CPU", inferd_cpu)
attempt("CUDA shared memory p50", cuda_shm_p50)

r = results
if "resnet50_onnx_gpu" in r and "ort_b1_p50" in r:
    figure("onnx_b1_p50_ratio", f"{r['resnet50_onnx_gpu'][0] / r['ort_b1_p50']:.3f}",
           f"inferd {r['resnet50_onnx_gpu'][0]:.3f} ms / in-process {r['ort_b1_p50']:.3f} ms; goal <= 1.05")
if "resnet50_onnx_gpu" in r and "ort_best" in r:
    figure("onnx_c16_ratio", f"{r['resnet50_onnx_gpu'][1] / r['ort_best']:.3f}",
           f"inferd {r['resnet50_onnx_gpu'][1]:.1f} / best in-process {r['ort_best']:.1f} images/s; goal >= 0.95")
if "resnet50_torch_gpu" in r and "torch_b1_p50" in r:
    figure("torch_b1_p50_ratio", f"{r['resnet50_torch_gpu'][0] / r['torch_b1_p50']:.3f}",
           f"inferd {r['resnet50_torch_gpu'][0]:.3f} ms / in-process {r['torch_b1_p50']:.3f} ms; goal <= 1.05")
if "resnet50_torch_gpu" in r and "torch_best" in r:
    figure("torch_c16_ratio", f"{r['resnet50_torch_gpu'][1] / r['torch_best']:.3f}",
           f"inferd {r['resnet50_torch_gpu'][1]:.1f} / best in-process {r['torch_best']:.1f} images/s; goal >= 0.95")
if "resnet50_onnx_gpu" in r and r.get("resnet50_onnx_cpu"):
    figure("gpu_cpu_images_ratio", f"{r['resnet50_onnx_gpu'][1] / r['resnet50_onnx_cpu']:.1f}",
           f"{r['resnet50_onnx_gpu'][1]:.1f} / {r['resnet50_onnx_cpu']:.1f} images/s at c=16")


def image_classifier():
    """image_classifier images/s, preprocessing on the GPU / on the CPU (same GPU classifier)."""
    from PIL import Image
    import json
    import numpy as np

    rng = np.random.default_rng(30)
    yy, xx = np.mgrid[0:480, 0:640]
    pixels = np.stack([xx * 255 // 639, yy * 255 // 479, ((xx + yy) * 3) % 256], -1)
    pixels = np.clip(pixels + rng.normal(0, 20, pixels.shape), 0, 255).astype(np.uint8)
    jpeg = WORK / "figure_image.jpg"
    Image.fromarray(pixels, "RGB").save(jpeg, "JPEG", quality=90)
    data = jpeg.read_bytes()
    input_data = WORK / "figure_image.json"
    input_data.write_text(json.dumps(
        {"data": [{"IMAGE": {"content": list(data), "shape": [len(data)]}}]}))
    names = ["resnet50_onnx_gpu", "image_preprocess_gpu", "image_preprocess_cpu",
             "image_classifier_gpu", "image_classifier_cpu"]
    proc, port = start_inferd(names)
    try:
        rates = {}
        for name in ("image_classifier_gpu", "image_classifier_cpu"):
            _, rates[name] = perf(name, port, 16, extra=["--input-data", input_data])
            print(f"inferd {name}: c=16 {rates[name]:.1f} images/s ({len(data)}-byte 640x480 "
                  f"JPEG)", flush=True)
    finally:
        stop(proc)
    figure("image_classifier_gpu_cpu_preprocess_ratio",
           f"{rates['image_classifier_gpu'] / rates['image_classifier_cpu']:.3f}",
           f"{rates['image_classifier_gpu']:.1f} / {rates['image_classifier_cpu']:.1f} images/s "
           f"at c=16, preprocessing on the GPU / on the CPU, same GPU ResNet-50")


attempt("image_classifier, preprocessing on the GPU and on the CPU", image_classifier)
sys.exit(1 if failed else 0)
