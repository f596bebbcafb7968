// The image preprocessing kernel's maths (gpu/image_preprocess_math.h), run per output element
// on the host as the kernel runs it per thread, against the CPU image code (image_transform.cc)
// over random images and settings; and, where there is a GPU, the real kernel against the CPU.
//
// The CPU path calls the same functions (TapAt, Blend, Normalize, ToUint8, OutputIndex) and the
// functions avoid fused multiply-adds on the device, so the comparison is bit for bit. Because
// the CPU path and the per-element path share those functions, an independent double-precision
// reference (torchvision's half-pixel bilinear / nearest, written out here) checks the shared
// sampling itself, within 1e-3 of a pixel level (float rounding of values up to 255).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/image/image_transform.h"
#include "common/data_type.h"
#include "gpu/image_preprocess_kernel.h"
#include "gpu/image_preprocess_math.h"
#include "gpu/runtime.h"
#include "gtest/gtest.h"

namespace inferd::backends::image {
namespace {

namespace math = ::inferd::gpu::image_math;

RgbImage RandomImage(std::mt19937& rng, int width, int height) {
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(static_cast<size_t>(width) * height * 3);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& p : image.pixels) p = static_cast<uint8_t>(byte(rng));
  return image;
}

struct Case {
  RgbImage image;
  PreprocessSettings settings;
  std::string Describe() const {
    const auto& s = settings;
    return "image " + std::to_string(image.width) + "x" + std::to_string(image.height) +
           " -> " + std::to_string(s.output_width) + "x" + std::to_string(s.output_height) +
           (s.resize_mode == ResizeMode::kStretch
                ? " stretch"
                : " shorter " + std::to_string(s.resize_shorter) + " + crop") +
           (s.interpolation == Interpolation::kNearest ? " nearest" : " bilinear") +
           (s.layout == Layout::kNCHW ? " NCHW" : " NHWC") +
           (s.channel_order == ChannelOrder::kRGB ? " RGB" : " BGR") +
           (s.output_type == DataType::kFp32   ? " FP32"
            : s.output_type == DataType::kFp16 ? " FP16"
                                               : " UINT8");
  }
};

// Sizes from 1 pixel up, odd and even, so that both upscaling and downscaling (and extreme
// aspect ratios) occur; every knob of PreprocessSettings drawn at random.
Case RandomCase(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Case c;
  c.image = RandomImage(rng, pick(1, 61), pick(1, 61));
  PreprocessSettings& s = c.settings;
  s.output_width = pick(1, 40);
  s.output_height = pick(1, 40);
  s.resize_mode = pick(0, 1) ? ResizeMode::kStretch : ResizeMode::kShorterSideCenterCrop;
  if (s.resize_mode == ResizeMode::kShorterSideCenterCrop) {
    const int least = std::max(s.output_width, s.output_height);
    s.resize_shorter = pick(least, least + 30);
  }
  s.interpolation = pick(0, 1) ? Interpolation::kBilinear : Interpolation::kNearest;
  s.layout = pick(0, 1) ? Layout::kNCHW : Layout::kNHWC;
  s.channel_order = pick(0, 1) ? ChannelOrder::kRGB : ChannelOrder::kBGR;
  const int type = pick(0, 5);
  s.output_type = type < 3 ? DataType::kFp32 : type < 5 ? DataType::kFp16 : DataType::kUint8;
  if (s.output_type != DataType::kUint8) {
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    s.scale = pick(0, 1) ? 1.0f / 255.0f : 0.5f + unit(rng);
    for (int ch = 0; ch < 3; ++ch) {
      s.mean[ch] = unit(rng) - 0.2f;
      s.std[ch] = 0.05f + unit(rng);
    }
  } else {
    s.scale = 1.0f;
  }
  return c;
}

size_t ItemBytes(const PreprocessSettings& s) {
  return static_cast<size_t>(s.output_width) * s.output_height * 3 *
         DataTypeSize(s.output_type);
}

std::vector<uint8_t> CpuOutput(const Case& c) {
  std::vector<uint8_t> out(ItemBytes(c.settings));
  Preprocess(c.image, c.settings, out.data());
  return out;
}

// What the kernel computes, element by element, on the host: gpu::ImagePreprocessOnHost, the
// kernel's per-thread body in a loop (what the image backend's fake-GPU tests run in place of
// the launch, so those tests' exactness is this one's).
std::vector<uint8_t> PerElementOutput(const Case& c) {
  const math::PreprocessParams p = MathParamsFor(c.image.width, c.image.height, c.settings);
  std::vector<uint8_t> out(ItemBytes(c.settings));
  const absl::Status st = gpu::ImagePreprocessOnHost(c.image.pixels.data(), p, out.data());
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// The first element where two outputs differ, as text; empty when they are the same bits.
std::string FirstDifference(const Case& c, const std::vector<uint8_t>& want,
                            const std::vector<uint8_t>& got) {
  const bool fp32 = c.settings.output_type == DataType::kFp32;
  const size_t width = DataTypeSize(c.settings.output_type);
  for (size_t i = 0; i < want.size() / width; ++i) {
    if (std::memcmp(want.data() + i * width, got.data() + i * width, width) == 0) continue;
    if (width == 2) {
      uint16_t a, b;
      std::memcpy(&a, want.data() + i * width, width);
      std::memcpy(&b, got.data() + i * width, width);
      return "element " + std::to_string(i) + ": CPU half " + std::to_string(HalfToFloat(a)) +
             " (bits " + std::to_string(a) + "), got " + std::to_string(HalfToFloat(b)) +
             " (bits " + std::to_string(b) + ")";
    }
    if (fp32) {
      float a, b;
      std::memcpy(&a, want.data() + i * width, width);
      std::memcpy(&b, got.data() + i * width, width);
      return "element " + std::to_string(i) + ": CPU " + std::to_string(a) + ", got " +
             std::to_string(b);
    }
    return "element " + std::to_string(i) + ": CPU " + std::to_string(want[i]) + ", got " +
           std::to_string(got[i]);
  }
  return "";
}

TEST(ImagePreprocessMathTest, PerElementMathsEqualsCpuBitForBit) {
  std::mt19937 rng(20261126);
  for (int i = 0; i < 400; ++i) {
    const Case c = RandomCase(rng);
    const std::string diff = FirstDifference(c, CpuOutput(c), PerElementOutput(c));
    ASSERT_EQ(diff, "") << "case " << i << ": " << c.Describe();
  }
}

// ImageNet's settings on a camera-sized image, as the image_classifier example runs them.
Case ImageNetCase() {
  std::mt19937 rng(7);
  Case c;
  c.image = RandomImage(rng, 641, 479);
  c.settings.output_width = c.settings.output_height = 224;
  c.settings.resize_mode = ResizeMode::kShorterSideCenterCrop;
  c.settings.resize_shorter = 256;
  c.settings.mean = {0.485f, 0.456f, 0.406f};
  c.settings.std = {0.229f, 0.224f, 0.225f};
  return c;
}

TEST(ImagePreprocessMathTest, ImageNetSettingsOnLargeImage) {
  const Case c = ImageNetCase();
  EXPECT_EQ(FirstDifference(c, CpuOutput(c), PerElementOutput(c)), "") << c.Describe();
}

// An independent reference of the sampling (double precision, written from torchvision's
// definition rather than from the shared functions), so that a mistake in the shared maths,
// which the CPU path would share, is caught too.
double ReferenceSample(const RgbImage& image, const math::PreprocessParams& p, int x, int y,
                       int source_channel) {
  auto axis = [&](int in, int resized, int offset, int d, int* lo, int* hi, double* w) {
    const double centre = (d + offset + 0.5) * in / resized;
    if (p.nearest) {
      *lo = *hi = std::min(static_cast<int>(std::floor(centre)), in - 1);
      *w = 0;
      return;
    }
    const double src = std::max(centre - 0.5, 0.0);
    *lo = std::min(static_cast<int>(std::floor(src)), in - 1);
    *hi = std::min(*lo + 1, in - 1);
    *w = src - *lo;
  };
  int x0, x1, y0, y1;
  double wx, wy;
  axis(p.src_width, p.resized_width, p.crop_left, x, &x0, &x1, &wx);
  axis(p.src_height, p.resized_height, p.crop_top, y, &y0, &y1, &wy);
  auto at = [&](int xx, int yy) {
    return static_cast<double>(
        image.pixels[(static_cast<size_t>(yy) * image.width + xx) * 3 + source_channel]);
  };
  return (1 - wy) * ((1 - wx) * at(x0, y0) + wx * at(x1, y0)) +
         wy * ((1 - wx) * at(x0, y1) + wx * at(x1, y1));
}

TEST(ImagePreprocessMathTest, SamplingMatchesIndependentReference) {
  std::mt19937 rng(99);
  for (int i = 0; i < 200; ++i) {
    const Case c = RandomCase(rng);
    const math::PreprocessParams p = MathParamsFor(c.image.width, c.image.height, c.settings);
    const int64_t plane = static_cast<int64_t>(p.out_width) * p.out_height;
    for (int64_t index = 0; index < math::OutputElements(p); ++index) {
      const int ch = p.nchw ? static_cast<int>(index / plane) : static_cast<int>(index % 3);
      const int64_t pixel = p.nchw ? index % plane : index / 3;
      const int y = static_cast<int>(pixel / p.out_width);
      const int x = static_cast<int>(pixel % p.out_width);
      const double want = ReferenceSample(c.image, p, x, y, p.source_channel[ch]);
      const float got = math::ResizedValue(c.image.pixels.data(), p, index);
      ASSERT_NEAR(got, want, 1e-3) << "case " << i << " (" << c.Describe() << "), output x " << x
                                   << " y " << y << " channel " << ch;
    }
  }
}

// ---- FP16 output ----

// float -> half by another route than math::HalfBits: the nearest of the finite halves, found by
// bisection over their values (HalfToFloat is exact), ties to the even bit pattern, in double
// arithmetic; past the largest half by at least half its spacing (65520), infinity.
uint16_t ReferenceHalf(float v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(v));
  if (std::isnan(v)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0, hi = 0x7bff;  // HalfToFloat(lo) <= a < HalfToFloat(hi + 1)
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (HalfToFloat(mid) <= a) {
      lo = mid;
    } else {
      hi = static_cast<uint16_t>(mid - 1);
    }
  }
  if (lo == 0x7bff) return sign | lo;  // a < 65520: 65504 is nearest
  const double below = a - HalfToFloat(lo);
  const double above = static_cast<double>(HalfToFloat(static_cast<uint16_t>(lo + 1))) - a;
  uint16_t h = lo;
  if (above < below || (above == below && (lo & 1))) h = static_cast<uint16_t>(lo + 1);
  return sign | h;
}

void ExpectHalf(float v) {
  const uint16_t got = math::HalfBits(v);
  const uint16_t want = ReferenceHalf(v);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (std::isnan(v)) {
    EXPECT_EQ(got & 0x7c00, 0x7c00) << bits;
    EXPECT_NE(got & 0x3ff, 0) << bits;
    return;
  }
  ASSERT_EQ(got, want) << "float bits " << bits << " (" << v << ")";
  ASSERT_EQ(got, FloatToHalf(v)) << "float bits " << bits << " (" << v << ")";
}

TEST(ImagePreprocessMathTest, HalfBitsRoundsToNearestEven) {
  // Every half, the exact midpoints between neighbours (the ties) and the floats just either
  // side of them, both signs: every rounding boundary there is.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float x = HalfToFloat(static_cast<uint16_t>(h));
    const float next = h + 1 < 0x7c00 ? HalfToFloat(static_cast<uint16_t>(h + 1)) : 65536.0f;
    const float mid = static_cast<float>((static_cast<double>(x) + next) / 2);  // exact
    for (float v : {x, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      ExpectHalf(v);
      ExpectHalf(-v);
    }
  }
  for (float v : {0.0f, -0.0f, 1e-30f, 5.96e-8f, 2.98e-8f, 65504.0f, 65519.99f, 65520.0f, 1e10f,
                  INFINITY, -INFINITY, NAN}) {
    ExpectHalf(v);
  }
  std::mt19937 rng(16);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = rng();
    float v;
    std::memcpy(&v, &bits, 4);
    ExpectHalf(v);
  }
}

