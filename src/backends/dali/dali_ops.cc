#include "backends/dali/dali_ops.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <system_error>
#include <thread>

#include "backends/image_codec/image_decode.h"
#include "common/strings.h"

namespace inferd::backends::dali {
namespace {

constexpr std::string_view kSupported[] = {
    "ExternalSource", "decoders__Image", "ImageDecoder", "Resize", "Crop",
    "CropMirrorNormalize", "Normalize", "Cast", "Transpose", "ColorSpaceConversion", "Reshape",
    "Pad", "Constant", "ArithmeticGenericOp"};

// The largest extent an argument may ask for (a guard against absurd sizes, far above images).
constexpr double kMaxExtent = 1 << 24;

// DALI's DALIImageType and DALIInterpType numbering.
enum ImageType { kRgb = 0, kBgr = 1, kGray = 2, kYCbCr = 3, kAnyData = 4 };
enum InterpType { kNearest = 0, kLinear = 1, kCubic = 2, kLanczos3 = 3, kTriangular = 4 };

absl::Status Bad(const OpNode& node, std::string_view arg, std::string_view what) {
  return absl::InvalidArgumentError(
      inferd::StrCat(node.Label(), " argument '", arg, "': ", what));
}

#define DALI_ASSIGN(lhs, expr)            \
  auto lhs##_or = (expr);                 \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

}  // namespace

void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto drain = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> helpers;
  const size_t wanted = n == 0 ? 0 : std::min<size_t>(n, std::max(threads, 1)) - 1;
  for (size_t k = 0; k < wanted; ++k) {
    try {
      helpers.emplace_back(drain);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones we have take the rest
    }
  }
  drain();
  for (auto& t : helpers) t.join();
}

namespace {

absl::StatusOr<DaliType> TypeArg(const OpNode& node, std::string_view name, DaliType fallback) {
  if (!node.Has(name)) return fallback;
  DALI_ASSIGN(v, node.Number(name, -1));
  DaliType t = DaliTypeFromInt(static_cast<int64_t>(v));
  if (t == DaliType::kNoType) {
    return Bad(node, name, inferd::StrCat("unknown DALI data type ", v));
  }
  return t;
}

// The positions of H, W and C in a sample's layout (C = -1 when absent).
struct Axes {
  int h = -1, w = -1, c = -1;
};
absl::StatusOr<Axes> ImageAxes(const Sample& s, std::string_view op) {
  std::string layout = s.layout;
  if (layout.empty()) layout = s.shape.size() == 3 ? "HWC" : s.shape.size() == 2 ? "HW" : "";
  Axes a;
  for (size_t i = 0; i < layout.size(); ++i) {
    if (layout[i] == 'H') a.h = static_cast<int>(i);
    if (layout[i] == 'W') a.w = static_cast<int>(i);
    if (layout[i] == 'C') a.c = static_cast<int>(i);
  }
  if (a.h < 0 || a.w < 0 || layout.size() != s.shape.size() ||
      layout.size() != static_cast<size_t>(2 + (a.c >= 0))) {
    return absl::InvalidArgumentError(inferd::StrCat(
        op, ": expected an image (layout HWC, CHW or HW), got shape ", ShapeToString(s.shape),
        " layout '", s.layout, "'"));
  }
  return a;
}

// ConvertTo over n values in place, with the common cases (floating types: nothing to do;
// UINT8: saturate, then round half to even with the 1.5 * 2^23 trick, exact below 2^22) in
// loops the compiler vectorizes.
void ConvertRow(DaliType type, float* v, size_t n) {
  if (IsFloat(type)) return;
  if (type == DaliType::kUint8) {
    constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
    for (size_t i = 0; i < n; ++i) {
      const float x = v[i] != v[i] ? 0.0f : std::min(std::max(v[i], 0.0f), 255.0f);
      v[i] = (x + kMagic) - kMagic;
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) v[i] = ConvertTo(type, v[i]);
}

// A sample's values as float (a request view is copied once).
const float* FloatValues(const Sample& s, FloatBuffer* scratch) {
  if (!s.is_view) return s.values.data();
  scratch->resize(s.bytes.size());
  for (size_t i = 0; i < s.bytes.size(); ++i) {
    (*scratch)[i] = static_cast<uint8_t>(s.bytes[i]);
  }
  return scratch->data();
}

// Strides of a row-major shape.
std::vector<int64_t> Strides(const Shape& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * shape[i + 1];
  return st;
}

// Operators whose samples are independent: Run maps RunSample over the batch in parallel.
class SampleOperator : public Operator {
 public:
  // How many inputs RunSample reads at least (in[0] for all but arithmetic).
  virtual size_t MinInputs() const { return 1; }
  absl::Status Run(std::span<const Batch* const> inputs, Batch* output,
                   const RunContext& ctx) const override {
    if (inputs.size() < MinInputs()) {
      // A pipeline may name no input for an operator that reads one (found by
      // dali_pipeline_fuzz): refused, not read past the end.
      return absl::InvalidArgumentError(
          inferd::StrCat("an operator that reads ", MinInputs(), " input(s) was given ",
                         inputs.size()));
    }
    output->assign(ctx.batch_size, Sample{});
    ParallelFor(ctx.batch_size, ctx.threads, [&](size_t i) {
      std::vector<const Sample*> in;
      for (const Batch* b : inputs) {
        const Sample& s = (*b)[i];
        if (!s.error.ok()) {
          (*output)[i].error = s.error;
          return;
        }
        in.push_back(&s);
      }
      Sample& out = (*output)[i];
      try {
        absl::Status st = RunSample(in, ctx, &out);
        if (!st.ok()) out.error = st;
      } catch (const std::bad_alloc&) {
        out.error = absl::ResourceExhaustedError("out of memory");
      } catch (const std::exception& e) {
        out.error = absl::InternalError(e.what());
      }
    });
    return absl::OkStatus();
  }

  bool PerSample() const override { return true; }

  absl::Status RunOneSample(std::span<const Sample* const> in, const RunContext& ctx,
                            Sample* out) const override {
    try {
      return RunSample(in, ctx, out);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("out of memory");
    } catch (const std::exception& e) {
      return absl::InternalError(e.what());
    }
  }

 protected:
  virtual absl::Status RunSample(std::span<const Sample* const> in, const RunContext& ctx,
                                 Sample* out) const = 0;
};

// ---------------------------------------------------------------- decoders.image / ImageDecoder
class ImageDecoderOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<ImageDecoderOp>();
    DALI_ASSIGN(type, node.Number("output_type", kRgb));
    op->output_type_ = static_cast<int>(type);
    if (op->output_type_ != kRgb && op->output_type_ != kBgr && op->output_type_ != kGray) {
      return Bad(node, "output_type",
                 inferd::StrCat("image type ", type, " is not run by inferd (RGB, BGR, GRAY are)"));
    }
    DALI_ASSIGN(dtype, TypeArg(node, "dtype", DaliType::kUint8));
    if (dtype != DaliType::kUint8) return Bad(node, "dtype", "inferd decodes to UINT8 only");
    if (node.inputs.size() != 1) return Bad(node, "input", "expected one input");
    return op;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext& ctx,
                         Sample* out) const override {
    const Sample& s = *in[0];
    std::string owned;
    std::string_view bytes = s.bytes;
    if (!s.is_view) {
      owned.resize(s.values.size());
      for (size_t i = 0; i < owned.size(); ++i) owned[i] = static_cast<char>(s.values[i]);
      bytes = owned;
    }
    auto img = image::DecodeImage(bytes, ctx.max_pixels);
    if (!img.ok()) return img.status();
    const size_t n = static_cast<size_t>(img->width) * img->height;
    out->type = DaliType::kUint8;
    out->layout = "HWC";
    if (output_type_ == kRgb) {
      // Kept as bytes: the next operator reads them without a float copy.
      out->shape = {img->height, img->width, 3};
      auto owned = std::make_shared<std::vector<uint8_t>>(std::move(img->pixels));
      out->bytes = std::string_view(reinterpret_cast<const char*>(owned->data()), owned->size());
      out->is_view = true;
      out->owned = std::move(owned);
      return absl::OkStatus();
    }
    const uint8_t* p = img->pixels.data();
    if (output_type_ == kGray) {
      out->shape = {img->height, img->width, 1};
      out->values.resize(n);
      for (size_t i = 0; i < n; ++i) {
        out->values[i] = std::nearbyint(0.299f * p[3 * i] + 0.587f * p[3 * i + 1] +
                                        0.114f * p[3 * i + 2]);
      }
    } else {
      out->shape = {img->height, img->width, 3};
      out->values.resize(3 * n);
      const bool bgr = output_type_ == kBgr;
      for (size_t i = 0; i < n; ++i) {
        out->values[3 * i] = p[3 * i + (bgr ? 2 : 0)];
        out->values[3 * i + 1] = p[3 * i + 1];
        out->values[3 * i + 2] = p[3 * i + (bgr ? 0 : 2)];
      }
    }
    return absl::OkStatus();
  }

