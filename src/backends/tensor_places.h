// Where tensors move between memory places: the edge copies of the GPU data path (issue 30).
//
// The rule, for every layer:
//   - An InputTensor whose place is GPU n reaches only an instance that takes GPU inputs on
//     GPU n (ModelInstance::GpuInputsOn); the server copies it to the host once, before
//     validation, for any other (PlaceInputsFor). BYTES inputs are always host bytes: their
//     elements are parsed on the CPU.
//   - An OutputTensor whose place is GPU n holds bytes in GPU n's memory, complete (its producer
//     waited for its stream before answering) and valid while `holder` lives. It stays on the
//     GPU only for a consumer that reads GPU bytes: a CUDA shared-memory region (copied
//     device-to-device into it), or an ensemble, which hands it to its next step (and that
//     step's server entry copies it to the host when the step's instances do not take GPU
//     inputs on GPU n). Any instance may answer on a GPU a request marked
//     InferRequest::gpu_outputs_ok (an ensemble's step); one that may do so for any request
//     says ModelInstance::OutputsMayBeOnGpu. Every other consumer (HTTP/gRPC serialization, system shared memory,
//     classification, the response cache, a CPU step) gets host bytes: the server, or the
//     ensemble for its own outputs, calls MakeOutputsHostReadable before handing the response
//     on, so code that never heard of GPUs keeps reading `data` as host bytes.
//   - Host-only requests pay a branch on `place` per tensor: no allocation, no lock.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "backends/backend.h"
#include "core/infer_request.h"
#include "gpu/runtime.h"

namespace inferd::backends {

// Whether a model whose instances take GPU inputs on `gpu_inputs_on` (Model::gpu_inputs_on:
// a GPU, kAnyGpu, or nullopt for host inputs only) reads an input on GPU `device` where it is.
inline bool TakesGpuInputOn(std::optional<int> gpu_inputs_on, int device) {
  return gpu_inputs_on.has_value() && (*gpu_inputs_on == kAnyGpu || *gpu_inputs_on == device);
}

// Copies to host memory each input of `request` whose place is a GPU other than
// `gpu_inputs_on` (TakesGpuInputOn; every GPU input when it is nullopt; a BYTES input on any
// GPU), one
// device-to-host copy each, waited for; the host bytes are held by request->holders and the
// tensor's place becomes CPU. Inputs on the host are untouched. INTERNAL naming the input when
// a copy fails (or `gpus` is null with a GPU input).
absl::Status PlaceInputsFor(gpu::Runtime* gpus, core::InferRequest* request,
                            std::optional<int> gpu_inputs_on);

// Copies each output of `response` whose place is a GPU to host memory (one device-to-host
// copy, waited for), except those `keep_on_gpu` accepts; the copy replaces the output's data
// and holder, and its place becomes CPU. On a failed copy the response fails (its status
// INTERNAL naming the output, its outputs cleared) and false is returned.
bool MakeOutputsHostReadable(gpu::Runtime* gpus, core::InferResponse* response,
                             absl::FunctionRef<bool(const core::OutputTensor&)> keep_on_gpu);
bool MakeOutputsHostReadable(gpu::Runtime* gpus, core::InferResponse* response);

// Whether an instance on GPU `device` may leave output `name` of `request` in its device memory:
// the request's consumer reads GPU bytes (an ensemble's step, InferRequest::gpu_outputs_ok),
// the output goes into a CUDA shared-memory region on that GPU (RequestedOutput::
// gpu_region_on: one device-to-device copy at the edge instead of device-to-host and
// host-to-device), or the request does not ask for the output at all.
bool OutputMayStayOnGpu(const core::InferRequest& request, std::string_view name, int device);
// The same for every request of a batch (false for an empty batch): the batch's output is one
// buffer, on the GPU or on the host for all of them.
bool BatchOutputMayStayOnGpu(std::span<core::InferRequest* const> requests, std::string_view name,
                             int device);

// True when some output of `response` is on a GPU: the branch the callers take before the
// copies above, cheap enough for every response.
inline bool AnyOutputOnGpu(const core::InferResponse& response) {
  for (const auto& out : response.outputs) {
    if (!out.place.OnHost()) return true;
  }
  return false;
}

}  // namespace inferd::backends
