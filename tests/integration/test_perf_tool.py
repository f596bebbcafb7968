"""inferd-perf against a running inferd: HTTP binary, HTTP JSON and gRPC, closed and open loop,
the CSV checked against the server's own statistics, failures counted, clear errors, and the
HTML report rendered in headless Chromium."""

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import INFERD_BIN, NO_GRPC

PERF_BIN = Path(os.environ.get("INFERD_PERF_BIN", INFERD_BIN.parent / "tools" / "perf" / "inferd-perf"))
CHROMIUM = shutil.which("chromium")

HEADER = ["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv",
          "Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output",
          "Client Recv", "p50 latency", "p90 latency", "p95 latency", "p99 latency", "Avg latency",
          "request/response", "response wait", "Failed"]


IDENTITY_BYTES = """name: "identity_bytes"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 3 ] } ]
"""


@pytest.fixture(scope="module")
def perf_server(tmp_path_factory, example_models, logs_dir):
    if not PERF_BIN.exists():
        pytest.skip(f"inferd-perf not found at {PERF_BIN}")
    from conftest import copy_models, start_server
    repo = tmp_path_factory.mktemp("perf_repo")
    copy_models(example_models, ["simple", "identity_fp32"], repo)
    (repo / "identity_bytes" / "1").mkdir(parents=True)
    (repo / "identity_bytes" / "config.pbtxt").write_text(IDENTITY_BYTES)
    srv = start_server(repo, [], logs_dir)
    for m in ("simple", "identity_fp32", "identity_bytes"):
        srv.wait_until(lambda: srv.get(f"/v2/models/{m}/ready").status_code == 200, 60, m)
    yield srv
    assert srv.stop() == 0, srv.log()


