"""Checks the container image the way SageMaker uses it (scripts/test_image.sh runs this).

Each scenario runs the image's entrypoint with `serve` as its argument (`docker run <image>
serve`) through `buildah run --isolation chroot` (host network), with the model folders mounted
where SageMaker mounts them, and talks to it over loopback:

  config        labels, entrypoint, exposed port, user, /etc/machine-id, /usr/bin/serve
  single model  /opt/ml/model holding `simple` (ONNX Runtime): /ping, /invocations in JSON and in
                binary+json, outputs compared with numpy; then SIGTERM, exit status 0
  multi model   SAGEMAKER_MULTI_MODEL=true, /opt/ml/models/<hash>/model folders and an archive:
                POST/GET/DELETE /models, invoke (JSON and binary+json), as root and as uid 1000
  ping time     /ping -> 200 measured from `buildah run` with no models (goal: 1 s)

    /usr/bin/python3 tests/image/check_image.py [--image localhost/inferd:latest] [--only NAME]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from v2client import build_request, make_input, parse_response  # noqa: E402

EXAMPLES = ROOT / "examples" / "model_repository"
MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 5, dtype=np.int32)
X = np.linspace(-2, 2, 24, dtype=np.float32).reshape(2, 12)
PING_GOAL_S = 1.0
# A hard bound well above the goal, so a loaded CI machine does not fail the run; the figure
# itself is printed against the goal.
PING_LIMIT_S = float(os.environ.get("INFERD_IMAGE_PING_LIMIT_S", "5"))


def buildah(*args, **kw):
    return subprocess.run(["buildah", "--storage-driver", "vfs", *args], check=True,
                          stdout=subprocess.PIPE, text=True, **kw).stdout.strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], stdout=subprocess.PIPE, text=True).stdout
    return [int(p) for p in out.split()]


# What `buildah run` prints when its runtime could not start, before anything of the image ran.
RUNNER_SETUP_FAILURE = "sealing memfd copy"


class Container:
    """One `buildah run` of the image's entrypoint, in a fresh working container."""

    def __init__(self, image, env, mounts=(), user=None, log_dir=None):
        self.image = image
        self.port = free_port()
        self.env = {"SAGEMAKER_BIND_TO_PORT": str(self.port), **env}
        self.mounts = mounts
        self.user = user
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"inferd-image-{self.port}.log"
        self.session = requests.Session()
        self.proc = None
        self.ctr = buildah("from", "--pull-never", "--quiet", image)
        cfg = json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
        self.entrypoint = cfg["Entrypoint"]

    def start(self):
        cmd = ["buildah", "--storage-driver", "vfs", "run", "--isolation", "chroot"]
        for k, v in self.env.items():
            cmd += ["--env", f"{k}={v}"]
        for host, target in self.mounts:
            cmd += ["-v", f"{host}:{target}:ro"]
        if self.user:
            cmd += ["--user", self.user]
        # What `docker run <image> serve` runs: the entrypoint with `serve` as its argument.
        cmd += [self.ctr, "--", *self.entrypoint, "serve"]
        self.log = open(self.log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def text(self):
        return self.log_path.read_text(errors="replace")

    def wait_ping(self, timeout=60, poll=0.005, watch_exec=False):
        """Seconds from start until /ping answers 200. With watch_exec, also sets self.exec_s: the
        seconds until inferd's process exists (serve exec'd it), the container's own set-up."""
        deadline = self.started + timeout
        self.exec_s = None
        retried = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not retried and RUNNER_SETUP_FAILURE in self.text():
                # buildah's chroot runner failed to set itself up before the entrypoint ran
                # (EBUSY sealing the memfd copy of its own binary, seen once in CI): one more start.
                retried = True
                self.log.close()
                self.start()
                deadline = self.started + timeout
                continue
            assert self.proc.poll() is None, f"the container exited ({self.proc.returncode}):\n{self.text()}"
            if watch_exec and self.exec_s is None and self.inferd_pid():
                self.exec_s = time.monotonic() - self.started
            try:
                if self.session.get(self.url + "/ping", timeout=1).status_code == 200:
                    return time.monotonic() - self.started
            except requests.ConnectionError:
                pass
            time.sleep(poll)
        raise AssertionError(f"/ping not 200 within {timeout} s:\n{self.text()}")

    def inferd_pid(self):
        """inferd's pid: the process under `buildah run` whose command is inferd."""
        todo, seen = [self.proc.pid], []
        while todo:
            pid = todo.pop()
            for c in children(pid):
                try:
                    if Path(f"/proc/{c}/comm").read_text().strip() == "inferd":
                        return c
                except OSError:
                    continue
                todo.append(c)
                seen.append(c)
        return None

    def stop(self):
        """SIGTERM to inferd (what `docker stop` sends the entrypoint, which serve exec'd); returns
        the exit status `buildah run` reports."""
        self.session.close()
        try:
            if self.proc.poll() is None:
                pid = self.inferd_pid()
                assert pid, f"no inferd process under buildah run:\n{self.text()}"
                os.kill(pid, signal.SIGTERM)
                try:
                    return self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    raise AssertionError(f"inferd did not exit within 20 s of SIGTERM:\n{self.text()}")
            return self.proc.returncode
        finally:
            self.log.close()
            subprocess.run(["buildah", "--storage-driver", "vfs", "rm", self.ctr],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def get(self, path, **kw):
        return self.session.get(self.url + path, timeout=60, **kw)

    def post(self, path, **kw):
        return self.session.post(self.url + path, timeout=120, **kw)

    def delete(self, path, **kw):
        return self.session.delete(self.url + path, timeout=60, **kw)


# ---- request bodies --------------------------------------------------------------------------


def sagemaker_body(inputs, outputs=None):
    body, headers = build_request(inputs, outputs)
    if "Inference-Header-Content-Length" in headers:
        headers["Content-Type"] = MIME + str(headers.pop("Inference-Header-Content-Length"))
    else:
        headers["Content-Type"] = "application/json"
    return body, headers


def parse_sagemaker(r):
    assert r.status_code == 200, (r.status_code, r.text[:500])
    ct = r.headers.get("Content-Type", "")
    if ct.startswith(MIME):
        fake = requests.Response()
        fake._content = r.content
        fake.status_code = r.status_code
        fake.headers["Inference-Header-Content-Length"] = ct[len(MIME):]
        return parse_response(fake)
    assert ct == "application/json", ct
    return parse_response(r)


def simple_request(binary):
    inputs = [make_input("INPUT0", A, "INT32", binary=binary), make_input("INPUT1", B, "INT32", binary=binary)]
    outputs = None
    if binary:
        outputs = [{"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")]
    return sagemaker_body(inputs, outputs)


def check_simple(r, binary):
    if binary:
        assert r.headers["Content-Type"].startswith(MIME), r.headers
    else:
        assert r.headers["Content-Type"] == "application/json", r.headers
    _, out = parse_sagemaker(r)
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def check_identity(r):
    _, out = parse_sagemaker(r)
    np.testing.assert_array_equal(out["OUTPUT0"], X)


def identity_request():
    return sagemaker_body([make_input("INPUT0", X, "FP32", binary=True)],
                          [{"name": "OUTPUT0", "parameters": {"binary_data": True}}])


# ---- scenarios -------------------------------------------------------------------------------


def scenario_config(image, work):
    info = json.loads(buildah("inspect", "--type", "image", image))
    cfg = info["OCIv1"]["config"]
    labels = cfg.get("Labels") or {}
    for label in ("com.amazonaws.sagemaker.capabilities.multi-models",
                  "com.amazonaws.sagemaker.capabilities.accept-bind-to-port"):
        assert labels.get(label) == "true", (label, labels)
    assert cfg["Entrypoint"] == ["serve"], cfg["Entrypoint"]
    assert "8080/tcp" in (cfg.get("ExposedPorts") or {}), cfg.get("ExposedPorts")
    # SageMaker runs containers as root (its documented expectation).
    assert cfg.get("User", "") in ("", "root", "0"), cfg.get("User")
    ctr = buildah("from", "--pull-never", "--quiet", image)
    try:
        out = buildah("run", "--isolation", "chroot", ctr, "--", "sh", "-c",
                      "command -v serve || echo none; cat /etc/machine-id 2>/dev/null || echo none; "
                      "id -u inferd 2>/dev/null || echo none; inferd --version 2>&1 || echo none")
    finally:
        buildah("rm", ctr)
    serve, machine_id, uid, version = out.splitlines()
    assert serve == "/usr/bin/serve", serve
    # ONNX Runtime reads it for its device id; without it, it runs `sh -c 'echo `blkid; hostname`'`
    # from inside the server when the first session is made (and crashed where that failed).
    assert len(machine_id) == 32 and all(c in "0123456789abcdef" for c in machine_id), \
        f"/etc/machine-id: {machine_id!r}"
    assert uid == "1000", uid
    print(f"  labels, entrypoint {cfg['Entrypoint']}, port 8080, /etc/machine-id, user inferd: ok ({version})")


def scenario_single(image, work):
    repo = work / "opt_ml_model"
    shutil.copytree(EXAMPLES / "simple", repo / "simple")
    c = Container(image, {}, mounts=[(repo, "/opt/ml/model")], log_dir=work).start()
    try:
        t = c.wait_ping()
        r = c.get("/ping")
        assert r.status_code == 200 and r.content == b"", (r.status_code, r.content)
        for binary in (False, True):
            body, headers = simple_request(binary)
            check_simple(c.post("/invocations", data=body, headers=headers), binary)
        assert "serving the only model folder, simple" in c.text(), c.text()
    finally:
        rc = c.stop()
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{c.text()}"
    print(f"  /ping 200 after {t:.2f} s (model loaded); /invocations JSON and binary+json match numpy; "
          "SIGTERM: exit 0")


def mme_models(work):
    """SageMaker's layout: each model's artifacts extracted under /opt/ml/models/<hash>/model."""
    root = work / "opt_ml_models"
    shutil.copytree(EXAMPLES / "simple", root / "5f1e0c2a" / "model" / "simple")
    shutil.copytree(EXAMPLES / "identity_fp32", root / "9b7d3e41" / "model" / "identity_fp32")
    (root / "archives").mkdir()
    with tarfile.open(root / "archives" / "simple.tar.gz", "w:gz") as tar:
        tar.add(EXAMPLES / "simple", arcname="simple")
    return root


def scenario_mme(image, work, user=None):
    root = mme_models(work / ("mme-uid" + user.split(":")[0] if user else "mme-root"))
    c = Container(image, {"SAGEMAKER_MULTI_MODEL": "true"}, mounts=[(root, "/opt/ml/models")],
                  user=user, log_dir=work).start()
    try:
        t = c.wait_ping()
        assert c.get("/models").json() == {"models": []}
        loads = {"m-simple": "/opt/ml/models/5f1e0c2a/model",
                 "m-identity": "/opt/ml/models/9b7d3e41/model",
                 "m-archive": "/opt/ml/models/archives/simple.tar.gz"}
        for name, url in loads.items():
            r = c.post("/models", json={"model_name": name, "url": url})
            assert r.status_code == 200, (name, r.status_code, r.text, c.text())
        listed = sorted((m["modelName"], m["modelUrl"]) for m in c.get("/models").json()["models"])
        assert listed == sorted(loads.items()), listed
        assert c.get("/models/m-identity").json() == {"modelName": "m-identity", "modelUrl": loads["m-identity"]}
        for name in ("m-simple", "m-archive"):
            for binary in (False, True):
                body, headers = simple_request(binary)
                headers["X-Amzn-SageMaker-Target-Model"] = "simple.tar.gz"
                check_simple(c.post(f"/models/{name}/invoke", data=body, headers=headers), binary)
        body, headers = identity_request()
        check_identity(c.post("/models/m-identity/invoke", data=body, headers=headers))
        assert c.delete("/models/m-simple").status_code == 200
        assert c.get("/models/m-simple").status_code == 404
        body, headers = simple_request(False)
        assert c.post("/models/m-simple/invoke", data=body, headers=headers).status_code == 404
        assert sorted(m["modelName"] for m in c.get("/models").json()["models"]) == ["m-archive", "m-identity"]
        assert c.get("/ping").status_code == 200
    finally:
        rc = c.stop()
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{c.text()}"
    who = f"uid {user}" if user else "root"
    print(f"  as {who}: /ping 200 after {t:.2f} s; POST /models (2 folders, 1 archive), GET, "
          "invoke JSON and binary+json match numpy, DELETE then 404; SIGTERM: exit 0")


def scenario_mme_nonroot(image, work):
    scenario_mme(image, work, user="1000:1000")


def scenario_ping_time(image, work, runs=3):
    times, execs = [], []
    for _ in range(runs):
        c = Container(image, {"SAGEMAKER_MULTI_MODEL": "true"}, log_dir=work).start()
        try:
            times.append(c.wait_ping(watch_exec=True))
            execs.append(c.exec_s)
        finally:
            rc = c.stop()
        assert rc == 0, c.text()
    median = statistics.median(times)
    verdict = "within" if median <= PING_GOAL_S else "OVER"
    print(f"  /ping 200 after {', '.join(f'{t:.3f}' for t in times)} s from `buildah run` "
          f"(median {median:.3f} s, {verdict} the {PING_GOAL_S:.0f} s goal)")
    if all(e is not None for e in execs):
        print(f"  of which buildah's set-up and serve until inferd runs: {', '.join(f'{e:.3f}' for e in execs)} s; "
              f"inferd's start to /ping 200: {', '.join(f'{t - e:.3f}' for t, e in zip(times, execs))} s")
    assert median <= PING_LIMIT_S, f"median {median:.2f} s is over the {PING_LIMIT_S} s limit"


SCENARIOS = {
    "config": scenario_config,
    "single": scenario_single,
    "mme": scenario_mme,
    "mme-nonroot": scenario_mme_nonroot,
    "ping-time": scenario_ping_time,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default=os.environ.get("INFERD_IMAGE", "localhost/inferd:latest"))
    ap.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    args = ap.parse_args()
    assert (EXAMPLES / "simple" / "1" / "model.onnx").exists(), \
        "generate the example models first: /usr/bin/python3 tests/models/gen_models.py --example examples/model_repository"
    with tempfile.TemporaryDirectory(prefix="inferd-image-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the uid 1000 run reads the mounted folders
        for name in args.only or SCENARIOS:
            print(f"{name}:", flush=True)
            start = time.monotonic()
            SCENARIOS[name](args.image, work)
            print(f"  ({time.monotonic() - start:.1f} s)", flush=True)
    print("image checks passed")


if __name__ == "__main__":
    main()
