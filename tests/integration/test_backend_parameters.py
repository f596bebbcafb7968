"""ONNX Runtime and PyTorch `parameters` mean what Triton's backends make them mean (issue 16).

Each parameter's effect is observed, never its echo: the graph ONNX Runtime optimized (written with
optimized_model_filepath, saved in the format a `session.*` key chooses), the threads a session
starts (/proc/<pid>/task), LibTorch's per-model settings around each forward().
Triton's sources: onnxruntime_backend src/onnxruntime.cc (ModelState::ModelState,
ModelInstanceState's run options), pytorch_backend src/pt/model_state.cc and
model_instance_state.cc (Execute)."""

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from v2client import infer, make_input, parse_response

C = 16  # channels: a multiple of ONNX Runtime's NCHWc block, so level "all" rewrites the Conv


def write_conv_gelu_model(path):
    """Y = gelu(conv(X, W) + (B1 * B2)): constant folding (basic), the Gelu fusion (extended)
    and the NCHWc layout rewrite of the Conv (all) each leave a trace in the optimized graph."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((C, C, 3, 3)).astype(np.float32) * 0.1
    b1 = rng.standard_normal((1, C, 1, 1)).astype(np.float32)
    b2 = np.full((1, C, 1, 1), 0.5, np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b1, "B1"),
             numpy_helper.from_array(b2, "B2"),
             numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "SQRT2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "ONE"),
             numpy_helper.from_array(np.array(0.5, np.float32), "HALF")]
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["B1", "B2"], ["bias"]),
        helper.make_node("Add", ["c", "bias"], ["x"]),
        helper.make_node("Div", ["x", "SQRT2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "ONE"], ["p"]),
        helper.make_node("Mul", ["x", "p"], ["m"]),
        helper.make_node("Mul", ["m", "HALF"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "conv_gelu",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, C, 8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, C, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return w, b1 * b2


def conv_gelu_numpy(x, w, bias):
    from math import erf
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    out += bias
    verf = np.vectorize(erf)
    return (0.5 * out * (1 + verf(out / np.sqrt(2.0)))).astype(np.float32)


def conv_gelu_config(name, extra):
    return (f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
            f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1, {C}, 8, 8 ] }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1, {C}, 8, 8 ] }} ]\n' + extra)


def param(key, value):
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


def make_model_dir(repo, name, config_text, writer):
    (repo / name / "1").mkdir(parents=True)
    result = writer(repo / name / "1" / "model.onnx")
    (repo / name / "config.pbtxt").write_text(config_text)
    return result


def graph_ops(path):
    model = onnx.load(str(path))
    return [(n.domain, n.op_type) for n in model.graph.node]


LEVELS = {"none": "optimization { graph { level: 2 } }\n",
          "basic": "optimization { graph { level: -1 } }\n",
          "extended": "optimization { graph { level: 1 } }\n",
          "all": "",
          "all3": "optimization { graph { level: 3 } }\n"}


def test_graph_level_and_session_entries_shape_the_optimized_graph(tmp_path, server_factory):
    repo = tmp_path / "repo"
    # Each dump inside its own model's folder (a path outside it is refused: security.md).
    dump = {name: repo / name / f"{name}.onnx" for name in LEVELS}
    dump["ort_format"] = repo / "ort_format" / "ort_format.ort"
    for name, level in LEVELS.items():
        make_model_dir(repo, name, conv_gelu_config(
            name, level + param("optimized_model_filepath", dump[name])),
            write_conv_gelu_model)
    # A session.* key passes through as a session config entry: this one makes ONNX Runtime
    # save the optimized model in its own flatbuffer format instead of ONNX.
    w, bias = make_model_dir(repo, "ort_format", conv_gelu_config(
        "ort_format", param("optimized_model_filepath", dump["ort_format"]) +
        param("session.save_model_format", "ORT") +
        param("session.use_device_allocator_for_initializers", "1")), write_conv_gelu_model)
    srv = server_factory(repo)
    x = np.random.default_rng(1).standard_normal((1, C, 8, 8)).astype(np.float32)
    expected = conv_gelu_numpy(x, w, bias)
    for name in list(LEVELS) + ["ort_format"]:
        srv.wait_until(lambda: srv.get(f"/v2/models/{name}/ready").status_code == 200, 30,
                       f"{name} to be ready")
        r = infer(srv, name, [make_input("X", x, "FP32")])
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(parse_response(r)[1]["Y"], expected, rtol=1e-4, atol=1e-5)

    ops = {name: graph_ops(dump[name]) for name in LEVELS}
    # level 2: nothing optimized, the constant Mul is still there.
    assert len(ops["none"]) == 8, ops["none"]
    assert ("", "Mul") in ops["none"] and ("", "Erf") in ops["none"]
    # -1 (basic): constants folded, no fusion.
    assert len(ops["basic"]) < 8 and ("", "Erf") in ops["basic"], ops["basic"]
    # 1 (extended): the erf pattern fused into com.microsoft Gelu; no layout rewrite.
    assert ("com.microsoft", "Gelu") in ops["extended"], ops["extended"]
    assert not any(d == "com.microsoft.nchwc" for d, _ in ops["extended"])
    # default and any other value: everything, the NCHWc layout included.
    for name in ("all", "all3"):
        assert any(d == "com.microsoft.nchwc" for d, _ in ops[name]), ops[name]
    ort_file = dump["ort_format"].read_bytes()
    assert ort_file[4:8] == b"ORTM", ort_file[:16]


def tasks(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def test_thread_counts_are_threads(tmp_path, server_factory):
    """A session's pools are started when it is created: the threads appear at load."""
    repo = tmp_path / "repo"
    configs = {
        "warm_up": param("intra_op_thread_count", "1"),  # starts the loader threads
        "one": param("intra_op_thread_count", "1"),
        "five": param("intra_op_thread_count", "5"),
        "inter": param("intra_op_thread_count", "1") + param("execution_mode", "1") +
        param("inter_op_thread_count", "4"),
    }
    for name, extra in configs.items():
        # One instance each (an onnxruntime group without a count has Triton's two).
        extra += 'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
        make_model_dir(repo, name, conv_gelu_config(name, extra), write_conv_gelu_model)
    srv = server_factory(repo, ["--model-control-mode=explicit", "--model-load-thread-count=1"])
    pid = srv.proc.pid
    added = {}
    for name in configs:
        before = tasks(pid)
        r = srv.post(f"/v2/repository/models/{name}/load", json={})
        assert r.status_code == 200, r.text
        added[name] = tasks(pid) - before
    # intra_op_thread_count N: N-1 pool threads (the caller is the Nth); the parallel
    # executor's inter-op pool: inter_op_thread_count - 1 more.
    assert added["five"] - added["one"] == 4, added
    assert added["inter"] - added["one"] == 3, added


