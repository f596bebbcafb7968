"""Command-line flags (tritonserver's names) and process behaviour."""

import concurrent.futures as futures
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import INFERD_BIN, free_port
from v2client import assert_4xx, infer, make_input, parse_response


def run_to_exit(args, timeout=30):
    try:
        p = subprocess.run([str(INFERD_BIN)] + args, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"inferd {' '.join(args)} did not exit within {timeout}s")
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def test_unknown_flag_exits_nonzero(make_repo):
    repo = make_repo({"simple": "simple"})
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={free_port()}",
                           "--no-such-flag=1"])
    assert rc != 0, out
    assert "no-such-flag" in out


def test_missing_repository_flag_exits_nonzero():
    rc, out = run_to_exit([f"--http-port={free_port()}"])
    assert rc != 0, out


def test_misc_flags_accepted(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--http-thread-count=2", "--log-verbose=1",
                                "--log-format=default", "--exit-on-error=true",
                                "--strict-readiness=true", "--http-max-input-size=67108864"])
    srv.wait_until(lambda: srv.get("/v2/health/ready").status_code == 200, 30, "ready")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT1"], a - a)


def test_disable_auto_complete_config(server_factory, make_repo):
    """Without auto-complete a model with no config.pbtxt cannot load; others still do."""
    repo = make_repo({"simple": "simple", "add_sub_autocomplete": "add_sub_autocomplete"})
    srv = server_factory(repo, ["--disable-auto-complete-config", "--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30,
                   "simple to be ready")
    assert_4xx(srv.get("/v2/models/add_sub_autocomplete/ready"))
    entries = [e for e in srv.post("/v2/repository/index", json={}).json()
               if e["name"] == "add_sub_autocomplete"]
    assert entries and all(e.get("state") != "READY" for e in entries), entries


@pytest.mark.parametrize("flags", [
    ["--disable-auto-complete-config", "--strict-model-config=false"],
    ["--strict-model-config=false", "--disable-auto-complete-config"],
])
def test_disable_auto_complete_config_wins_over_strict_model_config_false(server_factory,
                                                                          make_repo, flags):
    """As tritonserver (qa/L0_model_config cli_messages/cli_override), in either order."""
    repo = make_repo({"simple": "simple", "add_sub_autocomplete": "add_sub_autocomplete"})
    srv = server_factory(repo, flags + ["--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30,
                   "simple to be ready")
    assert_4xx(srv.get("/v2/models/add_sub_autocomplete/ready"))
    log = srv.log()
    assert ("Warning: Overriding deprecated '--strict-model-config' from False to True in favor "
            "of '--disable-auto-complete-config'!") in log, log
    assert "Warning: '--strict-model-config' has been deprecated!" in log, log


def test_sigterm_while_idle_exits_cleanly(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo)
    assert srv.is_live()
    rc = srv.stop()
    assert rc == 0, srv.log()


# --------------------------------------------------------------------------------------------
# tritonserver's command line (issue 16): every flag it accepts is accepted


# Every flag of tritonserver 2.5x-2.6x (its option table, src/command_line_parser.cc) with a
# plausible value. "implemented": it means the same here; "no effect": accepted, and one line at
# start says it has no effect on this server. None for a flag that takes no value.
IMPLEMENTED_FLAGS = [
    ("model-store", "<repo>"), ("exit-on-error", "true"), ("disable-auto-complete-config", None),
    ("strict-model-config", "true"), ("strict-readiness", "true"),
    ("model-control-mode", "explicit"), ("repository-poll-secs", "15"), ("load-model", "simple"),
    ("model-config-name", "custom"), ("model-load-thread-count", "2"), ("allow-http", "true"),
    ("http-thread-count", "2"), ("http-restricted-api", "model-repository:admin-key=secret"),
    ("http-max-input-size", "67108864"), ("allow-grpc", "true"), ("grpc-infer-thread-count", "2"),
    ("grpc-restricted-protocol", "model-repository:admin-key=secret"),
    ("allow-sagemaker", "false"), ("sagemaker-port", "8080"), ("sagemaker-thread-count", "2"),
    ("allow-metrics", "true"), ("allow-cpu-metrics", "true"), ("allow-gpu-metrics", "true"),
    ("metrics-interval-ms", "2000"),
    ("metrics-config", "summary_latencies=true"),
    ("log-verbose", "0"), ("log-info", "true"), ("log-warning", "true"), ("log-error", "true"),
    ("log-format", "default"), ("log-file", "<log>"), ("exit-timeout-secs", "30"),
    ("backend-directory", "<bin>"), ("backend-config", "onnxruntime,default-max-batch-size=4"),
    ("cache-config", "local,size=1048576"), ("id", "triton"),
    ("model-namespacing", "true"),  # both values: test_model_namespacing.py
    ("min-supported-compute-capability", "6.0"),  # placement: tests/unit/placement_test.cc
    ("model-load-gpu-limit", "0:0.8"),  # tests/unit/gpu_memory_test.cc, test_gpu_memory_flags.py
    # The trace extension (test_trace_logging.py): --trace-config and tritonserver's deprecated
    # spellings of the same settings.
    ("trace-config", "level=TIMESTAMPS"), ("trace-file", "<log>.trace"),
    ("trace-level", "TIMESTAMPS"), ("trace-rate", "100"), ("trace-count", "-1"),
    ("trace-log-frequency", "0"),
]
# Implemented, but refused together with --cache-config (as tritonserver): test_response_cache.py.
ALTERNATIVE_FLAGS = ["response-cache-byte-size"]
# Set by the harness on every server (conftest.launch), and --help, which prints and exits.
HARNESS_FLAGS = ["model-repository", "http-port", "http-address", "grpc-port", "grpc-address",
                 "metrics-port", "metrics-address", "help"]
NO_EFFECT_FLAGS = [
    ("model-load-retry-count", "1"),
    ("enable-peer-access", "true"), ("reuse-http-port", "false"), ("reuse-grpc-port", "false"),
    ("http-header-forward-pattern", "x-.*"), ("grpc-header-forward-pattern", "x-.*"),
    ("grpc-infer-allocation-pool-size", "8"), ("grpc-max-response-pool-size", "8"),
    ("grpc-use-ssl", "false"), ("grpc-use-ssl-mutual", "false"),
    ("grpc-server-cert", "/no/cert.pem"), ("grpc-server-key", "/no/key.pem"),
    ("grpc-root-cert", "/no/root.pem"), ("grpc-infer-response-compression-level", "low"),
    ("grpc-keepalive-time", "7200000"), ("grpc-keepalive-timeout", "20000"),
    ("grpc-keepalive-permit-without-calls", "0"), ("grpc-http2-max-pings-without-data", "2"),
    ("grpc-http2-min-recv-ping-interval-without-data", "300000"),
    ("grpc-http2-max-ping-strikes", "2"), ("grpc-max-connection-age", "60000"),
    ("grpc-max-connection-age-grace", "5000"), ("sagemaker-safe-port-range", "8000-8002"),
    ("allow-vertex-ai", "false"), ("vertex-ai-port", "8080"), ("vertex-ai-thread-count", "2"),
    ("vertex-ai-default-model", "simple"),
    ("cache-directory", "/opt/tritonserver/caches"),
    ("rate-limit", "execution_count"), ("rate-limit-resource", "R1:10:0"),
    ("pinned-memory-pool-byte-size", "268435456"), ("cuda-memory-pool-byte-size", "0:67108864"),
    ("cuda-virtual-address-size", "0:1073741824"),
    ("buffer-manager-thread-count", "2"),
    ("host-policy", "gpu_0,numa-node=0"), ("repoagent-directory", "/opt/tritonserver/repoagents"),
    ("allow-client-shm", "false"),
]


def test_flag_table_is_tritonservers():
    names = [n for n, _ in IMPLEMENTED_FLAGS + NO_EFFECT_FLAGS] + HARNESS_FLAGS + ALTERNATIVE_FLAGS
    assert len(names) == len(set(names)) == 91


def flag_args(table, **subst):
    args = []
    for name, value in table:
        if value is None:
            args.append(f"--{name}")
        else:
            for key, real in subst.items():
                value = value.replace(f"<{key}>", str(real))
            args.append(f"--{name}={value}")
    return args


def simple_inputs():
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return a, [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")]


def test_every_implemented_tritonserver_flag_starts_the_server(server_factory, make_repo, tmp_path):
    repo = make_repo({"simple": "simple"})
    (repo / "simple" / "configs").mkdir()
    (repo / "simple" / "configs" / "custom.pbtxt").write_text(
        (repo / "simple" / "config.pbtxt").read_text())
    log = tmp_path / "inferd.log"
    srv = server_factory([], flag_args(IMPLEMENTED_FLAGS, repo=repo, log=log,
                                       bin=INFERD_BIN.parent))
    srv.wait_until(lambda: srv.get("/v2/health/ready").status_code == 200, 30, "ready")
    a, inputs = simple_inputs()
    r = infer(srv, "simple", inputs)
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], a + a)
    assert "started HTTP service" in log.read_text()
    assert "has no effect" not in log.read_text()


def test_every_other_tritonserver_flag_is_accepted_with_a_no_effect_line(server_factory,
                                                                           make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, flag_args(NO_EFFECT_FLAGS))
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30, "ready")
    a, inputs = simple_inputs()
    assert infer(srv, "simple", inputs).status_code == 200
    log = Path(srv.log_path).read_text()
    for name, value in NO_EFFECT_FLAGS:
        assert f"--{name}={value} has no effect on this server (" in log, name
    assert log.count("has no effect on this server") == len(NO_EFFECT_FLAGS)


