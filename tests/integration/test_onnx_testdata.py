"""Checked with models no one here wrote (issue 16): Debian's libonnx-testdata, the ONNX
project's single-operator models with reference inputs and outputs (computed by ONNX's own
numpy implementation of each operator).

A deterministic sample of about 40 of them, chosen to cover the data types (BOOL, INT8, UINT8,
FP16, DOUBLE, STRING, ...) and arrangements (several inputs or outputs, scalars, zero-size
dimensions), is served from one repository without any config.pbtxt (auto-complete), each
inferred over HTTP with binary tensors holding test_data_set_0's inputs, and each output
compared with the reference output and, for numeric models, with the same model run by ONNX
Runtime called directly (tools/ort_run.cc): inferd must hand over exactly what the runtime
computes. Models ONNX Runtime itself cannot load (checked by calling the library directly,
tools/ort_can_load.cc) are left out, so what fails is inferd's."""

import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import requests
from onnx import TensorProto, numpy_helper

from v2client import build_request, make_input, parse_response

DATA = Path("/usr/share/libonnx-testdata/data/node")
ORT_ROOT = Path(os.environ.get("ONNXRUNTIME_ROOT", Path.home() / ".cache/inferd/onnxruntime-1.29.0"))
TOOL = Path(__file__).resolve().parent / "tools" / "ort_can_load.cc"
RUN_TOOL = Path(__file__).resolve().parent / "tools" / "ort_run.cc"

KSERVE = {TensorProto.BOOL: "BOOL", TensorProto.UINT8: "UINT8", TensorProto.UINT16: "UINT16",
          TensorProto.UINT32: "UINT32", TensorProto.UINT64: "UINT64", TensorProto.INT8: "INT8",
          TensorProto.INT16: "INT16", TensorProto.INT32: "INT32", TensorProto.INT64: "INT64",
          TensorProto.FLOAT16: "FP16", TensorProto.FLOAT: "FP32", TensorProto.DOUBLE: "FP64",
          TensorProto.STRING: "BYTES"}

# (what a model must show, how many to take): the sample covers each.
WANTED = [("BOOL", 4), ("INT8", 3), ("UINT8", 3), ("FP16", 3), ("FP64", 4), ("BYTES", 3),
          ("INT32", 2), ("INT64", 3), ("UINT16", 1), ("UINT32", 1), ("UINT64", 1), ("INT16", 1),
          ("multi_input", 4), ("multi_output", 6), ("scalar", 6), ("zero_size", 4), ("FP32", 4)]
# Operators whose reference outputs come from a random draw.
RANDOM = ("bernoulli", "random", "training_dropout")


def load_tensor(path):
    t = TensorProto()
    t.ParseFromString(path.read_bytes())
    return t