def test_arena_shrinkage_is_the_run_option_string(tmp_path, server_factory):
    """Triton passes memory.enable_memory_arena_shrinkage to the run options as given
    ("cpu:0"); a value that is not '<device>:<id>' fails that model's load, naming it."""
    repo = tmp_path / "repo"
    w, bias = make_model_dir(repo, "shrink", conv_gelu_config(
        "shrink", param("memory.enable_memory_arena_shrinkage", "cpu:0") +
        param("enable_mem_arena", "1") + param("enable_mem_pattern", "0")), write_conv_gelu_model)
    make_model_dir(repo, "bad_shrink", conv_gelu_config(
        "bad_shrink", param("memory.enable_memory_arena_shrinkage", "true")),
        write_conv_gelu_model)
    srv = server_factory(repo, ["--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/shrink/ready").status_code == 200, 30, "shrink")
    x = np.ones((1, C, 8, 8), np.float32)
    for _ in range(3):  # the arena is shrunk after each run; the next one allocates again
        r = infer(srv, "shrink", [make_input("X", x, "FP32")])
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(parse_response(r)[1]["Y"], conv_gelu_numpy(x, w, bias),
                                   rtol=1e-4, atol=1e-5)
    entries = {e["name"]: e for e in srv.post("/v2/repository/index", json={}).json()}
    assert entries["bad_shrink"]["state"] == "UNAVAILABLE"
    assert "memory.enable_memory_arena_shrinkage" in entries["bad_shrink"]["reason"]


