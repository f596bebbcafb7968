// The image backend: decoding (PNG and JPEG encoded here with libpng / libjpeg), the resize
// arithmetic on hand-computed tiny images, parameter validation messages, a batch whose
// bad image fails only its own request, and GPU instances on fake GPUs (gpu::FakeRuntime, the
// kernel's per-thread maths run on the host in place of the launch): the same bytes as a CPU
// instance, one upload and one download per batch, outputs left on the GPU when asked.
#include "backends/image/image_backend.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <random>

#include <jpeglib.h>
#include <png.h>

#include "backends/image_codec/image_decode.h"
#include "backends/image/image_transform.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gpu/image_preprocess_kernel.h"
#include "gtest/gtest.h"

namespace inferd::backends::image {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// --- encoders for test inputs ---------------------------------------------------------------

struct PngSpec {
  int width = 0;
  int height = 0;
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  bool interlaced = false;
  std::vector<png_color> palette = {};
  std::vector<png_byte> trans = {};  // palette alpha
  bool header_only = false;     // stop after IHDR (for size checks)
};

void AppendPng(png_structp png, png_bytep data, size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), n);
}

// `rows` holds height rows of packed samples in the PNG's own format.
std::string EncodePng(const PngSpec& spec, const std::vector<std::vector<png_byte>>& rows) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    ADD_FAILURE() << "libpng failed to encode the test image";
    png_destroy_write_struct(&png, &info);
    return out;
  }
  png_set_write_fn(png, &out, AppendPng, nullptr);
  png_set_IHDR(png, info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty()) {
    png_set_PLTE(png, info, spec.palette.data(), static_cast<int>(spec.palette.size()));
  }
  if (!spec.trans.empty()) {
    png_set_tRNS(png, info, spec.trans.data(), static_cast<int>(spec.trans.size()), nullptr);
  }
  png_write_info(png, info);
  if (!spec.header_only) {
    std::vector<png_bytep> pointers;
    for (const auto& r : rows) pointers.push_back(const_cast<png_bytep>(r.data()));
    png_write_image(png, pointers.data());
    png_write_end(png, nullptr);
  }
  png_destroy_write_struct(&png, &info);
  return out;
}

// An RGB test pattern: pixel (x, y) = (10x + y, 20y, 255 - x).
std::vector<std::vector<png_byte>> Pattern(int width, int height) {
  std::vector<std::vector<png_byte>> rows(height);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      rows[y].push_back(static_cast<png_byte>(10 * x + y));
      rows[y].push_back(static_cast<png_byte>(20 * y));
      rows[y].push_back(static_cast<png_byte>(255 - x));
    }
  }
  return rows;
}

std::string RgbPng(int width, int height) {
  return EncodePng({.width = width, .height = height}, Pattern(width, height));
}

// A JPEG of `components` (1 gray, 3 RGB) at quality 100 with 4:4:4 sampling, from libjpeg.
std::string EncodeJpeg(int width, int height, int components, const std::vector<uint8_t>& pixels) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = width;
  cinfo.image_height = height;
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 100, TRUE);
  for (int c = 0; c < cinfo.num_components; ++c) {
    cinfo.comp_info[c].h_samp_factor = 1;
    cinfo.comp_info[c].v_samp_factor = 1;
  }
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * width * components;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buffer), size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return out;
}

std::string SolidJpeg(int width, int height, uint8_t r, uint8_t g, uint8_t b) {
  std::vector<uint8_t> pixels;
  for (int i = 0; i < width * height; ++i) pixels.insert(pixels.end(), {r, g, b});
  return EncodeJpeg(width, height, 3, pixels);
}

std::array<int, 3> PixelAt(const RgbImage& img, int x, int y) {
  const uint8_t* p = &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3];
  return {p[0], p[1], p[2]};
}

// --- decoding -------------------------------------------------------------------------------

TEST(ImageDecodeTest, DetectsFormatByMagicBytes) {
  EXPECT_EQ(DetectFormat(std::string("\xFF\xD8\xFF\xE0", 4)), ImageFormat::kJpeg);
  EXPECT_EQ(DetectFormat(RgbPng(1, 1)), ImageFormat::kPng);
  EXPECT_EQ(DetectFormat("GIF89a"), ImageFormat::kUnknown);
  EXPECT_EQ(DetectFormat(std::string("\xFF\xD8", 2)), ImageFormat::kUnknown);
  EXPECT_EQ(DetectFormat(""), ImageFormat::kUnknown);
}

TEST(ImageDecodeTest, RgbPngRoundTrips) {
  for (bool interlaced : {false, true}) {
    auto img = DecodeImage(
        EncodePng({.width = 5, .height = 4, .interlaced = interlaced}, Pattern(5, 4)), 1000);
    ASSERT_TRUE(img.ok()) << img.status();
    EXPECT_EQ(img->width, 5);
    EXPECT_EQ(img->height, 4);
    ASSERT_EQ(img->pixels.size(), 5u * 4 * 3);
    EXPECT_EQ(PixelAt(*img, 0, 0), (std::array<int, 3>{0, 0, 255}));
    EXPECT_EQ(PixelAt(*img, 4, 3), (std::array<int, 3>{43, 60, 251}));
  }
}

