#include "core/infer_request.h"

#include <chrono>
#include <cstdio>

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
uint64_t Waited(const InferRequest& request, uint64_t now_ns) {
  return now_ns > request.times.received_ns ? now_ns - request.times.received_ns : 0;
}
}  // namespace

absl::Status CancelledError(const InferRequest& request, uint64_t now_ns) {
  return absl::CancelledError("request for model '" + request.model_name +
                              "' was cancelled by the client after " +
                              Millis(Waited(request, now_ns)) + " ms");
}

absl::Status DeadlineError(const InferRequest& request, uint64_t now_ns, std::string_view limit) {
  return absl::DeadlineExceededError("request for model '" + request.model_name +
                                     "' timed out: waited " + Millis(Waited(request, now_ns)) +
                                     " ms (" + std::string(limit) + ")");
}

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace inferd::core
