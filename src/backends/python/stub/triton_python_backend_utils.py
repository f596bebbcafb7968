"""inferd's `triton_python_backend_utils`: the module Triton's Python backend gives model.py files.

Written for inferd from Triton's documented API (python_backend README): the same names, arguments
and behaviour, so model.py files written for Triton import and run unchanged. Tensors live in
numpy arrays; inferd moves their bytes through a shared memory mapping (see inferd_python_stub.py),
never through pickling.
"""

import base64
import ctypes
import glob
import json
import os
import struct
import sys

import numpy as np

# TRITONSERVER_DataType values, as Triton numbers them.
_TYPE_NAMES = ["INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
               "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"]
_NUMPY_OF_NAME = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}

# numpy dtype (and scalar type) -> TRITONSERVER_DataType, for one dictionary lookup per tensor.
_TRITON_OF_DTYPE = {}
for _code, _name in enumerate(_TYPE_NAMES):
    if _name in _NUMPY_OF_NAME:
        _TRITON_OF_DTYPE[np.dtype(_NUMPY_OF_NAME[_name])] = _code
        _TRITON_OF_DTYPE[_NUMPY_OF_NAME[_name]] = _code
_TRITON_OF_DTYPE[bool] = 1

_CODE_OF_NAME = {name: code for code, name in enumerate(_TYPE_NAMES)}

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Set by the stub: the connection to inferd (BLS, logging, readiness) and the model's folder.
_channel = None
_model_dir = ""


def serialize_byte_tensor(input_tensor):
    """Flattens an object/bytes array into 4-byte little-endian length + bytes per element."""
    if input_tensor.size == 0:
        return np.empty([0], dtype=np.object_)
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        raise TritonModelException("cannot serialize a tensor of dtype " + str(input_tensor.dtype)
                                   + " as BYTES")
    parts = []
    for item in input_tensor.reshape(-1, order="C"):
        if isinstance(item, (bytes, bytearray)):
            s = bytes(item)
        elif isinstance(item, np.bytes_):
            s = item.tobytes()
        else:
            s = str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(s)))
        parts.append(s)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor):
    """The inverse of serialize_byte_tensor: a 1-D numpy object array of bytes."""
    buf = memoryview(encoded_tensor).cast("B") if not isinstance(encoded_tensor, bytes) \
        else encoded_tensor
    strs = []
    offset = 0
    n = len(buf)
    while offset < n:
        (length,) = struct.unpack_from("<I", buf, offset)
        offset += 4
        strs.append(bytes(buf[offset:offset + length]))
        offset += length
    return np.array(strs, dtype=np.object_)


def get_input_tensor_by_name(inference_request, name):
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config, name):
    for props in model_config.get("input", []):
        if props["name"] == name:
            return props
    return None


def get_output_config_by_name(model_config, name):
    for props in model_config.get("output", []):
        if props["name"] == name:
            return props
    return None


def using_decoupled_model_transaction_policy(model_config):
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_to_numpy_type(data_type):
    if 0 < data_type < 14:
        return _NUMPY_OF_NAME[_TYPE_NAMES[data_type]]
    return None


def numpy_to_triton_type(data_type):
    try:
        code = _TRITON_OF_DTYPE.get(data_type)
        if code is not None:
            return code
        t = np.dtype(data_type)
    except TypeError:
        return None
    if t.type == np.bytes_:
        return 13
    return _TRITON_OF_DTYPE.get(t)


def triton_string_to_numpy(triton_type_string):
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def get_model_dir():
    return _model_dir


def is_model_ready(model_name, model_version=""):
    return _channel.is_model_ready(model_name, str(model_version))


def load_model(model_name, config="", files=None):
    """Loads (or reloads) a model through inferd's model repository, as the repository API's
    load does: `config` a JSON model configuration overriding the repository's, `files`
    {"file:<path>": bytes} a model folder replacing it (needs `config`). Returns when the
    load is done; a refusal or failure raises TritonModelException. Needs
    --model-control-mode=explicit, as Triton's does."""
    if not isinstance(model_name, str) or not model_name:
        raise TritonModelException("load_model: model_name must be a non-empty str")
    if not isinstance(config, str):
        raise TritonModelException("load_model: config must be a JSON str")
    encoded = {}
    for key, content in (files or {}).items():
        if not isinstance(key, str) or not isinstance(content, (bytes, bytearray)):
            raise TritonModelException(
                "load_model: files must map 'file:<path>' (str) to the file's bytes")
        encoded[key] = base64.b64encode(bytes(content)).decode()
    if _channel is None:
        raise TritonModelException("load_model is available only inside inferd")
    _channel.model_control({"op": "load_model", "name": model_name, "config": config,
                            "files": encoded})


