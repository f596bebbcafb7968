#!/usr/bin/python3
"""Generates the ONNX model files for the example repository and the integration-test models.

    /usr/bin/python3 tests/models/gen_models.py --example examples/model_repository --test DIR

Either flag is optional. Idempotent: a file that already exists is left alone, so re-runs are
fast. Example configs (config.pbtxt) are committed text files; this script writes only the model
files (and the ResNet-50 reference input/output) for them. For the test repository it writes
both the configs and the models.

ONNX graphs use opset 13 and IR version 8.
"""

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 13
IR_VERSION = 8

# name suffix -> (ONNX element type, Triton config data type, KServe datatype)
DATATYPES = {
    "bool": (TensorProto.BOOL, "TYPE_BOOL", "BOOL"),
    "uint8": (TensorProto.UINT8, "TYPE_UINT8", "UINT8"),
    "uint16": (TensorProto.UINT16, "TYPE_UINT16", "UINT16"),
    "uint32": (TensorProto.UINT32, "TYPE_UINT32", "UINT32"),
    "uint64": (TensorProto.UINT64, "TYPE_UINT64", "UINT64"),
    "int8": (TensorProto.INT8, "TYPE_INT8", "INT8"),
    "int16": (TensorProto.INT16, "TYPE_INT16", "INT16"),
    "int32": (TensorProto.INT32, "TYPE_INT32", "INT32"),
    "int64": (TensorProto.INT64, "TYPE_INT64", "INT64"),
    "fp16": (TensorProto.FLOAT16, "TYPE_FP16", "FP16"),
    "fp32": (TensorProto.FLOAT, "TYPE_FP32", "FP32"),
    "fp64": (TensorProto.DOUBLE, "TYPE_FP64", "FP64"),
    "bytes": (TensorProto.STRING, "TYPE_STRING", "BYTES"),
}

LABELS = ["cat", "dog", "bird", "fish", "horse"]


# --------------------------------------------------------------------------------------------
# helpers


def _save_model(graph, path):
    if os.path.exists(path):
        return False
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="inferd-gen"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
    print("wrote", path)
    return True


def _write_text(path, text):
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print("wrote", path)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def identity_graph(elem, shape, n_io=1):
    nodes, ins, outs = [], [], []
    for i in range(n_io):
        nodes.append(helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]))
        ins.append(_vi(f"INPUT{i}", elem, shape))
        outs.append(_vi(f"OUTPUT{i}", elem, shape))
    return helper.make_graph(nodes, "identity", ins, outs)


def add_sub_graph(elem, shape):
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    ins = [_vi("INPUT0", elem, shape), _vi("INPUT1", elem, shape)]
    outs = [_vi("OUTPUT0", elem, shape), _vi("OUTPUT1", elem, shape)]
    return helper.make_graph(nodes, "add_sub", ins, outs)


def add_const_graph(value):
    """OUTPUT0 = INPUT0 + value (FP32, shape [batch, n])."""
    const = helper.make_tensor("C", TensorProto.FLOAT, [], [float(value)])
    nodes = [helper.make_node("Add", ["INPUT0", "C"], ["OUTPUT0"])]
    return helper.make_graph(
        nodes,
        f"add_{value}",
        [_vi("INPUT0", TensorProto.FLOAT, ["batch", "n"])],
        [_vi("OUTPUT0", TensorProto.FLOAT, ["batch", "n"])],
        initializer=[const],
    )


def io_config(kind, name, dtype, dims, extra=""):
    dims_s = ", ".join(str(d) for d in dims)
    return (
        f"  {{\n    name: \"{name}\"\n    data_type: {dtype}\n    dims: [ {dims_s} ]\n{extra}  }}"
    )


def simple_config(name, max_batch, inputs, outputs, platform="onnxruntime_onnx", extra=""):
    s = f'name: "{name}"\n'
    if platform:
        s += f'platform: "{platform}"\n'
    s += f"max_batch_size: {max_batch}\n"
    if extra:
        s += extra
    s += "input [\n" + ",\n".join(io_config("input", *i) for i in inputs) + "\n]\n"
    s += "output [\n" + ",\n".join(io_config("output", *o) for o in outputs) + "\n]\n"
    return s


# --------------------------------------------------------------------------------------------
# example repository


def gen_example(root):
    # simple: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32 [batch, 16]
    _save_model(add_sub_graph(TensorProto.INT32, ["batch", 16]),
                os.path.join(root, "simple", "1", "model.onnx"))

    # identity_fp32: backend "identity", no model file; the version folder must exist.
    _write_text(os.path.join(root, "identity_fp32", "1", ".keep"), "")

    # image_preprocess: backend "image" (JPEG/PNG -> ResNet input), no model file either.
    _write_text(os.path.join(root, "image_preprocess", "1", ".keep"), "")

    # image_classifier: an ensemble (image_preprocess -> resnet50); its version folder is empty
    # and its labels are torchvision's ImageNet class names (the weights are random).
    _write_text(os.path.join(root, "image_classifier", "1", ".keep"), "")
    labels = os.path.join(root, "image_classifier", "labels.txt")
    if not os.path.exists(labels):
        import torchvision
        names = torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"]
        _write_text(labels, "\n".join(names) + "\n")

    # add_sub_autocomplete: no config.pbtxt, FP32 ["batch", 4]
    _save_model(add_sub_graph(TensorProto.FLOAT, ["batch", 4]),
                os.path.join(root, "add_sub_autocomplete", "1", "model.onnx"))

    gen_resnet50(os.path.join(root, "resnet50"))


