// The image backend's resize / centre crop / normalize / layout step as a CUDA kernel: one
// thread per output element, the arithmetic of image_preprocess_math.h (the same functions the
// CPU path calls, so the output equals the CPU's bit for bit). Decoding stays on the CPU.
//
// Built into inferd_gpu_image: the kernel when the build has CUDA (INFERD_WITH_CUDA), else a
// LaunchImagePreprocess that answers UNIMPLEMENTED. Called by the image backend's GPU instances
// (backends/image/image_backend.cc).
#ifndef INFERD_GPU_IMAGE_PREPROCESS_KERNEL_H_
#define INFERD_GPU_IMAGE_PREPROCESS_KERNEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "gpu/image_preprocess_math.h"
#include "gpu/runtime.h"

namespace inferd::gpu {

// Whether this build has the kernel (the CUDA toolkit was found at configure time).
bool ImagePreprocessKernelBuilt();

// Queues, on `stream`, one item of the output: `params.out_height * params.out_width * 3`
// elements (FP32, UINT8 when params.uint8_output, FP16 bits when params.fp16_output) written to `device_out`, from the decoded
// HWC image `device_pixels` (params.src_height x params.src_width x 3 uint8, packed rows). Both
// pointers are device memory on the stream's device and must stay valid until the stream is
// synchronized. INVALID_ARGUMENT for sizes that are not positive, UNIMPLEMENTED without CUDA
// in the build, the launch error otherwise (errors inside the kernel surface at Synchronize).
absl::Status LaunchImagePreprocess(const uint8_t* device_pixels,
                                   const image_math::PreprocessParams& params, void* device_out,
                                   Stream& stream);

// What the kernel computes, as a loop on the host over every output element (each iteration is
// one kernel thread's body), from host `pixels` to host `out`. For tests with gpu::FakeRuntime,
// whose device memory is host memory: the image backend's GPU path runs end to end there with
// this in place of the launch. INVALID_ARGUMENT for the sizes LaunchImagePreprocess refuses.
absl::Status ImagePreprocessOnHost(const uint8_t* pixels,
                                   const image_math::PreprocessParams& params, void* out);

}  // namespace inferd::gpu

#endif  // INFERD_GPU_IMAGE_PREPROCESS_KERNEL_H_
