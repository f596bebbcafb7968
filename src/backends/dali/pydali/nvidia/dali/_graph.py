"""The graph that fn.* calls build, recorded the way DALI's Python API records it: each call is
one operator (schema name, device, arguments, inputs) whose output is a DataNode; arithmetic on
DataNodes becomes ArithmeticGenericOp with DALI's expression_desc."""

import enum
import re

from nvidia.dali import _wire
from nvidia.dali import types

# The serialized type of each argument, as DALI's operator schemas declare it (Python ints given
# for a float argument are written as floats, as DALI does).
_FLOAT = {"resize_x", "resize_y", "resize_shorter", "resize_longer", "size", "max_size", "crop",
          "crop_h", "crop_w", "crop_pos_x", "crop_pos_y", "mean", "std", "scale", "shift",
          "fill_values", "stddev", "epsilon", "fill_value", "rel_shape", "fdata",
          "real_constants", "ddof"}
_INT = {"dtype", "output_type", "image_type", "interp_type", "min_filter", "mag_filter", "perm",
        "axes", "shape", "align", "idata", "integer_constants", "ndim", "mirror", "seed",
        "bytes_per_sample_hint", "max_batch_size"}
_VECTOR = {"size", "max_size", "crop", "mean", "std", "fill_values", "rel_shape", "fdata",
           "real_constants", "perm", "axes", "shape", "align", "idata", "integer_constants",
           "bytes_per_sample_hint"}

_current = []  # the graphs being built (pipeline_def calls may nest)


class Graph:
    def __init__(self):
        self.ops = []  # (schema, inst_name, [input edges], output edge, device, args)
        self.next_id = 0

    def add(self, schema, inputs, device, args, name=None):
        op_id = self.next_id
        self.next_id += 1
        inst = name if name is not None else "__%s_%d" % (schema, op_id)
        out = inst if name is not None else "%s[0]" % inst
        self.ops.append((schema, inst, [i.name for i in inputs], out, device, args, op_id))
        return DataNode(out, "cpu" if device == "cpu" else "gpu")


def current():
    if not _current:
        raise RuntimeError("DALI operators can be used only inside a pipeline definition")
    return _current[-1]


def _type_of(name, value):
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    if name in _FLOAT:
        return "float"
    if name in _INT or isinstance(value, (int, enum.IntEnum)):
        return "int64"
    if isinstance(value, float):
        return "float"
    raise TypeError("argument %s: cannot serialize %r" % (name, value))


def serialize_args(kwargs):
    out = []
    for name, value in kwargs.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                continue
            out.append(_wire.argument(name, _type_of(name, value[0]), list(value), True))
        elif name in _VECTOR and not isinstance(value, str):
            out.append(_wire.argument(name, _type_of(name, value), [value], True))
        else:
            out.append(_wire.argument(name, _type_of(name, value), value, False))
    return out


class DataNode:
    def __init__(self, name, device="cpu"):
        self.name = name
        self.device = device

    def gpu(self):
        return DataNode(self.name, "gpu")

    def _arith(self, fn, *operands):
        inputs, desc, ints, reals = [], [], [], []
        for o in operands:
            if isinstance(o, DataNode):
                desc.append("&%d" % len(inputs))
                inputs.append(o)
            elif isinstance(o, bool):
                desc.append("$%d:bool" % len(ints))
                ints.append(int(o))
            elif isinstance(o, int):
                desc.append("$%d:int32" % len(ints))
                ints.append(o)
            elif isinstance(o, float):
                desc.append("$%d:float32" % len(reals))
                reals.append(o)
            else:
                return NotImplemented
        device = "gpu" if any(i.device == "gpu" for i in inputs) else "cpu"
        args = {"device": device, "expression_desc": "%s(%s)" % (fn, " ".join(desc))}
        if ints:
            args["integer_constants"] = ints
        if reals:
            args["real_constants"] = reals
        return current().add("ArithmeticGenericOp", inputs, device, serialize_args(args))

    def __add__(self, o): return self._arith("add", self, o)
    def __radd__(self, o): return self._arith("add", o, self)
    def __sub__(self, o): return self._arith("sub", self, o)
    def __rsub__(self, o): return self._arith("sub", o, self)
    def __mul__(self, o): return self._arith("mul", self, o)
    def __rmul__(self, o): return self._arith("mul", o, self)
    def __truediv__(self, o): return self._arith("fdiv", self, o)
    def __rtruediv__(self, o): return self._arith("fdiv", o, self)
    def __floordiv__(self, o): return self._arith("div", self, o)
    def __rfloordiv__(self, o): return self._arith("div", o, self)
    def __neg__(self): return self._arith("minus", self)
    def __pos__(self): return self._arith("plus", self)


def schema_name(fn_name):
    """fn.crop_mirror_normalize -> CropMirrorNormalize; fn.decoders.image -> decoders__Image."""
    parts = fn_name.split(".")
    camel = "".join(p[:1].upper() + p[1:] for p in parts[-1].split("_"))
    camel = re.sub(r"Id$", "ID", camel)
    return "__".join(parts[:-1] + [camel])


def call(fn_name, inputs, kwargs):
    schema = schema_name(fn_name)
    kwargs = dict(kwargs)
    device = kwargs.pop("device", None)
    name = kwargs.pop("name", None)
    if device is None:
        device = "gpu" if any(i.device == "gpu" for i in inputs) else "cpu"
    args = {"device": device}
    if schema == "ExternalSource":
        if name is None:
            raise ValueError("fn.external_source needs a name (the Triton input it reads)")
        args["name"] = name
    for k in ("source", "cycle", "batch", "parallel", "prefetch_queue_depth", "no_copy",
              "blocking", "repeat_last", "preserve"):
        if schema == "ExternalSource":
            kwargs.pop(k, None)
    args.update(kwargs)
    for i in inputs:
        if not isinstance(i, DataNode):
            raise TypeError("%s: inputs must be DALI data nodes" % fn_name)
    return current().add(schema, list(inputs), device, serialize_args(args),
                         name=name if schema == "ExternalSource" else None)


def constant(value, dtype=None, shape=None, layout=None, device=None):
    values = value if isinstance(value, (list, tuple)) else [value]
    is_float = any(isinstance(v, float) for v in values)
    args = {"device": device or "cpu"}
    if is_float:
        args["fdata"] = [float(v) for v in values]
    else:
        args["idata"] = [int(v) for v in values]
    if shape is not None:
        args["shape"] = list(shape) if isinstance(shape, (list, tuple)) else [shape]
    elif isinstance(value, (list, tuple)):
        args["shape"] = [len(values)]
    if dtype is not None:
        args["dtype"] = int(dtype)
    if layout is not None:
        args["layout"] = layout
    return current().add("Constant", [], args["device"], serialize_args(args))
