"""The image preprocessing backend (backend: "image") through the real server.

Images are generated here with PIL (smooth random patterns plus noise, so a resize has
something to get wrong), sent over HTTP with the binary tensor extension, and the outputs are
compared with the same steps done in numpy: decode with PIL (which uses the same
libjpeg-turbo / libpng, so decoding is bit-identical: checked exactly below), then the
half-pixel-centre bilinear resize (align_corners=False, no antialiasing; OpenCV INTER_LINEAR,
torch interpolate(antialias=False)) written in numpy, torchvision's Resize(n)+CenterCrop
geometry, then normalization.

Tolerances: FP32 outputs within 1e-4 of the float64 reference after normalization (the
server computes in float32; values are O(1)); UINT8 outputs are the unrounded reference
rounded to nearest, i.e. within 0.5 + 1e-3 of it (downscales by 4.8x hit exact .5 ties often,
which float32 and float64 break differently). Against PIL's own BILINEAR (antialiased): upscaling
within 1 grey level (mean 0.22 measured), 0.8x downscaling mean abs diff <= 2 (1.49 measured;
PIL averages over a wider window there).

    INFERD_BIN=build/inferd /usr/bin/python3 -m pytest -q tests/integration/test_image_backend.py
"""

import io
import threading
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import start_server
from v2client import assert_error, build_request, infer, make_input, parse_response

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------------------------
# models


def params(**kv):
    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                   for k, v in kv.items())


def write_model(repo, name, max_batch, input_type, output_type, dims, extra="", ragged=False):
    d = Path(repo) / name
    (d / "1").mkdir(parents=True)  # no model file: the backend needs none
    in_dims = "[ -1 ]" if input_type == "TYPE_UINT8" else "[ 1 ]"
    (d / "config.pbtxt").write_text(f"""
name: "{name}"
backend: "image"
max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: {input_type} dims: {in_dims}{" allow_ragged_batch: true" if ragged else ""} }} ]
output [ {{ name: "OUTPUT" data_type: {output_type} dims: [ {", ".join(map(str, dims))} ] }} ]
{extra}
""")


MODELS = {
    # The ResNet-style model: shorter side 256, centre 224, ImageNet normalization, NCHW RGB.
    "preprocess": dict(max_batch=8, input_type="TYPE_UINT8", output_type="TYPE_FP32",
                       dims=[3, 224, 224],
                       extra=params(resize_mode="shorter_side_center_crop", resize_shorter=256,
                                    mean=",".join(map(str, IMAGENET_MEAN)),
                                    std=",".join(map(str, IMAGENET_STD)))
                       + "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"),
    # The same with a TYPE_FP16 output: the FP32 value rounded to half, ties to even.
    "preprocess_fp16": dict(max_batch=8, input_type="TYPE_UINT8", output_type="TYPE_FP16",
                            dims=[3, 224, 224],
                            extra=params(resize_mode="shorter_side_center_crop",
                                         resize_shorter=256,
                                         mean=",".join(map(str, IMAGENET_MEAN)),
                                         std=",".join(map(str, IMAGENET_STD)))),
    "pre_nhwc_bgr": dict(max_batch=4, input_type="TYPE_UINT8", output_type="TYPE_FP32",
                         dims=[96, 128, 3],
                         extra=params(channel_order="BGR", mean="0.5", std="0.25")),
    "pre_uint8": dict(max_batch=8, input_type="TYPE_UINT8", output_type="TYPE_UINT8",
                      dims=[3, 100, 120], extra=""),
    # BYTES requests all have shape [n, 1], so concurrent ones batch in the dynamic batcher
    # (UINT8 [-1] requests with images of different lengths have different shapes and cannot).
    "pre_bytes": dict(max_batch=8, input_type="TYPE_STRING", output_type="TYPE_FP32",
                      dims=[3, 64, 64],
                      extra=params(resize_mode="shorter_side_center_crop", scale="1/127.5",
                                   mean="1")
                      + "dynamic_batching { max_queue_delay_microseconds: 100000 }\n"),
    # The preprocess model again, with allow_ragged_batch on its UINT8 [-1] input: requests
    # whose images differ in byte length share batches.
    "pre_ragged": dict(max_batch=8, input_type="TYPE_UINT8", output_type="TYPE_FP32",
                       dims=[3, 224, 224], ragged=True,
                       extra=params(resize_mode="shorter_side_center_crop", resize_shorter=256,
                                    mean=",".join(map(str, IMAGENET_MEAN)),
                                    std=",".join(map(str, IMAGENET_STD)))
                       + "dynamic_batching { max_queue_delay_microseconds: 100000 }\n"),
    "pre_nearest_nobatch": dict(max_batch=0, input_type="TYPE_UINT8", output_type="TYPE_UINT8",
                                dims=[50, 70, 3], extra=params(interpolation="nearest")),
}


