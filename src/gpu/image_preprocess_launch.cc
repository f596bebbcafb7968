// The host side of image_preprocess_kernel.h: checks the arguments and calls the kernel's launch
// in image_preprocess_kernel.cu (compiled only with INFERD_GPU_IMAGE_KERNEL), turning its CUDA
// error into a Status.
#include "gpu/image_preprocess_kernel.h"

#include <cstdint>
#include <string>

#include "common/strings.h"

namespace inferd::gpu {

#if defined(INFERD_GPU_IMAGE_KERNEL)
int LaunchImagePreprocessCuda(const uint8_t* device_pixels,
                              const image_math::PreprocessParams& params, void* device_out,
                              void* native_stream, const char** error_text);
#endif

bool ImagePreprocessKernelBuilt() {
#if defined(INFERD_GPU_IMAGE_KERNEL)
  return true;
#else
  return false;
#endif
}

absl::Status LaunchImagePreprocess(const uint8_t* device_pixels,
                                   const image_math::PreprocessParams& params, void* device_out,
                                   Stream& stream) {
  const auto& p = params;
  if (p.src_width <= 0 || p.src_height <= 0 || p.out_width <= 0 || p.out_height <= 0 ||
      p.resized_width <= 0 || p.resized_height <= 0 || p.crop_left < 0 || p.crop_top < 0 ||
      p.crop_left + p.out_width > p.resized_width ||
      p.crop_top + p.out_height > p.resized_height) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "image preprocess kernel: bad sizes: source ", p.src_width, "x", p.src_height,
        ", resized ", p.resized_width, "x", p.resized_height, ", window ", p.out_width, "x",
        p.out_height, " at (", p.crop_left, ",", p.crop_top, ")"));
  }
  if (device_pixels == nullptr || device_out == nullptr) {
    return absl::InvalidArgumentError("image preprocess kernel: null device pointer");
  }
#if defined(INFERD_GPU_IMAGE_KERNEL)
  const char* error_text = "";
  const int error = LaunchImagePreprocessCuda(device_pixels, params, device_out,
                                              stream.native_handle(), &error_text);
  if (error != 0) {
    return absl::InternalError(inferd::StrCat("image preprocess kernel launch on GPU ",
                                              stream.device(), " failed: CUDA error ", error,
                                              " (", error_text, ")"));
  }
  return absl::OkStatus();
#else
  (void)stream;
  return absl::UnimplementedError(
      "image preprocess kernel: this build has no CUDA (configure with -DINFERD_WITH_CUDA=ON)");
#endif
}

}  // namespace inferd::gpu
