// The image preprocessing backend (`backend: "image"`): what NVIDIA DALI does in front of a
// classifier in a Triton ensemble. Each batch item is one encoded JPEG or PNG (a TYPE_UINT8
// [-1] row, or a TYPE_STRING element); the output is the decoded image resized, optionally
// centre-cropped, normalized and laid out as [3,H,W] or [H,W,3] (FP32, FP16 or UINT8). The model
// needs no file: its version folder may be empty. Settings are the config's `parameters`,
// documented in image_transform.h and docs/image_backend.md.
//
// An image that cannot be decoded fails only its request (INVALID_ARGUMENT "image <i>: ...");
// the other requests of the batch are answered. The images of one batch are decoded in
// parallel on up to ThreadCount() threads started for that batch.
//
// GPU instances (`instance_group { kind: KIND_GPU }`, in a build with CUDA): decoding stays on
// the CPU; the decoded pixels of a batch go to the GPU in one copy on the instance's stream
// (from pinned memory), the resize / crop / normalize runs as the CUDA kernel of
// gpu/image_preprocess_kernel.h (the CPU path's arithmetic, so the output is bit for bit the
// CPU instance's), and the output is copied back to the host in one copy, or, with the
// `output_on_gpu` parameter, left on the GPU (OutputTensor::place GPU n, the device buffer held
// by the response).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "backends/backend.h"
#include "gpu/image_preprocess_math.h"
#include "gpu/runtime.h"

namespace inferd::backends {

// Queues one batch item's resize / normalize on `stream` (gpu::LaunchImagePreprocess's
// contract): `pixels` and `out` are device memory of the stream's GPU.
using ImagePreprocessLauncher =
    std::function<absl::Status(const uint8_t* pixels,
                               const gpu::image_math::PreprocessParams& params, void* out,
                               gpu::Stream& stream)>;

struct ImageBackendOptions {
  // The GPUs that GPU instances run on; null: gpu::SystemRuntime() (the runtime placement
  // numbers the devices by). Must outlive the backend.
  gpu::Runtime* runtime = nullptr;
  // The kernel launch; empty: gpu::LaunchImagePreprocess, and GPU instances are offered only
  // when the build has the kernel. Tests with gpu::FakeRuntime (whose device memory is host
  // memory) pass one that calls gpu::ImagePreprocessOnHost.
  ImagePreprocessLauncher launch;
};

std::unique_ptr<Backend> MakeImageBackend(ImageBackendOptions options = {});

}  // namespace inferd::backends
