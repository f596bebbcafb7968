#include "core/infer_request.h"

#include <chrono>

namespace inferd::core {

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

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace inferd::core
