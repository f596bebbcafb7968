// The interface every backend implements, and the registry `app` fills at start-up. Schedulers
// and the repository see only this header; each backend lives in its own library so ML runtime
// headers never leak into the rest of the build.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "config/model_config_util.h"
#include "core/infer_request.h"
#include "core/response_sender.h"
#include "metrics/custom_metrics.h"

namespace inferd::backends {

// What a backend gets to create the instances of one model version. The config is normalized
// and complete; the pointers stay valid for the lifetime of the instances.
struct ModelSpec {
  const config::ModelConfig* config = nullptr;
  std::string model_dir;    // <repository>/<model>
  std::string version_dir;  // <repository>/<model>/<version>
  int64_t version = 0;
  std::string model_path;   // <version_dir>/<default_model_filename>
  int total_instances = 1;  // instances over every group, for the thread budget
  int cpu_cores = 1;
  // --strict-model-config-parameters: CheckConfigSupport refuses a `parameters` key the backend
  // does not read, instead of logging a WARNING naming it.
  bool strict_parameters = false;
  // The server's inference entry point, for backends whose models call other models (the
  // Python backend's BLS); null where the server offers none. Completes the request itself.
  std::function<void(std::unique_ptr<core::InferRequest>)> dispatch;
  // Whether a model (version -1: any) is ready, for pb_utils.is_model_ready; may be null.
  std::function<bool(const std::string& name, int64_t version)> is_model_ready;
  // Where a model's own metrics go (the Python backend's pb_utils.MetricFamily), shown on
  // GET /metrics; null where the server keeps none.
  metrics::CustomMetrics* custom_metrics = nullptr;
  // Loads (or reloads, with a config and files as the repository API's load takes them) and
  // unloads a model, synchronously on the caller's thread, for pb_utils.load_model /
  // unload_model; null where the server offers none. The server's control-mode rules apply.
  std::function<absl::Status(const std::string& name, const std::optional<std::string>& config,
                             const std::map<std::string, std::string>& files)>
      load_model;
  std::function<absl::Status(const std::string& name, bool unload_dependents)> unload_model;
};

// Where one instance runs. Triton's instance name is "<group name>_<n>" (n counts the
// group's instances per device, so a group on two GPUs has two "<group>_0"), and its device id
// is 0 on the CPU.
struct InstanceDevice {
  bool gpu = false;
  int id = 0;
  std::string name;  // "<group name>_<n>"
};

// Timestamps a backend reports from inside Execute (monotonic ns).
struct ExecutionTimes {
  uint64_t input_end_ns = 0;     // inputs handed to the runtime
  uint64_t output_start_ns = 0;  // runtime finished; outputs being collected
};

// ModelInstance::GpuInputsOn's answer for an instance that reads inputs on any GPU.
inline constexpr int kAnyGpu = -1;

// One execution context of a model (a session, a module copy). Execute is called by one
// thread at a time; different instances run concurrently.
class ModelInstance {
 public:
  virtual ~ModelInstance() = default;

  // Runs `requests` as one batch. Every request has already been validated against the
  // config. Fills `responses[i]->outputs` (only the requested outputs, all when none were
  // named) or sets `responses[i]->status`. Never throws.
  virtual void Execute(std::span<core::InferRequest* const> requests,
                       std::span<core::InferResponse* const> responses,
                       ExecutionTimes* times) = 0;

  // Compute threads this instance uses (for the thread-budget log line).
  virtual int ThreadCount() const { return 1; }

  // Asks the Execute running on this instance to stop early: every request of its batch was
  // cancelled by its client. Called from another thread; the scheduler calls it only while
  // Execute runs on this instance (a call between runs must change nothing: no pending flag).
  // Execute then returns as soon as it can, with any status (the scheduler answers the
  // requests CANCELLED). The default runs to the end. Thread-safe.
  virtual void CancelExecution() {}

  // False while the instance cannot run requests (the Python backend's process died and is
  // being restarted); the model reports not ready meanwhile. Thread-safe.
  virtual bool Ready() const { return true; }

