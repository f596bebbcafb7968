"""Command-line flags (tritonserver's names) and process behaviour."""

import subprocess

import numpy as np

from conftest import INFERD_BIN, free_port
from v2client import assert_4xx, infer, make_input, parse_response


def run_to_exit(args, timeout=30):
    try:
        p = subprocess.run([str(INFERD_BIN)] + args, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"inferd {' '.join(args)} did not exit within {timeout}s")
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def test_unknown_flag_exits_nonzero(make_repo):
    repo = make_repo({"simple": "simple"})
    rc, out = run_to_exit([f"--model-repository={repo}", f"--http-port={free_port()}",
                           "--no-such-flag=1"])
    assert rc != 0, out
    assert "no-such-flag" in out


def test_missing_repository_flag_exits_nonzero():
    rc, out = run_to_exit([f"--http-port={free_port()}"])
    assert rc != 0, out


def test_misc_flags_accepted(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo, ["--http-thread-count=2", "--log-verbose=1",
                                "--log-format=default", "--exit-on-error=true",
                                "--strict-readiness=true", "--http-max-input-size=67108864"])
    srv.wait_until(lambda: srv.get("/v2/health/ready").status_code == 200, 30, "ready")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer(srv, "simple", [make_input("INPUT0", a, "INT32"), make_input("INPUT1", a, "INT32")])
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(parse_response(r)[1]["OUTPUT1"], a - a)


def test_disable_auto_complete_config(server_factory, make_repo):
    """Without auto-complete a model with no config.pbtxt cannot load; others still do."""
    repo = make_repo({"simple": "simple", "add_sub_autocomplete": "add_sub_autocomplete"})
    srv = server_factory(repo, ["--disable-auto-complete-config", "--exit-on-error=false"])
    srv.wait_until(lambda: srv.get("/v2/models/simple/ready").status_code == 200, 30,
                   "simple to be ready")
    assert_4xx(srv.get("/v2/models/add_sub_autocomplete/ready"))
    entries = [e for e in srv.post("/v2/repository/index", json={}).json()
               if e["name"] == "add_sub_autocomplete"]
    assert entries and all(e.get("state") != "READY" for e in entries), entries


def test_sigterm_while_idle_exits_cleanly(server_factory, make_repo):
    repo = make_repo({"simple": "simple"})
    srv = server_factory(repo)
    assert srv.is_live()
    rc = srv.stop()
    assert rc == 0, srv.log()