TEST(ImageDecodeTest, PngGrayAlphaPaletteAnd16BitBecomeRgb) {
  // 8-bit gray -> three equal channels.
  auto gray = DecodeImage(EncodePng({.width = 2, .height = 1, .color_type = PNG_COLOR_TYPE_GRAY},
                                    {{7, 200}}),
                          100);
  ASSERT_TRUE(gray.ok()) << gray.status();
  EXPECT_EQ(PixelAt(*gray, 1, 0), (std::array<int, 3>{200, 200, 200}));

  // 1-bit gray: 1 -> 255.
  auto bits = DecodeImage(EncodePng({.width = 8, .height = 1, .color_type = PNG_COLOR_TYPE_GRAY,
                                     .bit_depth = 1},
                                    {{0b10000001}}),
                          100);
  ASSERT_TRUE(bits.ok()) << bits.status();
  EXPECT_EQ(PixelAt(*bits, 0, 0), (std::array<int, 3>{255, 255, 255}));
  EXPECT_EQ(PixelAt(*bits, 1, 0), (std::array<int, 3>{0, 0, 0}));

  // RGBA: alpha dropped, colour kept (not composited onto a background).
  auto rgba = DecodeImage(EncodePng({.width = 1, .height = 1, .color_type = PNG_COLOR_TYPE_RGBA},
                                    {{10, 20, 30, 0}}),
                          100);
  ASSERT_TRUE(rgba.ok()) << rgba.status();
  EXPECT_EQ(PixelAt(*rgba, 0, 0), (std::array<int, 3>{10, 20, 30}));

  // Gray + alpha.
  auto ga = DecodeImage(EncodePng({.width = 1, .height = 1,
                                   .color_type = PNG_COLOR_TYPE_GRAY_ALPHA},
                                  {{90, 128}}),
                        100);
  ASSERT_TRUE(ga.ok()) << ga.status();
  EXPECT_EQ(PixelAt(*ga, 0, 0), (std::array<int, 3>{90, 90, 90}));

  // Palette with a transparent entry.
  auto pal = DecodeImage(EncodePng({.width = 2, .height = 1, .color_type = PNG_COLOR_TYPE_PALETTE,
                                    .palette = {{1, 2, 3}, {250, 251, 252}},
                                    .trans = {0}},
                                   {{1, 0}}),
                         100);
  ASSERT_TRUE(pal.ok()) << pal.status();
  EXPECT_EQ(PixelAt(*pal, 0, 0), (std::array<int, 3>{250, 251, 252}));
  EXPECT_EQ(PixelAt(*pal, 1, 0), (std::array<int, 3>{1, 2, 3}));

  // 16-bit RGB: the high byte of each (big-endian) sample.
  auto deep = DecodeImage(EncodePng({.width = 1, .height = 1, .bit_depth = 16},
                                    {{0x12, 0x34, 0xAB, 0xCD, 0xFF, 0x01}}),
                          100);
  ASSERT_TRUE(deep.ok()) << deep.status();
  EXPECT_EQ(PixelAt(*deep, 0, 0), (std::array<int, 3>{0x12, 0xAB, 0xFF}));
}

TEST(ImageDecodeTest, JpegColourAndGray) {
  auto img = DecodeImage(SolidJpeg(16, 8, 200, 100, 50), 1000);
  ASSERT_TRUE(img.ok()) << img.status();
  EXPECT_EQ(img->width, 16);
  EXPECT_EQ(img->height, 8);
  for (int y = 0; y < 8; ++y) {
    for (int x = 0; x < 16; ++x) {
      auto p = PixelAt(*img, x, y);
      EXPECT_NEAR(p[0], 200, 2);  // quality 100, 4:4:4: only YCbCr rounding
      EXPECT_NEAR(p[1], 100, 2);
      EXPECT_NEAR(p[2], 50, 2);
    }
  }
  std::vector<uint8_t> gray(8 * 8, 77);
  auto g = DecodeImage(EncodeJpeg(8, 8, 1, gray), 1000);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(PixelAt(*g, 3, 3), (std::array<int, 3>{77, 77, 77}));
}

TEST(ImageDecodeTest, TrailingPaddingIsIgnored) {
  // A batched UINT8 tensor pads shorter images with zeros up to the longest one.
  std::string jpeg = SolidJpeg(8, 8, 1, 2, 3) + std::string(100, '\0');
  EXPECT_TRUE(DecodeImage(jpeg, 100).ok());
  std::string png = RgbPng(3, 3) + std::string(100, '\0');
  EXPECT_TRUE(DecodeImage(png, 100).ok());
}

TEST(ImageDecodeTest, UnknownAndEmptyInputs) {
  EXPECT_EQ(DecodeImage("GIF89a....", 100).status().message(),
            "not a JPEG or PNG (10 bytes, first bytes 47 49 46 38 39 61 2e 2e)");
  EXPECT_EQ(DecodeImage("", 100).status().message(), "empty (0 bytes), not a JPEG or PNG");
  EXPECT_EQ(DecodeImage("", 100).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ImageDecodeTest, CorruptAndTruncatedJpeg) {
  const std::string jpeg = SolidJpeg(32, 32, 10, 200, 30);
  auto truncated = DecodeImage(jpeg.substr(0, jpeg.size() / 2), 10000);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(truncated.status().message(), "corrupt JPEG: Premature end of JPEG file");
  // Only the SOI marker: the header is missing.
  auto header = DecodeImage(jpeg.substr(0, 4), 10000);
  EXPECT_THAT(std::string(header.status().message()), StartsWith("corrupt JPEG: "));
  // A broken marker segment inside the header.
  std::string broken = jpeg;
  for (size_t i = 4; i < 40 && i < broken.size(); ++i) broken[i] = '\x01';
  auto bad = DecodeImage(broken, 10000);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), StartsWith("corrupt JPEG: "));
}

TEST(ImageDecodeTest, CorruptAndTruncatedPng) {
  const std::string png = RgbPng(16, 16);
  auto truncated = DecodeImage(png.substr(0, png.size() - 30), 1000);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(truncated.status().message(), "corrupt PNG: truncated PNG data");
  std::string flipped = png;
  flipped[png.size() / 2] ^= 0x55;  // inside IDAT: the CRC no longer matches
  auto bad = DecodeImage(flipped, 1000);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), StartsWith("corrupt PNG: "));
}

TEST(ImageDecodeTest, MaxPixelsRefusesBeforeDecoding) {
  // A PNG header announcing 100000 x 100000 pixels and no pixel data: refused from the header.
  std::string bomb = EncodePng({.width = 100000, .height = 100000, .header_only = true}, {});
  auto big = DecodeImage(bomb, kDefaultMaxPixels);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big.status().message(),
            "image is 100000x100000 = 10000000000 pixels, more than max_pixels 67108864");
  auto jpeg = DecodeImage(SolidJpeg(16, 16, 0, 0, 0), 255);
  EXPECT_EQ(jpeg.status().message(), "image is 16x16 = 256 pixels, more than max_pixels 255");
  EXPECT_TRUE(DecodeImage(SolidJpeg(16, 16, 0, 0, 0), 256).ok());
}

// --- resize arithmetic ----------------------------------------------------------------------

void ExpectTap(const AxisTap& t, int lo, int hi, float frac) {
  EXPECT_EQ(t.lo, lo);
  EXPECT_EQ(t.hi, hi);
  EXPECT_FLOAT_EQ(t.frac, frac);
}

