#!/usr/bin/env python3
"""Models and configs for the GPU checks (issue 29), generated where they run (torch, torchvision
and onnx are on the GPU machine; nothing is downloaded: random weights, seeded).

  make_models.py <repository folder>

writes, each model file once (a second call only rewrites the configs):
  resnet50_onnx/1/model.onnx          ResNet-50, input "input" [B,3,224,224] -> "output" [B,1000]
  resnet50_torch/1/model.pt           the same weights traced to TorchScript (INPUT__0 -> OUTPUT__0)
  bert_like_onnx/1/model.onnx         a small BERT-like encoder: input_ids, attention_mask
                                      INT64 [B,128] -> last_hidden_state FP32 [B,128,256]
and for each, configs of the same file on the GPU (`<name>_gpu`: KIND_GPU, dynamic batching) and
on the CPU (`<name>_cpu`: KIND_CPU, dynamic batching), sharing the model file by a hard link
(inferd refuses a model file that is a symlink leading out of its model folder). And the
image_classifier ensemble of examples/model_repository with its preprocessing (backend "image",
no model file) on the GPU or the CPU, the classifier the same GPU ResNet-50 in both:
  image_preprocess_gpu / _cpu         JPEG/PNG -> [3,224,224] FP32 (the torchvision transform)
  image_preprocess_gpu_keep           the GPU one with output_on_gpu "true" (the output stays
                                      on the GPU: for when the server copies at the edge)
  image_classifier_gpu / _cpu         ensemble: image_preprocess_<x> -> resnet50_onnx_gpu
Exits 0; prints what it wrote. Importable: generate(root) returns the model names written.
"""

import os
import sys

MAX_BATCH = 32
SEQ = 128
HIDDEN = 256


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _config(name, platform, inputs, outputs, kind, extra=""):
    def io(kind_, entries):
        parts = []
        for n, t, dims in entries:
            parts.append(f'  {{ name: "{n}" data_type: {t} dims: [ {", ".join(map(str, dims))} ] }}')
        return f"{kind_} [\n" + ",\n".join(parts) + "\n]\n"

    return (f'name: "{name}"\nplatform: "{platform}"\nmax_batch_size: {MAX_BATCH}\n'
            + io("input", inputs) + io("output", outputs)
            + f"instance_group [ {{ kind: {kind} count: 1 }} ]\n"
            # No queue delay: a lone request runs at once (the batch-1 latency figure), and
            # requests queued while the instance is busy form the next batch (concurrency 16).
            + "dynamic_batching { }\n" + extra)


def _export_onnx(torch, model, args, path, input_names, output_names, dynamic_axes):
    tmp = path + ".tmp"
    kwargs = dict(opset_version=17, input_names=input_names, output_names=output_names,
                  dynamic_axes=dynamic_axes, do_constant_folding=True)
    try:
        # The TorchScript-based exporter: no onnxscript needed, dynamic axes as named.
        torch.onnx.export(model, args, tmp, dynamo=False, **kwargs)
    except TypeError:  # a torch older than the `dynamo` argument (Debian's 1.13)
        torch.onnx.export(model, args, tmp, **kwargs)
    os.replace(tmp, path)


