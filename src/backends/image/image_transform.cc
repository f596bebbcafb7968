#include "backends/image/image_transform.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <type_traits>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/status_macros.h"
#include "common/strings.h"

namespace inferd::backends::image {
namespace {

namespace math = ::inferd::gpu::image_math;

constexpr int kMaxOutputSide = 16384;
constexpr int64_t kMaxMaxPixels = int64_t{1} << 30;

constexpr std::string_view kKnownParameters[] = {
    "output_height", "output_width", "resize_mode", "resize_shorter", "interpolation", "mean",
    "std",           "scale",        "channel_order", "layout",      "max_pixels",
    "output_on_gpu"};

class ParameterReader {
 public:
  explicit ParameterReader(const config::ModelConfig& config) : config_(config) {}

  absl::Status Error(std::string_view key, std::string_view expectation,
                     std::string_view value) const {
    return absl::InvalidArgumentError(inferd::StrCat("model '", config_.name(), "': parameter '",
                                                     key, "' must be ", expectation, ", got '",
                                                     value, "'"));
  }

  std::optional<std::string> Get(std::string_view key) const {
    return config::GetParameter(config_, key);
  }

  // An integer in [lo, hi]; `fallback` when absent.
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t lo, int64_t hi,
                              int64_t fallback) const {
    auto v = Get(key);
    if (!v) return fallback;
    int64_t parsed;
    if (!absl::SimpleAtoi(*v, &parsed) || parsed < lo || parsed > hi) {
      return Error(key, inferd::StrCat("an integer from ", lo, " to ", hi), *v);
    }
    return parsed;
  }

  // One of `choices`; `fallback` when absent.
  absl::StatusOr<std::string> Choice(std::string_view key,
                                     std::initializer_list<std::string_view> choices,
                                     std::string_view fallback) const {
    auto v = Get(key);
    if (!v) return std::string(fallback);
    for (auto c : choices) {
      if (*v == c) return *v;
    }
    std::string expectation;
    for (auto c : choices) {
      if (!expectation.empty()) expectation += " or ";
      inferd::StrAppend(&expectation, "'", c, "'");
    }
    return Error(key, expectation, *v);
  }

  // A finite number, or a fraction "a/b" (scale "1/255").
  static bool ParseNumber(std::string_view text, float* out) {
    auto trim = [](std::string_view s) {
      while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
      while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
      return s;
    };
    text = trim(text);
    double value;
    const size_t slash = text.find('/');
    if (slash != std::string_view::npos) {
      double num, den;
      if (!absl::SimpleAtod(std::string(trim(text.substr(0, slash))), &num) ||
          !absl::SimpleAtod(std::string(trim(text.substr(slash + 1))), &den) || den == 0) {
        return false;
      }
      value = num / den;
    } else if (!absl::SimpleAtod(std::string(text), &value)) {
      return false;
    }
    if (!std::isfinite(value) || std::abs(value) > 1e30) return false;
    *out = static_cast<float>(value);
    return true;
  }

  // One value for every channel, or three comma-separated values.
  absl::Status Channels(std::string_view key, bool positive, std::array<float, 3>* out) const {
    auto v = Get(key);
    if (!v) return absl::OkStatus();
    std::vector<float> values;
    std::string_view rest = *v;
    bool ok = true;
    while (ok) {
      const size_t comma = rest.find(',');
      float f;
      ok = ParseNumber(rest.substr(0, comma), &f) && (!positive || f > 0);
      if (ok) values.push_back(f);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (!ok || (values.size() != 1 && values.size() != 3)) {
      return Error(key,
                   positive ? "1 or 3 comma-separated positive numbers (one per output channel)"
                            : "1 or 3 comma-separated numbers (one per output channel)",
                   *v);
    }
    for (int c = 0; c < 3; ++c) (*out)[c] = values.size() == 1 ? values[0] : values[c];
    return absl::OkStatus();
  }

 private:
  const config::ModelConfig& config_;
};

std::string DimsString(const google::protobuf::RepeatedField<int64_t>& dims) {
  return ShapeToString(Shape(dims.begin(), dims.end()));
}

// The output's height or width: the parameter when set (it must agree with a fixed dim), else
// the dim (which must then be fixed).
absl::StatusOr<int> OutputSide(const config::ModelConfig& config, const ParameterReader& params,
                               std::string_view key, int64_t dim) {
  auto param = params.Int(key, 1, kMaxOutputSide, -1);
  if (!param.ok()) return param.status();
  const auto& out = config.output(0);
  if (*param > 0) {
    if (dim > 0 && dim != *param) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", config.name(), "': parameter '", key, "' is ", *param, " but output '",
          out.name(), "' has dims ", DimsString(out.dims()), "; they must agree"));
    }
    return static_cast<int>(*param);
  }
  if (dim <= 0 || dim > kMaxOutputSide) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", config.name(), "': output '", out.name(), "' dims ", DimsString(out.dims()),
        " leave ", key == "output_height" ? "the height" : "the width", " unknown; give a size from 1 to ",
        kMaxOutputSide, " in dims or parameter '", key, "'"));
  }
  return static_cast<int>(dim);
}