def unload_model(model_name, unload_dependents=False):
    """Unloads a model through inferd's model repository; returns when it is unloaded."""
    if not isinstance(model_name, str) or not model_name:
        raise TritonModelException("unload_model: model_name must be a non-empty str")
    if _channel is None:
        raise TritonModelException("unload_model is available only inside inferd")
    _channel.model_control({"op": "unload_model", "name": model_name,
                            "unload_dependents": bool(unload_dependents)})


# ------------------------------------------------------------------------------------------------
# Errors


class TritonError:
    """An error a response carries; `code` is one of the class constants (INTERNAL by default)."""
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=1):
        if message is None:
            raise TypeError("TritonError: message must not be None")
        self._msg = str(message)
        self._code = int(code)

    def __str__(self):
        return self._msg

    def __repr__(self):
        return f"TritonError({self._msg!r}, {self._code})"

    def message(self):
        return self._msg

    def code(self):
        return self._code


class TritonModelException(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self._msg = msg

    def message(self):
        return self._msg


# ------------------------------------------------------------------------------------------------
# Tensors, requests, responses


# ------------------------------------------------------------------------------------------------
# DLPack (dlpack.h's public ABI, read and written with ctypes: no extension module to build)
#
# A tensor from a CPU producer becomes a numpy array (np.from_dlpack: no copy). A tensor on a
# GPU (kDLCUDA, kDLCUDAManaged) stays where it is: the Tensor keeps the producer's
# DLManagedTensor (so the producer's memory lives) and records its pointer, shape and type;
# `to_dlpack()` hands consumers a capsule over the same memory. inferd's server answers host
# bytes, so such a tensor is copied to the host once, when a response or a BLS request that
# holds it is written into the shared mapping (_copy_to_host).

_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_HOST_DEVICES = (_kDLCPU, _kDLCUDAHost)  # Triton reads pinned host memory as CPU memory
_GPU_DEVICES = (_kDLCUDA, _kDLCUDAManaged)
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat, _kDLBool = 0, 1, 2, 4, 6
# TRITONSERVER_DataType <-> DLPack (code, bits), as Triton's pb_stub_utils.cc maps them.
_DL_OF_TRITON = {1: (_kDLBool, 8), 2: (_kDLUInt, 8), 3: (_kDLUInt, 16), 4: (_kDLUInt, 32),
                 5: (_kDLUInt, 64), 6: (_kDLInt, 8), 7: (_kDLInt, 16), 8: (_kDLInt, 32),
                 9: (_kDLInt, 64), 10: (_kDLFloat, 16), 11: (_kDLFloat, 32),
                 12: (_kDLFloat, 64), 14: (_kDLBfloat, 16)}
_TRITON_OF_DL = {dl: code for code, dl in _DL_OF_TRITON.items()}
_BF16 = 14


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DLDeleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DLDeleter)]


# The capsule functions of the C API, on a handle of our own: prototypes set on
# ctypes.pythonapi would change them for every other user of it in the process.
_PY = ctypes.PyDLL(None)


def _capi(name, restype, *argtypes):
    f = _PY[name]  # a new function object each time: two prototypes of one function can coexist
    f.restype, f.argtypes = restype, list(argtypes)
    return f


_capsule_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object,
                         ctypes.c_char_p)
_capsule_set_name = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                     ctypes.c_void_p)
# The same two, for the capsule destructor, which gets the dying capsule as a bare pointer.
_raw_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_raw_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
# A capsule keeps the pointer to its name: these live as long as the module.
_DLTENSOR = b"dltensor"
_USED_DLTENSOR = b"used_dltensor"


def _is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"  # the type has no public name


class _DLOwner:
    """The DLManagedTensor a Tensor consumed: its deleter runs when the last user lets go.
    `source` (the producer object, when there is one) is kept too."""

    __slots__ = ("_address", "_source", "__weakref__")

    def __init__(self, address, source):
        self._address, self._source = address, source

    def __del__(self):
        address, self._address = self._address, None
        if address:
            try:
                deleter = _DLManagedTensor.from_address(address).deleter
                if deleter:
                    deleter(address)
            except Exception:  # a destructor must not raise (the interpreter may be exiting)
                pass


