"""GPU memory a client process exports to inferd's CUDA shared-memory extension, as Triton's
clients do: cudaMalloc (not a pooling allocator: an IPC handle names a whole allocation, and the
server maps it from its start), cudaIpcGetMemHandle, and copies in and out.

Through CuPy where it is installed, else through the CUDA runtime library itself with ctypes
(the GPU machine's venv has cudart 13 from pip, beside PyTorch, and no CuPy). `available()`
says whether either is there and why not.
"""

import ctypes
import glob
import os
import sys

import numpy as np

_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


def _find_cudart():
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    for root in sys.path:
        for pattern in ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu13/lib/libcudart.so*",
                        "nvidia/*/lib/libcudart.so*", "torch/lib/libcudart*.so*"):
            for path in sorted(glob.glob(os.path.join(root, pattern)), reverse=True):
                try:
                    return ctypes.CDLL(path)
                except OSError:
                    pass
    return None


try:
    import cupy  # noqa: F401
    _cudart = None
    _why = ""
except ImportError:
    cupy = None
    _cudart = _find_cudart()
    _why = "" if _cudart is not None else "neither CuPy nor libcudart found"


def available():
    """'' when regions can be made here, else why not."""
    return _why


def _check(err, what):
    if err != 0:
        raise RuntimeError(f"{what}: CUDA error {err}")


class DeviceRegion:
    """`nbytes` of GPU `device` memory with its 64-byte IPC handle."""

    def __init__(self, nbytes, device=0):
        self.device, self.nbytes = device, nbytes
        if cupy is not None:
            with cupy.cuda.Device(device):
                self.ptr = cupy.cuda.runtime.malloc(nbytes)
                self.handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(self.ptr))
        else:
            _check(_cudart.cudaSetDevice(ctypes.c_int(device)), "cudaSetDevice")
            ptr = ctypes.c_void_p()
            _check(_cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cudaMalloc")
            self.ptr = ptr.value
            handle = (ctypes.c_char * 64)()
            _check(_cudart.cudaIpcGetMemHandle(handle, ctypes.c_void_p(self.ptr)),
                   "cudaIpcGetMemHandle")
            self.handle = bytes(handle)
        assert len(self.handle) == 64

    def _copy(self, dst, src, nbytes, kind):
        if cupy is not None:
            with cupy.cuda.Device(self.device):
                cupy.cuda.runtime.memcpy(dst, src, nbytes, kind)
        else:
            _check(_cudart.cudaSetDevice(ctypes.c_int(self.device)), "cudaSetDevice")
            _check(_cudart.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src),
                                      ctypes.c_size_t(nbytes), ctypes.c_int(kind)), "cudaMemcpy")

    def write(self, offset, array):
        host = np.ascontiguousarray(array)
        self._copy(self.ptr + offset, host.ctypes.data, host.nbytes, _H2D)

    def read(self, offset, count, dtype=np.float32):
        host = np.empty(count, dtype)
        self._copy(host.ctypes.data, self.ptr + offset, host.nbytes, _D2H)
        return host

    def free(self):
        if cupy is not None:
            with cupy.cuda.Device(self.device):
                cupy.cuda.runtime.free(self.ptr)
        else:
            _cudart.cudaFree(ctypes.c_void_p(self.ptr))
