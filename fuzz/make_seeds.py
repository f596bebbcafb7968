#!/usr/bin/python3
"""Writes the generated seed inputs of the fuzzers that take images, archives and ONNX models,
so none is kept in git: `make_seeds.py <fuzzer> <dir>`. Regression inputs found by fuzzing
stay in fuzz/corpus/<fuzzer>/ (scripts/test.sh copies both)."""

import contextlib
import io
import struct
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def pattern(w, h, channels=3):
    y, x = np.mgrid[0:h, 0:w]
    chans = [(x * 37 + y * 11 + 50 * c) % 256 for c in range(channels)]
    return np.stack(chans, -1).astype(np.uint8)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def interlaced_rgba_png(w, h):
    """An Adam7-interlaced RGBA PNG (PIL does not write interlaced PNGs)."""
    px = pattern(w, h, 4)
    raw = b""
    for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                           (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]:
        sub = px[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        for row in sub:
            raw += b"\x00" + row.tobytes()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 1)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
            png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def image_seeds():
    def save(img, fmt, **kw):
        buf = io.BytesIO()
        img.save(buf, format=fmt, **kw)
        return buf.getvalue()
    rgb = Image.fromarray(pattern(16, 12))
    return {
        "rgb.jpg": save(rgb, "JPEG", quality=80),
        "gray_progressive.jpg": save(rgb.convert("L"), "JPEG", progressive=True),
        "rgb.png": save(rgb, "PNG"),
        "palette.png": save(rgb.convert("P"), "PNG"),
        "rgba_interlaced.png": interlaced_rgba_png(9, 7),
    }


def archive_seeds():
    def tar(members, mode="w:gz"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode=mode) as t:
            for name, kind, arg in members:
                info = tarfile.TarInfo(name)
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    t.addfile(info)
                elif kind == "sym":
                    info.type, info.linkname = tarfile.SYMTYPE, arg
                    t.addfile(info)
                elif kind == "hard":
                    info.type, info.linkname = tarfile.LNKTYPE, arg
                    t.addfile(info)
                else:
                    info.size = len(arg)
                    t.addfile(info, io.BytesIO(arg))
        return buf.getvalue()
    return {
        "model.tar.gz": tar([("m", "dir", None), ("m/config.pbtxt", "file", b'platform: "onnxruntime_onnx"\n'),
                             ("m/1", "dir", None), ("m/1/model.onnx", "file", b"\x08\x07" * 50)]),
        "links.tar.gz": tar([("m/a.txt", "file", b"x"), ("m/in", "sym", "a.txt"),
                             ("m/hard", "hard", "m/a.txt")]),
        "escape.tar.gz": tar([("../evil", "file", b"x"), ("m/out", "sym", "/etc/passwd")]),
        "plain.tar": tar([("m/f", "file", b"hello")], mode="w"),
    }


def sagemaker_seeds():
    prefix = b"application/vnd.sagemaker-triton.binary+json;json-header-size="
    cases = [(100, prefix + b"42"), (10, prefix + b"11"), (5, b"application/json"),
             (64, prefix + b"7; charset=x")]
    return {f"seed{i}": struct.pack("<Q", n) + ct for i, (n, ct) in enumerate(cases)}


def onnx_seeds():
    """Small real ONNX models: tensor ones (a Conv, strings, an If with subgraphs), ones with
    sequence, map and optional inputs or outputs, an unknown operator, and the example
    repository's `simple` and `add_sub_autocomplete` models as gen_models.py writes them."""
    from onnx import TensorProto
    models = Path(__file__).resolve().parents[1] / "tests" / "models"
    sys.path.insert(0, str(models))
    import gen_models
    import onnx_odd_models
    seeds = {f"{name}.onnx": build().SerializeToString()
             for name, build in onnx_odd_models.SEED_MODELS.items()}
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, dims in [("simple", TensorProto.INT32, ["batch", 16]),
                                  ("add_sub_autocomplete", TensorProto.FLOAT, ["batch", 4])]:
            path = Path(tmp) / name / "model.onnx"
            with contextlib.redirect_stdout(io.StringIO()):  # it reports each file it wrote
                gen_models._save_model(gen_models.add_sub_graph(dtype, dims), str(path))
            seeds[f"example_{name}.onnx"] = path.read_bytes()
    return seeds


def archive_links_seeds():
    """Programs for archive_links_fuzz (see its Path/BuildTar): the issue-27 chain
    a/, a/l1 -> .., a/l1/l2 -> .., a/l1/l2/l3 -> .., a/l1/l2/l3/x/ with and without openat2."""
    A, L1, L2, L3, X, UP = 0, 2, 3, 4, 5, 6
    def entry(kind, names, target=None):
        out = [kind, len(names) - 1, *names]
        if target is not None:
            out += [len(target) - 1, *target]
        return out
    chain = (entry(0, [A]) + entry(2, [A, L1], [UP]) + entry(2, [A, L1, L2], [UP]) +
             entry(2, [A, L1, L2, L3], [UP]) + entry(0, [A, L1, L2, L3, X]) +
             entry(1, [A, L1, L2, L3, X]))
    return {"chain_openat2": bytes([0] + chain), "chain_walk": bytes([1] + chain)}


def config_files_seeds():
    out = 'output [{ name: "o" data_type: TYPE_FP32 dims: [1] label_filename: "%s" }]\n'
    return {
        "label_passwd.pbtxt": (out % "../../../etc/passwd").encode(),
        "label_link.pbtxt": (out % "secret-link").encode(),
        "label_ok.pbtxt": (out % "labels.txt").encode(),
        "default_model.pbtxt": b'default_model_filename: "../../other/1/model.onnx"\n',
        "default_model_link.pbtxt": b'default_model_filename: "out/model.onnx"\n',
        "env.pbtxt": b'parameters { key: "EXECUTION_ENV_PATH" value { string_value: '
                     b'"$$TRITON_MODEL_DIRECTORY/up/env.tar.gz" } }\n',
        "warmup.pbtxt": b'model_warmup [{ name: "w" batch_size: 1 inputs { key: "i" value { '
                        b'data_type: TYPE_FP32 dims: [1] input_data_file: "w/../../secret" } } }]\n',
    }


def dali_seeds():
    """The test pipelines of tests/models/gen_dali_models.py, both writers."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
    import gen_dali_models as gen
    return {
        "article.dali": gen.article_pipeline(),
        "resnet_gray.dali": gen.resnet_pipeline(gray=True),
        "resnet_hwc_mirror.dali": gen.resnet_pipeline(layout="HWC", mirror=1),
        "arithmetic.dali": gen.arithmetic_pipeline(),
        "handbuilt.dali": gen.handbuilt_pipeline([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),
    }


SEEDS = {"image_decode_fuzz": image_seeds, "archive_fuzz": archive_seeds,
         "archive_links_fuzz": archive_links_seeds, "config_files_fuzz": config_files_seeds,
         "sagemaker_content_type_fuzz": sagemaker_seeds, "onnx_load_fuzz": onnx_seeds,
         "dali_pipeline_fuzz": dali_seeds}

if __name__ == "__main__":
    fuzzer, out = sys.argv[1], Path(sys.argv[2])
    if fuzzer in SEEDS:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in SEEDS[fuzzer]().items():
            (out / name).write_bytes(data)
