// The HTTP status an error answers with where it is not its code's usual one: a payload on the
// absl::Status that http::HttpStatusFromStatus reads first. Triton's HTTP frontend answers 400
// for a model's UNKNOWN and ALREADY_EXISTS errors (HttpCodeFromError), while inferd's own
// errors of those codes keep their usual statuses (409 for a load conflict), so the backend
// that passes a model's error code on marks the status.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace inferd {

inline constexpr char kHttpStatusPayloadUrl[] = "type.inferd/http_status";

// `status` (not OK) answering `http_status` over HTTP; its code still says what gRPC answers.
inline absl::Status WithHttpStatus(absl::Status status, int http_status) {
  status.SetPayload(kHttpStatusPayloadUrl, absl::Cord(std::to_string(http_status)));
  return status;
}

// The HTTP status WithHttpStatus set on `status`, if any.
inline std::optional<int> HttpStatusHint(const absl::Status& status) {
  auto payload = status.GetPayload(kHttpStatusPayloadUrl);  // absl::optional<absl::Cord>
  if (!payload) return std::nullopt;
  int code = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &code) || code < 400 || code > 599) {
    return std::nullopt;
  }
  return code;
}

}  // namespace inferd
