"""Serializes the @autoserialize pipeline of a dali.py: `inferd_dali_serialize.py DALI_PY OUT`.
inferd's dali backend runs this (with inferd's nvidia.dali first on PYTHONPATH) when a model
folder holds dali.py instead of model.dali. Exit status 0 and OUT written, or 1 and the reason
on stderr."""

import runpy
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, out = sys.argv[1], sys.argv[2]
    from nvidia.dali.plugin import triton
    runpy.run_path(source, run_name="__dali_autoserialize__")
    if len(triton._marked) != 1:
        print("%s: expected exactly one @autoserialize pipeline, found %d"
              % (source, len(triton._marked)), file=sys.stderr)
        return 1
    pipe = triton._marked[0]()
    pipe.serialize(filename=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