class _DeviceTensor:
    """Where a GPU tensor's bytes are: device (DLPack type and id), address, shape, size."""

    __slots__ = ("device_type", "device_id", "ptr", "shape", "nbytes", "owner")

    def __init__(self, device_type, device_id, ptr, shape, nbytes, owner):
        self.device_type, self.device_id, self.ptr = device_type, device_id, ptr
        self.shape, self.nbytes, self.owner = shape, nbytes, owner


# What our exported capsules keep alive, by the address of their DLManagedTensor: removed by
# the deleter (the consumer is done) or by the capsule's destructor (no one consumed it).
_EXPORTED = {}


@_DLDeleter
def _exported_deleter(address):
    exported = _EXPORTED
    if exported is not None:  # None: the interpreter is shutting down
        exported.pop(address, None)


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CapsuleDestructor
def _exported_capsule_destructor(capsule):
    # DLPack's rule for Python: a capsule still named "dltensor" was never consumed, so its
    # tensor is still ours to free.
    try:
        if _raw_is_valid(capsule, _DLTENSOR):
            _exported_deleter(_raw_pointer(capsule, _DLTENSOR))
    except Exception:  # a destructor must not raise (the interpreter may be shutting down)
        pass


_DESTRUCTOR_ADDRESS = ctypes.cast(_exported_capsule_destructor, ctypes.c_void_p).value


def _export_dlpack(ptr, device_type, device_id, shape, triton_code, owner):
    """A "dltensor" capsule over `ptr` (compact, row-major) that keeps `owner` alive until the
    consumer calls its deleter."""
    code, bits = _DL_OF_TRITON[triton_code]
    ndim = len(shape)
    managed = _DLManagedTensor()
    dims = (ctypes.c_int64 * max(ndim, 1))(*shape)
    t = managed.dl_tensor
    t.data = ptr
    t.device.device_type, t.device.device_id = device_type, device_id
    t.ndim = ndim
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
    t.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    t.strides = None  # compact row-major
    t.byte_offset = 0
    managed.deleter = _exported_deleter
    address = ctypes.addressof(managed)
    _EXPORTED[address] = (managed, dims, owner)
    return _capsule_new(address, _DLTENSOR, _DESTRUCTOR_ADDRESS)


