"""scripts/serve, the container entrypoint: every variable the SageMaker Triton container's `serve`
honours, and what it becomes on inferd's command line (docs/container.md has the table).

Most tests run the script with a stand-in inferd (INFERD_BIN) that records its argv and the
SAGEMAKER_* environment it was given; the `real` tests run the real binary and talk to it."""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import INFERD_BIN, REPO_ROOT, free_port
from v2client import build_request, make_input, parse_response

SERVE = REPO_ROOT / "scripts" / "serve"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)

# The variables that have nothing to set in inferd: accepted and logged, never a failure, and
# never passed on (inferd exits 2 on a flag it does not know).
NO_EFFECT = {
    "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": ("true", "one repository"),
    "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": ("4", "buffer-manager"),
    "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": ("0.8", "shows no GPU"),
    "SAGEMAKER_TRITON_TENSORFLOW_VERSION": ("2", "TensorFlow"),
}

FAKE = """#!/usr/bin/python3
import json, os, sys
with open(os.environ["FAKE_INFERD_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:],
               "env": {k: v for k, v in os.environ.items() if k.startswith("SAGEMAKER_")}}, f)
"""


def base_env(**extra):
    """The caller's environment without any SAGEMAKER_* it may carry, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGEMAKER_")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Run:
    def __init__(self, proc, out_path):
        self.rc = proc.returncode
        self.log = proc.stderr + proc.stdout
        record = json.loads(out_path.read_text()) if out_path.exists() else {"argv": None, "env": {}}
        self.argv = record["argv"]
        self.env = record["env"]

    def flag(self, name):
        """The value of --name=..., the last one given; None when absent."""
        values = [a.split("=", 1)[1] for a in self.argv or [] if a.startswith(f"--{name}=")]
        return values[-1] if values else None


@pytest.fixture
def serve(tmp_path):
    """Runs scripts/serve with the stand-in inferd on a repository of `models` (empty folders)."""
    fake = tmp_path / "fake-inferd"
    fake.write_text(FAKE)
    fake.chmod(0o755)

    def run(env=None, models=("simple",), args=(), cwd=None):
        repo = tmp_path / "repo"
        if repo.exists():
            subprocess.run(["rm", "-rf", str(repo)], check=True)
        repo.mkdir()
        for m in models:
            (repo / m).mkdir()
        out = tmp_path / "argv.json"
        out.unlink(missing_ok=True)
        proc = subprocess.run([str(SERVE), *args], capture_output=True, text=True, timeout=30,
                              cwd=cwd or tmp_path,
                              env=base_env(**{"INFERD_BIN": fake, "FAKE_INFERD_OUT": out,
                                              "SAGEMAKER_MODEL_REPOSITORY": repo, **(env or {})}))
        return Run(proc, out)
    return run


def failed(run, *words):
    assert run.rc == 1 and run.argv is None, (run.rc, run.argv, run.log)
    for w in words:
        assert w in run.log, run.log


# ---- mode, repository, default model --------------------------------------------------------


def test_defaults_single_model(serve):
    r = serve()
    assert r.rc == 0, r.log
    assert r.argv[:3] == [f"--model-repository={r.env['SAGEMAKER_MODEL_REPOSITORY']}",
                          "--model-control-mode=explicit", "--load-model=simple"]
    assert r.flag("allow-sagemaker") == "true" and r.flag("sagemaker-port") == "8080"
    # Triton's serve: only the SageMaker port; KServe HTTP, gRPC and metrics off.
    assert r.flag("allow-http") == "false" and r.flag("allow-grpc") == "false"
    assert r.flag("allow-metrics") == "false"
    assert r.env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] == "simple"
    assert "serving the only model folder, simple" in r.log


def test_default_model_name(serve):
    r = serve({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "b"}, models=("a", "b"))
    assert r.rc == 0, r.log
    assert r.flag("load-model") == "b" and r.env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] == "b"
    failed(serve({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "c"}, models=("a", "b")),
           "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME=c", "no folder")
    failed(serve(models=("a", "b")), "2 model folders", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
    failed(serve(models=()), "no model folder")


def test_python_shm_sizes(serve):
    # As SageMaker's Triton serve passes them: --backend-config=python,shm-*-byte-size.
    r = serve({"SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "33554432",
               "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "2097152"})
    assert r.rc == 0, r.log
    assert "--backend-config=python,shm-default-byte-size=33554432" in r.argv
    assert "--backend-config=python,shm-growth-byte-size=2097152" in r.argv
    failed(serve({"SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "1MB"}),
           "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE", "1MB")


def test_model_files_at_the_top_are_refused(serve, tmp_path):
    repo = tmp_path / "flat"
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text('name: "m"\n')
    r = serve({"SAGEMAKER_MODEL_REPOSITORY": repo})
    failed(r, "incorrect directory structure")


def test_multi_model(serve, tmp_path):
    mme_repo = tmp_path / "mme"
    r = serve({"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_MODEL_REPOSITORY": mme_repo,
               "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "ignored"})
    assert r.rc == 0, r.log
    assert mme_repo.is_dir()  # created: the repository starts empty
    assert r.flag("model-repository") == str(mme_repo) and r.flag("model-control-mode") == "explicit"
    assert r.flag("load-model") is None
    assert r.env["SAGEMAKER_TRITON_PING_MODE"] == "live"
    # Only the exact value `true` selects it, as in Triton's serve.
    r = serve({"SAGEMAKER_MULTI_MODEL": "yes"})
    assert r.rc == 0 and r.flag("load-model") == "simple", r.log
    assert "not 'true': single-model mode" in r.log


# ---- /ping ----------------------------------------------------------------------------------


@pytest.mark.parametrize("env, mme, expected", [
    ({}, False, "ready"),
    ({}, True, "live"),
    ({"SAGEMAKER_TRITON_PING_MODE": "live"}, False, "live"),
    ({"SAGEMAKER_TRITON_PING_MODE": "ready"}, True, "ready"),
    ({"SAGEMAKER_TRITON_PING_MODE": "ready", "SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "live"}, False, "live"),
    ({"SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "ready"}, True, "ready"),
    ({"SAGEMAKER_TRITON_PING_MODE": "sometimes"}, False, "ready"),
])
def test_ping_mode(serve, env, mme, expected):
    if mme:
        env = {**env, "SAGEMAKER_MULTI_MODEL": "true"}
    r = serve(env)
    assert r.rc == 0, r.log
    assert r.env["SAGEMAKER_TRITON_PING_MODE"] == expected
    assert f"ping mode: {expected}" in r.log
    if "sometimes" in env.values():
        assert "neither ready nor live" in r.log


# ---- ports ----------------------------------------------------------------------------------


def test_bind_to_port(serve):
    r = serve({"SAGEMAKER_BIND_TO_PORT": "9123"})
    assert r.rc == 0 and r.flag("sagemaker-port") == "9123", r.log
    for bad in ("http", "0", "70000"):
        failed(serve({"SAGEMAKER_BIND_TO_PORT": bad}), "SAGEMAKER_BIND_TO_PORT")


def test_safe_port_range(serve):
    r = serve({"SAGEMAKER_SAFE_PORT_RANGE": "9000-9010"})
    assert r.rc == 0, r.log
    assert (r.flag("allow-http"), r.flag("http-port")) == ("true", "9000")
    assert (r.flag("allow-grpc"), r.flag("grpc-port")) == ("true", "9001")
    assert r.flag("allow-metrics") == "false"
    # Metrics take the next port; the SageMaker port is skipped when it lies in the range.
    r = serve({"SAGEMAKER_SAFE_PORT_RANGE": "9000-9010", "SAGEMAKER_BIND_TO_PORT": "9001",
               "SAGEMAKER_TRITON_ALLOW_METRICS": "true"})
    assert r.rc == 0, r.log
    assert [r.flag(f) for f in ("http-port", "grpc-port", "metrics-port")] == ["9000", "9002", "9003"]
    # gRPC can be turned off; an explicit port must lie in the range (Triton refuses to start).
    r = serve({"SAGEMAKER_SAFE_PORT_RANGE": "9000-9010", "SAGEMAKER_TRITON_ALLOW_GRPC": "false"})
    assert r.rc == 0 and r.flag("allow-grpc") == "false" and r.flag("grpc-port") is None, r.log
    failed(serve({"SAGEMAKER_SAFE_PORT_RANGE": "9000-9010", "SAGEMAKER_TRITON_GRPC_PORT": "8001"}),
           "SAGEMAKER_TRITON_GRPC_PORT=8001 lies outside SAGEMAKER_SAFE_PORT_RANGE=9000-9010")
    failed(serve({"SAGEMAKER_SAFE_PORT_RANGE": "9000-9000"}), "no port left for grpc")
    for bad in ("9000", "9010-9000", "a-b", "0-10"):
        failed(serve({"SAGEMAKER_SAFE_PORT_RANGE": bad}), "SAGEMAKER_SAFE_PORT_RANGE")


def test_grpc_and_metrics_switches(serve):
    r = serve({"SAGEMAKER_TRITON_ALLOW_GRPC": "true", "SAGEMAKER_TRITON_GRPC_PORT": "9501",
               "SAGEMAKER_TRITON_ALLOW_METRICS": "true", "SAGEMAKER_TRITON_METRICS_PORT": "9502"})
    assert r.rc == 0, r.log
    assert (r.flag("allow-grpc"), r.flag("grpc-port")) == ("true", "9501")
    assert (r.flag("allow-metrics"), r.flag("metrics-port")) == ("true", "9502")
    assert r.flag("allow-http") == "false"
    r = serve({"SAGEMAKER_TRITON_ALLOW_GRPC": "true"})
    assert r.flag("allow-grpc") == "true" and r.flag("grpc-port") is None  # inferd's default, 8001
    r = serve({"SAGEMAKER_TRITON_METRICS_PORT": "9502"})
    assert r.rc == 0 and r.flag("allow-metrics") == "false" and r.flag("metrics-port") is None
    assert "metrics are off" in r.log
    failed(serve({"SAGEMAKER_TRITON_ALLOW_GRPC": "maybe"}), "SAGEMAKER_TRITON_ALLOW_GRPC takes true or false")


# ---- threads, logging, inference type -------------------------------------------------------


def test_thread_count(serve):
    r = serve({"SAGEMAKER_TRITON_THREAD_COUNT": "3"})
    assert r.rc == 0 and r.flag("sagemaker-thread-count") == "3", r.log
    for bad in ("0", "many", "-1"):
        failed(serve({"SAGEMAKER_TRITON_THREAD_COUNT": bad}), "SAGEMAKER_TRITON_THREAD_COUNT")


@pytest.mark.parametrize("value, level", [("true", "1"), ("false", "0"), ("3", "3"), ("TRUE", "1")])
def test_log_verbose(serve, value, level):
    r = serve({"SAGEMAKER_TRITON_LOG_VERBOSE": value})
    assert r.rc == 0 and r.flag("log-verbose") == level, r.log


def test_log_verbose_unset_and_invalid(serve):
    assert serve().flag("log-verbose") is None  # inferd's default (off); Triton's serve turns it on
    failed(serve({"SAGEMAKER_TRITON_LOG_VERBOSE": "loud"}), "SAGEMAKER_TRITON_LOG_VERBOSE")


@pytest.mark.parametrize("level", ["INFO", "WARNING", "ERROR"])
def test_log_levels(serve, level):
    var = f"SAGEMAKER_TRITON_LOG_{level}"
    r = serve({var: "false"})
    assert r.rc == 0 and r.flag(f"log-{level.lower()}") == "false", r.log
    assert f"{var}=false: inferd writes {level.lower()} messages regardless" in r.log
    r = serve({var: "1"})
    assert r.rc == 0 and r.flag(f"log-{level.lower()}") == "true", r.log
    failed(serve({var: "verbose"}), var)


def test_inference_type(serve):
    r = serve({"SAGEMAKER_TRITON_INFERENCE_TYPE": "infer"})
    assert r.rc == 0, r.log
    for value in ("generate", "generate_stream"):
        failed(serve({"SAGEMAKER_TRITON_INFERENCE_TYPE": value}), "no generate extension")
    failed(serve({"SAGEMAKER_TRITON_INFERENCE_TYPE": "predict"}), "must be infer, generate or generate_stream")


# ---- no effect on CPU / in inferd -----------------------------------------------------------


@pytest.mark.parametrize("var", sorted(NO_EFFECT))
def test_no_effect_variables_are_logged_not_passed(serve, var):
    value, reason = NO_EFFECT[var]
    baseline = serve()
    r = serve({var: value})
    assert r.rc == 0, r.log
    assert r.argv == baseline.argv  # nothing inferd would refuse
    assert f"{var}={value} accepted, no effect in inferd" in r.log and reason in r.log


def test_model_load_gpu_limit_for_each_gpu(serve, tmp_path):
    # Triton's serve: one --model-load-gpu-limit <i>:<fraction> per line of `nvidia-smi -L`.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = -L ] || exit 2\n"
                   "echo 'GPU 0: NVIDIA A10G (UUID: GPU-aaaa)'\n"
                   "echo 'GPU 1: NVIDIA A10G (UUID: GPU-bbbb)'\n")
    smi.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    r = serve({"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.7", "PATH": path})
    assert r.rc == 0, r.log
    limits = [a for a in r.argv if a.startswith("--model-load-gpu-limit")]
    assert limits == ["--model-load-gpu-limit=0:0.7", "--model-load-gpu-limit=1:0.7"], r.argv
    assert "no effect" not in r.log, r.log
    # Unset: no flag, whatever the machine has.
    r = serve({"PATH": path})
    assert r.rc == 0 and not any(a.startswith("--model-load-gpu-limit") for a in r.argv), r.argv


# ---- additional arguments -------------------------------------------------------------------


def test_additional_args_and_arguments_after_serve(serve, tmp_path):
    (tmp_path / "a-file").write_text("")  # a glob would expand to it
    r = serve({"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "  --max-queue-size=7   --log-format ISO8601 * "},
              args=("serve", "--http-thread-count=1"))
    assert r.rc == 0, r.log
    assert r.argv[-5:] == ["--max-queue-size=7", "--log-format", "ISO8601", "*", "--http-thread-count=1"]
    # Later flags win in inferd, so the additional arguments override what serve set.
    r = serve({"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--allow-metrics=true"})
    assert r.flag("allow-metrics") == "true"


def test_no_inferd_binary(tmp_path):
    # The script's layout in the image: /usr/bin/serve, no build/ beside it.
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "serve"
    script.write_bytes(SERVE.read_bytes())
    script.chmod(0o755)
    (tmp_path / "repo" / "simple").mkdir(parents=True)
    env = base_env(PATH="/usr/bin:/bin", SAGEMAKER_MODEL_REPOSITORY=tmp_path / "repo")
    env.pop("INFERD_BIN", None)  # the sanitizer stages of the test command set it
    p = subprocess.run([str(script)], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 1 and "no inferd binary" in p.stderr, p.stderr


# ---- real runs ------------------------------------------------------------------------------


class Served:
    def __init__(self, tmp_path, env, args=()):
        if not INFERD_BIN.exists():
            pytest.skip(f"inferd binary not found at {INFERD_BIN} (set INFERD_BIN)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"serve-{self.port}.log"
        env = base_env(INFERD_BIN=INFERD_BIN, SAGEMAKER_BIND_TO_PORT=self.port, **env)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(SERVE), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"serve exited with {self.proc.returncode}:\n{self.log()}"
            try:
                requests.get(self.url + "/ping", timeout=2)
                return
            except requests.ConnectionError:
                assert time.monotonic() < deadline, self.log()
                time.sleep(0.1)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def ping(self):
        return requests.get(self.url + "/ping", timeout=10).status_code

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=20) == 0, self.log()


def example_repo(tmp_path, example_models, *names):
    repo = tmp_path / "opt_ml_model"
    for n in names:
        shutil.copytree(Path(example_models) / n, repo / n)
    return repo


def invocations(url, binary):
    inputs = [make_input("INPUT0", A, "INT32", binary=binary), make_input("INPUT1", B, "INT32", binary=binary)]
    body, headers = build_request(inputs)
    if "Inference-Header-Content-Length" in headers:
        headers["Content-Type"] = ("application/vnd.sagemaker-triton.binary+json;json-header-size="
                                   + str(headers.pop("Inference-Header-Content-Length")))
    else:
        headers["Content-Type"] = "application/json"
    r = requests.post(url, data=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    ct = r.headers["Content-Type"]
    assert ct == "application/json", ct
    _, out = parse_response(r)
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def test_real_every_setting_at_once(tmp_path, example_models):
    """The real binary accepts what serve makes of every variable (it exits 2 on a flag it does
    not know): two models, the default one named, every no-effect variable set."""
    repo = example_repo(tmp_path, example_models, "simple", "identity_fp32")
    env = {k: v for k, (v, _) in NO_EFFECT.items()}
    env.update(SAGEMAKER_MODEL_REPOSITORY=repo, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="simple",
               SAGEMAKER_TRITON_THREAD_COUNT=2, SAGEMAKER_TRITON_LOG_VERBOSE="true",
               SAGEMAKER_TRITON_LOG_INFO="true", SAGEMAKER_TRITON_LOG_WARNING="true",
               SAGEMAKER_TRITON_LOG_ERROR="true", SAGEMAKER_TRITON_INFERENCE_TYPE="infer",
               SAGEMAKER_TRITON_PING_MODE="ready",
               SAGEMAKER_TRITON_ADDITIONAL_ARGS="--max-queue-size=64")
    s = Served(tmp_path, env, args=("serve",))
    try:
        assert s.ping() == 200
        invocations(s.url + "/invocations", binary=False)
        invocations(s.url + "/invocations", binary=True)
        for var in NO_EFFECT:
            assert f"{var}=" in s.log() and "no effect in inferd" in s.log()
    finally:
        s.stop()


@pytest.mark.parametrize("env, expected", [
    ({"SAGEMAKER_TRITON_PING_MODE": "ready"}, "not 200"),
    ({"SAGEMAKER_TRITON_PING_MODE": "live"}, 200),
    ({"SAGEMAKER_TRITON_PING_MODE": "ready", "SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "live"}, 200),
    ({"SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "live"}, 200),
])
def test_real_ping_mode(tmp_path, env, expected):
    """A model that fails to load (kept running with --exit-on-error=false): live, not ready."""
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "no_such_backend"\n')
    s = Served(tmp_path, {**env, "SAGEMAKER_MODEL_REPOSITORY": repo,
                          "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-on-error=false"})
    try:
        code = s.ping()
        assert (code != 200) if expected == "not 200" else (code == expected), (code, s.log())
    finally:
        s.stop()


def consecutive_free_ports(n):
    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no run of free ports")


def test_real_safe_port_range(tmp_path, example_models):
    """KServe HTTP, gRPC and metrics open on ports of the range; the SageMaker port stays put."""
    lo = consecutive_free_ports(3)
    repo = example_repo(tmp_path, example_models, "simple")
    s = Served(tmp_path, {"SAGEMAKER_MODEL_REPOSITORY": repo,
                          "SAGEMAKER_SAFE_PORT_RANGE": f"{lo}-{lo + 2}",
                          "SAGEMAKER_TRITON_ALLOW_METRICS": "true"})
    try:
        assert s.ping() == 200
        deadline = time.monotonic() + 30
        while True:  # the KServe HTTP port opens last
            try:
                assert requests.get(f"http://127.0.0.1:{lo}/v2/health/ready", timeout=5).status_code == 200
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, s.log()
                time.sleep(0.1)
        socket.create_connection(("127.0.0.1", lo + 1), timeout=5).close()  # gRPC
        assert "nv_inference_request_success" in requests.get(
            f"http://127.0.0.1:{lo + 2}/metrics", timeout=10).text
    finally:
        s.stop()


def test_real_multi_model(tmp_path, example_models):
    """SAGEMAKER_MULTI_MODEL=true: /ping answers with no model; load, invoke, delete."""
    s = Served(tmp_path, {"SAGEMAKER_MULTI_MODEL": "true",
                          "SAGEMAKER_MODEL_REPOSITORY": tmp_path / "mme",
                          "SAGEMAKER_TRITON_ADDITIONAL_ARGS":
                              f"--sagemaker-model-cache-dir={tmp_path / 'cache'}"},
               args=("serve",))
    try:
        assert s.ping() == 200
        assert requests.get(s.url + "/models", timeout=10).json() == {"models": []}
        src = Path(example_models) / "simple"
        r = requests.post(s.url + "/models", json={"model_name": "m1", "url": str(src)}, timeout=60)
        assert r.status_code == 200, r.text
        invocations(s.url + "/models/m1/invoke", binary=False)
        assert requests.delete(s.url + "/models/m1", timeout=60).status_code == 200
        assert requests.get(s.url + "/models/m1", timeout=10).status_code == 404
    finally:
        s.stop()
