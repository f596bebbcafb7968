"""Ensemble call vs the client chaining the two calls itself, measured in one run.

    ensemble_client.py <base url> <seconds per round> <concurrency> <jpeg>...

Mode "ensemble": one POST to image_classifier (JPEG in, top-5 classes out). Mode "chained":
POST the JPEG to image_preprocess, take the FP32 3x224x224 tensor back (binary), POST it to
resnet50, take the 1000 scores (classification top-5 applied by the server in both modes).
Rounds alternate ensemble / chained, two each; prints images/s and p50 per mode and the ratio.
"""
import json
import statistics
import sys
import threading
import time

import requests

HDR = "Inference-Header-Content-Length"


def post_binary(session, url, name, datatype, shape, raw, outputs):
    header = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": outputs}).encode()
    r = session.post(url, data=header + raw, headers={HDR: str(len(header)),
                                                      "Content-Type": "application/octet-stream"})
    if r.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {r.status_code} {r.text[:200]}")
    n = int(r.headers.get(HDR, len(r.content)))
    return json.loads(r.content[:n]), r.content[n:]


TOP5 = [{"name": "SCORES", "parameters": {"classification": 5}}]


def ensemble_call(s, base, jpeg):
    h, _ = post_binary(s, f"{base}/v2/models/image_classifier/infer", "IMAGE", "UINT8",
                       [1, len(jpeg)], jpeg, TOP5)
    return h["outputs"][0]["data"]


def chained_call(s, base, jpeg):
    h, tail = post_binary(s, f"{base}/v2/models/image_preprocess/infer", "IMAGE", "UINT8",
                          [1, len(jpeg)], jpeg,
                          [{"name": "PREPROCESSED", "parameters": {"binary_data": True}}])
    h, _ = post_binary(s, f"{base}/v2/models/resnet50/infer", "input", "FP32",
                       [1, 3, 224, 224], tail,
                       [{"name": "output", "parameters": {"classification": 5}}])
    return h["outputs"][0]["data"]


def run(fn, base, images, seconds, concurrency):
    lat, lock, stop = [], threading.Lock(), time.monotonic() + seconds

    def worker(k):
        s = requests.Session()
        i = k
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            fn(s, base, images[i % len(images)])
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
            i += concurrency

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(lat) / (time.monotonic() - t0), statistics.median(lat) * 1000


def main():
    base, seconds, conc = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    images = [open(p, "rb").read() for p in sys.argv[4:]]
    # Both modes find the same top-5 classes for the same image.
    a, b = ensemble_call(requests, base, images[0]), chained_call(requests, base, images[0])
    assert [x.split(":")[1] for x in a] == [x.split(":")[1] for x in b], (a, b)
    run(ensemble_call, base, images, min(2.0, seconds), conc)  # warm up
    res = {"ensemble": [], "chained": []}
    for _ in range(2):
        for mode, fn in (("ensemble", ensemble_call), ("chained", chained_call)):
            res[mode].append(run(fn, base, images, seconds, conc))
    for mode, rounds in res.items():
        print(f"c={conc} {mode}: " + ", ".join(f"{r:.1f} images/s (p50 {p:.1f} ms)" for r, p in rounds))
    e = statistics.median([r for r, _ in res["ensemble"]])
    c = statistics.median([r for r, _ in res["chained"]])
    print(f"c={conc} ensemble/chained throughput ratio: {e / c:.3f}")


if __name__ == "__main__":
    main()
