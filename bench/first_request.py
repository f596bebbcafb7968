#!/usr/bin/python3
"""The client side of bench/first_request.sh.

    first_request.py upload S3_URL PREFIX N MODEL_DIR
        PUTs N copies of MODEL_DIR (config.pbtxt with its name changed to m<i>, 1/model.onnx)
        as PREFIX/m<i>/... (s3rver takes unsigned payloads).
    first_request.py pass HTTP_URL N OUT.json [--hand S3_URL PREFIX WORKDIR]
        For each model m0 .. m<N-1> in turn, over one keep-alive connection: a first request
        (the server loads the model on demand), then a second one (warm), each checked against
        numpy; with --hand, then the same S3 steps the server's fetch does, by hand over one
        keep-alive connection to S3: ListObjectsV2 of PREFIX/m<i>/, then GET of both objects
        into WORKDIR. Writes the latencies in seconds to OUT.json.
    first_request.py report SERVER_LOG OUT.json [--hand-from OUT1.json]
        Prints the summary of one pass: percentiles, first / warm, and first / the same steps
        by hand (the S3 steps timed above + the load time the server logged for that model +
        the warm request).

KServe v2 JSON over HTTP: INT32 [1,16] INPUT0 and INPUT1; the `simple` model answers
OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1.
"""

import http.client
import json
import os
import re
import sys
import time
import urllib.parse
import xml.etree.ElementTree as ET

import numpy as np


def connect(url):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def upload(s3_url, prefix, n, model_dir):
    config = open(os.path.join(model_dir, "config.pbtxt")).read()
    onnx = open(os.path.join(model_dir, "1", "model.onnx"), "rb").read()
    conn = connect(s3_url)
    headers = {"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    for i in range(n):
        named = re.sub(r'^name: ".*"$', f'name: "m{i}"', config, count=1, flags=re.M)
        for key, body in ((f"m{i}/config.pbtxt", named.encode()), (f"m{i}/1/model.onnx", onnx)):
            conn.request("PUT", f"/models/{prefix}/{key}", body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                sys.exit(f"PUT {key}: HTTP {r.status}")


def infer(conn, model, a, b):
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()},
    ]})
    t0 = time.perf_counter()
    conn.request("POST", f"/v2/models/{model}/infer", body=body,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    elapsed = time.perf_counter() - t0
    if r.status != 200:
        sys.exit(f"{model}: HTTP {r.status}: {data[:300]!r}")
    outs = {o["name"]: np.array(o["data"], dtype=np.int64).reshape(o["shape"])
            for o in json.loads(data)["outputs"]}
    if not (np.array_equal(outs["OUTPUT0"], a + b) and np.array_equal(outs["OUTPUT1"], a - b)):
        sys.exit(f"{model}: wrong answer {outs}")
    return elapsed


def by_hand(s3, prefix, model, workdir):
    """ListObjectsV2 of the model's folder, then GET of every object into workdir."""
    t0 = time.perf_counter()
    q = urllib.parse.urlencode({"list-type": "2", "prefix": f"{prefix}/{model}/"})
    s3.request("GET", f"/models?{q}")
    r = s3.getresponse()
    listing = r.read()
    if r.status != 200:
        sys.exit(f"list {model}: HTTP {r.status}")
    # Any namespace: AWS's is s3.amazonaws.com/doc/..., s3rver's doc.s3.amazonaws.com/...
    keys = [k.text for k in ET.fromstring(listing).iter() if k.tag.endswith("}Key") or k.tag == "Key"]
    listed = time.perf_counter() - t0
    if len(keys) != 2:
        sys.exit(f"list {model}: {keys}")
    for key in keys:
        s3.request("GET", "/models/" + urllib.parse.quote(key))
        r = s3.getresponse()
        body = r.read()
        if r.status != 200:
            sys.exit(f"GET {key}: HTTP {r.status}")
        path = os.path.join(workdir, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(body)
    return listed, time.perf_counter() - t0


def run_pass(http_url, n, out, hand):
    rng = np.random.default_rng(0)
    conn = connect(http_url)
    s3 = connect(hand[0]) if hand else None
    rows = []
    for i in range(n):
        model = f"m{i}"
        a = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
        b = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
        row = {"model": model, "first": infer(conn, model, a, b), "warm": infer(conn, model, b, a)}
        if hand:
            row["hand_list"], row["hand_fetch"] = by_hand(s3, hand[1], model, hand[2])
        rows.append(row)
    json.dump(rows, open(out, "w"))


def pct(values, p):
    return float(np.percentile(np.array(values) * 1e3, p, method="nearest"))


def report(log, out, hand_from):
    rows = json.load(open(out))
    loads = {m: float(s) for m, s in
             re.findall(r"loaded model '([^']+)' in ([0-9.e+-]+) s", open(log).read())}
    missing = [r["model"] for r in rows if r["model"] not in loads]
    if missing:
        sys.exit(f"no load time logged for {missing[:5]}")
    first = [r["first"] for r in rows]
    warm = [r["warm"] for r in rows]
    load = [loads[r["model"]] for r in rows]
    print(f"  first request: p50 {pct(first, 50):.2f} ms, p90 {pct(first, 90):.2f} ms, "
          f"p99 {pct(first, 99):.2f} ms, max {pct(first, 100):.2f} ms ({len(rows)} models)")
    print(f"  warm request (the second one, same model): p50 {pct(warm, 50):.3f} ms; "
          f"first / warm (p50s): {pct(first, 50) / pct(warm, 50):.1f}")
    print(f"  load logged by the server (fetch excluded): p50 {pct(load, 50):.2f} ms")
    hand = json.load(open(hand_from)) if hand_from else rows
    by_model = {r["model"]: r for r in hand}
    # The same steps by hand: what this pass's fetch does against S3 (pass 1: list + both GETs;
    # from the cache: the list only), the server's own load, and a request to a loaded model.
    key = "hand_list" if hand_from else "hand_fetch"
    s3 = [by_model[r["model"]][key] for r in rows]
    ref = [s + l + w for s, l, w in zip(s3, load, warm)]
    ratios = [f / r for f, r in zip(first, ref)]
    what = "ListObjectsV2" if hand_from else "ListObjectsV2 + 2 GETs"
    print(f"  by hand: {what} p50 {pct(s3, 50):.2f} ms; + logged load + warm request: "
          f"p50 {pct(ref, 50):.2f} ms")
    print(f"  first request / the same steps by hand, per model: p50 {np.median(ratios):.3f} "
          f"(p90 {np.percentile(ratios, 90):.3f}); overhead p50 "
          f"{np.median([(f - r) * 1e3 for f, r in zip(first, ref)]):.2f} ms")
    print(f"RESULT p50_first_ms={pct(first, 50):.3f} p90_first_ms={pct(first, 90):.3f} "
          f"p99_first_ms={pct(first, 99):.3f} p50_warm_ms={pct(warm, 50):.4f} "
          f"first_over_warm={pct(first, 50) / pct(warm, 50):.2f} "
          f"first_over_hand={np.median(ratios):.3f}")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "upload":
        upload(args[0], args[1], int(args[2]), args[3])
    elif cmd == "pass":
        hand = None
        if "--hand" in args:
            k = args.index("--hand")
            hand = args[k + 1:k + 4]
            args = args[:k]
        run_pass(args[0], int(args[1]), args[2], hand)
    elif cmd == "report":
        hand_from = None
        if "--hand-from" in args:
            hand_from = args[args.index("--hand-from") + 1]
        report(args[0], args[1], hand_from)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
