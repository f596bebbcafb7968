#!/usr/bin/python3
"""DALI-backend test models, generated at test time (nothing binary is kept in git).

Two independent writers of model.dali, so that inferd's reader and serializer cannot share a
bug unseen:
  * inferd's own nvidia.dali package (src/backends/dali/pydali), the one the backend runs for
    dali.py: the pipelines are written as DALI code (fn.*, @pipeline_def) and serialized;
  * `handbuilt_pipeline`, which builds the PipelineDef message field by field with the protobuf
    package from a descriptor declared here (DALI's field numbers, dali/pipeline/proto/dali.proto),
    not from inferd's .proto.

    /usr/bin/python3 tests/models/gen_dali_models.py OUT_DIR   # writes every model below
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYDALI = ROOT / "src" / "backends" / "dali" / "pydali"

IMAGENET_MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
IMAGENET_STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def _dali():
    if str(PYDALI) not in sys.path:
        sys.path.insert(0, str(PYDALI))
    import nvidia.dali as dali
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    return dali, fn, types


# The pipelines, as a user writes them with DALI. Each returns the serialized bytes.

def article_pipeline():
    """The SageMaker article's Inception preprocessing: 299x299 HWC FP32, ImageNet mean/std."""
    dali, fn, types = _dali()

    @dali.pipeline_def(batch_size=256, num_threads=4, device_id=0)
    def pipe():
        images = fn.external_source(device="cpu", name="DALI_INPUT_0")
        images = fn.decoders.image(images, device="mixed", output_type=types.RGB)
        images = fn.resize(images, resize_x=299, resize_y=299)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="HWC",
                                          crop=(299, 299), mean=IMAGENET_MEAN, std=IMAGENET_STD)
        return images
    return pipe().serialize()


def resnet_pipeline(layout="CHW", dtype=None, mirror=0, gray=False):
    """ResNet preprocessing: shorter side to 256, centre crop 224, normalize."""
    dali, fn, types = _dali()
    dtype = types.FLOAT if dtype is None else dtype

    @dali.pipeline_def(batch_size=8, num_threads=2, device_id=0)
    def pipe():
        images = fn.external_source(device="cpu", name="IMAGES")
        images = fn.decoders.image(images, device="cpu",
                                   output_type=types.GRAY if gray else types.RGB)
        images = fn.resize(images, resize_shorter=256)
        images = fn.crop_mirror_normalize(
            images, dtype=dtype, output_layout=layout, crop=(224, 224), mirror=mirror,
            mean=[IMAGENET_MEAN[0]] if gray else IMAGENET_MEAN,
            std=[IMAGENET_STD[0]] if gray else IMAGENET_STD)
        return images
    return pipe().serialize()


def arithmetic_pipeline():
    """Crop, cast, arithmetic with constants, transpose: BGR resized, x / 127.5 - 1 in CHW."""
    dali, fn, types = _dali()

    @dali.pipeline_def(batch_size=4, num_threads=1, device_id=0)
    def pipe():
        images = fn.external_source(name="RAW")
        images = fn.decoders.image(images, output_type=types.BGR)
        images = fn.resize(images, size=[40, 50], antialias=False)
        images = fn.crop(images, crop=(32, 48), crop_pos_x=0.0, crop_pos_y=1.0)
        images = fn.cast(images, dtype=types.FLOAT)
        images = images / 127.5 - 1.0
        images = fn.transpose(images, perm=[2, 0, 1])
        return images
    return pipe().serialize()


def unsupported_pipeline():
    dali, fn, types = _dali()

    @dali.pipeline_def(batch_size=2, num_threads=1, device_id=0)
    def pipe():
        images = fn.external_source(name="IN")
        images = fn.decoders.image(images)
        return fn.rotate(images, angle=10.0)
    return pipe().serialize()


DALI_PY = '''
import nvidia.dali as dali
import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali.plugin.triton import autoserialize


@autoserialize
@dali.pipeline_def(batch_size=16, num_threads=2, device_id=0)
def pipe():
    images = fn.external_source(device="cpu", name="DALI_INPUT_0")
    images = fn.decoders.image(images, device="mixed", output_type=types.RGB)
    images = fn.resize(images, resize_x=299, resize_y=299)
    images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="HWC",
                                      crop=(299, 299), mean=%r, std=%r)
    return images
''' % (IMAGENET_MEAN, IMAGENET_STD)


