// The image preprocessing backend (`backend: "image"`): what NVIDIA DALI does in front of a
// classifier in a Triton ensemble. Each batch item is one encoded JPEG or PNG (a TYPE_UINT8
// [-1] row, or a TYPE_STRING element); the output is the decoded image resized, optionally
// centre-cropped, normalized and laid out as [3,H,W] or [H,W,3] (FP32 or UINT8). The model
// needs no file: its version folder may be empty. Settings are the config's `parameters`,
// documented in image_transform.h and docs/image_backend.md.
//
// An image that cannot be decoded fails only its request (INVALID_ARGUMENT "image <i>: ...");
// the other requests of the batch are answered. The images of one batch are decoded in
// parallel on up to ThreadCount() threads started for that batch.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace inferd::backends {

std::unique_ptr<Backend> MakeImageBackend();

}  // namespace inferd::backends
