#!/usr/bin/python3
"""The in-process reference for bench/image_preprocess.sh: the image_preprocess example's steps
(decode, shorter side 256, centre crop 224, ImageNet normalization, NCHW) in Python on one core.

    image_reference.py SECONDS FILE...

Prints two lines "<name> <images/s>": 'numpy' does the resize with the same half-pixel bilinear
formula as the backend (vectorized numpy, what the integration tests compare against);
'pil' resizes with PIL's C BILINEAR (antialiased), as torchvision's transform on a PIL image.
"""
import io
import sys
import time

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def plan(w, h, size=224, shorter=256):
    short, long = min(w, h), max(w, h)
    new_long = int(shorter * long / short)
    rw, rh = (shorter, new_long) if w <= h else (new_long, shorter)
    return rw, rh, int(round((rw - size) / 2.0)), int(round((rh - size) / 2.0))


def taps(n_in, resized, offset, n_out):
    src = np.maximum((np.arange(n_out) + offset + 0.5) * (n_in / resized) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    return lo, np.minimum(lo + 1, n_in - 1), (src - lo).astype(np.float32)


def numpy_pipeline(data):
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    h, w = rgb.shape[:2]
    rw, rh, left, top = plan(w, h)
    y0, y1, wy = taps(h, rh, top, 224)
    x0, x1, wx = taps(w, rw, left, 224)
    a = rgb.astype(np.float32)
    wx = wx[None, :, None]
    t = a[y0][:, x0] * (1 - wx) + a[y0][:, x1] * wx
    b = a[y1][:, x0] * (1 - wx) + a[y1][:, x1] * wx
    v = t + wy[:, None, None] * (b - t)
    return ((v / 255.0 - MEAN) / STD).transpose(2, 0, 1).copy()


def pil_pipeline(data):
    img = Image.open(io.BytesIO(data)).convert("RGB")
    rw, rh, left, top = plan(*img.size)
    img = img.resize((rw, rh), Image.BILINEAR).crop((left, top, left + 224, top + 224))
    v = np.asarray(img, np.float32)
    return ((v / 255.0 - MEAN) / STD).transpose(2, 0, 1).copy()


def rate(fn, images, seconds):
    for d in images:
        fn(d)  # warm up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(images[n % len(images)])
        n += 1
    return n / (time.perf_counter() - start)


if __name__ == "__main__":
    seconds = float(sys.argv[1])
    images = [open(f, "rb").read() for f in sys.argv[2:]]
    print(f"numpy {rate(numpy_pipeline, images, seconds):.1f}")
    print(f"pil {rate(pil_pipeline, images, seconds):.1f}")
