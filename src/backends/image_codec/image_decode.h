// Decoding of encoded images (JPEG through libjpeg-turbo, PNG through libpng) into 8-bit
// interleaved RGB. The format is chosen by the magic bytes, never by a name or a content type.
// Both libraries report errors by longjmp to a point inside the decoder function, so a corrupt
// or truncated image is a Status, never an exit() or a crash.
//
// Thread safety: the functions keep no state; any number of threads may decode at once.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::backends::image {

// A decoded image: height rows of width RGB triplets (HWC, row-major, no padding).
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// Format from the leading bytes: FF D8 FF (JPEG), 89 'P' 'N' 'G' 0D 0A 1A 0A (PNG).
ImageFormat DetectFormat(std::string_view bytes);

// Decodes `bytes` to RGB. Grayscale becomes three equal channels; PNG palettes are expanded,
// 16-bit samples keep their high byte, alpha is dropped (not composited, as PIL's
// convert("RGB")). Images with more than `max_pixels` pixels are refused from the header,
// before any pixel memory is allocated. Trailing bytes after the end of the image (the zero
// padding of a batched UINT8 tensor) are ignored. Errors are INVALID_ARGUMENT with a message
// that does not name the image (the caller adds "image <i>: ").
absl::StatusOr<RgbImage> DecodeImage(std::string_view bytes, int64_t max_pixels);

}  // namespace inferd::backends::image
