"""inferd-pack (tools/pack): a model folder, or an ensemble and its parts from one repository
folder, becomes a SageMaker-ready .tar.gz that the real server loads (multi-model POST /models,
an on-demand repository of archives, a folder repository of the extracted copies); a model the
server refuses is refused with the server's own error, naming the file and the field, and no
archive is written; --copies/--name-prefix rename folders, config names and an ensemble's parts;
--upload puts the archives in S3 (s3rver) signed with SigV4, with the payload's SHA-256 and
MD5."""

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import tarfile
import threading
import base64
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import REPO_ROOT, free_port
from v2client import infer, make_input, parse_response

PACK_BIN = Path(os.environ.get("INFERD_PACK_BIN", REPO_ROOT / "build" / "inferd-pack"))

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)

# (a+b, a-b), then (sum+diff, sum-diff) = (2a, 2b), on the example `simple` model.
CHAIN = """name: "chain"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "TWICE_A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "TWICE_B" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    { model_name: "simple" model_version: -1
      input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "diff" } },
    { model_name: "simple" model_version: -1
      input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "diff" }
      output_map { key: "OUTPUT0" value: "TWICE_A" } output_map { key: "OUTPUT1" value: "TWICE_B" } }
  ]
}
"""


def pack(*args, env=None):
    if not PACK_BIN.exists():
        pytest.skip(f"{PACK_BIN} is not built (cmake --build build --target inferd-pack)")
    return subprocess.run([str(PACK_BIN), *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


def members(archive):
    with tarfile.open(archive, "r:gz") as t:
        return sorted(m.name.rstrip("/") for m in t.getmembers())


def member_text(archive, name):
    with tarfile.open(archive, "r:gz") as t:
        return t.extractfile(name).read().decode()


def simple_inputs(names=("INPUT0", "INPUT1")):
    return [make_input(names[0], A, "INT32"), make_input(names[1], B, "INT32")]


def simple_body(names=("INPUT0", "INPUT1")):
    return {"inputs": [t for t, _ in simple_inputs(names)]}


def check_simple(r, twice=False):
    assert r.status_code == 200, r.text
    _, out = parse_response(r)
    if twice:
        np.testing.assert_array_equal(out["TWICE_A"], 2 * A)
        np.testing.assert_array_equal(out["TWICE_B"], 2 * B)
    else:
        np.testing.assert_array_equal(out["OUTPUT0"], A + B)
        np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def sagemaker_server(server_factory, repo, tmp_path, *extra):
    port = free_port()
    srv = server_factory(repo, ["--model-control-mode=on-demand", "--allow-sagemaker=true",
                                f"--sagemaker-port={port}", "--sagemaker-address=127.0.0.1",
                                f"--model-cache-dir={tmp_path / 'cache'}", *extra])
    srv.sm = f"http://127.0.0.1:{port}"
    return srv


@pytest.fixture
def simple_copy(tmp_path, example_models):
    """{name: folder} -> a repository folder with copies of `simple` named so (config too)."""
    def make(*names, root=None):
        root = Path(root or tmp_path / "src")
        root.mkdir(exist_ok=True)
        src = Path(example_models) / "simple"
        for n in names:
            shutil.copytree(src, root / n)
            cfg = (src / "config.pbtxt").read_text().replace('"simple"', f'"{n}"')
            (root / n / "config.pbtxt").write_text(cfg)
        return root
    return make


def test_a_model_folder_becomes_an_archive_sagemaker_loads(tmp_path, example_models,
                                                           server_factory):
    out = tmp_path / "out"
    r = pack("-o", out, Path(example_models) / "simple")
    assert r.returncode == 0, r.stderr
    archive = out / "simple.tar.gz"
    assert members(archive) == ["simple", "simple/1", "simple/1/model.onnx", "simple/config.pbtxt"]
    assert member_text(archive, "simple/config.pbtxt") == \
        (Path(example_models) / "simple" / "config.pbtxt").read_text()
    # The SageMaker multi-model API: POST /models with the archive, then invoke.
    empty = tmp_path / "empty"
    empty.mkdir()
    srv = sagemaker_server(server_factory, empty, tmp_path)
    assert requests.post(srv.sm + "/models", json={"model_name": "m1", "url": str(archive)},
                         timeout=60).status_code == 200
    check_simple(requests.post(srv.sm + "/models/m1/invoke", json=simple_body(), timeout=60))
    # Packing again gives the same bytes: the same S3 ETag, a cache hit on the servers.
    r = pack("-o", tmp_path / "again", Path(example_models) / "simple")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again" / "simple.tar.gz").read_bytes() == archive.read_bytes()


@pytest.mark.parametrize("edit, file_part, must_contain", [
    # protobuf text that does not parse: the parser's file:line:column and the field
    (("max_batch_size: 8", "max_batch: 8"), "config.pbtxt:3:", ['no field named "max_batch"']),
    # a config that contradicts the model file (auto-complete's check)
    (("TYPE_INT32", "TYPE_FP32"), "config.pbtxt: ", ["input 'INPUT0'", "TYPE_FP32", "model file"]),
    # a field out of range
    (("max_batch_size: 8", "max_batch_size: -1"), "config.pbtxt: ", ["'max_batch_size'", ">= 0"]),
])
def test_refuses_what_the_server_refuses_with_its_error(tmp_path, simple_copy, server_factory,
                                                         edit, file_part, must_contain):
    repo = simple_copy("bad")
    cfg = repo / "bad" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace(*edit, 1))
    out = tmp_path / "out"
    r = pack("-o", out, repo / "bad")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{repo}/bad/{file_part}" in r.stderr, r.stderr
    for s in must_contain:
        assert s in r.stderr, r.stderr
    assert not list(out.glob("*")) if out.exists() else True  # nothing written
    # The very words inferd itself answers when it loads the same folder.
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    answer = srv.post("/v2/repository/models/bad/load")
    assert answer.status_code == 400
    assert answer.json()["error"] in r.stderr, (answer.text, r.stderr)


def test_an_ensemble_is_packed_with_its_parts_only(tmp_path, simple_copy, server_factory):
    repo = simple_copy("simple", "unrelated")
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(CHAIN)
    out = tmp_path / "out"
    r = pack("-o", out, "--model=chain", repo)
    assert r.returncode == 0, r.stderr
    assert members(out / "chain.tar.gz") == [
        "chain", "chain/1", "chain/config.pbtxt",
        "simple", "simple/1", "simple/1/model.onnx", "simple/config.pbtxt"]
    # Without --model the folder's ensemble is the one packed (SageMaker's choice).
    r = pack("-o", tmp_path / "out2", repo)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out2" / "chain.tar.gz").read_bytes() == (out / "chain.tar.gz").read_bytes()
    empty = tmp_path / "empty"
    empty.mkdir()
    srv = sagemaker_server(server_factory, empty, tmp_path)
    assert requests.post(srv.sm + "/models", json={"model_name": "e", "url": str(out / "chain.tar.gz")},
                         timeout=60).status_code == 200
    check_simple(requests.post(srv.sm + "/models/e/invoke", json=simple_body(("A", "B")), timeout=60),
                 twice=True)


def test_an_ensemble_whose_part_is_missing_or_broken_is_refused(tmp_path, simple_copy):
    repo = simple_copy("other")
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(CHAIN)
    r = pack("-o", tmp_path / "out", repo / "chain")
    assert r.returncode == 1
    assert f"{repo}/chain/config.pbtxt: ensemble 'chain' step 0 (model 'simple')" in r.stderr, r.stderr
    # The part is there but its config is wrong: the part's file is named.
    simple_copy("simple", root=repo)
    cfg = repo / "simple" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("TYPE_INT32", "TYPE_INT64"))
    r = pack("-o", tmp_path / "out", repo / "chain")
    assert r.returncode == 1
    assert f"{repo}/simple/config.pbtxt: " in r.stderr and "INPUT0" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "chain.tar.gz").exists()