@pytest.fixture(scope="module")
def image_server(tmp_path_factory, logs_dir):
    repo = tmp_path_factory.mktemp("image_repo")
    for name, m in MODELS.items():
        write_model(repo, name, **m)
    srv = start_server(repo, [], logs_dir)
    for name in MODELS:
        srv.wait_until(lambda: srv.get(f"/v2/models/{name}/ready").status_code == 200, 60,
                       f"model {name} to be ready")
    yield srv
    rc = srv.stop()
    assert rc == 0, f"inferd exited with {rc} after SIGTERM\n{srv.log()}"


# --------------------------------------------------------------------------------------------
# images and the numpy reference


def pattern(width, height, seed):
    """Smooth random sinusoids per channel plus noise, uint8 HxWx3."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    chans = []
    for _ in range(3):
        fx, fy, ph = rng.uniform(0.5, 4), rng.uniform(0.5, 4), rng.uniform(0, 2 * np.pi)
        v = 127 + 90 * np.sin(2 * np.pi * (fx * x / width + fy * y / height) + ph)
        chans.append(v + rng.normal(0, 10, (height, width)))
    return np.clip(np.stack(chans, -1), 0, 255).astype(np.uint8)


def encode(arr, fmt, mode=None, **kw):
    img = Image.fromarray(arr)
    if mode is not None:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def jpeg(width, height, seed, gray=False):
    return encode(pattern(width, height, seed), "JPEG", "L" if gray else None, quality=90)


def png(width, height, seed, mode=None):
    arr = pattern(width, height, seed)
    if mode == "RGBA":
        alpha = np.random.default_rng(seed + 1).integers(0, 256, (height, width), np.uint8)
        return encode(np.dstack([arr, alpha]), "PNG")
    return encode(arr, "PNG", mode)


def decode(data):
    """PIL's decode as the server should do it: grayscale/palette to RGB, alpha dropped."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def taps(n_in, resized, offset, n_out, nearest=False):
    scale = n_in / resized
    centre = (np.arange(n_out) + offset + 0.5) * scale
    if nearest:
        lo = np.minimum(np.floor(centre).astype(np.int64), n_in - 1)
        return lo, lo, np.zeros(n_out)
    src = np.maximum(centre - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, src - lo


def plan(w, h, out_h, out_w, mode, shorter):
    """(resized_w, resized_h, left, top): torchvision Resize(shorter) + CenterCrop."""
    if mode == "stretch":
        return out_w, out_h, 0, 0
    short, long = min(w, h), max(w, h)
    new_long = int(shorter * long / short)
    rw, rh = (shorter, new_long) if w <= h else (new_long, shorter)
    return rw, rh, int(round((rw - out_w) / 2.0)), int(round((rh - out_h) / 2.0))


def resize(rgb, out_h, out_w, mode="stretch", shorter=None, nearest=False):
    """HxWx3 uint8 -> out_h x out_w x 3 float64, classic half-pixel bilinear (or nearest)."""
    h, w = rgb.shape[:2]
    rw, rh, left, top = plan(w, h, out_h, out_w, mode, shorter or max(out_h, out_w))
    y0, y1, wy = taps(h, rh, top, out_h, nearest)
    x0, x1, wx = taps(w, rw, left, out_w, nearest)
    a = rgb.astype(np.float64)
    wx = wx[None, :, None]
    top_row = a[y0][:, x0] * (1 - wx) + a[y0][:, x1] * wx
    bottom_row = a[y1][:, x0] * (1 - wx) + a[y1][:, x1] * wx
    wy = wy[:, None, None]
    return top_row * (1 - wy) + bottom_row * wy


def normalize(v, scale=1 / 255, mean=(0, 0, 0), std=(1, 1, 1)):
    return (v * scale - np.asarray(mean)) / np.asarray(std)


def reference(name, data):
    """The expected output item of model `name` for encoded image `data` (config layout)."""
    rgb = decode(data)
    if name == "preprocess":
        v = normalize(resize(rgb, 224, 224, "shorter_side_center_crop", 256),
                      mean=IMAGENET_MEAN, std=IMAGENET_STD)
        return v.transpose(2, 0, 1)
    if name == "pre_ragged":
        return reference("preprocess", data)
    if name == "pre_nhwc_bgr":
        return normalize(resize(rgb, 96, 128)[..., ::-1], mean=(0.5,) * 3, std=(0.25,) * 3)
    if name == "pre_uint8":
        return resize(rgb, 100, 120).transpose(2, 0, 1)
    if name == "pre_bytes":
        v = normalize(resize(rgb, 64, 64, "shorter_side_center_crop"), scale=1 / 127.5,
                      mean=(1, 1, 1))
        return v.transpose(2, 0, 1)
    if name == "pre_nearest_nobatch":
        return resize(rgb, 50, 70, nearest=True)
    raise KeyError(name)


# --------------------------------------------------------------------------------------------
# requests


def uint8_batch(images):
    """[n, L] UINT8 tensor, rows zero-padded to the longest image (as DALI clients send)."""
    n = max(len(d) for d in images)
    arr = np.zeros((len(images), n), np.uint8)
    for i, d in enumerate(images):
        arr[i, :len(d)] = np.frombuffer(d, np.uint8)
    return arr


BINARY_OUT = [{"name": "OUTPUT", "parameters": {"binary_data": True}}]


def run(srv, model, images, bytes_input=False, batched=True):
    if bytes_input:
        arr = np.array([[d] for d in images], dtype=np.object_)
        inp = make_input("INPUT", arr, "BYTES", binary=True)
    else:
        arr = uint8_batch(images)
        inp = make_input("INPUT", arr if batched else arr[0], "UINT8", binary=True)
    return infer(srv, model, [inp], outputs=BINARY_OUT)


def outputs_of(resp):
    assert resp.status_code == 200, resp.text[:500]
    return parse_response(resp)[1]["OUTPUT"]


def check(model, images, out, batched=True):
    """Compares each item of `out` with the numpy reference within the stated tolerance."""
    assert out.shape[0] == len(images) if batched else True
    items = out if batched else [out]
    for i, (data, got) in enumerate(zip(images, items)):
        want = reference(model, data)
        assert got.shape == want.shape, (i, got.shape, want.shape)
        if got.dtype == np.uint8:
            # The reference before rounding: each output is it rounded to the nearest integer
            # (an exact .5 tie may go either way, float32 vs float64).
            diff = np.abs(got.astype(np.float64) - want)
            assert diff.max() <= 0.5 + 1e-3, f"item {i}: max diff {diff.max()}"
        else:
            diff = np.abs(got.astype(np.float64) - want)
            assert diff.max() <= 1e-4, f"item {i}: max abs diff {diff.max()}"


# --------------------------------------------------------------------------------------------
# tests


def test_decode_is_identical_to_pil(image_server):
    # Output size == image size: the resize is the identity, so this is the decoder alone.
    images = [jpeg(120, 100, 1), jpeg(120, 100, 2, gray=True), png(120, 100, 3),
              png(120, 100, 4, mode="RGBA"), png(120, 100, 5, mode="P"), png(120, 100, 6, "L")]
    out = outputs_of(run(image_server, "pre_uint8", images))
    for i, data in enumerate(images):
        np.testing.assert_array_equal(out[i], decode(data).transpose(2, 0, 1), f"image {i}")


def test_resnet_preprocess_batch_of_four_mixed(image_server):
    images = [jpeg(640, 480, 10), png(300, 200, 11), jpeg(200, 300, 12, gray=True),
              png(256, 256, 13, mode="RGBA")]
    out = outputs_of(run(image_server, "preprocess", images))
    assert out.shape == (4, 3, 224, 224) and out.dtype == np.float32
    check("preprocess", images, out)


def test_fp16_output_is_the_fp32_output_rounded_by_numpy(image_server):
    # numpy's float32 -> float16 rounds to nearest, ties to even: exactly what the server must
    # give, on the CPU as on the GPU (the kernel shares the conversion).
    images = [jpeg(640, 480, 14), png(300, 200, 15), jpeg(200, 300, 16, gray=True)]
    fp32 = outputs_of(run(image_server, "preprocess", images))
    fp16 = outputs_of(run(image_server, "preprocess_fp16", images))
    assert fp16.shape == (3, 3, 224, 224) and fp16.dtype == np.float16
    np.testing.assert_array_equal(fp16.view(np.uint16), fp32.astype(np.float16).view(np.uint16))
    # And within half precision of the float64 reference (values are O(1): |err| <= 2^-11 * |v|
    # plus the FP32 tolerance).
    for i, data in enumerate(images):
        want = reference("preprocess", data)
        err = np.abs(fp16[i].astype(np.float64) - want)
        assert (err <= np.abs(want) * 2.0 ** -11 + 1e-4).all(), f"item {i}: max {err.max()}"


def test_nhwc_bgr_stretch(image_server):
    images = [jpeg(640, 480, 20), png(300, 200, 21)]
    out = outputs_of(run(image_server, "pre_nhwc_bgr", images))
    assert out.shape == (2, 96, 128, 3)
    check("pre_nhwc_bgr", images, out)


def test_uint8_output_stretch(image_server):
    images = [jpeg(640, 480, 30), png(60, 40, 31)]  # downscale and upscale
    out = outputs_of(run(image_server, "pre_uint8", images))
    assert out.shape == (2, 3, 100, 120) and out.dtype == np.uint8
    check("pre_uint8", images, out)


def test_bytes_input_center_crop(image_server):
    images = [jpeg(640, 480, 40), png(300, 200, 41, mode="L"), jpeg(90, 160, 42)]
    out = outputs_of(run(image_server, "pre_bytes", images, bytes_input=True))
    assert out.shape == (3, 3, 64, 64)
    check("pre_bytes", images, out)


def test_nearest_without_batching(image_server):
    images = [jpeg(300, 200, 50)]
    out = outputs_of(run(image_server, "pre_nearest_nobatch", images, batched=False))
    assert out.shape == (50, 70, 3)
    check("pre_nearest_nobatch", images, out, batched=False)


def test_close_to_pil_bilinear_when_upscaling_or_mildly_downscaling(image_server):
    # PIL's BILINEAR is a triangle filter widened by the scale when downscaling (antialiased):
    # the same as the classic formula when upscaling, close for a mild downscale.
    up_img = png(96, 80, 60)                     # 96x80 -> 120x100 (1.25x)
    down_img = png(150, 125, 61)                 # 150x125 -> 120x100 (0.8x)
    out = outputs_of(run(image_server, "pre_uint8", [up_img, down_img]))
    for data, got, mean_tol, max_tol in ((up_img, out[0], 0.5, 1), (down_img, out[1], 2.0, 16)):
        pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((120, 100),
                                                                             Image.BILINEAR))
        diff = np.abs(got.transpose(1, 2, 0).astype(np.int64) - pil.astype(np.int64))
        assert diff.mean() <= mean_tol and diff.max() <= max_tol, (diff.mean(), diff.max())


