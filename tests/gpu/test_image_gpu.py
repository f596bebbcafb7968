"""Image preprocessing on the GPU (issue 30): the image backend's GPU instances (decode on the
CPU, resize / crop / normalize as a CUDA kernel) give the CPU instances' bytes exactly, and the
image_classifier ensemble with its preprocessing on the GPU gives the scores it gives with the
preprocessing on the CPU, the classifier being the same GPU ResNet-50 (make_models.py's
image_preprocess_{gpu,cpu} and image_classifier_{gpu,cpu}).

Exactness: the kernel and the CPU path share gpu/image_preprocess_math.h, every float operation
unfused, so the preprocessed tensors are compared bit for bit. The classifier's scores are
compared within 1e-5 relative (the classifier gets the same input bytes; what may differ is
cuDNN's choice of algorithm for another batch size), with the same top-1 class.

In image_classifier_gpu the preprocessing's output stays on the GPU (an ensemble step's batch)
and goes to the GPU classifier's input without a trip through the host. The `output_on_gpu`
variant (image_preprocess_gpu_keep) leaves it on the GPU for clients too: the server copies it to
the host at its edge for the HTTP answer (backends/tensor_places.h).

Self-contained like test_gpu_instances.py (whose Server it uses): $INFERD_BIN, $GPU_MODELS_DIR,
skips without a GPU.
"""

import concurrent.futures
import io
import json
import os

import numpy as np
import pytest
import requests

from test_gpu_instances import Server, _has_gpu, models  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif(not _has_gpu(), reason="no GPU (nvidia-smi lists none)")


def _images():
    """Encoded test images: JPEG and PNG, several sizes and aspect ratios, gray too (smooth
    patterns plus noise, so a resize has something to get wrong)."""
    try:
        from PIL import Image
    except ImportError:
        pytest.skip("PIL is not installed here")
    rng = np.random.default_rng(30)
    out = []
    for (w, h), fmt, mode in (((640, 480), "JPEG", "RGB"), ((300, 200), "PNG", "RGB"),
                              ((1024, 768), "JPEG", "RGB"), ((97, 131), "PNG", "RGB"),
                              ((256, 256), "JPEG", "L"), ((500, 333), "JPEG", "RGB"),
                              ((224, 600), "PNG", "RGB"), ((1280, 720), "JPEG", "RGB")):
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)),
                         ((xx + yy) * 3) % 256], -1).astype(np.float64)
        noisy = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        img = Image.fromarray(noisy, "RGB")
        if mode == "L":
            img = img.convert("L")
        buf = io.BytesIO()
        img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        out.append(buf.getvalue())
    return out


def _infer(srv, model, image, output):
    """One image as a [1, L] UINT8 tensor; the named output as float32 (binary extension)."""
    header = {"inputs": [{"name": "IMAGE", "shape": [1, len(image)], "datatype": "UINT8",
                          "parameters": {"binary_data_size": len(image)}}],
              "outputs": [{"name": output, "parameters": {"binary_data": True}}]}
    head = json.dumps(header).encode()
    r = requests.post(f"{srv.url}/v2/models/{model}/infer", data=head + image,
                      headers={"Inference-Header-Content-Length": str(len(head)),
                               "Content-Type": "application/octet-stream"}, timeout=120)
    assert r.status_code == 200, f"{model}: HTTP {r.status_code}: {r.text[:500]}"
    hlen = int(r.headers["Inference-Header-Content-Length"])
    out = json.loads(r.content[:hlen])["outputs"][0]
    return np.frombuffer(r.content[hlen:], dtype=np.float32).reshape(out["shape"])


@pytest.fixture
def server(models, tmp_path):  # noqa: F811
    started = []

    def start(names):
        where = tmp_path / f"s{len(started)}"
        where.mkdir()
        srv = Server(models, names, where)
        started.append(srv)
        for n in names:
            srv.wait_ready(n)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.mark.parametrize("gpu_model", ["image_preprocess_gpu", "image_preprocess_gpu_keep"])
def test_gpu_preprocessing_equals_cpu_bit_for_bit(server, gpu_model, capsys):
    srv = server([gpu_model, "image_preprocess_cpu"])
    assert "(GPU device 0)" in srv.log(), srv.log()  # the load line's instance list
    images = _images()
    # Concurrent requests, so that the GPU instances run batches of several images.
    with concurrent.futures.ThreadPoolExecutor(len(images)) as pool:
        gpu = list(pool.map(lambda im: _infer(srv, gpu_model, im, "PREPROCESSED"), images * 2))
    cpu = [_infer(srv, "image_preprocess_cpu", im, "PREPROCESSED") for im in images * 2]
    st = srv.stats(gpu_model)
    with capsys.disabled():
        print(f"\n{gpu_model}: {len(gpu)} images, {st['execution_count']} GPU executions")
    for i, (g, c) in enumerate(zip(gpu, cpu)):
        assert g.shape == c.shape == (1, 3, 224, 224)
        differ = int(np.count_nonzero(g.view(np.uint32) != c.view(np.uint32)))
        assert differ == 0, (f"image {i % len(images)}: {differ} of {g.size} values differ from "
                             f"the CPU's (max abs {float(np.abs(g - c).max()):.3g})")


@pytest.mark.parametrize("gpu_model", ["image_classifier_gpu", "image_classifier_gpu_keep"])
def test_image_classifier_with_gpu_preprocessing_equals_cpu(server, gpu_model, capsys):
    preprocess = gpu_model.replace("classifier", "preprocess")
    srv = server(["resnet50_onnx_gpu", preprocess, "image_preprocess_cpu", gpu_model,
                  "image_classifier_cpu"])
    errors = []
    for i, im in enumerate(_images()):
        g = _infer(srv, gpu_model, im, "SCORES")
        c = _infer(srv, "image_classifier_cpu", im, "SCORES")
        assert g.shape == c.shape == (1, 1000)
        err = float(np.linalg.norm(g.astype(np.float64) - c) / max(np.linalg.norm(c), 1e-30))
        errors.append(err)
        assert err <= 1e-5, f"image {i}: scores differ, relative error {err:.2e}"
        assert int(g.argmax()) == int(c.argmax()), f"image {i}: top-1 class differs"
    with capsys.disabled():
        print(f"\n{gpu_model}: GPU vs CPU preprocessing, scores relative error max "
              f"{max(errors):.2e}")
