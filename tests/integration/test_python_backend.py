"""The Python backend (issue 18): model.py files in Triton's own style, run unchanged.

Each test writes its model.py files into a fresh repository and starts a server on it. The
expected values are computed here with numpy, never echoed from a config.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from v2client import assert_error, infer, make_input, parse_response

ADD_SUB_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }},
        {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
{extra}
"""

# Triton's add_sub example, as users write it.
ADD_SUB_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        self.args = args
        out0 = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        self.output0_dtype = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(model_config, "OUTPUT1")["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0 = in_0.as_numpy() + in_1.as_numpy()
            out_1 = in_0.as_numpy() - in_1.as_numpy()
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1]))
        return responses

    def finalize(self):
        print("Cleaning up...")
'''


def write_model(repo, name, config, model_py, version=1, filename="model.py"):
    d = Path(repo) / name
    (d / str(version)).mkdir(parents=True, exist_ok=True)
    if config is not None:
        (d / "config.pbtxt").write_text(config)
    (d / str(version) / filename).write_text(model_py)
    return d


def fp32(name, arr, binary=False):
    return make_input(name, np.asarray(arr, dtype=np.float32), "FP32", binary=binary)


def ok(resp):
    assert resp.status_code == 200, resp.text[:2000]
    return parse_response(resp)[1]


def model_ready(srv, name):
    return srv.get(f"/v2/models/{name}/ready").status_code == 200


def test_add_sub_and_instance_args(tmp_path, server_factory):
    write_model(tmp_path, "add_sub", ADD_SUB_CONFIG.format(
        name="add_sub", mbs=0, dims="4",
        extra='instance_group [ { count: 2 kind: KIND_CPU } ]'), ADD_SUB_PY)
    # A model reporting its initialize() args back: Triton's keys, each instance its own name.
    write_model(tmp_path, "args", """name: "args"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { name: "grp" count: 2 kind: KIND_CPU } ]
""", '''
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
    def execute(self, requests):
        keys = ["model_name", "model_version", "model_instance_kind", "model_instance_name",
                "model_instance_device_id", "model_repository"]
        vals = [self.args[k] for k in keys] + [json.loads(self.args["model_config"])["name"],
                                               pb_utils.get_model_dir(), str(os.getpid())]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(vals, dtype=object))])
                for _ in requests]
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "add_sub") and model_ready(srv, "args"), 30, "ready")
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    out = ok(infer(srv, "add_sub", [fp32("INPUT0", a), fp32("INPUT1", b)]))
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    # Binary tensors in and out take the same path.
    out = ok(infer(srv, "add_sub", [fp32("INPUT0", a, True), fp32("INPUT1", b, True)],
                   outputs=[{"name": "OUTPUT1", "parameters": {"binary_data": True}}]))
    assert list(out) == ["OUTPUT1"]
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)

    names, pids = set(), set()
    for _ in range(12):
        vals = [v.decode() for v in ok(infer(srv, "args", [make_input(
            "IN", np.array([1], dtype=np.int32), "INT32")]))["OUT"]]
        assert vals[:3] == ["args", "1", "CPU"]
        assert vals[4] == "0" and vals[5] == str(tmp_path / "args")
        assert vals[6] == "args" and vals[7] == str(tmp_path / "args" / "1")
        names.add(vals[3])
        pids.add(vals[8])
    # Two processes (one per instance), named as Triton names them.
    assert names <= {"grp_0", "grp_1"} and len(pids) == len(names)
    assert str(os.getpid()) not in pids


def test_bytes_in_and_out(tmp_path, server_factory):
    write_model(tmp_path, "strings", """name: "strings"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "LENGTH" data_type: TYPE_INT32 dims: [ -1 ] } ]
""", '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
            assert text.dtype == np.object_, text.dtype
            upper = np.array([t.decode("utf-8").upper().encode("utf-8") for t in text], dtype=np.object_)
            length = np.array([len(t) for t in text], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper),
                                                   pb_utils.Tensor("LENGTH", length)]))
        return out
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "strings"), 30, "ready")
    words = ["hello", "", "grüße", "a" * 1000]
    arr = np.array([w.encode() for w in words], dtype=np.object_)
    for binary in (False, True):
        out = ok(infer(srv, "strings", [make_input("TEXT", arr, "BYTES", binary=binary)]))
        assert [x.decode() for x in out["UPPER"]] == [w.upper() for w in words]
        np.testing.assert_array_equal(out["LENGTH"], [len(w.encode()) for w in words])