def run_perf(*args, check=True):
    p = subprocess.run([str(PERF_BIN), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, f"rc {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def success_count(srv, model):
    s = srv.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return s["inference_stats"]["success"]["count"]


def read_csv(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


@pytest.mark.parametrize("mode", ["http-binary", "http-json", "grpc"])
def test_concurrency_range_counts_agree_with_the_server(perf_server, tmp_path, mode):
    if mode == "grpc" and NO_GRPC:
        pytest.skip("gRPC is off in this run")
    out = tmp_path / "out.csv"
    args = ["-m", "simple", "--concurrency-range", "1:2:1", "--measurement-interval", "500",
            "--max-trials", "4", "-f", out]
    if mode == "grpc":
        args += ["-i", "grpc", "-u", f"127.0.0.1:{perf_server.grpc_port}"]
    else:
        args += ["-u", f"127.0.0.1:{perf_server.port}"]
        if mode == "http-json":
            args += ["--http-json"]
    before = success_count(perf_server, "simple")
    p = run_perf(*args)
    after = success_count(perf_server, "simple")
    assert "Concurrency: 1, throughput:" in p.stdout and "Concurrency: 2, throughput:" in p.stdout
    header, rows = read_csv(out)
    assert header == HEADER
    assert [r[0] for r in rows] == ["1", "2"]
    for r in rows:
        assert float(r[1]) > 0
        assert int(r[-1]) == 0  # no failures
        p50, p90, p99 = int(r[9]), int(r[10]), int(r[12])
        assert 0 < p50 <= p90 <= p99
    # The server answered at least every request the tool counted (the tool counts only the
    # requests that completed inside its measurement windows).
    measured = [line for line in p.stdout.splitlines() if line.strip().startswith("Client:")]
    counted = sum(int(line.split("Client: ")[1].split(" requests")[0]) for line in measured)
    assert 0 < counted <= after - before
    # Server-side breakdown came from the statistics extension.
    assert all(line.strip().startswith("Server:") and " 0 requests" not in line
               for line in p.stdout.splitlines() if line.strip().startswith("Server:"))


@pytest.mark.parametrize("distribution", ["constant", "poisson"])
def test_request_rate(perf_server, tmp_path, distribution):
    out = tmp_path / "rate.csv"
    p = run_perf("-m", "identity_fp32", "--shape", "INPUT0:16", "-u", f"127.0.0.1:{perf_server.port}",
                 "--request-rate-range", "200", "--request-distribution", distribution,
                 "--measurement-interval", "1000", "--max-trials", "3", "-f", out)
    header, rows = read_csv(out)
    assert header[0] == "Request Rate" and header[1:] == HEADER[1:]
    assert rows[0][0] == "200"
    achieved = float(rows[0][1])
    assert 160 <= achieved <= 240, (achieved, p.stdout)
    assert int(rows[0][-1]) == 0
    assert "Request rate: 200, throughput:" in p.stdout and "achieved" in p.stdout


def test_unknown_model_is_a_clear_error(perf_server):
    p = run_perf("-m", "no_such_model", "-u", f"127.0.0.1:{perf_server.port}", check=False)
    assert p.returncode == 1
    assert "model 'no_such_model'" in p.stderr and "404" in p.stderr
    if not NO_GRPC:
        p = run_perf("-m", "no_such_model", "-i", "grpc", "-u", f"127.0.0.1:{perf_server.grpc_port}",
                     check=False)
        assert p.returncode == 1
        assert "model 'no_such_model': ModelMetadata failed" in p.stderr, p.stderr


def test_unreachable_server_is_a_clear_error():
    from conftest import free_port
    port = free_port()
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{port}", check=False)
    assert p.returncode == 1 and f"cannot connect to 127.0.0.1:{port}" in p.stderr, p.stderr


def test_bad_options_name_what_is_wrong(perf_server):
    p = run_perf("-m", "simple", "--shape", "INPUT0", check=False)
    assert p.returncode == 2 and "--shape takes name:d1,d2,... , got 'INPUT0'" in p.stderr
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "--shape", "NOPE:4", check=False)
    assert p.returncode == 2 and "--shape names input 'NOPE'" in p.stderr
    p = run_perf("-m", "identity_fp32", "-u", f"127.0.0.1:{perf_server.port}", check=False)
    assert p.returncode == 2 and "input 'INPUT0' has a variable dimension" in p.stderr
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "-b", "9", check=False)
    assert p.returncode == 2 and "exceeds the model's max_batch_size 8" in p.stderr


def test_failed_requests_are_counted_and_fail_the_run(perf_server, tmp_path):
    # simple's INPUT0 is [16]; [3] makes the server answer 400 to every request.
    out = tmp_path / "fail.csv"
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "--shape", "INPUT0:3",
                 "--measurement-interval", "300", "--max-trials", "3", "-f", out, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "every request failed" in p.stderr
    assert "HTTP 400" in p.stderr and "INPUT0" in p.stderr
    _, rows = read_csv(out)
    assert int(rows[0][-1]) > 0 and float(rows[0][1]) == 0


def test_failed_requests_are_counted_over_grpc(perf_server, tmp_path):
    # The same refusal over gRPC (INVALID_ARGUMENT). identity_fp32 would not do here: its
    # INPUT0 is [-1], so any --shape is valid for it.
    if NO_GRPC:
        pytest.skip("gRPC is off in this run")
    out = tmp_path / "fail.csv"
    p = run_perf("-m", "simple", "-i", "grpc", "-u", f"127.0.0.1:{perf_server.grpc_port}",
                 "--shape", "INPUT0:3", "--measurement-interval", "300", "--max-trials", "3",
                 "-f", out, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "failed requests; the first: gRPC 3:" in p.stderr and "INPUT0" in p.stderr
    _, rows = read_csv(out)
    assert int(rows[0][-1]) > 0 and float(rows[0][1]) == 0


def test_percentile_is_what_the_step_reports(perf_server):
    # --percentile 75 is neither p50/p90/p95/p99: the reported latency is its own figure.
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "--percentile", "75",
                 "--measurement-interval", "300", "--max-trials", "3")
    assert "latency p75" in p.stdout
    line = next(l for l in p.stdout.splitlines() if l.startswith("Concurrency: 1,"))
    reported = float(line.split("latency ")[1].split(" usec")[0])
    client = next(l for l in p.stdout.splitlines() if l.strip().startswith("Client:"))
    p50 = float(client.split("p50 ")[1].split(",")[0])
    p90 = float(client.split("p90 ")[1].split(",")[0])
    assert p50 <= reported <= p90, p.stdout


def test_html_report_renders_in_chromium(perf_server, tmp_path):
    report = tmp_path / "report.html"
    run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "--concurrency-range", "1:3:2",
             "--measurement-interval", "300", "--max-trials", "3", "--report", report)
    if CHROMIUM is None:
        pytest.skip("chromium is not installed")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--user-data-dir=" + str(tmp_path / "chromium-profile"),
                          "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'id="latency-plot"' in html and 'id="breakdown-plot"' in html, html[:2000]
    latency = html.split('id="latency-plot"')[1].split("</svg>")[0]
    breakdown = html.split('id="breakdown-plot"')[1].split("</svg>")[0]
    assert latency.count("<circle") == 6  # 3 percentiles x 2 steps
    assert breakdown.count("<rect") == 10  # 5 parts (queue, 3 compute, rest) x 2 steps


