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
//                  on disk or at s3://bucket/key (downloaded once per ETag).
//                  Under --model-memory-budget, idle models are evicted least recently used
//                  first to make room; a model with requests in flight never is.
//
// Loads and unloads run on the service's own thread, never on an event loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "common/worker_pool.h"
#include "frontends/http/kserve_service.h"
#include "metrics/prometheus.h"
#include "server/server.h"
#include "repository/archive.h"

namespace inferd::sagemaker {

struct SageMakerOptions {
  std::string default_model;  // SAGEMAKER_TRITON_DEFAULT_MODEL_NAME; empty: the only model
  bool ping_live = false;     // SAGEMAKER_TRITON_PING_MODE=live: /ping is liveness
  std::string model_cache_dir = "/tmp/inferd-sagemaker";  // where archives are extracted
  int64_t memory_budget_bytes = 0;  // 0: no budget
  // How a model's footprint is counted: the process's RSS growth over its load (at least its
  // size on disk), or just its size on disk (exact and repeatable, but blind to what a
  // backend allocates beyond its weights).
  bool footprint_from_disk = false;
  repository::ExtractLimits extract_limits;
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
                   SageMakerOptions options, metrics::MetricsRegistry* registry);
  ~SageMakerService();

  void Handle(const http::HttpRequest& request, std::shared_ptr<const void> body_owner,
              Reply reply);
  http::HttpHandler AsHandler();

 private:
  struct Entry {
    std::string url;
    std::string extracted;  // folder to delete on unload ("" when the url was a folder)
    int64_t footprint = 0;
    uint64_t last_used_ns = 0;
    int in_flight = 0;
  };

  void Invocations(const http::HttpRequest& request, std::shared_ptr<const void> owner,
                   Reply reply);
  void Invoke(const http::HttpRequest& request, std::shared_ptr<const void> owner,
              const std::string& model, Reply reply, bool track);
  void LoadModel(const http::HttpRequest& request, Reply reply);
  void UnloadModel(const std::string& name, Reply reply);
  http::HttpResponse ListModels(const http::HttpRequest& request);
  http::HttpResponse GetModel(const std::string& name);
  absl::Status LoadNow(const std::string& name, const std::string& url);
  absl::Status MakeRoom(const std::string& name, int64_t needed);
  void Collect(metrics::PrometheusWriter& w) const;

  server::Server* server_;
  http::KServeHttpService* kserve_;
  const SageMakerOptions options_;

  mutable inferd::Mutex mu_;
  std::map<std::string, Entry, std::less<>> models_ ABSL_GUARDED_BY(mu_);
  // Names being loaded: a second load of one is 409 too.
  std::map<std::string, bool, std::less<>> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unloads_ ABSL_GUARDED_BY(mu_) = 0;
  double load_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double unload_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t extract_counter_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t downloads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t download_cache_hits_ ABSL_GUARDED_BY(mu_) = 0;
  double download_seconds_ ABSL_GUARDED_BY(mu_) = 0;

  // One thread: loads and unloads are serialized, so each load's memory footprint can be
  // measured as the process's RSS growth.
  WorkerPool loader_{1, 256};
};

}  // namespace inferd::sagemaker
