"""Pipeline and @pipeline_def, with DALI's signatures, recording the graph instead of running
it; Pipeline.serialize writes DALI's PipelineDef protobuf."""

import functools

from nvidia.dali import _graph
from nvidia.dali import _wire


class Pipeline:
    def __init__(self, batch_size=-1, num_threads=-1, device_id=0, seed=-1,
                 prefetch_queue_depth=2, exec_pipelined=True, exec_async=True, **kwargs):
        self.max_batch_size = batch_size
        self.batch_size = batch_size
        self.num_threads = num_threads
        self.device_id = device_id if device_id is not None else -1
        self.seed = seed
        self._graph = _graph.Graph()
        self._outputs = []

    def __enter__(self):
        _graph._current.append(self._graph)
        return self

    def __exit__(self, *exc):
        _graph._current.pop()
        return False

    def set_outputs(self, *outputs):
        self._outputs = list(outputs)

    def define_graph(self):
        raise NotImplementedError

    def build(self):
        if not self._outputs:
            with self:
                outs = self.define_graph()
            self._outputs = list(outs) if isinstance(outs, (list, tuple)) else [outs]

    def serialize(self, filename=None, **kwargs):
        self.build()
        ops = []
        for schema, inst, inputs, out, device, args, op_id in self._graph.ops:
            ins = [_wire.input_output(i, "cpu" if device in ("cpu", "mixed") else "gpu")
                   for i in inputs]
            outs = [_wire.input_output(out, "cpu" if device == "cpu" else "gpu")]
            ops.append(_wire.op_def(schema, ins, outs, args, inst, op_id))
        outputs = [_wire.input_output(o.name, o.device) for o in self._outputs]
        data = _wire.pipeline_def(max(self.num_threads, 1), max(self.batch_size, 1), ops, outputs,
                                  self.device_id, self.seed)
        if filename is None:
            return data
        with open(filename, "wb") as f:
            f.write(data)
        return None


def pipeline_def(fn=None, **pipeline_kwargs):
    """@pipeline_def or @pipeline_def(batch_size=..., ...): calling the function returns a
    Pipeline whose graph is what the function built."""
    def decorate(func):
        @functools.wraps(func)
        def create(*args, **kwargs):
            pkw = dict(pipeline_kwargs)
            for k in ("batch_size", "num_threads", "device_id", "seed", "prefetch_queue_depth",
                      "exec_async", "exec_pipelined", "enable_conditionals", "output_dtype",
                      "output_ndim", "py_num_workers", "py_start_method"):
                if k in kwargs:
                    pkw[k] = kwargs.pop(k)
            pipe = Pipeline(**pkw)
            with pipe:
                outs = func(*args, **kwargs)
            pipe._outputs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            return pipe
        create._is_pipeline_def = True
        return create
    return decorate(fn) if fn is not None else decorate