TEST(ImageResizeTest, BilinearTapsUseHalfPixelCentres) {
  // Downscale 4 -> 2: src = (d + 0.5) * 2 - 0.5 = 0.5, 2.5.
  auto down = PlanAxis(4, 2, 0, 2, Interpolation::kBilinear);
  ExpectTap(down[0], 0, 1, 0.5f);
  ExpectTap(down[1], 2, 3, 0.5f);
  // Upscale 2 -> 4: src = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (hi clamped to the edge).
  auto up = PlanAxis(2, 4, 0, 4, Interpolation::kBilinear);
  ExpectTap(up[0], 0, 1, 0.0f);
  ExpectTap(up[1], 0, 1, 0.25f);
  ExpectTap(up[2], 0, 1, 0.75f);
  ExpectTap(up[3], 1, 1, 0.25f);
  // A crop offset of 1 in a 6-wide resize of 3: src = (d + 1.5) * 0.5 - 0.5 = 0.25, 0.75.
  auto crop = PlanAxis(3, 6, 1, 2, Interpolation::kBilinear);
  ExpectTap(crop[0], 0, 1, 0.25f);
  ExpectTap(crop[1], 0, 1, 0.75f);
}

TEST(ImageResizeTest, NearestTakesThePixelUnderTheCentre) {
  auto down = PlanAxis(4, 2, 0, 2, Interpolation::kNearest);  // centres 1.0, 3.0
  ExpectTap(down[0], 1, 1, 0.0f);
  ExpectTap(down[1], 3, 3, 0.0f);
  auto up = PlanAxis(2, 3, 0, 3, Interpolation::kNearest);  // centres 1/3, 1, 5/3
  EXPECT_EQ(up[0].lo, 0);
  EXPECT_EQ(up[1].lo, 1);
  EXPECT_EQ(up[2].lo, 1);
}

PreprocessSettings Settings(int height, int width, DataType type = DataType::kFp32) {
  PreprocessSettings s;
  s.output_height = height;
  s.output_width = width;
  s.output_type = type;
  s.scale = 1.0f;
  return s;
}

RgbImage Image2x2() {
  // Red channel [[0, 100], [200, 40]]; green = red / 2; blue = 255 - red.
  return RgbImage{2, 2, {0, 0, 255, 100, 50, 155, 200, 100, 55, 40, 20, 215}};
}

TEST(ImageResizeTest, BilinearUpscaleByHand) {
  const PreprocessSettings s = Settings(4, 4);
  std::vector<float> out(3 * 16);
  Preprocess(Image2x2(), s, out.data());
  // Taps on both axes (see above): (0,1,0) (0,1,.25) (0,1,.75) (1,1,.25).
  // (y=1, x=1): top = 0 + .25 * 100 = 25, bottom = 200 + .25 * (40 - 200) = 160,
  // value = 25 + .25 * (160 - 25) = 58.75.
  EXPECT_FLOAT_EQ(out[1 * 4 + 1], 58.75f);
  EXPECT_FLOAT_EQ(out[0], 0.0f);          // corner
  EXPECT_FLOAT_EQ(out[3], 100.0f);        // (0, 3): clamped to the right column
  EXPECT_FLOAT_EQ(out[15], 40.0f);        // (3, 3)
  // (y=2, x=3): column 1 only; rows 0/1 at .75: 100 + .75 * (40 - 100) = 55.
  EXPECT_FLOAT_EQ(out[2 * 4 + 3], 55.0f);
  // Green plane (NCHW: the second 16 values) at (1, 1): halves of the red inputs
  // [[0,50],[100,20]]: top 12.5, bottom 80, value 12.5 + .25 * 67.5 = 29.375.
  EXPECT_FLOAT_EQ(out[16 + 5], 29.375f);
}

TEST(ImageResizeTest, Uint8OutputRoundsHalfUp) {
  std::vector<uint8_t> out(3 * 16);
  Preprocess(Image2x2(), Settings(4, 4, DataType::kUint8), out.data());
  EXPECT_EQ(out[5], 59);   // 58.75
  EXPECT_EQ(out[11], 55);  // 55
  EXPECT_EQ(out[16 + 5], 29);  // 29.375
}

TEST(ImageResizeTest, LayoutChannelOrderAndNormalization) {
  RgbImage pixel{1, 1, {10, 20, 30}};
  PreprocessSettings s = Settings(1, 2);
  s.scale = 0.5f;
  s.mean = {1, 2, 3};
  s.std = {2, 4, 8};
  std::vector<float> out(6);
  Preprocess(pixel, s, out.data());  // NCHW RGB: (10*.5-1)/2, (20*.5-2)/4, (30*.5-3)/8
  EXPECT_EQ(out, (std::vector<float>{2, 2, 2, 2, 1.5, 1.5}));
  s.layout = Layout::kNHWC;
  s.channel_order = ChannelOrder::kBGR;  // mean/std follow the output's channel order
  Preprocess(pixel, s, out.data());      // B=30: (15-1)/2, G=20: (10-2)/4, R=10: (5-3)/8
  EXPECT_EQ(out, (std::vector<float>{7, 2, 0.25, 7, 2, 0.25}));
}

TEST(ImageResizeTest, ShorterSideCenterCropFollowsTorchvision) {
  PreprocessSettings s = Settings(224, 224);
  s.resize_mode = ResizeMode::kShorterSideCenterCrop;
  s.resize_shorter = 256;
  // 640x480 -> 341x256 (int(256 * 640 / 480)), crop corner round(58.5) = 58 (half to even), 16.
  ResizePlan p = PlanResize(640, 480, s);
  EXPECT_EQ(p.resized_width, 341);
  EXPECT_EQ(p.resized_height, 256);
  EXPECT_EQ(p.crop_left, 58);
  EXPECT_EQ(p.crop_top, 16);
  // Portrait 200x300 -> 256x384, corner (16, 80).
  p = PlanResize(200, 300, s);
  EXPECT_EQ(p.resized_width, 256);
  EXPECT_EQ(p.resized_height, 384);
  EXPECT_EQ(p.crop_left, 16);
  EXPECT_EQ(p.crop_top, 80);
  // 227 wide: (259 - 224) / 2 = 17.5 rounds to 18 (even).
  p = PlanResize(227, 256, s);
  EXPECT_EQ(p.resized_width, 256);
  EXPECT_EQ(p.resized_height, 288);  // int(256 * 256 / 227) = 288
  EXPECT_EQ(p.crop_left, 16);
  EXPECT_EQ(p.crop_top, 32);
  s.resize_mode = ResizeMode::kStretch;
  p = PlanResize(640, 480, s);
  EXPECT_EQ(p.resized_width, 224);
  EXPECT_EQ(p.crop_left, 0);
}

