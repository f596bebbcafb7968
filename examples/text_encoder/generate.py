#!/usr/bin/env python3
"""Generates the text_encoder example's model files into a repository folder (default: the
`repository` folder beside this script): a SentencePiece vocabulary trained on a small built-in
corpus (tokenizer/1/spm.model) and a BERT-like encoder with random weights exported to ONNX
(encoder/1/model.onnx: input_ids, attention_mask INT64 [batch, seq] -> last_hidden_state
FP32 [batch, seq, HIDDEN]). The configs and model.py files are committed; these are not.

    /usr/bin/python3 examples/text_encoder/generate.py [REPOSITORY]
"""

import io
import os
import sys

HIDDEN = 32
VOCAB = 128
SEED = 7

CORPUS = """
Triton model repositories hold one folder per model with a config and numbered versions.
A tokenizer turns text into token ids; an encoder turns ids into one vector per token.
Mean pooling averages the token vectors where the attention mask is one.
The quick brown fox jumps over the lazy dog while the server answers requests.
Inference servers batch requests, schedule instances and return tensors to clients.
Python steps do pre and post processing around models in an ensemble.
Shared memory moves tensor bytes between processes without copying them through sockets.
Embeddings of similar sentences point in similar directions in the vector space.
""".strip().splitlines()


def build_encoder():
    import torch

    class Encoder(torch.nn.Module):
        """Token + position embeddings, one masked self-attention block, a feed-forward block."""

        def __init__(self):
            super().__init__()
            self.tok = torch.nn.Embedding(VOCAB, HIDDEN)
            self.pos = torch.nn.Embedding(128, HIDDEN)
            self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
            self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
            self.ln1 = torch.nn.LayerNorm(HIDDEN)
            self.ff1 = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
            self.ff2 = torch.nn.Linear(4 * HIDDEN, HIDDEN)
            self.ln2 = torch.nn.LayerNorm(HIDDEN)

        def forward(self, input_ids, attention_mask):
            seq = input_ids.shape[1]
            positions = torch.arange(seq, device=input_ids.device).unsqueeze(0)
            x = self.tok(input_ids) + self.pos(positions)
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = torch.matmul(q, k.transpose(1, 2)) / (HIDDEN ** 0.5)
            bias = (1.0 - attention_mask.unsqueeze(1).to(x.dtype)) * -10000.0
            attn = torch.softmax(scores + bias, dim=-1)
            x = self.ln1(x + self.proj(torch.matmul(attn, v)))
            x = self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))
            return x

    torch.manual_seed(SEED)
    return Encoder().eval()


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                               "repository")
    import sentencepiece as spm
    import torch

    spm_path = os.path.join(root, "tokenizer", "1", "spm.model")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 4), model_writer=model,
                                   vocab_size=100, model_type="unigram", hard_vocab_limit=False,
                                   character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2,
                                   eos_id=3, minloglevel=2)
    os.makedirs(os.path.dirname(spm_path), exist_ok=True)
    with open(spm_path, "wb") as f:
        f.write(model.getvalue())

    onnx_path = os.path.join(root, "encoder", "1", "model.onnx")
    os.makedirs(os.path.dirname(onnx_path), exist_ok=True)
    enc = build_encoder()
    ids = torch.ones(2, 5, dtype=torch.int64)
    mask = torch.ones(2, 5, dtype=torch.int64)
    torch.onnx.export(enc, (ids, mask), onnx_path, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], opset_version=14,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                    "attention_mask": {0: "batch", 1: "seq"},
                                    "last_hidden_state": {0: "batch", 1: "seq"}})
    print("wrote", spm_path, onnx_path)


if __name__ == "__main__":
    main()
