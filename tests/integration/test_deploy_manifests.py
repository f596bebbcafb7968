"""deploy/kubernetes/: every object loads into the Kubernetes Python client's model classes
(python3-kubernetes) with nothing lost on the way (a misspelt or misplaced field does not
survive the round trip); the KServe objects match the CRD fields written down in
kserve_crd_schema.py; the pieces agree (probes on declared ports, the Service on the pods'
labels, the InferenceService on the runtime's formats and protocol); and the containers'
commands run the real inferd: the Deployment's with the memory budget computed from its memory
limit as the downward API would give it, the ServingRuntime's on a repository at /mnt/models's
place, answering on its declared port."""

import copy
import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from conftest import INFERD_BIN, REPO_ROOT, copy_models, free_port
import kserve_crd_schema as crd
from v2client import infer, make_input, parse_response

kubernetes = pytest.importorskip("kubernetes", reason="python3-kubernetes (scripts/setup.sh)")
from kubernetes import client as k8s  # noqa: E402
from kubernetes.utils import parse_quantity  # noqa: E402

DEPLOY = REPO_ROOT / "deploy" / "kubernetes"


def load(name):
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def by_kind(docs, kind):
    [d] = [d for d in docs if d["kind"] == kind]
    return d


class _Response:
    def __init__(self, obj):
        self.data = json.dumps(obj)


API = k8s.ApiClient()


def k8s_roundtrip(obj, type_name):
    """obj -> the client's model class -> JSON again: what the class does not know is lost."""
    model = API.deserialize(_Response(obj), type_name)
    return API.sanitize_for_serialization(model)


def diff(a, b, path=""):
    """Paths where a and b differ (fields missing from b, or other values)."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k not in b:
                out.append(f"{path}.{k}: not a field of this object")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{path}[{i}]")
    elif a != b:
        out.append(f"{path}: {a!r} became {b!r}")
    return out


def k8s_errors(obj, type_name, path):
    try:
        return diff(obj, k8s_roundtrip(obj, type_name), path)
    except (ValueError, TypeError) as e:  # a required field missing, a wrong type
        return [f"{path}: {type_name}: {e}"]


def k8s_json_fields(type_name):
    return set(getattr(k8s, type_name).attribute_map.values())


def schema_errors(node, value, path="$"):
    """Errors of `value` against a kserve_crd_schema node (see its docstring)."""
    if isinstance(node, str):
        ok = {"string": str, "bool": bool, "int": int, "map": dict}[node]
        if not isinstance(value, ok) or (node == "int" and isinstance(value, bool)):
            return [f"{path}: expected {node}, got {value!r}"]
        if node == "map" and not all(isinstance(k, str) for k in value):
            return [f"{path}: keys must be strings"]
        return []
    if isinstance(node, tuple) and node[0] == "enum":
        return [] if value in node[1:] else [f"{path}: {value!r} is not one of {list(node[1:])}"]
    if isinstance(node, tuple) and node[0] == "list":
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [e for i, v in enumerate(value) for e in schema_errors(node[1], v, f"{path}[{i}]")]
    if isinstance(node, tuple) and node[0] == "k8s":
        return k8s_errors(value, node[1], path)
    assert isinstance(node, dict), node
    if not isinstance(value, dict):
        return [f"{path}: expected an object"]
    fields = {k.lstrip("!"): v for k, v in node.items() if k != "*inline"}
    required = {k[1:] for k in node if k.startswith("!")}
    inline = node.get("*inline", [])
    errors = [f"{path}.{k}: required" for k in sorted(required) if k not in value]
    inlined = {}
    for k, v in value.items():
        if k in fields:
            errors += schema_errors(fields[k], v, f"{path}.{k}")
        elif any(k in k8s_json_fields(t) for t in inline):
            inlined[k] = v
        else:
            errors.append(f"{path}.{k}: not a field of this object")
    for t in inline:
        part = {k: v for k, v in inlined.items() if k in k8s_json_fields(t)}
        if not part:
            continue
        # Inlined, the class's required fields are optional: give them placeholders.
        filler = {"V1Container": {"name": "x"}, "V1PodSpec": {"containers": []}}[t]
        errors += k8s_errors({**filler, **part}, t, path)
    return errors


# ---- the Deployment and the Service ----------------------------------------------------------


def test_deployment_and_service_are_valid_kubernetes_objects():
    docs = load("inferd.yaml")
    deployment, service = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    assert k8s_errors(deployment, "V1Deployment", "Deployment") == []
    assert k8s_errors(service, "V1Service", "Service") == []

    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    [c] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for p in service["spec"]["ports"]:
        assert p["targetPort"] in ports, p
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    env = {e["name"]: e for e in c["env"]}
    ref = env["INFERD_MEMORY_LIMIT_BYTES"]["valueFrom"]["resourceFieldRef"]
    assert ref == {"containerName": c["name"], "resource": "limits.memory", "divisor": "1"}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])


def k8s_expand(text, env):
    """Kubernetes' expansion of a container's command and args: $(VAR) from the container's
    environment (left alone when undefined), $$ -> $."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def downward_env(container):
    """The container's environment as the kubelet would set it (plain values and the
    resourceFieldRefs this manifest uses; divisor 1, so bytes and whole cores rounded up)."""
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        ref = e["valueFrom"]["resourceFieldRef"]
        kind, resource = ref["resource"].split(".")
        q = parse_quantity(container["resources"][kind][resource]) / parse_quantity(ref["divisor"])
        env[e["name"]] = str(math.ceil(q))
    return env


