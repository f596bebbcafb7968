"""@autoserialize, as nvidia.dali.plugin.triton: marks the pipeline_def that Triton's DALI backend
(here, inferd's) serializes when it loads dali.py."""

_marked = []


def autoserialize(dali_pipeline):
    if not getattr(dali_pipeline, "_is_pipeline_def", False):
        raise TypeError("@autoserialize applies to a function decorated with @pipeline_def")
    _marked.append(dali_pipeline)
    return dali_pipeline