@pytest.mark.parametrize("flag", ["--no-such-flag=1", "--log-infos=true", "--grpc-use-tls=true",
                                  "--model-repository-path=/tmp"])
def test_unknown_flag_exits_2_naming_it(make_repo, flag):
    repo = make_repo({"simple": "simple"})
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={free_port()}", flag])
    assert rc == 2, out
    assert f"unknown flag '{flag.split('=')[0]}'" in out, out


@pytest.mark.parametrize("flag,message", [
    ("--grpc-keepalive-time=soon", "--grpc-keepalive-time takes an integer, got 'soon'"),
    ("--allow-gpu-metrics=maybe", "--allow-gpu-metrics takes true or false, got 'maybe'"),
    ("--grpc-infer-response-compression-level=max", "takes none, low, medium or high"),
    ("--grpc-use-ssl=true", "inferd's gRPC endpoint has no TLS"),
    ("--backend-config=,default-max-batch-size=3", "--backend-config: no backend named"),
    ("--backend-config=default-max-batch-size", "the format is <backend name>,<setting>=<value>"),
    ("--backend-config=onnxruntime,default-max-batch-size=",
     "the format is <backend name>,<setting>=<value>"),
    ("--backend-config=onnxruntime,default-max-batch-size=x",
     "default-max-batch-size takes an integer, got 'x'"),
    ("--model-config-name=", "--model-config-name needs a name"),
    ("--exit-timeout-secs=soon", "--exit-timeout-secs takes an integer"),
])
def test_bad_flag_value_exits_2_naming_it(make_repo, flag, message):
    repo = make_repo({"simple": "simple"})
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={free_port()}", flag])
    assert rc == 2, out
    assert message in out, out