def test_dynamic_batching_delivers_several_requests(tmp_path, server_factory):
    # execute() records how many requests it got in one call.
    write_model(tmp_path, "batched", """name: "batched"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
""", '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x * 2),
                pb_utils.Tensor("N", np.full((x.shape[0], 1), n, dtype=np.int32))]))
        return out
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "batched"), 30, "ready")
    import concurrent.futures
    xs = [np.random.rand(1, 3).astype(np.float32) for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        resps = list(pool.map(lambda x: infer(srv, "batched", [fp32("X", x)],
                                              session=__import__("requests").Session()), xs))
    counts = []
    for x, r in zip(xs, resps):
        out = ok(r)
        np.testing.assert_array_equal(out["Y"], x * 2)
        counts.append(int(out["N"][0, 0]))
    assert max(counts) >= 2, f"every execute got one request: {counts}"


def test_errors_map_to_status_and_server_stays_up(tmp_path, server_factory):
    write_model(tmp_path, "errs", """name: "errs"
backend: "python"
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            mode = int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0])
            if mode == 1:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "mode 1 is not a valid input", pb_utils.TritonError.INVALID_ARG)))
            elif mode == 2:
                out.append(pb_utils.InferenceResponse([], pb_utils.TritonError("plain failure")))
            elif mode == 3:
                raise ValueError("execute blew up on mode 3")
            elif mode == 4:
                return []
            elif mode == 5:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "mode 5 exists already", pb_utils.TritonError.ALREADY_EXISTS)))
            elif mode == 6:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "mode 6 is a mystery", pb_utils.TritonError.UNKNOWN)))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([mode * 10], dtype=np.int32))]))
        return out
''')
    # initialize() raising fails that model's load with its message; the others serve on.
    write_model(tmp_path, "bad_init", """name: "bad_init"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights found at /nowhere")
    def execute(self, requests):
        return []
''')
    srv = server_factory(tmp_path, ["--exit-on-error=false"])
    srv.wait_until(lambda: model_ready(srv, "errs"), 30, "ready")
    mode = lambda m: [make_input("MODE", np.array([m], dtype=np.int32), "INT32")]
    assert_error(infer(srv, "errs", mode(1)), 400, "mode 1 is not a valid input")
    assert_error(infer(srv, "errs", mode(2)), 500, "plain failure")
    assert_error(infer(srv, "errs", mode(3)), 500, "execute blew up on mode 3", "errs")
    assert_error(infer(srv, "errs", mode(4)), 500, "InferenceResponse")
    # Triton's HTTP frontend answers 400 for a model's ALREADY_EXISTS and UNKNOWN errors.
    assert_error(infer(srv, "errs", mode(5)), 400, "mode 5 exists already")
    assert_error(infer(srv, "errs", mode(6)), 400, "mode 6 is a mystery")
    assert ok(infer(srv, "errs", mode(7)))["OUT"].tolist() == [70]
    assert not model_ready(srv, "bad_init")
    index = srv.post("/v2/repository/index", json={}).json()
    reason = [m for m in index if m["name"] == "bad_init"][0].get("reason", "")
    assert "no weights found at /nowhere" in reason and "initialize" in reason, index
    # Decoupled models are refused clearly at load until the response sender is wired.
    assert srv.is_live()


CRASH_PY = '''
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

MARK = os.path.join(os.path.dirname(__file__), "crashed")

class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(MARK):
            time.sleep(1.5)  # a slow restart, so the test can see the model not ready

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x[0] == 13:
                open(MARK, "w").close()
                os._exit(3)
            if x[0] == 14:
                time.sleep(30)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return out
'''


def test_crash_restart_and_readiness(tmp_path, server_factory):
    write_model(tmp_path, "crashy", """name: "crashy"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", CRASH_PY)
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "crashy"), 30, "ready")
    x = lambda v: [make_input("X", np.array([v], dtype=np.int32), "INT32")]
    assert ok(infer(srv, "crashy", x(1)))["Y"].tolist() == [2]
    err = assert_error(infer(srv, "crashy", x(13)), 500, "crashy", "exited with status 3")
    assert "restart" in err
    # Not ready while the new process initializes, ready again after.
    assert not model_ready(srv, "crashy")
    srv.wait_until(lambda: model_ready(srv, "crashy"), 30, "crashy ready again")
    assert ok(infer(srv, "crashy", x(5)))["Y"].tolist() == [6]
    # A hung execute past the request's timeout: 504, the process is killed and restarted.
    t0 = time.monotonic()
    resp = infer(srv, "crashy", x(14), parameters={"timeout": 1000000})
    assert time.monotonic() - t0 < 10
    assert_error(resp, 504, "crashy")
    srv.wait_until(lambda: model_ready(srv, "crashy"), 30, "crashy ready after the hang")
    assert ok(infer(srv, "crashy", x(6)))["Y"].tolist() == [7]
    assert srv.is_live()


def test_auto_complete_config(tmp_path, server_factory):
    # No config.pbtxt at all: backend from... the model needs one naming the backend; Triton's
    # auto-complete example gives only the backend.
    write_model(tmp_path, "auto", 'backend: "python"\n', '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "IN0", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        for i in inputs:
            if i["name"] not in input_names:
                auto_complete_model_config.add_input(i)
        for o in outputs:
            auto_complete_model_config.add_output(o)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT0", pb_utils.get_input_tensor_by_name(r, "IN0").as_numpy() * 3)]) for r in requests]
''')
    write_model(tmp_path, "auto_bad", 'backend: "python"\n', '''
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(cfg):
        cfg.add_input({"name": "X", "data_type": "TYPE_FP32"})
        return cfg
    def execute(self, requests):
        return []
''')
    srv = server_factory(tmp_path, ["--exit-on-error=false"])
    srv.wait_until(lambda: model_ready(srv, "auto"), 30, "ready")
    cfg = srv.get("/v2/models/auto/config").json()
    assert cfg["max_batch_size"] == 4
    assert [i["name"] for i in cfg["input"]] == ["IN0"]
    assert "dynamic_batching" in cfg
    x = np.random.rand(2, 4).astype(np.float32)
    np.testing.assert_allclose(ok(infer(srv, "auto", [fp32("IN0", x)]))["OUT0"], x * 3)
    index = srv.post("/v2/repository/index", json={}).json()
    reason = [m for m in index if m["name"] == "auto_bad"][0].get("reason", "")
    assert "missing 'dims' property" in reason, index


BLS_PY = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0]
            def call(x, y, model="add_sub_nobatch"):
                return pb_utils.InferenceRequest(
                    model_name=model, requested_output_names=["OUTPUT0", "OUTPUT1"],
                    inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", y)])
            if mode == 0:   # sync
                r = call(a, b).exec()
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
                s = pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
                d = pb_utils.get_output_tensor_by_name(r, "OUTPUT1").as_numpy()
            elif mode in (3, 4):  # another Python model, an ensemble
                r = call(a, b, model="py_add_sub" if mode == 3 else "ens_add_sub").exec()
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
                s = pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
                d = pb_utils.get_output_tensor_by_name(r, "OUTPUT1").as_numpy()
            elif mode == 1:  # async, two calls in flight
                r1, r2 = await asyncio.gather(call(a, b).async_exec(), call(b, a).async_exec())
                s = pb_utils.get_output_tensor_by_name(r1, "OUTPUT0").as_numpy()
                d = pb_utils.get_output_tensor_by_name(r2, "OUTPUT1").as_numpy()
            else:  # an unknown model: the error comes back in the response
                r = call(a, b, model="no_such_model").exec()
                responses.append(pb_utils.InferenceResponse(error=r.error()))
                continue
            ready = pb_utils.is_model_ready("add_sub_nobatch") and not pb_utils.is_model_ready("no_such_model")
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", s), pb_utils.Tensor("DIFF", d),
                pb_utils.Tensor("READY", np.array([ready]))]))
        return responses
