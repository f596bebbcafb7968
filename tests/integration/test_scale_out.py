"""inferd as a fleet (scripts/scale_out.sh, deploy/nginx/): 3 on-demand replicas behind nginx,
30 models (copies of the example `simple`). Through the router every model answers correctly,
each model is resident on exactly one replica (the replicas' repository index and
inferd_model_memory_bytes agree with the replica nginx says answered), and killing a replica
under load moves its models to the others: no request that started after the kill fails, and
the survivors keep their own models. A second fleet serves archives made by inferd-pack from
S3 (s3rver) through the SageMaker front, routed on X-Amzn-SageMaker-Target-Model. SIGTERM and
SIGINT stop every process the script started."""

import os
import re
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import INFERD_BIN, REPO_ROOT
from s3server import S3Server
from v2client import build_request, make_input, parse_response

SCALE_OUT = REPO_ROOT / "scripts" / "scale_out.sh"
PACK_BIN = Path(os.environ.get("INFERD_PACK_BIN", REPO_ROOT / "build" / "inferd-pack"))
MODELS = [f"m{i:02d}" for i in range(30)]


class Fleet:
    """scripts/scale_out.sh running; what it printed, parsed."""

    def __init__(self, proc, replicas, nginx_pid, front, sagemaker_front, run_dir, err_path):
        self.proc, self.replicas, self.nginx_pid = proc, replicas, nginx_pid
        self.front = f"http://127.0.0.1:{front}"
        self.sagemaker_front = f"http://127.0.0.1:{sagemaker_front}"
        self.run_dir, self.err_path = run_dir, err_path

    def stderr(self):
        return Path(self.err_path).read_text(errors="replace")[-4000:]

    def pids(self):
        return [r["pid"] for r in self.replicas] + [self.nginx_pid]

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        # scripts/scale_out.sh gives the replicas 20 s to drain, then kills them; on a loaded
        # machine the whole stop can take longer than that.
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"scale_out.sh did not stop within 90 s of the signal:\n{self.stderr()}")


def start_fleet(tmp_path, n, repository, *extra, budget=None, env=None):
    if not INFERD_BIN.exists():
        pytest.skip(f"{INFERD_BIN} is not built")
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        pytest.skip("nginx is not installed (scripts/setup.sh installs it)")
    run_dir = tmp_path / f"fleet{n}"
    err_path = tmp_path / f"fleet{n}.err"
    args = [str(SCALE_OUT), "--front-port=0", "--sagemaker-front-port=0", f"--run-dir={run_dir}"]
    if budget:
        args.append(f"--replica-memory-budget={budget}")
    args += [str(n), str(repository), "--http-thread-count=1", "--sagemaker-thread-count=1", *extra]
    env = {**os.environ, "INFERD": str(INFERD_BIN), "PATH": os.environ.get("PATH", "") + ":/usr/sbin",
           **(env or {})}
    err = open(err_path, "wb")
    # SIGINT back to its default in the child: where the test run itself was started in the
    # background (SIGINT ignored, as a non-interactive shell does for `&`), bash could not trap
    # it ("signals ignored upon entry cannot be trapped") and the SIGINT stop below would hang.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                            env=env, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err.close()
    # A thread reads the output: select() on a buffered pipe would miss lines already read.
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    replicas, nginx_pid, front, sm_front = [], None, None, None
    deadline = time.monotonic() + 90
    while sm_front is None:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.terminate()  # the script stops what it started
            proc.wait(timeout=40)
            raise AssertionError(f"scale_out.sh printed no ports in 90 s\n{err_path.read_text()}")
        if line is None:
            raise AssertionError(f"scale_out.sh exited with {proc.wait()}\n{err_path.read_text()}")
        if m := re.match(r"replica (\d+): pid (\d+) http 127.0.0.1:(\d+) sagemaker 127.0.0.1:(\d+) "
                         r"metrics 127.0.0.1:(\d+)", line):
            replicas.append(dict(pid=int(m[2]), http=f"http://127.0.0.1:{m[3]}",
                                 sagemaker=f"http://127.0.0.1:{m[4]}",
                                 metrics=f"http://127.0.0.1:{m[5]}/metrics", addr=f"127.0.0.1:{m[3]}",
                                 sm_addr=f"127.0.0.1:{m[4]}"))
        elif m := re.match(r"nginx: pid (\d+)", line):
            nginx_pid = int(m[1])
        elif m := re.match(r"FRONT_PORT=(\d+)", line):
            front = int(m[1])
        elif m := re.match(r"SAGEMAKER_FRONT_PORT=(\d+)", line):
            sm_front = int(m[1])
    assert len(replicas) == n and nginx_pid
    return Fleet(proc, replicas, nginx_pid, front, sm_front, run_dir, err_path)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by the script) is not alive either.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def fleet_factory(tmp_path):
    started = []

    def factory(*args, **kw):
        f = start_fleet(tmp_path, *args, **kw)
        started.append(f)
        return f

    yield factory
    for f in started:
        if f.proc.poll() is None:
            rc = f.stop()
            assert rc == 0, f"scale_out.sh exited with {rc} on SIGTERM\n{f.stderr()}"
        deadline = time.monotonic() + 10
        while any(alive(p) for p in f.pids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in f.pids()), "processes left after SIGTERM"


