"""inferd's own nvidia.dali: enough of DALI's Python API to define a pipeline and serialize it
(pipeline_def, Pipeline, fn, ops, types, plugin.triton.autoserialize). Nothing runs here; inferd's
dali backend runs the serialized pipeline. Not NVIDIA DALI."""

from nvidia.dali import fn, ops, types
from nvidia.dali.pipeline import Pipeline, pipeline_def

__version__ = "inferd"