template <typename Out>
void PreprocessTyped(const RgbImage& image, const PreprocessSettings& s, Out* out) {
  const ResizePlan plan = PlanResize(image.width, image.height, s);
  const int out_h = s.output_height;
  const int out_w = s.output_width;
  const std::vector<AxisTap> xs =
      PlanAxis(image.width, plan.resized_width, plan.crop_left, out_w, s.interpolation);
  const std::vector<AxisTap> ys =
      PlanAxis(image.height, plan.resized_height, plan.crop_top, out_h, s.interpolation);
  const size_t stride = static_cast<size_t>(image.width) * 3;
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  const bool nchw = s.layout == Layout::kNCHW;
  int source_channel[3];
  float mul[3];
  float add[3];
  for (int c = 0; c < 3; ++c) {
    source_channel[c] = s.channel_order == ChannelOrder::kRGB ? c : 2 - c;
    // value = (pixel * scale - mean) / std, folded to one multiply-add.
    math::NormalizeCoefficients(s.scale, s.mean[c], s.std[c], &mul[c], &add[c]);
  }
  // The per-element arithmetic is gpu/image_preprocess_math.h's, shared with the CUDA kernel;
  // here the taps are planned once per axis and the loops walk rows, which inlines to the same
  // code as before the functions were shared.
  const uint8_t* pixels = image.pixels.data();
  for (int y = 0; y < out_h; ++y) {
    const AxisTap& ty = ys[y];
    const uint8_t* row0 = pixels + stride * ty.lo;
    const uint8_t* row1 = pixels + stride * ty.hi;
    const float wy = ty.frac;
    for (int x = 0; x < out_w; ++x) {
      const AxisTap& tx = xs[x];
      const uint8_t* p00 = row0 + 3 * tx.lo;
      const uint8_t* p01 = row0 + 3 * tx.hi;
      const uint8_t* p10 = row1 + 3 * tx.lo;
      const uint8_t* p11 = row1 + 3 * tx.hi;
      const float wx = tx.frac;
      const size_t pixel = static_cast<size_t>(y) * out_w + x;
      for (int c = 0; c < 3; ++c) {
        const int sc = source_channel[c];
        const float v = math::Blend(p00[sc], p01[sc], p10[sc], p11[sc], wx, wy);
        const size_t index = static_cast<size_t>(math::OutputIndex(nchw, c, pixel, plane));
        if constexpr (std::is_same_v<Out, float>) {
          out[index] = math::Normalize(v, mul[c], add[c]);
        } else if constexpr (std::is_same_v<Out, uint16_t>) {  // FP16 bits
          out[index] = math::HalfBits(math::Normalize(v, mul[c], add[c]));
        } else {
          out[index] = math::ToUint8(v);
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<PreprocessSettings> SettingsFromConfig(const config::ModelConfig& config) {
  const std::string prefix = inferd::StrCat("model '", config.name(), "': ");
  for (const auto& [key, value] : config.parameters()) {
    if (std::find(std::begin(kKnownParameters), std::end(kKnownParameters), key) ==
        std::end(kKnownParameters)) {
      return absl::InvalidArgumentError(inferd::StrCat(
          prefix, "unknown parameter '", key, "' for the image backend (known: ",
          inferd::StrJoin(kKnownParameters, ", "), ")"));
    }
  }
  if (config.input_size() != 1 || config.output_size() != 1) {
    return absl::InvalidArgumentError(inferd::StrCat(
        prefix, "the image backend takes exactly one input and one output, the config has ",
        config.input_size(), " and ", config.output_size()));
  }
  PreprocessSettings s;
  const auto& in = config.input(0);
  if (in.data_type() == inference::TYPE_UINT8 && in.dims_size() == 1 && in.dims(0) == -1) {
    s.input_type = DataType::kUint8;
  } else if (in.data_type() == inference::TYPE_STRING && in.dims_size() == 1 && in.dims(0) == 1) {
    s.input_type = DataType::kBytes;
  } else {
    return absl::InvalidArgumentError(inferd::StrCat(
        prefix, "input '", in.name(),
        "' must be TYPE_UINT8 with dims [-1] (the encoded image's bytes) or TYPE_STRING with dims "
        "[1] (one encoded image per element), got ",
        inference::DataType_Name(in.data_type()), " with dims ", DimsString(in.dims())));
  }

  const auto& out = config.output(0);
  if (out.data_type() == inference::TYPE_FP32) {
    s.output_type = DataType::kFp32;
  } else if (out.data_type() == inference::TYPE_FP16) {
    s.output_type = DataType::kFp16;
  } else if (out.data_type() == inference::TYPE_UINT8) {
    s.output_type = DataType::kUint8;
  } else {
    return absl::InvalidArgumentError(inferd::StrCat(
        prefix, "output '", out.name(), "' must be TYPE_FP32, TYPE_FP16 or TYPE_UINT8, got ",
        inference::DataType_Name(out.data_type())));
  }
  if (out.dims_size() != 3) {
    return absl::InvalidArgumentError(inferd::StrCat(
        prefix, "output '", out.name(), "' must have dims [3,H,W] (NCHW) or [H,W,3] (NHWC), got ",
        DimsString(out.dims())));
  }
  ParameterReader params(config);
  const bool chw = out.dims(0) == 3;
  const bool hwc = out.dims(2) == 3;
  auto layout = params.Choice("layout", {"NCHW", "NHWC"}, "");
  if (!layout.ok()) return layout.status();
  if (layout->empty()) {
    if (chw == hwc) {
      return absl::InvalidArgumentError(inferd::StrCat(
          prefix, "output '", out.name(), "' dims ", DimsString(out.dims()),
          chw ? " fit both NCHW and NHWC; set parameter 'layout'"
              : " must be [3,H,W] (NCHW) or [H,W,3] (NHWC)"));
    }
    s.layout = chw ? Layout::kNCHW : Layout::kNHWC;
  } else {
    s.layout = *layout == "NCHW" ? Layout::kNCHW : Layout::kNHWC;
    if ((s.layout == Layout::kNCHW && !chw) || (s.layout == Layout::kNHWC && !hwc)) {
      return absl::InvalidArgumentError(inferd::StrCat(
          prefix, "parameter 'layout' is '", *layout, "' but output '", out.name(), "' has dims ",
          DimsString(out.dims()), "; ", *layout, " needs ",
          s.layout == Layout::kNCHW ? "[3,H,W]" : "[H,W,3]"));
    }
  }
  const int64_t h_dim = s.layout == Layout::kNCHW ? out.dims(1) : out.dims(0);
  const int64_t w_dim = s.layout == Layout::kNCHW ? out.dims(2) : out.dims(1);
  auto height = OutputSide(config, params, "output_height", h_dim);
  if (!height.ok()) return height.status();
  auto width = OutputSide(config, params, "output_width", w_dim);
  if (!width.ok()) return width.status();
  s.output_height = *height;
  s.output_width = *width;

  auto mode = params.Choice("resize_mode", {"stretch", "shorter_side_center_crop"}, "stretch");
  if (!mode.ok()) return mode.status();
  s.resize_mode = *mode == "stretch" ? ResizeMode::kStretch : ResizeMode::kShorterSideCenterCrop;
  const int min_shorter = std::max(s.output_height, s.output_width);
  if (s.resize_mode == ResizeMode::kStretch) {
    if (auto v = params.Get("resize_shorter")) {
      return absl::InvalidArgumentError(inferd::StrCat(
          prefix, "parameter 'resize_shorter' ('", *v,
          "') needs resize_mode 'shorter_side_center_crop'; resize_mode is 'stretch'"));
    }
  } else {
    auto shorter = params.Int("resize_shorter", min_shorter, 4 * kMaxOutputSide, min_shorter);
    if (!shorter.ok()) return shorter.status();
    s.resize_shorter = static_cast<int>(*shorter);
  }
  auto interp = params.Choice("interpolation", {"bilinear", "nearest"}, "bilinear");
  if (!interp.ok()) return interp.status();
  s.interpolation = *interp == "bilinear" ? Interpolation::kBilinear : Interpolation::kNearest;
  auto order = params.Choice("channel_order", {"RGB", "BGR"}, "RGB");
  if (!order.ok()) return order.status();
  s.channel_order = *order == "RGB" ? ChannelOrder::kRGB : ChannelOrder::kBGR;
  auto max_pixels = params.Int("max_pixels", 1, kMaxMaxPixels, kDefaultMaxPixels);
  if (!max_pixels.ok()) return max_pixels.status();
  s.max_pixels = *max_pixels;
  auto on_gpu =
      params.Choice("output_on_gpu", {"true", "false"}, kOutputOnGpuDefault ? "true" : "false");
  if (!on_gpu.ok()) return on_gpu.status();
  s.output_on_gpu = *on_gpu == "true";

  if (s.output_type == DataType::kUint8) {
    for (const char* key : {"scale", "mean", "std"}) {
      if (auto v = params.Get(key)) {
        return absl::InvalidArgumentError(inferd::StrCat(
            prefix, "parameter '", key, "' ('", *v,
            "') applies only to a TYPE_FP32 or TYPE_FP16 output; output '",
            out.name(), "' is TYPE_UINT8 (resized pixels, not normalized)"));
      }
    }
    s.scale = 1.0f;
    return s;
  }
  if (auto v = params.Get("scale")) {
    if (!ParameterReader::ParseNumber(*v, &s.scale) || !(s.scale > 0)) {
      return params.Error("scale", "a positive number or fraction such as '1/255'", *v);
    }
  }
  RETURN_IF_ERROR(params.Channels("mean", /*positive=*/false, &s.mean));
  RETURN_IF_ERROR(params.Channels("std", /*positive=*/true, &s.std));
  return s;
}

Shape ItemShape(const PreprocessSettings& s) {
  if (s.layout == Layout::kNCHW) return {3, s.output_height, s.output_width};
  return {s.output_height, s.output_width, 3};
}

ResizePlan PlanResize(int src_width, int src_height, const PreprocessSettings& s) {
  ResizePlan plan;
  if (s.resize_mode == ResizeMode::kStretch) {
    plan.resized_width = s.output_width;
    plan.resized_height = s.output_height;
    return plan;
  }
  // torchvision: the shorter side becomes resize_shorter, the longer int(n * long / short);
  // the crop corner is int(round((resized - crop) / 2.0)), Python's round (half to even).
  const int64_t shorter = std::min(src_width, src_height);
  const int64_t longer = std::max(src_width, src_height);
  const int new_short = s.resize_shorter;
  const int new_long = static_cast<int>(static_cast<double>(new_short * longer) / shorter);
  plan.resized_width = src_width <= src_height ? new_short : new_long;
  plan.resized_height = src_width <= src_height ? new_long : new_short;
  plan.crop_left = static_cast<int>(std::nearbyint((plan.resized_width - s.output_width) / 2.0));
  plan.crop_top = static_cast<int>(std::nearbyint((plan.resized_height - s.output_height) / 2.0));
  return plan;
}

std::vector<AxisTap> PlanAxis(int in, int resized, int offset, int out, Interpolation mode) {
  std::vector<AxisTap> taps(out);
  for (int d = 0; d < out; ++d) {
    taps[d] = math::TapAt(in, resized, offset, d, mode == Interpolation::kNearest);
  }
  return taps;
}

math::PreprocessParams MathParamsFor(int src_width, int src_height, const PreprocessSettings& s) {
  const ResizePlan plan = PlanResize(src_width, src_height, s);
  math::PreprocessParams p;
  p.src_width = src_width;
  p.src_height = src_height;
  p.out_width = s.output_width;
  p.out_height = s.output_height;
  p.resized_width = plan.resized_width;
  p.resized_height = plan.resized_height;
  p.crop_left = plan.crop_left;
  p.crop_top = plan.crop_top;
  p.nearest = s.interpolation == Interpolation::kNearest;
  p.nchw = s.layout == Layout::kNCHW;
  p.uint8_output = s.output_type == DataType::kUint8;
  p.fp16_output = s.output_type == DataType::kFp16;
  for (int c = 0; c < 3; ++c) {
    p.source_channel[c] = s.channel_order == ChannelOrder::kRGB ? c : 2 - c;
    math::NormalizeCoefficients(s.scale, s.mean[c], s.std[c], &p.mul[c], &p.add[c]);
  }
  return p;
}

void Preprocess(const RgbImage& image, const PreprocessSettings& s, void* out) {
  if (s.output_type == DataType::kFp32) {
    PreprocessTyped(image, s, static_cast<float*>(out));
  } else if (s.output_type == DataType::kFp16) {
    PreprocessTyped(image, s, static_cast<uint16_t*>(out));
  } else {
    PreprocessTyped(image, s, static_cast<uint8_t*>(out));
  }
}

}  // namespace inferd::backends::image
