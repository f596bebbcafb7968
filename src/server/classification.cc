#include "server/classification.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <numeric>

#include "common/strings.h"

namespace inferd::server {
namespace {

template <typename T>
double Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return static_cast<double>(v);
}

// IEEE 754 binary16 to double (subnormals, infinities and NaN included).
double HalfToDouble(const char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

// bfloat16 is the upper half of a float.
double Bf16ToDouble(const char* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool ToDoubles(const core::OutputTensor& out, std::vector<double>* values) {
  const size_t size = DataTypeSize(out.datatype);
  if (size == 0) return false;
  const size_t n = out.data.size() / size;
  values->resize(n);
  const char* p = out.data.data();
  for (size_t i = 0; i < n; ++i, p += size) {
    switch (out.datatype) {
      case DataType::kBool: (*values)[i] = *p != 0; break;
      case DataType::kUint8: (*values)[i] = Load<uint8_t>(p); break;
      case DataType::kUint16: (*values)[i] = Load<uint16_t>(p); break;
      case DataType::kUint32: (*values)[i] = Load<uint32_t>(p); break;
      case DataType::kUint64: (*values)[i] = Load<uint64_t>(p); break;
      case DataType::kInt8: (*values)[i] = Load<int8_t>(p); break;
      case DataType::kInt16: (*values)[i] = Load<int16_t>(p); break;
      case DataType::kInt32: (*values)[i] = Load<int32_t>(p); break;
      case DataType::kInt64: (*values)[i] = Load<int64_t>(p); break;
      case DataType::kFp16: (*values)[i] = HalfToDouble(p); break;
      case DataType::kBf16: (*values)[i] = Bf16ToDouble(p); break;
      case DataType::kFp32: (*values)[i] = Load<float>(p); break;
      case DataType::kFp64: (*values)[i] = Load<double>(p); break;
      default: return false;
    }
  }
  return true;
}

}  // namespace

absl::Status ApplyClassification(const std::vector<core::RequestedOutput>& requested,
                                 const LabelMap& labels, bool batching,
                                 core::InferResponse* response) {
  for (const auto& req : requested) {
    if (req.classification <= 0) continue;
    for (auto& out : response->outputs) {
      if (out.name != req.name) continue;
      std::vector<double> values;
      if (!ToDoubles(out, &values)) {
        return absl::InvalidArgumentError(StrCat(
            "output '", out.name, "': classification needs a numeric output, not ",
            DataTypeName(out.datatype)));
      }
      const size_t rows = batching && !out.shape.empty() ? static_cast<size_t>(out.shape[0]) : 1;
      const size_t cols = rows ? values.size() / rows : 0;
      const size_t k = std::min<size_t>(static_cast<size_t>(req.classification), cols);
      const std::vector<std::string>* names = nullptr;
      if (auto it = labels.find(out.name); it != labels.end()) names = &it->second;
      auto bytes = std::make_shared<std::string>();
      std::vector<size_t> idx(cols);
      for (size_t r = 0; r < rows; ++r) {
        const double* row = values.data() + r * cols;
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(),
                         [row](size_t a, size_t b) { return row[a] > row[b]; });
        for (size_t j = 0; j < k; ++j) {
          std::string entry = std::to_string(row[idx[j]]) + ":" + std::to_string(idx[j]);
          if (names != nullptr && idx[j] < names->size()) entry += ":" + (*names)[idx[j]];
          const uint32_t len = static_cast<uint32_t>(entry.size());
          bytes->append(reinterpret_cast<const char*>(&len), 4);
          bytes->append(entry);
        }
      }
      out.datatype = DataType::kBytes;
      out.shape = batching ? Shape{static_cast<int64_t>(rows), static_cast<int64_t>(k)}
                           : Shape{static_cast<int64_t>(k)};
      out.data = *bytes;
      out.holder = std::move(bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace inferd::server