// The CPU's FP16 output is its FP32 output rounded to half (by the reference conversion), and
// the kernel's body gives the same bits (PerElementMathsEqualsCpuBitForBit covers FP16 too).
TEST(ImagePreprocessMathTest, Fp16OutputIsTheFp32OutputRoundedToHalf) {
  std::mt19937 rng(1616);
  for (int i = 0; i < 200; ++i) {
    Case c = i == 0 ? ImageNetCase() : RandomCase(rng);
    if (c.settings.output_type == DataType::kUint8) continue;
    c.settings.output_type = DataType::kFp32;
    const std::vector<uint8_t> fp32 = CpuOutput(c);
    c.settings.output_type = DataType::kFp16;
    const std::vector<uint8_t> fp16 = CpuOutput(c);
    ASSERT_EQ(fp16.size() * 2, fp32.size());
    std::vector<uint8_t> want(fp16.size());
    for (size_t e = 0; e < fp16.size() / 2; ++e) {
      float v;
      std::memcpy(&v, fp32.data() + 4 * e, 4);
      const uint16_t h = ReferenceHalf(v);
      std::memcpy(want.data() + 2 * e, &h, 2);
    }
    ASSERT_EQ(FirstDifference(c, want, fp16), "") << "case " << i << ": " << c.Describe();
    ASSERT_EQ(FirstDifference(c, fp16, PerElementOutput(c)), "") << "case " << i;
  }
}

