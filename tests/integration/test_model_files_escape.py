"""Nothing an archive or a config sends reaches outside its model's folder (issue 27).

Archives: link chains (a/l1 -> .., a/l1/l2 -> .., ...) that climb one level per link, and a
second archive planting a link through them, over a local archive (SageMaker's load API) and
over S3 (the streaming extraction). Configs: every field that names a file must name one
inside the model's folder, links resolved, or the load is refused with 400 naming the field.
The Python backend's packed environment is extracted without a shell. The model cache is
private to the server's user, and one it cannot trust or write is a 500.
"""

import io
import json
import os
import secrets
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import free_port
from test_python_backend import write_model
from v2client import infer, make_input

A = np.arange(16, dtype=np.int32).reshape(1, 16)

# ---- archives ------------------------------------------------------------------------------


def tar_bytes(entries):
    """entries: (name, kind, data_or_target) with kind 'dir', 'file' or 'link'."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, arg in entries:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, arg
                tar.addfile(info)
            else:
                data = arg.encode() if isinstance(arg, str) else arg
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Each link, on its own text, resolves inside its folder; together they climb one level each.
CHAIN = [("a", "dir", None), ("a/l1", "link", ".."), ("a/l1/l2", "link", ".."),
         ("a/l1/l2/l3", "link", ".."), ("a/l1/l2/l3/l4", "link", ".."),
         ("a/l1/l2/l3/l4/l5", "link", ".."), ("a/l1/l2/l3/l4/l5/x-escaped", "dir", None),
         ("a/l1/l2/l3/l4/l5/x-escaped/y", "dir", None)]
# The second archive: a link to attacker content, placed through the chain.
PLANT = [("m", "dir", None), ("m/l1", "link", ".."), ("m/l1/l2", "link", ".."),
         ("m/l1/l2/l3", "link", ".."), ("m/l1/l2/l3/authorized_keys", "link", "payload/key")]


def everything_under(root):
    out = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), root))
    return out


def assert_nothing_escaped(top):
    names = {Path(p).name for p in everything_under(top)}
    assert "x-escaped" not in names, sorted(everything_under(top))
    assert "authorized_keys" not in names, sorted(everything_under(top))


@pytest.fixture
def deep_cache(tmp_path):
    """A cache 8 folders below tmp_path: a chain that climbs out lands where the test sees it."""
    return tmp_path.joinpath(*["d"] * 8, "cache")


def sagemaker_server(server_factory, make_repo, cache, *extra):
    port = free_port()
    srv = server_factory(make_repo({}), ["--allow-sagemaker=true", f"--sagemaker-port={port}",
                                         "--sagemaker-address=127.0.0.1",
                                         f"--model-cache-dir={cache}", *extra])
    return srv, f"http://127.0.0.1:{port}"


def test_local_archive_link_chain_stays_inside(server_factory, make_repo, tmp_path, deep_cache):
    srv, url = sagemaker_server(server_factory, make_repo, deep_cache)
    archive = tmp_path / "chain.tar.gz"
    archive.write_bytes(tar_bytes(CHAIN))
    r = requests.post(f"{url}/models", json={"model_name": "chain", "url": str(archive)}, timeout=60)
    assert_nothing_escaped(tmp_path)
    assert r.status_code == 400, r.text
    assert "a/l1/l2" in r.json()["error"], r.text
    assert srv.proc.poll() is None


def test_local_two_archive_link_plant(server_factory, make_repo, tmp_path, deep_cache):
    srv, url = sagemaker_server(server_factory, make_repo, deep_cache)
    first = tmp_path / "payload.tar.gz"
    first.write_bytes(tar_bytes([("payload", "dir", None), ("payload/key", "file", "ssh-ed25519 AAAA")]))
    requests.post(f"{url}/models", json={"model_name": "payload", "url": str(first)}, timeout=60)
    second = tmp_path / "plant.tar.gz"
    second.write_bytes(tar_bytes(PLANT))
    r = requests.post(f"{url}/models", json={"model_name": "plant", "url": str(second)}, timeout=60)
    assert r.status_code == 400, r.text
    assert_nothing_escaped(tmp_path)


def test_s3_archive_link_chain_and_plant(s3, server_factory, make_repo, tmp_path, deep_cache):
    s3.put("p/chain.tar.gz", tar_bytes(CHAIN))
    s3.put("p/plant.tar.gz", tar_bytes(PLANT))
    srv, url = sagemaker_server(server_factory, make_repo, deep_cache)
    for name in ("chain", "plant"):
        r = requests.post(f"{url}/models", json={"model_name": name, "url": f"s3://models/p/{name}.tar.gz"},
                          timeout=60)
        assert r.status_code == 400, r.text
    assert_nothing_escaped(tmp_path)
    assert srv.proc.poll() is None


def test_archive_with_links_inside_still_loads(server_factory, make_repo, tmp_path, example_models,
                                               deep_cache):
    src = Path(example_models) / "simple"
    entries = [("simple", "dir", None),
               ("simple/config.pbtxt", "file", (src / "config.pbtxt").read_bytes()),
               ("simple/0", "dir", None),
               ("simple/0/model.onnx", "file", (src / "1" / "model.onnx").read_bytes()),
               ("simple/1", "link", "0")]
    archive = tmp_path / "linked.tar.gz"
    archive.write_bytes(tar_bytes(entries))
    srv, url = sagemaker_server(server_factory, make_repo, deep_cache)
    r = requests.post(f"{url}/models", json={"model_name": "linked", "url": str(archive)}, timeout=60)
    assert r.status_code == 200, r.text


# ---- config fields that name files ---------------------------------------------------------


def labelled_config(label_filename):
    return f"""name: "labelled"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 5 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "{label_filename}" }} ]