 private:
  int output_type_ = kRgb;
};

// ---------------------------------------------------------------- Resize
// One output position's source taps along an axis.
struct Taps {
  int first = 0;               // first source index (before clamping)
  std::vector<float> weights;  // normalized
};

// The taps of every output position, flattened, source indices clamped to the image.
struct FlatTaps {
  std::vector<int> begin;  // output o's taps are [begin[o], begin[o + 1])
  std::vector<int> index;
  std::vector<float> weight;
  FlatTaps(const std::vector<Taps>& taps, int in) {
    begin.push_back(0);
    for (const Taps& t : taps) {
      for (size_t k = 0; k < t.weights.size(); ++k) {
        index.push_back(std::clamp(t.first + static_cast<int>(k), 0, in - 1));
        weight.push_back(t.weights[k]);
      }
      begin.push_back(static_cast<int>(index.size()));
    }
  }
};

class ResizeOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<ResizeOp>();
    DALI_ASSIGN(rx, node.Number("resize_x", 0));
    DALI_ASSIGN(ry, node.Number("resize_y", 0));
    DALI_ASSIGN(rs, node.Number("resize_shorter", 0));
    DALI_ASSIGN(rl, node.Number("resize_longer", 0));
    DALI_ASSIGN(size, node.Numbers("size"));
    DALI_ASSIGN(max_size, node.Numbers("max_size"));
    DALI_ASSIGN(mode, node.String("mode", "default"));
    DALI_ASSIGN(interp, node.Number("interp_type", kLinear));
    DALI_ASSIGN(min_f, node.Number("min_filter", interp));
    DALI_ASSIGN(mag_f, node.Number("mag_filter", interp));
    DALI_ASSIGN(antialias, node.Bool("antialias", true));
    DALI_ASSIGN(subpixel, node.Bool("subpixel_scale", true));
    DALI_ASSIGN(dtype, TypeArg(node, "dtype", DaliType::kNoType));
    for (std::string_view unsupported : {"roi_start", "roi_end", "roi_shape", "resize_z"}) {
      if (node.Has(unsupported)) return Bad(node, unsupported, "not run by inferd");
    }
    if (!size.empty()) {
      if (size.size() != 2) return Bad(node, "size", "expected [height, width]");
      ry = size[0];
      rx = size[1];
    }
    for (double v : {rx, ry, rs, rl}) {
      if (!(v >= 0 && v <= kMaxExtent)) return Bad(node, "resize_x", "size out of range");
    }
    if ((rs > 0) + (rl > 0) + (rx > 0 || ry > 0) > 1) {
      return Bad(node, "resize_shorter",
                 "resize_shorter, resize_longer and resize_x/resize_y/size exclude each other");
    }
    if (rs == 0 && rl == 0 && rx == 0 && ry == 0) {
      return Bad(node, "size", "no output size given");
    }
    if (mode != "default" && mode != "stretch" && mode != "not_larger" && mode != "not_smaller") {
      return Bad(node, "mode", inferd::StrCat("'", mode, "' is not a DALI resize mode"));
    }
    for (double f : {min_f, mag_f}) {
      const int k = static_cast<int>(f);
      if (k != f || (k != kNearest && k != kLinear && k != kTriangular)) {
        return Bad(node, "interp_type",
                   inferd::StrCat("interpolation ", f,
                                  " is not run by inferd (NN, LINEAR, TRIANGULAR are)"));
      }
    }
    if (!max_size.empty() && max_size.size() != 1 && max_size.size() != 2) {
      return Bad(node, "max_size", "expected one or two extents");
    }
    op->rx_ = rx, op->ry_ = ry, op->rs_ = rs, op->rl_ = rl;
    op->mode_ = mode;
    op->min_filter_ = static_cast<int>(min_f);
    op->mag_filter_ = static_cast<int>(mag_f);
    op->antialias_ = antialias;
    op->subpixel_ = subpixel;
    op->dtype_ = dtype;
    if (!max_size.empty()) {
      op->max_h_ = max_size[0];
      op->max_w_ = max_size.size() == 2 ? max_size[1] : max_size[0];
    }
    return op;
  }

  // The output extents before rounding (DALI's resize attribute arithmetic).
  void OutputSize(double in_h, double in_w, double* oh, double* ow) const {
    if (rs_ > 0 || rl_ > 0) {
      const bool by_h = rs_ > 0 ? in_h <= in_w : in_h >= in_w;
      const double target = rs_ > 0 ? rs_ : rl_;
      const double scale = target / (by_h ? in_h : in_w);
      *oh = in_h * scale;
      *ow = in_w * scale;
    } else if (rx_ > 0 && ry_ > 0) {
      *oh = ry_;
      *ow = rx_;
      if (mode_ == "not_larger" || mode_ == "not_smaller") {
        const double sx = rx_ / in_w, sy = ry_ / in_h;
        const double s = mode_ == "not_larger" ? std::min(sx, sy) : std::max(sx, sy);
        *oh = in_h * s;
        *ow = in_w * s;
      }
    } else if (rx_ > 0) {
      *ow = rx_;
      *oh = mode_ == "stretch" ? in_h : in_h * rx_ / in_w;
    } else {
      *oh = ry_;
      *ow = mode_ == "stretch" ? in_w : in_w * ry_ / in_h;
    }
    if (max_h_ > 0 || max_w_ > 0) {
      double s = 1.0;
      if (max_h_ > 0 && *oh > max_h_) s = std::min(s, max_h_ / *oh);
      if (max_w_ > 0 && *ow > max_w_) s = std::min(s, max_w_ / *ow);
      *oh *= s;
      *ow *= s;
    }
  }

  // Taps for `out` output positions over `in` source pixels, the output extent before
  // rounding being `out_f`. Source coordinates have pixel j's centre at j + 0.5; output pixel
  // o maps to centre lo + (o + 0.5) * scale, the window centred in the input when the output
  // extent was rounded (subpixel_scale).
  std::vector<Taps> PlanAxis(int in, int out, double out_f) const {
    const double scale = subpixel_ ? in / out_f : static_cast<double>(in) / out;
    const double lo = (in - out * scale) / 2.0;
    const int filter = scale > 1.0 ? min_filter_ : mag_filter_;
    std::vector<Taps> taps(out);
    for (int o = 0; o < out; ++o) {
      const double c = lo + (o + 0.5) * scale;
      Taps& t = taps[o];
      if (filter == kNearest) {
        t.first = static_cast<int>(std::floor(c));
        t.weights = {1.0f};
        continue;
      }
      // Triangle of radius r: 1 for linear interpolation, the scale when shrinking with
      // antialiasing (DALI's triangular filter), never below 1.
      double r = 1.0;
      if (scale > 1.0 && (antialias_ || filter == kTriangular)) r = scale;
      const int j0 = static_cast<int>(std::floor(c - r - 0.5)) + 1;
      const int j1 = static_cast<int>(std::ceil(c + r - 0.5)) - 1;
      t.first = j0;
      double sum = 0;
      std::vector<double> w;
      for (int j = j0; j <= j1; ++j) {
        const double d = std::abs(j + 0.5 - c) / r;
        w.push_back(std::max(0.0, 1.0 - d));
        sum += w.back();
      }
      if (sum <= 0) {  // c exactly between taps at distance r: take the nearest
        t.first = static_cast<int>(std::floor(c));
        t.weights = {1.0f};
        continue;
      }
      for (double x : w) t.weights.push_back(static_cast<float>(x / sum));
    }
    return taps;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext& ctx,
                         Sample* out) const override {
    const Sample& s = *in[0];
    DALI_ASSIGN(ax, ImageAxes(s, "Resize"));
    if (ax.c >= 0 && ax.c != 2) {
      return absl::InvalidArgumentError("Resize: inferd resizes HWC and HW images only");
    }
    const int in_h = static_cast<int>(s.shape[ax.h]), in_w = static_cast<int>(s.shape[ax.w]);
    const int ch = ax.c >= 0 ? static_cast<int>(s.shape[ax.c]) : 1;
    if (in_h <= 0 || in_w <= 0) return absl::InvalidArgumentError("Resize: empty image");
    double oh_f, ow_f;
    OutputSize(in_h, in_w, &oh_f, &ow_f);
    if (!(oh_f <= kMaxExtent && ow_f <= kMaxExtent && oh_f > 0 && ow_f > 0)) {
      return absl::InvalidArgumentError("Resize: output size out of range");
    }
    const int oh = std::max(1, static_cast<int>(std::round(oh_f)));
    const int ow = std::max(1, static_cast<int>(std::round(ow_f)));
    if (static_cast<int64_t>(oh) * ow > ctx.max_pixels) {
      return absl::InvalidArgumentError(
          inferd::StrCat("Resize: output ", oh, "x", ow, " is larger than allowed"));
    }
    const FlatTaps tx(PlanAxis(in_w, ow, ow_f), in_w);
    const FlatTaps ty(PlanAxis(in_h, oh, oh_f), in_h);
    // Vertical pass into a float buffer (rows of contiguous values: vectorizes), then the
    // horizontal pass into the output; sources clamp at the border.
    const size_t in_row = static_cast<size_t>(in_w) * ch;
    FloatBuffer mid(static_cast<size_t>(oh) * in_row);
    for (int y = 0; y < oh; ++y) {
      float* dst = &mid[y * in_row];
      if (s.is_view) {
        VerticalTaps(reinterpret_cast<const uint8_t*>(s.bytes.data()), in_row, ty, y, dst);
      } else {
        VerticalTaps(s.values.data(), in_row, ty, y, dst);
      }
    }
    out->type = dtype_ == DaliType::kNoType ? s.type : dtype_;
    out->layout = s.layout;
    out->shape = s.shape;
    out->shape[ax.h] = oh;
    out->shape[ax.w] = ow;
    out->values.resize(static_cast<size_t>(oh) * ow * ch);
    for (int y = 0; y < oh; ++y) {
      const float* row = &mid[y * in_row];
      float* dst = &out->values[static_cast<size_t>(y) * ow * ch];
      for (int x = 0; x < ow; ++x) {
        const int k0 = tx.begin[x], k1 = tx.begin[x + 1];
        if (ch == 3) {
          float a0 = 0, a1 = 0, a2 = 0;
          for (int k = k0; k < k1; ++k) {
            const float* p = row + tx.index[k] * 3;
            const float w = tx.weight[k];
            a0 += w * p[0];
            a1 += w * p[1];
            a2 += w * p[2];
          }
          dst[3 * x] = a0;
          dst[3 * x + 1] = a1;
          dst[3 * x + 2] = a2;
          continue;
        }
        for (int c = 0; c < ch; ++c) {
          float acc = 0;
          for (int k = k0; k < k1; ++k) acc += tx.weight[k] * row[tx.index[k] * ch + c];
          dst[x * ch + c] = acc;
        }
      }
      ConvertRow(out->type, dst, static_cast<size_t>(ow) * ch);
    }
    return absl::OkStatus();
  }

  // dst[i] = sum over output row y's taps of weight * src row[i], for the n values of a row.
  template <typename T>
  static void VerticalTaps(const T* src, size_t n, const FlatTaps& ty, int y, float* dst) {
    const int k0 = ty.begin[y], k1 = ty.begin[y + 1];
    {
      const T* r = src + static_cast<size_t>(ty.index[k0]) * n;
      const float w = ty.weight[k0];
      for (size_t i = 0; i < n; ++i) dst[i] = w * static_cast<float>(r[i]);
    }
    for (int k = k0 + 1; k < k1; ++k) {
      const T* r = src + static_cast<size_t>(ty.index[k]) * n;
      const float w = ty.weight[k];
      for (size_t i = 0; i < n; ++i) dst[i] += w * static_cast<float>(r[i]);
    }
  }

 private:
  double rx_ = 0, ry_ = 0, rs_ = 0, rl_ = 0, max_h_ = 0, max_w_ = 0;
  std::string mode_;
  int min_filter_ = kLinear, mag_filter_ = kLinear;
  bool antialias_ = true, subpixel_ = true;
  DaliType dtype_ = DaliType::kNoType;
};

