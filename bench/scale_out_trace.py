#!/usr/bin/python3
"""Replays a skewed (Zipf) request trace over N copies of `simple` through a URL (the nginx
front, or one replica), one request at a time so that every load the servers do is caused by
exactly one request, and prints what the replicas' metrics counted.

    scale_out_trace.py --url http://127.0.0.1:8000 --metrics URL [--metrics URL ...]
        --models 30 --requests 5000 --zipf 1.0 --seed 1

Output (one JSON line): requests, failures, seconds, loads and evictions summed over the
replicas (inferd_model_loads_total{result="success"}, inferd_model_evictions_total), and per
replica: loads, evictions, models resident at the end (inferd_model_store_loaded_models).
"""

import argparse
import json
import re
import sys
import time

import numpy as np
import requests

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 2, dtype=np.int32)


def metric_sum(text, name):
    total = 0.0
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M):
        if name == "inferd_model_loads_total" and 'result="success"' not in (m.group(1) or ""):
            continue
        total += float(m.group(2))
    return total


def scrape(urls):
    out = []
    for u in urls:
        t = requests.get(u, timeout=30).text
        out.append(dict(loads=metric_sum(t, "inferd_model_loads_total"),
                        evictions=metric_sum(t, "inferd_model_evictions_total"),
                        resident=metric_sum(t, "inferd_model_store_loaded_models")))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--metrics", action="append", required=True)
    p.add_argument("--models", type=int, default=30)
    p.add_argument("--prefix", default="m")
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()

    # Model k (rank k+1) is asked with probability proportional to 1 / (k+1)^s.
    weights = 1.0 / np.arange(1, a.models + 1) ** a.zipf
    rng = np.random.default_rng(a.seed)
    trace = rng.choice(a.models, size=a.requests, p=weights / weights.sum())
    body = {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.reshape(-1).tolist()},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.reshape(-1).tolist()}]}
    payload = json.dumps(body)
    expected = (A + B).reshape(-1).tolist()

    before = scrape(a.metrics)
    s = requests.Session()
    failures = 0
    first_error = None
    t0 = time.monotonic()
    for k in trace:
        r = s.post(f"{a.url}/v2/models/{a.prefix}{k:02d}/infer", data=payload,
                   headers={"Content-Type": "application/json"}, timeout=120)
        ok = r.status_code == 200 and r.json()["outputs"][0]["data"] == expected
        if not ok:
            failures += 1
            first_error = first_error or f"{r.status_code} {r.text[:200]}"
    seconds = time.monotonic() - t0
    after = scrape(a.metrics)
    per = [dict(loads=x["loads"] - y["loads"], evictions=x["evictions"] - y["evictions"],
                resident=x["resident"]) for x, y in zip(after, before)]
    print(json.dumps(dict(requests=a.requests, failures=failures, first_error=first_error,
                          seconds=round(seconds, 2), loads=sum(x["loads"] for x in per),
                          evictions=sum(x["evictions"] for x in per), replicas=per)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