  // True when Execute may run on any thread (still one run at a time): the instance keeps
  // no thread-bound state (a GPU's current device, a thread-local runtime, a process it
  // talks to). The default scheduler may then run a model whose runs take microseconds on
  // the thread that submits the request, saving two thread hand-offs
  // (InstancePool::SubmitAny). The default: only the instance's own thread runs it.
  virtual bool RunsOnAnyThread() const { return false; }

  // The device memory this instance holds on its GPU, when the backend knows it (Triton's
  // backends report their allocations with TRITONBACKEND_ModelInstanceReportMemoryUsage); -1
  // when it does not, and the model store measures the device's memory around the instance's
  // creation instead. Asked once, after the model's instances are created. Thread-safe.
  virtual int64_t DeviceMemoryBytes() const { return -1; }

  // The GPU whose memory Execute reads inputs from as they are (InputTensor::place GPU n: a
  // CUDA shared-memory region, an ensemble step's GPU output), as well as host inputs; nullopt,
  // the default, for an instance that reads host bytes only. When every instance of a model
  // answers the same GPU, the server leaves such inputs on it; otherwise it copies them to the
  // host first (backends/tensor_places.h). Never BYTES. kAnyGpu: inputs on whichever GPU they
  // are (the Python backend, which hands model.py CUDA tensors where they lie). Asked once,
  // after creation.
  virtual std::optional<int> GpuInputsOn() const { return std::nullopt; }

  // Any instance may leave an output on a GPU (OutputTensor::place GPU n, bytes complete by the
  // time Execute returns) for a request whose consumer reads GPU bytes
  // (InferRequest::gpu_outputs_ok). True here when it may do so for other requests too; the
  // server then copies such outputs to the host for every consumer that reads host bytes
  // (backends/tensor_places.h). False, the default: other requests get host outputs. Asked
  // once, after creation.
  virtual bool OutputsMayBeOnGpu() const { return false; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Triton's auto-complete: fills inputs, outputs and max_batch_size the config leaves out,
  // from the model file at `model_path`.
  virtual absl::Status AutoCompleteConfig(const std::string& model_path,
                                          config::ModelConfig* config) {
    return absl::OkStatus();
  }
  // True for a backend whose code, not the model's folder, holds what auto-complete reads (a
  // Python-based backend's model.py): AutoCompleteConfig runs though `model_path` is absent.
  virtual bool AutoCompletesWithoutModelFile() const { return false; }

  // tritonserver's --backend-config settings for this backend: its own
  // (`--backend-config=<name>,<key>=<value>`) over the global ones (`--backend-config=<key>=<value>`).
  // Called once at start-up, before any model loads. Returns the keys it does not read, which the
  // caller reports as having no effect; fails on a value it cannot use.
  virtual absl::StatusOr<std::vector<std::string>> Configure(
      const std::map<std::string, std::string>& settings);

  // True when an instance opens the model file in the version folder (ModelSpec::model_path):
  // the repository then refuses a version without it, naming the file. False for a backend that
  // computes without one (identity, repeat).
  virtual bool ReadsModelFile() const { return true; }

  // True when Execute takes a batch whose requests' tensors differ in shape on inputs marked
  // `allow_ragged_batch` (each request's tensor used as it is, never concatenated).
  virtual bool SupportsRaggedBatch() const { return false; }

  // True when the backend answers models with `model_transaction_policy { decoupled: true }`
  // through `InferRequest::response_sender` (core/response_sender.h): 0..N responses per
  // request and the final flag, from any thread, during or after Execute. A backend that
  // returns false answers such a model once per request, through `responses[i]`.
  virtual bool SupportsDecoupled() const { return false; }

  // True when CreateInstance may run for several instances of a model at once (each on its
  // own thread), as the Python backend's instances start their processes in parallel.
  virtual bool CreatesInstancesConcurrently() const { return false; }

  // Creates instance `index` (0-based over all groups) of group `group`.
  virtual absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) = 0;

