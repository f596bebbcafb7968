// The PyTorch backend (platform "pytorch_libtorch", backend "pytorch"): TorchScript modules
// run on LibTorch, with Triton's PyTorch-backend conventions for tensor names (INPUT__0,
// forward() argument names, a Dict[str, Tensor] input) and outputs (a tensor, a tuple/list,
// or a dict). LibTorch headers appear only in this folder's .cc file.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace inferd::backends {

std::unique_ptr<Backend> MakeLibTorchBackend();

}  // namespace inferd::backends