def _read_dlpack(name, capsule):
    """Checks a "dltensor" capsule (not yet consumed) and returns (DLManagedTensor address,
    device type, device id, data address, shape, Triton type code, size in bytes, whether it
    is compact row-major). Raises TritonModelException naming the tensor and the reason."""
    if not _is_capsule(capsule) or not _capsule_is_valid(capsule, _DLTENSOR):
        raise TritonModelException(
            f"Tensor.from_dlpack('{name}'): expected a DLPack capsule named 'dltensor' (one "
            "that was consumed already cannot be used again)")
    address = _capsule_pointer(capsule, _DLTENSOR)
    t = _DLManagedTensor.from_address(address).dl_tensor
    device_type, device_id = int(t.device.device_type), int(t.device.device_id)
    if device_type not in _HOST_DEVICES and device_type not in _GPU_DEVICES:
        raise TritonModelException(f"Tensor.from_dlpack('{name}'): DLDevice type {device_type} "
                                   "is not supported by Python backend.")
    dt = t.dtype
    code = _TRITON_OF_DL.get((int(dt.code), int(dt.bits))) if dt.lanes == 1 else None
    if code is None:
        raise TritonModelException(
            f"Tensor.from_dlpack('{name}'): DLPack data type (code {dt.code}, bits {dt.bits}, "
            f"lanes {dt.lanes}) has no Triton data type")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    count = 1
    for d in shape:
        count *= d
    compact = True
    if t.strides and count > 0:
        expected = 1
        for i in range(ndim - 1, -1, -1):
            # A dimension of size 1 may carry any stride (torch gives such ones).
            if shape[i] != 1 and int(t.strides[i]) != expected:
                compact = False
                break
            expected *= shape[i]
    data = (t.data or 0) + int(t.byte_offset)
    return address, device_type, device_id, data, shape, code, count * (dt.bits // 8), compact


# ------------------------------------------------------------------------------------------------
# The one copy of a GPU tensor to the host (CUDA runtime through ctypes)

_cudart = None
_cudart_error = None


def _cudart_candidates():
    """Where the CUDA runtime may be, best first: one this process loaded already (torch's),
    the pip wheels beside the interpreter's packages, the system's, the toolkit's."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if "/libcudart.so" in path and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    for root in sys.path:
        if not root.endswith(("site-packages", "dist-packages")):
            continue
        for pattern in ("torch/lib/libcudart*.so*", "nvidia/cuda_runtime/lib/libcudart.so*",
                        "nvidia/cu*/lib/libcudart.so*"):
            paths += sorted(glob.glob(os.path.join(root, pattern)), reverse=True)
    paths += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    paths += sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"), reverse=True)
    return paths


def _load_cudart():
    global _cudart, _cudart_error
    if _cudart is not None:
        return _cudart
    if _cudart_error is not None:
        raise TritonModelException(_cudart_error)
    tried = _cudart_candidates()
    for path in tried:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_int]
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcMemHandle,
                                             ctypes.c_uint]
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        _cudart = lib
        return lib
    _cudart_error = ("a tensor on the GPU needs the CUDA runtime, but no libcudart.so could be "
                     "loaded; tried: " + ", ".join(tried))
    raise TritonModelException(_cudart_error)


class _IpcMemHandle(ctypes.Structure):
    """cudaIpcMemHandle_t: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _on_device(lib, device_id, call, what):
    """Runs call() with `device_id` current, then makes the previous device current again;
    raises TritonModelException naming `what` and CUDA's error."""

    def check(err, name):
        if err != 0:
            raise TritonModelException(
                f"{name} failed: {lib.cudaGetErrorString(err).decode(errors='replace')} "
                f"(cudaError {err})")

    current = ctypes.c_int(0)
    check(lib.cudaGetDevice(ctypes.byref(current)), "cudaGetDevice")
    check(lib.cudaSetDevice(device_id), f"cudaSetDevice({device_id})")
    try:
        check(call(), what)
    finally:
        if current.value != device_id:
            lib.cudaSetDevice(current.value)


def _cuda_ipc_open(handle, device_id):
    """Maps the device memory another process exported (its 64-byte cudaIpcMemHandle_t) on
    GPU `device_id`; returns the address of the start of that allocation."""
    lib = _load_cudart()
    h = _IpcMemHandle()
    h.reserved = bytes(handle)
    ptr = ctypes.c_void_p()
    # flags 1: cudaIpcMemLazyEnablePeerAccess (the memory may be on another GPU)
    _on_device(lib, device_id, lambda: lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), h, 1),
               f"cudaIpcOpenMemHandle on GPU {device_id}")
    return ptr.value


def _cuda_ipc_close(address, device_id):
    lib = _load_cudart()
    _on_device(lib, device_id, lambda: lib.cudaIpcCloseMemHandle(address),
               f"cudaIpcCloseMemHandle on GPU {device_id}")


# How the stub maps an input the server left on a GPU (FORCE_CPU_ONLY_INPUT_TENSORS 'no'):
# open (64 handle bytes, device id) -> allocation address; close (address, device id). Tests
# without a GPU replace both.
_ipc_open = _cuda_ipc_open
_ipc_close = _cuda_ipc_close


def _cuda_device_to_host(dst, src, nbytes, device_id):
    """Copies `nbytes` from device memory `src` (on GPU `device_id`) to host memory `dst`.

    cudaMemcpy is synchronous and runs on the legacy default stream, which waits for the work
    of every blocking stream, so what the producer queued on those is done before the copy;
    a producer on a non-blocking stream must have synchronized first, as with Triton (torch
    orders its current stream before the default one when from_dlpack asks with stream=1)."""
    lib = _load_cudart()
    _on_device(lib, device_id, lambda: lib.cudaMemcpy(dst, src, nbytes, 2),  # kind 2: D2H
               "cudaMemcpy (device to host)")


# The copy used for GPU tensors: (host destination address, device source address, bytes,
# device id). Tests without a GPU replace it (with one over host memory: ctypes.memmove).
_device_to_host = _cuda_device_to_host


def _copy_to_host(tensor):
    """The bytes of a tensor on the GPU, in a new host array (uint8): the one copy."""
    dev = tensor._dev
    out = np.empty(dev.nbytes, dtype=np.uint8)
    if dev.nbytes:
        try:
            _device_to_host(out.ctypes.data, dev.ptr, dev.nbytes, dev.device_id)
        except TritonModelException as e:
            raise TritonModelException(f"tensor '{tensor._name}' (on GPU {dev.device_id}): "
                                       f"{e.message()}") from None
    return out


