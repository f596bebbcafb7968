"""numpy reference of the DALI operators the dali backend tests use, written from DALI's
documentation of each operator, not from inferd's code:

* decoders.image: the image decoded (PIL, which uses the same libjpeg-turbo / libpng, so this
  step is exact), as RGB, BGR or GRAY (ITU-R 601 luma 0.299 R + 0.587 G + 0.114 B, rounded).
* Resize: output extents from resize_x/resize_y, resize_shorter (the shorter side set, the other
  scaled to keep the aspect ratio) rounded to nearest; the scale is kept from the unrounded
  extent (subpixel_scale, DALI's default), the source window centred. interp_type LINEAR with
  antialias (DALI's default): shrinking uses DALI's triangular filter, a triangle of radius
  `scale` input pixels around each output pixel's centre, weights normalized; enlarging is
  linear interpolation (a triangle of radius 1). Pixel centres at i + 0.5; the border repeats.
  The output keeps the input type: UINT8, rounded to nearest and saturated.
* Crop / CropMirrorNormalize: window anchor round(crop_pos * (extent - crop)), crop_pos 0.5 by
  default; mirror flips horizontally; out = (in - mean[c]) / std[c] in float; output_layout CHW by
  default.
"""

import io

import numpy as np
from PIL import Image


def decode(data, mode="RGB"):
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.float64)
    if mode == "BGR":
        return rgb[..., ::-1]
    if mode == "GRAY":
        y = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
        return np.rint(y)[..., None]
    return rgb


def _weights(n_in, out_f, antialias=True):
    """(n_out, n_in) resampling matrix along one axis."""
    n_out = max(1, int(np.floor(out_f + 0.5)))
    scale = n_in / out_f
    lo = (n_in - n_out * scale) / 2.0
    radius = scale if (scale > 1 and antialias) else 1.0
    w = np.zeros((n_out, n_in))
    for o in range(n_out):
        centre = lo + (o + 0.5) * scale
        for j in range(int(np.floor(centre - radius)) - 1, int(np.ceil(centre + radius)) + 2):
            t = max(0.0, 1.0 - abs(j + 0.5 - centre) / radius)
            w[o, min(max(j, 0), n_in - 1)] += t
    return w / w.sum(axis=1, keepdims=True)


def resize(img, out_h_f, out_w_f, antialias=True, round_to_uint8=True):
    wy = _weights(img.shape[0], out_h_f, antialias)
    wx = _weights(img.shape[1], out_w_f, antialias)
    out = np.einsum("oh,hwc->owc", wy, img)
    out = np.einsum("pw,owc->opc", wx, out)
    return np.clip(np.rint(out), 0, 255) if round_to_uint8 else out


def shorter_side(h, w, target):
    s = target / min(h, w)
    return h * s, w * s


def crop(img, ch, cw, pos_x=0.5, pos_y=0.5):
    h, w = img.shape[:2]
    top = int(np.floor(pos_y * (h - ch) + 0.5))
    left = int(np.floor(pos_x * (w - cw) + 0.5))
    return img[top:top + ch, left:left + cw]


def crop_mirror_normalize(img, crop_hw, mean, std, mirror=False, layout="CHW"):
    out = crop(img, *crop_hw) if crop_hw else img
    if mirror:
        out = out[:, ::-1]
    out = (out - np.asarray(mean, np.float64)) / np.asarray(std, np.float64)
    return out.transpose(2, 0, 1) if layout == "CHW" else out
