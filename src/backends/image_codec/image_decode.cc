#include "backends/image_codec/image_decode.h"

// jpeglib.h needs FILE and size_t declared before it.
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <new>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "common/strings.h"

namespace inferd::backends::image {
namespace {

// A progressive JPEG can hold thousands of tiny scans, each a full pass over the coefficients:
// a CPU bomb in a few kilobytes. libjpeg-turbo's own advice (djpeg -maxscan) is to cap them.
constexpr int kMaxJpegScans = 1000;

// How a decoder helper ended. The helpers below hold no C++ object with a destructor in the
// frame that calls setjmp, so a longjmp out of libjpeg/libpng skips nothing; everything that
// owns memory lives in the caller and is reached through pointers.
enum class Outcome { kOk, kCodecError, kTooLarge, kUnsupported, kOutOfMemory };

std::string HexPrefix(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    if (i > 0) out.push_back(' ');
    const auto b = static_cast<unsigned char>(bytes[i]);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::Status TooLarge(const RgbImage& image, int64_t max_pixels) {
  return absl::InvalidArgumentError(inferd::StrCat(
      "image is ", image.width, "x", image.height, " = ",
      static_cast<int64_t>(image.width) * image.height, " pixels, more than max_pixels ",
      max_pixels));
}

// --- JPEG -----------------------------------------------------------------------------------

struct JpegContext {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;  // cinfo.err points here
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  int color_space = 0;
};

JpegContext* ContextOf(j_common_ptr cinfo) {
  return reinterpret_cast<JpegContext*>(reinterpret_cast<char*>(cinfo) -
                                        offsetof(JpegContext, cinfo));
}

[[noreturn]] void JpegErrorExit(j_common_ptr cinfo) {
  JpegContext* ctx = ContextOf(cinfo);
  (*cinfo->err->format_message)(cinfo, ctx->message);
  std::longjmp(ctx->jump, 1);
}

// Warnings that mean the pixel data is damaged (libjpeg would fill the rest with grey and carry
// on) fail the image; informational ones (an unknown JFIF revision, extraneous bytes before a
// marker that the decoder skips) do not, as with PIL.
void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_NOT_SEQUENTIAL:
      JpegErrorExit(cinfo);
    default:
      cinfo->err->num_warnings++;
  }
}

void JpegProgress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    JpegContext* ctx = ContextOf(cinfo);
    std::snprintf(ctx->message, sizeof(ctx->message),
                  "more than %d progressive scans", kMaxJpegScans);
    std::longjmp(ctx->jump, 1);
  }
}

Outcome DecodeJpegInto(const unsigned char* data, size_t size, int64_t max_pixels,
                       JpegContext* ctx, RgbImage* image) {
  j_decompress_ptr cinfo = &ctx->cinfo;
  cinfo->err = jpeg_std_error(&ctx->err);
  ctx->err.error_exit = JpegErrorExit;
  ctx->err.emit_message = JpegEmitMessage;
  if (setjmp(ctx->jump)) {
    jpeg_destroy_decompress(cinfo);
    return Outcome::kCodecError;
  }
  jpeg_create_decompress(cinfo);
  ctx->progress.progress_monitor = JpegProgress;
  cinfo->progress = &ctx->progress;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  image->width = static_cast<int>(cinfo->image_width);
  image->height = static_cast<int>(cinfo->image_height);
  if (static_cast<int64_t>(image->width) * image->height > max_pixels) {
    jpeg_destroy_decompress(cinfo);
    return Outcome::kTooLarge;
  }
  ctx->color_space = cinfo->jpeg_color_space;
  if (cinfo->jpeg_color_space != JCS_GRAYSCALE && cinfo->jpeg_color_space != JCS_YCbCr &&
      cinfo->jpeg_color_space != JCS_RGB) {
    jpeg_destroy_decompress(cinfo);
    return Outcome::kUnsupported;  // CMYK / YCCK
  }
  cinfo->out_color_space = JCS_RGB;  // libjpeg-turbo converts grayscale too
  const size_t row_bytes = static_cast<size_t>(image->width) * 3;
  try {
    image->pixels.resize(row_bytes * image->height);
  } catch (const std::bad_alloc&) {
    jpeg_destroy_decompress(cinfo);
    return Outcome::kOutOfMemory;
  }
  jpeg_start_decompress(cinfo);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = image->pixels.data() + row_bytes * cinfo->output_scanline;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  jpeg_destroy_decompress(cinfo);
  return Outcome::kOk;
}

absl::StatusOr<RgbImage> DecodeJpeg(std::string_view bytes, int64_t max_pixels) {
  RgbImage image;
  auto ctx = std::make_unique<JpegContext>();
  switch (DecodeJpegInto(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                         max_pixels, ctx.get(), &image)) {
    case Outcome::kOk:
      return image;
    case Outcome::kTooLarge:
      return TooLarge(image, max_pixels);
    case Outcome::kUnsupported:
      return absl::InvalidArgumentError(inferd::StrCat(
          "unsupported JPEG color space ",
          ctx->color_space == JCS_CMYK ? "CMYK" : ctx->color_space == JCS_YCCK ? "YCCK" : "unknown",
          " (only grayscale, YCbCr and RGB JPEGs are decoded)"));
    case Outcome::kOutOfMemory:
      return absl::ResourceExhaustedError("out of memory decoding the JPEG");
    case Outcome::kCodecError:
      break;
  }
  return absl::InvalidArgumentError(inferd::StrCat("corrupt JPEG: ", ctx->message));
}

