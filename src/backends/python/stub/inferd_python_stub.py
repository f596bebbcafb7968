"""The process inferd runs for one instance of a Python model (Triton's model.py, unchanged).

inferd starts it with (python_stub_process.h): two message slots (memfds on fds
INFERD_PYTHON_SLOT_IN/OUT: an 8-byte little-endian length, then the message: binary for execute
and its answer, JSON for the rest), an eventfd doorbell for each (INFERD_PYTHON_DOORBELL_IN/OUT:
a message is announced by ringing), a connected socket on fd INFERD_PYTHON_FD (for log lines,
which need no answer, and to tell inferd when this process is gone), and a memfd on fd
INFERD_PYTHON_SHM_FD for tensor bytes. The exchange is strictly turn-based: whoever sends a
message has written its tensors at the start of the mapping, and the receiver copies them out
before it sends anything, so one mapping (and one slot per direction) serves. The writer grows
a memfd (ftruncate) when a message needs more room; the reader remaps when it lies past its
mapping. Nothing here touches /dev/shm.
"""

import asyncio
import importlib.util
import inspect
import json
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
import traceback
import types

import numpy as np

import triton_python_backend_utils as pb

_ALIGN = 64
_LEN = struct.Struct("<I")
# The binary messages of the per-request path (python_backend.cc describes the layout).
_BIN_EXECUTE = 1
_BIN_DONE = 2
_HEAD = struct.Struct("<BBH")
_U16 = struct.Struct("<H")
_REQ = struct.Struct("<QI")
_COUNTS = struct.Struct("<HH")
_TYPE_DIMS = struct.Struct("<BB")
_OFF_SIZE = struct.Struct("<QQ")
_I32 = struct.Struct("<i")
_GPU_INPUT_BIT = 0x80  # in an input's type byte: on a GPU, its CUDA IPC handle follows
_IPC_HANDLE_BYTES = 64
_OK = struct.Struct("<BH")
_PARAMS = struct.Struct("<BI")  # a response with parameters: kind 2, their JSON's length
_COUNT = struct.Struct("<H")
_ERR = struct.Struct("<BBI")
_DIMS = [struct.Struct("<%dq" % n) for n in range(33)]
_DESC = {}  # (name length, dims) -> the Struct of one output's descriptor
_NUMPY_OF_CODE = [None] + [np.dtype(pb._NUMPY_OF_NAME[n]) if n in pb._NUMPY_OF_NAME else None
                           for n in pb._TYPE_NAMES[1:]]
_NUMPY_OF_CODE[pb._BF16] = np.dtype(np.uint16)  # numpy has no bfloat16: its bits


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Mapped:
    """A memfd mapped here (the tensor region, a message slot): its writer grows it, a reader
    remaps when what it reads lies past the mapping."""

    def __init__(self, fd):
        self.fd = fd
        self.mm = None
        self.size = 0
        self._remap()

    def _remap(self):
        size = os.fstat(self.fd).st_size
        if size <= self.size:
            return
        old = self.mm
        self.mm = mmap.mmap(self.fd, size)
        self.size = size
        if old is not None:
            try:
                old.close()
            except BufferError:
                pass  # a view still uses it; it is freed with the view