class _DLPackCapsule:
    """A bare capsule in the shape np.from_dlpack takes (a host tensor)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return (_kDLCPU, 0)


class Tensor:
    """A named tensor over a numpy array (BYTES as a numpy object array, BF16 as the uint16
    bits), or over memory on a GPU (from_dlpack) that `_dev` describes (`_array` is None)."""

    __slots__ = ("_name", "_array", "_dtype", "_dev")

    def __init__(self, name, numpy_array, triton_dtype=None):
        if numpy_array.__class__ is not np.ndarray:
            numpy_array = np.asarray(numpy_array)
        kind = numpy_array.dtype.kind
        if kind == "U" or kind == "V":
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not supported by Python backend. "
                "Please use np.object_ instead.")
        if triton_dtype is not None:
            npt = triton_to_numpy_type(triton_dtype)
            if npt is not None and npt is not np.object_ and numpy_array.dtype != npt:
                numpy_array = numpy_array.view(npt)
            self._dtype = int(triton_dtype)
        else:
            self._dtype = numpy_to_triton_type(numpy_array.dtype)
            if self._dtype is None:
                raise TritonModelException(
                    f"tensor '{name}': numpy dtype {numpy_array.dtype} has no Triton data type")
        self._name = name
        self._array = numpy_array
        self._dev = None

    @classmethod
    def _wrap(cls, name, array, type_name):
        # The stub's constructor for tensors it read: the type is known, nothing to check.
        t = object.__new__(cls)
        t._name, t._array, t._dtype, t._dev = name, array, _CODE_OF_NAME[type_name], None
        return t

    @classmethod
    def _wrap_device(cls, name, code, device_id, ptr, shape, nbytes):
        # An input on GPU `device_id` at `ptr` (mapped by the stub for the request's life).
        t = object.__new__(cls)
        t._name, t._array, t._dtype = name, None, code
        t._dev = _DeviceTensor(_kDLCUDA, device_id, ptr, tuple(shape), nbytes, None)
        return t

    @classmethod
    def _wrap_code(cls, name, array, code):
        t = object.__new__(cls)
        t._name, t._array, t._dtype, t._dev = name, array, code, None
        return t

    def name(self):
        return self._name

    def as_numpy(self):
        if self._dev is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._dtype == _BF16:
            raise TritonModelException("Tensor dtype is BF16 and cannot be converted to NumPy. "
                                       "Use to_dlpack() and from_dlpack() instead.")
        return self._array

    def triton_dtype(self):
        return self._dtype

    def shape(self):
        if self._dev is not None:
            return list(self._dev.shape)
        return list(self._array.shape)

    def is_cpu(self):
        return self._dev is None

    def to_dlpack(self):
        dev = self._dev
        if dev is not None:
            return _export_dlpack(dev.ptr, dev.device_type, dev.device_id, dev.shape,
                                  self._dtype, dev)
        if self._dtype == 13:
            raise TritonModelException("DLPack does not support BYTES tensors")
        a = self._array
        # numpy has no bfloat16 (the uint16 bits, typed BF16 here), and refuses to export a
        # read-only array (one np.from_dlpack made): those go out in a capsule of our own.
        if self._dtype == _BF16 or not a.flags.writeable:
            a = np.ascontiguousarray(a)
            return _export_dlpack(a.ctypes.data, _kDLCPU, 0, a.shape, self._dtype, a)
        return a.__dlpack__()

    def __dlpack__(self, stream=None, **kwargs):
        # Nothing is pending on a Tensor's memory (as in Triton): no stream to order.
        return self.to_dlpack()

    def __dlpack_device__(self):
        dev = self._dev
        return (dev.device_type, dev.device_id) if dev is not None else (_kDLCPU, 0)

    @staticmethod
    def from_dlpack(name, dlpack_tensor):
        """A Tensor over a DLPack tensor: a capsule, or an object with __dlpack__ and
        __dlpack_device__ (torch, CuPy, numpy...). Host memory becomes a numpy array (no
        copy); GPU memory stays on the GPU (is_cpu() False) until inferd needs its bytes."""
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        source = None
        if _is_capsule(dlpack_tensor):
            capsule = dlpack_tensor
        else:
            if not hasattr(dlpack_tensor, "__dlpack__") or \
                    not hasattr(dlpack_tensor, "__dlpack_device__"):
                raise TritonModelException(
                    f"Tensor.from_dlpack('{name}'): provided tensor is not supported. Tensor "
                    "must be a DLPack capsule or have `__dlpack__` and `__dlpack_device__` "
                    "attributes")
            source = dlpack_tensor
            device_type = int(dlpack_tensor.__dlpack_device__()[0])
            capsule = None
            if device_type in _GPU_DEVICES:
                # stream=1 (the array API's legacy default stream): the producer orders its
                # pending work before that stream, which the copy to the host runs on.
                try:
                    capsule = dlpack_tensor.__dlpack__(stream=1)
                except TypeError:
                    capsule = None
            if capsule is None:
                capsule = dlpack_tensor.__dlpack__()
        address, device_type, device_id, data, shape, code, nbytes, compact = \
            _read_dlpack(name, capsule)
        why = ""
        if device_type in _HOST_DEVICES and code != _BF16:
            try:  # no copy: numpy takes the capsule
                array = np.from_dlpack(_DLPackCapsule(capsule))
                return Tensor._wrap_code(name, array, code)
            except (RuntimeError, TypeError, BufferError, ValueError) as e:
                why = str(e)  # a type this numpy does not import (bool before 1.25): copied
        if not compact:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}'): DLPack tensor is not contiguous. Only "
                "contiguous DLPack tensors that are stored in C-Order are supported.")
        if device_type in _HOST_DEVICES:  # the bytes, copied (BF16: its bits as uint16)
            npt = np.uint16 if code == _BF16 else triton_to_numpy_type(code)
            array = np.empty(shape, dtype=npt)
            if array.nbytes != nbytes:
                raise TritonModelException(f"Tensor.from_dlpack('{name}'): {why}")
            if nbytes:
                ctypes.memmove(array.ctypes.data, data, nbytes)
            return Tensor._wrap_code(name, array, code)
        # On the GPU: consumed here (renamed, as DLPack's consumers do); the deleter runs when
        # the Tensor and every capsule exported from it are gone.
        owner = _DLOwner(address, source)
        _capsule_set_name(capsule, _USED_DLTENSOR)
        t = object.__new__(Tensor)
        t._name, t._array, t._dtype = name, None, code
        t._dev = _DeviceTensor(device_type, device_id, data, shape, nbytes, owner)
        return t


class PreferredMemory:
    TRITONSERVER_MEMORY_GPU = 1
    TRITONSERVER_MEMORY_CPU = 0

    def __init__(self, preferred_memory_type, preferred_device_id=0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


TRITONSERVER_MEMORY_GPU = 1
TRITONSERVER_MEMORY_CPU = 0


def _parameters_json(parameters):
    """A request's or response's parameters as the JSON object text parameters() answers,
    checked as Triton's stub checks them: a dict of str to bool, int or str (a JSON string
    of such an object is taken too)."""
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        return parameters or "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type "
                f"{type(value)}")
    return json.dumps(parameters) if parameters else "{}"


class InferenceResponse:
    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(self, output_tensors=None, error=None, parameters=None):
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list.')
        self._outputs = output_tensors
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters


class InferenceRequest:
    """A request given to execute(), or one a model builds to call another model (BLS)."""

    __slots__ = ("_request_id", "_correlation_id", "_inputs", "_requested", "_model_name",
                 "_model_version", "_flags", "_timeout", "_parameters", "_sender", "_index",
                 "_preferred_memory", "_trace", "_flags_released")

    def __init__(self, request_id="", correlation_id=0, inputs=None, requested_output_names=None,
                 model_name=None, model_version=-1, flags=0, timeout=0, preferred_memory=None,
                 trace=None, parameters=None):
        # As Triton's binding: inputs, requested_output_names and model_name are required.
        if inputs is None or requested_output_names is None or model_name is None:
            raise TypeError("InferenceRequest needs inputs, requested_output_names and "
                            "model_name")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._model_name = model_name
        self._model_version = int(model_version)
        self._flags = flags
        self._timeout = int(timeout)
        self._parameters = _parameters_json(parameters)
        self._sender = None
        self._index = -1  # the position in execute()'s list; -1: a request the model built
        self._preferred_memory = preferred_memory
        self._trace = trace

    @classmethod
    def _make(cls, request_id, inputs, requested, model_name, model_version, timeout,
              parameters, index, correlation_id=0, flags=0):
        # The stub's constructor for the requests it hands to execute(): no checks, no copies.
        r = object.__new__(cls)
        r._request_id, r._correlation_id, r._inputs, r._requested = \
            request_id, correlation_id, inputs, requested
        r._model_name, r._model_version, r._flags, r._timeout = \
            model_name, model_version, flags, timeout
        r._parameters, r._sender, r._index = parameters, None, index
        r._preferred_memory = r._trace = None
        return r

    def inputs(self):
        return self._inputs

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def set_flags(self, flags):
        self._flags = flags

    def timeout(self):
        return self._timeout

    def parameters(self):
        return self._parameters

    def requested_output_names(self):
        return self._requested

    def model_name(self):
        return self._model_name

    def is_cancelled(self):
        """Whether the client of this request went away (asks inferd: one round trip)."""
        if self._index < 0 or _channel is None:
            return False
        return _channel.is_cancelled(self._index)

    def set_release_flags(self, flags):
        """TRITONSERVER_REQUEST_RELEASE_ALL only: inferd does not reschedule requests (Triton
        does for a sequence_batching.iterative_sequence model, which inferd refuses at load).
        A refusal here, rather than a request silently released."""
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE is not supported by inferd: it does not "
                "reschedule requests (sequence_batching.iterative_sequence is refused at load)")
        self._flags_released = flags

    def get_response_sender(self):
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is only available in decoupled models "
                "(model_transaction_policy { decoupled: true })")
        return self._sender

    def exec(self, decoupled=False):
        """Runs the request in inferd; decoupled=True: an iterator over the model's responses
        (the last one may be empty: the final flag alone)."""
        _check_bls_allowed()
        if decoupled:
            return _channel.bls_stream(self)
        return _channel.bls_exec(self)

    def async_exec(self, decoupled=False):
        """An awaitable of exec()'s result; decoupled=True: of a response iterator (also
        usable with `async for`)."""
        _check_bls_allowed()
        if decoupled:
            return _channel.bls_stream_submit(self)
        return _channel.bls_submit(self)


# Whether BLS requests may be sent: from the end of initialize() to the start of finalize(),
# as in Triton, whose stub refuses them in either with the message below.
_bls_allowed = False


def _check_bls_allowed():
    if not _bls_allowed:
        raise TritonModelException("BLS is only supported during the 'execute' function.")


# ------------------------------------------------------------------------------------------------
# Logging


class LogLevel:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=LogLevel.INFO):
        if _channel is not None:
            _channel.log(int(level), str(message))

    @staticmethod
    def log_info(message):
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, LogLevel.VERBOSE)


# Custom metrics (Triton's pb_utils.MetricFamily / Metric): kept by inferd and shown on its
# GET /metrics. Same name, same family (the first description stays; another kind is refused);
# same family and labels, same series. Each object is a handle, released when it is deleted.


class _FamilyState:
    """What a family's Metric objects share with it: whether the family was deleted."""
    __slots__ = ("handle", "kind", "name", "deleted")


