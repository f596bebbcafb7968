"""examples/text_encoder: Python tokenizer (SentencePiece) -> ONNX encoder -> Python mean pooling
as one ensemble. The embedding is checked against the same steps run directly: SentencePiece
in this process, the encoder in torch (rebuilt from the generator's seed), pooling in numpy."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from v2client import infer, make_input, parse_response

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "text_encoder"

spm = pytest.importorskip("sentencepiece")


def load_generator():
    spec = importlib.util.spec_from_file_location("text_encoder_generate", EXAMPLE / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_text_encoder_matches_direct_computation(tmp_path, server_factory):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE / "repository", repo)
    subprocess.run([sys.executable, str(EXAMPLE / "generate.py"), str(repo)], check=True,
                   stdout=subprocess.DEVNULL)
    srv = server_factory(repo)
    srv.wait_until(lambda: srv.get("/v2/models/text_encoder/ready").status_code == 200, 60,
                   "text_encoder ready")
    texts = ["The quick brown fox answers requests.", "Mean pooling of token vectors"]

    import torch
    gen = load_generator()
    encoder = gen.build_encoder()
    sp = spm.SentencePieceProcessor(model_file=str(repo / "tokenizer" / "1" / "spm.model"))
    for text in texts:
        resp = infer(srv, "text_encoder", [make_input(
            "TEXT", np.array([[text.encode()]], dtype=np.object_), "BYTES")])
        assert resp.status_code == 200, resp.text
        got = parse_response(resp)[1]["EMBEDDING"]
        assert got.shape == (1, gen.HIDDEN)

        ids = np.array([sp.encode(text)], dtype=np.int64)
        mask = np.ones_like(ids)
        with torch.no_grad():
            hidden = encoder(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        want = hidden.mean(axis=1)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Different texts, different embeddings (the pipeline is not constant).
    a, b = [parse_response(infer(srv, "text_encoder", [make_input(
        "TEXT", np.array([[t.encode()]], dtype=np.object_), "BYTES")]))[1]["EMBEDDING"]
        for t in texts]
    assert np.abs(a - b).max() > 1e-3