def wait_metric(url, name, deadline_s=30):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            for line in requests.get(url, timeout=2).text.splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[-1])
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{name} never appeared at {url}")


@pytest.fixture
def inferd_on_path(tmp_path):
    if not INFERD_BIN.exists():
        pytest.skip(f"{INFERD_BIN} is not built")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "inferd").symlink_to(INFERD_BIN)
    return f"{bindir}:{os.environ['PATH']}"


def run_container(command, env, path, tmp_path):
    log = open(tmp_path / "container.log", "wb")
    # Its own session, so that whatever it leaves behind can be ended with it.
    # A sanitized binary (the test command's ASan and TSan stages) keeps its suppressions.
    sanitizers = {k: v for k, v in os.environ.items() if k.endswith("SAN_OPTIONS")}
    proc = subprocess.Popen(command, env={**sanitizers, **env, "PATH": path}, stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc


def stop_container(proc, tmp_path):
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=20)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the command left running
        except ProcessLookupError:
            pass
    assert rc == 0, (tmp_path / "container.log").read_text()[-3000:]


def test_the_deployments_command_sets_the_budget_from_the_memory_limit(
        tmp_path, inferd_on_path, example_models):
    [c] = by_kind(load("inferd.yaml"), "Deployment")["spec"]["template"]["spec"]["containers"]
    env = downward_env(c)
    limit = parse_quantity(c["resources"]["limits"]["memory"])
    assert int(env["INFERD_MEMORY_LIMIT_BYTES"]) == limit
    # The pod's ports and folders, moved to this machine's free ports and a scratch folder.
    http, grpc, metrics = free_port(), free_port(), free_port()
    repo = tmp_path / "repo"
    copy_models(example_models, ["simple"], repo)
    env["INFERD_MODEL_REPOSITORY"] = str(repo)
    cmd = [k8s_expand(x, env) for x in c["command"] + c["args"]]
    moved = [x.replace("--http-port=8000", f"--http-port={http}")
              .replace("--grpc-port=8001", f"--grpc-port={grpc}")
              .replace("--metrics-port=8002", f"--metrics-port={metrics}")
              .replace("/var/cache/inferd", str(tmp_path / "cache")) for x in cmd]
    assert moved != cmd
    proc = run_container(moved, env, inferd_on_path, tmp_path)
    try:
        budget = wait_metric(f"http://127.0.0.1:{metrics}/metrics", "inferd_model_store_budget_bytes")
        percent = int(env["INFERD_MODEL_MEMORY_PERCENT"])
        assert budget == limit // 100 * percent, (budget, limit)
        base = f"http://127.0.0.1:{http}"
        assert requests.get(base + "/v2/health/ready", timeout=5).status_code == 200
        # On demand: the model loads on its first request.
        srv = type("S", (), {"post": lambda self, p, session=None, **kw:
                             requests.post(base + p, timeout=60, **kw)})()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        r = infer(srv, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT0"], 2 * a)
    finally:
        # `exec`: the signal reaches inferd itself, which drains and exits 0.
        stop_container(proc, tmp_path)


# ---- KServe ----------------------------------------------------------------------------------


def test_kserve_objects_match_the_crd_schema_and_each_other():
    docs = load("kserve.yaml")
    runtime, isvc = by_kind(docs, "ServingRuntime"), by_kind(docs, "InferenceService")
    assert schema_errors(crd.SERVING_RUNTIME, runtime) == []
    assert schema_errors(crd.INFERENCE_SERVICE, isvc) == []
    spec = runtime["spec"]
    assert {f["name"] for f in spec["supportedModelFormats"]} >= {"onnx", "pytorch", "triton"}
    assert "v2" in spec["protocolVersions"]
    [c] = spec["containers"]
    assert c["name"] == "kserve-container"  # the name KServe merges the predictor into
    port = c["ports"][0]["containerPort"]
    assert f"--http-port={port}" in c["args"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": port}
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    assert model["protocolVersion"] in spec["protocolVersions"]


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["spec"].__setitem__("suportedModelFormats", d["spec"].pop("supportedModelFormats")),
     "$.spec.suportedModelFormats: not a field"),
    (lambda d: d["spec"].__setitem__("protocolVersions", ["v3"]), "'v3' is not one of"),
    (lambda d: d["spec"]["supportedModelFormats"][0].pop("name"), "supportedModelFormats[0].name: required"),
    (lambda d: d["spec"]["containers"][0].__setitem__("readinesProbe", {}), "readinesProbe: not a field"),
    (lambda d: d["spec"]["containers"][0]["resources"].__setitem__("limit", {}), "resources.limit: not a field"),
])
def test_the_schema_check_catches_mistakes(mutate, expected):
    runtime = copy.deepcopy(by_kind(load("kserve.yaml"), "ServingRuntime"))
    mutate(runtime)
    errors = schema_errors(crd.SERVING_RUNTIME, runtime)
    assert any(expected in e for e in errors), errors


def test_the_serving_runtimes_container_serves_a_repository(tmp_path, inferd_on_path, example_models):
    [c] = by_kind(load("kserve.yaml"), "ServingRuntime")["spec"]["containers"]
    port, grpc, metrics = free_port(), free_port(), free_port()
    repo = tmp_path / "mnt-models"
    copy_models(example_models, ["simple", "identity_fp32"], repo)
    cmd = [x.replace("/mnt/models", str(repo)).replace("--http-port=8080", f"--http-port={port}")
            .replace("--grpc-port=9000", f"--grpc-port={grpc}")
            .replace("--metrics-port=8002", f"--metrics-port={metrics}")
           for x in c["command"] + c["args"]]
    proc = run_container(cmd, {}, inferd_on_path, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(base + c["readinessProbe"]["httpGet"]["path"], timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None, (tmp_path / "container.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.1)
        # Both models were loaded at start (KServe's storage initializer put them there).
        index = requests.post(base + "/v2/repository/index", timeout=10).json()
        assert {e["name"] for e in index if e.get("state") == "READY"} == {"simple", "identity_fp32"}
    finally:
        stop_container(proc, tmp_path)