class MetricFamily:
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name, description, kind):
        if kind not in (MetricFamily.COUNTER, MetricFamily.GAUGE, MetricFamily.HISTOGRAM):
            raise TritonModelException(
                f"MetricFamily '{name}': kind must be MetricFamily.COUNTER, GAUGE or "
                f"HISTOGRAM, got {kind!r}")
        if _channel is None:
            raise TritonModelException("custom metrics are available only inside inferd")
        self._state = _FamilyState()
        self._state.kind, self._state.name, self._state.deleted = kind, str(name), False
        self._state.handle = None
        self._state.handle = int(_channel.metric_call({
            "op": "metric_family", "name": str(name), "description": str(description),
            "kind": int(kind)}))

    def Metric(self, labels=None, buckets=None):
        """A series of this family with `labels` (a dict of str to str); a histogram needs
        `buckets`, its upper bounds in increasing order."""
        if labels is None:
            labels = {}
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TritonModelException("Metric: labels must be a dict of str to str")
        if self._state.kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise TritonModelException(
                    f"Metric of histogram family '{self._state.name}': buckets are required")
            buckets = [float(b) for b in buckets]
        elif buckets is not None:
            raise TritonModelException(
                f"Metric of family '{self._state.name}': only a histogram takes buckets")
        return Metric._make(self._state, labels, buckets)

    def __del__(self):
        state = getattr(self, "_state", None)
        if state is None or state.handle is None:
            return
        state.deleted = True
        try:
            if _channel is not None:
                _channel.metric_release(state.handle)
        except Exception:
            pass


