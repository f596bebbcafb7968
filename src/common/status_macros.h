// Small helpers for propagating absl::Status. Every fallible function in inferd returns
// absl::Status or absl::StatusOr<T>; these keep call sites short.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define INFERD_CONCAT_INNER(a, b) a##b
#define INFERD_CONCAT(a, b) INFERD_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                   \
  do {                                          \
    ::absl::Status _inferd_status = (expr);     \
    if (!_inferd_status.ok()) return _inferd_status; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                          \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL(INFERD_CONCAT(_inferd_statusor_, __LINE__), lhs, rexpr)
