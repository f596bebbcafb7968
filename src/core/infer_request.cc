#include "core/infer_request.h"

#include <chrono>
#include <cstdio>

#include "common/strings.h"

namespace inferd::core {

InferRequest::~InferRequest() {
  if (trace != nullptr) trace->Finish(*this, NowNs());
}

const InputTensor* InferRequest::FindInput(std::string_view name) const {
  for (const auto& in : inputs) {
    if (in.name == name) return &in;
  }
  return nullptr;
}

void CompleteWithError(std::unique_ptr<InferRequest> request, absl::Status status) {
  auto response = std::make_unique<InferResponse>();
  response->status = std::move(status);
  response->model_name = request->model_name;
  response->model_version = request->model_version;
  response->id = request->id;
  InferCallback cb = std::move(request->on_complete);
  request.reset();
  if (cb) cb(std::move(response));
}

namespace {
std::string Millis(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(ns) / 1e6);
  return buf;
}
uint64_t Waited(uint64_t received_ns, uint64_t now_ns) {
  return now_ns > received_ns ? now_ns - received_ns : 0;
}
}  // namespace

absl::Status CancelledError(const InferRequest& request, uint64_t now_ns) {
  return CancelledError(request.model_name, request.times.received_ns, now_ns);
}

absl::Status DeadlineError(const InferRequest& request, uint64_t now_ns, std::string_view limit) {
  return DeadlineError(request.model_name, request.times.received_ns, now_ns, limit);
}

absl::Status CancelledError(std::string_view model_name, uint64_t received_ns, uint64_t now_ns) {
  return absl::CancelledError(StrCat("request for model '", model_name,
                                     "' was cancelled by the client after ",
                                     Millis(Waited(received_ns, now_ns)), " ms"));
}

absl::Status DeadlineError(std::string_view model_name, uint64_t received_ns, uint64_t now_ns,
                           std::string_view limit) {
  return absl::DeadlineExceededError(StrCat("request for model '", model_name,
                                            "' timed out: waited ",
                                            Millis(Waited(received_ns, now_ns)), " ms (", limit,
                                            ")"));
}

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace inferd::core
