"""npm s3rver (installed by scripts/setup.sh) on a loopback port with one bucket, `models`: the
S3 server every S3 test talks to. stop() and start() keep its data, so a test can take S3 away
and bring it back on the same port. The `s3` fixture in conftest.py points inferd's AWS_*
variables at it."""

import os
import subprocess
import time
from pathlib import Path

import requests

from conftest import free_port

CACHE = Path(os.environ.get("INFERD_CACHE_DIR",
                            Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferd"))
BINARY = CACHE / "s3rver-3.7.1/node_modules/.bin/s3rver"


class S3Server:
    def __init__(self, data_dir):
        assert BINARY.exists(), f"{BINARY} is missing: run scripts/setup.sh"
        self.data = Path(data_dir)
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def env(self):
        """The AWS variables that point inferd (and inferd-pack) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "S3RVER",
                "AWS_SECRET_ACCESS_KEY": "S3RVER", "AWS_REGION": "us-east-1"}

    def start(self):
        # s3rver 3.7.1 makes its continuation tokens with DES, which Node 17+ (OpenSSL 3) offers
        # only through the legacy provider: without it a truncated listing is a 500.
        self.proc = subprocess.Popen(
            [str(BINARY), "-d", str(self.data), "-a", "127.0.0.1", "-p", str(self.port),
             "--configure-bucket", "models", "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"})
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(self.endpoint + "/models", timeout=2).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline and self.proc.poll() is None, "s3rver did not start"
            time.sleep(0.2)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def put(self, key, data):
        r = requests.put(f"{self.endpoint}/models/{key}", data=data,
                         headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}, timeout=60)
        assert r.status_code == 200, r.text

    def put_model(self, prefix, src, name=None):
        """A model folder's config.pbtxt and 1/model.onnx under `prefix`; `name` renames it in
        the config (the folder name must match it)."""
        cfg = (Path(src) / "config.pbtxt").read_text()
        if name is not None:
            cfg = cfg.replace(f'"{Path(src).name}"', f'"{name}"', 1)
        self.put(f"{prefix}/config.pbtxt", cfg.encode())
        self.put(f"{prefix}/1/model.onnx", (Path(src) / "1" / "model.onnx").read_bytes())