'''


def test_bls_sync_and_async_to_onnx(make_repo, server_factory):
    repo = make_repo({"add_sub_nobatch": "add_sub_nobatch"})
    write_model(repo, "bls", """name: "bls"
backend: "python"
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "READY" data_type: TYPE_BOOL dims: [ 1 ] } ]
""", BLS_PY)
    write_model(repo, "py_add_sub", ADD_SUB_CONFIG.format(name="py_add_sub", mbs=0, dims="4",
                                                          extra=""), ADD_SUB_PY)
    ens = Path(repo) / "ens_add_sub"
    (ens / "1").mkdir(parents=True)
    (ens / "config.pbtxt").write_text("""name: "ens_add_sub"
platform: "ensemble"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "add_sub_nobatch" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }
""")
    srv = server_factory(repo)
    srv.wait_until(lambda: model_ready(srv, "bls") and model_ready(srv, "ens_add_sub"), 30, "ready")
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    for m, want_diff in ((0, a - b), (1, b - a), (3, a - b), (4, a - b)):
        out = ok(infer(srv, "bls", [fp32("A", a), fp32("B", b),
                                    make_input("MODE", np.array([m], dtype=np.int32), "INT32")]))
        np.testing.assert_allclose(out["SUM"], a + b, rtol=1e-6)
        np.testing.assert_allclose(out["DIFF"], want_diff, rtol=1e-6)
        assert out["READY"].tolist() == [True]
    resp = infer(srv, "bls", [fp32("A", a), fp32("B", b),
                              make_input("MODE", np.array([2], dtype=np.int32), "INT32")])
    assert_error(resp, 404, "no_such_model")


def test_64mb_tensor_without_dev_shm(tmp_path, server_factory):
    # 64 MB through a 1 MB default region growing 1 MB at a time, and no /dev/shm at all: the
    # stub reports the mappings it has, which must be the memfd and nothing under /dev/shm.
    write_model(tmp_path, "big", """name: "big"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "MAPS" data_type: TYPE_STRING dims: [ -1 ] } ]
""", '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        maps = [l.split(None, 5)[5].strip() for l in open("/proc/self/maps") if "shm" in l or "memfd" in l]
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x[::-1] + 1),
                pb_utils.Tensor("MAPS", np.array(sorted(set(maps)) or ["none"], dtype=object))]))
        return out
''')
    srv = server_factory(tmp_path, ["--backend-config=python,shm-default-byte-size=1048576",
                                    "--backend-config=python,shm-growth-byte-size=1048576",
                                    "--http-max-input-size=100000000"])
    srv.wait_until(lambda: model_ready(srv, "big"), 30, "ready")
    x = np.random.rand(16 * 1024 * 1024).astype(np.float32)  # 64 MiB
    resp = infer(srv, "big", [fp32("X", x, binary=True)],
                 outputs=[{"name": "Y", "parameters": {"binary_data": True}}, {"name": "MAPS"}])
    out = ok(resp)
    np.testing.assert_array_equal(out["Y"], x[::-1] + 1)
    maps = [m.decode() for m in out["MAPS"]]
    assert maps and all(m.startswith("/memfd:inferd-python") for m in maps), maps
    assert not any(m.startswith("/dev/shm") for m in maps)


def test_instances_start_in_parallel(tmp_path, server_factory):
    # Each instance's initialize() records when it ran; started one after another (Triton
    # server#5342) the intervals would not overlap.
    write_model(tmp_path, "slow_init", """name: "slow_init"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 3 kind: KIND_CPU } ]
""", '''
import os, time
class TritonPythonModel:
    def initialize(self, args):
        start = time.time()
        time.sleep(2.0)
        path = os.path.join(args["model_repository"], args["model_instance_name"] + ".span")
        with open(path, "w") as f:
            f.write(f"{start} {time.time()}")
    def execute(self, requests):
        return []
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "slow_init"), 30, "ready")
    spans = [tuple(map(float, p.read_text().split())) for p in (tmp_path / "slow_init").glob("*.span")]
    assert len(spans) == 3
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans


DECOUPLED_PY = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            if values.size and values[0] < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "negative input", pb_utils.TritonError.INVALID_ARG)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            # As Triton's decoupled examples: a thread answers after execute() returned.
            def respond(values=values, sender=sender):
                for i, v in enumerate(values):
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", np.array([v * 2], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([i], dtype=np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            t = threading.Thread(target=respond)
            t.start()
            self.threads.append(t)
        return None
'''


def test_decoupled_response_sender(tmp_path, server_factory):
    import json as _json
    import requests as _requests
    write_model(tmp_path, "py_repeat", """name: "py_repeat"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", DECOUPLED_PY)
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "py_repeat"), 30, "ready")

    def stream(values):
        with _requests.post(srv.url + "/v2/models/py_repeat/generate_stream",
                            json={"IN": values}, stream=True, timeout=30) as r:
            body = b"".join(r.iter_content(chunk_size=None))
            return r.status_code, [_json.loads(line[6:]) for line in body.split(b"\n")
                                   if line.startswith(b"data: ")]

    status, events = stream([3, 5, 7])
    assert status == 200
    assert [e["OUT"] for e in events] == [6, 10, 14]
    assert [e["IDX"] for e in events] == [0, 1, 2]
    status, events = stream([-1])
    # An error before any response: a plain JSON error with the TritonError's status.
    r = srv.post("/v2/models/py_repeat/generate_stream", json={"IN": [-1]})
    assert r.status_code == 400 and "negative input" in r.json()["error"], r.text
    # The plain /infer route refuses a decoupled model, as Triton does.
    r = infer(srv, "py_repeat", [make_input("IN", np.array([1], dtype=np.int32), "INT32")])
    assert r.status_code >= 400
    status, events = stream([1, 2])
    assert [e["OUT"] for e in events] == [2, 4]


def test_execution_env_path(tmp_path, server_factory):
    # A packed environment (tar.gz with lib/python3.X/site-packages) and a plain folder: the
    # model imports a module only they hold.
    import tarfile
    env_dir = tmp_path / "envsrc" / "lib" / "python3.11" / "site-packages"
    env_dir.mkdir(parents=True)
    (env_dir / "packed_helper.py").write_text("def scale():\n    return 5\n")
    # Inside the model's folder: an environment elsewhere is refused (test_model_files_escape).
    repo = tmp_path / "repo"
    folder = repo / "foldermodel" / "plainenv"
    folder.mkdir(parents=True)
    (folder / "folder_helper.py").write_text("def offset():\n    return 100\n")
    model_dir = write_model(repo, "envmodel", """name: "envmodel"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
""", '''
import numpy as np
import packed_helper
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y",
            pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * packed_helper.scale())])
            for r in requests]
''')
    with tarfile.open(model_dir / "env.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "envsrc", arcname=".")
    write_model(repo, "foldermodel", f"""name: "foldermodel"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{folder}" }} }}
""", '''
import folder_helper
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y",
            pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + folder_helper.offset())])
            for r in requests]
''')
    srv = server_factory(repo, ["--exit-on-error=false"])
    srv.wait_until(lambda: model_ready(srv, "envmodel") and model_ready(srv, "foldermodel"), 30,
                   "ready")
    x = [make_input("X", np.array([7], dtype=np.int32), "INT32")]
    assert ok(infer(srv, "envmodel", x))["Y"].tolist() == [35]
    assert ok(infer(srv, "foldermodel", x))["Y"].tolist() == [107]


def test_finalize_on_unload_and_logger(tmp_path, server_factory):
    write_model(tmp_path, "fin", """name: "fin"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", '''
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]
        pb_utils.Logger.log_warn("fin is warming up")

    def execute(self, requests):
        pb_utils.Logger.log_info("fin executes " + str(len(requests)))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y",
            pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]

    def finalize(self):
        open(os.path.join(self.dir, "finalized"), "w").write(str(os.getpid()))