# --------------------------------------------------------------------------------------------
# PyTorch


def torch_model_dir(repo, name, module, params, mbs=0, dims=(4,), outputs=None):
    import torch
    (repo / name / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(repo / name / "1" / "model.pt"))
    outputs = outputs or [("OUTPUT__0", dims)]
    outs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {", ".join(map(str, d))} ] }}'
                     for n, d in outputs)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "pytorch"\nmax_batch_size: {mbs}\n'
        f'input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {", ".join(map(str, dims))} ] }} ]\n'
        f'output [ {outs} ]\n' + "".join(param(k, v) for k, v in params.items()))


def test_torch_settings_apply_per_model_around_forward(tmp_path, server_factory):
    import torch

    class Probe(torch.nn.Module):
        """OUTPUT__1: [made an inference tensor, grad mode on] inside forward()."""

        def forward(self, x):
            flags = torch.tensor([float((x * 2).is_inference()), float(torch.is_grad_enabled())])
            return torch.sin(x), flags

    class Sin(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x)

    repo = tmp_path / "repo"
    probe_out = [("OUTPUT__0", (4,)), ("OUTPUT__1", (2,))]
    torch_model_dir(repo, "inference_mode", Probe(), {}, outputs=probe_out)
    torch_model_dir(repo, "no_inference_mode", Probe(), {"INFERENCE_MODE": "false"},
                    outputs=probe_out)
    big = (1 << 20,)  # large enough for ATen to split sin() over its OpenMP threads
    torch_model_dir(repo, "threads3", Sin(), {"INTRA_OP_THREAD_COUNT": "3"}, dims=big)
    torch_model_dir(repo, "threads1", Sin(), {"INTRA_OP_THREAD_COUNT": "1",
                                               "DISABLE_OPTIMIZED_EXECUTION": "true",
                                               "ENABLE_JIT_PROFILING": "false"}, dims=big)
    torch_model_dir(repo, "bad_bool", Sin(), {"INFERENCE_MODE": "maybe"})
    srv = server_factory(repo, ["--model-control-mode=explicit"])
    for name in ["inference_mode", "no_inference_mode", "threads3", "threads1"]:
        r = srv.post(f"/v2/repository/models/{name}/load", json={})  # threads1 loads last
        if "backend 'pytorch' is not available" in r.text:
            pytest.skip("this build has no LibTorch backend (the sanitizer builds leave it out)")
        assert r.status_code == 200, r.text
    r = srv.post("/v2/repository/models/bad_bool/load", json={})
    assert r.status_code == 400 and "INFERENCE_MODE" in r.text and "maybe" in r.text, r.text

    x = np.linspace(-1, 1, 4, dtype=np.float32)
    for name, flags in [("inference_mode", [1, 0]), ("no_inference_mode", [0, 0]),
                        ("inference_mode", [1, 0])]:
        r = infer(srv, name, [make_input("INPUT__0", x, "FP32")])
        assert r.status_code == 200, r.text
        out = parse_response(r)[1]
        np.testing.assert_allclose(out["OUTPUT__0"], np.sin(x), rtol=1e-6)
        np.testing.assert_array_equal(out["OUTPUT__1"], flags, err_msg=name)

    # Each instance runs its model's thread count, whatever model was loaded last (threads1):
    # OpenMP starts a team of INTRA_OP_THREAD_COUNT - 1 threads for the instance's thread.
    pid = srv.proc.pid
    xb = np.random.default_rng(0).standard_normal(big).astype(np.float32)
    added = {}
    for name in ["threads1", "threads3", "threads1"]:
        before = tasks(pid)
        r = infer(srv, name, [make_input("INPUT__0", xb, "FP32", binary=True)])
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(parse_response(r)[1]["OUTPUT__0"], np.sin(xb), rtol=1e-5,
                                   atol=1e-6)
        added.setdefault(name, []).append(tasks(pid) - before)
    # (threads3 may add LibTorch's pthreadpool as well; a short-lived thread of the server may
    # end meanwhile, hence the inequalities.)
    assert max(added["threads1"]) <= 0 and added["threads3"][0] >= 2, added