def log_lines(text, level):
    return [l for l in text.splitlines() if re.match(level + r"\d{4} \d\d:\d\d:\d\d\.\d+ ", l)]


def test_log_file_receives_the_log(server_factory, make_repo, tmp_path):
    repo = make_repo({"simple": "simple"})
    log = tmp_path / "sub.log"
    log.write_text("kept\n")  # appended to, as tritonserver does
    srv = server_factory(repo, [f"--log-file={log}", "--enable-peer-access=false"])
    srv.wait_until(lambda: "loaded model 'simple'" in log.read_text(), 30, "the load logged")
    text = log.read_text()
    assert text.startswith("kept\n")
    assert "started HTTP service" in text
    assert "--enable-peer-access=false has no effect on this server" in text
    assert "started HTTP service" not in srv.log()


def test_log_file_that_cannot_be_opened_exits_2(make_repo):
    repo = make_repo({"simple": "simple"})
    rc, out = run_to_exit([f"--model-repository={repo}", "--log-file=/no/such/dir/inferd.log"])
    assert rc == 2 and "--log-file: cannot open '/no/such/dir/inferd.log'" in out, out


def test_log_info_false_drops_info_lines(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--log-info=false", "--enable-peer-access=false"])
    assert srv.get("/v2/models/simple/ready").status_code == 200
    log = srv.log()
    assert log_lines(log, "W"), log  # warnings still come
    assert not log_lines(log, "I"), log
    # The default has them.
    srv2 = server_factory(repo, ["--log-info=true"])
    assert log_lines(srv2.log(), "I")


def test_log_warning_false_drops_warning_lines(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--log-warning=false", "--enable-peer-access=false"])
    log = srv.log()
    assert "has no effect" not in log and not log_lines(log, "W"), log
    assert log_lines(log, "I"), log


def test_log_error_false_drops_error_lines(make_repo):
    repo = make_repo({"simple": "simple"})
    (repo / "simple" / "config.pbtxt").write_text("name: \"simple\"\nbogus: 1\n")
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={free_port()}"])
    assert rc != 0 and log_lines(out, "E"), out
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={free_port()}",
                           "--log-error=false"])
    assert rc != 0 and not log_lines(out, "E"), out


