"""SentencePiece tokenizer: TEXT [batch, 1] -> input_ids, attention_mask INT64 [batch, seq]
(padded with id 0 to the longest text of the request)."""

import os

import numpy as np
import sentencepiece as spm
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "spm.model")
        self.sp = spm.SentencePieceProcessor(model_file=path)

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            pieces = [self.sp.encode(t.decode("utf-8")) for t in texts]
            seq = max(1, max(len(p) for p in pieces))
            ids = np.zeros((len(pieces), seq), dtype=np.int64)
            mask = np.zeros((len(pieces), seq), dtype=np.int64)
            for i, p in enumerate(pieces):
                ids[i, :len(p)] = p
                mask[i, :len(p)] = 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]))
        return responses
