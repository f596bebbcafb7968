// The host side of image_preprocess_kernel.h: checks the arguments and calls the kernel's launch
// in image_preprocess_kernel.cu (compiled only with INFERD_GPU_IMAGE_KERNEL), turning its CUDA
// error into a Status; and the kernel's per-thread body as a host loop (ImagePreprocessOnHost).
#include "gpu/image_preprocess_kernel.h"

#include <cstdint>
#include <string>
#include <string_view>

#include "common/strings.h"

namespace inferd::gpu {

#if defined(INFERD_GPU_IMAGE_KERNEL)
int LaunchImagePreprocessCuda(const uint8_t* device_pixels,
                              const image_math::PreprocessParams& params, void* device_out,
                              int device, void* native_stream, const char** error_text);
#endif

bool ImagePreprocessKernelBuilt() {
#if defined(INFERD_GPU_IMAGE_KERNEL)
  return true;
#else
  return false;
#endif
}

namespace {

absl::Status CheckSizes(const image_math::PreprocessParams& p, const void* pixels,
                        const void* out, std::string_view who) {
  if (p.src_width <= 0 || p.src_height <= 0 || p.out_width <= 0 || p.out_height <= 0 ||
      p.resized_width <= 0 || p.resized_height <= 0 || p.crop_left < 0 || p.crop_top < 0 ||
      p.crop_left + p.out_width > p.resized_width ||
      p.crop_top + p.out_height > p.resized_height) {
    return absl::InvalidArgumentError(inferd::StrCat(
        who, ": bad sizes: source ", p.src_width, "x", p.src_height, ", resized ",
        p.resized_width, "x", p.resized_height, ", window ", p.out_width, "x", p.out_height,
        " at (", p.crop_left, ",", p.crop_top, ")"));
  }
  if (pixels == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(inferd::StrCat(who, ": null pointer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchImagePreprocess(const uint8_t* device_pixels,
                                   const image_math::PreprocessParams& params, void* device_out,
                                   Stream& stream) {
  if (absl::Status st = CheckSizes(params, device_pixels, device_out,
                                   "image preprocess kernel");
      !st.ok()) {
    return st;
  }
#if defined(INFERD_GPU_IMAGE_KERNEL)
  const char* error_text = "";
  const int error = LaunchImagePreprocessCuda(device_pixels, params, device_out, stream.device(),
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

absl::Status ImagePreprocessOnHost(const uint8_t* pixels,
                                   const image_math::PreprocessParams& params, void* out) {
  if (absl::Status st = CheckSizes(params, pixels, out, "image preprocess on the host");
      !st.ok()) {
    return st;
  }
  const int64_t total = image_math::OutputElements(params);
  for (int64_t index = 0; index < total; ++index) {
    if (params.uint8_output) {
      static_cast<uint8_t*>(out)[index] = image_math::Uint8Element(pixels, params, index);
    } else if (params.fp16_output) {
      static_cast<uint16_t*>(out)[index] = image_math::Fp16Element(pixels, params, index);
    } else {
      static_cast<float*>(out)[index] = image_math::Fp32Element(pixels, params, index);
    }
  }
  return absl::OkStatus();
}

}  // namespace inferd::gpu
