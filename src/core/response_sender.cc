#include "core/response_sender.h"

#include <utility>

namespace inferd::core {

ResponseSender::ResponseSender(std::string model_name, int64_t model_version,
                               std::string request_id, ResponseCallback sink)
    : model_name_(std::move(model_name)),
      model_version_(model_version),
      request_id_(std::move(request_id)),
      sink_(std::move(sink)) {}

ResponseSender::~ResponseSender() {
  if (closed()) return;
  SendError(absl::InternalError(
      "the backend of model '" + model_name_ +
      "' released its response sender without sending the final flag"));
}

std::unique_ptr<InferResponse> ResponseSender::MakeResponse() const {
  auto response = std::make_unique<InferResponse>();
  response->model_name = model_name_;
  response->model_version = model_version_;
  response->id = request_id_;
  return response;
}

absl::Status ResponseSender::Send(std::unique_ptr<InferResponse> response, bool final) {
  if (response == nullptr && !final) {
    return absl::InvalidArgumentError("a response sender needs a response or the final flag");
  }
  if (response != nullptr) {
    if (response->model_name.empty()) response->model_name = model_name_;
    if (response->model_version < 0) response->model_version = model_version_;
    if (response->id.empty()) response->id = request_id_;
    // Outside the lock: an edge may copy from a GPU. Skipped once closed (refused below).
    if (!closed()) {
      for (auto it = edges_.rbegin(); it != edges_.rend(); ++it) (*it)(response.get());
    }
  }
  ResponseCallback done;
  {
    inferd::MutexLock lock(&mu_);
    if (closed_.load(std::memory_order_acquire)) {
      return absl::FailedPreconditionError("the response sender of a request to model '" +
                                           model_name_ + "' already sent its final flag");
    }
    if (response != nullptr) sent_.fetch_add(1, std::memory_order_acq_rel);
    if (final) closed_.store(true, std::memory_order_release);
    if (sink_) sink_(std::move(response), final);
    // The frontend's callback (and what it holds) is released with the final flag.
    if (final) done = std::move(sink_);
  }
  return absl::OkStatus();
}

absl::Status ResponseSender::SendError(absl::Status error) {
  auto response = MakeResponse();
  response->status = std::move(error);
  return Send(std::move(response), /*final=*/true);
}

absl::Status PrepareDecoupledRequest(InferRequest* request, bool backend_streams) {
  if (!request->on_response) {
    return absl::UnimplementedError(
        "model '" + request->model_name +
        "' is decoupled (model_transaction_policy { decoupled: true }): this endpoint answers "
        "once and doesn't support models with decoupled transaction policy; use gRPC "
        "ModelStreamInfer or HTTP generate_stream");
  }
  auto sender = std::make_shared<ResponseSender>(request->model_name, request->model_version,
                                                 request->id, std::move(request->on_response));
  request->on_response = nullptr;
  sender->FollowCancellation(request->cancel);
  request->response_sender = sender;
  request->on_complete = [sender, backend_streams](std::unique_ptr<InferResponse> response) {
    if (sender->closed()) return;
    if (backend_streams && response->status.ok()) return;  // the backend sends the rest
    (void)sender->Send(std::move(response), /*final=*/true);
  };
  return absl::OkStatus();
}

void AnswerOnceThroughStream(InferRequest* request) {
  if (!request->on_response || request->on_complete) return;
  request->on_complete = [sink = request->on_response](std::unique_ptr<InferResponse> response) {
    sink(std::move(response), /*final=*/true);
  };
}

}  // namespace inferd::core