def test_copies_are_renamed_and_each_loads_under_its_name(tmp_path, simple_copy, server_factory):
    repo = simple_copy("simple", "unrelated")
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(CHAIN)
    out = tmp_path / "out"
    r = pack("-o", out, "--copies=4", "--name-prefix=p", repo / "simple")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"p{i}.tar.gz" for i in range(4)]
    # A folder repository of the extracted copies: inferd requires each config's name to
    # match its folder, so every copy loading proves both were renamed.
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(4):
        assert members(out / f"p{i}.tar.gz")[0] == f"p{i}"
        with tarfile.open(out / f"p{i}.tar.gz") as t:
            t.extractall(flat)
    srv = server_factory(flat)
    for i in range(4):
        check_simple(infer(srv, f"p{i}", simple_inputs()))

    # Copies of an ensemble get their own parts (<copy>_<part>), so two copies loaded side by
    # side never share one: unloading e0 leaves e1 whole.
    r = pack("-o", tmp_path / "ens", "--copies=2", "--name-prefix=e", repo / "chain")
    assert r.returncode == 0, r.stderr
    assert members(tmp_path / "ens" / "e1.tar.gz") == [
        "e1", "e1/1", "e1/config.pbtxt",
        "e1_simple", "e1_simple/1", "e1_simple/1/model.onnx", "e1_simple/config.pbtxt"]
    assert 'model_name: "e1_simple"' in member_text(tmp_path / "ens" / "e1.tar.gz", "e1/config.pbtxt")
    empty = tmp_path / "empty"
    empty.mkdir()
    sm = sagemaker_server(server_factory, empty, tmp_path)
    for i in range(2):
        assert requests.post(sm.sm + "/models", json={"model_name": f"e{i}", "url": str(tmp_path / "ens" / f"e{i}.tar.gz")},
                             timeout=60).status_code == 200
    assert requests.delete(sm.sm + "/models/e0", timeout=60).status_code == 200
    check_simple(requests.post(sm.sm + "/models/e1/invoke", json=simple_body(("A", "B")), timeout=60),
                 twice=True)