@pytest.fixture(scope="module")
def thirty_models(tmp_path_factory, example_models):
    repo = tmp_path_factory.mktemp("fleet_repo")
    src = Path(example_models) / "simple"
    for name in MODELS:
        shutil.copytree(src, repo / name)
        (repo / name / "config.pbtxt").write_text(
            (src / "config.pbtxt").read_text().replace('"simple"', f'"{name}"'))
    return repo


def request_for(k):
    """Inputs that differ per request, so a wrong answer cannot pass for a right one."""
    a = (np.arange(16, dtype=np.int32) * (k + 1)).reshape(1, 16)
    b = np.full((1, 16), k, dtype=np.int32)
    body, headers = build_request([make_input("INPUT0", a, "INT32", binary=True),
                                   make_input("INPUT1", b, "INT32", binary=True)])
    return a, b, body, headers


def check_answer(r, a, b):
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def infer_via(session, base, model, k):
    a, b, body, headers = request_for(k)
    r = session.post(f"{base}/v2/models/{model}/infer", data=body, headers=headers, timeout=120)
    return r, a, b


def answered_by(r):
    """The replica that answered: the last address nginx tried."""
    return r.headers["X-Inferd-Replica"].split(",")[-1].strip()


def resident(replica):
    """Models READY on a replica, by its repository index and by its memory metric."""
    index = requests.post(replica["http"] + "/v2/repository/index", timeout=30).json()
    ready = {e["name"] for e in index if e.get("state") == "READY"}
    text = requests.get(replica["metrics"], timeout=30).text
    metric = {m[1] for m in re.finditer(r'^inferd_model_memory_bytes\{model="([^"]+)",version="1"\} (\d+)',
                                        text, re.M) if int(m[2]) > 0}
    assert ready == metric, (ready, metric)
    return ready


