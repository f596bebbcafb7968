// The CUDA side of image_preprocess_kernel.h. Only cuda_runtime.h and the shared maths are
// included: nvcc never sees Abseil. The launch returns the cudaError_t as an int; the wrapper
// in image_preprocess_launch.cc turns it into a Status.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/image_preprocess_math.h"

namespace inferd::gpu {
namespace {

namespace math = image_math;

constexpr int kThreadsPerBlock = 256;

// One thread per output element; `total` = out_height * out_width * 3.
__global__ void ImagePreprocessKernel(const uint8_t* __restrict__ pixels,
                                      math::PreprocessParams params, void* __restrict__ out,
                                      int64_t total) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  if (params.uint8_output) {
    static_cast<uint8_t*>(out)[index] = math::Uint8Element(pixels, params, index);
  } else if (params.fp16_output) {
    // binary16 bits, as a __half holds them (HalfBits rounds as __float2half_rn does).
    static_cast<uint16_t*>(out)[index] = math::Fp16Element(pixels, params, index);
  } else {
    static_cast<float*>(out)[index] = math::Fp32Element(pixels, params, index);
  }
}

}  // namespace

// Declared in image_preprocess_launch.cc.
// `device` is the stream's: CUDA's current device is per thread, and a launch into a stream of
// another device than the current one fails, so it is made current first.
int LaunchImagePreprocessCuda(const uint8_t* device_pixels, const math::PreprocessParams& params,
                              void* device_out, int device, void* native_stream,
                              const char** error_text) {
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) {
    *error_text = cudaGetErrorString(error);
    return static_cast<int>(error);
  }
  const int64_t total = math::OutputElements(params);
  const int64_t blocks = (total + kThreadsPerBlock - 1) / kThreadsPerBlock;
  ImagePreprocessKernel<<<static_cast<unsigned int>(blocks), kThreadsPerBlock, 0,
                          static_cast<cudaStream_t>(native_stream)>>>(device_pixels, params,
                                                                     device_out, total);
  error = cudaGetLastError();
  *error_text = cudaGetErrorString(error);
  return static_cast<int>(error);
}

}  // namespace inferd::gpu