class SharedRegion(_Mapped):
    def __init__(self, fd, growth):
        self.growth = max(int(growth), 4096)
        super().__init__(fd)

    def reserve(self, need):
        if need <= self.size:
            return
        if os.fstat(self.fd).st_size < need:
            os.ftruncate(self.fd, (need + self.growth - 1) // self.growth * self.growth)
        self._remap()

    def read(self, d):
        return self.read_at(d["offset"], d["size"], d["shape"], pb._CODE_OF_NAME[d["datatype"]])

    def read_at(self, off, size, shape, code):
        # A copy: the model may keep it, and the next message reuses the region.
        if off + size > self.size:
            self._remap()
        if code == 13:
            return pb.deserialize_bytes_tensor(self.mm[off:off + size]).reshape(shape)
        npt = _NUMPY_OF_CODE[code]
        if size == 0:
            return np.empty(shape, dtype=npt)
        return np.ndarray(shape, npt, self.mm, off).copy()

    def write(self, tensors):
        """Writes `tensors` from offset 0; returns their JSON descriptors."""
        return [{"name": name, "datatype": pb._TYPE_NAMES[code], "shape": shape, "offset": o,
                 "size": n} for name, code, shape, _, o, n in self.write_raw(tensors)]

    def write_raw(self, tensors):
        """Writes `tensors` from offset 0; returns (name, type code, shape, array, offset,
        size) of each."""
        items = []
        off = 0
        for t in tensors:
            payload, code, shape = _payload(t)
            nbytes = payload.nbytes
            items.append((t._name, code, shape, payload, off, nbytes))
            off = (off + nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        if off > self.size:
            self.reserve(off)
        mm = self.mm
        for _, _, _, payload, o, n in items:
            if n:
                mm[o:o + n] = payload  # a C-contiguous array is its own bytes
        return items


def _payload(t):
    """The bytes to send for tensor `t` (a C-contiguous array; a GPU tensor's bytes copied to
    the host), its type code and shape."""
    if t.__class__ is not pb.Tensor and not isinstance(t, pb.Tensor):
        raise pb.TritonModelException(
            f"output tensors must be pb_utils.Tensor objects, got {type(t).__name__}")
    code = t._dtype
    if code is None or not 0 < code <= pb._BF16:
        raise pb.TritonModelException(f"tensor '{t._name}': unsupported data type")
    if t._dev is not None:  # on the GPU: copied to the host here, once
        return pb._copy_to_host(t), code, t._dev.shape
    a = t._array
    if code == 13:
        return pb.serialize_byte_tensor(a), code, a.shape
    if a.flags.c_contiguous:
        return a, code, a.shape
    return np.ascontiguousarray(a), code, a.shape


class BlsFuture:
    """What async_exec returns: awaiting it collects the response from inferd."""

    def __init__(self, channel, call_id, error):
        self._channel, self._id, self._error = channel, call_id, error
        self._result = None

    def result(self):
        if self._result is None:
            if self._error is not None:
                self._result = pb.InferenceResponse([], pb.TritonError(*self._error))
            else:
                self._result = self._channel.bls_wait(self._id)
        return self._result

    def __await__(self):
        return self.result()
        yield  # makes this a generator, as __await__ must be


_U64 = struct.Struct("<Q")
_RING = (1).to_bytes(8, "little")


class _ChannelLock:
    """The channel's lock (re-entrant). It refuses a process the model forked (a
    multiprocessing Pool): the channel is this process's own, strictly in turns, and a child
    writing to it too would break an exchange of its parent and hang both, where Triton's stub
    lets forked children send BLS requests. The refusal is an exception the model sees."""

    def __init__(self):
        self._lock = threading.RLock()
        self._pid = os.getpid()

    def forked(self):
        return os.getpid() != self._pid

    def __enter__(self):
        if self.forked():
            raise pb.TritonModelException(
                "BLS and other calls to inferd (is_model_ready, is_cancelled, a response "
                "sender) are not available in a process the model forked (multiprocessing): "
                "inferd's Python backend serves only the process it started; make the calls "
                "from that process (threads or asyncio)")
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)


class Channel:
    """Messages to and from inferd (python_stub_process.h): each in a shared-memory slot
    announced by an eventfd doorbell, strictly in turns; log lines, which need no answer, on
    the socket."""

    def __init__(self, sock, shm, env):
        self.sock = sock
        self.shm = shm
        self._bell_in = int(env["INFERD_PYTHON_DOORBELL_IN"])
        self._bell_out = int(env["INFERD_PYTHON_DOORBELL_OUT"])
        self._in = _Mapped(int(env["INFERD_PYTHON_SLOT_IN"]))
        self._out = _Mapped(int(env["INFERD_PYTHON_SLOT_OUT"]))
        # A decoupled model's threads send responses while execute() may still make calls:
        # each exchange with inferd (message, reply) holds the lock.
        self.lock = _ChannelLock()

    def send(self, obj):
        self.send_raw(json.dumps(obj, separators=(",", ":")).encode())

    def send_raw(self, data):
        n = len(data)
        out = self._out
        if 8 + n > out.size:
            os.ftruncate(out.fd, max(out.size * 2, (8 + n + 65535) // 65536 * 65536))
            out._remap()
        mm = out.mm
        mm[0:8] = _U64.pack(n)
        mm[8:8 + n] = data
        os.write(self._bell_out, _RING)

    def recv_raw(self):
        """The next message's bytes: waits for inferd's ring, then copies the slot."""
        os.read(self._bell_in, 8)
        slot = self._in
        (n,) = _U64.unpack_from(slot.mm, 0)
        if 8 + n > slot.size:
            slot._remap()
        return slot.mm[8:8 + n]

    def send_unanswered(self, obj):
        """A message inferd does not answer (a log line): on the socket, so that it never
        waits for the slot."""
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.sock.sendall(_LEN.pack(len(data)) + data)

    def recv(self):
        return json.loads(self.recv_raw())

    def is_cancelled(self, index):
        with self.lock:
            self.send({"op": "is_cancelled", "request": index})
            return bool(self.recv().get("cancelled"))

    # -- calls a model makes -------------------------------------------------------------------
    def log(self, level, message):
        if self.lock.forked():
            # A child the model forked has no channel: its log lines go to its stderr, which
            # is the process's (inferd's log).
            print(message, file=sys.stderr, flush=True)
            return
        with self.lock:
            self.send_unanswered({"op": "log", "level": level, "message": message})

    def is_model_ready(self, name, version):
        with self.lock:
            self.send({"op": "is_model_ready", "name": name, "version": version})
            return bool(self.recv().get("ready"))

    def model_control(self, msg):
        """pb_utils.load_model / unload_model: inferd's refusal as a TritonModelException."""
        with self.lock:
            self.send(msg)
            reply = self.recv()
        if reply.get("op") != "ok":
            raise pb.TritonModelException(reply.get("message", f"{msg['op']} failed"))

    def metric_call(self, msg):
        """A custom-metric call (pb_utils.MetricFamily / Metric): the handle made or the value
        read; inferd's refusal as a TritonModelException."""
        with self.lock:
            self.send(msg)
            reply = self.recv()
        if reply.get("op") != "metric":
            raise pb.TritonModelException(reply.get("message", "custom metric call failed"))
        return reply.get("value", reply.get("id"))

    def metric_release(self, handle):
        """A MetricFamily or Metric the model deleted: unanswered (it may come from a
        destructor at any time, even while the process ends)."""
        if self.lock.forked():
            return
        with self.lock:
            self.send_unanswered({"op": "metric_release", "id": handle})

    def send_response(self, index, response, final):
        with self.lock:
            msg = {"op": "send", "request": index, "final": final}
            if response is not None:
                err = response.error()
                if err is not None:
                    msg["error"] = err.message() if hasattr(err, "message") else str(err)
                    msg["code"] = err.code() if hasattr(err, "code") else 1
                else:
                    msg["outputs"] = self.shm.write(response.output_tensors())
                    if response._parameters != "{}":
                        msg["parameters"] = response._parameters
            self.send(msg)
            self.recv()

    def _bls(self, request, wait, decoupled=False):
        with self.lock:
            descs = self.shm.write(request.inputs())
            self.send({"op": "bls", "wait": wait, "model_name": request.model_name(),
                       "model_version": request._model_version, "id": request.request_id(),
                       "inputs": descs, "outputs": request.requested_output_names(),
                       "timeout": request.timeout(), "parameters": request.parameters(),
                       "decoupled": decoupled})
            return self.recv()

    def _response(self, reply):
        if reply.get("error") is not None:
            return pb.InferenceResponse([], pb.TritonError(reply["error"], reply.get("code", 1)))
        wrap, codes = pb.Tensor._wrap_code, pb._CODE_OF_NAME
        return pb.InferenceResponse(
            [wrap(d["name"], self.shm.read(d), codes[d["datatype"]])
             for d in reply.get("outputs", [])], parameters=reply.get("parameters"))

    def bls_exec(self, request):
        with self.lock:
            return self._response(self._bls(request, True))

    def bls_submit(self, request):
        reply = self._bls(request, False)
        if reply.get("error") is not None:
            return BlsFuture(self, None, (reply["error"], reply.get("code", 1)))
        return BlsFuture(self, reply["call"], None)

    def bls_stream(self, request):
        reply = self._bls(request, False, True)
        if reply.get("error") is not None:
            return ResponseIterator(self, None, (reply["error"], reply.get("code", 1)))
        return ResponseIterator(self, reply["call"], None)

    def bls_stream_submit(self, request):
        return _Ready(self.bls_stream(request))

    def bls_next(self, call_id):
        with self.lock:
            self.send({"op": "bls_next", "call": call_id})
            reply = self.recv()
            return self._response(reply), reply.get("final", True)

    def bls_wait(self, call_id):
        with self.lock:
            self.send({"op": "bls_wait", "call": call_id})
            return self._response(self.recv())


class _Ready:
    """An awaitable whose result is already there (async_exec(decoupled=True))."""

    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value

    def __await__(self):
        return self._value
        yield  # makes this a generator, as __await__ must be


class ResponseIterator:
    """exec(decoupled=True): the called model's responses in order; `for` or `async for`."""

    def __init__(self, channel, call_id, error):
        self._channel, self._id, self._error = channel, call_id, error
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        if self._error is not None:
            self._done = True
            return pb.InferenceResponse([], pb.TritonError(*self._error))
        response, final = self._channel.bls_next(self._id)
        self._done = bool(final)
        return response

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return self.__next__()
        except StopIteration:
            raise StopAsyncIteration

    def cancel(self):
        pass


class ResponseSender:
    """get_response_sender() of a decoupled model: any number of responses, then the final flag."""

    def __init__(self, channel, index, done):
        self._channel, self._index, self._done = channel, index, done
        self._closed = False

    def send(self, response=None, flags=0):
        if self._closed:
            raise pb.TritonModelException(
                "Unable to send response. Response sender has been closed.")
        final = bool(flags & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise pb.TritonModelException(
                "Inference Response object is None and the flags is not final.")
        if response is not None and not isinstance(response, pb.InferenceResponse):
            raise pb.TritonModelException("send() takes a pb_utils.InferenceResponse")
        self._channel.send_response(self._index, response, final)
        if final:
            self._closed = True
            with self._done:
                self._done.notify_all()

    def is_cancelled(self):
        if self._closed:
            return False  # inferd no longer holds the request
        return self._channel.is_cancelled(self._index)


def _error_message(e):
    if isinstance(e, pb.TritonModelException):
        return str(e.message())
    return f"{type(e).__name__}: {e}"


class _GpuInputsFailed(Exception):
    """An input's CUDA IPC handle could not be opened (no CUDA runtime, the driver refused)."""


class Stub:
    def __init__(self, channel):
        self.channel = channel
        self.model_class = None
        self.model = None
        self.name = ""
        self.version = -1
        self.loop = None
        self.outputs_all = []
        self._last_msg = None
        self._last_layout = None
        self._opened = {}  # (device, CUDA IPC handle) -> mapped address, for the current call

    def load_module(self, msg):
        path = msg["model_path"]
        pb._model_dir = msg.get("model_dir", "")
        version_dir = os.path.dirname(path)
        for d in (version_dir, os.path.dirname(version_dir)):
            if d not in sys.path:
                sys.path.append(d)
        # As Triton's stub, the file is imported as a module of a package named after the
        # version folder ("1.model"), so that model.py can import its neighbours relatively
        # (`from . import helper`) as well as absolutely (`import helper`).
        package = os.path.basename(version_dir)
        stem = os.path.splitext(os.path.basename(path))[0]
        pkg = types.ModuleType(package)
        pkg.__path__ = [version_dir]
        pkg.__package__ = package
        sys.modules[package] = pkg
        spec = importlib.util.spec_from_file_location(f"{package}.{stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        if not hasattr(module, "TritonPythonModel"):
            raise pb.TritonModelException(f"{path} defines no class TritonPythonModel")
        self.model_class = module.TritonPythonModel

    def auto_complete(self, msg):
        self.load_module(msg)
        config = pb.ModelConfig(msg["config"])
        fn = getattr(self.model_class, "auto_complete_config", None)
        if fn is not None:
            config = fn(config)
            if not isinstance(config, pb.ModelConfig):
                raise pb.TritonModelException(
                    "auto_complete_config function in model '" + msg.get("name", "") +
                    "' must return a valid pb.ModelConfig object.")
        return {"op": "ok", "config": json.dumps(config.as_dict())}

    def initialize(self, msg):
        self.load_module(msg)
        args = msg["args"]
        self.name = args.get("model_name", "")
        self.version = int(args.get("model_version", "-1"))
        self.model = self.model_class()
        fn = getattr(self.model, "initialize", None)
        if fn is not None:
            result = fn(dict(args))
            if inspect.iscoroutine(result):
                self._run(result)
        pb._bls_allowed = True
        return {"op": "ok"}

    def _run(self, coro):
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        return self.loop.run_until_complete(coro)

    def execute_decoupled(self, msg, requests):
        done = threading.Condition()
        senders = []
        for i, r in enumerate(requests):
            r._sender = ResponseSender(self.channel, i, done)
            senders.append(r._sender)
        try:
            result = self.model.execute(requests)
            if inspect.iscoroutine(result):
                result = self._run(result)
        except Exception as e:
            return {"op": "done", "error": _error_message(e)}
        if result is not None:
            return {"op": "done", "error": "a decoupled model's execute() must return None"}
        # Responses may come from the model's own threads after execute() returned: the turn
        # stays with this process until every request got its final flag (or no thread is left
        # that could send it).
        main = threading.current_thread()
        with done:
            while not all(s._closed for s in senders):
                if not any(t is not main and t.is_alive() for t in threading.enumerate()):
                    break
                done.wait(0.05)
        for r in requests:
            r._index = -1
        return {"op": "done", "responses": []}

    def _decode(self, msg):
        """The layout of a binary execute message: its flags and, per request, (id, timeout,
        parameters, [(input name, offset, size, shape, type code)], [output names])."""
        u16, req_head, counts = _U16.unpack_from, _REQ.unpack_from, _COUNTS.unpack_from
        type_dims, off_size = _TYPE_DIMS.unpack_from, _OFF_SIZE.unpack_from
        _, flags, count = _HEAD.unpack_from(msg, 0)
        pos = 4
        layout = []
        for _ in range(count):
            (n,) = u16(msg, pos)
            pos += 2
            rid = msg[pos:pos + n].decode() if n else ""
            pos += n
            timeout, n = req_head(msg, pos)
            pos += 12
            params = msg[pos:pos + n].decode() if n else "{}"
            pos += n
            seq = msg[pos]
            pos += 1
            if seq & 4:  # a string correlation ID
                (n,) = u16(msg, pos)
                pos += 2
                corr = msg[pos:pos + n].decode()
                pos += n
            else:
                (corr,) = _U64.unpack_from(msg, pos)
                pos += 8
            n_in, n_out = counts(msg, pos)
            pos += 4
            inputs = []
            for _ in range(n_in):
                (n,) = u16(msg, pos)
                pos += 2
                tname = msg[pos:pos + n].decode()
                pos += n
                code, dims = type_dims(msg, pos)
                pos += 2
                shape = _DIMS[dims].unpack_from(msg, pos)
                pos += 8 * dims
                off, size = off_size(msg, pos)
                pos += 16
                gpu = None
                if code & _GPU_INPUT_BIT:  # on GPU `device`, `off` bytes into the allocation
                    code &= ~_GPU_INPUT_BIT
                    (device,) = _I32.unpack_from(msg, pos)
                    pos += 4
                    gpu = (device, bytes(msg[pos:pos + _IPC_HANDLE_BYTES]))
                    pos += _IPC_HANDLE_BYTES
                inputs.append((tname, off, size, shape, code, gpu))
            outputs = []
            for _ in range(n_out):
                (n,) = u16(msg, pos)
                pos += 2
                outputs.append(msg[pos:pos + n].decode())
                pos += n
            layout.append((rid, timeout, params, inputs, outputs, corr, seq & 3))
        return flags, layout

    def _requests(self, msg):
        """The InferenceRequests of a binary execute message, and its flags."""
        # The same bytes mean the same layout (ids, shapes, offsets; the tensor bytes are in
        # the shared region): a client sending alike requests is decoded once.
        if msg == self._last_msg:
            flags, layout = self._last_layout
        else:
            flags, layout = self._last_layout = self._decode(msg)
            self._last_msg = msg
        read = self.channel.shm.read_at
        wrap = pb.Tensor._wrap_code
        make = pb.InferenceRequest._make
        name, version = self.name, self.version
        requests = []
        index = 0
        for rid, timeout, params, inputs, outputs, corr, seq_flags in layout:
            requests.append(make(
                rid, [wrap(t, read(off, size, shape, code), code) if gpu is None else
                      self._gpu_input(t, off, size, shape, code, gpu)
                      for t, off, size, shape, code, gpu in inputs],
                list(outputs), name, version, timeout, params, index, corr, seq_flags))
            index += 1
        return requests, flags

    def _gpu_input(self, name, off, size, shape, code, gpu):
        """A CUDA tensor over an input the server left on a GPU: its allocation mapped here
        (once per handle in a call) until the call is answered (_close_gpu_inputs)."""
        device, handle = gpu
        key = (device, handle)
        base = self._opened.get(key)
        if base is None:
            try:
                base = pb._ipc_open(handle, device)
            except Exception as e:
                raise _GpuInputsFailed(f"input '{name}' on GPU {device}: {_error_message(e)}")
            self._opened[key] = base
        return pb.Tensor._wrap_device(name, code, device, base + off, shape, size)

    def _close_gpu_inputs(self):
        opened, self._opened = self._opened, {}
        for (device, _), base in opened.items():
            try:
                pb._ipc_close(base, device)
            except Exception as e:  # the mapping goes with the process anyway
                self.channel.log(1, f"closing a GPU input's CUDA IPC mapping: {_error_message(e)}")

    def execute(self, msg):
        # Inputs on a GPU are mapped for this call only: the server holds their memory until
        # it has the answer (a decoupled model's included: the turn ends with the final flags).
        try:
            try:
                requests, flags = self._requests(msg)
            except _GpuInputsFailed as e:  # nothing ran: the server sends host copies instead
                return {"op": "gpu_inputs_failed", "message": str(e)}
            return self._execute(msg, requests, flags)
        finally:
            if self._opened:
                self._close_gpu_inputs()

    def _execute(self, msg, requests, flags):
        if flags & 1:
            return self.execute_decoupled(msg, requests)
        try:
            result = self.model.execute(requests)
            if result.__class__ is not list and inspect.iscoroutine(result):
                result = self._run(result)
        except Exception as e:  # the model's own error fails the whole batch
            return {"op": "done", "error": _error_message(e)}
        finally:
            # inferd answers is_cancelled() only while the call runs: afterwards (a request kept
            # by the model's threads) the answer is False, asked of no one.
            for r in requests:
                r._index = -1
        if not isinstance(result, (list, tuple)) or len(result) != len(requests):
            got = len(result) if isinstance(result, (list, tuple)) else type(result).__name__
            return {"op": "done", "error":
                    "Number of InferenceResponse objects do not match the number of "
                    f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, "
                    f"and InferenceResponse(s) size is:{got}"}
        # The answer: binary (see python_backend.cc), tensors in the shared region from offset
        # 0 (the inputs were copied out already).
        parts = [_HEAD.pack(_BIN_DONE, 0, len(result))]
        append = parts.append
        copies = []
        off = 0
        try:
            for resp in result:
                if resp.__class__ is not pb.InferenceResponse and \
                        not isinstance(resp, pb.InferenceResponse):
                    message = ("execute returned " + type(resp).__name__ +
                               " where a pb_utils.InferenceResponse belongs").encode()
                    append(_ERR.pack(1, 1, len(message)))
                    append(message)
                    continue
                err = resp._error
                if err is not None:
                    code = err.code() if hasattr(err, "code") else 1
                    message = (err.message() if hasattr(err, "message") else str(err)).encode()
                    append(_ERR.pack(1, code & 0xff, len(message)))
                    append(message)
                    continue
                outputs = resp._outputs
                params = resp._parameters
                if params != "{}":
                    encoded = params.encode()
                    append(_PARAMS.pack(2, len(encoded)))
                    append(encoded)
                    append(_COUNT.pack(len(outputs)))
                else:
                    append(_OK.pack(0, len(outputs)))
                for t in outputs:
                    payload, code, shape = _payload(t)
                    n = payload.nbytes
                    b = t._name.encode()
                    # name length, name, type, dims, shape, offset, size: one pack
                    key = (len(b), len(shape))
                    desc = _DESC.get(key)
                    if desc is None:
                        desc = _DESC[key] = struct.Struct("<H%dsBB%dqQQ" % key)
                    append(desc.pack(len(b), b, code, len(shape), *shape, off, n))
                    if n:
                        copies.append((off, n, payload))
                    off = (off + n + _ALIGN - 1) // _ALIGN * _ALIGN
            shm = self.channel.shm
            if off > shm.size:
                shm.reserve(off)
            mm = shm.mm
            for o, n, payload in copies:
                mm[o:o + n] = payload
        except Exception as e:
            return {"op": "done", "error": _error_message(e)}
        return b"".join(parts)

    def finalize(self):
        """Runs the model's finalize(); an exception is logged (as Triton logs it), never
        raised: the process ends either way."""
        pb._bls_allowed = False
        fn = getattr(self.model, "finalize", None) if self.model is not None else None
        if fn is None:
            return
        try:
            result = fn()
            if inspect.iscoroutine(result):
                self._run(result)
        except Exception as e:
            tb = traceback.extract_tb(e.__traceback__)
            where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
            self.channel.log(pb.LogLevel.ERROR,
                             f"finalize() failed: {_error_message(e)}{where}")


def _exit_with_parent():
    """Ends this process when inferd is gone (killed, crashed), as Triton's stub watches its
    parent. Not PR_SET_PDEATHSIG: that follows the *thread* that started the process, and
    inferd starts processes from loader threads that end long before the model does (which
    killed every process, and restarted it, whenever such a thread ended)."""
    parent = os.getppid()

    def watch():
        try:
            fd = os.pidfd_open(parent)
        except (AttributeError, OSError):
            fd = -1
        if fd >= 0 and os.getppid() == parent:
            # The pidfd turns readable when the process exits: no polling.
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
        else:
            while os.getppid() == parent:
                time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="inferd-parent-watch", daemon=True).start()


def main():
    _exit_with_parent()
    sock = socket.socket(fileno=int(os.environ["INFERD_PYTHON_FD"]))
    shm = SharedRegion(int(os.environ["INFERD_PYTHON_SHM_FD"]),
                       int(os.environ.get("INFERD_PYTHON_SHM_GROWTH", "1048576")))
    channel = Channel(sock, shm, os.environ)
    pb._channel = channel
    stub = Stub(channel)
    while True:
        raw = channel.recv_raw()  # inferd ends this process: finalize, or SIGKILL
        try:
            if raw[0] == _BIN_EXECUTE:
                reply = stub.execute(raw)
                if reply.__class__ is bytes:
                    with channel.lock:
                        channel.send_raw(reply)
                    continue
                op = "execute"
            else:
                msg = json.loads(raw)
                op = msg.get("op")
            if op == "execute":
                pass
            elif op == "init":
                reply = stub.initialize(msg)
            elif op == "auto_complete":
                reply = stub.auto_complete(msg)
            elif op == "finalize":
                stub.finalize()
                channel.send({"op": "ok"})
                return 0
            else:
                reply = {"op": "error", "message": f"unknown message '{op}'"}
        except Exception as e:
            tb = traceback.extract_tb(e.__traceback__)
            where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
            reply = {"op": "error", "message": _error_message(e) + where}
        with channel.lock:
            channel.send(reply)


if __name__ == "__main__":
    sys.exit(main())
