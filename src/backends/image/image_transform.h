// What the image backend does to a decoded image: the settings read from a model's config
// (validated once, at load) and the resize / crop / normalize / layout step that writes one
// batch item of the output tensor. Pure functions of their arguments, so each knob and the
// resize arithmetic are unit-tested without a server.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/image_codec/image_decode.h"
#include "common/data_type.h"
#include "config/model_config_util.h"
#include "gpu/image_preprocess_math.h"

namespace inferd::backends::image {

enum class ResizeMode { kStretch, kShorterSideCenterCrop };
enum class Interpolation { kBilinear, kNearest };
enum class Layout { kNCHW, kNHWC };
enum class ChannelOrder { kRGB, kBGR };

inline constexpr int64_t kDefaultMaxPixels = int64_t{64} << 20;  // 64 Mi pixels

// Whether a GPU instance leaves its output on its GPU for every request when the config does
// not say (`output_on_gpu`). false: a batch of ensemble steps keeps it there anyway
// (InferRequest::gpu_outputs_ok: the next step, a GPU classifier, reads it in place); a client
// gets it copied to the host inside the backend, once per batch, which is cheaper than the
// server's copy at its edge per response (backends/tensor_places.h) that `true` would mean.
inline constexpr bool kOutputOnGpuDefault = false;

struct PreprocessSettings {
  DataType input_type = DataType::kUint8;  // kUint8 (dims [-1]) or kBytes (dims [1])
  DataType output_type = DataType::kFp32;  // kFp32, kFp16 or kUint8
  int output_height = 0;
  int output_width = 0;
  Layout layout = Layout::kNCHW;
  ResizeMode resize_mode = ResizeMode::kStretch;
  // kShorterSideCenterCrop: the shorter side is resized to this, then the centre
  // output_height x output_width is cut out (torchvision Resize(n) + CenterCrop).
  int resize_shorter = 0;
  Interpolation interpolation = Interpolation::kBilinear;
  ChannelOrder channel_order = ChannelOrder::kRGB;
  // FP32 only: value = (pixel * scale - mean[c]) / std[c], c in the output's channel order.
  float scale = 1.0f / 255.0f;
  std::array<float, 3> mean = {0.0f, 0.0f, 0.0f};
  std::array<float, 3> std = {1.0f, 1.0f, 1.0f};
  int64_t max_pixels = kDefaultMaxPixels;
  // GPU instances only: the output stays in the instance's GPU memory (MemoryPlace::Gpu)
  // instead of being copied to the host before it leaves the backend. No effect on the CPU.
  bool output_on_gpu = kOutputOnGpuDefault;
};

// Reads and checks the config: one input (TYPE_UINT8 dims [-1] or TYPE_STRING dims [1]), one
// output (TYPE_FP32, TYPE_FP16 or TYPE_UINT8, dims [3,H,W] or [H,W,3]) and the `parameters`. Every error
// names the model, the parameter (or tensor) and the value it refused.
absl::StatusOr<PreprocessSettings> SettingsFromConfig(const config::ModelConfig& config);

// The output's dims for one item, in the configured layout: [3,H,W] or [H,W,3].
Shape ItemShape(const PreprocessSettings& s);

// Where the output window lies in the resized image: the resized size and the window's
// top-left corner. Stretch: resized == output, corner (0,0).
struct ResizePlan {
  int resized_width = 0;
  int resized_height = 0;
  int crop_left = 0;
  int crop_top = 0;
};
ResizePlan PlanResize(int src_width, int src_height, const PreprocessSettings& s);

// Source sampling along one axis for output positions [0, out): gpu/image_preprocess_math.h's
// TapAt (half-pixel centres, align_corners=False, no antialiasing) for each position.
using AxisTap = ::inferd::gpu::image_math::AxisTap;
std::vector<AxisTap> PlanAxis(int in, int resized, int offset, int out, Interpolation mode);

// What the shared per-element maths (and the CUDA kernel) need for one item of an image of
// src_width x src_height: the plan, the layout, the channel order and the folded normalization.
::inferd::gpu::image_math::PreprocessParams MathParamsFor(int src_width, int src_height,
                                                          const PreprocessSettings& s);

// Writes one item (3 * output_height * output_width elements of output_type) to `out`.
void Preprocess(const RgbImage& image, const PreprocessSettings& s, void* out);

}  // namespace inferd::backends::image
