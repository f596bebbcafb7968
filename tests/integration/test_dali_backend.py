"""The dali backend (backend: "dali") through the real server: Triton DALI-backend models run
unchanged, without DALI.

model.dali files are generated here by tests/models/gen_dali_models.py with two independent
writers (inferd's nvidia.dali package, and the protobuf package from DALI's field numbers);
dali.py is serialized by the server at load. Outputs are compared with dali_reference.py, a numpy
reference written from DALI's documentation.

Tolerance: the server resizes in float32, the reference in float64; both round the resized
UINT8 image to nearest, so a value sitting on a .5 tie may land one grey level apart. After
normalization that is 1 / std[c] (1 / (0.229 * 255) = 0.0171 for ImageNet's std), so every
element must be within 1.001 / min(std) of the reference, and the mean absolute difference below
1e-3 (measured: see the test's printed figures; typically 1e-5). FP16 outputs add half
precision: rtol 1e-3.

    INFERD_BIN=build/inferd /usr/bin/python3 -m pytest -q tests/integration/test_dali_backend.py
"""

import io
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import dali_reference as ref
from conftest import start_server
from v2client import assert_error, infer, make_input, parse_response

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import gen_dali_models as gen  # noqa: E402

MEAN = np.array(gen.IMAGENET_MEAN)
STD = np.array(gen.IMAGENET_STD)
ARTICLE_CONFIG = """
name: "dali"
backend: "dali"
max_batch_size: 256
input [ { name: "DALI_INPUT_0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "DALI_OUTPUT_0" data_type: TYPE_FP32 dims: [ 299, 299, 3 ] } ]
parameters: [ { key: "num_threads" value: { string_value: "12" } } ]
"""