// ---------------------------------------------------------------- crop window (Crop, CMN)
struct CropSpec {
  double h = 0, w = 0;  // 0: the whole extent
  double pos_x = 0.5, pos_y = 0.5;
  std::string oob = "error";  // out_of_bounds_policy
  std::vector<double> fill;

  static absl::StatusOr<CropSpec> Read(const OpNode& node) {
    CropSpec c;
    DALI_ASSIGN(crop, node.Numbers("crop"));
    if (!crop.empty()) {
      if (crop.size() != 2) return Bad(node, "crop", "expected [height, width]");
      c.h = crop[0];
      c.w = crop[1];
    }
    DALI_ASSIGN(ch, node.Number("crop_h", c.h));
    DALI_ASSIGN(cw, node.Number("crop_w", c.w));
    c.h = ch, c.w = cw;
    if (!(c.h >= 0 && c.w >= 0 && c.h <= kMaxExtent && c.w <= kMaxExtent)) {
      return Bad(node, "crop", "extent out of range");
    }
    DALI_ASSIGN(px, node.Number("crop_pos_x", 0.5));
    DALI_ASSIGN(py, node.Number("crop_pos_y", 0.5));
    if (px < 0 || px > 1) return Bad(node, "crop_pos_x", "must lie in [0, 1]");
    if (py < 0 || py > 1) return Bad(node, "crop_pos_y", "must lie in [0, 1]");
    c.pos_x = px, c.pos_y = py;
    DALI_ASSIGN(oob, node.String("out_of_bounds_policy", "error"));
    if (oob != "error" && oob != "pad" && oob != "trim_to_shape") {
      return Bad(node, "out_of_bounds_policy", inferd::StrCat("unknown policy '", oob, "'"));
    }
    c.oob = oob;
    DALI_ASSIGN(fill, node.Numbers("fill_values"));
    c.fill = fill;
    if (node.Has("crop_d") || node.Has("crop_pos_z")) return Bad(node, "crop_d", "3-D crops are not run by inferd");
    return c;
  }

  // The window (top, left, height, width) in an in_h x in_w image; may exceed it with "pad".
  absl::Status Window(int64_t in_h, int64_t in_w, int64_t* top, int64_t* left, int64_t* h,
                      int64_t* w) const {
    *h = this->h > 0 ? static_cast<int64_t>(std::round(this->h)) : in_h;
    *w = this->w > 0 ? static_cast<int64_t>(std::round(this->w)) : in_w;
    *top = static_cast<int64_t>(std::round(pos_y * static_cast<double>(in_h - *h)));
    *left = static_cast<int64_t>(std::round(pos_x * static_cast<double>(in_w - *w)));
    const bool outside = *top < 0 || *left < 0 || *top + *h > in_h || *left + *w > in_w;
    if (outside && oob == "error") {
      return absl::InvalidArgumentError(inferd::StrCat(
          "crop window ", *h, "x", *w, " does not fit in the ", in_h, "x", in_w, " image"));
    }
    if (outside && oob == "trim_to_shape") {
      const int64_t t0 = std::max<int64_t>(*top, 0), l0 = std::max<int64_t>(*left, 0);
      *h = std::min(*top + *h, in_h) - t0;
      *w = std::min(*left + *w, in_w) - l0;
      *top = t0;
      *left = l0;
    }
    return absl::OkStatus();
  }

  float Fill(int c) const {
    if (fill.empty()) return 0.0f;
    return static_cast<float>(fill.size() == 1 ? fill[0] : fill[std::min<size_t>(c, fill.size() - 1)]);
  }
};

