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

}  // namespace inferd
