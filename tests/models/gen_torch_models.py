#!/usr/bin/python3
"""Writes a Triton model repository of TorchScript models for the PyTorch backend tests and
the torch benchmark:  /usr/bin/python3 tests/models/gen_torch_models.py <out_dir>
Idempotent: files that exist are kept. Random weights (torch.manual_seed(0))."""

import shutil
import sys
from pathlib import Path
from typing import Dict

import torch
import torchvision


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(text)


def save(module, path, example=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return
    scripted = torch.jit.trace(module, example) if example is not None else torch.jit.script(module)
    tmp = path.with_suffix(".pt.tmp")
    torch.jit.save(scripted, str(tmp))
    tmp.rename(path)


class TwoIO(torch.nn.Module):
    def forward(self, a, b):
        return a + b, a * b


class NamedArgs(torch.nn.Module):
    def forward(self, x, y):
        return x - y


class DictOut(torch.nn.Module):
    def forward(self, x) -> Dict[str, torch.Tensor]:
        return {"sum": x.sum(1, keepdim=True), "double": x * 2}


class Raises(torch.nn.Module):
    def forward(self, x):
        if bool(x.min() < 0):
            raise RuntimeError("negative input")
        return x


class DictIn(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]):
        return inputs["A"] * 10 + inputs["B"]


class WrongDtype(torch.nn.Module):
    """Returns INT64 although config.pbtxt declares OUTPUT__0 as TYPE_FP32."""

    def forward(self, x):
        return x.to(torch.int64)


def copy_file(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        tmp = dst.with_suffix(dst.suffix + ".tmp")
        shutil.copyfile(src, tmp)
        tmp.rename(dst)


def io(kind, name, dtype, dims):
    return f'{kind} [ {{ name: "{name}" data_type: {dtype} dims: [ {", ".join(map(str, dims))} ] }} ]\n'


def main(out):
    out = Path(out)
    torch.manual_seed(0)

    save(torch.nn.Linear(8, 4).eval(), out / "torch_linear/1/model.pt")
    write(out / "torch_linear/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
          + io("input", "INPUT__0", "TYPE_FP32", [8]) + io("output", "OUTPUT__0", "TYPE_FP32", [4]))

    save(TwoIO(), out / "torch_two_io/1/model.pt")
    write(out / "torch_two_io/config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 4\n'
          'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, '
          '{ name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
          'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, '
          '{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')

    save(NamedArgs(), out / "torch_named_args/1/model.pt")
    write(out / "torch_named_args/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 0\n'
          'input [ { name: "y" data_type: TYPE_INT64 dims: [ 3 ] }, '
          '{ name: "x" data_type: TYPE_INT64 dims: [ 3 ] } ]\n'
          + io("output", "OUTPUT__0", "TYPE_INT64", [3]))

    save(DictOut(), out / "torch_dict_out/1/model.pt")
    write(out / "torch_dict_out/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
          + io("input", "INPUT__0", "TYPE_FP32", [5])
          + 'output [ { name: "sum" data_type: TYPE_FP32 dims: [ 1 ] }, '
            '{ name: "double" data_type: TYPE_FP32 dims: [ 5 ] } ]\n')

    save(DictIn(), out / "torch_dict_in/1/model.pt")
    write(out / "torch_dict_in/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
          'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, '
          '{ name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
          + io("output", "OUTPUT__0", "TYPE_FP32", [2]))

    save(Raises(), out / "torch_raises/1/model.pt")
    write(out / "torch_raises/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
          + io("input", "INPUT__0", "TYPE_FP32", [2]) + io("output", "OUTPUT__0", "TYPE_FP32", [2]))

    bad = out / "torch_bad_file/1/model.pt"
    bad.parent.mkdir(parents=True, exist_ok=True)
    if not bad.exists():
        bad.write_bytes(b"this is not a TorchScript archive")
    write(out / "torch_bad_file/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
          + io("input", "INPUT__0", "TYPE_FP32", [2]) + io("output", "OUTPUT__0", "TYPE_FP32", [2]))

    params = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in [
        ("INFERENCE_MODE", "false"), ("DISABLE_OPTIMIZED_EXECUTION", "true"),
        ("ENABLE_JIT_PROFILING", "false"), ("ENABLE_TENSOR_FUSER", "false"),
        ("ENABLE_JIT_EXECUTOR", "false"), ("INTER_OP_THREAD_COUNT", "1"),
        ("ENABLE_CACHE_CLEANING", "true"), ("DISABLE_CUDNN", "true"),
        ("ENABLE_WEIGHT_SHARING", "true")])
    # The same weights as torch_linear (a copy of its model.pt), with every backend parameter set.
    copy_file(out / "torch_linear/1/model.pt", out / "torch_params/1/model.pt")
    write(out / "torch_params/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
          + io("input", "INPUT__0", "TYPE_FP32", [8]) + io("output", "OUTPUT__0", "TYPE_FP32", [4])
          + 'instance_group [ { count: 2 kind: KIND_CPU } ]\n' + params)

    save(WrongDtype(), out / "torch_wrong_dtype/1/model.pt")
    write(out / "torch_wrong_dtype/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
          + io("input", "INPUT__0", "TYPE_FP32", [2]) + io("output", "OUTPUT__0", "TYPE_FP32", [2]))

    resnet = out / "torch_resnet50/1/model.pt"
    if not resnet.exists():
        model = torchvision.models.resnet50().eval()
        with torch.no_grad():
            save(model, resnet, torch.rand(1, 3, 224, 224))
    write(out / "torch_resnet50/config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
          + io("input", "INPUT__0", "TYPE_FP32", [3, 224, 224])
          + io("output", "OUTPUT__0", "TYPE_FP32", [1000])
          + 'dynamic_batching { }\n'
          + 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "2" } }\n')


if __name__ == "__main__":
    main(sys.argv[1])