def test_allow_cpu_metrics_false_drops_the_cpu_gauges(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    on = server_factory(repo)
    off = server_factory(repo, ["--allow-cpu-metrics=false"])
    text = lambda srv: requests.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text
    on.wait_until(lambda: "nv_cpu_utilization" in text(on), 10, "CPU metrics")
    assert "nv_cpu_utilization" not in text(off) and "nv_cpu_memory_used_bytes" not in text(off)
    assert "nv_inference_request_success" in text(off)  # the rest is still served


@pytest.mark.parametrize("flag,max_batch", [
    (None, 4),  # tritonserver's default
    ("--backend-config=onnxruntime,default-max-batch-size=8", 8),
    ("--backend-config=default-max-batch-size=2", 2),  # the global form
    ("--backend-config=onnxruntime,default-max-batch-size=0", 0),
])
def test_backend_config_default_max_batch_size(server_factory, make_repo, flag, max_batch):
    """onnxruntime's default-max-batch-size is the max_batch_size auto-complete gives a model
    whose inputs and outputs all have a variable first dimension; above 1 it batches dynamically,
    as Triton's backend sets it up."""
    repo = make_repo({"add_sub_autocomplete": "add_sub_autocomplete"})
    srv = server_factory(repo, [flag] if flag else [])
    cfg = srv.get("/v2/models/add_sub_autocomplete/config").json()
    assert cfg["max_batch_size"] == max_batch, cfg
    assert ("dynamic_batching" in cfg) == (max_batch > 1), cfg
    assert cfg["input"][0]["dims"] == ([4] if max_batch else [-1, 4]), cfg
    x = np.ones((3, 4), np.float32)
    r = infer(srv, "add_sub_autocomplete", [make_input("INPUT0", x, "FP32"),
                                            make_input("INPUT1", x, "FP32")])
    assert r.status_code == (200 if max_batch == 0 or max_batch >= 3 else 400), r.text
    assert "has no effect" not in srv.log()


def test_backend_config_keys_no_backend_reads_are_reported(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--backend-config=onnxruntime,enable-global-threadpool=1",
                                "--backend-config=tensorflow,version=2",
                                "--backend-config=some-setting=1"])
    log = srv.log()
    assert ("--backend-config=onnxruntime,enable-global-threadpool=1 has no effect on this "
            "server (the onnxruntime backend does not read 'enable-global-threadpool')") in log
    assert ("--backend-config=tensorflow,version=2 has no effect on this server (it has no "
            "'tensorflow' backend)") in log
    assert "--backend-config=some-setting=1 has no effect on this server" in log


def test_model_config_name_selects_configs_name_pbtxt(server_factory, make_repo):
    repo = make_repo({"simple": "simple", "other": "simple"})
    (repo / "other" / "config.pbtxt").write_text(
        (repo / "other" / "config.pbtxt").read_text().replace('"simple"', '"other"'))
    custom = (repo / "simple" / "config.pbtxt").read_text().replace(
        "max_batch_size: 8", "max_batch_size: 2")
    assert "max_batch_size: 2" in custom
    (repo / "simple" / "configs").mkdir()
    (repo / "simple" / "configs" / "small.pbtxt").write_text(custom)
    srv = server_factory(repo, ["--model-config-name=small"])
    assert srv.get("/v2/models/simple/config").json()["max_batch_size"] == 2
    # A model without configs/small.pbtxt uses its config.pbtxt.
    assert srv.get("/v2/models/other/config").json()["max_batch_size"] == 8


