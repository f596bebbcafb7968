// One loaded version of a model: its completed configuration, its instances behind a
// scheduler, and its statistics. Held through std::shared_ptr<const Model>; the registry drops
// its reference on unload and the destructor drains what is in flight.
#pragma once

#include <atomic>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "config/model_config_util.h"
#include "metrics/model_stats.h"
#include "repository/placement.h"
#include "scheduling/scheduler.h"

namespace inferd::repository {

// The store's key of a model in a namespace (--model-namespacing): "<namespace>::<name>", or
// the name alone when `ns` is empty. An ensemble step with model_namespace dispatches to it.
std::string NamespacedName(std::string_view ns, std::string_view name);

struct LoadOptions {
  int cpu_cores = 1;
  // --strict-model-config-parameters (backends::ModelSpec::strict_parameters).
  bool strict_parameters = false;
  size_t max_queue_size = 4096;
  // --metrics-config: which latency histograms and summaries each model records.
  metrics::LatencyMetricsConfig latency_metrics;
  // Where an ensemble sends its steps' requests (the server's inference entry point).
  std::function<void(std::unique_ptr<core::InferRequest>)> dispatch;
  // The device layer an ensemble copies its GPU outputs to the host with (the server's
  // ServerOptions::gpus); null: no GPU, so no output is ever on one.
  gpu::Runtime* gpus = nullptr;
  // Whether a model is ready (the server's readiness), for backends that ask (Python's
  // is_model_ready).
  std::function<bool(const std::string& name, int64_t version)> is_model_ready;
  // The server's custom metrics (backends::ModelSpec::custom_metrics); null: none.
  metrics::CustomMetrics* custom_metrics = nullptr;
  // The server's synchronous load and unload (backends::ModelSpec::load_model / unload_model).
  std::function<absl::Status(const std::string& name, const std::optional<std::string>& config,
                             const std::map<std::string, std::string>& files)>
      load_model;
  std::function<absl::Status(const std::string& name, bool unload_dependents)> unload_model;
  // --model-namespacing: the repository the model was loaded from (its metrics' "namespace"
  // label, as Triton's); empty without namespacing.
  std::string model_namespace;
  // Where instances run: the devices, --min-supported-compute-capability,
  // --gpu-fallback-to-cpu (repository/placement.h).
  PlacementOptions placement;
};

// Runs every model_warmup sample on `instance` (count times each). Fails with the reason.
absl::Status RunWarmup(const config::ModelConfig& config, const std::string& model_dir,
                       backends::ModelInstance* instance, size_t index);

class Model {
 public:
  // Creates every instance of every instance group and starts the scheduler. An ensemble
  // (`backend` null) gets the ensemble scheduler instead; the repository has checked its steps.
  static absl::StatusOr<std::shared_ptr<Model>> Load(const config::ModelConfig& config,
                                                     const std::string& model_dir,
                                                     int64_t version, backends::Backend* backend,
                                                     const LoadOptions& options);
  // Completes everything queued, then frees the instances; a model that finished loading logs
  // "successfully unloaded '<name>' version <v> in <s> s, freed <bytes> bytes" (Triton's
  // wording), whichever route dropped its last reference (unload, eviction, poll, reload,
  // SageMaker, shutdown).
  ~Model();

  const config::ModelConfig& config() const { return config_; }
  int64_t version() const { return version_; }
  double load_seconds() const { return load_seconds_; }
  // Each instance's name and device, in creation order (empty for an ensemble).
  const std::vector<backends::InstanceDevice>& instance_devices() const { return devices_; }
  const std::string& model_namespace() const { return model_namespace_; }
  // The memory the repository accounts to this version (its footprint), for the unload line.
  void set_footprint_bytes(int64_t bytes) { footprint_bytes_.store(bytes, std::memory_order_relaxed); }
  // Device memory this version holds, by GPU id (statistics' memory_usage "GPU" entries, the
  // load line); empty for a model with no GPU instance. Set by the store before the model is
  // published, read-only after.
  const std::map<int, int64_t>& gpu_memory_bytes() const { return gpu_memory_bytes_; }
  void set_gpu_memory_bytes(std::map<int, int64_t> bytes) { gpu_memory_bytes_ = std::move(bytes); }
  // What the GPU instances' backends report holding (ModelInstance::DeviceMemoryBytes), by GPU
  // id, for the GPUs on which every instance reported; a GPU with any instance that does not
  // know is left out (the store measures it).
  std::map<int, int64_t> ReportedGpuMemoryBytes() const;
  metrics::ModelStats& stats() const { return *stats_; }
  // The GPU every instance takes inputs on (ModelInstance::GpuInputsOn): the server leaves an
  // input in a CUDA shared-memory region or an ensemble step's GPU output there; nullopt when
  // any instance reads host bytes only, or they differ (an ensemble: its steps decide).
  std::optional<int> gpu_inputs_on() const { return gpu_inputs_on_; }
  // Whether an instance may answer with an output on a GPU (ModelInstance::OutputsMayBeOnGpu):
  // the server then makes outputs host-readable for consumers that read host bytes.
  bool outputs_may_be_on_gpu() const { return outputs_may_be_on_gpu_; }
  // Thread-safe; takes ownership (see Scheduler::Enqueue).
  void Enqueue(std::unique_ptr<core::InferRequest> request) const;
  size_t InFlight() const { return scheduler_->InFlight(); }
  // False while an instance cannot run (ModelInstance::Ready: a Python process restarting).
  bool InstancesReady() const;
  // Requests waiting for an instance (nv_inference_pending_request_count).
  size_t Queued() const { return scheduler_->Queued(); }
  // Labels of each output that names a label_filename (classification extension). Shared so
  // a completion callback can hold them without holding the model.
  using LabelMap = std::map<std::string, std::vector<std::string>>;
  std::shared_ptr<const LabelMap> labels() const { return labels_; }

 private:
  Model() = default;
  config::ModelConfig config_;
  // sequence_batching: config_ plus the control and state tensors, as the backend sees it.
  config::ModelConfig backend_config_;
  int64_t version_ = 0;
  double load_seconds_ = 0;
  bool loaded_ = false;  // Load completed: the destructor logs the unload
  std::atomic<int64_t> footprint_bytes_{0};
  std::string model_namespace_;
  std::unique_ptr<metrics::ModelStats> stats_;
  std::shared_ptr<const LabelMap> labels_;
  std::unique_ptr<scheduling::Scheduler> scheduler_;
  // The instances (owned by scheduler_), for InstancesReady.
  std::vector<const backends::ModelInstance*> instances_;
  std::vector<backends::InstanceDevice> devices_;  // per instance, as placed
  std::map<int, int64_t> gpu_memory_bytes_;
  std::optional<int> gpu_inputs_on_;   // set by Load, read-only after
  bool outputs_may_be_on_gpu_ = false;  // set by Load, read-only after
};

}  // namespace inferd::repository
