"""The legacy operator-object API: ops.Resize(device="cpu", resize_x=...)(images)."""

import re

from nvidia.dali import _graph


class _Op:
    def __init__(self, schema, **kwargs):
        self._schema = schema
        self._kwargs = kwargs

    def __call__(self, *inputs, **kwargs):
        args = dict(self._kwargs, **kwargs)
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", self._schema.split("__")[-1]).lower()
        prefix = "".join(p + "." for p in self._schema.split("__")[:-1])
        return _graph.call(prefix + snake, inputs, args)


def _op_class(schema):
    return type(schema, (_Op,), {"__init__": lambda self, **kw: _Op.__init__(self, schema, **kw)})


class _Module:
    def __init__(self, prefix):
        self._prefix = prefix

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _op_class(self._prefix + attr)


decoders = _Module("decoders__")


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _op_class(attr)