def gen_resnet50(model_dir):
    path = os.path.join(model_dir, "1", "model.onnx")
    ref_in = os.path.join(model_dir, "reference_input.npy")
    ref_out = os.path.join(model_dir, "reference_output.npy")
    if os.path.exists(path) and os.path.exists(ref_in) and os.path.exists(ref_out):
        return
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    model.eval()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path):
        dummy = torch.randn(1, 3, 224, 224)
        tmp = path + ".tmp"
        torch.onnx.export(
            model,
            dummy,
            tmp,
            opset_version=OPSET,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
            do_constant_folding=True,
        )
        os.replace(tmp, path)
        print("wrote", path)
    # Reference pair computed by torch with the very weights that were exported.
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 224, 224), dtype=np.float32)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy().astype(np.float32)
    np.save(ref_in, x)
    np.save(ref_out, y)
    print("wrote", ref_in, ref_out)


# --------------------------------------------------------------------------------------------
# test repository


def gen_test(root):
    # One identity model per datatype: INPUT0 -> OUTPUT0, dims [-1], max_batch_size 8.
    for suffix, (elem, cfg_type, _) in DATATYPES.items():
        name = f"onnx_identity_{suffix}"
        _write_text(os.path.join(root, name, "config.pbtxt"),
                    simple_config(name, 8, [("INPUT0", cfg_type, [-1])],
                                  [("OUTPUT0", cfg_type, [-1])]))
        _save_model(identity_graph(elem, ["batch", "n"]),
                    os.path.join(root, name, "1", "model.onnx"))

    # Non-batching model (max_batch_size 0): add/sub FP32 [4].
    name = "add_sub_nobatch"
    _write_text(os.path.join(root, name, "config.pbtxt"),
                simple_config(name, 0,
                              [("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])],
                              [("OUTPUT0", "TYPE_FP32", [4]), ("OUTPUT1", "TYPE_FP32", [4])]))
    _save_model(add_sub_graph(TensorProto.FLOAT, [4]),
                os.path.join(root, name, "1", "model.onnx"))

    # Broken config.pbtxt (syntax error: unterminated list / message).
    name = "broken_config"
    _write_text(os.path.join(root, name, "config.pbtxt"),
                'name: "broken_config"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ]\n'
                'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 } ]\n')
    _save_model(identity_graph(TensorProto.FLOAT, ["batch", "n"]),
                os.path.join(root, name, "1", "model.onnx"))

    # Config disagrees with the ONNX file (INT32 in the config, FP32 in the model): load fails.
    name = "mismatched_config"
    _write_text(os.path.join(root, name, "config.pbtxt"),
                simple_config(name, 8, [("INPUT0", "TYPE_INT32", [-1])],
                              [("OUTPUT0", "TYPE_INT32", [-1])]))
    _save_model(identity_graph(TensorProto.FLOAT, ["batch", "n"]),
                os.path.join(root, name, "1", "model.onnx"))

    # Two versions: version v computes OUTPUT0 = INPUT0 + v. Three version policies.
    policies = {
        "two_versions": "",  # default: latest { num_versions: 1 }
        "two_versions_all": "version_policy: { all { } }\n",
        "two_versions_specific": "version_policy: { specific { versions: [ 1 ] } }\n",
    }
    for name, policy in policies.items():
        _write_text(os.path.join(root, name, "config.pbtxt"),
                    simple_config(name, 8, [("INPUT0", "TYPE_FP32", [-1])],
                                  [("OUTPUT0", "TYPE_FP32", [-1])], extra=policy))
        for v in (1, 2):
            _save_model(add_const_graph(v), os.path.join(root, name, str(v), "model.onnx"))

    # Classification with a label file: OUTPUT0 = INPUT0, FP32 [5].
    name = "labelled"
    _write_text(os.path.join(root, name, "config.pbtxt"),
                simple_config(name, 8, [("INPUT0", "TYPE_FP32", [5])],
                              [("OUTPUT0", "TYPE_FP32", [5],
                                '    label_filename: "labels.txt"\n')]))
    _write_text(os.path.join(root, name, "labels.txt"), "\n".join(LABELS) + "\n")
    _save_model(identity_graph(TensorProto.FLOAT, ["batch", 5]),
                os.path.join(root, name, "1", "model.onnx"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", help="example model repository (configs already present)")
    ap.add_argument("--test", help="directory to write the integration-test models into")
    args = ap.parse_args(argv)
    if not args.example and not args.test:
        ap.error("give --example and/or --test")
    if args.example:
        gen_example(args.example)
    if args.test:
        gen_test(args.test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
