"""fn.<operator>(inputs..., **arguments): records one operator of the pipeline being defined."""

from nvidia.dali import _graph


def _make(name):
    def op(*inputs, **kwargs):
        return _graph.call(name, inputs, kwargs)
    op.__name__ = name.split(".")[-1]
    return op


class _Module:
    def __init__(self, prefix):
        self._prefix = prefix

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _make(self._prefix + attr)


decoders = _Module("decoders.")
experimental = _Module("experimental.")


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _make(attr)
