"""Triton's instance-group defaults on a host with a GPU (issue 29).

A config without `instance_group` is one KIND_AUTO group named after the model, which Triton
resolves to KIND_GPU on every GPU when the host has one, one instance per GPU (the SageMaker
articles' configs often set none). The Python backend takes KIND_GPU as Triton's does: model.py
runs on the CPU and reads args["model_instance_kind"] == "GPU" and the device id. The CPU-host
half of these rules is tests/integration/test_gpu_placement.py and tests/unit/placement_test.cc.

    INFERD_BIN=build/inferd python3 -m pytest -q tests/gpu/test_gpu_defaults.py
"""

import os
from pathlib import Path

import numpy as np
import pytest
import requests

from test_gpu_instances import _has_gpu, start_with_python_stub

pytestmark = pytest.mark.skipif(not _has_gpu(), reason="no GPU (nvidia-smi lists none)")


KIND_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.where = np.array([1.0 if args["model_instance_kind"] == "GPU" else 0.0,
                               float(args["model_instance_device_id"])], dtype=np.float32)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", self.where)])
                for _ in requests]
'''

PY_IO = ('backend: "python"\nmax_batch_size: 0\n'
         'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
         'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models_dir = os.environ.get("GPU_MODELS_DIR")
    onnx_src = Path(models_dir, "resnet50_onnx_gpu") if models_dir else None
    tmp = tmp_path_factory.mktemp("gpu_defaults")
    root = tmp / "models"
    names = ["py_auto", "py_gpu"]
    for name, extra in (("py_auto", ""), ("py_gpu", "instance_group [ { kind: KIND_GPU } ]\n")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(PY_IO + extra)
        (root / name / "1" / "model.py").write_text(KIND_PY)
    if onnx_src is not None and onnx_src.is_dir():
        # The generated ResNet-50 ONNX with its config's instance_group removed.
        (root / "onnx_auto" / "1").mkdir(parents=True)
        os.symlink(onnx_src / "1" / "model.onnx", root / "onnx_auto" / "1" / "model.onnx")
        text = (onnx_src / "config.pbtxt").read_text()
        start = text.find("instance_group")
        if start >= 0:
            end = text.find("]", start)
            text = text[:start] + text[end + 1:]
        text = text.replace('name: "resnet50_onnx_gpu"', 'name: "onnx_auto"')
        (root / "onnx_auto" / "config.pbtxt").write_text(text)
        names.append("onnx_auto")
    srv = start_with_python_stub(root, names, tmp)
    try:
        for n in names:
            srv.wait_ready(n, timeout=150)
        srv.names = names
        yield srv
    finally:
        srv.stop()


def groups(srv, name):
    cfg = requests.get(f"{srv.url}/v2/models/{name}/config", timeout=10).json()
    return [(g["name"], g["kind"], int(g["count"]), [int(i) for i in g.get("gpus", [])])
            for g in cfg["instance_group"]]


def test_python_instances_are_told_their_gpu(server):
    # KIND_AUTO with a GPU on the host: Triton's KIND_GPU, one instance on GPU 0.
    for name in ("py_auto", "py_gpu"):
        kind = groups(server, name)[0][1]
        assert kind == "KIND_GPU", (name, groups(server, name))
        y = server.infer(name, {"X": np.zeros(2, np.float32)}, "Y")
        np.testing.assert_array_equal(y, [1.0, 0.0])


def test_onnx_without_instance_group_runs_on_the_gpu(server):
    if "onnx_auto" not in server.names:
        pytest.skip("resnet50_onnx_gpu was not generated (GPU_MODELS_DIR)")
    g = groups(server, "onnx_auto")
    assert len(g) == 1 and g[0][0] == "onnx_auto" and g[0][1] == "KIND_GPU" and g[0][2] == 1, g
    assert "(GPU device 0)" in server.log(), server.log()