def test_thirty_models_one_replica_each_and_a_killed_replica_moves_its_models(fleet_factory,
                                                                              thirty_models):
    fleet = fleet_factory(3, thirty_models)
    s = requests.Session()
    home = {}
    for k, name in enumerate(MODELS):
        r, a, b = infer_via(s, fleet.front, name, k)
        check_answer(r, a, b)
        home[name] = answered_by(r)
        # Asked again, the same replica answers.
        r, a, b = infer_via(s, fleet.front, name, k + 100)
        check_answer(r, a, b)
        assert answered_by(r) == home[name]
    by_addr = {rep["addr"]: rep for rep in fleet.replicas}
    placement = {addr: resident(rep) for addr, rep in by_addr.items()}
    for addr, models in placement.items():
        assert models == {m for m, h in home.items() if h == addr}, (addr, models)
    assert sorted(m for models in placement.values() for m in models) == MODELS  # each once
    assert all(placement.values()), f"a replica got no model: {placement}"

    # Load on every model from 6 clients; then the replica with the most models is killed.
    victim = max(by_addr, key=lambda a: len(placement[a]))
    records = []  # (start, end, model, status or exception)
    stop = threading.Event()
    lock = threading.Lock()

    def client(c):
        sess = requests.Session()
        k = c
        while not stop.is_set():
            name = MODELS[k % len(MODELS)]
            t0 = time.monotonic()
            try:
                r, a, b = infer_via(sess, fleet.front, name, k)
                check_answer(r, a, b)
                outcome = 200
            except AssertionError as e:
                outcome = f"wrong answer or status: {e}"
            except requests.RequestException as e:
                outcome = f"{type(e).__name__}: {e}"
            with lock:
                records.append((t0, time.monotonic(), name, outcome))
            k += 7

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    os.kill(by_addr[victim]["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    after = [r for r in records if r[0] > killed_at]
    in_flight = [r for r in records if r[0] <= killed_at < r[1]]
    failed_after = [r for r in after if r[3] != 200]
    failed_in_flight = [r for r in in_flight if r[3] != 200]
    print(f"placement {[len(m) for m in placement.values()]}; after the kill: {len(after)} requests, "
          f"{len(in_flight)} in flight at the kill, {len(failed_in_flight)} of them failed")
    assert len(after) > 50, f"too few requests after the kill: {len(after)}"
    assert not failed_after, failed_after[:5]
    assert len(failed_in_flight) <= len(in_flight)

    # The victim's models now live on the survivors, once each; the survivors kept theirs.
    survivors = {a: by_addr[a] for a in by_addr if a != victim}
    for k, name in enumerate(MODELS):
        r, a, b = infer_via(s, fleet.front, name, k + 500)
        check_answer(r, a, b)
        assert answered_by(r) in survivors
        if home[name] != victim:
            assert answered_by(r) == home[name], name
    after_placement = {addr: resident(rep) for addr, rep in survivors.items()}
    assert sorted(m for models in after_placement.values() for m in models) == MODELS
    for addr in survivors:
        assert placement[addr] <= after_placement[addr]
    assert "replica" in fleet.stderr() and "exited" in fleet.stderr()


def test_sagemaker_front_routes_packed_archives_from_s3_on_the_target_model(
        fleet_factory, tmp_path, example_models):
    if not PACK_BIN.exists():
        pytest.skip(f"{PACK_BIN} is not built")
    s3 = S3Server(tmp_path / "s3data").start()
    try:
        env = s3.env()
        r = subprocess.run([str(PACK_BIN), "-o", str(tmp_path / "archives"), "--copies=12",
                            "--name-prefix=a", "--upload=s3://models/fleet/",
                            str(Path(example_models) / "simple")],
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
        assert r.returncode == 0, r.stderr
        fleet = fleet_factory(3, "s3://models/fleet", env=env)
        s = requests.Session()
        home = {}
        for k in range(12):
            a, b, _, _ = request_for(k)
            body_json = {"inputs": [make_input("INPUT0", a, "INT32")[0], make_input("INPUT1", b, "INT32")[0]]}
            r = s.post(f"{fleet.sagemaker_front}/models/a{k}/invoke", json=body_json,
                       headers={"X-Amzn-SageMaker-Target-Model": f"a{k}.tar.gz"}, timeout=120)
            check_answer(r, a, b)
            home[f"a{k}"] = r.headers["X-Inferd-Replica"].split(",")[-1].strip()
            # The header routes, not the path: another name for the same archive, same replica.
            r = s.post(f"{fleet.sagemaker_front}/models/alias{k}/invoke", json=body_json,
                       headers={"X-Amzn-SageMaker-Target-Model": f"a{k}.tar.gz"}, timeout=120)
            check_answer(r, a, b)
            assert r.headers["X-Inferd-Replica"].split(",")[-1].strip() == home[f"a{k}"]
        assert len(set(home.values())) >= 2, f"everything went to one replica: {home}"
        for rep in fleet.replicas:
            text = requests.get(rep["metrics"], timeout=30).text
            loaded = set(re.findall(r'^inferd_model_memory_bytes\{model="(a\d+)",', text, re.M))
            assert loaded == {m for m, h in home.items() if h == rep["sm_addr"]}, (rep, loaded)
        # SIGINT stops the fleet too.
        assert fleet.stop(signal.SIGINT) == 0
    finally:
        s3.stop()


def test_scale_out_refuses_bad_arguments(tmp_path):
    r = subprocess.run([str(SCALE_OUT), "zero", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "positive integer" in r.stderr
    r = subprocess.run([str(SCALE_OUT), "--bogus", "1", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown option" in r.stderr
    # A replica that cannot start (a repository that is not there): the script says so and
    # leaves nothing running.
    r = subprocess.run([str(SCALE_OUT), "--front-port=0", "--sagemaker-front-port=0",
                        f"--run-dir={tmp_path / 'run'}", "2", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "INFERD": str(INFERD_BIN)})
    assert r.returncode == 1 and "exited during start-up" in r.stderr, r.stderr
    assert "missing" in r.stderr