// --- configuration --------------------------------------------------------------------------

config::ModelConfig Config(const std::string& text) {
  auto cfg = config::ParseModelConfigText("name: \"pre\" backend: \"image\" " + text, "c");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return *cfg;
}

std::string Param(const std::string& key, const std::string& value) {
  return "parameters { key: \"" + key + "\" value: { string_value: \"" + value + "\" } } ";
}

const char kUint8In[] = "input [ { name: \"IN\" data_type: TYPE_UINT8 dims: [ -1 ] } ] ";
const char kFp32Chw[] = "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ] ";

std::string ErrorOf(const std::string& text) {
  auto s = SettingsFromConfig(Config(text));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.status().message());
}

TEST(ImageSettingsTest, DefaultsAndEveryParameter) {
  auto d = SettingsFromConfig(Config(std::string(kUint8In) + kFp32Chw));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->layout, Layout::kNCHW);
  EXPECT_EQ(d->output_height, 224);
  EXPECT_EQ(d->resize_mode, ResizeMode::kStretch);
  EXPECT_EQ(d->interpolation, Interpolation::kBilinear);
  EXPECT_FLOAT_EQ(d->scale, 1.0f / 255);
  EXPECT_EQ(d->max_pixels, 67108864);

  auto s = SettingsFromConfig(Config(
      "input [ { name: \"IN\" data_type: TYPE_STRING dims: [ 1 ] } ] "
      "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ -1, -1, 3 ] } ] " +
      Param("output_height", "200") + Param("output_width", "100") +
      Param("resize_mode", "shorter_side_center_crop") + Param("resize_shorter", "256") +
      Param("interpolation", "nearest") + Param("mean", "0.485, 0.456,0.406") +
      Param("std", "0.5") + Param("scale", "1/127.5") + Param("channel_order", "BGR") +
      Param("layout", "NHWC") + Param("max_pixels", "1000000")));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->input_type, DataType::kBytes);
  EXPECT_EQ(s->layout, Layout::kNHWC);
  EXPECT_EQ(s->output_height, 200);
  EXPECT_EQ(s->output_width, 100);
  EXPECT_EQ(s->resize_mode, ResizeMode::kShorterSideCenterCrop);
  EXPECT_EQ(s->resize_shorter, 256);
  EXPECT_EQ(s->interpolation, Interpolation::kNearest);
  EXPECT_FLOAT_EQ(s->mean[1], 0.456f);
  EXPECT_FLOAT_EQ(s->std[2], 0.5f);
  EXPECT_FLOAT_EQ(s->scale, 1.0f / 127.5f);
  EXPECT_EQ(s->channel_order, ChannelOrder::kBGR);
  EXPECT_EQ(s->max_pixels, 1000000);
  EXPECT_EQ(ItemShape(*s), (Shape{200, 100, 3}));

  // resize_shorter defaults to the larger output side.
  auto crop = SettingsFromConfig(
      Config(std::string(kUint8In) + kFp32Chw + Param("resize_mode", "shorter_side_center_crop")));
  ASSERT_TRUE(crop.ok()) << crop.status();
  EXPECT_EQ(crop->resize_shorter, 224);
}

TEST(ImageSettingsTest, BadParametersNameTheParameterAndValue) {
  const std::string base = std::string(kUint8In) + kFp32Chw;
  EXPECT_EQ(ErrorOf(base + Param("resize_mode", "crop")),
            "model 'pre': parameter 'resize_mode' must be 'stretch' or "
            "'shorter_side_center_crop', got 'crop'");
  EXPECT_EQ(ErrorOf(base + Param("interpolation", "bicubic")),
            "model 'pre': parameter 'interpolation' must be 'bilinear' or 'nearest', got 'bicubic'");
  EXPECT_EQ(ErrorOf(base + Param("channel_order", "rgb")),
            "model 'pre': parameter 'channel_order' must be 'RGB' or 'BGR', got 'rgb'");
  EXPECT_EQ(ErrorOf(base + Param("mean", "0.1,0.2")),
            "model 'pre': parameter 'mean' must be 1 or 3 comma-separated numbers (one per "
            "output channel), got '0.1,0.2'");
  EXPECT_EQ(ErrorOf(base + Param("std", "0.2,0,0.2")),
            "model 'pre': parameter 'std' must be 1 or 3 comma-separated positive numbers (one "
            "per output channel), got '0.2,0,0.2'");
  EXPECT_EQ(ErrorOf(base + Param("scale", "abc")),
            "model 'pre': parameter 'scale' must be a positive number or fraction such as "
            "'1/255', got 'abc'");
  EXPECT_EQ(ErrorOf(base + Param("max_pixels", "0")),
            "model 'pre': parameter 'max_pixels' must be an integer from 1 to 1073741824, got '0'");
  EXPECT_EQ(ErrorOf(base + Param("output_height", "300")),
            "model 'pre': parameter 'output_height' is 300 but output 'OUT' has dims "
            "[3,224,224]; they must agree");
  EXPECT_EQ(ErrorOf(base + Param("resize_mode", "shorter_side_center_crop") +
                    Param("resize_shorter", "200")),
            "model 'pre': parameter 'resize_shorter' must be an integer from 224 to 65536, got "
            "'200'");
  EXPECT_EQ(ErrorOf(base + Param("resize_shorter", "256")),
            "model 'pre': parameter 'resize_shorter' ('256') needs resize_mode "
            "'shorter_side_center_crop'; resize_mode is 'stretch'");
  EXPECT_EQ(ErrorOf(base + Param("layout", "NHWC")),
            "model 'pre': parameter 'layout' is 'NHWC' but output 'OUT' has dims [3,224,224]; "
            "NHWC needs [H,W,3]");
  EXPECT_EQ(ErrorOf(base + Param("resize", "256")),
            "model 'pre': unknown parameter 'resize' for the image backend (known: "
            "output_height, output_width, resize_mode, resize_shorter, interpolation, mean, std, "
            "scale, channel_order, layout, max_pixels, output_on_gpu)");
  EXPECT_EQ(ErrorOf(base + Param("output_on_gpu", "yes")),
            "model 'pre': parameter 'output_on_gpu' must be 'true' or 'false', got 'yes'");
  EXPECT_EQ(ErrorOf(std::string(kUint8In) +
                    "output [ { name: \"OUT\" data_type: TYPE_UINT8 dims: [ 3, 8, 8 ] } ] " +
                    Param("mean", "0.5")),
            "model 'pre': parameter 'mean' ('0.5') applies only to a TYPE_FP32 or TYPE_FP16 "
            "output; output 'OUT' is TYPE_UINT8 (resized pixels, not normalized)");
}

