// The facade every frontend calls: health, metadata, configuration, inference, statistics and
// the model repository API. It owns the model lifecycle and the background threads (poller,
// loader pool). One execution path for every protocol: frontends only convert messages.
//
// Thread-safe. Start() once, then any thread may call the rest; Shutdown() stops the poller,
// then unloads every model, draining requests in flight.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "backends/backend.h"
#include "common/worker_pool.h"
#include "config/model_config_util.h"
#include "core/infer_request.h"
#include "metrics/custom_metrics.h"
#include "metrics/model_stats.h"
#include "metrics/prometheus.h"
#include "repository/model_lifecycle.h"
#include "server/model_resolver.h"
#include "server/response_cache.h"
#include "server/shared_memory.h"
#include "server/trace.h"

namespace inferd::server {

// tritonserver's modes, plus on-demand: nothing loads at start but --load-model models
// (pinned); a model's first request loads it, and the memory budget evicts idle ones.
enum class ControlMode { kNone, kExplicit, kPoll, kOnDemand };

struct ServerOptions {
  // --id: the server metadata's "name". tritonserver's default, "triton", which clients
  // written for Triton (tritonclient's own examples) check for.
  std::string id = "triton";
  bool model_namespacing = false;  // --model-namespacing (repository::LifecycleOptions)
  std::vector<std::string> repositories;
  ControlMode control_mode = ControlMode::kNone;
  int poll_secs = 15;
  std::vector<std::string> load_models;  // explicit mode; "*" means all
  bool strict_readiness = true;
  bool exit_on_error = true;
  bool auto_complete = true;
  // --strict-model-config-parameters: refuse a `parameters` key the backend does not read
  // (backends::CheckConfigSupport) instead of loading with a WARNING naming it.
  bool strict_model_config_parameters = false;
  // Where instances run: the host's GPUs (gpu::SystemRuntime() in the server),
  // --min-supported-compute-capability, --gpu-fallback-to-cpu.
  repository::PlacementOptions placement;
  // The device layer for CUDA shared memory (opening clients' IPC handles, copies between a
  // region and the host): gpu::SystemRuntime() in the server, the fake devices in tests; null
  // refuses CUDA regions as Triton built without GPU support. Must outlive the server.
  gpu::Runtime* gpus = nullptr;
  // --model-config-name: each model's config is <model>/configs/<name>.pbtxt where that file
  // exists (config::ModelConfigPath), config.pbtxt otherwise.
  std::string model_config_name;
  int cpu_cores = 1;
  size_t max_queue_size = 4096;
  // The model store (see repository/model_lifecycle.h).
  repository::SourceOptions sources;                // --model-cache-dir, S3 settings
  int load_threads = 4;                             // --model-load-thread-count
  absl::Duration load_wait = absl::Seconds(60);     // --model-load-wait-secs
  int64_t memory_budget_bytes = 0;                  // --model-memory-budget
  bool footprint_from_disk = false;                 // --model-memory-accounting=disk
  std::string eviction_policy = "cost";             // --model-eviction-policy
  std::map<int, double> gpu_load_limits;            // --model-load-gpu-limit <gpu>:<fraction>
  metrics::LatencyMetricsConfig latency_metrics;    // --metrics-config
  // --cache-config local,size=N (or --response-cache-byte-size): the response cache that
  // models with `response_cache { enable: true }` use. Size 0: no cache.
  uint64_t response_cache_bytes = 0;
  // --trace-config: the trace extension's global setting at start (server/trace.h).
  TraceOptions trace;
};

struct TensorMetadata {
  std::string name;
  DataType datatype;
  Shape shape;  // -1 for variable dimensions, including the batch dimension
};

struct ModelMetadata {
  std::string name;
  std::vector<std::string> versions;
  std::string platform;
  std::vector<TensorMetadata> inputs;
  std::vector<TensorMetadata> outputs;
};

struct ModelStatistics {
  std::string name;
  std::string version;
  metrics::ModelStatsSnapshot stats;
  int64_t memory_bytes = 0;  // the version's measured footprint (statistics' memory_usage)
  // Device memory the version holds, GPU id -> bytes (memory_usage's "GPU" entries).
  std::map<int, int64_t> gpu_memory_bytes;
};

class Server {
 public:
  // `registry` (optional) receives the per-model Prometheus metrics collector.
  Server(ServerOptions options, const backends::BackendRegistry* backends,
         metrics::MetricsRegistry* registry = nullptr);
  ~Server();

  // Loads the initial models for the control mode and starts the poller. With exit_on_error,
  // a model that fails to load fails Start.
  absl::Status Start();
  void Shutdown();
  // Poll mode: asks the poller for one pass over the repositories now (SIGHUP), without
  // waiting for it. False in the other control modes, and after Shutdown.
  bool PollNow();

  static constexpr std::string_view kVersion = "0.1.0";
  // The server metadata's extensions (Triton's names, in its order).
  std::vector<std::string> Extensions() const;
  // The server metadata's "name" (--id; "triton" by default, as tritonserver).
  const std::string& id() const { return options_.id; }

  bool IsLive() const;
  bool IsReady() const;
  bool IsModelReady(std::string_view name, int64_t version) const;