def describe(case):
    """The model's tensor inputs/outputs and its first data set, or None where it is not a
    plain-tensor model with reference data inferd can carry."""
    data_dir = case / "test_data_set_0"
    if any(word in case.name for word in RANDOM):
        return None
    if not (case / "model.onnx").exists() or not data_dir.is_dir():
        return None
    model = onnx.load(str(case / "model.onnx"), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    ins = [v for v in model.graph.input if v.name not in inits]
    outs = list(model.graph.output)
    for v in ins + outs:
        if v.type.WhichOneof("value") != "tensor_type" or v.type.tensor_type.elem_type not in KSERVE:
            return None
    in_files = sorted(data_dir.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    out_files = sorted(data_dir.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    if len(in_files) != len(ins) or len(out_files) != len(outs) or not outs:
        return None  # optional inputs left out of the data set: skip
    try:
        inputs = [numpy_helper.to_array(load_tensor(p)) for p in in_files]
        outputs = [numpy_helper.to_array(load_tensor(p)) for p in out_files]
    except Exception:  # noqa: BLE001 - a tensor numpy_helper cannot read (external data)
        return None
    tags = {KSERVE[v.type.tensor_type.elem_type] for v in ins + outs}
    if len(ins) > 1:
        tags.add("multi_input")
    if len(outs) > 1:
        tags.add("multi_output")
    if any(a.ndim == 0 for a in inputs + outputs):
        tags.add("scalar")
    if any(0 in a.shape for a in inputs + outputs):
        tags.add("zero_size")
    return {"name": case.name, "onnx_types": [v.type.tensor_type.elem_type for v in ins],
            "inputs": [(v.name, KSERVE[v.type.tensor_type.elem_type], a)
                       for v, a in zip(ins, inputs)],
            "outputs": [(v.name, KSERVE[v.type.tensor_type.elem_type], a)
                        for v, a in zip(outs, outputs)], "tags": tags}


def compile_tool(source, exe):
    subprocess.run(["c++", "-std=c++17", "-O0", f"-I{ORT_ROOT}/include", str(source),
                    f"-L{ORT_ROOT}/lib", "-lonnxruntime", f"-Wl,-rpath,{ORT_ROOT}/lib", "-o",
                    str(exe)], check=True)
    return exe


def ort_loadable(paths, tmp):
    exe = compile_tool(TOOL, tmp / "ort_can_load")
    out = subprocess.run([str(exe)], input="".join(f"{p}\n" for p in paths), check=True,
                         capture_output=True, text=True).stdout
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("ok ")}


def ort_direct(exe, case, tmp):
    """The case's outputs from ONNX Runtime called directly (tools/ort_run.cc), by name."""
    work = tmp / f"direct_{case['name']}"
    work.mkdir()
    lines = [str(DATA / case["name"] / "model.onnx"), str(len(case["inputs"]))]
    for i, ((name, _, arr), onnx_type) in enumerate(zip(case["inputs"], case["onnx_types"])):
        (work / f"in{i}.bin").write_bytes(np.ascontiguousarray(arr).tobytes())
        lines.append(" ".join([name, str(onnx_type), str(arr.ndim)] + [str(d) for d in arr.shape]
                              + [str(work / f"in{i}.bin")]))
    lines.append(str(work))
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True)
    assert out.returncode == 0, f"{case['name']}: ONNX Runtime called directly: {out.stderr}"
    result = {}
    for i, line in enumerate(out.stdout.splitlines()):
        name, onnx_type, rank, *dims = line.split()
        dtype = (onnx.helper.tensor_dtype_to_np_dtype(int(onnx_type))
                 if hasattr(onnx.helper, "tensor_dtype_to_np_dtype")
                 else onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[int(onnx_type)])
        result[name] = np.frombuffer((work / f"{i}.bin").read_bytes(), dtype).reshape(
            [int(d) for d in dims])
    return result


def sample(tmp):
    cases = [c for c in (describe(d) for d in sorted(DATA.iterdir())) if c is not None]
    ok = ort_loadable([DATA / c["name"] / "model.onnx" for c in cases], tmp)
    cases = [c for c in cases if str(DATA / c["name"] / "model.onnx") in ok]
    chosen = {}
    for tag, count in WANTED:
        have = sum(1 for c in chosen.values() if tag in c["tags"])
        for c in cases:
            if have >= count:
                break
            if tag in c["tags"] and c["name"] not in chosen:
                chosen[c["name"]] = c
                have += 1
    return list(chosen.values())


@pytest.fixture(scope="module")
def testdata_server(tmp_path_factory, logs_dir):
    if not DATA.is_dir():
        pytest.skip("libonnx-testdata is not installed (scripts/setup.sh installs it)")
    from conftest import start_server
    tmp = tmp_path_factory.mktemp("onnx_testdata")
    cases = sample(tmp)
    repo = tmp / "repo"
    for c in cases:
        (repo / c["name"] / "1").mkdir(parents=True)
        os.symlink(DATA / c["name"] / "model.onnx", repo / c["name"] / "1" / "model.onnx")
    # default-max-batch-size=0: auto-complete gives no batch dimension, so each reference
    # tensor is sent with its own shape (batching models are test_batching.py's).
    srv = start_server(repo, ["--exit-on-error=false",
                              "--backend-config=onnxruntime,default-max-batch-size=0"], logs_dir)
    yield srv, cases, compile_tool(RUN_TOOL, tmp / "ort_run"), tmp
    assert srv.stop() == 0


def test_sample_covers_types_and_arrangements(testdata_server):
    _, cases, _, _ = testdata_server
    assert len(cases) >= 35, [c["name"] for c in cases]
    for tag, count in WANTED:
        have = [c["name"] for c in cases if tag in c["tags"]]
        assert len(have) >= min(count, 1), (tag, have)


def test_every_sampled_model_matches_its_reference_outputs(testdata_server):
    srv, cases, ort_run, tmp = testdata_server
    index = {e["name"]: e for e in srv.post("/v2/repository/index", json={}).json()}
    failures = []
    for c in cases:
        entry = index.get(c["name"], {})
        if entry.get("state") != "READY":
            failures.append(f"{c['name']}: not loaded: {entry.get('reason')}")
            continue
        meta = srv.get(f"/v2/models/{c['name']}").json()
        config_shapes = {t["name"]: t["shape"] for t in meta["inputs"]}
        tensors = []
        for name, dtype, arr in c["inputs"]:
            # A scalar is presented as [1] (auto-complete's reshape, as Triton's).
            if arr.ndim == 0 and config_shapes.get(name) == [1]:
                arr = arr.reshape(1)
            tensors.append(make_input(name, arr, dtype, binary=True))
        body, headers = build_request(tensors, outputs=[{"name": n, "parameters": {"binary_data": True}}
                                                         for n, _, _ in c["outputs"]])
        r = srv.post(f"/v2/models/{c['name']}/infer", data=body, headers=headers)
        if r.status_code != 200:
            failures.append(f"{c['name']}: HTTP {r.status_code}: {r.text[:300]}")
            continue
        header, got = parse_response(r)
        # The same model run by ONNX Runtime called directly: inferd must hand over what the
        # runtime computes (numeric tensors; the tool takes no strings). Integers and booleans
        # exactly; floats to rounding, as thread counts differ (a reduction's order).
        if "BYTES" not in c["tags"]:
            direct = ort_direct(ort_run, c, tmp)
            for name, _, want in c["outputs"]:
                if name not in got:
                    continue
                value, ref = got[name].reshape(direct[name].shape), direct[name]
                same = (np.allclose(value, ref, rtol=1e-5, atol=1e-6, equal_nan=True)
                        if ref.dtype.kind == "f" else np.array_equal(value, ref))
                if not same:
                    failures.append(f"{c['name']}: output {name} differs from ONNX Runtime "
                                    f"called directly: {got[name]} vs {direct[name]}")
        for name, dtype, want in c["outputs"]:
            out = next((o for o in header["outputs"] if o["name"] == name), None)
            if out is None or out["datatype"] != dtype:
                failures.append(f"{c['name']}: output {name}: {out} (want {dtype})")
                continue
            value = got[name]
            if want.ndim == 0 and list(value.shape) == [1]:
                value = value.reshape(())
            if value.shape != want.shape:
                failures.append(f"{c['name']}: output {name} shape {value.shape}, want {want.shape}")
                continue
            if dtype == "BYTES":
                want_b = [b if isinstance(b, bytes) else str(b).encode() for b in want.reshape(-1)]
                if "to_STRING" in c["name"]:
                    # A float cast to a string: ONNX Runtime prints 9 significant digits
                    # ("0.60484552"), ONNX's reference the shortest that give the float back
                    # ("0.6048455"); the same float32 either way.
                    ok = [np.float32(a) == np.float32(b) for a, b in zip(value.reshape(-1), want_b)]
                else:
                    ok = [bytes(a) == b for a, b in zip(value.reshape(-1), want_b)]
                if not all(ok):
                    failures.append(f"{c['name']}: output {name} differs: {value!r} vs {want!r}")
            elif want.dtype.kind == "f":
                tol = 1e-2 if want.dtype == np.float16 else 1e-4
                if not np.allclose(value.astype(np.float64), want.astype(np.float64),
                                   rtol=tol, atol=tol, equal_nan=True):
                    failures.append(f"{c['name']}: output {name} differs by "
                                    f"{np.nanmax(np.abs(value.astype(np.float64) - want)):.3g}")
            elif not np.array_equal(value, want):
                failures.append(f"{c['name']}: output {name} differs: {value} vs {want}")
    assert not failures, "\n".join(failures)