def pattern(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([np.sin(x / (7 + 3 * c) + y / (11 + c)) * 90 + 128 for c in range(3)], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def encode(arr, fmt, mode=None, **kw):
    img = Image.fromarray(arr)
    if mode:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def jpeg(w, h, seed, gray=False):
    return encode(pattern(w, h, seed), "JPEG", "L" if gray else None, quality=90)


def png(w, h, seed):
    return encode(pattern(w, h, seed), "PNG")


def uint8_batch(images):
    n = max(len(d) for d in images)
    arr = np.zeros((len(images), n), np.uint8)
    for i, d in enumerate(images):
        arr[i, :len(d)] = np.frombuffer(d, np.uint8)
    return arr


def model(repo, name, config, files):
    d = Path(repo) / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    for fname, data in files.items():
        target = d / "1" / fname
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data)


def io_config(name, in_name, out_name, out_type, dims, mbs=8, extra=""):
    return f"""
name: "{name}"
backend: "dali"
max_batch_size: {mbs}
input [ {{ name: "{in_name}" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
output [ {{ name: "{out_name}" data_type: {out_type} dims: [ {", ".join(map(str, dims))} ] }} ]
{extra}"""


def write_inception_onnx(path):
    """Stands in for the article's TensorFlow Inception (same input and output names and
    shapes): global average pool over H and W, a fixed 3x1001 matrix, softmax."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = inception_weights()
    nodes = [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1, 2], keepdims=0),
             helper.make_node("MatMul", ["pooled", "W"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["InceptionV3/Predictions/Softmax"], axis=1)]
    graph = helper.make_graph(
        nodes, "inception_stand_in",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 299, 299, 3])],
        [helper.make_tensor_value_info("InceptionV3/Predictions/Softmax", TensorProto.FLOAT,
                                       [None, 1001])],
        [numpy_helper.from_array(w, "W")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))


def inception_weights():
    return np.random.default_rng(5).normal(0, 3, (3, 1001)).astype(np.float32)


def inception_reference(pre):
    logits = pre.mean(axis=(1, 2)) @ inception_weights().astype(np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


ENSEMBLE = """
name: "ensemble_dali_inception"
platform: "ensemble"
max_batch_size: 256
input [ { name: "INPUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1001 ] } ]
ensemble_scheduling {
  step [
    { model_name: "dali" model_version: -1
      input_map { key: "DALI_INPUT_0" value: "INPUT" }
      output_map { key: "DALI_OUTPUT_0" value: "preprocessed_image" } },
    { model_name: "inception_graphdef" model_version: -1
      input_map { key: "input" value: "preprocessed_image" }
      output_map { key: "InceptionV3/Predictions/Softmax" value: "OUTPUT" } }
  ]
}
"""

INCEPTION = """
name: "inception_graphdef"
platform: "onnxruntime_onnx"
max_batch_size: 256
input [ { name: "input" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 299, 299, 3 ] } ]
output [ { name: "InceptionV3/Predictions/Softmax" data_type: TYPE_FP32 dims: [ 1001 ] } ]
"""


@pytest.fixture(scope="module")
def dali_server(tmp_path_factory, logs_dir):
    files = gen.write(tmp_path_factory.mktemp("dali_files"))
    repo = tmp_path_factory.mktemp("dali_repo")
    model(repo, "dali", ARTICLE_CONFIG, {"model.dali": (files / "article.dali").read_bytes()})
    model(repo, "dali_py", ARTICLE_CONFIG.replace('name: "dali"', 'name: "dali_py"'),
          {"dali.py": (files / "dali.py").read_text()})
    model(repo, "resnet_chw", io_config("resnet_chw", "IMAGES", "OUT", "TYPE_FP32", [3, 224, 224]),
          {"model.dali": (files / "resnet_chw.dali").read_bytes()})
    model(repo, "resnet_hwc_mirror",
          io_config("resnet_hwc_mirror", "IMAGES", "OUT", "TYPE_FP32", [224, 224, 3]),
          {"model.dali": (files / "resnet_hwc_mirror.dali").read_bytes()})
    model(repo, "resnet_gray", io_config("resnet_gray", "IMAGES", "OUT", "TYPE_FP32", [1, 224, 224]),
          {"model.dali": (files / "resnet_gray.dali").read_bytes()})
    model(repo, "resnet_fp16", io_config("resnet_fp16", "IMAGES", "OUT", "TYPE_FP16", [3, 224, 224]),
          {"model.dali": (files / "resnet_fp16.dali").read_bytes()})
    model(repo, "arithmetic", io_config("arithmetic", "RAW", "OUT", "TYPE_FP32", [3, 32, 48]),
          {"model.dali": (files / "arithmetic.dali").read_bytes()})
    model(repo, "handbuilt", io_config("handbuilt", "INPUT_IMAGES", "OUT", "TYPE_FP32", [3, 48, 64]),
          {"model.dali": (files / "handbuilt.dali").read_bytes()})
    # No input, output or max_batch_size in the config: auto-completed from the pipeline.
    model(repo, "autocomplete", 'name: "autocomplete"\nbackend: "dali"\n',
          {"model.dali": (files / "resnet_chw.dali").read_bytes()})
    model(repo, "unsupported", io_config("unsupported", "IN", "OUT", "TYPE_UINT8", [-1, -1, 3]),
          {"model.dali": (files / "unsupported.dali").read_bytes()})
    model(repo, "ensemble_dali_inception", ENSEMBLE, {})
    (repo / "inception_graphdef" / "1").mkdir(parents=True)
    (repo / "inception_graphdef" / "config.pbtxt").write_text(INCEPTION)
    write_inception_onnx(repo / "inception_graphdef" / "1" / "model.onnx")
    srv = start_server(repo, ["--exit-on-error=false", "--strict-readiness=false"], logs_dir)
    for name in ("dali", "dali_py", "ensemble_dali_inception", "autocomplete"):
        srv.wait_until(lambda: srv.get(f"/v2/models/{name}/ready").status_code == 200, 120,
                       f"{name} to be ready")
    yield srv
    rc = srv.stop()
    assert rc == 0, srv.log()


def run(srv, name, images, in_name="DALI_INPUT_0", out_name="DALI_OUTPUT_0", binary=True):
    r = infer(srv, name, [make_input(in_name, uint8_batch(images), "UINT8", binary=binary)],
              outputs=[{"name": out_name, "parameters": {"binary_data": binary}}])
    assert r.status_code == 200, r.text[:500]
    return parse_response(r)[1][out_name]


def check_close(got, want, std, what):
    diff = np.abs(got.astype(np.float64) - want)
    bound = 1.001 / np.min(std) + 1e-4
    print(f"{what}: max abs diff {diff.max():.3g}, mean {diff.mean():.3g} (bound {bound:.3g})")
    assert got.shape == want.shape
    assert diff.max() <= bound, f"{what}: max abs diff {diff.max()}"
    assert diff.mean() <= 1e-3, f"{what}: mean abs diff {diff.mean()}"


def article_reference(data):
    img = ref.decode(data)
    img = ref.resize(img, 299, 299)
    return ref.crop_mirror_normalize(img, (299, 299), MEAN, STD, layout="HWC")


IMAGES = [jpeg(640, 480, 1), png(300, 200, 2), jpeg(256, 320, 3, gray=True), png(120, 90, 4)]


@pytest.mark.parametrize("name", ["dali", "dali_py"])
@pytest.mark.parametrize("binary", [True, False])
def test_article_pipeline_matches_reference(dali_server, name, binary):
    out = run(dali_server, name, IMAGES, binary=binary)
    assert out.shape == (len(IMAGES), 299, 299, 3) and out.dtype == np.float32
    for i, data in enumerate(IMAGES):
        check_close(out[i], article_reference(data), STD, f"{name} image {i}")


def resnet_reference(data, layout="CHW", mirror=False, gray=False):
    img = ref.decode(data, "GRAY" if gray else "RGB")
    h, w = ref.shorter_side(img.shape[0], img.shape[1], 256)
    img = ref.resize(img, h, w)
    mean, std = (MEAN[:1], STD[:1]) if gray else (MEAN, STD)
    return ref.crop_mirror_normalize(img, (224, 224), mean, std, mirror=mirror, layout=layout)


@pytest.mark.parametrize("name,kw", [
    ("resnet_chw", {}),
    ("resnet_hwc_mirror", {"layout": "HWC", "mirror": True}),
    ("resnet_gray", {"gray": True}),
])
def test_resnet_variants_match_reference(dali_server, name, kw):
    out = run(dali_server, name, IMAGES, "IMAGES", "OUT")
    for i, data in enumerate(IMAGES):
        check_close(out[i], resnet_reference(data, **kw), STD, f"{name} image {i}")


def test_fp16_output(dali_server):
    out = run(dali_server, "resnet_fp16", IMAGES[:2], "IMAGES", "OUT")
    assert out.dtype == np.float16
    for i, data in enumerate(IMAGES[:2]):
        want = resnet_reference(data)
        np.testing.assert_allclose(out[i].astype(np.float64), want, rtol=1e-3,
                                   atol=1.001 / STD.min() + 1e-3)


def test_crop_cast_arithmetic_transpose(dali_server):
    out = run(dali_server, "arithmetic", IMAGES, "RAW", "OUT")
    for i, data in enumerate(IMAGES):
        img = ref.resize(ref.decode(data, "BGR"), 40, 50, antialias=False)
        img = ref.crop(img, 32, 48, pos_x=0.0, pos_y=1.0)
        want = (img / 127.5 - 1.0).transpose(2, 0, 1)
        check_close(out[i], want, np.array([127.5]), f"arithmetic image {i}")


def test_handbuilt_protobuf_pipeline(dali_server):
    out = run(dali_server, "handbuilt", IMAGES, "INPUT_IMAGES", "OUT")
    mean, std = np.array([10.0, 20.0, 30.0]), np.array([50.0, 60.0, 70.0])
    for i, data in enumerate(IMAGES):
        img = ref.resize(ref.decode(data), 48, 64)
        check_close(out[i], ref.crop_mirror_normalize(img, None, mean, std), std,
                    f"handbuilt image {i}")


def test_autocomplete_from_pipeline(dali_server):
    r = dali_server.get("/v2/models/autocomplete/config")
    assert r.status_code == 200, r.text
    cfg = r.json()
    assert cfg["max_batch_size"] == 8  # the pipeline's batch_size
    assert cfg["input"][0]["name"] == "IMAGES"
    assert cfg["input"][0]["data_type"] == "TYPE_UINT8"
    assert cfg["input"][0]["allow_ragged_batch"] is True
    assert cfg["output"][0]["name"] == "DALI_OUTPUT_0"
    assert cfg["output"][0]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in cfg["output"][0]["dims"]] == [-1, -1, -1]
    out = run(dali_server, "autocomplete", IMAGES[:1], "IMAGES", "DALI_OUTPUT_0")
    check_close(out[0], resnet_reference(IMAGES[0]), STD, "autocomplete")


def test_unsupported_operator_fails_the_load_naming_it(dali_server):
    entries = {e["name"]: e for e in dali_server.post("/v2/repository/index", json={}).json()}
    assert entries["unsupported"]["state"] == "UNAVAILABLE"
    reason = entries["unsupported"]["reason"]
    assert "Rotate" in reason and "CropMirrorNormalize" in reason, reason


def test_bad_image_fails_only_its_request(dali_server):
    r = infer(dali_server, "dali", [make_input("DALI_INPUT_0", uint8_batch([b"not an image"]),
                                               "UINT8", binary=True)])
    assert_error(r, 400, "sample 0")
    out = run(dali_server, "dali", IMAGES[:1])  # the server still serves
    check_close(out[0], article_reference(IMAGES[0]), STD, "after a bad image")


@pytest.mark.parametrize("binary", [True, False])
def test_article_ensemble_with_onnx_classifier(dali_server, binary):
    arr = uint8_batch(IMAGES[:3])
    r = infer(dali_server, "ensemble_dali_inception", [make_input("INPUT", arr, "UINT8", binary=binary)],
              outputs=[{"name": "OUTPUT", "parameters": {"binary_data": binary}}])
    assert r.status_code == 200, r.text[:500]
    got = parse_response(r)[1]["OUTPUT"]
    want = inception_reference(np.stack([article_reference(d) for d in IMAGES[:3]]))
    assert got.shape == (3, 1001)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