// The real kernel against the CPU path. Needs a CUDA device; skipped (with the reason) where
// there is none, as in CI. Runs on the GPU machine (tests/gpu/check.sh).
TEST(ImagePreprocessKernelTest, KernelEqualsCpuBitForBit) {
  if (!gpu::ImagePreprocessKernelBuilt()) {
    GTEST_SKIP() << "this build has no CUDA (INFERD_WITH_CUDA): no kernel to run";
  }
  gpu::Runtime& runtime = gpu::SystemRuntime();
  if (runtime.DeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device: " << runtime.UnavailableReason();
  }
  auto stream = runtime.CreateStream(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::mt19937 rng(4242);
  for (int i = 0; i < 200; ++i) {
    const Case c = i == 0 ? ImageNetCase() : RandomCase(rng);
    const math::PreprocessParams p = MathParamsFor(c.image.width, c.image.height, c.settings);
    const size_t out_bytes = ItemBytes(c.settings);
    auto pixels = runtime.AllocateDevice(0, c.image.pixels.size());
    ASSERT_TRUE(pixels.ok()) << pixels.status();
    auto out = runtime.AllocateDevice(0, out_bytes);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(runtime
                    .CopyAsync((*pixels)->data(), c.image.pixels.data(), c.image.pixels.size(),
                               gpu::CopyKind::kHostToDevice, **stream)
                    .ok());
    const absl::Status launched = gpu::LaunchImagePreprocess(
        static_cast<const uint8_t*>((*pixels)->data()), p, (*out)->data(), **stream);
    ASSERT_TRUE(launched.ok()) << launched;
    std::vector<uint8_t> got(out_bytes);
    ASSERT_TRUE(runtime
                    .CopyAsync(got.data(), (*out)->data(), out_bytes, gpu::CopyKind::kDeviceToHost,
                               **stream)
                    .ok());
    const absl::Status synced = (*stream)->Synchronize();
    ASSERT_TRUE(synced.ok()) << synced;
    ASSERT_EQ(FirstDifference(c, CpuOutput(c), got), "") << "case " << i << ": " << c.Describe();
  }
}

TEST(ImagePreprocessKernelTest, LaunchRefusesBadSizes) {
  math::PreprocessParams p;  // all sizes 0
  class NoStream : public gpu::Stream {
   public:
    int device() const override { return 0; }
    absl::Status Synchronize() override { return absl::OkStatus(); }
    void* native_handle() const override { return nullptr; }
  } stream;
  uint8_t byte = 0;
  const absl::Status status = gpu::LaunchImagePreprocess(&byte, p, &byte, stream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("bad sizes"), std::string::npos) << status;
}

}  // namespace
}  // namespace inferd::backends::image
