// The ONNX Runtime backend (platform "onnxruntime_onnx", backend "onnxruntime"): one
// Ort::Session per instance, inputs as tensors over the request bytes (no copy), outputs kept
// alive in the response without a copy.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace inferd::backends {

std::unique_ptr<Backend> MakeOnnxRuntimeBackend();

}  // namespace inferd::backends