// Crop and CropMirrorNormalize share this: read the window (mirrored or not) of an HWC/CHW
// image, normalize per channel, lay out as `out_layout` and pad channels.
class CropMirrorNormalizeOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node, bool is_cmn) {
    auto op = std::make_unique<CropMirrorNormalizeOp>();
    DALI_ASSIGN(crop, CropSpec::Read(node));
    op->crop_ = crop;
    op->is_cmn_ = is_cmn;
    DALI_ASSIGN(dtype, TypeArg(node, "dtype", is_cmn ? DaliType::kFloat : DaliType::kNoType));
    op->dtype_ = dtype;
    if (is_cmn) {
      DALI_ASSIGN(mean, node.Numbers("mean"));
      DALI_ASSIGN(stddev, node.Numbers("std"));
      DALI_ASSIGN(mirror, node.Number("mirror", 0));
      DALI_ASSIGN(scale, node.Number("scale", 1));
      DALI_ASSIGN(shift, node.Number("shift", 0));
      DALI_ASSIGN(layout, node.String("output_layout", "CHW"));
      DALI_ASSIGN(pad, node.Bool("pad_output", false));
      for (double s : stddev) {
        if (s == 0) return Bad(node, "std", "a standard deviation of 0");
      }
      if (layout != "CHW" && layout != "HWC") {
        return Bad(node, "output_layout", inferd::StrCat("'", layout, "': inferd writes CHW or HWC"));
      }
      op->mean_ = mean, op->std_ = stddev;
      op->mirror_ = mirror != 0;
      op->scale_ = scale, op->shift_ = shift;
      op->out_layout_ = layout;
      op->pad_ = pad;
    }
    return op;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext& ctx,
                         Sample* out) const override {
    const Sample& s = *in[0];
    DALI_ASSIGN(ax, ImageAxes(s, is_cmn_ ? "CropMirrorNormalize" : "Crop"));
    const int64_t in_h = s.shape[ax.h], in_w = s.shape[ax.w];
    const int64_t ch = ax.c >= 0 ? s.shape[ax.c] : 1;
    int64_t top, left, h, w;
    if (auto st = crop_.Window(in_h, in_w, &top, &left, &h, &w); !st.ok()) return st;
    if (mean_.size() > 1 && static_cast<int64_t>(mean_.size()) != ch) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "CropMirrorNormalize: ", mean_.size(), " mean values for ", ch, " channels"));
    }
    if (std_.size() > 1 && static_cast<int64_t>(std_.size()) != ch) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "CropMirrorNormalize: ", std_.size(), " std values for ", ch, " channels"));
    }
    if (h * w > ctx.max_pixels) {
      return absl::InvalidArgumentError(
          inferd::StrCat("crop window ", h, "x", w, " is larger than allowed"));
    }
    const int64_t out_ch = pad_ ? std::max<int64_t>(ch, 4) : ch;  // DALI pads 3 -> 4
    out->type = dtype_ == DaliType::kNoType ? s.type : dtype_;
    std::string layout = is_cmn_ ? out_layout_ : s.layout;
    if (layout.empty()) layout = ax.c < 0 ? "HW" : "HWC";
    if (ax.c < 0) layout = "HW";
    out->layout = is_cmn_ || !s.layout.empty() ? layout : "";
    const bool chw = layout == "CHW";
    if (ax.c < 0) {
      out->shape = {h, w};
    } else {
      out->shape = chw ? Shape{out_ch, h, w} : Shape{h, w, out_ch};
    }
    out->values.resize(static_cast<size_t>(out_ch * h * w));
    const auto in_st = Strides(s.shape);
    const int64_t sh = in_st[ax.h], sw = in_st[ax.w], sc = ax.c >= 0 ? in_st[ax.c] : 0;
    std::vector<float> mul(ch), add(ch), fill(out_ch);
    for (int64_t c = 0; c < ch; ++c) {
      const double m = mean_.empty() ? 0 : mean_.size() == 1 ? mean_[0] : mean_[c];
      const double d = std_.empty() ? 1 : std_.size() == 1 ? std_[0] : std_[c];
      mul[c] = static_cast<float>(scale_ / d);
      add[c] = static_cast<float>(shift_ - m * scale_ / d);
    }
    for (int64_t c = 0; c < out_ch; ++c) fill[c] = crop_.Fill(static_cast<int>(c));
    FloatBuffer scratch;
    const float* src = FloatValues(s, &scratch);
    const bool window_inside = top >= 0 && left >= 0 && top + h <= in_h && left + w <= in_w;
    if (window_inside && ax.c == 2 && out_ch == ch) {
      // The common case: an HWC image, the window inside it, no padded channel.
      for (int64_t y = 0; y < h; ++y) {
        const float* srow = src + (top + y) * sh;
        if (ch == 3 && !chw) {
          float* o = &out->values[static_cast<size_t>(y * w * 3)];
          for (int64_t x = 0; x < w; ++x) {
            const float* p = srow + (left + (mirror_ ? w - 1 - x : x)) * 3;
            o[3 * x] = p[0] * mul[0] + add[0];
            o[3 * x + 1] = p[1] * mul[1] + add[1];
            o[3 * x + 2] = p[2] * mul[2] + add[2];
          }
          continue;
        }
        for (int64_t x = 0; x < w; ++x) {
          const float* p = srow + (left + (mirror_ ? w - 1 - x : x)) * sw;
          for (int64_t c = 0; c < ch; ++c) {
            const size_t o = chw ? static_cast<size_t>((c * h + y) * w + x)
                                 : static_cast<size_t>((y * w + x) * ch + c);
            out->values[o] = p[c] * mul[c] + add[c];
          }
        }
      }
      ConvertRow(out->type, out->values.data(), out->values.size());
      return absl::OkStatus();
    }
    for (int64_t y = 0; y < h; ++y) {
      const int64_t sy = top + y;
      for (int64_t x = 0; x < w; ++x) {
        const int64_t sx = left + (mirror_ ? w - 1 - x : x);
        const bool inside = sy >= 0 && sy < in_h && sx >= 0 && sx < in_w;
        for (int64_t c = 0; c < out_ch; ++c) {
          float v;
          if (c >= ch) {
            v = 0.0f;  // the padded channel
          } else if (!inside) {
            v = fill[c];
          } else {
            v = s.At(static_cast<size_t>(sy * sh + sx * sw + c * sc)) * mul[c] + add[c];
          }
          const size_t o = chw ? static_cast<size_t>((c * h + y) * w + x)
                               : static_cast<size_t>((y * w + x) * out_ch + c);
          out->values[o] = ConvertTo(out->type, v);
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  CropSpec crop_;
  bool is_cmn_ = false;
  DaliType dtype_ = DaliType::kNoType;
  std::vector<double> mean_, std_;
  bool mirror_ = false, pad_ = false;
  double scale_ = 1, shift_ = 0;
  std::string out_layout_ = "CHW";
};

// ---------------------------------------------------------------- Normalize
// Over the whole sample: (x - mean) / stddev * scale + shift, mean and stddev given or computed.
class NormalizeOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<NormalizeOp>();
    for (std::string_view a : {"axes", "axis_names"}) {
      if (node.Has(a)) return Bad(node, a, "inferd normalizes over the whole sample only");
    }
    DALI_ASSIGN(batch, node.Bool("batch", false));
    if (batch) return Bad(node, "batch", "inferd normalizes each sample on its own");
    op->has_mean_ = node.Has("mean");
    op->has_std_ = node.Has("stddev");
    DALI_ASSIGN(mean, node.Number("mean", 0));
    DALI_ASSIGN(stddev, node.Number("stddev", 1));
    DALI_ASSIGN(scale, node.Number("scale", 1));
    DALI_ASSIGN(shift, node.Number("shift", 0));
    DALI_ASSIGN(eps, node.Number("epsilon", 0));
    DALI_ASSIGN(ddof, node.Number("ddof", 0));
    DALI_ASSIGN(dtype, TypeArg(node, "dtype", DaliType::kFloat));
    op->mean_ = mean, op->std_ = stddev, op->scale_ = scale, op->shift_ = shift;
    op->eps_ = eps, op->ddof_ = ddof, op->dtype_ = dtype;
    return op;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext&,
                         Sample* out) const override {
    const Sample& s = *in[0];
    const size_t n = s.NumElements();
    double mean = mean_;
    if (!has_mean_) {
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += s.At(i);
      mean = n > 0 ? sum / n : 0;
    }
    double stddev = std_;
    if (!has_std_) {
      double sq = 0;
      for (size_t i = 0; i < n; ++i) sq += (s.At(i) - mean) * (s.At(i) - mean);
      const double denom = static_cast<double>(n) - ddof_;
      stddev = denom > 0 ? std::sqrt(sq / denom + eps_) : 0;
    }
    const double mul = stddev != 0 ? scale_ / stddev : 0;
    out->type = dtype_;
    out->shape = s.shape;
    out->layout = s.layout;
    out->values.resize(n);
    for (size_t i = 0; i < n; ++i) {
      out->values[i] = ConvertTo(dtype_, static_cast<float>((s.At(i) - mean) * mul + shift_));
    }
    return absl::OkStatus();
  }

 private:
  bool has_mean_ = false, has_std_ = false;
  double mean_ = 0, std_ = 1, scale_ = 1, shift_ = 0, eps_ = 0, ddof_ = 0;
  DaliType dtype_ = DaliType::kFloat;
};

