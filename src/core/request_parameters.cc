#include "core/request_parameters.h"

#include <limits>
#include <string>

#include "common/strings.h"

namespace inferd::core {

absl::StatusOr<bool> ApplyRequestParameter(std::string_view key, const ParameterValue& value,
                                           const ParameterWords& words, InferRequest* request) {
  using Kind = ParameterValue::Kind;
  if (key == "priority") {
    auto v = value.NonNegative();
    if (!v || *v > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError("parameter 'priority' must be a non-negative integer");
    }
    request->priority = static_cast<uint32_t>(*v);
    return true;
  }
  if (key == "timeout") {
    auto v = value.NonNegative();
    if (!v) {
      return absl::InvalidArgumentError(
          "parameter 'timeout' must be a non-negative integer (microseconds)");
    }
    request->timeout_us = *v;
    return true;
  }
  if (key == "sequence_id") {
    if (auto v = value.NonNegative()) {
      request->sequence_id.number = *v;
    } else if (value.kind == Kind::kString) {
      request->sequence_id.is_string = true;
      request->sequence_id.text.assign(value.text.data(), value.text.size());
    } else {
      return absl::InvalidArgumentError(
          "parameter 'sequence_id' must be a non-negative integer or a string");
    }
    return true;
  }
  if (key == "sequence_start" || key == "sequence_end") {
    if (value.kind != Kind::kBool) {
      return absl::InvalidArgumentError(
          StrCat("parameter '", key, "' must be ", words.boolean));
    }
    (key == "sequence_start" ? request->sequence_start : request->sequence_end) = value.boolean;
    return true;
  }
  return key == "binary_data_output";
}

absl::StatusOr<std::optional<SharedMemoryRef>> ParseSharedMemoryParameters(
    const ParameterValue* region, const ParameterValue* offset, const ParameterValue* byte_size,
    const ParameterWords& words, std::string_view what) {
  if (region == nullptr) {
    if (offset != nullptr || byte_size != nullptr) {
      return absl::InvalidArgumentError(StrCat(
          what, ": 'shared_memory_offset' and 'shared_memory_byte_size' need 'shared_memory_region'"));
    }
    return std::optional<SharedMemoryRef>();
  }
  if (region->kind != ParameterValue::Kind::kString) {
    return absl::InvalidArgumentError(
        StrCat(what, ": 'shared_memory_region' must be ", words.string));
  }
  SharedMemoryRef ref;
  ref.region.assign(region->text.data(), region->text.size());
  if (offset != nullptr) {
    auto v = offset->NonNegative();
    if (!v) {
      return absl::InvalidArgumentError(
          StrCat(what, ": 'shared_memory_offset' must be ", words.non_negative));
    }
    ref.offset = *v;
  }
  if (byte_size == nullptr) {
    return absl::InvalidArgumentError(StrCat(
        what, ": 'shared_memory_byte_size' must be given with 'shared_memory_region'"));
  }
  auto v = byte_size->NonNegative();
  if (!v) {
    return absl::InvalidArgumentError(
        StrCat(what, ": 'shared_memory_byte_size' must be ", words.non_negative));
  }
  ref.byte_size = *v;
  return std::optional<SharedMemoryRef>(std::move(ref));
}

}  // namespace inferd::core