TEST(ImageSettingsTest, BadTensorsAreNamed) {
  EXPECT_EQ(ErrorOf("input [ { name: \"IN\" data_type: TYPE_UINT8 dims: [ 3 ] } ] " +
                    std::string(kFp32Chw)),
            "model 'pre': input 'IN' must be TYPE_UINT8 with dims [-1] (the encoded image's "
            "bytes) or TYPE_STRING with dims [1] (one encoded image per element), got TYPE_UINT8 "
            "with dims [3]");
  EXPECT_EQ(ErrorOf(std::string(kUint8In) +
                    "output [ { name: \"OUT\" data_type: TYPE_FP64 dims: [ 3, 8, 8 ] } ] "),
            "model 'pre': output 'OUT' must be TYPE_FP32, TYPE_FP16 or TYPE_UINT8, got TYPE_FP64");
  EXPECT_EQ(ErrorOf(std::string(kUint8In) +
                    "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3, 8, 3 ] } ] "),
            "model 'pre': output 'OUT' dims [3,8,3] fit both NCHW and NHWC; set parameter "
            "'layout'");
  EXPECT_EQ(ErrorOf(std::string(kUint8In) +
                    "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 8, 8, 4 ] } ] "),
            "model 'pre': output 'OUT' dims [8,8,4] must be [3,H,W] (NCHW) or [H,W,3] (NHWC)");
  EXPECT_EQ(ErrorOf(std::string(kUint8In) +
                    "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3, -1, 8 ] } ] "),
            "model 'pre': output 'OUT' dims [3,-1,8] leave the height unknown; give a size from "
            "1 to 16384 in dims or parameter 'output_height'");
}

// --- the backend on a batch -----------------------------------------------------------------

struct Batch {
  std::vector<std::unique_ptr<core::InferRequest>> requests;
  std::vector<std::unique_ptr<core::InferResponse>> responses;
  std::vector<std::string> bodies;

  // One request holding `images` as a [n, L] UINT8 tensor (rows zero-padded to the longest).
  void AddUint8(const std::vector<std::string>& images) {
    size_t len = 0;
    for (const auto& i : images) len = std::max(len, i.size());
    std::string body;
    for (const auto& i : images) body += i + std::string(len - i.size(), '\0');
    Add(Tensor(DataType::kUint8, {static_cast<int64_t>(images.size()), static_cast<int64_t>(len)}),
        std::move(body));
  }
  void AddBytes(const std::vector<std::string>& images) {
    std::string body;
    for (const auto& i : images) {
      uint32_t n = static_cast<uint32_t>(i.size());
      body.append(reinterpret_cast<const char*>(&n), 4);
      body += i;
    }
    Add(Tensor(DataType::kBytes, {static_cast<int64_t>(images.size()), 1}), std::move(body));
  }
  static core::InputTensor Tensor(DataType type, Shape shape) {
    core::InputTensor t;
    t.name = "IN";
    t.datatype = type;
    t.shape = std::move(shape);
    return t;
  }
  void Add(core::InputTensor tensor, std::string body) {
    auto owned = std::make_shared<std::string>(std::move(body));
    tensor.data = *owned;
    auto req = std::make_unique<core::InferRequest>();
    req->inputs.push_back(tensor);
    req->batch_size = tensor.shape[0];
    req->payload = owned;
    requests.push_back(std::move(req));
    responses.push_back(std::make_unique<core::InferResponse>());
  }
  void Run(ModelInstance* instance) {
    std::vector<core::InferRequest*> reqs;
    std::vector<core::InferResponse*> resps;
    for (auto& r : requests) reqs.push_back(r.get());
    for (auto& r : responses) resps.push_back(r.get());
    ExecutionTimes times;
    instance->Execute(reqs, resps, &times);
  }
};

std::unique_ptr<ModelInstance> MakeInstance(const config::ModelConfig& cfg) {
  static auto* backend = MakeImageBackend().release();
  ModelSpec spec;
  spec.config = &cfg;
  spec.total_instances = 1;
  spec.cpu_cores = 2;
  auto instance = backend->CreateInstance(spec, inference::ModelInstanceGroup(), 0);
  EXPECT_TRUE(instance.ok()) << instance.status();
  return instance.ok() ? *std::move(instance) : nullptr;
}

TEST(ImageBackendTest, CreateInstanceRefusesBadParameters) {
  auto backend = MakeImageBackend();
  EXPECT_EQ(backend->name(), "image");
  const auto cfg = Config(std::string(kUint8In) + kFp32Chw + Param("layout", "HWC"));
  ModelSpec spec;
  spec.config = &cfg;
  auto instance = backend->CreateInstance(spec, inference::ModelInstanceGroup(), 0);
  EXPECT_EQ(instance.status().message(),
            "model 'pre': parameter 'layout' must be 'NCHW' or 'NHWC', got 'HWC'");
}