// ---------------------------------------------------------------- Cast
class CastOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<CastOp>();
    if (!node.Has("dtype")) return Bad(node, "dtype", "missing");
    DALI_ASSIGN(dtype, TypeArg(node, "dtype", DaliType::kFloat));
    op->dtype_ = dtype;
    return op;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext&,
                         Sample* out) const override {
    const Sample& s = *in[0];
    out->type = dtype_;
    out->shape = s.shape;
    out->layout = s.layout;
    out->values.resize(s.NumElements());
    for (size_t i = 0; i < out->values.size(); ++i) out->values[i] = ConvertTo(dtype_, s.At(i));
    return absl::OkStatus();
  }

 private:
  DaliType dtype_ = DaliType::kFloat;
};

// ---------------------------------------------------------------- Transpose
class TransposeOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<TransposeOp>();
    DALI_ASSIGN(perm, node.Numbers("perm"));
    if (perm.empty()) return Bad(node, "perm", "missing");
    std::vector<bool> seen(perm.size(), false);
    for (double p : perm) {
      if (p < 0 || p >= perm.size() || seen[static_cast<size_t>(p)]) {
        return Bad(node, "perm", "not a permutation");
      }
      seen[static_cast<size_t>(p)] = true;
      op->perm_.push_back(static_cast<int>(p));
    }
    DALI_ASSIGN(tl, node.Bool("transpose_layout", true));
    DALI_ASSIGN(ol, node.String("output_layout", ""));
    op->transpose_layout_ = tl;
    op->output_layout_ = ol;
    return op;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext&,
                         Sample* out) const override {
    const Sample& s = *in[0];
    const size_t nd = perm_.size();
    if (s.shape.size() != nd) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "Transpose: perm has ", nd, " axes, the sample ", s.shape.size()));
    }
    out->type = s.type;
    out->shape.resize(nd);
    for (size_t i = 0; i < nd; ++i) out->shape[i] = s.shape[perm_[i]];
    if (!output_layout_.empty()) {
      out->layout = output_layout_;
    } else if (transpose_layout_ && s.layout.size() == nd) {
      out->layout.resize(nd);
      for (size_t i = 0; i < nd; ++i) out->layout[i] = s.layout[perm_[i]];
    }
    const auto in_st = Strides(s.shape);
    const size_t n = s.NumElements();
    out->values.resize(n);
    std::vector<int64_t> idx(nd, 0);
    for (size_t o = 0; o < n; ++o) {
      int64_t src = 0;
      for (size_t i = 0; i < nd; ++i) src += idx[i] * in_st[perm_[i]];
      out->values[o] = s.At(static_cast<size_t>(src));
      for (int i = static_cast<int>(nd) - 1; i >= 0; --i) {
        if (++idx[i] < out->shape[i]) break;
        idx[i] = 0;
      }
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int> perm_;
  bool transpose_layout_ = true;
  std::string output_layout_;
};

// ---------------------------------------------------------------- ColorSpaceConversion
class ColorSpaceConversionOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<ColorSpaceConversionOp>();
    DALI_ASSIGN(from, node.Number("image_type", -1));
    DALI_ASSIGN(to, node.Number("output_type", -1));
    for (auto [name, v] : {std::pair<std::string_view, double>{"image_type", from},
                           {"output_type", to}}) {
      const int k = static_cast<int>(v);
      if (k != v || (k != kRgb && k != kBgr && k != kGray)) {
        return Bad(node, name, "inferd converts between RGB, BGR and GRAY only");
      }
    }
    op->from_ = static_cast<int>(from);
    op->to_ = static_cast<int>(to);
    return op;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext&,
                         Sample* out) const override {
    const Sample& s = *in[0];
    DALI_ASSIGN(ax, ImageAxes(s, "ColorSpaceConversion"));
    const int64_t in_ch = from_ == kGray ? 1 : 3;
    if (ax.c != 2 || s.shape[2] != in_ch) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "ColorSpaceConversion: expected an HWC image of ", in_ch, " channels, got shape ",
          ShapeToString(s.shape)));
    }
    const int64_t out_ch = to_ == kGray ? 1 : 3;
    const size_t n = static_cast<size_t>(s.shape[0] * s.shape[1]);
    out->type = s.type;
    out->layout = s.layout;
    out->shape = {s.shape[0], s.shape[1], out_ch};
    out->values.resize(n * out_ch);
    for (size_t i = 0; i < n; ++i) {
      float r, g, b;
      if (from_ == kGray) {
        r = g = b = s.At(i);
      } else {
        r = s.At(3 * i + (from_ == kBgr ? 2 : 0));
        g = s.At(3 * i + 1);
        b = s.At(3 * i + (from_ == kBgr ? 0 : 2));
      }
      if (to_ == kGray) {
        out->values[i] = ConvertTo(s.type, 0.299f * r + 0.587f * g + 0.114f * b);
      } else {
        out->values[3 * i] = to_ == kBgr ? b : r;
        out->values[3 * i + 1] = g;
        out->values[3 * i + 2] = to_ == kBgr ? r : b;
      }
    }
    return absl::OkStatus();
  }

 private:
  int from_ = kRgb, to_ = kRgb;
};

// ---------------------------------------------------------------- Reshape
class ReshapeOp : public SampleOperator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<ReshapeOp>();
    DALI_ASSIGN(shape, node.Numbers("shape"));
    DALI_ASSIGN(rel, node.Numbers("rel_shape"));
    if (shape.empty() == rel.empty()) return Bad(node, "shape", "give one of shape and rel_shape");
    if (node.inputs.size() != 1) return Bad(node, "shape", "a shape from an input is not run by inferd");
    int inferred = 0;
    for (double d : shape) {
      if (!(d >= -1 && d <= kMaxExtent)) return Bad(node, "shape", "extent out of range");
      inferred += d == -1;
    }
    if (inferred > 1) return Bad(node, "shape", "more than one -1");
    op->shape_ = shape;
    op->rel_ = rel;
    DALI_ASSIGN(layout, node.String("layout", ""));
    op->layout_ = layout;
    op->has_layout_ = node.Has("layout");
    return op;
  }

 protected:
  absl::Status RunSample(std::span<const Sample* const> in, const RunContext&,
                         Sample* out) const override {
    const Sample& s = *in[0];
    const int64_t n = static_cast<int64_t>(s.NumElements());
    Shape shape;
    if (!rel_.empty()) {
      if (rel_.size() > s.shape.size()) {
        return absl::InvalidArgumentError("Reshape: rel_shape has more axes than the sample");
      }
      for (size_t i = 0; i < rel_.size(); ++i) {
        const double d = std::round(rel_[i] * s.shape[i]);
        if (!(d >= 0 && d <= kMaxExtent)) {
          return absl::InvalidArgumentError("Reshape: rel_shape gives an extent out of range");
        }
        shape.push_back(static_cast<int64_t>(d));
      }
    } else {
      int64_t known = 1;
      int at = -1;
      for (size_t i = 0; i < shape_.size(); ++i) {
        if (shape_[i] == -1) {
          at = static_cast<int>(i);
          shape.push_back(0);
        } else {
          shape.push_back(static_cast<int64_t>(shape_[i]));
          known = std::min<int64_t>(known * shape.back(), int64_t{1} << 40);
        }
      }
      if (at >= 0) shape[at] = known > 0 && known <= n ? n / known : 0;
    }
    double count = 1;
    for (int64_t d : shape) count *= static_cast<double>(d);
    if (count != static_cast<double>(n)) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "Reshape: cannot reshape ", ShapeToString(s.shape), " (", n, " elements) to ",
          ShapeToString(shape)));
    }
    out->type = s.type;
    out->shape = shape;
    out->layout = has_layout_ ? layout_ : (shape.size() == s.shape.size() ? s.layout : "");
    out->values.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out->values[i] = s.At(static_cast<size_t>(i));
    return absl::OkStatus();
  }

 private:
  std::vector<double> shape_, rel_;
  std::string layout_;
  bool has_layout_ = false;
};

