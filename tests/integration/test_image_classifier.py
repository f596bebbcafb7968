"""The example `image_classifier` ensemble (image_preprocess -> resnet50, top-N with labels) on
the example repository's own configs. JPEG and PNG files are generated here with PIL; the
ensemble's scores are compared with (1) the client running the two steps itself through the
server and (2) the same two steps done outside the server: PIL decode + the numpy reference
preprocessing of test_image_backend, then torchvision's ResNet-50 with the generator's seed.

Tolerances: (1) identical computations, max abs diff <= 1e-4 (ONNX Runtime may batch them
differently); (2) float32 vs float64 preprocessing and ONNX Runtime vs torch, rtol 1e-3 with
atol 1e-3 x max|score|, and the same top-5 classes.

Slow (ResNet-50 on CPU): deselect with -m "not resnet"."""

import concurrent.futures as futures

import numpy as np
import pytest

from conftest import copy_models, start_server
from test_image_backend import IMAGENET_MEAN, IMAGENET_STD, decode, jpeg, normalize, png, resize
from test_image_backend import uint8_batch
from v2client import assert_error, infer, make_input, parse_response

pytestmark = pytest.mark.resnet

MODELS = ["image_classifier", "image_preprocess", "resnet50"]


@pytest.fixture(scope="module")
def classifier_server(tmp_path_factory, example_models, logs_dir):
    repo = tmp_path_factory.mktemp("classifier_repo")
    copy_models(example_models, MODELS, repo)
    srv = start_server(repo, [], logs_dir)
    srv.wait_until(lambda: srv.get("/v2/models/image_classifier/ready").status_code == 200, 120,
                   "image_classifier to be ready")
    yield srv
    rc = srv.stop()
    assert rc == 0, srv.log()


@pytest.fixture(scope="module")
def labels(example_models):
    return (example_models / "image_classifier" / "labels.txt").read_text().splitlines()


@pytest.fixture(scope="module")
def torch_resnet():
    import torch
    import torchvision
    torch.manual_seed(0)  # the weights gen_models.py exported
    model = torchvision.models.resnet50(weights=None)
    model.eval()
    return model


def classify(srv, images, outputs):
    arr = uint8_batch(images)
    return infer(srv, "image_classifier", [make_input("IMAGE", arr, "UINT8", binary=True)],
                 outputs=outputs)


RAW = [{"name": "SCORES", "parameters": {"binary_data": True}}]


def scores_by_hand_through_server(srv, data):
    r = infer(srv, "image_preprocess", [make_input("IMAGE", uint8_batch([data]), "UINT8", binary=True)],
              outputs=[{"name": "PREPROCESSED", "parameters": {"binary_data": True}}])
    assert r.status_code == 200, r.text[:300]
    pre = parse_response(r)[1]["PREPROCESSED"]
    r = infer(srv, "resnet50", [make_input("input", pre, "FP32", binary=True)],
              outputs=[{"name": "output", "parameters": {"binary_data": True}}])
    assert r.status_code == 200, r.text[:300]
    return parse_response(r)[1]["output"]


IMAGES = {
    "jpeg_640x480": lambda: jpeg(640, 480, 11),
    "png_300x200": lambda: png(300, 200, 12),
    "jpeg_gray_256x320": lambda: jpeg(256, 320, 13, gray=True),
}


@pytest.mark.parametrize("name", list(IMAGES))
def test_scores_match_the_two_steps_run_by_hand(classifier_server, torch_resnet, name):
    import torch
    data = IMAGES[name]()
    r = classify(classifier_server, [data], RAW)
    assert r.status_code == 200, r.text[:300]
    header, out = parse_response(r)
    assert header["model_name"] == "image_classifier"
    got = out["SCORES"]
    assert got.shape == (1, 1000)
    # (1) the client chaining the two models through the server
    chained = scores_by_hand_through_server(classifier_server, data)
    assert np.abs(got - chained).max() <= 1e-4
    # (2) outside the server: PIL + numpy preprocessing, torchvision ResNet-50
    pre = normalize(resize(decode(data), 224, 224, "shorter_side_center_crop", 256),
                    mean=IMAGENET_MEAN, std=IMAGENET_STD).transpose(2, 0, 1)
    with torch.no_grad():
        expected = torch_resnet(torch.from_numpy(pre[None].astype(np.float32))).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())
    assert list(np.argsort(-got[0])[:5]) == list(np.argsort(-expected[0])[:5])


def test_top5_with_labels(classifier_server, labels):
    data = jpeg(640, 480, 21)
    raw = parse_response(classify(classifier_server, [data], RAW))[1]["SCORES"][0]
    r = classify(classifier_server, [data], [{"name": "SCORES", "parameters": {"classification": 5}}])
    assert r.status_code == 200, r.text[:300]
    o = r.json()["outputs"][0]
    assert o["name"] == "SCORES" and o["datatype"] == "BYTES" and o["shape"] == [1, 5]
    top = np.argsort(-raw)[:5]
    parsed = [s.split(":", 2) for s in o["data"]]
    assert [int(p[1]) for p in parsed] == list(top)
    assert [p[2] for p in parsed] == [labels[i] for i in top]
    np.testing.assert_allclose([float(p[0]) for p in parsed], raw[top], rtol=1e-5)


def test_batch_of_two_padded_images(classifier_server):
    # Rows of one UINT8 [2, L] tensor, the shorter image zero-padded (as DALI clients send).
    a, b = jpeg(640, 480, 31), png(320, 240, 32)
    r = classify(classifier_server, [a, b], RAW)
    assert r.status_code == 200, r.text[:300]
    both = parse_response(r)[1]["SCORES"]
    assert both.shape == (2, 1000)
    for i, data in enumerate((a, b)):
        one = parse_response(classify(classifier_server, [data], RAW))[1]["SCORES"][0]
        assert np.abs(both[i] - one).max() <= 1e-4


def test_corrupt_image_fails_only_its_request(classifier_server):
    good = jpeg(400, 300, 41)
    bad = good[: len(good) // 3]

    def call(data):
        return classify(classifier_server, [data], RAW)

    with futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, [good, bad, good, bad]))
    for i, r in enumerate(results):
        if i % 2 == 0:
            assert r.status_code == 200, r.text[:300]
        else:
            assert_error(r, 400, "in ensemble 'image_classifier' step 0 (model 'image_preprocess')",
                         "image 0")
    r = classify(classifier_server, [b"not an image at all"], RAW)
    assert_error(r, 400, "image_preprocess", "not a JPEG or PNG")


def test_statistics_for_the_ensemble_and_each_model(classifier_server):
    def count(model):
        s = classifier_server.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
        return s["inference_stats"]["success"]["count"]

    before = {m: count(m) for m in MODELS}
    for seed in range(3):
        assert classify(classifier_server, [jpeg(320, 240, 50 + seed)], RAW).status_code == 200
    after = {m: count(m) for m in MODELS}
    assert {m: after[m] - before[m] for m in MODELS} == {m: 3 for m in MODELS}