''')
    srv = server_factory(tmp_path, ["--model-control-mode=explicit", "--load-model=fin"])
    srv.wait_until(lambda: model_ready(srv, "fin"), 30, "ready")
    assert ok(infer(srv, "fin", [make_input("X", np.array([4], dtype=np.int32), "INT32")]))["Y"].tolist() == [4]
    assert not (tmp_path / "fin" / "finalized").exists()
    assert srv.post("/v2/repository/models/fin/unload", json={}).status_code == 200
    srv.wait_until(lambda: (tmp_path / "fin" / "finalized").exists(), 15, "finalize() to run")
    pid = int((tmp_path / "fin" / "finalized").read_text())
    srv.wait_until(lambda: not Path(f"/proc/{pid}").exists() or
                   "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], 15, "the process to exit")
    log = srv.log()
    assert "model 'fin' instance 'fin_0': fin is warming up" in log  # group 'fin' (no instance_group)
    assert "fin executes 1" in log


PARAMS_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mine = request.parameters()
            assert isinstance(mine, str), type(mine)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            via_bls = "{}"
            if x[0] == 1:
                # BLS: the parameters this model gives travel to the called model.
                bls = pb_utils.InferenceRequest(
                    model_name="py_params_inner", requested_output_names=["PARAMS"],
                    inputs=[pb_utils.Tensor("X", np.array([0], dtype=np.int32))],
                    parameters={"from_bls": "yes", "depth": 2})
                out = bls.exec()
                if out.has_error():
                    raise pb_utils.TritonModelException(out.error().message())
                via_bls = pb_utils.get_output_tensor_by_name(out, "PARAMS").as_numpy()[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PARAMS", np.array([mine.encode()], dtype=np.object_)),
                pb_utils.Tensor("BLS", np.array([via_bls], dtype=np.object_))]))
        return responses
'''


def test_request_parameters_reach_model_and_bls(tmp_path, server_factory, request):
    import json as _json
    write_model(tmp_path, "py_params", """name: "py_params"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }, { name: "BLS" data_type: TYPE_STRING dims: [ 1 ] } ]
""", PARAMS_PY)
    write_model(tmp_path, "py_params_inner", """name: "py_params_inner"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }, { name: "BLS" data_type: TYPE_STRING dims: [ 1 ] } ]
""", PARAMS_PY)
    (tmp_path / "ens_params" / "1").mkdir(parents=True)
    (tmp_path / "ens_params" / "config.pbtxt").write_text("""name: "ens_params"
platform: "ensemble"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "py_params" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "PARAMS" value: "PARAMS" } } ] }
""")
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "py_params") and model_ready(srv, "py_params_inner")
                   and model_ready(srv, "ens_params"), 30, "ready")
    x0 = make_input("X", np.array([0], dtype=np.int32), "INT32")
    # Triton's python backend: a JSON object of the request's own parameters; the ones the
    # server reads itself (priority, timeout, sequence_*, binary_data_output) are not in it.
    sent = {"temperature": 0.5, "user": "ann", "stream": False, "top_k": 7}
    out = ok(infer(srv, "py_params", [x0], parameters=dict(sent, priority=1, timeout=10000000)))
    assert _json.loads(out["PARAMS"][0]) == sent
    out = ok(infer(srv, "py_params", [x0]))
    assert _json.loads(out["PARAMS"][0]) == {}
    out = ok(infer(srv, "py_params", [make_input("X", np.array([1], dtype=np.int32), "INT32")],
                   parameters={"outer": 1}))
    assert _json.loads(out["PARAMS"][0]) == {"outer": 1}
    assert _json.loads(out["BLS"][0]) == {"from_bls": "yes", "depth": 2}
    # Through an ensemble: each step sees the ensemble request's parameters (Triton's ensemble
    # scheduler sets them on every step's request).
    out = ok(infer(srv, "ens_params", [x0], parameters=dict(sent, priority=1)))
    assert _json.loads(out["PARAMS"][0]) == sent
    # gRPC: the typed parameters map, as JSON values.
    from conftest import NO_GRPC
    if NO_GRPC or not srv.grpc_port:
        return
    import grpc
    m, services = request.getfixturevalue("pb")
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        req = m.ModelInferRequest(model_name="py_params")
        req.inputs.add(name="X", datatype="INT32", shape=[1])
        req.raw_input_contents.append(np.array([0], dtype=np.int32).tobytes())
        req.parameters["user"].string_param = 'a "quoted"\tname\n'
        req.parameters["top_k"].int64_param = 7
        req.parameters["stream"].bool_param = True
        req.parameters["temperature"].double_param = 0.123456789012345
        req.parameters["priority"].uint64_param = 1
        resp = services.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=30)
    raw = resp.raw_output_contents[[o.name for o in resp.outputs].index("PARAMS")]
    # Doubles keep every digit (a %g-style writer gave 0.123457).
    assert _json.loads(raw[4:].decode()) == {"user": 'a "quoted"\tname\n', "top_k": 7,
                                             "stream": True, "temperature": 0.123456789012345}


CANCEL_PY = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.marker = args["model_repository"] + "/outcome"

    def execute(self, requests):
        request = requests[0]
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if request.is_cancelled():
                open(self.marker, "w").write("cancelled")
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "cancelled", pb_utils.TritonError.CANCELLED))]
            time.sleep(0.01)
        open(self.marker, "w").write("not cancelled")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([1], dtype=np.int32))])]