// ---------------------------------------------------------------- Pad (batch-level)
class PadOp : public Operator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<PadOp>();
    DALI_ASSIGN(axes, node.Numbers("axes"));
    DALI_ASSIGN(names, node.String("axis_names", ""));
    DALI_ASSIGN(shape, node.Numbers("shape"));
    DALI_ASSIGN(align, node.Numbers("align"));
    DALI_ASSIGN(fill, node.Number("fill_value", 0));
    if (node.Has("axes") && node.Has("axis_names")) return Bad(node, "axes", "give axes or axis_names");
    for (double a : axes) {
      if (!(a >= -64 && a <= 64)) return Bad(node, "axes", "axis out of range");
      op->axes_.push_back(static_cast<int>(a));
    }
    for (const auto* v : {&shape, &align}) {
      for (double d : *v) {
        if (!(d >= -1 && d <= kMaxExtent)) return Bad(node, "shape", "extent out of range");
      }
    }
    op->names_ = names;
    op->shape_ = shape;
    op->align_ = align;
    op->fill_ = static_cast<float>(fill);
    DALI_ASSIGN(to_pow2, node.Bool("shape_to_pow2", false));  // not in every version
    if (to_pow2) return Bad(node, "shape_to_pow2", "not run by inferd");
    return op;
  }

  absl::Status Run(std::span<const Batch* const> inputs, Batch* output,
                   const RunContext& ctx) const override {
    const Batch& in = *inputs[0];
    *output = Batch(in.size());
    size_t nd = 0;
    for (const Sample& s : in) {
      if (s.error.ok()) nd = s.shape.size();
    }
    // Which axes pad: those listed (negative counts from the end), all by default.
    std::vector<int> axes;
    if (!names_.empty()) {
      for (const Sample& s : in) {
        if (!s.error.ok()) continue;
        for (char c : names_) {
          auto at = s.layout.find(c);
          if (at == std::string::npos) {
            return absl::InvalidArgumentError(inferd::StrCat(
                "Pad: axis '", std::string(1, c), "' is not in layout '", s.layout, "'"));
          }
          axes.push_back(static_cast<int>(at));
        }
        break;
      }
    } else if (axes_.empty()) {
      for (size_t i = 0; i < nd; ++i) axes.push_back(static_cast<int>(i));
    } else {
      for (int a : axes_) axes.push_back(a < 0 ? a + static_cast<int>(nd) : a);
    }
    Shape target(nd, -1);
    for (size_t k = 0; k < axes.size(); ++k) {
      if (axes[k] < 0 || static_cast<size_t>(axes[k]) >= nd) {
        return absl::InvalidArgumentError("Pad: axis out of range");
      }
      const double want = shape_.empty() ? -1 : shape_[std::min(k, shape_.size() - 1)];
      int64_t ext = static_cast<int64_t>(want);
      if (want < 0) {  // the batch's largest extent
        ext = 0;
        for (const Sample& s : in) {
          if (s.error.ok() && s.shape.size() == nd) ext = std::max(ext, s.shape[axes[k]]);
        }
      }
      if (!align_.empty()) {
        const int64_t a = static_cast<int64_t>(align_[std::min(k, align_.size() - 1)]);
        if (a > 1) ext = (ext + a - 1) / a * a;
      }
      target[axes[k]] = ext;
    }
    ParallelFor(in.size(), ctx.threads, [&](size_t i) {
      const Sample& s = in[i];
      Sample& out = (*output)[i];
      if (!s.error.ok()) {
        out.error = s.error;
        return;
      }
      if (s.shape.size() != nd) {
        out.error = absl::InvalidArgumentError("Pad: samples of different ranks");
        return;
      }
      out.type = s.type;
      out.layout = s.layout;
      out.shape = s.shape;
      for (size_t d = 0; d < nd; ++d) {
        if (target[d] >= 0) out.shape[d] = std::max(target[d], s.shape[d]);
      }
      int64_t count = 1;
      for (int64_t d : out.shape) {
        count *= d;
        if (count > ctx.max_pixels * 4) {
          out.error = absl::InvalidArgumentError("Pad: the padded sample is larger than allowed");
          return;
        }
      }
      out.values.assign(static_cast<size_t>(count), ConvertTo(s.type, fill_));
      const auto in_st = Strides(s.shape), out_st = Strides(out.shape);
      std::vector<int64_t> idx(nd, 0);
      const size_t n = s.NumElements();
      for (size_t e = 0; e < n; ++e) {
        int64_t o = 0;
        for (size_t d = 0; d < nd; ++d) o += idx[d] * out_st[d];
        out.values[static_cast<size_t>(o)] = s.At(e);
        for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
          if (++idx[d] < s.shape[d]) break;
          idx[d] = 0;
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  std::vector<int> axes_;
  std::string names_;
  std::vector<double> shape_, align_;
  float fill_ = 0;
};

// ---------------------------------------------------------------- Constant
class ConstantOp : public Operator {
 public:
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<ConstantOp>();
    DALI_ASSIGN(f, node.Numbers("fdata"));
    DALI_ASSIGN(i, node.Numbers("idata"));
    DALI_ASSIGN(shape, node.Numbers("shape"));
    DALI_ASSIGN(layout, node.String("layout", ""));
    DALI_ASSIGN(dtype, TypeArg(node, "dtype", f.empty() ? DaliType::kInt32 : DaliType::kFloat));
    if (f.empty() == i.empty()) return Bad(node, "fdata", "give one of fdata and idata");
    const auto& data = f.empty() ? i : f;
    int64_t count = 1;
    for (double d : shape) {
      if (d < 0 || d > (1 << 24)) return Bad(node, "shape", "extent out of range");
      op->sample_.shape.push_back(static_cast<int64_t>(d));
      count *= op->sample_.shape.back();
      if (count > (1 << 20)) return Bad(node, "shape", "more than 2^20 elements");
    }
    if (shape.empty()) op->sample_.shape = {static_cast<int64_t>(data.size())};
    if (shape.empty()) count = static_cast<int64_t>(data.size());
    if (data.size() != 1 && static_cast<int64_t>(data.size()) != count) {
      return Bad(node, "shape", "does not match the number of values");
    }
    op->sample_.type = dtype;
    op->sample_.layout = layout;
    for (int64_t k = 0; k < count; ++k) {
      op->sample_.values.push_back(
          ConvertTo(dtype, static_cast<float>(data[data.size() == 1 ? 0 : k])));
    }
    return op;
  }

  absl::Status Run(std::span<const Batch* const>, Batch* output,
                   const RunContext& ctx) const override {
    output->assign(ctx.batch_size, sample_);
    return absl::OkStatus();
  }

 private:
  Sample sample_;
};

// ---------------------------------------------------------------- ArithmeticGenericOp
// expression_desc as DALI's Python writes it: `name(arg arg ...)` where an arg is `&i`
// (the i-th input), `$j:type` (the j-th integer or real constant) or a nested expression.
struct Expr {
  enum Kind { kInput, kConst, kCall } kind = kInput;
  std::string fn;  // for kCall
  int index = 0;
  float value = 0;
  DaliType type = DaliType::kFloat;
  std::vector<Expr> args;
};

class ExprParser {
 public:
  ExprParser(std::string_view s, const std::vector<double>& ints, const std::vector<double>& reals)
      : s_(s), ints_(ints), reals_(reals) {}

  absl::StatusOr<Expr> ParseAll() {
    auto e = Parse(0);
    if (!e.ok()) return e;
    Skip();
    if (pos_ != s_.size()) return Err("trailing characters");
    return e;
  }

 private:
  absl::Status Err(std::string_view what) const {
    return absl::InvalidArgumentError(inferd::StrCat("expression_desc '", s_, "': ", what,
                                                     " at position ", pos_));
  }
  void Skip() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  absl::StatusOr<int> Index() {
    size_t start = pos_;
    int v = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_])) && v < 1000000) {
      v = v * 10 + (s_[pos_++] - '0');
    }
    if (pos_ == start) return Err("expected a number");
    return v;
  }
  absl::StatusOr<Expr> Parse(int depth) {
    if (depth > 32) return Err("nested too deeply");
    Skip();
    if (pos_ >= s_.size()) return Err("unexpected end");
    Expr e;
    if (s_[pos_] == '&') {
      ++pos_;
      e.kind = Expr::kInput;
      DALI_ASSIGN(i, Index());
      e.index = i;
      return e;
    }
    if (s_[pos_] == '$') {
      ++pos_;
      e.kind = Expr::kConst;
      DALI_ASSIGN(i, Index());
      if (pos_ >= s_.size() || s_[pos_] != ':') return Err("expected ':' after a constant");
      ++pos_;
      size_t start = pos_;
      while (pos_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      const std::string_view t = s_.substr(start, pos_ - start);
      static const std::pair<std::string_view, DaliType> kTypes[] = {
          {"uint8", DaliType::kUint8},   {"uint16", DaliType::kUint16},
          {"uint32", DaliType::kUint32}, {"uint64", DaliType::kUint64},
          {"int8", DaliType::kInt8},     {"int16", DaliType::kInt16},
          {"int32", DaliType::kInt32},   {"int64", DaliType::kInt64},
          {"float16", DaliType::kFloat16}, {"float32", DaliType::kFloat},
          {"float64", DaliType::kFloat64}, {"bool", DaliType::kBool}};
      e.type = DaliType::kNoType;
      for (auto [name, type] : kTypes) {
        if (t == name) e.type = type;
      }
      if (e.type == DaliType::kNoType) return Err(inferd::StrCat("unknown constant type '", t, "'"));
      const auto& pool = IsFloat(e.type) ? reals_ : ints_;
      if (static_cast<size_t>(i) >= pool.size()) return Err("constant index out of range");
      e.value = static_cast<float>(pool[i]);
      return e;
    }
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    e.kind = Expr::kCall;
    e.fn = std::string(s_.substr(start, pos_ - start));
    if (e.fn.empty()) return Err("expected a function name");
    Skip();
    if (pos_ >= s_.size() || s_[pos_] != '(') return Err("expected '('");
    ++pos_;
    while (true) {
      Skip();
      if (pos_ < s_.size() && s_[pos_] == ')') {
        ++pos_;
        break;
      }
      DALI_ASSIGN(arg, Parse(depth + 1));
      e.args.push_back(std::move(arg));
    }
    return e;
  }

  std::string_view s_;
  size_t pos_ = 0;
  const std::vector<double>& ints_;
  const std::vector<double>& reals_;
};