"""


def explicit_server(server_factory, repo):
    return server_factory(repo, ["--model-control-mode=explicit"])


def load(srv, name, body=None):
    return srv.post(f"/v2/repository/models/{name}/load", json=body or {})


def test_label_filename_outside_is_refused(server_factory, make_repo):
    repo = make_repo({"labelled": "labelled"})
    (repo / "labelled" / "config.pbtxt").write_text(labelled_config("../../../../../../../etc/passwd"))
    srv = explicit_server(server_factory, repo)
    r = load(srv, "labelled")
    assert r.status_code == 400, r.text
    assert "label_filename" in r.json()["error"] and "outside the model folder" in r.json()["error"]
    # And no classification answers with the host's files.
    r = srv.post("/v2/models/labelled/infer", json={
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 5], "data": [1] * 5}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 5}}]})
    assert r.status_code != 200 and "root:" not in r.text, r.text


def test_label_file_linking_out_is_refused(server_factory, make_repo):
    repo = make_repo({"labelled": "labelled"})
    (repo / "labelled" / "labels.txt").unlink()
    os.symlink("/etc/passwd", repo / "labelled" / "labels.txt")
    srv = explicit_server(server_factory, repo)
    r = load(srv, "labelled")
    assert r.status_code == 400, r.text
    assert "label_filename" in r.json()["error"] and "link" in r.json()["error"]


def test_label_filename_through_the_load_api_config(server_factory, make_repo):
    repo = make_repo({"labelled": "labelled"})
    srv = explicit_server(server_factory, repo)
    cfg = {"name": "labelled", "platform": "onnxruntime_onnx", "max_batch_size": 8,
           "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [5]}],
           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [5],
                       "label_filename": "../../../../../../../../etc/passwd"}]}
    r = load(srv, "labelled", {"parameters": {"config": json.dumps(cfg)}})
    assert r.status_code == 400, r.text
    assert "label_filename" in r.json()["error"]
    # The good labels still load.
    cfg["output"][0]["label_filename"] = "labels.txt"
    assert load(srv, "labelled", {"parameters": {"config": json.dumps(cfg)}}).status_code == 200


@pytest.mark.parametrize("field,extra", [
    ("default_model_filename", 'default_model_filename: "../../other/1/model.onnx"\n'),
    ("default_model_filename", 'default_model_filename: "../../../../../../etc/hostname"\n'),
    ("input_data_file", """model_warmup [ { name: "w" batch_size: 1
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "../../../../../../../etc/passwd" } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } } ]
"""),
    ("optimized_model_filepath",
     'parameters { key: "optimized_model_filepath" value: { string_value: "/tmp/inferd-opt-escape.onnx" } }\n'),
])
def test_file_fields_outside_are_refused(server_factory, make_repo, tmp_path, field, extra):
    repo = make_repo({"simple": "simple", "other": "simple"})
    cfg = repo / "simple" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + extra)
    srv = explicit_server(server_factory, repo)
    r = load(srv, "simple")
    assert r.status_code == 400, r.text
    assert field in r.json()["error"], r.text


def test_initial_state_data_file_outside_is_refused(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    cfg = repo / "simple" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + """sequence_batching {
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state: [ { name: "s" data_type: TYPE_INT32 dims: [ 1 ] data_file: "../../../../../../etc/passwd" } ] } ]
}
""")
    srv = explicit_server(server_factory, repo)
    r = load(srv, "simple")
    assert r.status_code == 400, r.text
    assert "data_file" in r.json()["error"], r.text


def test_model_config_name_cannot_leave_configs(server_factory, make_repo, tmp_path, logs_dir):
    repo = make_repo({"simple": "simple"})
    (tmp_path / "evil.pbtxt").write_text('name: "simple"\nbackend: "identity"\n')
    srv = server_factory(repo, ["--model-control-mode=explicit",
                                "--model-config-name=../../evil"], wait_live=False)
    srv.proc.wait(timeout=60)
    assert srv.proc.returncode != 0
    assert "--model-config-name" in srv.log()


def test_configs_file_linking_out_is_refused(server_factory, make_repo, tmp_path):
    repo = make_repo({"simple": "simple"})
    (tmp_path / "outside.pbtxt").write_text((repo / "simple" / "config.pbtxt").read_text())
    (repo / "simple" / "configs").mkdir()
    os.symlink(tmp_path / "outside.pbtxt", repo / "simple" / "configs" / "alt.pbtxt")
    srv = server_factory(repo, ["--model-control-mode=explicit", "--model-config-name=alt"])
    r = load(srv, "simple")
    assert r.status_code == 400, r.text
    assert "configs/alt.pbtxt" in r.json()["error"], r.text


# ---- the Python backend's packed environment -----------------------------------------------

PY_CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}
"""
PY_MODEL = '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y",
            pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