TEST(ImageBackendTest, OneCorruptImageFailsOnlyItsRequest) {
  const auto cfg = Config(
      "max_batch_size: 8 " + std::string(kUint8In) +
      "output [ { name: \"OUT\" data_type: TYPE_UINT8 dims: [ 4, 4, 3 ] } ] ");
  auto instance = MakeInstance(cfg);
  ASSERT_NE(instance, nullptr);
  EXPECT_EQ(instance->ThreadCount(), 2);
  const std::string png = RgbPng(8, 8);
  const std::string jpeg = SolidJpeg(16, 16, 200, 100, 50);
  Batch batch;
  batch.AddUint8({png, jpeg});                           // ok, padded rows
  batch.AddUint8({jpeg, jpeg.substr(0, 300)});           // image 1 truncated
  batch.AddUint8({std::string("not an image at all")});  // unknown format
  batch.AddUint8({jpeg});                                // ok
  batch.Run(instance.get());

  ASSERT_TRUE(batch.responses[0]->status.ok()) << batch.responses[0]->status;
  ASSERT_EQ(batch.responses[0]->outputs.size(), 1u);
  const auto& out = batch.responses[0]->outputs[0];
  EXPECT_EQ(out.name, "OUT");
  EXPECT_EQ(out.datatype, DataType::kUint8);
  EXPECT_EQ(out.shape, (Shape{2, 4, 4, 3}));
  ASSERT_EQ(out.data.size(), 2u * 4 * 4 * 3);
  // Second item: a solid JPEG stays solid through the resize.
  EXPECT_NEAR(static_cast<uint8_t>(out.data[48]), 200, 2);
  EXPECT_NEAR(static_cast<uint8_t>(out.data[49]), 100, 2);
  EXPECT_NEAR(static_cast<uint8_t>(out.data[50]), 50, 2);

  EXPECT_EQ(batch.responses[1]->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.responses[1]->status.message(), "image 1: corrupt JPEG: Premature end of JPEG file");
  EXPECT_TRUE(batch.responses[1]->outputs.empty());
  EXPECT_EQ(batch.responses[2]->status.message(),
            "image 0: not a JPEG or PNG (19 bytes, first bytes 6e 6f 74 20 61 6e 20 69)");
  ASSERT_TRUE(batch.responses[3]->status.ok()) << batch.responses[3]->status;
  EXPECT_EQ(batch.responses[3]->outputs[0].shape, (Shape{1, 4, 4, 3}));
}

TEST(ImageBackendTest, BytesInputAndNonBatchingModel) {
  const auto cfg = Config(
      "input [ { name: \"IN\" data_type: TYPE_STRING dims: [ 1 ] } ] "
      "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3, 2, 2 ] } ] " +
      Param("mean", "0.5") + Param("std", "0.5"));
  auto instance = MakeInstance(cfg);
  ASSERT_NE(instance, nullptr);
  Batch batch;
  // A 2x2 white PNG -> every value (1 - 0.5) / 0.5 = 1.
  batch.AddBytes({EncodePng({.width = 2, .height = 2, .color_type = PNG_COLOR_TYPE_GRAY},
                            {{255, 255}, {255, 255}})});
  batch.requests[0]->inputs[0].shape = {1};
  batch.requests[0]->batch_size = 1;
  batch.Run(instance.get());
  ASSERT_TRUE(batch.responses[0]->status.ok()) << batch.responses[0]->status;
  const auto& out = batch.responses[0]->outputs[0];
  EXPECT_EQ(out.shape, (Shape{3, 2, 2}));
  ASSERT_EQ(out.data.size(), 12 * sizeof(float));
  std::vector<float> values(12);
  std::memcpy(values.data(), out.data.data(), out.data.size());
  for (float v : values) EXPECT_FLOAT_EQ(v, 1.0f);
}

// --- GPU instances on fake GPUs -------------------------------------------------------------

// The fake's device memory is host memory, so the kernel's body runs on the host in its place
// (gpu::ImagePreprocessOnHost: the same per-element functions the kernel's threads call). The
// launches are counted, and the pointers checked to be fake device memory of the stream's GPU.
struct FakeGpus {
  std::unique_ptr<gpu::FakeRuntime> runtime = gpu::FakeRuntime::WithDevices(2);
  int launches = 0;
  absl::Status fail_launch;  // set: every launch answers it
  std::unique_ptr<Backend> backend = MakeImageBackend(
      {.runtime = runtime.get(),
       .launch = [this](const uint8_t* pixels, const gpu::image_math::PreprocessParams& params,
                        void* out, gpu::Stream& stream) -> absl::Status {
         ++launches;
         if (!fail_launch.ok()) return fail_launch;
         EXPECT_EQ(stream.device(), 1);
         return gpu::ImagePreprocessOnHost(pixels, params, out);
       }});

  std::unique_ptr<ModelInstance> Instance(const config::ModelConfig& cfg, bool on_gpu) {
    ModelSpec spec;
    spec.config = &cfg;
    spec.total_instances = 1;
    spec.cpu_cores = 2;
    auto instance = backend->CreateInstanceOn(spec, inference::ModelInstanceGroup(), 0,
                                              {.gpu = on_gpu, .id = on_gpu ? 1 : 0,
                                               .name = "pre_0"});
    EXPECT_TRUE(instance.ok()) << instance.status();
    return instance.ok() ? *std::move(instance) : nullptr;
  }
  uint64_t UsedBytes(int device) const {
    auto info = runtime->GetMemoryInfo(device);
    return info->total_bytes - info->free_bytes;
  }
};

// The same requests, twice (one Batch each), so that two instances can answer them.
std::vector<Batch> TwoBatches(const std::vector<std::vector<std::string>>& requests) {
  std::vector<Batch> batches(2);
  for (Batch& b : batches) {
    for (const auto& images : requests) b.AddUint8(images);
  }
  return batches;
}

std::string RandomRgbJpeg(std::mt19937& rng, int width, int height) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 3);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& p : pixels) p = static_cast<uint8_t>(byte(rng));
  return EncodeJpeg(width, height, 3, pixels);
}

