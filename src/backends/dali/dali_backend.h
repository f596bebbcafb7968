// The `dali` backend: serves Triton DALI-backend models unchanged, without DALI. A model's
// version folder holds `model.dali` (DALI's serialized pipeline) or `dali.py` (a pipeline
// marked @autoserialize, serialized at load by running it with /usr/bin/python3 and inferd's
// own small `nvidia.dali` package, src/backends/dali/pydali). inferd runs the pipeline's
// operators on the CPU with its own image code (dali_ops.h); see docs/dali.md.
//
// Inputs map to the pipeline's ExternalSource operators by name; outputs to the pipeline's
// outputs by position, as in Triton's DALI backend. Each request's samples are one slice of
// the batch; a sample that fails (an undecodable image) fails only its request.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace inferd::backends {

std::unique_ptr<Backend> MakeDaliBackend();

namespace dali {

// Runs `dali_py` with inferd's nvidia.dali package and returns the serialized pipeline of its
// @autoserialize function. Starts `python` (no shell) and waits for it.
absl::StatusOr<std::string> SerializeDaliPy(const std::string& python,
                                            const std::string& dali_py);

// Where inferd's nvidia.dali package lives: $INFERD_DALI_PYTHON_DIR, <exe>/dali_python,
// <exe>/../lib/inferd/dali_python, else the source tree.
std::string PyDaliDirectory();

}  // namespace dali
}  // namespace inferd::backends
