"""Protobuf wire encoding of DALI's PipelineDef (dali/pipeline/proto/dali.proto field numbers),
written by hand so that serializing needs no protobuf package. Scalars are written unpacked,
as DALI's proto2 C++ code writes them."""

import struct


def _varint(v):
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire):
    return _varint((field << 3) | wire)


def f_varint(field, v):
    return _key(field, 0) + _varint(int(v))


def f_float(field, v):
    return _key(field, 5) + struct.pack("<f", float(v))


def f_bytes(field, b):
    if isinstance(b, str):
        b = b.encode()
    return _key(field, 2) + _varint(len(b)) + b


def argument(name, type_name, value, is_vector):
    """An Argument message: a scalar in the field of its type, a list as extra_args elements."""
    out = f_bytes(1, name) + f_bytes(2, type_name)
    if is_vector:
        for i, v in enumerate(value):
            out += f_bytes(7, argument("element %d" % i, type_name, v, False))
        return out + f_varint(8, 1)
    if type_name == "float":
        out += f_float(3, value)
    elif type_name == "int64":
        out += f_varint(4, value)
    elif type_name == "string":
        out += f_bytes(5, value)
    elif type_name == "bool":
        out += f_varint(6, 1 if value else 0)
    else:
        raise TypeError("cannot serialize an argument of type %s" % type_name)
    return out + f_varint(8, 0)


def input_output(name, device, dtype=None, ndim=None):
    out = f_bytes(1, name) + f_bytes(2, device) + f_varint(3, 0)
    if dtype is not None:
        out += f_varint(5, dtype)
    if ndim is not None:
        out += f_varint(6, ndim)
    return out


def op_def(name, inputs, outputs, args, inst_name, logical_id):
    out = f_bytes(1, name)
    for i in inputs:
        out += f_bytes(2, i)
    for o in outputs:
        out += f_bytes(3, o)
    for a in args:
        out += f_bytes(4, a)
    return out + f_bytes(5, inst_name) + f_varint(6, logical_id)


def pipeline_def(num_threads, batch_size, ops, outputs, device_id, seed):
    out = f_varint(1, num_threads) + f_varint(2, batch_size)
    out += f_varint(3, 0) + f_varint(4, 0)
    for op in ops:
        out += f_bytes(5, op)
    for o in outputs:
        out += f_bytes(7, o)
    return out + f_varint(8, device_id) + f_varint(9, seed)