// DALI's type promotion, simplified: any float operand gives FLOAT (FLOAT64 if one is), else
// the wider integer type (signed when the two disagree), true division gives FLOAT.
DaliType Promote(DaliType a, DaliType b) {
  if (a == b) return a;
  if (a == DaliType::kFloat64 || b == DaliType::kFloat64) return DaliType::kFloat64;
  if (IsFloat(a) || IsFloat(b)) {
    if (IsFloat(a) && IsFloat(b)) return DaliType::kFloat;
    return IsFloat(a) ? a : b;
  }
  if (a == DaliType::kBool) return b;
  if (b == DaliType::kBool) return a;
  auto size = [](DaliType t) {
    switch (t) {
      case DaliType::kUint8: case DaliType::kInt8: return 1;
      case DaliType::kUint16: case DaliType::kInt16: return 2;
      case DaliType::kUint32: case DaliType::kInt32: return 4;
      default: return 8;
    }
  };
  auto is_signed = [](DaliType t) { return static_cast<int>(t) >= 4; };
  const int sz = std::max(size(a), size(b));
  const bool sgn = is_signed(a) || is_signed(b);
  if (!sgn) return sz == 1 ? DaliType::kUint8 : sz == 2 ? DaliType::kUint16 : sz == 4 ? DaliType::kUint32 : DaliType::kUint64;
  // a signed type at least as wide as the unsigned one
  int need = 0;
  for (DaliType t : {a, b}) need = std::max(need, is_signed(t) ? size(t) : std::min(8, size(t) * 2));
  return need == 1 ? DaliType::kInt8 : need == 2 ? DaliType::kInt16 : need == 4 ? DaliType::kInt32 : DaliType::kInt64;
}

// The type of a binary operation's result: DALI's promotion table; true division of integers
// gives FLOAT.
DaliType ResultType(std::string_view fn, DaliType a, DaliType b) {
  const DaliType t = Promote(a, b);
  return fn == "fdiv" && !IsFloat(t) ? DaliType::kFloat : t;
}

// The type an expression yields for inputs of `inputs` types (kNoType where unknown).
DaliType ExprType(const Expr& e, std::span<const DaliType> inputs) {
  switch (e.kind) {
    case Expr::kInput:
      return static_cast<size_t>(e.index) < inputs.size() ? inputs[e.index] : DaliType::kNoType;
    case Expr::kConst:
      return e.type;
    case Expr::kCall:
      break;
  }
  if (e.args.size() == 1) return ExprType(e.args[0], inputs);
  if (e.args.size() != 2) return DaliType::kNoType;
  const DaliType a = ExprType(e.args[0], inputs), b = ExprType(e.args[1], inputs);
  if (a == DaliType::kNoType || b == DaliType::kNoType) return DaliType::kNoType;
  return ResultType(e.fn, a, b);
}

class ArithmeticOp : public SampleOperator {
 public:
  size_t MinInputs() const override { return 0; }  // inputs are checked by index (Check)
  static absl::StatusOr<std::unique_ptr<Operator>> Make(const OpNode& node) {
    auto op = std::make_unique<ArithmeticOp>();
    DALI_ASSIGN(desc, node.String("expression_desc", ""));
    DALI_ASSIGN(ints, node.Numbers("integer_constants"));
    DALI_ASSIGN(reals, node.Numbers("real_constants"));
    ExprParser parser(desc, ints, reals);
    auto e = parser.ParseAll();
    if (!e.ok()) return Bad(node, "expression_desc", std::string(e.status().message()));
    if (auto st = Check(*e, node.inputs.size()); !st.ok()) {
      return Bad(node, "expression_desc", std::string(st.message()));
    }
    op->expr_ = *std::move(e);
    return op;
  }

 protected:
  // A value being computed: a tensor (shape, values) or a scalar constant.
  struct Val {
    DaliType type;
    Shape shape;  // empty: scalar
    std::string layout;
    std::vector<float> v;
    bool weak = false;  // a Python constant: takes the tensor operand's type where it can
  };