# --------------------------------------------------------------------------------------------
# enable_mem_arena / enable_mem_pattern (Triton: ModelState::ModelState reads both into the
# session options, EnableCpuMemArena / EnableMemPattern)

N_BIG = 32 * 1024 * 1024  # FP32 elements of the intermediate tensor: 128 MiB


def write_big_intermediate_model(path):
    """Y = sum(expand(X, [N_BIG])) - sum(X): one 128 MiB intermediate per run, a scalar out."""
    shape = numpy_helper.from_array(np.array([N_BIG], np.int64), "SHAPE")
    nodes = [helper.make_node("Expand", ["X", "SHAPE"], ["big"]),
             helper.make_node("ReduceSum", ["big"], ["Y"], keepdims=0)]
    graph = helper.make_graph(nodes, "big_intermediate",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def big_config(name, arena, pattern):
    return (f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]\n'
            + param("enable_mem_arena", arena) + param("enable_mem_pattern", pattern))


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_mem_arena_keeps_the_intermediate_and_session_options_read_back(tmp_path, server_factory,
                                                                       monkeypatch):
    """enable_mem_arena 1: ONNX Runtime's CPU arena keeps the 128 MiB intermediate after the run
    (RSS stays up); 0: it goes back as the run ends. Both parameters are also read back from the
    session: with --log-verbose the runtime logs its own "Session Options" line at load.
    tcmalloc would keep the freed pages itself (and hand them to the arena next): told to give
    freed spans back at once, RSS shows what the runtime holds."""
    monkeypatch.setenv("TCMALLOC_AGGRESSIVE_DECOMMIT", "true")
    repo = tmp_path / "repo"
    for name, arena, pattern in [("no_arena", "0", "0"), ("arena", "1", "1")]:
        make_model_dir(repo, name, big_config(name, arena, pattern), write_big_intermediate_model)
    srv = server_factory(repo, ["--log-verbose=1"])
    for name in ("no_arena", "arena"):
        srv.wait_until(lambda n=name: srv.get(f"/v2/models/{n}/ready").status_code == 200, 30, name)
    pid = srv.proc.pid
    x = np.array([0.5], np.float32)
    grown = {}
    for name in ("no_arena", "arena"):  # the arena's memory stays: measure it last
        before = rss_bytes(pid)
        for _ in range(2):
            r = infer(srv, name, [make_input("X", x, "FP32")])
            assert r.status_code == 200, r.text
            assert parse_response(r)[1]["Y"].item() == pytest.approx(0.5 * N_BIG, rel=1e-3)
        grown[name] = rss_bytes(pid) - before
    # The release build's allocator is tcmalloc; a sanitizer build's keeps freed memory in
    # quarantine, where RSS cannot tell the runtime's holding from the allocator's.
    if "tcmalloc" in Path(f"/proc/{pid}/maps").read_text():
        big = N_BIG * 4
        assert grown["no_arena"] < big // 4, grown
        assert grown["arena"] > big * 3 // 4, grown
    # ONNX Runtime's own log of each session's options (not inferd's echo of config.pbtxt).
    log = Path(srv.log_path).read_text(errors="replace")
    lines = [l for l in log.splitlines() if "Session Options {" in l]
    assert any("enable_mem_pattern:0" in l and "enable_cpu_mem_arena:0" in l for l in lines), lines
    assert any("enable_mem_pattern:1" in l and "enable_cpu_mem_arena:1" in l for l in lines), lines