class Metric:
    """One series of a MetricFamily; made by MetricFamily.Metric(labels, buckets)."""

    def __init__(self, *args, **kwargs):
        raise TritonModelException("Metric objects are made with MetricFamily.Metric()")

    @classmethod
    def _make(cls, family_state, labels, buckets):
        m = object.__new__(cls)
        m._family = family_state
        m._handle = None
        msg = {"op": "metric_new", "id": family_state.handle, "labels": labels}
        if buckets is not None:
            msg["buckets"] = buckets
        m._handle = int(_channel.metric_call(msg))
        return m

    def _check(self, operation, kinds):
        if self._family.deleted:
            raise TritonModelException(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted.")
        if self._family.kind not in kinds:
            kind = {0: "counter", 1: "gauge", 2: "histogram"}[self._family.kind]
            raise TritonModelException(
                f"{operation}() is not supported on metric '{self._family.name}', a {kind}")

    def increment(self, value):
        self._check("increment", (MetricFamily.COUNTER, MetricFamily.GAUGE))
        if self._family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException(
                f"metric '{self._family.name}' is a counter: it cannot be incremented by a "
                f"negative value ({value})")
        _channel.metric_call({"op": "metric_update", "id": self._handle, "what": "increment",
                              "value": float(value)})

    def set(self, value):
        self._check("set", (MetricFamily.GAUGE,))
        _channel.metric_call({"op": "metric_update", "id": self._handle, "what": "set",
                              "value": float(value)})

    def observe(self, value):
        self._check("observe", (MetricFamily.HISTOGRAM,))
        _channel.metric_call({"op": "metric_update", "id": self._handle, "what": "observe",
                              "value": float(value)})

    def value(self):
        self._check("value", (MetricFamily.COUNTER, MetricFamily.GAUGE))
        return float(_channel.metric_call({"op": "metric_value", "id": self._handle}))

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is None:
            return
        try:
            if _channel is not None:
                _channel.metric_release(handle)
        except Exception:
            pass


# ------------------------------------------------------------------------------------------------
# auto_complete_config


class ModelConfig:
    """The configuration handed to auto_complete_config: max_batch_size, inputs, outputs,
    dynamic batching and the transaction policy can be filled in."""

    def __init__(self, model_config):
        self._model_config = json.loads(model_config) if isinstance(model_config, str) \
            else model_config
        cfg = self._model_config
        cfg.setdefault("max_batch_size", 0)
        cfg.setdefault("input", [])
        cfg.setdefault("output", [])
        for t in cfg["input"] + cfg["output"]:
            t["dims"] = [int(d) for d in t.get("dims", [])]

    def as_dict(self):
        return self._model_config

    def _name(self):
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size):
        if self._model_config["max_batch_size"] > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {self._model_config['max_batch_size']}, "
                f"but in auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._model_config.get(other):
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        if not self._model_config.get("dynamic_batching"):
            self._model_config["dynamic_batching"] = {}

    def _add(self, kind, tensor, valid):
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model "
                             f"'{self._name()}' is missing 'name' property.")
        for prop in tensor:
            if prop not in valid:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than {', '.join(valid)}.")
        for prop in ("data_type", "dims"):
            if prop not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{self._name()}' is missing '{prop}' property.")
        dims = [int(d) for d in tensor["dims"]]
        for current in self._model_config[kind]:
            if current["name"] != tensor["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID",
                                                                  tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{current['data_type']} for {kind} '{tensor['name']}', model provides "
                    f"{tensor['data_type']}")
            if current.get("dims") and current["dims"] != dims:
                raise ValueError(
                    f"model '{self._name()}', tensor '{tensor['name']}': the model expects dims "
                    f"{dims} but the model configuration specifies dims {current['dims']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = dims
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        entry = dict(tensor)
        entry["dims"] = dims
        self._model_config[kind].append(entry)

    def add_input(self, input):
        self._add("input", input, ["name", "data_type", "dims", "optional"])

    def add_output(self, output):
        self._add("output", output, ["name", "data_type", "dims"])

    def set_model_transaction_policy(self, transaction_policy_dict):
        for prop in transaction_policy_dict:
            if prop != "decoupled":
                raise ValueError("model transaction property in auto-complete-config function "
                                 f"for model '{self._name()}' contains property other than "
                                 "'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            if "decoupled" in policy and policy["decoupled"] != \
                    transaction_policy_dict["decoupled"]:
                raise ValueError("trying to change decoupled property in auto-complete-config "
                                 f"for model '{self._name()}', which is already set to "
                                 f"'{policy['decoupled']}'.")
            policy["decoupled"] = transaction_policy_dict["decoupled"]
