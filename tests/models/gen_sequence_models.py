"""Test models for the sequence batcher (imported by tests/integration/test_sequence.py).

`accumulator`: OUTPUT = ACC + INPUT with implicit state ACC (input) / ACC_OUT (output), and the
control inputs echoed: START_OUT (INT32), END_OUT (FP32), READY_OUT (BOOL), CORRID_OUT (UINT64,
or BYTES for a string CORRID). The model is batching (inputs [-1, 1]).

`fetch_silero_vad`: the Silero VAD v5 ONNX file from the npm package @ricky0123/vad-web@0.0.31,
fetched once with `npm pack` into the inferd cache (never committed).
"""

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

CACHE = Path(os.environ.get("INFERD_CACHE_DIR",
                            Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferd"))
VAD_PKG = "@ricky0123/vad-web@0.0.31"
VAD_SHA256 = "d1a211cf1a2ed26297da52cc08de79e75d79838a274bfc6de546feb1f828c940"


def accumulator_onnx(path, corrid_type=TensorProto.UINT64):
    def vi(name, t):
        return helper.make_tensor_value_info(name, t, ["b", 1])
    nodes = [
        helper.make_node("Add", ["ACC", "INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
        helper.make_node("Identity", ["START"], ["START_OUT"]),
        helper.make_node("Identity", ["END"], ["END_OUT"]),
        helper.make_node("Identity", ["READY"], ["READY_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    graph = helper.make_graph(
        nodes, "accumulator",
        [vi("INPUT", TensorProto.INT32), vi("ACC", TensorProto.INT32), vi("START", TensorProto.INT32),
         vi("END", TensorProto.FLOAT), vi("READY", TensorProto.BOOL), vi("CORRID", corrid_type)],
        [vi("OUTPUT", TensorProto.INT32), vi("ACC_OUT", TensorProto.INT32),
         vi("START_OUT", TensorProto.INT32), vi("END_OUT", TensorProto.FLOAT),
         vi("READY_OUT", TensorProto.BOOL), vi("CORRID_OUT", corrid_type)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def accumulator_config(name, strategy="direct {}", max_batch_size=4, instances=1, idle_us=0,
                       corrid="TYPE_UINT64", initial_state="zero_data: true", extra=""):
    corrid_out = "TYPE_STRING" if corrid == "TYPE_STRING" else corrid
    idle = f"max_sequence_idle_microseconds: {idle_us}" if idle_us else ""
    return f"""
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "END_OUT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "READY_OUT" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "CORRID_OUT" data_type: {corrid_out} dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
sequence_batching {{
  {strategy}
  {idle}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]
  state [ {{
    input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state [ {{ name: "init" data_type: TYPE_INT32 dims: [ 1 ] {initial_state} }} ]
  }} ]
  {extra}
}}
"""


def write_accumulator(repo, name, **kw):
    d = Path(repo) / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    corrid = kw.get("corrid", "TYPE_UINT64")
    accumulator_onnx(d / "1" / "model.onnx",
                     TensorProto.STRING if corrid == "TYPE_STRING" else
                     getattr(TensorProto, corrid.replace("TYPE_", "")))
    (d / "config.pbtxt").write_text(accumulator_config(name, **kw))
    return d


def fetch_silero_vad():
    """Path of silero_vad_v5.onnx in the cache (npm pack once, sha256 checked)."""
    out = CACHE / "silero-vad-web-0.0.31" / "silero_vad_v5.onnx"
    if out.exists():
        return out
    import hashlib
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", "--silent", VAD_PKG], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL, timeout=300)
        tgz = next(Path(tmp).glob("*.tgz"))
        digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
        if digest != VAD_SHA256:
            raise RuntimeError(f"{VAD_PKG}: sha256 {digest}, expected {VAD_SHA256}")
        with tarfile.open(tgz) as tar:
            member = tar.getmember("package/dist/silero_vad_v5.onnx")
            src = tar.extractfile(member)
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_suffix(".part")
            with open(part, "wb") as f:
                shutil.copyfileobj(src, f)
            part.rename(out)
    return out


VAD_IO = """
input [
  { name: "input" data_type: TYPE_FP32 dims: [ 1, 512 ] },
  { name: "sr" data_type: TYPE_INT64 dims: [ 1 ] reshape { shape: [ ] } }
]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]
"""


def write_vad(repo, name, stateful, instances=2, candidates=8):
    """Silero VAD v5 served as is, max_batch_size 0 (its state is [2, batch, 128]).

    stateful: the sequence batcher keeps `state`/`stateN` (oldest, `candidates` slots);
    else the client sends `state` and reads `stateN` itself."""
    d = Path(repo) / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(fetch_silero_vad(), d / "1" / "model.onnx")
    if stateful:
        tail = f"""
sequence_batching {{
  oldest {{ max_candidate_sequences: {candidates} }}
  state [ {{
    input_name: "state" output_name: "stateN" data_type: TYPE_FP32 dims: [ 2, 1, 128 ]
    initial_state [ {{ name: "zeros" data_type: TYPE_FP32 dims: [ 2, 1, 128 ] zero_data: true }} ]
  }} ]
}}"""
        io = VAD_IO
    else:
        tail = ""
        io = VAD_IO.replace(
            '{ name: "sr"', '{ name: "state" data_type: TYPE_FP32 dims: [ 2, 1, 128 ] },\n  { name: "sr"'
        ).replace('output [ { name: "output" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]',
                  'output [ { name: "output" data_type: TYPE_FP32 dims: [ 1, 1 ] },\n'
                  '         { name: "stateN" data_type: TYPE_FP32 dims: [ 2, 1, 128 ] } ]')
    (d / "config.pbtxt").write_text(f"""
name: "{name}"
backend: "onnxruntime"
max_batch_size: 0
{io}
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
parameters {{ key: "intra_op_thread_count" value {{ string_value: "1" }} }}
{tail}
""")
    return d


def vad_audio(n_chunks, seed):
    """Deterministic speech-like audio: bursts of a few harmonics in noise, 16 kHz."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_chunks * 512) / 16000.0
    f0 = 120 + 80 * rng.random()
    voice = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
    envelope = (np.sin(2 * np.pi * 1.5 * t + rng.random() * 6) > 0).astype(np.float64)
    audio = 0.3 * voice * envelope + 0.02 * rng.standard_normal(t.shape)
    return audio.astype(np.float32).reshape(n_chunks, 1, 512)