'''


def test_is_cancelled_sees_client_disconnect(tmp_path, server_factory):
    import json as _json
    import socket
    d = write_model(tmp_path, "py_cancel", """name: "py_cancel"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", CANCEL_PY)
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "py_cancel"), 30, "ready")
    body = _json.dumps({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1],
                                    "data": [1]}]}).encode()
    host, port = srv.url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v2/models/py_cancel/infer HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.5)  # execute() is running and polling
    s.close()  # the client goes away
    marker = d / "outcome"
    srv.wait_until(marker.exists, 20, "the model to finish")
    assert marker.read_text() == "cancelled"
    # A request whose client stays is not cancelled: the model runs to its end... (15 s):
    # instead check the server still answers and the instance is ready.
    assert model_ready(srv, "py_cancel")


REPEAT_CONFIG = """name: "repeat_int32"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""

BLS_DECOUPLED_PY = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

def call(values):
    return pb_utils.InferenceRequest(
        model_name="repeat_int32", requested_output_names=["OUT", "IDX"],
        inputs=[pb_utils.Tensor("IN", values.astype(np.int32)),
                pb_utils.Tensor("DELAY", np.full(values.shape, 5, dtype=np.uint32)),
                pb_utils.Tensor("WAIT", np.array([0], dtype=np.uint32))])

def collect(responses):
    outs, empty = [], 0
    for r in responses:
        if r.has_error():
            raise pb_utils.TritonModelException(r.error().message())
        if len(r.output_tensors()) == 0:
            empty += 1  # the final flag alone
            continue
        outs.append(int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]))
    return outs, empty

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 0:
                outs, empty = collect(call(values).exec(decoupled=True))
            else:
                # Two calls in flight, then each read with async for.
                it1, it2 = await asyncio.gather(call(values).async_exec(decoupled=True),
                                                call(values[::-1]).async_exec(decoupled=True))
                outs, empty = [], 0
                for it in (it1, it2):
                    async for r in it:
                        if len(r.output_tensors()):
                            outs.append(int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]))
                        else:
                            empty += 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTS", np.array(outs, dtype=np.int32)),
                pb_utils.Tensor("EMPTY", np.array([empty], dtype=np.int32))]))
        return responses
'''


def test_bls_to_decoupled_model(tmp_path, server_factory):
    write_model(tmp_path, "repeat_int32", REPEAT_CONFIG, "")
    (tmp_path / "repeat_int32" / "1" / "model.py").unlink()
    write_model(tmp_path, "bls_stream", """name: "bls_stream"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTS" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "EMPTY" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", BLS_DECOUPLED_PY)
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "bls_stream") and model_ready(srv, "repeat_int32"),
                   30, "ready")
    values = np.random.randint(-1000, 1000, size=5).astype(np.int32)

    def run(mode, vals):
        return ok(infer(srv, "bls_stream", [
            make_input("IN", vals, "INT32"),
            make_input("MODE", np.array([mode], dtype=np.int32), "INT32")]))

    # The repeat model answers once per element, in order, then the final flag alone.
    out = run(0, values)
    assert out["OUTS"].tolist() == values.tolist()
    assert out["EMPTY"].tolist() == [1]
    out = run(1, values)
    assert out["OUTS"].tolist() == values.tolist() + values[::-1].tolist()
    assert out["EMPTY"].tolist() == [2]
    # No element: no response but the final flag.
    out = run(0, np.array([], dtype=np.int32))
    assert out["OUTS"].tolist() == [] and out["EMPTY"].tolist() == [1]


IDENTITY_CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{extra}
"""


def test_model_py_imports_its_neighbours_relatively_and_absolutely(tmp_path, server_factory):
    # Triton imports model.py as "<version>.model", a module of a package named after the
    # version folder: `from . import helper` works beside `import helper` (Triton's multi_file).
    d = write_model(tmp_path, "multi", IDENTITY_CONFIG.format(name="multi", extra=""), '''
import numpy as np
import triton_python_backend_utils as pb_utils
import helper_abs
from . import helper_rel
from .helper_rel import OFFSET

class TritonPythonModel:
    def initialize(self, args):
        assert helper_abs.NAME == "abs" and helper_rel.NAME == "rel", "imports"
        self.package = __name__
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + OFFSET)]) for r in requests]
''')
    (d / "1" / "helper_abs.py").write_text('NAME = "abs"\n')
    (d / "1" / "helper_rel.py").write_text('NAME = "rel"\nOFFSET = 40\n')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "multi"), 30, "ready\n" + srv.log())
    out = ok(infer(srv, "multi", [make_input("IN", np.array([2], dtype=np.int32), "INT32")]))
    assert out["OUT"].tolist() == [42]


def test_processes_outlive_the_thread_that_loaded_them(tmp_path, server_factory):
    # Each process's initialize() runs once, and at shutdown every instance's finalize() runs:
    # the processes must not die with the (short-lived) loading thread that started them, as
    # PR_SET_PDEATHSIG, which follows the forking thread, made them do.
    marks = tmp_path / "marks"
    marks.mkdir()
    for name in ("life_a", "life_b"):
        write_model(tmp_path / "repo", name, IDENTITY_CONFIG.format(
            name=name, extra="instance_group [ { count: 2 kind: KIND_CPU } ]"), f'''
import os, time
import triton_python_backend_utils as pb_utils
MARKS = {str(marks)!r}

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        open(os.path.join(MARKS, "init-" + self.name + "-" + str(os.getpid())), "w").close()
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
    def finalize(self):
        open(os.path.join(MARKS, "fini-" + self.name + "-" + str(os.getpid())), "w").close()
''')
    srv = server_factory(tmp_path / "repo")
    srv.wait_until(lambda: model_ready(srv, "life_a") and model_ready(srv, "life_b"), 60, "ready")
    for name in ("life_a", "life_b"):
        for _ in range(4):
            ok(infer(srv, name, [make_input("IN", np.array([1], dtype=np.int32), "INT32")]))
    # Give a wrongly tied process time to die with its thread, as the loader's threads end.
    time.sleep(2)
    assert srv.stop() == 0
    inits = sorted(p.name for p in marks.glob("init-*"))
    finis = sorted(p.name for p in marks.glob("fini-*"))
    assert len(inits) == 4, (inits, srv.log())
    assert [f.replace("fini-", "init-") for f in finis] == inits, (inits, finis, srv.log())
    assert "restarting it" not in srv.log()


