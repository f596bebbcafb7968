#include "server/model_resolver.h"

namespace inferd::server {

absl::Status WaitFailure(absl::Status status, std::string_view model_name,
                         const std::shared_ptr<core::CancellationToken>& cancel,
                         uint64_t received_ns, uint64_t timeout_us, uint64_t now_ns) {
  // The store answers a request's own limits with an empty message: the request names itself.
  if (status.code() == absl::StatusCode::kCancelled && cancel != nullptr &&
      cancel->IsCancelled()) {
    return core::CancelledError(model_name, received_ns, now_ns);
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded && status.message().empty()) {
    return core::DeadlineError(
        model_name, received_ns, now_ns,
        timeout_us != 0 && received_ns + timeout_us * 1000 <= now_ns
            ? StrCat("timeout ", timeout_us, " us, waiting for the model to load")
            : std::string("the client's deadline, waiting for the model to load"));
  }
  return status;
}

}  // namespace inferd::server