TEST(ImageBackendGpuTest, GpuInstanceAnswersTheCpuInstancesBytes) {
  std::mt19937 rng(7);
  // Several sizes (up- and downscaling, odd sizes, a 1-pixel-wide one), PNG and JPEG, gray too.
  const std::vector<std::vector<std::string>> requests = {
      {RgbPng(8, 8), RandomRgbJpeg(rng, 37, 21)},
      {RandomRgbJpeg(rng, 300, 200)},
      {RgbPng(1, 9), SolidJpeg(16, 16, 200, 100, 50), RandomRgbJpeg(rng, 5, 64)},
      {EncodePng({.width = 3, .height = 2, .color_type = PNG_COLOR_TYPE_GRAY},
                 {{0, 128, 255}, {7, 8, 9}})},
  };
  const std::string fp32 = "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 3, 24, 16 ] } ] ";
  const std::string u8 = "output [ { name: \"OUT\" data_type: TYPE_UINT8 dims: [ 12, 20, 3 ] } ] ";
  const std::string fp16 = "output [ { name: \"OUT\" data_type: TYPE_FP16 dims: [ 3, 24, 16 ] } ] ";
  const std::string fp16_hwc =
      "output [ { name: \"OUT\" data_type: TYPE_FP16 dims: [ 24, 16, 3 ] } ] ";
  const std::vector<std::string> settings = {
      fp32,
      fp32 + Param("mean", "0.485,0.456,0.406") + Param("std", "0.229,0.224,0.225"),
      fp32 + Param("resize_mode", "shorter_side_center_crop") + Param("resize_shorter", "30") +
          Param("channel_order", "BGR") + Param("scale", "1") + Param("mean", "100") +
          Param("std", "3"),
      fp32 + Param("interpolation", "nearest") + Param("channel_order", "BGR"),
      u8,
      u8 + Param("resize_mode", "shorter_side_center_crop") + Param("interpolation", "nearest"),
      fp16 + Param("mean", "0.485,0.456,0.406") + Param("std", "0.229,0.224,0.225"),
      fp16_hwc + Param("resize_mode", "shorter_side_center_crop") + Param("scale", "1") +
          Param("mean", "100") + Param("std", "3") + Param("channel_order", "BGR"),
  };
  for (const std::string& setting : settings) {
    SCOPED_TRACE(setting);
    const auto cfg = Config("max_batch_size: 8 " + std::string(kUint8In) + setting);
    FakeGpus gpus;
    auto cpu = gpus.Instance(cfg, false);
    auto gpu = gpus.Instance(cfg, true);
    ASSERT_NE(cpu, nullptr);
    ASSERT_NE(gpu, nullptr);
    std::vector<Batch> b = TwoBatches(requests);
    b[0].Run(cpu.get());
    b[1].Run(gpu.get());
    EXPECT_EQ(gpus.launches, 7);  // one per image
    // One upload and one download for the whole batch of four requests.
    EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kHostToDevice), 1);
    EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kDeviceToHost), 1);
    for (size_t r = 0; r < requests.size(); ++r) {
      ASSERT_TRUE(b[0].responses[r]->status.ok()) << b[0].responses[r]->status;
      ASSERT_TRUE(b[1].responses[r]->status.ok()) << b[1].responses[r]->status;
      ASSERT_EQ(b[1].responses[r]->outputs.size(), 1u);
      const core::OutputTensor& want = b[0].responses[r]->outputs[0];
      const core::OutputTensor& got = b[1].responses[r]->outputs[0];
      EXPECT_EQ(got.place, MemoryPlace::Host());  // output_on_gpu is off by default
      EXPECT_EQ(got.name, want.name);
      EXPECT_EQ(got.datatype, want.datatype);
      EXPECT_EQ(got.shape, want.shape);
      ASSERT_EQ(got.data.size(), want.data.size());
      EXPECT_TRUE(got.data == want.data) << "request " << r << ": the GPU instance's bytes differ";
    }
  }
}

TEST(ImageBackendGpuTest, OutputOnGpuStaysThereUntilTheResponseGoes) {
  const auto cfg = Config("max_batch_size: 8 " + std::string(kUint8In) + kFp32Chw +
                          Param("output_on_gpu", "true") + Param("mean", "0.5"));
  FakeGpus gpus;
  auto cpu = gpus.Instance(cfg, false);
  auto gpu = gpus.Instance(cfg, true);
  ASSERT_NE(gpu, nullptr);
  std::mt19937 rng(11);
  std::vector<Batch> b = TwoBatches({{RandomRgbJpeg(rng, 64, 48)},
                                     {RgbPng(10, 300), RandomRgbJpeg(rng, 250, 250)}});
  b[0].Run(cpu.get());
  const uint64_t before = gpus.UsedBytes(1);
  b[1].Run(gpu.get());
  EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kHostToDevice), 1);
  EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kDeviceToHost), 0);  // nothing came back
  const size_t item = 3 * 224 * 224 * sizeof(float);
  // The batch's output (3 items) is in GPU 1's memory while the responses hold it.
  EXPECT_GE(gpus.UsedBytes(1), before + 3 * item);
  EXPECT_EQ(gpus.UsedBytes(0), 0u);
  gpu::FakeRuntime& rt = *gpus.runtime;
  auto stream = rt.CreateStream(1);
  ASSERT_TRUE(stream.ok());
  for (size_t r = 0; r < 2; ++r) {
    const core::OutputTensor& got = b[1].responses[r]->outputs[0];
    EXPECT_EQ(got.place, MemoryPlace::Gpu(1));
    EXPECT_EQ(got.shape, b[0].responses[r]->outputs[0].shape);
    // Device memory: the host reads it only through a copy (the fake refuses a device-to-host
    // copy whose source is not its device memory).
    std::string host(got.data.size(), '\0');
    ASSERT_TRUE(rt.CopyAsync(host.data(), got.data.data(), host.size(),
                             gpu::CopyKind::kDeviceToHost, **stream)
                    .ok());
    EXPECT_TRUE(host == b[0].responses[r]->outputs[0].data) << "request " << r;
  }
  const uint64_t held = gpus.UsedBytes(1);
  b[1].responses.clear();  // the responses' holders free the device buffer
  EXPECT_EQ(gpus.UsedBytes(1), held - 3 * item);
}

// Without output_on_gpu: a batch of ensemble steps (each InferRequest::gpu_outputs_ok) keeps its
// output on the GPU for the next step, as ONNX Runtime's instances do; a batch with any other
// request downloads it once. Only output_on_gpu makes the server copy at its edge.
TEST(ImageBackendGpuTest, EnsembleStepsKeepTheOutputOnTheGpu) {
  const auto cfg = Config("max_batch_size: 8 " + std::string(kUint8In) + kFp32Chw);
  FakeGpus gpus;
  auto gpu = gpus.Instance(cfg, true);
  ASSERT_NE(gpu, nullptr);
  EXPECT_FALSE(gpu->OutputsMayBeOnGpu());
  std::mt19937 rng(5);
  std::vector<Batch> b = TwoBatches({{RandomRgbJpeg(rng, 64, 48)}, {RgbPng(10, 30)}});
  for (auto& r : b[0].requests) r->gpu_outputs_ok = true;
  b[0].Run(gpu.get());
  EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kDeviceToHost), 0);
  for (const auto& resp : b[0].responses) {
    ASSERT_TRUE(resp->status.ok()) << resp->status;
    EXPECT_EQ(resp->outputs[0].place, MemoryPlace::Gpu(1));
  }
  b[1].requests[0]->gpu_outputs_ok = true;  // one of two: the batch comes back to the host
  b[1].Run(gpu.get());
  EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kDeviceToHost), 1);
  for (const auto& resp : b[1].responses) EXPECT_EQ(resp->outputs[0].place, MemoryPlace::Host());

  const auto keep = Config("max_batch_size: 8 " + std::string(kUint8In) + kFp32Chw +
                           Param("output_on_gpu", "true"));
  FakeGpus more;
  EXPECT_TRUE(more.Instance(keep, true)->OutputsMayBeOnGpu());
  EXPECT_FALSE(more.Instance(keep, false)->OutputsMayBeOnGpu());
}