  // OK when the backend can run an instance on a GPU (CreateInstanceOn with a GPU device), else
  // why not (FAILED_PRECONDITION; the default: "backend '<name>' runs only on the CPU"). The
  // repository places KIND_AUTO groups on the CPU for a backend that cannot, and refuses
  // KIND_GPU for it with this reason (or, with --gpu-fallback-to-cpu, runs them on the CPU).
  virtual absl::Status GpuInstanceSupport() const;

  // Creates the instance on `device` (repository/placement.h decided it, as Triton's
  // TRITONBACKEND_ModelInstanceKind / DeviceId). The default runs CPU instances through
  // CreateInstance and refuses a GPU one; a backend with SupportsGpuInstances() overrides it.
  virtual absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstanceOn(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const InstanceDevice& device);
};

// A `parameters` key Triton's backend reads that has no effect here (a GPU setting on a server
// without one), and what it would have done.
struct UnappliedParameter {
  std::string_view key;
  std::string_view effect;  // "it would ...; <why not here>"
};

// What of a model configuration a backend implements itself, beyond the fields every backend
// gets from the server (config/supported_fields.h): the `parameters` keys it reads and whether
// it applies `reshape`. Each backend declares its own beside its code and calls
// CheckConfigSupport first thing in CreateInstance.
struct ConfigSupport {
  std::span<const std::string_view> parameters;  // a key ending in '*' names a prefix
  std::span<const UnappliedParameter> unapplied;  // known keys without effect: a WARNING each
  bool backend_checks_parameters = false;        // it reads or refuses every key itself
  bool input_reshape = false;
  bool output_reshape = false;
};

// The rule (issue 26): never refuse what Triton accepts unless serving it would compute a wrong
// answer. Triton's backends ignore `parameters` keys they do not read, so a key the backend
// neither reads nor lists as unapplied loads with one WARNING naming it (for instance `index`
// 0 only, so once per model version), unless spec.strict_parameters: then INVALID_ARGUMENT
// "model '<m>': config.pbtxt field 'parameters' key '<k>' is not supported by inferd's
// <backend> backend (...)". An unapplied key always loads with its WARNING. A `reshape` the
// backend does not apply is refused (the tensor would reach the model in the wrong shape).
absl::Status CheckConfigSupport(const ModelSpec& spec, std::string_view backend,
                                const ConfigSupport& support, int index);

// Backends by name ("onnxruntime", "identity"). Filled once at start-up, then read-only.
class BackendRegistry {
 public:
  void Register(std::unique_ptr<Backend> backend);
  Backend* Find(std::string_view name) const;
  std::vector<Backend*> All() const;

 private:
  absl::flat_hash_map<std::string, std::unique_ptr<Backend>> backends_;
};

// True when `name` should be returned for `request` (no outputs named means all).
bool IsOutputRequested(const core::InferRequest& request, std::string_view name);

// The shape the backend runs with for a request input: `reshape` applied (keeping the batch
// dimension when the model batches).
Shape BackendInputShape(const inference::ModelInput& input, const Shape& request_shape,
                        bool batching);

// The error fan-out of a batch that failed as a whole: every response gets `status` and loses
// any outputs already written.
void FailBatch(std::span<core::InferResponse* const> responses, const absl::Status& status);

// Runs `run` (an instance's work on a batch) so that no exception leaves the backend: one that
// escapes fails the whole batch (FailBatch), std::bad_alloc as RESOURCE_EXHAUSTED
// "<who>: out of memory", any other std::exception as INTERNAL "<who>: <what()>".
void FailBatchOnException(std::string_view who, std::span<core::InferResponse* const> responses,
                          absl::FunctionRef<void()> run);

// Walks a BYTES buffer (4-byte little-endian length + bytes per element), calling
// fn(string_view) for each element. Fails when the buffer is not well formed.
absl::Status ForEachBytesElement(std::string_view buffer,
                                 const std::function<void(std::string_view)>& fn);

}  // namespace inferd::backends