  static absl::Status Check(const Expr& e, size_t inputs) {
    if (e.kind == Expr::kInput && static_cast<size_t>(e.index) >= inputs) {
      return absl::InvalidArgumentError("input index out of range");
    }
    if (e.kind != Expr::kCall) return absl::OkStatus();
    static const std::string_view kBinary[] = {"add", "sub", "mul", "div", "fdiv", "min", "max"};
    static const std::string_view kUnary[] = {"minus", "plus"};
    bool binary = std::find(std::begin(kBinary), std::end(kBinary), e.fn) != std::end(kBinary);
    bool unary = std::find(std::begin(kUnary), std::end(kUnary), e.fn) != std::end(kUnary);
    if (!binary && !unary) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "operation '", e.fn, "' is not run by inferd (add, sub, mul, div, fdiv, min, max, "
          "minus, plus are)"));
    }
    if (e.args.size() != (binary ? 2u : 1u)) {
      return absl::InvalidArgumentError(inferd::StrCat("'", e.fn, "' takes ", binary ? 2 : 1,
                                                       " operands, got ", e.args.size()));
    }
    for (const Expr& a : e.args) {
      if (auto st = Check(a, inputs); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<Val> Eval(const Expr& e, std::span<const Sample* const> in) {
    if (e.kind == Expr::kInput) {
      const Sample& s = *in[e.index];
      Val v{s.type, s.shape, s.layout, {}};
      v.v.resize(s.NumElements());
      for (size_t i = 0; i < v.v.size(); ++i) v.v[i] = s.At(i);
      return v;
    }
    if (e.kind == Expr::kConst) return Val{e.type, {}, "", {e.value}, true};
    std::vector<Val> a;
    for (const Expr& x : e.args) {
      DALI_ASSIGN(v, Eval(x, in));
      a.push_back(std::move(v));
    }
    if (a.size() == 1) {
      if (e.fn == "minus") {
        for (float& x : a[0].v) x = -x;
      }
      return std::move(a[0]);
    }
    // Broadcast numpy-style (a scalar constant is a 0-d tensor).
    const Shape& sa = a[0].shape;
    const Shape& sb = a[1].shape;
    const size_t nd = std::max(sa.size(), sb.size());
    Shape out(nd);
    auto ext = [&](const Shape& s, size_t d) -> int64_t {
      const size_t off = nd - s.size();
      return d < off ? 1 : s[d - off];
    };
    for (size_t d = 0; d < nd; ++d) {
      const int64_t x = ext(sa, d), y = ext(sb, d);
      if (x != y && x != 1 && y != 1) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "arithmetic: shapes ", ShapeToString(sa), " and ", ShapeToString(sb),
            " do not broadcast"));
      }
      out[d] = std::max(x, y);
    }
    // A constant is an operand of its serialized type ("$0:int32": a Python int is int32, a
    // float float32) in DALI's promotion table, as any tensor is: a UINT8 tensor * 2 is INT32
    // (Triton's DALI backend QA declares exactly that for `y * 2`).
    const DaliType type = ResultType(e.fn, a[0].type, a[1].type);
    Val r{type, out, a[0].shape.size() == nd ? a[0].layout : a[1].layout, {},
          a[0].weak && a[1].weak};
    int64_t n = 1;
    for (int64_t d : out) n *= d;
    r.v.resize(static_cast<size_t>(n));
    auto strides_for = [&](const Shape& s) {
      std::vector<int64_t> st(nd, 0);
      int64_t acc = 1;
      for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
        const int64_t x = ext(s, d);
        st[d] = x == 1 ? 0 : acc;
        acc *= x;
      }
      return st;
    };
    const auto ta = strides_for(sa), tb = strides_for(sb);
    std::vector<int64_t> idx(nd, 0);
    const bool integer = !IsFloat(type);
    for (int64_t o = 0; o < n; ++o) {
      int64_t ia = 0, ib = 0;
      for (size_t d = 0; d < nd; ++d) {
        ia += idx[d] * ta[d];
        ib += idx[d] * tb[d];
      }
      const float x = a[0].v[ia], y = a[1].v[ib];
      float z;
      if (e.fn == "add") z = x + y;
      else if (e.fn == "sub") z = x - y;
      else if (e.fn == "mul") z = x * y;
      else if (e.fn == "fdiv") z = x / y;
      else if (e.fn == "div") z = integer ? (y == 0 ? 0.0f : std::trunc(x / y)) : x / y;
      else if (e.fn == "min") z = std::min(x, y);
      else z = std::max(x, y);
      r.v[o] = integer ? ConvertTo(type, z) : z;
      for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
        if (++idx[d] < out[d]) break;
        idx[d] = 0;
      }
    }
    return r;
  }

  absl::Status RunSample(std::span<const Sample* const> in, const RunContext&,
                         Sample* out) const override {
    DALI_ASSIGN(v, Eval(expr_, in));
    out->type = v.type;
    out->shape = v.shape.empty() ? Shape{1} : v.shape;
    out->layout = v.layout;
    out->values.assign(v.v.begin(), v.v.end());
    for (float& x : out->values) x = ConvertTo(out->type, x);
    return absl::OkStatus();
  }

 private:
  Expr expr_;
};

}  // namespace

std::span<const std::string_view> SupportedOperators() { return kSupported; }

float ConvertTo(DaliType type, float v) {
  auto sat = [&](double lo, double hi) {
    if (std::isnan(v)) return 0.0f;
    return static_cast<float>(std::clamp<double>(std::nearbyint(v), lo, hi));
  };
  switch (type) {
    case DaliType::kUint8: return sat(0, 255);
    case DaliType::kUint16: return sat(0, 65535);
    // The 32- and 64-bit bounds are the largest floats below 2^32, 2^64, 2^31, 2^63, so that
    // storing the value as the integer type is defined.
    case DaliType::kUint32: return sat(0, 4294967040.0);
    case DaliType::kUint64: return sat(0, 18446742974197923840.0);
    case DaliType::kInt8: return sat(-128, 127);
    case DaliType::kInt16: return sat(-32768, 32767);
    case DaliType::kInt32: return sat(-2147483648.0, 2147483520.0);
    case DaliType::kInt64: return sat(-9223372036854775808.0, 9223371487098961920.0);
    case DaliType::kBool: return v != 0.0f ? 1.0f : 0.0f;
    default: return v;
  }
}

absl::StatusOr<std::unique_ptr<Operator>> MakeOperator(const OpNode& node) {
  const std::string& op = node.op;
  if (op == "decoders__Image" || op == "ImageDecoder") return ImageDecoderOp::Make(node);
  if (op == "Resize") return ResizeOp::Make(node);
  if (op == "Crop") return CropMirrorNormalizeOp::Make(node, false);
  if (op == "CropMirrorNormalize") return CropMirrorNormalizeOp::Make(node, true);
  if (op == "Normalize") return NormalizeOp::Make(node);
  if (op == "Cast") return CastOp::Make(node);
  if (op == "Transpose") return TransposeOp::Make(node);
  if (op == "ColorSpaceConversion") return ColorSpaceConversionOp::Make(node);
  if (op == "Reshape") return ReshapeOp::Make(node);
  if (op == "Pad") return PadOp::Make(node);
  if (op == "Constant") return ConstantOp::Make(node);
  if (op == "ArithmeticGenericOp") return ArithmeticOp::Make(node);
  return absl::UnimplementedError(inferd::StrCat(
      node.Label(), " is not run by inferd's dali backend; it runs ",
      inferd::StrJoin(SupportedOperators(), ", ")));
}

}  // namespace inferd::backends::dali

namespace inferd::backends::dali {

OutputMeta InferOutputMeta(const OpNode& node, std::span<const OutputMeta> inputs) {
  const OutputMeta in = inputs.empty() ? OutputMeta{} : inputs[0];
  auto dtype = [&](DaliType fallback) {
    auto t = TypeArg(node, "dtype", fallback);
    return t.ok() ? *t : DaliType::kNoType;
  };
  const std::string& op = node.op;
  if (op == "ExternalSource") {
    auto ndim = node.Number("ndim", -1);
    return {dtype(DaliType::kNoType), ndim.ok() ? static_cast<int>(*ndim) : -1};
  }
  if (op == "decoders__Image" || op == "ImageDecoder") return {DaliType::kUint8, 3};
  if (op == "Resize" || op == "Crop") return {dtype(in.type), in.ndim};
  if (op == "CropMirrorNormalize") return {dtype(DaliType::kFloat), in.ndim};
  if (op == "Normalize") return {dtype(DaliType::kFloat), in.ndim};
  if (op == "Cast") return {dtype(DaliType::kNoType), in.ndim};
  if (op == "Transpose" || op == "Pad") return in;
  if (op == "ColorSpaceConversion") return in;
  if (op == "Reshape") {
    auto shape = node.Numbers("shape");
    auto rel = node.Numbers("rel_shape");
    int nd = -1;
    if (shape.ok() && !shape->empty()) nd = static_cast<int>(shape->size());
    if (rel.ok() && !rel->empty()) nd = static_cast<int>(rel->size());
    return {in.type, nd};
  }
  if (op == "Constant") {
    auto f = node.Numbers("fdata");
    auto shape = node.Numbers("shape");
    const bool is_float = f.ok() && !f->empty();
    const int nd = shape.ok() && !shape->empty() ? static_cast<int>(shape->size()) : 1;
    return {dtype(is_float ? DaliType::kFloat : DaliType::kInt32), nd};
  }
  if (op == "ArithmeticGenericOp") {
    std::vector<DaliType> types;
    int nd = -1;
    for (const OutputMeta& m : inputs) {
      if (m.type == DaliType::kNoType) return {};
      types.push_back(m.type);
      nd = std::max(nd, m.ndim);
    }
    auto desc = node.String("expression_desc", "");
    auto ints = node.Numbers("integer_constants");
    auto reals = node.Numbers("real_constants");
    if (!desc.ok() || !ints.ok() || !reals.ok()) return {};
    ExprParser parser(*desc, *ints, *reals);
    auto e = parser.ParseAll();
    if (!e.ok()) return {};
    return {ExprType(*e, types), nd};
  }
  return {};
}

}  // namespace inferd::backends::dali