@pytest.mark.parametrize("protocol", ["http", "http-json", "grpc"])
def test_input_data_file_batch_and_percentile(perf_server, tmp_path, protocol):
    if protocol == "grpc" and NO_GRPC:
        pytest.skip("gRPC is off in this run")
    # perf_analyzer's format: flat values for simple, {"content", "shape"} for the variable
    # dimension of identity_fp32 (the shape there replaces --shape).
    data = tmp_path / "data.json"
    data.write_text('{"data": [{"INPUT0": {"content": [0.5, 1.5, 2.5, 3.5, 4.5, 5.5], "shape": [6]}}]}')
    args = ["-m", "identity_fp32", "--input-data", data, "-b", "4", "--percentile", "90",
            "--measurement-interval", "300", "--max-trials", "3", "-f", tmp_path / "o.csv"]
    if protocol == "grpc":
        args += ["-i", "grpc", "-u", f"127.0.0.1:{perf_server.grpc_port}"]
    else:
        args += ["-u", f"127.0.0.1:{perf_server.port}"]
        if protocol == "http-json":
            args += ["--http-json"]
    before = success_count(perf_server, "identity_fp32")
    p = run_perf(*args)
    after = success_count(perf_server, "identity_fp32")
    assert "batch 4" in p.stdout and "latency p90" in p.stdout
    _, rows = read_csv(tmp_path / "o.csv")
    assert int(rows[0][-1]) == 0
    # The reported latency is the p90 column; throughput counts inferences (4 per request).
    reported = float(p.stdout.split("latency ")[2].split(" usec")[0])
    assert abs(reported - int(rows[0][10])) <= 1, (reported, rows[0])
    requests = int(p.stdout.split("Client: ")[1].split(" requests")[0])
    assert 0 < requests <= after - before


def test_malformed_input_data_names_the_input(perf_server, tmp_path):
    data = tmp_path / "data.json"
    data.write_text('{"data": [{"INPUT0": [1, 2, 3]}]}')
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "--input-data", data, check=False)
    assert p.returncode == 2
    assert "no data for input 'INPUT1'" in p.stderr or "input 'INPUT0' has 3 values" in p.stderr, p.stderr
@pytest.mark.parametrize("mode", ["http-binary", "http-json", "grpc"])
@pytest.mark.parametrize("data", ["zero", "random"])
def test_bytes_inputs(perf_server, mode, data):
    # BYTES: zero sends empty strings, random short strings; batch 2 adds the batch dimension.
    if mode == "grpc" and NO_GRPC:
        pytest.skip("gRPC is off in this run")
    port = perf_server.grpc_port if mode == "grpc" else perf_server.port
    args = ["-m", "identity_bytes", "-b", "2", "--input-data", data, "-u", f"127.0.0.1:{port}",
            "--measurement-interval", "300", "--max-trials", "3"]
    args += {"http-binary": [], "http-json": ["--http-json"], "grpc": ["-i", "grpc"]}[mode]
    p = run_perf(*args)
    assert " 0 failed" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("form", ["flat", "content"])
def test_input_data_json_file(perf_server, tmp_path, form):
    values = list(range(16))
    entry = {"INPUT0": values, "INPUT1": values} if form == "flat" else \
        {"INPUT0": {"content": values, "shape": [16]}, "INPUT1": {"content": values, "shape": [16]}}
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [entry]}))
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "--input-data", data,
                 "--measurement-interval", "300", "--max-trials", "3")
    assert " 0 failed" in p.stdout, p.stdout + p.stderr
    data.write_text(json.dumps({"data": [{"INPUT0": values}]}))
    p = run_perf("-m", "simple", "-u", f"127.0.0.1:{perf_server.port}", "--input-data", data, check=False)
    assert p.returncode == 2 and "--input-data: no data for input 'INPUT1'" in p.stderr