def test_processes_exit_when_inferd_is_killed(tmp_path, server_factory):
    marks = tmp_path / "marks"
    marks.mkdir()
    write_model(tmp_path / "repo", "orphan", IDENTITY_CONFIG.format(name="orphan", extra=""), f'''
import os
class TritonPythonModel:
    def initialize(self, args):
        open(os.path.join({str(marks)!r}, str(os.getpid())), "w").close()
    def execute(self, requests):
        return []
''')
    srv = server_factory(tmp_path / "repo")
    srv.wait_until(lambda: model_ready(srv, "orphan"), 30, "ready")
    (pid,) = [int(p.name) for p in marks.iterdir()]
    srv.proc.kill()
    srv.proc.wait()

    def gone():
        try:
            return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return True
    deadline = time.monotonic() + 20
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(), f"the Python process {pid} outlived inferd"


def test_bls_outside_execute_and_finalize_errors(tmp_path, server_factory):
    # Triton's stub refuses BLS in initialize() and finalize() with this message (its QA greps
    # the server log for it), and logs an exception from finalize().
    bls_call = '''
        pb_utils.InferenceRequest(model_name="target", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", np.array([1], dtype=np.int32))]).exec()
'''
    body = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        pass{init}
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
    def finalize(self):
        pass{fini}
'''
    write_model(tmp_path, "target", IDENTITY_CONFIG.format(name="target", extra=""),
                body.format(init="", fini=""))
    write_model(tmp_path, "bls_in_init", IDENTITY_CONFIG.format(name="bls_in_init", extra=""),
                body.format(init=bls_call, fini=""))
    write_model(tmp_path, "bls_in_fini", IDENTITY_CONFIG.format(name="bls_in_fini", extra=""),
                body.format(init="", fini=bls_call))
    write_model(tmp_path, "fini_raises", IDENTITY_CONFIG.format(name="fini_raises", extra=""),
                body.format(init="", fini="\n        undefined_variable\n"))
    srv = server_factory(tmp_path, ["--model-control-mode=explicit", "--load-model=target",
                                    "--load-model=bls_in_fini", "--load-model=fini_raises"])
    srv.wait_until(lambda: model_ready(srv, "bls_in_fini") and model_ready(srv, "fini_raises"),
                   30, "ready")
    r = srv.post("/v2/repository/models/bls_in_init/load", json={})
    assert r.status_code == 400, r.text
    assert "BLS is only supported during the 'execute' function." in r.json()["error"], r.text
    for name in ("bls_in_fini", "fini_raises"):
        t0 = time.monotonic()
        assert srv.post(f"/v2/repository/models/{name}/unload", json={}).status_code == 200
        srv.wait_until(lambda: not model_ready(srv, name), 30, f"{name} unloaded")
    srv.wait_until(lambda: "name 'undefined_variable' is not defined" in srv.log(), 30,
                   "the finalize() error in the log")
    log = srv.log()
    assert "model 'bls_in_fini' instance 'bls_in_fini_0': finalize() failed: " \
           "BLS is only supported during the 'execute' function." in log, log
    assert "model 'fini_raises' instance 'fini_raises_0': finalize() failed: NameError: " \
           "name 'undefined_variable' is not defined" in log, log
    # The process ended by itself after finalize(): nothing killed it, the unload did not wait.
    assert "unloaded 'fini_raises' version 1 in 5." not in log, log


def test_bls_from_a_forked_process_is_refused_not_hung(tmp_path, server_factory):
    # Triton's bls QA model sends BLS requests from a multiprocessing Pool. inferd's channel to
    # the process is strictly in turns: a forked child writing to it hung the instance (and
    # the server's shutdown). The child now gets an exception; the parent goes on.
    write_model(tmp_path, "target", IDENTITY_CONFIG.format(name="target", extra=""), '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
''')
    write_model(tmp_path, "forker", """name: "forker"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
""", '''
import multiprocessing
import numpy as np
import triton_python_backend_utils as pb_utils

def bls(x):
    r = pb_utils.InferenceRequest(model_name="target", requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("IN", np.array([x], dtype=np.int32))]).exec()
    return int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0])

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            try:
                with multiprocessing.get_context("fork").Pool(2) as pool:
                    text = str(pool.map(bls, [1, 2, 3]))
            except Exception as e:
                text = type(e).__name__ + ": " + str(e)
            text += " | parent: " + str(bls(7))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                np.array([text.encode()], dtype=np.object_))]))
        return out
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "forker") and model_ready(srv, "target"), 30, "ready")
    r = infer(srv, "forker", [make_input("IN", np.array([1], dtype=np.int32), "INT32")])
    text = ok(r)["OUT"][0].decode()
    assert "not available in a process the model forked" in text, text
    assert text.endswith(" | parent: 7"), text


def test_custom_metrics_on_the_metrics_endpoint(tmp_path, server_factory):
    # pb_utils.MetricFamily / Metric (Triton's custom metrics) show on GET /metrics as Triton
    # shows them, shared between the instances of a model, and go when the model unloads.
    write_model(tmp_path, "metered", IDENTITY_CONFIG.format(
        name="metered", extra="instance_group [ { count: 2 kind: KIND_CPU } ]"), '''
import numpy as np
import triton_python_backend_utils as pb_utils

def refused(fn):
    try:
        fn()
    except pb_utils.TritonModelException as e:
        return str(e)
    return "accepted"

class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily(
            name="metered_requests", description="requests seen", kind=pb_utils.MetricFamily.COUNTER)
        self.level = pb_utils.MetricFamily(
            name="metered_level", description="last input", kind=pb_utils.MetricFamily.GAUGE)
        self.sizes = pb_utils.MetricFamily(
            name="metered_sizes", description="input values", kind=pb_utils.MetricFamily.HISTOGRAM)
        # Labels in any order: written in name order, as prometheus-cpp writes them.
        self.count = self.requests.Metric(labels={"zone": "z1", "app": "demo"})
        self.gauge = self.level.Metric(labels={"app": "demo"})
        self.hist = self.sizes.Metric(labels={"app": "demo"}, buckets=[1.0, 2.5, 10.0])

    def execute(self, requests):
        out = []
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            self.count.increment(1)
            self.gauge.set(x)
            self.hist.observe(x)
            errors = [
                refused(lambda: self.count.increment(-1)),
                refused(lambda: self.count.set(3)),
                refused(lambda: self.gauge.observe(1)),
                refused(lambda: self.hist.value()),
                refused(lambda: self.sizes.Metric(labels={}, buckets=[2.0, 1.0])),
                refused(lambda: self.sizes.Metric(labels={})),
                refused(lambda: pb_utils.MetricFamily(name="metered_requests", description="x",
                                                      kind=pb_utils.MetricFamily.GAUGE)),
            ]
            ok = all(e != "accepted" for e in errors)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(
                [int(self.count.value()) if ok else -1], dtype=np.int32))]))
        return out
