"""Load/unload churn: ONNX Runtime's per-session pool threads are borrowed from a reused set
(backends/onnxruntime/thread_reuse.h), not started and ended with every session: each ended
ORT thread left heap behind. The RSS figures over 10,000 cycles are bench/soak.py's."""

import os

import numpy as np

from v2client import build_request, make_input, parse_response

CYCLES = 15


def tids(pid):
    return set(os.listdir(f"/proc/{pid}/task"))


def churn(srv, model, cycles):
    """Loads, runs and unloads `model` `cycles` times; returns how many new thread ids the
    server showed meanwhile."""
    pid = srv.proc.pid
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    before = tids(pid)
    seen = set()
    for _ in range(cycles):
        assert srv.post(f"/v2/repository/models/{model}/load", json={}).status_code == 200
        seen |= tids(pid)
        body, headers = build_request([make_input("INPUT0", x, "FP32", binary=True)])
        r = srv.post(f"/v2/models/{model}/infer", data=body, headers=headers)
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], x)
        assert srv.post(f"/v2/repository/models/{model}/unload", json={}).status_code == 200
    return len(seen - before)


def test_onnx_pool_threads_are_reused_across_loads(server_factory, make_repo):
    repo = make_repo({"one": "onnx_identity_fp32", "two": "onnx_identity_fp32"})
    for name, threads in (("one", 1), ("two", 2)):
        cfg = repo / name / "config.pbtxt"
        text = cfg.read_text().replace('name: "onnx_identity_fp32"', f'name: "{name}"')
        # With two intra-op threads ORT gives the session a pool of one thread besides the
        # caller; with one, no pool.
        cfg.write_text(text + '\nparameters { key: "intra_op_thread_count" '
                       f'value: {{ string_value: "{threads}" }} }}\n')
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    without_pool = churn(srv, "one", CYCLES)
    with_pool = churn(srv, "two", CYCLES)
    # A load starts threads of its own (the instance's worker) whatever the pool: the same
    # count for both models. The pool thread is the same OS thread every time, so it adds at
    # most the first one (and slack for a thread of the server's own that starts meanwhile);
    # without reuse it adds one per cycle.
    assert with_pool - without_pool <= 3, (without_pool, with_pool)
    assert without_pool >= CYCLES  # each cycle did start a thread: the count sees new threads
