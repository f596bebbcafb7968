"""Silero VAD v5 chunk latency: through the sequence batcher (state kept by the server) vs the
same model served stateless with the state round-tripped by the client, same server, same run,
binary tensor extension both ways, alternating rounds.

usage: sequence_vad_client.py URL CHUNKS CLIENTS ROUNDS
Prints one line per round and a last line with the median ratios."""

import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests" / "models"))
from v2client import build_request, make_input, parse_response  # noqa: E402
import gen_sequence_models as gen  # noqa: E402

url, chunks, clients, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
SR = np.array([16000], dtype=np.int64)
BIN_OUT = [{"name": "output", "parameters": {"binary_data": True}}]


def stateful(k, base, lat):
    s = requests.Session()
    audio = gen.vad_audio(chunks, seed=k)
    for i in range(chunks):
        params = {"sequence_id": base + k, "sequence_start": i == 0, "sequence_end": i == chunks - 1}
        body, headers = build_request([make_input("input", audio[i], "FP32", binary=True),
                                       make_input("sr", SR, "INT64", binary=True)], BIN_OUT,
                                      parameters=params)
        t = time.perf_counter()
        r = s.post(f"{url}/v2/models/vad_seq/infer", data=body, headers=headers)
        lat.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text
        parse_response(r)


def stateless(k, base, lat):
    s = requests.Session()
    audio = gen.vad_audio(chunks, seed=k)
    state = np.zeros((2, 1, 128), dtype=np.float32)
    outs = BIN_OUT + [{"name": "stateN", "parameters": {"binary_data": True}}]
    for i in range(chunks):
        body, headers = build_request([make_input("input", audio[i], "FP32", binary=True),
                                       make_input("state", state, "FP32", binary=True),
                                       make_input("sr", SR, "INT64", binary=True)], outs)
        t = time.perf_counter()
        r = s.post(f"{url}/v2/models/vad_plain/infer", data=body, headers=headers)
        lat.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text
        state = parse_response(r)[1]["stateN"]


def run(fn, base):
    lat = []
    threads = [threading.Thread(target=fn, args=(k, base, lat)) for k in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    return statistics.median(lat) * 1e3, clients * chunks / wall


p50_ratio, rate_ratio = [], []
for rnd in range(rounds):
    seq_p50, seq_rate = run(stateful, 1000 * (rnd + 1))
    plain_p50, plain_rate = run(stateless, 0)
    p50_ratio.append(seq_p50 / plain_p50)
    rate_ratio.append(seq_rate / plain_rate)
    print(f"round {rnd}: sequence batcher p50 {seq_p50:.3f} ms, {seq_rate:.0f} chunks/s; "
          f"client-carried state p50 {plain_p50:.3f} ms, {plain_rate:.0f} chunks/s", flush=True)
print(f"sequence batcher / client-carried state: p50 latency {statistics.median(p50_ratio):.3f}, "
      f"chunks/s {statistics.median(rate_ratio):.3f} ({clients} clients, {chunks} chunks each, "
      f"median of {rounds} rounds)")