''')
    srv = server_factory(tmp_path, ["--model-control-mode=explicit", "--load-model=metered"])
    srv.wait_until(lambda: model_ready(srv, "metered"), 30, "ready")
    for x in (1, 2, 7):
        out = ok(infer(srv, "metered", [make_input("IN", np.array([x], dtype=np.int32), "INT32")]))
        assert out["OUT"][0] > 0, "a refused operation was accepted"
    import requests as http
    text = http.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text
    for line in [
        "# HELP metered_requests requests seen",
        "# TYPE metered_requests counter",
        # Two instances, one series: each process's objects reach the same one.
        'metered_requests{app="demo",zone="z1"} 3',
        "# TYPE metered_level gauge",
        'metered_level{app="demo"} 7',
        "# TYPE metered_sizes histogram",
        'metered_sizes_count{app="demo"} 3',
        'metered_sizes_sum{app="demo"} 10',
        'metered_sizes_bucket{app="demo",le="1"} 1',
        'metered_sizes_bucket{app="demo",le="2.5"} 2',
        'metered_sizes_bucket{app="demo",le="10"} 3',
        'metered_sizes_bucket{app="demo",le="+Inf"} 3',
    ]:
        assert line + "\n" in text, (line, [l for l in text.splitlines() if "metered" in l])
    assert srv.post("/v2/repository/models/metered/unload", json={}).status_code == 200
    srv.wait_until(lambda: "metered_" not in http.get(
        f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text, 30,
        "the model's metrics to go with it")


def test_load_and_unload_models_from_model_py(tmp_path, server_factory):
    # pb_utils.load_model / unload_model (Triton's bls_model_loading): the server's explicit
    # load and unload, from initialize() and from execute(), with a config override.
    write_model(tmp_path, "target", IDENTITY_CONFIG.format(name="target", extra=""), '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
''', version=1)
    (tmp_path / "target" / "2").mkdir()
    (tmp_path / "target" / "2" / "model.py").write_text((tmp_path / "target" / "1" / "model.py").read_text())
    write_model(tmp_path, "loader", """name: "loader"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
""", '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

def attempt(fn):
    try:
        fn()
        return "ok"
    except pb_utils.TritonModelException as e:
        return "error: " + str(e)

class TritonPythonModel:
    def initialize(self, args):
        assert not pb_utils.is_model_ready("target"), "target ready before its load"
        pb_utils.load_model(model_name="target")
        assert pb_utils.is_model_ready("target", "2"), "target not ready after its load"

    def execute(self, requests):
        out = []
        for r in requests:
            step = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            if step == 1:
                got = [attempt(lambda: pb_utils.unload_model("target"))]
                got.append(str(pb_utils.is_model_ready("target")))
            elif step == 2:
                config = json.dumps({"backend": "python",
                                     "version_policy": {"specific": {"versions": [1]}}})
                got = [attempt(lambda: pb_utils.load_model("target", config=config))]
                got += [str(pb_utils.is_model_ready("target", v)) for v in ("1", "2")]
            else:
                got = [attempt(lambda: pb_utils.load_model("no_such_model")),
                       attempt(lambda: pb_utils.unload_model("loader")),
                       attempt(lambda: pb_utils.load_model("target", files={"file:1/model.py": b"x"}))]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                np.array([g.encode() for g in got], dtype=np.object_))]))
        return out
''')
    srv = server_factory(tmp_path, ["--model-control-mode=explicit", "--load-model=loader"])
    srv.wait_until(lambda: model_ready(srv, "loader"), 60, "ready\n" + srv.log())
    assert model_ready(srv, "target")

    def step(n):
        r = infer(srv, "loader", [make_input("IN", np.array([n], dtype=np.int32), "INT32")])
        return [v.decode() for v in ok(r)["OUT"]]
    assert step(1) == ["ok", "False"]
    assert not model_ready(srv, "target")
    assert step(2) == ["ok", "True", "False"]
    errors = step(3)
    assert errors[0].startswith("error: ") and "no_such_model" in errors[0], errors
    assert errors[1] == "error: model 'loader' cannot unload itself", errors
    assert errors[2].startswith("error: ") and "config" in errors[2], errors
    assert model_ready(srv, "loader")


def test_python_based_backend(tmp_path, server_factory):
    # Triton's Python-based backends (vLLM's is one): <backend dir>/<name>/model.py serves
    # every model whose config says backend "<name>"; the models hold only their settings.
    backends = tmp_path / "backends"
    (backends / "arith").mkdir(parents=True)
    (backends / "arith" / "model.py").write_text('''
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2]})
        config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [2]})
        config.add_output({"name": "C", "data_type": "TYPE_INT32", "dims": [2]})
        return config

    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.json")
        self.op = json.load(open(path))["operation"]

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            c = a + b if self.op == "add" else a - b
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("C", c.astype(np.int32))]))
        return out