// --- PNG ------------------------------------------------------------------------------------

struct PngContext {
  const unsigned char* data = nullptr;
  size_t size = 0;
  size_t offset = 0;
  char message[256] = {};
};

void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (n > ctx->size - ctx->offset) png_error(png, "truncated PNG data");
  std::memcpy(out, ctx->data + ctx->offset, n);
  ctx->offset += n;
}

[[noreturn]] void PngError(png_structp png, png_const_charp message) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->message, sizeof(ctx->message), "%s", message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}  // ancillary-chunk trouble: keep decoding

Outcome DecodePngInto(PngContext* ctx, int64_t max_pixels, RgbImage* image,
                      std::vector<png_bytep>* rows) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, ctx, PngError, PngWarning);
  if (png == nullptr) return Outcome::kOutOfMemory;
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return Outcome::kOutOfMemory;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Outcome::kCodecError;
  }
  png_set_read_fn(png, ctx, PngRead);
  png_read_info(png, info);
  image->width = static_cast<int>(png_get_image_width(png, info));
  image->height = static_cast<int>(png_get_image_height(png, info));
  if (static_cast<int64_t>(image->width) * image->height > max_pixels) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Outcome::kTooLarge;
  }
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);  // tRNS -> alpha
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16) png_set_strip_16(png);
  png_set_strip_alpha(png);  // also the alpha a palette's tRNS expands to
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = static_cast<size_t>(image->width) * 3;
  if (png_get_rowbytes(png, info) != row_bytes) {
    std::snprintf(ctx->message, sizeof(ctx->message),
                  "unexpected row size %zu after conversion to RGB (color type %d, depth %d)",
                  static_cast<size_t>(png_get_rowbytes(png, info)), color_type, bit_depth);
    png_destroy_read_struct(&png, &info, nullptr);
    return Outcome::kCodecError;
  }
  try {
    image->pixels.resize(row_bytes * image->height);
    rows->resize(image->height);
  } catch (const std::bad_alloc&) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Outcome::kOutOfMemory;
  }
  for (int y = 0; y < image->height; ++y) (*rows)[y] = image->pixels.data() + row_bytes * y;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return Outcome::kOk;
}

uint32_t BigEndian32(std::string_view b) {
  return (uint32_t{static_cast<unsigned char>(b[0])} << 24) |
         (uint32_t{static_cast<unsigned char>(b[1])} << 16) |
         (uint32_t{static_cast<unsigned char>(b[2])} << 8) | static_cast<unsigned char>(b[3]);
}

absl::StatusOr<RgbImage> DecodePng(std::string_view bytes, int64_t max_pixels) {
  RgbImage image;
  // IHDR is the first chunk: refuse a bomb before libpng reads (and inflates) anything else;
  // png_read_info reads every chunk up to the first IDAT.
  // (PNG dimensions are at most 2^31 - 1, so the product fits in 64 bits; larger values are
  // libpng's to reject.)
  if (bytes.size() >= 24 && bytes.substr(12, 4) == "IHDR") {
    const uint64_t width = BigEndian32(bytes.substr(16, 4));
    const uint64_t height = BigEndian32(bytes.substr(20, 4));
    if (width <= INT32_MAX && height <= INT32_MAX &&
        width * height > static_cast<uint64_t>(max_pixels)) {
      image.width = static_cast<int>(width);
      image.height = static_cast<int>(height);
      return TooLarge(image, max_pixels);
    }
  }
  std::vector<png_bytep> rows;
  PngContext ctx;
  ctx.data = reinterpret_cast<const unsigned char*>(bytes.data());
  ctx.size = bytes.size();
  switch (DecodePngInto(&ctx, max_pixels, &image, &rows)) {
    case Outcome::kOk:
      return image;
    case Outcome::kTooLarge:
      return TooLarge(image, max_pixels);
    case Outcome::kOutOfMemory:
      return absl::ResourceExhaustedError("out of memory decoding the PNG");
    case Outcome::kUnsupported:
    case Outcome::kCodecError:
      break;
  }
  return absl::InvalidArgumentError(inferd::StrCat("corrupt PNG: ", ctx.message));
}

}  // namespace

ImageFormat DetectFormat(std::string_view bytes) {
  static constexpr unsigned char kJpeg[] = {0xFF, 0xD8, 0xFF};
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (bytes.size() >= sizeof(kJpeg) && std::memcmp(bytes.data(), kJpeg, sizeof(kJpeg)) == 0) {
    return ImageFormat::kJpeg;
  }
  if (bytes.size() >= sizeof(kPng) && std::memcmp(bytes.data(), kPng, sizeof(kPng)) == 0) {
    return ImageFormat::kPng;
  }
  return ImageFormat::kUnknown;
}

absl::StatusOr<RgbImage> DecodeImage(std::string_view bytes, int64_t max_pixels) {
  switch (DetectFormat(bytes)) {
    case ImageFormat::kJpeg:
      return DecodeJpeg(bytes, max_pixels);
    case ImageFormat::kPng:
      return DecodePng(bytes, max_pixels);
    case ImageFormat::kUnknown:
      break;
  }
  if (bytes.empty()) return absl::InvalidArgumentError("empty (0 bytes), not a JPEG or PNG");
  return absl::InvalidArgumentError(inferd::StrCat(
      "not a JPEG or PNG (", bytes.size(), " bytes, first bytes ", HexPrefix(bytes), ")"));
}

}  // namespace inferd::backends::image