'''


def test_execution_env_path_runs_no_shell(server_factory, tmp_path):
    marker = f"inferd-pwned-{secrets.token_hex(4)}"
    repo = tmp_path / "repo"
    env_name = f"env'; touch {marker}; echo '.tar.gz"
    d = write_model(repo, "inj", PY_CONFIG.format(name="inj", env=f"$$TRITON_MODEL_DIRECTORY/{env_name}"),
                    PY_MODEL)
    (d / env_name).write_bytes(b"not a tarball")
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    try:
        r = load(srv, "inj")
        assert not (Path.cwd() / marker).exists(), "the environment's name ran as a shell command"
        assert r.status_code == 400, r.text
        assert "EXECUTION_ENV_PATH" in r.json()["error"]
    finally:
        (Path.cwd() / marker).unlink(missing_ok=True)


def test_execution_env_path_outside_the_model_is_refused(server_factory, tmp_path):
    repo = tmp_path / "repo"
    (tmp_path / "shared_env").mkdir()
    write_model(repo, "outside", PY_CONFIG.format(name="outside", env=str(tmp_path / "shared_env")),
                PY_MODEL)
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    r = load(srv, "outside")
    assert r.status_code == 400, r.text
    assert "EXECUTION_ENV_PATH" in r.json()["error"] and "outside the model folder" in r.json()["error"]


def test_execution_env_archive_cannot_write_outside(server_factory, tmp_path):
    repo = tmp_path / "repo"
    d = write_model(repo, "envchain", PY_CONFIG.format(name="envchain",
                                                       env="$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                    PY_MODEL)
    (d / "env.tar.gz").write_bytes(tar_bytes(CHAIN))
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    r = load(srv, "envchain")
    assert r.status_code == 400, r.text
    for top in (Path("/"), Path("/tmp")):
        assert "x-escaped" not in {p.name for p in top.iterdir()}


# ---- the model cache -----------------------------------------------------------------------


def test_cache_owned_or_writable_by_others_is_refused(server_factory, make_repo, tmp_path,
                                                     example_models):
    archive = tmp_path / "simple.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(Path(example_models) / "simple", arcname="simple")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    srv, url = sagemaker_server(server_factory, make_repo, cache)
    r = requests.post(f"{url}/models", json={"model_name": "s", "url": str(archive)}, timeout=60)
    assert r.status_code == 500, r.text
    assert "chmod go-w" in r.json()["error"], r.text
    os.chmod(cache, 0o700)
    r = requests.post(f"{url}/models", json={"model_name": "s", "url": str(archive)}, timeout=60)
    assert r.status_code == 200, r.text
    if os.geteuid() == 0:
        os.chown(cache, 65534, 65534)  # nobody's
        r = requests.post(f"{url}/models", json={"model_name": "s2", "url": str(archive)}, timeout=60)
        assert r.status_code == 500 and "owned by uid 65534" in r.json()["error"], r.text


def test_default_cache_is_private(server_factory, make_repo, tmp_path, example_models, monkeypatch):
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    archive = tmp_path / "simple.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(Path(example_models) / "simple", arcname="simple")
    port = free_port()
    server_factory(make_repo({}), ["--allow-sagemaker=true", f"--sagemaker-port={port}",
                                   "--sagemaker-address=127.0.0.1"])
    r = requests.post(f"http://127.0.0.1:{port}/models", json={"model_name": "s", "url": str(archive)},
                      timeout=60)
    assert r.status_code == 200, r.text
    cache = xdg / "inferd" / "model-cache"
    assert cache.is_dir()
    for p in (xdg / "inferd", cache):
        assert (p.stat().st_mode & 0o777) == 0o700, oct(p.stat().st_mode)


def test_cache_cap_trims_unloaded_models_least_recently_used(server_factory, make_repo, tmp_path,
                                                             example_models):
    archives = {}
    for n in ("one", "two", "three"):
        archives[n] = tmp_path / f"{n}.tar.gz"
        with tarfile.open(archives[n], "w:gz") as tar:
            tar.add(Path(example_models) / "simple", arcname="simple")
    size = sum(f.stat().st_size for f in (Path(example_models) / "simple").rglob("*") if f.is_file())
    cache = tmp_path / "cache"
    # Room for two extractions, not three.
    srv, url = sagemaker_server(server_factory, make_repo, cache,
                                f"--model-cache-max-bytes={int(size * 2.5)}")

    def entry(n):
        found = [p for p in (cache / "local").glob(f"{n}.tar.gz@*") if not p.name.endswith(".partial")]
        return found[0] if found else None

    def backdate(n):  # as if last used an hour ago (entries used in the last minute are kept)
        os.utime(entry(n), (os.stat(entry(n)).st_atime, os.stat(entry(n)).st_mtime - 3600))

    for n in ("one", "two"):
        r = requests.post(f"{url}/models", json={"model_name": n, "url": str(archives[n])}, timeout=60)
        assert r.status_code == 200, r.text
        backdate(n)
    # `one` is unloaded, `two` stays loaded: the third extraction removes `one` only.
    assert requests.delete(f"{url}/models/one", timeout=60).status_code == 200
    r = requests.post(f"{url}/models", json={"model_name": "three", "url": str(archives["three"])},
                      timeout=60)
    assert r.status_code == 200, r.text
    assert entry("one") is None, sorted(p.name for p in (cache / "local").iterdir())
    assert entry("two") is not None and entry("three") is not None
    assert "to stay under the cap" in srv.log()