def test_corrupt_image_is_400_naming_the_item(image_server):
    good = jpeg(64, 48, 70)
    resp = run(image_server, "preprocess", [good, good[: len(good) // 2]])
    assert_error(resp, 400, "image 1: corrupt JPEG: Premature end of JPEG file")
    resp = run(image_server, "preprocess", [b"GIF89a" + bytes(20)])
    assert_error(resp, 400, "image 0: not a JPEG or PNG (26 bytes, first bytes 47 49 46 38")
    p = png(64, 48, 71)
    resp = run(image_server, "pre_bytes", [p[:-40]], bytes_input=True)
    assert_error(resp, 400, "image 0: corrupt PNG:")
    # The server is still fine.
    check("preprocess", [good], outputs_of(run(image_server, "preprocess", [good])))


def test_corrupt_request_does_not_fail_its_batch_neighbours(image_server):
    # Concurrent BYTES requests meet in the dynamic batcher (100 ms window) and run as one
    # batch; only the request with the bad image fails.
    def batch_sizes():
        stats = image_server.get("/v2/models/pre_bytes/stats").json()
        return {b["batch_size"]: b["compute_infer"]["count"]
                for b in stats["model_stats"][0]["batch_stats"]}

    before = batch_sizes()
    good = [jpeg(320, 240, 80 + i) for i in range(6)]
    bad = good[0][:200]
    payloads = good[:3] + [bad] + good[3:]
    barrier = threading.Barrier(len(payloads))

    def send(data):
        barrier.wait()
        return run(image_server, "pre_bytes", [data], bytes_input=True)

    with futures.ThreadPoolExecutor(len(payloads)) as pool:
        answers = list(pool.map(send, payloads))
    for data, resp in zip(payloads, answers):
        if data is bad:
            assert_error(resp, 400, "image 0: corrupt JPEG: Premature end of JPEG file")
        else:
            check("pre_bytes", [data], outputs_of(resp))
    after = batch_sizes()
    grew = [size for size, n in after.items() if n > before.get(size, 0) and size > 1]
    assert grew, f"no batch of more than one request formed: {before} -> {after}"


def test_ragged_batch_merges_images_of_different_lengths(image_server):
    def executions_and_inferences():
        st = image_server.get("/v2/models/pre_ragged/stats").json()["model_stats"][0]
        return int(st["execution_count"]), int(st["inference_count"])

    before = executions_and_inferences()
    images = [jpeg(320 + 16 * i, 240, 90 + i) for i in range(6)]
    assert len({len(d) for d in images}) == 6  # six different UINT8 shapes
    barrier = threading.Barrier(len(images))

    def send(data):
        barrier.wait()
        return run(image_server, "pre_ragged", [data])

    with futures.ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(send, images))
    for data, resp in zip(images, answers):
        check("pre_ragged", [data], outputs_of(resp))
    execs, infers = executions_and_inferences()
    assert infers - before[1] == 6
    assert execs - before[0] < 6, "requests of different lengths never shared a batch"


def test_ragged_batch_needs_a_backend_that_takes_it(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    cfg = (repo / "simple" / "config.pbtxt").read_text()
    (repo / "simple" / "config.pbtxt").write_text(
        cfg.replace('name: "INPUT0"', 'name: "INPUT0"\n    allow_ragged_batch: true', 1))
    srv = server_factory([repo], ["--model-control-mode=explicit"])
    r = srv.post("/v2/repository/models/simple/load", json={})
    assert_error(r, 400, "model 'simple': input 'INPUT0' sets allow_ragged_batch, which backend "
                 "'onnxruntime' does not support")


def test_bad_parameter_fails_the_load_with_the_message(server_factory, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "bad_resize", 4, "TYPE_UINT8", "TYPE_FP32", [3, 224, 224],
                params(resize_mode="zoom"))
    write_model(repo, "bad_layout", 4, "TYPE_UINT8", "TYPE_FP32", [3, 224, 224],
                params(layout="NHWC"))
    srv = server_factory([repo], ["--model-control-mode=explicit"])
    r = srv.post("/v2/repository/models/bad_resize/load")
    assert r.status_code == 400, r.text
    msg = "parameter 'resize_mode' must be 'stretch' or 'shorter_side_center_crop', got 'zoom'"
    assert msg in r.json()["error"], r.text
    r = srv.post("/v2/repository/models/bad_layout/load")
    assert r.status_code == 400, r.text
    index = {e["name"]: e for e in srv.post("/v2/repository/index", json={}).json()}
    assert index["bad_resize"]["state"] == "UNAVAILABLE"
    assert msg in index["bad_resize"]["reason"]
    assert "parameter 'layout' is 'NHWC' but output 'OUTPUT' has dims [3,224,224]" in \
        index["bad_layout"]["reason"]


def test_example_repository_model_config(server_factory, tmp_path):
    """examples/model_repository/image_preprocess loads and matches the ResNet reference."""
    example = Path(__file__).resolve().parents[2] / "examples" / "model_repository"
    repo = tmp_path / "repo"
    repo.mkdir()
    import shutil
    shutil.copytree(example / "image_preprocess", repo / "image_preprocess")
    (repo / "image_preprocess" / "1").mkdir(exist_ok=True)
    srv = server_factory([repo])
    srv.wait_until(lambda: srv.get("/v2/models/image_preprocess/ready").status_code == 200, 30,
                   "image_preprocess to be ready")
    cfg = srv.get("/v2/models/image_preprocess/config").json()
    in_name, out_name = cfg["input"][0]["name"], cfg["output"][0]["name"]
    images = [jpeg(640, 480, 90), png(300, 200, 91)]
    inp = make_input(in_name, uint8_batch(images), "UINT8", binary=True)
    resp = infer(srv, "image_preprocess", [inp],
                 outputs=[{"name": out_name, "parameters": {"binary_data": True}}])
    assert resp.status_code == 200, resp.text
    out = parse_response(resp)[1][out_name]
    check("preprocess", images, out)


def test_kind_gpu_without_a_gpu_says_why_and_falls_back(server_factory, tmp_path):
    """A KIND_GPU image model on this host, which has no GPU: the load fails naming CUDA's
    reason, as for ONNX Runtime and LibTorch models (tests/integration/test_gpu_placement.py);
    --gpu-fallback-to-cpu serves it on the CPU, where `output_on_gpu` has no effect. On a GPU
    host this is tests/gpu/test_image_gpu.py's part instead."""
    m = dict(MODELS["preprocess"])
    m["extra"] += params(output_on_gpu="true") + "instance_group [ { kind: KIND_GPU } ]\n"
    repo = tmp_path / "repo"
    write_model(repo, "preprocess", **m)
    srv = server_factory([repo], ["--exit-on-error=false", "--strict-readiness=false"])
    if "GPUs: none (" not in srv.log():
        pytest.skip("this host has a GPU")
    entry = [e for e in srv.post("/v2/repository/index", json={}).json()
             if e["name"] == "preprocess"][0]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith("instance group preprocess_0 of model preprocess has kind "
                                      "KIND_GPU but cannot run on a GPU: "), entry["reason"]
    srv = server_factory([repo], ["--gpu-fallback-to-cpu=true"])
    srv.wait_until(lambda: srv.get("/v2/models/preprocess/ready").status_code == 200, 30,
                   "preprocess to be ready")
    images = [jpeg(640, 480, 92), png(300, 200, 93)]
    check("preprocess", images, outputs_of(run(srv, "preprocess", images)))
