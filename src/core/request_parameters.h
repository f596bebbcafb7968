// The KServe request parameters the server reads itself (priority, timeout, sequence_id,
// sequence_start, sequence_end) and the shared-memory extension's tensor parameters, parsed
// once for both protocols. A frontend turns each value into a ParameterValue (a JSON scalar
// over HTTP, an InferParameter over gRPC) and hands it here; the rules and the messages are
// one, except for the protocol's own name of a type ("a boolean" / "a bool_param").
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/infer_request.h"

namespace inferd::core {

// One parameter's value, as either protocol carries it. `text` points into the message.
struct ParameterValue {
  enum class Kind { kBool, kInt64, kUint64, kDouble, kString, kOther };
  Kind kind = Kind::kOther;  // kOther: an object, an array, null, or an unset oneof
  bool boolean = false;
  int64_t int64 = 0;
  uint64_t uint64 = 0;
  double number = 0;
  std::string_view text;

  // The value as a non-negative integer (an unsigned, or a signed one >= 0).
  std::optional<uint64_t> NonNegative() const {
    if (kind == Kind::kUint64) return uint64;
    if (kind == Kind::kInt64 && int64 >= 0) return static_cast<uint64_t>(int64);
    return std::nullopt;
  }
};

// How a protocol names the types its errors ask for.
struct ParameterWords {
  std::string_view boolean;
  std::string_view string;
  std::string_view non_negative;
};
inline constexpr ParameterWords kJsonParameterWords{"a boolean", "a string",
                                                    "a non-negative integer"};
inline constexpr ParameterWords kGrpcParameterWords{"a bool_param", "a string_param",
                                                    "a non-negative int64_param"};

// Applies `key` to `request` when it is a parameter the server reads: priority (0 ..
// 4294967295), timeout (microseconds), sequence_id (a non-negative integer or a string),
// sequence_start, sequence_end; binary_data_output is the HTTP codec's and is taken without
// effect. True: taken; false: another parameter, which travels in `request->parameters`.
// INVALID_ARGUMENT naming the parameter for a value of the wrong type.
absl::StatusOr<bool> ApplyRequestParameter(std::string_view key, const ParameterValue& value,
                                           const ParameterWords& words, InferRequest* request);

// The shared-memory extension's parameters of one tensor (`what`: "input 'x'"): nullopt without
// shared_memory_region; shared_memory_byte_size is required with it, shared_memory_offset
// defaults to 0. Each argument is null when the tensor does not carry that parameter.
absl::StatusOr<std::optional<SharedMemoryRef>> ParseSharedMemoryParameters(
    const ParameterValue* region, const ParameterValue* offset, const ParameterValue* byte_size,
    const ParameterWords& words, std::string_view what);

}  // namespace inferd::core
