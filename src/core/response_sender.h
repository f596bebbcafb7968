// Decoupled responses: how a backend answers one request with any number of responses (0..N)
// and then a final flag, as Triton's `model_transaction_policy { decoupled: true }` and
// TRITONBACKEND_ResponseFactory / the Python backend's `get_response_sender()` do.
//
// Who does what:
//  - A frontend that can carry several responses per request (gRPC ModelStreamInfer, HTTP
//    generate_stream and generate) sets `InferRequest::on_response` (core/infer_request.h).
//    Frontends that answer once (HTTP /infer, unary gRPC ModelInfer) set only `on_complete`;
//    the server refuses decoupled models there, as Triton does.
//  - For a model whose config says `decoupled: true`, server::Server creates one
//    ResponseSender per request, over the frontend's `on_response`, and puts it in
//    `InferRequest::response_sender` before the request is queued.
//  - A backend that answers decoupled (Backend::SupportsDecoupled()) takes a copy of that
//    shared_ptr in ModelInstance::Execute and calls Send / SendFinal from any thread, during
//    Execute or after it returned, until it has sent the final flag. The request itself (and
//    every tensor view in it) is valid only during Execute: copy what you need. The model
//    instance is free for its next request as soon as Execute returns.
//  - A backend that knows nothing of this (identity, onnxruntime, ...) fills
//    `responses[i]` as usual; the server sends that as the one response, final.
//  - Execute leaving `responses[i]->status` not OK while the sender has not sent its final
//    flag: the server sends that error as the final response.
//
// Wire mapping (done by the frontends): each Send becomes one stream message / SSE event;
// `final` becomes the `triton_final_response` response parameter; SendFinal() alone (no
// response) is written only when the client asked for `triton_enable_empty_final_response`.
//
// Thread safety: every method is thread-safe. Calls of the sink for one request never overlap
// and keep the order of the Send calls. Lifetime: shared by the server and the backend; if the
// last reference goes away before the final flag was sent, the destructor sends an INTERNAL
// error as the final response, so a client never waits forever on a backend bug.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "core/cancellation.h"
#include "core/infer_request.h"

namespace inferd::core {

class ResponseSender {
 public:
  // `sink` receives each response (null with final=true for the flag alone).
  ResponseSender(std::string model_name, int64_t model_version, std::string request_id,
                 ResponseCallback sink);
  ~ResponseSender();
  ResponseSender(const ResponseSender&) = delete;
  ResponseSender& operator=(const ResponseSender&) = delete;

  // What the server does to every response before the client's sink sees it: the output
  // edge (GPU outputs made host-readable, outputs copied into shared-memory regions), the same
  // functions a request that answers once passes through its `on_complete` wrappers. Edges
  // run in the reverse order of their addition, as those wrappers do (the one installed last
  // runs first), on the thread that calls Send, and must be idempotent: the one response of a
  // decoupled model whose backend does not stream passes them twice (on_complete, then Send).
  // Set-up only: called by the server before the request is queued, never once the sender is
  // shared with a backend.
  using Edge = std::function<void(InferResponse*)>;
  void AddEdge(Edge edge) { edges_.push_back(std::move(edge)); }

  // A response already stamped with the request's model, version and id.
  std::unique_ptr<InferResponse> MakeResponse() const;

  // Sends one response: outputs, or an error in `response->status` (an error response does
  // not end the request unless `final`). FAILED_PRECONDITION once the final flag was sent;
  // INVALID_ARGUMENT for a null response that is not final.
  absl::Status Send(std::unique_ptr<InferResponse> response, bool final);
  // Sends the final flag with no response (Triton's TRITONBACKEND_ResponseFactorySendFlags).
  absl::Status SendFinal() { return Send(nullptr, true); }
  // Sends `error` as the final response.
  absl::Status SendError(absl::Status error);

  // True once the final flag was sent.
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Responses sent so far (not counting a flag-only final).
  uint64_t responses_sent() const { return sent_.load(std::memory_order_acquire); }

  // The client can no longer receive responses (the request's CancellationToken fired, or
  // Cancel was called); a backend may stop early, but must still send the final flag.
  bool IsCancelled() const {
    return cancelled_.load(std::memory_order_acquire) ||
           (cancel_ != nullptr && cancel_->IsCancelled());
  }
  void Cancel() { cancelled_.store(true, std::memory_order_release); }
  // Makes IsCancelled follow the request's token (set once, before the sender is shared).
  void FollowCancellation(std::shared_ptr<CancellationToken> token) { cancel_ = std::move(token); }

  const std::string& model_name() const { return model_name_; }
  int64_t model_version() const { return model_version_; }
  const std::string& request_id() const { return request_id_; }

 private:
  const std::string model_name_;
  const int64_t model_version_;
  const std::string request_id_;
  inferd::Mutex mu_;  // serializes calls of the sink
  ResponseCallback sink_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> closed_{false};
  std::atomic<bool> cancelled_{false};
  std::shared_ptr<CancellationToken> cancel_;
  std::atomic<uint64_t> sent_{0};
  std::vector<Edge> edges_;  // written before the sender is shared, then only read
};

// Called by the server for a request to a decoupled model, before it is queued: creates the
// request's ResponseSender over `on_response` and makes `on_complete` (what the scheduler calls
// once Execute returned) send an error, or with a backend that does not stream
// (`backend_streams` false) the one response, as the final response. UNIMPLEMENTED, naming
// the model, when the request came from an endpoint that answers once (no `on_response`), as
// Triton refuses decoupled models on /infer and ModelInfer.
absl::Status PrepareDecoupledRequest(InferRequest* request, bool backend_streams);

// For a request that may get several responses (`on_response` set) to a model that answers
// once: `on_complete` forwards its one response as the final one. No-op otherwise.
void AnswerOnceThroughStream(InferRequest* request);

}  // namespace inferd::core