  // The resident model's metadata and configuration; never loads (tools, tests). Frontends
  // use the forms below, which load an on-demand model first.
  absl::StatusOr<ModelMetadata> GetModelMetadata(std::string_view name, int64_t version) const;
  absl::StatusOr<config::ModelConfig> GetModelConfig(std::string_view name,
                                                     int64_t version) const;
  // The same, with the model resolved as Infer resolves it (model_resolver.h: an on-demand or
  // evicted model loads first; readiness never loads). `done` is called exactly once: on this
  // thread when the model is resident or cannot load, else on the loader thread after its
  // load. The config pointer is valid during the call only.
  void GetModelMetadata(std::string_view name, int64_t version, const ResolveOptions& options,
                        std::function<void(absl::StatusOr<ModelMetadata>)> done);
  void GetModelConfig(std::string_view name, int64_t version, const ResolveOptions& options,
                      std::function<void(absl::StatusOr<const config::ModelConfig*>)> done);
  // Empty name: every ready model.
  absl::StatusOr<std::vector<ModelStatistics>> GetStatistics(std::string_view name,
                                                             int64_t version) const;

  // Takes ownership; `request->on_complete` is called exactly once, on some thread. The model
  // is resolved first (model_resolver.h): resident, it runs at once on this thread; a model that
  // must load (on demand, evicted, SageMaker's TargetModel in `options`) is loaded and the
  // request goes on from the loader thread, unless its client leaves, its `timeout` or deadline
  // passes, or --model-load-wait-secs passes first.
  void Infer(std::unique_ptr<core::InferRequest> request, const ResolveOptions& options = {});

  std::vector<repository::IndexEntry> RepositoryIndex(bool ready_only) const;
  // Run on the loader pool; `done` is called there. Explicit mode only.
  // `files`: the "file:<path>" parameters (path -> content), a model folder that replaces the
  // repository's; they need `config_json` (repository::ModelLifecycle::Load).
  void LoadModel(std::string name, std::optional<std::string> config_json,
                 std::function<void(absl::Status)> done,
                 std::map<std::string, std::string> files = {});
  // `unload_dependents`: also the models an ensemble runs that were loaded only for it.
  void UnloadModel(std::string name, std::function<void(absl::Status)> done,
                   bool unload_dependents = false);
  // Synchronous, in any control mode: for the SageMaker multi-model API, which runs them on
  // a loader thread. `url`: a model folder, an archive, or an s3:// object. The model is
  // evictable under the memory budget and loads again on its next request.
  absl::Status LoadModelFromUrl(const std::string& name, const std::string& url);
  // Unloads `name` and forgets where it came from. Waits for the requests in flight.
  absl::Status ForgetModel(const std::string& name);
  // Models loaded by LoadModelFromUrl, with their URLs.
  std::map<std::string, std::string> UrlModels() const;
  // Runs `task` on the store's loader pool; false when its queue is full.
  bool SubmitLoad(std::function<void()> task);
  // The model-name rules (no path parts, valid UTF-8), for frontends that take names.
  static absl::Status ValidateModelName(std::string_view name);
  // The system and CUDA shared-memory regions clients registered (the shared-memory
  // extensions), in one name space as Triton's.
  SharedMemoryManager& shared_memory() { return shared_memory_; }
  // Null when no response cache is configured.
  const ResponseCache* response_cache() const { return response_cache_.get(); }
  // The trace extension's settings (GET/POST /v2[/models/<m>]/trace/setting, TraceSetting).
  TraceManager& trace() { return *trace_; }

 private:
  // Whether a load or unload of `name` may go ahead: a valid name, and a control mode that
  // allows the repository API to load and unload.
  absl::Status CheckRepositoryControl(std::string_view name) const;
  // A load's name, files and their need of a config (LoadModel's checks before it queues).
  absl::Status CheckLoadRequest(std::string_view name, const std::optional<std::string>& config_json,
                                const std::map<std::string, std::string>& files) const;
  // The load itself, on the caller's thread.
  absl::Status LoadModelNow(const std::string& name, const std::optional<std::string>& config_json,
                            const std::map<std::string, std::string>& files);
  void PollLoop();
  // Runs `request` on its resolved model: decoupled set-up, shared memory, validation,
  // tracing, classification, the response cache, then the model's scheduler.
  void InferOn(const repository::Model& model, std::unique_ptr<core::InferRequest> request);
  ModelMetadata MetadataOf(const repository::Model& model, std::string_view name,
                           int64_t version) const;
  // Answers `request` from the response cache (false: done, `request` is consumed) or arranges
  // for its response to be cached (true: the caller enqueues it).
  bool ServeFromCache(const repository::Model& model, std::unique_ptr<core::InferRequest>& request);
  void CollectMetrics(metrics::PrometheusWriter& w) const;

  const ServerOptions options_;
  // Whether a model's backend streams decoupled responses (Backend::SupportsDecoupled).
  const backends::BackendRegistry* backends_ = nullptr;
  SharedMemoryManager shared_memory_;
  // Before lifecycle_: the models' instances hold it until they are gone.
  std::unique_ptr<metrics::CustomMetrics> custom_metrics_;
  std::unique_ptr<ResponseCache> response_cache_;
  std::unique_ptr<TraceManager> trace_;
  std::unique_ptr<repository::ModelLifecycle> lifecycle_;
  std::unique_ptr<ModelResolver<repository::ModelLifecycle>> resolver_;
  std::unique_ptr<WorkerPool> loader_;
  std::thread poller_;
  inferd::Mutex mu_;
  inferd::CondVar stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool poll_now_ ABSL_GUARDED_BY(mu_) = false;  // PollNow asked for a pass before the interval
  std::atomic<bool> live_{false};
};

}  // namespace inferd::server
