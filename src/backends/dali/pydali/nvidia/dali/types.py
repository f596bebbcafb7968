"""DALI's enums with DALI's numbering (DALIDataType, DALIImageType, DALIInterpType)."""

import enum


class DALIDataType(enum.IntEnum):
    NO_TYPE = -1
    UINT8 = 0
    UINT16 = 1
    UINT32 = 2
    UINT64 = 3
    INT8 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    FLOAT16 = 8
    FLOAT = 9
    FLOAT64 = 10
    BOOL = 11


class DALIImageType(enum.IntEnum):
    RGB = 0
    BGR = 1
    GRAY = 2
    YCbCr = 3
    ANY_DATA = 4


class DALIInterpType(enum.IntEnum):
    INTERP_NN = 0
    INTERP_LINEAR = 1
    INTERP_CUBIC = 2
    INTERP_LANCZOS3 = 3
    INTERP_TRIANGULAR = 4
    INTERP_GAUSSIAN = 5


globals().update(DALIDataType.__members__)
globals().update(DALIImageType.__members__)
globals().update(DALIInterpType.__members__)
FLOAT32 = DALIDataType.FLOAT


def Constant(value, dtype=None, shape=None, layout=None, device=None, **kwargs):
    """A constant node (DALI's `Constant` operator), repeated for every sample."""
    from nvidia.dali import _graph
    return _graph.constant(value, dtype=dtype, shape=shape, layout=layout, device=device)
