"""ResNet-50 example (torchvision, random weights with torch.manual_seed(0)) exported to ONNX.

Slow: deselect with -m "not resnet". The reference input/output pair is computed by torch at
generation time (examples/model_repository/resnet50/reference_*.npy)."""

import numpy as np
import pytest

from conftest import start_server
from v2client import infer, make_input, parse_response

pytestmark = pytest.mark.resnet


@pytest.fixture(scope="module")
def resnet_server(tmp_path_factory, example_models, logs_dir):
    repo = tmp_path_factory.mktemp("resnet_repo")
    (repo / "resnet50").symlink_to(example_models / "resnet50", target_is_directory=True)
    srv = start_server(repo, [], logs_dir)
    srv.wait_until(lambda: srv.get("/v2/models/resnet50/ready").status_code == 200, 120,
                   "resnet50 to be ready")
    yield srv
    rc = srv.stop()
    assert rc == 0, srv.log()


def test_resnet50_matches_torch(resnet_server, example_models):
    x = np.load(example_models / "resnet50" / "reference_input.npy")
    expected = np.load(example_models / "resnet50" / "reference_output.npy")
    r = infer(resnet_server, "resnet50", [make_input("input", x, "FP32", binary=True)],
              outputs=[{"name": "output", "parameters": {"binary_data": True}}])
    assert r.status_code == 200, r.text[:500]
    hdr, out = parse_response(r)
    got = out["output"]
    assert got.shape == (2, 1000)
    assert hdr["outputs"][0]["datatype"] == "FP32"
    tol = 1e-3 * np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=tol)
    np.testing.assert_array_equal(got.argmax(axis=1), expected.argmax(axis=1))


def test_resnet50_metadata_and_config(resnet_server):
    md = resnet_server.get("/v2/models/resnet50").json()
    assert md["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
    assert md["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 1000]}]
    cfg = resnet_server.get("/v2/models/resnet50/config").json()
    assert int(cfg["max_batch_size"]) == 8
    params = {k: v["string_value"] for k, v in cfg["parameters"].items()}
    assert params["intra_op_thread_count"] == "2"
    assert params["execution_mode"] == "0"
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert int(cfg["instance_group"][0]["count"]) == 1
    assert int(cfg["optimization"]["graph"]["level"]) == 1


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS line")


def test_unload_gives_the_memory_back(server_factory, example_models, tmp_path):
    # After an unload the allocator's free pages go back to the kernel (tcmalloc's
    # ReleaseFreeMemory, or malloc_trim on glibc): without that, glibc kept 115 of the
    # 125 MB this model added, so a multi-model eviction freed almost nothing.
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "resnet50").symlink_to(example_models / "resnet50", target_is_directory=True)
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    base = _rss_kib(srv.proc.pid)
    assert srv.post("/v2/repository/models/resnet50/load").status_code == 200
    x = np.load(example_models / "resnet50" / "reference_input.npy")
    r = infer(srv, "resnet50", [make_input("input", x, "FP32", binary=True)],
              outputs=[{"name": "output", "binary_data": True}])
    assert r.status_code == 200, r.text
    loaded = _rss_kib(srv.proc.pid)
    growth = loaded - base
    assert growth > 80 * 1024, f"loading ResNet-50 added only {growth} KiB"
    assert srv.post("/v2/repository/models/resnet50/unload").status_code == 200
    after = _rss_kib(srv.proc.pid)
    kept = after - base
    assert kept < growth * 0.4, \
        f"RSS {base} KiB before load, {loaded} KiB loaded, {after} KiB after unload"