SLOW_N = "N"


def write_slow_model(repo):
    """`OUT` = mean of tanh(V W) applied N times, N from the request: as slow as a test needs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    size = 128
    w = numpy_helper.from_array(np.full((size, size), 0.01, np.float32), "W")
    v0 = numpy_helper.from_array(np.ones((size, size), np.float32), "V0")
    shape = numpy_helper.from_array(np.array([], np.int64), "SCALAR")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["v_in", "W"], ["mm"]),
         helper.make_node("Tanh", ["mm"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [size, size])])
    graph = helper.make_graph(
        [helper.make_node("Reshape", [SLOW_N, "SCALAR"], ["trips"]),
         helper.make_node("Loop", ["trips", "", "V0"], ["v"], body=body),
         helper.make_node("ReduceMean", ["v"], ["OUT"], keepdims=1)],
        "slow",
        [helper.make_tensor_value_info(SLOW_N, TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, [1, 1])],
        initializer=[w, v0, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (repo / "slow" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "slow" / "1" / "model.onnx"))
    (repo / "slow" / "config.pbtxt").write_text(
        'name: "slow"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]\n')


def slow_request(srv, n):
    return infer(srv, "slow", [make_input("N", np.array([n], np.int64), "INT64")])


def calibrated_trips(srv, seconds):
    """Loop trips for a request of about `seconds` on this machine and build (the slope between
    two sizes, so the fixed cost of a request does not count)."""
    def timed(n):
        start = time.monotonic()
        r = slow_request(srv, n)
        assert r.status_code == 200, r.text
        return time.monotonic() - start
    timed(10)
    per_trip = max(1e-6, (timed(400) - timed(100)) / 300)
    return max(400, int(seconds / per_trip))


@pytest.mark.parametrize("timeout_s", [1, 60])
def test_exit_timeout_secs_bounds_the_wait_for_requests_in_flight(server_factory, tmp_path,
                                                                  timeout_s):
    """SIGTERM with a long inference in flight: --exit-timeout-secs=1 exits after about 1 s with
    status 1 (the request is cut off, as tritonserver does); with 60 the request completes and
    the exit is clean."""
    repo = tmp_path / "slow_repo"
    write_slow_model(repo)
    srv = server_factory([repo], [f"--exit-timeout-secs={timeout_s}"])
    # Cut off, the request can be long (machine load then cannot end it early); waited for, 5 s.
    trips = calibrated_trips(srv, 30.0 if timeout_s == 1 else 5.0)
    with futures.ThreadPoolExecutor(1) as pool:
        for _ in range(4):
            pending = pool.submit(lambda: slow_request(srv, trips))
            time.sleep(0.5)
            if not pending.done():
                break  # in flight
            # Calibrated while the machine was busier: make it longer.
            assert pending.result().status_code == 200
            trips *= 4
        assert not pending.done(), "could not keep a request in flight"
        start = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=60)
        took = time.monotonic() - start
        if timeout_s == 1:
            assert rc == 1, srv.log()
            assert took < 3.0, (took, srv.log())
            assert "exit timeout (1 s, --exit-timeout-secs) expired" in srv.log()
            with pytest.raises(requests.RequestException):
                pending.result()
        else:
            assert rc == 0, srv.log()
            # It was still running at SIGTERM: the server waited for it.
            assert pending.result().status_code == 200


def test_a_port_in_use_stops_the_start_naming_it(server_factory, make_repo):
    # Each HTTP event loop has its own SO_REUSEPORT socket; without a check, another server (or
    # this one's metrics port given the same number) would join the port and take a share of
    # its connections silently. Triton fails to bind there, and so does inferd.
    repo = make_repo({"simple": "simple"})
    port = free_port()
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={port}",
                           f"--metrics-port={port}", "--allow-grpc=false"])
    assert rc != 0, out
    assert f"cannot listen on 0.0.0.0:{port}: Address already in use" in out, out

    first = server_factory(repo, ["--allow-grpc=false", "--allow-metrics=false"])
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={first.port}",
                           "--http-address=127.0.0.1", "--allow-grpc=false",
                           "--allow-metrics=false"])
    assert rc != 0, out
    assert f":{first.port}: Address already in use" in out, out
    assert requests.get(f"{first.url}/v2/health/ready", timeout=30).status_code == 200
