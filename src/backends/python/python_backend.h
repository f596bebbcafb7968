// The Python backend: runs Triton's `model.py` files (class TritonPythonModel) unchanged. Each
// instance is its own Python process (src/backends/python/stub), started in parallel at load,
// talking to inferd over a socketpair (one round trip per execute) with tensors in a memfd
// mapping that grows as tensors need (never /dev/shm). A process that dies is restarted; while
// it is down the instance is not ready. BLS calls from Python go back into the server through
// ModelSpec::dispatch. See docs/python_backend.md.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "gpu/runtime.h"

namespace inferd::backends {

// `gpus`: the device layer whose GPU inputs model.py may receive as CUDA tensors
// (FORCE_CPU_ONLY_INPUT_TENSORS 'no'); null for gpu::SystemRuntime(). Tests pass a
// gpu::FakeRuntime.
std::unique_ptr<Backend> MakePythonBackend(gpu::Runtime* gpus = nullptr);

// Triton's Python-based backend: `model_py` (<backend directory>/<name>/model.py) runs, as
// a Python backend model.py, for every model whose config says `backend: "<name>"` (vLLM's
// backend is one). The models' folders hold what that code reads (model.json...).
std::unique_ptr<Backend> MakePythonBasedBackend(std::string name, std::string model_py);

// Where the stub and triton_python_backend_utils.py are: $INFERD_PYTHON_BACKEND_DIR, else
// <exe dir>/python_backend, else <exe dir>/../lib/inferd/python_backend, else the source tree.
std::string PythonStubDirectory();

}  // namespace inferd::backends
