// The Amazon SageMaker container contract, on its own HTTP listener (--sagemaker-port, 8080):
//
//   single model   GET /ping, POST /invocations (the model SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
//                  names, or the repository's only model). JSON bodies, or Content-Type
//                  application/vnd.sagemaker-triton.binary+json;json-header-size=N in place of
//                  Inference-Header-Content-Length; binary answers carry the same type.
//   multi model    POST /models {"model_name","url"}, GET /models[?next_page_token=],
//                  GET /models/<name>, DELETE /models/<name>, POST /models/<name>/invoke.
//                  `url` is a model folder, a folder holding one model (or an ensemble and its
//                  parts), or an archive (.tar.gz, .tgz, .tar) of either, extracted safely,
//                  on disk or at s3://bucket/key. With --model-control-mode=on-demand, an
//                  invoke of a model that is not loaded loads the repository's entry named by
//                  X-Amzn-SageMaker-Target-Model (e.g. "resnet.tar.gz") under <name>, and
//                  GET /models lists it. One name serves one model: a TargetModel naming
//                  another entry for a name loaded (or being loaded) from one, or for a model
//                  the repository holds under that name, is 409 naming both.
//                  With --http-restricted-api, the /models routes (not invocations) are the
//                  model-repository category.
//
// These are routes over the model store (repository::ModelLifecycle through server::Server):
// fetching, extraction, the memory budget and eviction live there, and an evicted multi-model
// model loads again from its URL on its next invoke. Loads run on the store's loader pool,
// never on an event loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/mutex.h"
#include "frontends/http/kserve_service.h"
#include "metrics/prometheus.h"
#include "server/server.h"

namespace inferd::sagemaker {

struct SageMakerOptions {
  std::string default_model;  // SAGEMAKER_TRITON_DEFAULT_MODEL_NAME; empty: the only model
  bool ping_live = false;     // SAGEMAKER_TRITON_PING_MODE=live: /ping is liveness
};

// The binary+json media type and its header size; nullopt when `content_type` is not it.
// Errors (INVALID_ARGUMENT) for a malformed or out-of-range size.
absl::StatusOr<std::optional<size_t>> ParseSageMakerContentType(std::string_view content_type,
                                                                size_t body_size);
inline constexpr std::string_view kBinaryMimePrefix =
    "application/vnd.sagemaker-triton.binary+json;json-header-size=";

class SageMakerService {
 public:
  using Reply = http::KServeHttpService::Reply;

  SageMakerService(server::Server* server, http::KServeHttpService* kserve,
                   SageMakerOptions options);
  ~SageMakerService();

  void Handle(const http::HttpRequest& request, std::shared_ptr<const void> body_owner,
              Reply reply);
  http::HttpHandler AsHandler();

 private:
  void Invocations(const http::HttpRequest& request, std::shared_ptr<const void> owner,
                   Reply reply);
  // One invocation through the server facade (http::InferFromBody); `resolve` carries the
  // multi-model contract and the TargetModel.
  void Invoke(const http::HttpRequest& request, std::shared_ptr<const void> owner,
              const std::string& model, const server::ResolveOptions& resolve, Reply reply);
  void LoadModel(const http::HttpRequest& request, Reply reply);
  void UnloadModel(const std::string& name, Reply reply);
  http::HttpResponse ListModels(const http::HttpRequest& request);
  http::HttpResponse GetModel(const std::string& name);

  server::Server* server_;
  http::KServeHttpService* kserve_;
  const SageMakerOptions options_;

  inferd::Mutex mu_;
  // Names being loaded through POST /models: a second load of one is 409.
  std::set<std::string, std::less<>> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::sagemaker
