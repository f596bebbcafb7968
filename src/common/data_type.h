// Tensor element types as the KServe v2 protocol names them ("FP32", "BYTES", ...), with their
// sizes and the helpers every layer needs to validate shapes against byte counts.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd {

enum class DataType : uint8_t {
  kInvalid = 0,
  kBool,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kFp32,
  kFp64,
  kBytes,
  kBf16,
};

using Shape = std::vector<int64_t>;

// "FP32" -> kFp32; kInvalid for an unknown name.
DataType DataTypeFromString(std::string_view name);
// kFp32 -> "FP32".
std::string_view DataTypeName(DataType type);
// Bytes per element; 0 for kBytes (variable length) and kInvalid.
size_t DataTypeSize(DataType type);

// Number of elements in `shape`. Fails on negative dimensions and on overflow past 2^62.
absl::StatusOr<int64_t> ElementCount(const Shape& shape);

// "[1,3,224,224]"
std::string ShapeToString(const Shape& shape);

// IEEE half <-> float (FP16 elements written as JSON numbers and read back), round to nearest
// even; overflow gives infinity, NaN stays NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// bfloat16 <-> float (BF16 elements): the upper half of the float, round to nearest even.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace inferd
