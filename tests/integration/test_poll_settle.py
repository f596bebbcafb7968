"""Poll mode never loads a model file while it is being written: a file overwritten in place,
slowly, across several polls, is loaded only once it is the same at two polls in a row.
Meanwhile every answer comes from the old file or the new one, never from a mix (Triton
reloads on the first change it sees, and serves the half-written model)."""

import threading
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from v2client import infer, make_input, parse_response

N = 16384  # 64 KB of weights: y = x + C


def add_const_model(value):
    c = numpy_helper.from_array(np.full(N, value, dtype=np.float32), "C")
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "C"], ["OUTPUT0"])], "add_c",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [N])], initializer=[c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


CONFIG = f"""name: "weights"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {N} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {N} ] }} ]
"""


def test_a_file_overwritten_in_place_is_never_served_half_written(server_factory, tmp_path):
    old, new = add_const_model(1.0), add_const_model(2.0)
    assert len(old) == len(new)  # same layout: only the weights differ
    repo = tmp_path / "repo"
    (repo / "weights" / "1").mkdir(parents=True)
    (repo / "weights" / "config.pbtxt").write_text(CONFIG)
    path = repo / "weights" / "1" / "model.onnx"
    path.write_bytes(old)
    srv = server_factory(repo, ["--model-control-mode=poll", "--repository-poll-secs=1"])
    x = np.zeros(N, dtype=np.float32)
    seen, bad, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            r = infer(srv, "weights", [make_input("INPUT0", x, "FP32", binary=True)])
            if r.status_code != 200:
                bad.append(r.text)
                continue
            out = parse_response(r)[1]["OUTPUT0"]
            values = set(np.unique(out).tolist())
            seen.append(values)
            if values not in ({1.0}, {2.0}):
                bad.append(f"a mix of the two files: {sorted(values)[:4]}")

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        srv.wait_until(lambda: len(seen) >= 5, 60, "answers from the first file")
        # 1 KB every 60 ms: about 4 s of writing, several polls see the file half-written.
        with open(path, "r+b") as f:
            for off in range(0, len(new), 1024):
                f.seek(off)
                f.write(new[off:off + 1024])
                f.flush()
                time.sleep(0.06)
        srv.wait_until(lambda: seen and seen[-1] == {2.0}, 60, "answers from the new file")
        n = len(seen)
        srv.wait_until(lambda: len(seen) >= n + 5, 60, "more answers")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not bad, bad[:5]
