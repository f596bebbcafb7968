"""Small ONNX models, valid and not, for the robustness test (tests/integration/
test_onnx_robustness.py) and the seeds of the model-loading fuzzer (fuzz/make_seeds.py):
inputs and outputs that are not plain tensors (sequence, map, optional), an unknown operator,
an unknown opset, and plain tensor models to mutate. Each builder returns an onnx.ModelProto."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(graph, opsets=(("", 13),)):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m


def add_model():
    """Y = X + X, FP32 [4]."""
    g = helper.make_graph([helper.make_node("Add", ["X", "X"], ["Y"])], "add",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
    return _model(g)


def conv_relu_model():
    """Y = relu(conv(X, W) + B), FP32 [batch, 2, 5, 5] -> [batch, 3, 5, 5]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B")
    g = helper.make_graph(
        [helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["Y"])], "conv_relu",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2, 5, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3, 5, 5])], [w, b])
    return _model(g)


def string_model():
    """OUT = Identity(IN), STRING [batch, 2], and a scalar INT64 count beside it."""
    g = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"]),
         helper.make_node("Size", ["IN"], ["N"])], "strings",
        [helper.make_tensor_value_info("IN", TensorProto.STRING, ["batch", 2])],
        [helper.make_tensor_value_info("OUT", TensorProto.STRING, ["batch", 2]),
         helper.make_tensor_value_info("N", TensorProto.INT64, [])])
    return _model(g)


def if_model():
    """Y = X * 2 if C else -X: a subgraph per branch."""
    def branch(name, node):
        return helper.make_graph([node], name, [],
                                 [helper.make_tensor_value_info("r", TensorProto.FLOAT, [3])])
    two = numpy_helper.from_array(np.full(3, 2, np.float32), "TWO")
    then_g = branch("then", helper.make_node("Mul", ["X", "TWO"], ["r"]))
    else_g = branch("else", helper.make_node("Neg", ["X"], ["r"]))
    g = helper.make_graph(
        [helper.make_node("If", ["C"], ["Y"], then_branch=then_g, else_branch=else_g)], "if",
        [helper.make_tensor_value_info("C", TensorProto.BOOL, []),
         helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])], [two])
    return _model(g)


def sequence_input_model():
    """Input X is a sequence of FP32 [4] tensors; Y = X[0]."""
    x = helper.make_value_info("X", helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [4])))
    g = helper.make_graph([helper.make_node("SequenceAt", ["X", "I"], ["Y"])], "seq_in", [x],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
                          [numpy_helper.from_array(np.array(0, np.int64), "I")])
    return _model(g)


def _map_type(key, value):
    t = onnx.TypeProto()
    t.map_type.key_type = key
    t.map_type.value_type.CopyFrom(value)
    return t


def zipmap_model():
    """ai.onnx.ml ZipMap, as sklearn classifiers export their probabilities: FP32 [N, 3] in,
    a sequence of map<int64, float> out."""
    z = helper.make_value_info("Z", helper.make_sequence_type_proto(
        _map_type(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    g = helper.make_graph(
        [helper.make_node("ZipMap", ["X"], ["Z"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])],
        "zipmap", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])], [z])
    return _model(g, (("", 13), ("ai.onnx.ml", 1)))


def map_input_model():
    """ai.onnx.ml DictVectorizer: a map<string, float> in, FP32 [1, 3] out."""
    x = helper.make_value_info("X", _map_type(
        TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    g = helper.make_graph(
        [helper.make_node("DictVectorizer", ["X"], ["Y"], domain="ai.onnx.ml",
                          string_vocabulary=["a", "b", "c"])],
        "dictvec", [x], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3])])
    return _model(g, (("", 13), ("ai.onnx.ml", 1)))


def optional_input_model():
    """Input X is optional(FP32 [4]); Y = whether it holds a tensor (opset 15)."""
    x = helper.make_value_info("X", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [4])))
    g = helper.make_graph([helper.make_node("OptionalHasElement", ["X"], ["Y"])], "opt_in", [x],
                          [helper.make_tensor_value_info("Y", TensorProto.BOOL, [])])
    return _model(g, (("", 15),))


def unknown_operator_model():
    """An operator no opset defines: Frobnicate."""
    g = helper.make_graph([helper.make_node("Frobnicate", ["X"], ["Y"])], "unknown_op",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
    return _model(g)


def unknown_opset_model():
    """The default domain at opset 99, which no ONNX Runtime implements."""
    m = add_model()
    m.opset_import[0].version = 99
    return m


def unknown_domain_model():
    """An operator in a domain no runtime registers: com.example.nowhere v1."""
    g = helper.make_graph([helper.make_node("Add", ["X", "X"], ["Y"], domain="com.example.nowhere")],
                          "unknown_domain",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
    return _model(g, (("", 13), ("com.example.nowhere", 1)))


# Valid models whose bytes seed the fuzzer.
SEED_MODELS = {"add": add_model, "conv_relu": conv_relu_model, "strings": string_model,
               "if": if_model, "sequence_input": sequence_input_model, "zipmap": zipmap_model,
               "map_input": map_input_model, "optional_input": optional_input_model,
               "unknown_operator": unknown_operator_model}
