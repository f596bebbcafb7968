// Fuzzes the image backend's decoders (libjpeg-turbo and libpng behind setjmp error handling)
// and, for what decodes, the resize / crop / normalize step. A small max_pixels keeps each
// input cheap; the first byte picks the output settings.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "backends/image_codec/image_decode.h"
#include "backends/image/image_transform.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  using namespace inferd::backends::image;
  const uint8_t knobs = data[0];
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  auto image = DecodeImage(bytes, /*max_pixels=*/1 << 18);
  if (!image.ok()) return 0;
  if (image->pixels.size() != static_cast<size_t>(image->width) * image->height * 3) {
    __builtin_trap();
  }
  PreprocessSettings s;
  s.output_height = 1 + (knobs & 7);
  s.output_width = 1 + ((knobs >> 3) & 7);
  s.output_type = (knobs & 64) ? inferd::DataType::kUint8 : inferd::DataType::kFp32;
  s.layout = (knobs & 128) ? Layout::kNHWC : Layout::kNCHW;
  if (knobs & 32) {
    s.resize_mode = ResizeMode::kShorterSideCenterCrop;
    s.resize_shorter = std::max(s.output_height, s.output_width) + (knobs & 3);
  }
  std::vector<float> out(3 * 8 * 8);
  Preprocess(*image, s, out.data());
  return 0;
}