''')
    repo = tmp_path / "repo"
    for name, op in (("adder", "add"), ("subber", "sub")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.json").write_text(json.dumps({"operation": op}))
        (repo / name / "config.pbtxt").write_text('backend: "arith"\n')
    srv = server_factory(repo, [f"--backend-directory={backends}"])
    srv.wait_until(lambda: model_ready(srv, "adder") and model_ready(srv, "subber"), 60,
                   "ready\n" + srv.log())
    a, b = np.array([5, 7], dtype=np.int32), np.array([2, 3], dtype=np.int32)
    ins = [make_input("A", a, "INT32"), make_input("B", b, "INT32")]
    assert ok(infer(srv, "adder", ins))["C"].tolist() == [7, 10]
    assert ok(infer(srv, "subber", ins))["C"].tolist() == [3, 4]
    cfg = srv.get("/v2/models/adder/config").json()
    assert cfg["backend"] == "arith" and [i["name"] for i in cfg["input"]] == ["A", "B"], cfg


def test_response_parameters(tmp_path, server_factory, pb):
    # InferenceResponse(parameters=...) (Triton's response_parameters models): the response's
    # "parameters" in HTTP's JSON and gRPC's map, from execute(), a decoupled sender and back
    # through BLS; other keys and values are refused with Triton's messages.
    write_model(tmp_path, "rp", """name: "rp"
backend: "python"
input [ { name: "P" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
""", '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "P").as_numpy()[0].decode()
            params = json.loads(text) if text != "bls" else {}
            if isinstance(params, dict) and params.pop("int_key", False):
                params[7] = "x"
            if text == "bls":
                b = pb_utils.InferenceRequest(model_name="rp_inner", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("P", np.array([b'{"via": "bls", "n": -3}'], dtype=np.object_))]).exec()
                text = b.parameters()
                params = {"seen": text}
            try:
                resp = pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                    np.array([text.encode()], dtype=np.object_))], parameters=params)
            except pb_utils.TritonModelException as e:
                resp = pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    str(e), pb_utils.TritonError.INVALID_ARG))
            out.append(resp)
        return out
''')
    write_model(tmp_path, "rp_stream", """name: "rp_stream"
backend: "python"
input [ { name: "P" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
""", '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for p in json.loads(pb_utils.get_input_tensor_by_name(r, "P").as_numpy()[0].decode()):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                    np.array([b"x"], dtype=np.object_))], parameters=p))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
''')
    # The BLS target: the same code under another name (a call to itself would wait for itself).
    write_model(tmp_path, "rp_inner", (tmp_path / "rp" / "config.pbtxt").read_text().replace(
        '"rp"', '"rp_inner"'), (tmp_path / "rp" / "1" / "model.py").read_text())
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "rp") and model_ready(srv, "rp_stream") and
                   model_ready(srv, "rp_inner"), 30, "ready")

    def http(params):
        text = params if isinstance(params, str) else json.dumps(params)
        return infer(srv, "rp", [make_input("P", np.array([text], dtype=np.object_), "BYTES")])
    want = {"flag": True, "count": 1024, "name": "Hello World!"}
    r = http(want)
    assert r.status_code == 200 and r.json()["parameters"] == want, r.text
    assert "parameters" not in http({}).json()
    # Binary outputs take the same path.
    r = infer(srv, "rp", [make_input("P", np.array([json.dumps(want)], dtype=np.object_), "BYTES")],
              outputs=[{"name": "OUT", "parameters": {"binary_data": True}}])
    hl = int(r.headers["Inference-Header-Content-Length"])
    assert json.loads(r.content[:hl])["parameters"] == want
    for bad, msg in [([1], "Expect dict, got <class 'list'>"),
                     ({"int_key": True}, "Expect parameters keys to have type str, found type <class 'int'>"),
                     ({"f": 0.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
                     ({"n": None}, "found type <class 'NoneType'>")]:
        r = http(bad)
        assert r.status_code == 400 and msg in r.json()["error"], (bad, r.text)
    assert json.loads(http("bls").json()["parameters"]["seen"]) == {"via": "bls", "n": -3}

    import grpc
    grpc_pb, grpc_stub = pb
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    stub = grpc_stub.GRPCInferenceServiceStub(channel)

    def grpc_request(model, text):
        req = grpc_pb.ModelInferRequest(model_name=model)
        t = req.inputs.add()
        t.name, t.datatype = "P", "BYTES"
        t.shape.append(1)
        t.contents.bytes_contents.append(text.encode())
        return req

    def params_of(resp):
        return {k: getattr(v, v.WhichOneof("parameter_choice"))
                for k, v in resp.parameters.items() if k != "triton_final_response"}
    assert params_of(stub.ModelInfer(grpc_request("rp", json.dumps(want)))) == want
    streamed = [{"step": 1, "last": False}, {"step": 2, "last": True}]
    msgs = list(stub.ModelStreamInfer(iter([grpc_request("rp_stream", json.dumps(streamed))]),
                                      timeout=30))
    assert [params_of(m.infer_response) for m in msgs] == streamed, msgs
    channel.close()


def test_request_rescheduling_is_refused_clearly(tmp_path, server_factory):
    # inferd does not reschedule requests (iterative_sequence is refused at load): a model
    # asking for it gets an exception naming why, not a silently released request.
    write_model(tmp_path, "resched", IDENTITY_CONFIG.format(name="resched", extra=""), '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
            r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "resched"), 30, "ready")
    r = infer(srv, "resched", [make_input("IN", np.array([1], dtype=np.int32), "INT32")])
    assert r.status_code == 500, r.text
    assert "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE is not supported by inferd" in r.json()["error"]


def test_inference_request_needs_its_arguments(tmp_path, server_factory):
    # As Triton's binding: model_name, inputs and requested_output_names are required
    # (TypeError), which Triton's bls QA model checks.
    write_model(tmp_path, "args_check", IDENTITY_CONFIG.format(name="args_check", extra=""), '''
import triton_python_backend_utils as pb_utils

def type_error(**kw):
    try:
        pb_utils.InferenceRequest(**kw)
    except TypeError:
        return 1
    return 0

class TritonPythonModel:
    def execute(self, requests):
        n = (type_error(inputs=[], requested_output_names=["OUT"]) +
             type_error(model_name="m", requested_output_names=["OUT"]) +
             type_error(model_name="m", inputs=[]))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 0 + n)]) for r in requests]
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "args_check"), 30, "ready")
    out = ok(infer(srv, "args_check", [make_input("IN", np.array([1], dtype=np.int32), "INT32")]))
    assert out["OUT"].tolist() == [3]


def test_sequence_correlation_id_and_flags_reach_model_py(tmp_path, server_factory):
    # request.correlation_id() and request.flags() (START 1, END 2) as the sequence batcher
    # gives them, numeric or string IDs (Triton's sequence_py keeps per-sequence state by them).
    write_model(tmp_path, "seq", """name: "seq"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching { max_sequence_idle_microseconds: 10000000 }
""", '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        out = []
        for r in requests:
            cid, flags = r.correlation_id(), r.flags()
            x = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0][0])
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.totals[cid] = 0
            self.totals[cid] += x
            text = json.dumps([cid, flags, self.totals[cid]])
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.totals[cid]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                np.array([[text.encode()]], dtype=np.object_))]))
        return out
''')
    srv = server_factory(tmp_path)
    srv.wait_until(lambda: model_ready(srv, "seq"), 30, "ready")

    def step(cid, x, start=False, end=False):
        r = srv.post("/v2/models/seq/infer", json={
            "parameters": {"sequence_id": cid, "sequence_start": start, "sequence_end": end},
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [x]}]})
        assert r.status_code == 200, r.text
        return json.loads(r.json()["outputs"][0]["data"][0])
    assert step(41, 5, start=True) == [41, 1, 5]
    assert step("user-7", 2, start=True) == ["user-7", 1, 2]
    assert step(41, 6) == [41, 0, 11]
    assert step("user-7", 3, end=True) == ["user-7", 2, 5]
    assert step(41, 1, end=True) == [41, 2, 12]