def _variants(root, name, model_file, platform, inputs, outputs, extra_gpu=""):
    for suffix, kind, extra in (("gpu", "KIND_GPU", extra_gpu), ("cpu", "KIND_CPU", "")):
        variant = f"{name}_{suffix}"
        _write(os.path.join(root, variant, "config.pbtxt"),
               _config(variant, platform, inputs, outputs, kind, extra))
        default_name = "model.pt" if platform == "pytorch_libtorch" else "model.onnx"
        link = os.path.join(root, variant, "1", default_name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.lexists(link):
            try:
                os.link(model_file, link)
            except OSError:
                import shutil
                shutil.copyfile(model_file, link)


def generate(root):
    import torch
    import torchvision

    os.makedirs(root, exist_ok=True)
    torch.manual_seed(0)
    written = []

    # ResNet-50, random weights: ONNX and TorchScript of the same weights.
    onnx_path = os.path.join(root, "files", "resnet50.onnx")
    pt_path = os.path.join(root, "files", "resnet50.pt")
    os.makedirs(os.path.dirname(onnx_path), exist_ok=True)
    if not (os.path.exists(onnx_path) and os.path.exists(pt_path)):
        model = torchvision.models.resnet50(weights=None).eval()
        example = torch.randn(1, 3, 224, 224)
        with torch.no_grad():
            _export_onnx(torch, model, (example,), onnx_path, ["input"], ["output"],
                         {"input": {0: "batch"}, "output": {0: "batch"}})
            traced = torch.jit.trace(model, example)
        traced.save(pt_path)
        print("wrote", onnx_path, pt_path)
    _variants(root, "resnet50_onnx", onnx_path, "onnxruntime_onnx",
              [("input", "TYPE_FP32", [3, 224, 224])], [("output", "TYPE_FP32", [1000])])
    # Triton's PyTorch naming (INPUT__0 / OUTPUT__0).
    _variants(root, "resnet50_torch", pt_path, "pytorch_libtorch",
              [("INPUT__0", "TYPE_FP32", [3, 224, 224])], [("OUTPUT__0", "TYPE_FP32", [1000])])
    written += ["resnet50_onnx", "resnet50_torch"]

    # A small BERT-like encoder (the articles' text model's shape: token ids and mask in,
    # hidden states out), 4 layers of width 256.
    bert_path = os.path.join(root, "files", "bert_like.onnx")
    if not os.path.exists(bert_path):
        # Plain operators (no nn.TransformerEncoder: its fused inference path does not export).
        class Layer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
                self.out = torch.nn.Linear(HIDDEN, HIDDEN)
                self.ff1 = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
                self.ff2 = torch.nn.Linear(4 * HIDDEN, HIDDEN)
                self.ln1 = torch.nn.LayerNorm(HIDDEN)
                self.ln2 = torch.nn.LayerNorm(HIDDEN)

            def forward(self, x, bias):
                b, s = x.shape[0], x.shape[1]
                q, k, v = self.qkv(x).reshape(b, s, 3, 4, HIDDEN // 4).permute(2, 0, 3, 1, 4).unbind(0)
                att = torch.softmax(q @ k.transpose(-1, -2) * (HIDDEN // 4) ** -0.5 + bias, -1)
                y = (att @ v).transpose(1, 2).reshape(b, s, HIDDEN)
                x = self.ln1(x + self.out(y))
                return self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.tokens = torch.nn.Embedding(30522, HIDDEN)
                self.positions = torch.nn.Embedding(SEQ, HIDDEN)
                self.layers = torch.nn.ModuleList([Layer() for _ in range(4)])

            def forward(self, input_ids, attention_mask):
                pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
                x = self.tokens(input_ids) + self.positions(pos)
                bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
                for layer in self.layers:
                    x = layer(x, bias)
                return x

        enc = Encoder().eval()
        ids = torch.randint(0, 30522, (2, SEQ))
        mask = torch.ones(2, SEQ, dtype=torch.int64)
        with torch.no_grad():
            _export_onnx(torch, enc, (ids, mask), bert_path, ["input_ids", "attention_mask"],
                         ["last_hidden_state"],
                         {"input_ids": {0: "batch"}, "attention_mask": {0: "batch"},
                          "last_hidden_state": {0: "batch"}})
        print("wrote", bert_path)
    _variants(root, "bert_like_onnx", bert_path, "onnxruntime_onnx",
              [("input_ids", "TYPE_INT64", [SEQ]), ("attention_mask", "TYPE_INT64", [SEQ])],
              [("last_hidden_state", "TYPE_FP32", [SEQ, HIDDEN])])
    written.append("bert_like_onnx")
    written += _image_models(root)
    return written


def _image_models(root):
    """The image_classifier ensemble with preprocessing on the GPU or the CPU (same settings as
    examples/model_repository/image_preprocess; both classify on resnet50_onnx_gpu)."""
    params = "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in (("resize_mode", "shorter_side_center_crop"), ("resize_shorter", "256"),
                     ("mean", "0.485,0.456,0.406"), ("std", "0.229,0.224,0.225")))
    # Decoding stays on the CPU either way: two instances keep cores decoding while one
    # batch is on the GPU; the CPU variant gets as many, each decoding with cores / 2 threads.
    for variant, group, extra in (
            ("gpu", "instance_group [ { kind: KIND_GPU count: 2 } ]", ""),
            ("gpu_keep", "instance_group [ { kind: KIND_GPU count: 2 } ]",
             'parameters { key: "output_on_gpu" value: { string_value: "true" } }\n'),
            ("cpu", "instance_group [ { kind: KIND_CPU count: 2 } ]", "")):
        name = f"image_preprocess_{variant}"
        _write(os.path.join(root, name, "1", ".keep"), "")
        _write(os.path.join(root, name, "config.pbtxt"), f"""name: "{name}"
backend: "image"
max_batch_size: {MAX_BATCH}
input [ {{ name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "PREPROCESSED" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
{group}
dynamic_batching {{ }}
{params}{extra}""")
    for variant in ("gpu", "gpu_keep", "cpu"):
        name = f"image_classifier_{variant}"
        _write(os.path.join(root, name, "1", ".keep"), "")
        _write(os.path.join(root, name, "config.pbtxt"), f"""name: "{name}"
platform: "ensemble"
max_batch_size: {MAX_BATCH}
input [ {{ name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
output [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "image_preprocess_{variant}"
      model_version: -1
      input_map {{ key: "IMAGE" value: "IMAGE" }}
      output_map {{ key: "PREPROCESSED" value: "preprocessed_image" }}
    }},
    {{
      model_name: "resnet50_onnx_gpu"
      model_version: -1
      input_map {{ key: "input" value: "preprocessed_image" }}
      output_map {{ key: "output" value: "SCORES" }}
    }}
  ]
}}
""")
    return [f"image_{kind}_{v}" for kind in ("preprocess", "classifier")
            for v in ("gpu", "gpu_keep", "cpu")]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print("models:", ", ".join(generate(sys.argv[1])))