def handbuilt_pipeline(mean, std, resize=(64, 48), layout="CHW"):
    """decoders.image -> Resize(resize_x, resize_y) -> CropMirrorNormalize, built with the
    protobuf package from DALI's field numbers, the way DALI's C++ serializer fills them."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="handbuilt_dali.proto", package="dali_proto",
                                             syntax="proto2")
    T = descriptor_pb2.FieldDescriptorProto
    OPT, REP = T.LABEL_OPTIONAL, T.LABEL_REPEATED

    def message(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            f = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = type_name

    message("Argument", [("name", 1, OPT, T.TYPE_STRING, None), ("type", 2, OPT, T.TYPE_STRING, None),
                         ("floats", 3, REP, T.TYPE_FLOAT, None), ("ints", 4, REP, T.TYPE_INT64, None),
                         ("strings", 5, REP, T.TYPE_STRING, None), ("bools", 6, REP, T.TYPE_BOOL, None),
                         ("extra_args", 7, REP, T.TYPE_MESSAGE, ".dali_proto.Argument"),
                         ("is_vector", 8, OPT, T.TYPE_BOOL, None)])
    message("InputOutput", [("name", 1, OPT, T.TYPE_STRING, None), ("device", 2, OPT, T.TYPE_STRING, None),
                            ("is_argument_input", 3, OPT, T.TYPE_BOOL, None),
                            ("arg_name", 4, OPT, T.TYPE_STRING, None)])
    message("OpDef", [("name", 1, OPT, T.TYPE_STRING, None),
                      ("input", 2, REP, T.TYPE_MESSAGE, ".dali_proto.InputOutput"),
                      ("output", 3, REP, T.TYPE_MESSAGE, ".dali_proto.InputOutput"),
                      ("args", 4, REP, T.TYPE_MESSAGE, ".dali_proto.Argument"),
                      ("inst_name", 5, OPT, T.TYPE_STRING, None), ("logical_id", 6, OPT, T.TYPE_INT32, None)])
    message("PipelineDef", [("num_threads", 1, OPT, T.TYPE_INT64, None), ("batch_size", 2, OPT, T.TYPE_INT32, None),
                            ("op", 5, REP, T.TYPE_MESSAGE, ".dali_proto.OpDef"),
                            ("pipe_outputs", 7, REP, T.TYPE_MESSAGE, ".dali_proto.InputOutput"),
                            ("device_id", 8, OPT, T.TYPE_INT32, None), ("seed", 9, OPT, T.TYPE_INT64, None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = getattr(message_factory, "GetMessageClass", None)
    if get is None:
        factory = message_factory.MessageFactory(pool)
        get = lambda d: factory.GetPrototype(d)  # noqa: E731
    PipelineDef = get(pool.FindMessageTypeByName("dali_proto.PipelineDef"))

    p = PipelineDef(num_threads=3, batch_size=32, device_id=0, seed=-1)

    def scalar(op, name, type_name, value):
        a = op.args.add(name=name, type=type_name, is_vector=False)
        getattr(a, {"float": "floats", "int64": "ints", "string": "strings", "bool": "bools"}[type_name]).append(value)

    def vector(op, name, type_name, values):
        a = op.args.add(name=name, type=type_name, is_vector=True)
        for i, v in enumerate(values):
            e = a.extra_args.add(name="element %d" % i, type=type_name, is_vector=False)
            getattr(e, {"float": "floats", "int64": "ints"}[type_name]).append(v)

    def op(name, inst, inputs, device):
        o = p.op.add(name=name, inst_name=inst, logical_id=len(p.op))
        for i in inputs:
            o.input.add(name=i, device="cpu", is_argument_input=False)
        o.output.add(name=inst + "_out", device="cpu" if device == "cpu" else "gpu",
                     is_argument_input=False)
        scalar(o, "device", "string", device)
        return o

    src = op("ExternalSource", "INPUT_IMAGES", [], "cpu")
    scalar(src, "name", "string", "INPUT_IMAGES")
    dec = op("ImageDecoder", "decoder", ["INPUT_IMAGES_out"], "mixed")
    scalar(dec, "output_type", "int64", 0)
    rs = op("Resize", "resize", ["decoder_out"], "gpu")
    scalar(rs, "resize_x", "float", float(resize[0]))
    scalar(rs, "resize_y", "float", float(resize[1]))
    cmn = op("CropMirrorNormalize", "cmn", ["resize_out"], "gpu")
    scalar(cmn, "dtype", "int64", 9)
    scalar(cmn, "output_layout", "string", layout)
    vector(cmn, "mean", "float", mean)
    vector(cmn, "std", "float", std)
    p.pipe_outputs.add(name="cmn_out", device="gpu", is_argument_input=False)
    return p.SerializeToString()


def write(out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    models = {
        "article.dali": article_pipeline(),
        "resnet_chw.dali": resnet_pipeline(),
        "resnet_hwc_mirror.dali": resnet_pipeline(layout="HWC", mirror=1),
        "resnet_gray.dali": resnet_pipeline(gray=True),
        "resnet_fp16.dali": resnet_pipeline(dtype=8),
        "arithmetic.dali": arithmetic_pipeline(),
        "unsupported.dali": unsupported_pipeline(),
        "handbuilt.dali": handbuilt_pipeline([10.0, 20.0, 30.0], [50.0, 60.0, 70.0]),
    }
    for name, data in models.items():
        (out / name).write_bytes(data)
    (out / "dali.py").write_text(DALI_PY)
    return out


if __name__ == "__main__":
    write(sys.argv[1] if len(sys.argv) > 1 else "dali_models")
