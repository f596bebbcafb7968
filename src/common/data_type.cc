#include "common/data_type.h"

#include <array>
#include <string>

#include "absl/status/status.h"
#include "common/strings.h"

namespace inferd {
namespace {

struct TypeInfo {
  DataType type;
  std::string_view name;
  size_t size;
};

constexpr std::array<TypeInfo, 14> kTypes = {{
    {DataType::kBool, "BOOL", 1},
    {DataType::kUint8, "UINT8", 1},
    {DataType::kUint16, "UINT16", 2},
    {DataType::kUint32, "UINT32", 4},
    {DataType::kUint64, "UINT64", 8},
    {DataType::kInt8, "INT8", 1},
    {DataType::kInt16, "INT16", 2},
    {DataType::kInt32, "INT32", 4},
    {DataType::kInt64, "INT64", 8},
    {DataType::kFp16, "FP16", 2},
    {DataType::kFp32, "FP32", 4},
    {DataType::kFp64, "FP64", 8},
    {DataType::kBytes, "BYTES", 0},
    {DataType::kBf16, "BF16", 2},
}};

}  // namespace

DataType DataTypeFromString(std::string_view name) {
  for (const auto& t : kTypes) {
    if (t.name == name) return t.type;
  }
  return DataType::kInvalid;
}

std::string_view DataTypeName(DataType type) {
  for (const auto& t : kTypes) {
    if (t.type == type) return t.name;
  }
  return "INVALID";
}

size_t DataTypeSize(DataType type) {
  for (const auto& t : kTypes) {
    if (t.type == type) return t.size;
  }
  return 0;
}

absl::StatusOr<int64_t> ElementCount(const Shape& shape) {
  constexpr int64_t kMax = int64_t{1} << 62;
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          inferd::StrCat("shape ", ShapeToString(shape), " has a negative dimension"));
    }
    if (d != 0 && count > kMax / d) {
      return absl::InvalidArgumentError(
          inferd::StrCat("shape ", ShapeToString(shape), " has too many elements"));
    }
    count *= d;
  }
  return count;
}

std::string ShapeToString(const Shape& shape) {
  return inferd::StrCat("[", inferd::StrJoin(shape, ","), "]");
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = (bits >> 16) & 0x8000;
  const uint32_t abs = bits & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0);  // inf / nan
  if (abs >= 0x477ff000) return sign | 0x7c00;  // overflow to inf
  if (abs < 0x38800000) {                       // subnormal or zero
    if (abs < 0x33000000) return sign;
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // at least 14 here
    uint32_t v = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (v & 1))) ++v;
    return sign | static_cast<uint16_t>(v);
  }
  uint32_t v = ((abs - 0x38000000) >> 13);
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (v & 1))) ++v;
  return sign | static_cast<uint16_t>(v);
}

}  // namespace inferd