def test_upload_to_s3_and_serve_from_there(s3, tmp_path, example_models, server_factory):
    out = tmp_path / "out"
    r = pack("-o", out, "--copies=3", "--name-prefix=m", "--upload=s3://models/fleet/",
             Path(example_models) / "simple")
    assert r.returncode == 0, r.stderr
    for i in range(3):
        assert f"uploaded s3://models/fleet/m{i}.tar.gz" in r.stdout
        got = requests.get(f"{s3.endpoint}/models/fleet/m{i}.tar.gz", timeout=30)
        assert got.status_code == 200 and got.content == (out / f"m{i}.tar.gz").read_bytes()
    # An on-demand server over the bucket: SageMaker's TargetModel names the archive.
    srv = sagemaker_server(server_factory, "s3://models/fleet", tmp_path)
    r = requests.post(srv.sm + "/models/x/invoke", json=simple_body(), timeout=60,
                      headers={"X-Amzn-SageMaker-Target-Model": "m2.tar.gz"})
    check_simple(r)
    # A bucket that does not exist: S3's own code, the object named.
    r = pack("-o", tmp_path / "o2", "--upload=s3://nobucket/p/", Path(example_models) / "simple")
    assert r.returncode == 1
    assert "s3://nobucket/p/simple.tar.gz" in r.stderr and "NoSuchBucket" in r.stderr, r.stderr


class Recorder(http.server.BaseHTTPRequestHandler):
    """Records one PUT (headers and body) and answers as S3 does."""
    seen = []

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.seen.append((self.path, dict(self.headers), body))
        self.send_response(200)
        self.send_header("ETag", '"%s"' % hashlib.md5(body).hexdigest())
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_upload_is_signed_with_sigv4_and_carries_the_payload_digests(tmp_path, example_models):
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    Recorder.seen.clear()
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{httpd.server_port}",
           "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
           "AWS_SESSION_TOKEN": "token123", "AWS_REGION": "eu-west-3"}
    try:
        r = pack("-o", tmp_path, "--upload=s3://bkt/a/b/", Path(example_models) / "simple", env=env)
    finally:
        httpd.shutdown()
    assert r.returncode == 0, r.stderr
    [(path, headers, body)] = Recorder.seen
    assert path == "/bkt/a/b/simple.tar.gz"
    assert body == (tmp_path / "simple.tar.gz").read_bytes()
    assert headers["x-amz-content-sha256"] == hashlib.sha256(body).hexdigest()
    assert headers["Content-MD5"] == base64.b64encode(hashlib.md5(body).digest()).decode()
    assert headers["x-amz-security-token"] == "token123"
    auth = headers["Authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"), auth
    assert "/eu-west-3/s3/aws4_request" in auth and "x-amz-content-sha256" in auth, auth
    assert "etag " + hashlib.md5(body).hexdigest() in r.stdout
