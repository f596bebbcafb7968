"""Signals an operator sends: SIGHUP reads the repository again (one poll) and reopens the log
file, SIGUSR1 reopens the log file; neither ends the server nor drops a request in flight.
SIGTERM still shuts it down cleanly."""

import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np

from v2client import infer, make_input, parse_response

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 2, dtype=np.int32)


def test_hup_and_usr1_keep_requests_in_flight(server_factory, make_repo, tmp_path):
    repo = make_repo({"simple": "simple"})
    log = tmp_path / "inferd.log"
    srv = server_factory(repo, [f"--log-file={log}"])
    answers, stop = [], threading.Event()

    def client():
        while not stop.is_set():
            r = infer(srv, "simple", [make_input("INPUT0", A, "INT32"), make_input("INPUT1", B, "INT32")])
            answers.append(r.status_code)
            if r.status_code == 200:
                np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], A + B)

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        srv.wait_until(lambda: len(answers) >= 20, 60, "requests under way")
        for _ in range(5):
            for sig in (signal.SIGHUP, signal.SIGUSR1):
                srv.proc.send_signal(sig)
                time.sleep(0.05)
        n = len(answers)
        srv.wait_until(lambda: len(answers) >= n + 20, 60, "requests after the signals")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert srv.proc.poll() is None, "the server died on SIGHUP or SIGUSR1"
    assert answers and set(answers) == {200}, sorted(set(answers))

    # logrotate: move the file away, signal, and the server writes to a new file of the name.
    rotated = tmp_path / "inferd.log.1"
    log.rename(rotated)
    srv.proc.send_signal(signal.SIGUSR1)
    srv.wait_until(lambda: log.exists() and "reopened the log file" in log.read_text(), 30,
                   "a new log file after SIGUSR1")
    assert "received SIGUSR1" in rotated.read_text() or "received SIGUSR1" in log.read_text()
    assert srv.stop() == 0


def test_hup_reads_the_repository_again(server_factory, make_repo, example_models):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--model-control-mode=poll", "--repository-poll-secs=3600"])
    shutil.copytree(Path(example_models) / "simple", repo / "added")
    cfg = repo / "added" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "simple"', 'name: "added"'))

    def hup_and_ready():
        # One poll per SIGHUP; a model folder just written loads at the second that sees it
        # unchanged.
        srv.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        return srv.get("/v2/models/added/ready").status_code == 200

    srv.wait_until(hup_and_ready, 60, "the added model loaded after SIGHUP")
    r = infer(srv, "added", [make_input("INPUT0", A, "INT32"), make_input("INPUT1", B, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT1"], A - B)