// A client's request that wants the output in a CUDA shared-memory region on the instance's GPU
// (RequestedOutput::gpu_region_on, set by the server) gets it on the GPU too: the server then
// copies it device-to-device into the region, instead of a download here and an upload there.
TEST(ImageBackendGpuTest, OutputForACudaRegionOnItsGpuStaysThere) {
  const auto cfg = Config("max_batch_size: 8 " + std::string(kUint8In) + kFp32Chw);
  FakeGpus gpus;
  auto gpu = gpus.Instance(cfg, true);
  ASSERT_NE(gpu, nullptr);
  std::mt19937 rng(9);
  std::vector<Batch> b = TwoBatches({{RandomRgbJpeg(rng, 64, 48)}, {RgbPng(10, 30)}});
  for (auto& r : b[0].requests) {
    r->outputs.push_back(core::RequestedOutput{.name = "OUT", .gpu_region_on = 1});
  }
  b[0].Run(gpu.get());
  EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kDeviceToHost), 0);
  for (const auto& resp : b[0].responses) {
    ASSERT_TRUE(resp->status.ok()) << resp->status;
    EXPECT_EQ(resp->outputs[0].place, MemoryPlace::Gpu(1));
  }
  // A region on another GPU (or one request of the batch wanting host bytes): downloaded once.
  b[1].requests[0]->outputs.push_back(core::RequestedOutput{.name = "OUT", .gpu_region_on = 0});
  b[1].Run(gpu.get());
  EXPECT_EQ(gpus.runtime->CopyCount(gpu::CopyKind::kDeviceToHost), 1);
  for (const auto& resp : b[1].responses) EXPECT_EQ(resp->outputs[0].place, MemoryPlace::Host());
}

TEST(ImageBackendGpuTest, BadImageFailsOnlyItsRequestAndLaunchErrorsFailTheBatch) {
  const auto cfg = Config("max_batch_size: 8 " + std::string(kUint8In) +
                          "output [ { name: \"OUT\" data_type: TYPE_UINT8 dims: [ 4, 4, 3 ] } ] ");
  FakeGpus gpus;
  auto gpu = gpus.Instance(cfg, true);
  ASSERT_NE(gpu, nullptr);
  const std::string jpeg = SolidJpeg(16, 16, 200, 100, 50);
  Batch batch;
  batch.AddUint8({jpeg, jpeg.substr(0, 300)});  // image 1 truncated
  batch.AddUint8({jpeg});
  batch.Run(gpu.get());
  EXPECT_EQ(batch.responses[0]->status.message(),
            "image 1: corrupt JPEG: Premature end of JPEG file");
  EXPECT_TRUE(batch.responses[0]->outputs.empty());
  ASSERT_TRUE(batch.responses[1]->status.ok()) << batch.responses[1]->status;
  EXPECT_EQ(gpus.launches, 1);  // the failed request's images are not run
  const auto& out = batch.responses[1]->outputs[0];
  EXPECT_EQ(out.shape, (Shape{1, 4, 4, 3}));
  EXPECT_NEAR(static_cast<uint8_t>(out.data[0]), 200, 2);

  gpus.fail_launch = absl::InternalError("CUDA error 700 (an illegal memory access)");
  Batch failing;
  failing.AddUint8({jpeg});
  failing.AddUint8({std::string("not an image at all")});
  failing.Run(gpu.get());
  EXPECT_EQ(failing.responses[0]->status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(failing.responses[0]->status.message(),
            "image backend on GPU 1: CUDA error 700 (an illegal memory access)");
  EXPECT_THAT(std::string(failing.responses[1]->status.message()), StartsWith("image 0: not a"));
  // The instance goes on after a device error.
  gpus.fail_launch = absl::OkStatus();
  Batch again;
  again.AddUint8({jpeg});
  again.Run(gpu.get());
  EXPECT_TRUE(again.responses[0]->status.ok()) << again.responses[0]->status;
}

TEST(ImageBackendGpuTest, GpuInstancesNeedTheKernelAndAnExistingGpu) {
  const auto cfg = Config(std::string(kUint8In) + kFp32Chw);
  FakeGpus gpus;
  EXPECT_TRUE(gpus.backend->GpuInstanceSupport().ok());
  ModelSpec spec;
  spec.config = &cfg;
  auto missing = gpus.backend->CreateInstanceOn(spec, inference::ModelInstanceGroup(), 0,
                                                {.gpu = true, .id = 2, .name = "pre_0"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(missing.status().message(),
            "model 'pre': instance 'pre_0' on GPU 2: the GPU runtime lists 2 GPU(s)");
  // The real launch: offered exactly when the build has the kernel (CUDA at configure time).
  auto system = MakeImageBackend();
  const absl::Status support = system->GpuInstanceSupport();
  EXPECT_EQ(support.ok(), gpu::ImagePreprocessKernelBuilt()) << support;
  if (!support.ok()) {
    EXPECT_THAT(std::string(support.message()),
                StartsWith("backend 'image' cannot run on a GPU: this build has no CUDA"));
  }
  // A bad parameter is refused on a GPU as on the CPU.
  const auto bad = Config(std::string(kUint8In) + kFp32Chw + Param("output_on_gpu", "1"));
  spec.config = &bad;
  auto refused = gpus.backend->CreateInstanceOn(spec, inference::ModelInstanceGroup(), 0,
                                                {.gpu = true, .id = 0, .name = "pre_0"});
  EXPECT_EQ(refused.status().message(),
            "model 'pre': parameter 'output_on_gpu' must be 'true' or 'false', got '1'");
}

}  // namespace
}  // namespace inferd::backends::image
