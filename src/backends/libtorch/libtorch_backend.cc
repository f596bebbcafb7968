#include "backends/libtorch/libtorch_backend.h"

#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>
#include <torch/library.h>
#include <torch/script.h>
#include <torch/version.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

// A module built against a CUDA LibTorch (tests/gpu/check.sh defines INFERD_TORCH_CUDA) gives
// a GPU model's memory back to the driver when the model unloads; everything else here is
// device-generic. Debian's CPU LibTorch ships these headers but no libc10_cuda to link.
#if defined(INFERD_TORCH_CUDA) && __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define INFERD_EMPTY_CUDA_CACHE 1
#endif

#include <algorithm>
#include <optional>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "backends/batch_io.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/strings.h"

namespace inferd::backends {
namespace {

// ---- Stopping a running forward() between operators (ModelInstance::CancelExecution) ----
//
// LibTorch has no terminate flag like ONNX Runtime's RunOptions, and an exception thrown by a
// RecordFunction callback is caught and logged by LibTorch (tryRunCallback), so a callback
// cannot stop a run by itself. Two pieces do: a thread-local RecordFunction callback, run
// before each operator on the instance's thread, that once the run is cancelled puts a
// dispatch key in the thread's included set; and a fallback kernel for that key, which every
// later operator on the thread then reaches first, and which throws. The key is
// TESTING_ONLY_GenericMode, which no kernel of LibTorch's uses (it exists for tests of the
// dispatcher). While nothing is cancelled the cost is the callback: one thread-local load per
// sampled operator (bench/cancellation.sh measures it).
constexpr c10::DispatchKey kStopKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
thread_local const std::atomic<bool>* t_stop = nullptr;  // the running Execute's flag
constexpr double kStopCheckEvery = 100;  // operators, on average

std::unique_ptr<at::ObserverContext> StopCheck(const at::RecordFunction&) {
  const std::atomic<bool>* stop = t_stop;
  if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
    c10::impl::tls_set_dispatch_key_included(kStopKey, true);
  }
  return nullptr;
}

void StopFallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  throw std::runtime_error("the run was cancelled (every request of the batch was) before " +
                           op.schema().name());
}

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&StopFallback>());
}

// INFERD_PYTORCH_STOP_CHECK=0 leaves the callback out (runs are then not stoppable): for
// bench/cancellation.sh, which measures what the callback costs.
bool StopCheckEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("INFERD_PYTORCH_STOP_CHECK");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return enabled;
}

// Scoped to one forward() on the calling thread: `stop` becomes what StopCheck watches.
class StopScope {
 public:
  explicit StopScope(const std::atomic<bool>* stop) {
    if (!StopCheckEnabled()) return;
    thread_local bool registered = false;
    if (!registered) {
      // Once per thread, for the thread's life: without a run it only loads t_stop (null).
      // Sampled: LibTorch runs it before about one operator in kStopCheckEvery (a thread-local
      // countdown decides; the operators in between take the dispatcher's fast path), so a
      // cancelled run goes on for ~kStopCheckEvery more operators, and a run of tiny
      // operators pays ~1/kStopCheckEvery of the callback's cost (bench/cancellation.sh).
      at::addThreadLocalCallback(at::RecordFunctionCallback(&StopCheck)
                                     .needsInputs(false)
                                     .needsOutputs(false)
                                     .needsIds(false)
                                     .samplingProb(1.0 / kStopCheckEvery));
      registered = true;
    }
    t_stop = stop;
  }
  ~StopScope() {
    t_stop = nullptr;
    c10::impl::tls_set_dispatch_key_included(kStopKey, false);
  }
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;
};

std::optional<c10::ScalarType> ToTorch(DataType t) {
  switch (t) {
    case DataType::kBool: return torch::kBool;
    case DataType::kUint8: return torch::kByte;
    case DataType::kInt8: return torch::kChar;
    case DataType::kInt16: return torch::kShort;
    case DataType::kInt32: return torch::kInt;
    case DataType::kInt64: return torch::kLong;
    case DataType::kFp16: return torch::kHalf;
    case DataType::kBf16: return torch::kBFloat16;
    case DataType::kFp32: return torch::kFloat;
    case DataType::kFp64: return torch::kDouble;
    default: return std::nullopt;
  }
}

DataType FromTorch(c10::ScalarType t) {
  switch (t) {
    case torch::kBool: return DataType::kBool;
    case torch::kByte: return DataType::kUint8;
    case torch::kChar: return DataType::kInt8;
    case torch::kShort: return DataType::kInt16;
    case torch::kInt: return DataType::kInt32;
    case torch::kLong: return DataType::kInt64;
    case torch::kHalf: return DataType::kFp16;
    case torch::kBFloat16: return DataType::kBf16;
    case torch::kFloat: return DataType::kFp32;
    case torch::kDouble: return DataType::kFp64;
    default: return DataType::kInvalid;
  }
}

// Whether this LibTorch can run instances on CUDA, asked once. Only device-generic c10 calls:
// the same source builds against Debian's CPU LibTorch (CI) and a CUDA LibTorch (the GPU
// machine, tests/gpu/check.sh), and the answer comes from the LibTorch it runs with.
absl::Status TorchCudaSupport() {
  static const absl::Status* const status = [] {
    const std::string prefix = StrCat("backend 'pytorch' cannot run on a GPU: LibTorch ",
                                      TORCH_VERSION);
    try {
      // A CUDA LibTorch registers CUDA's device guard when libtorch_cuda loads; a CPU build
      // has none (torch::cuda::is_available() is false there too, without saying why).
      if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
        return new absl::Status(absl::FailedPreconditionError(StrCat(
            prefix, " is a CPU build (torch::cuda::is_available() is false: no CUDA support "
                    "is linked; tests/gpu/check.sh builds this module against a CUDA LibTorch)")));
      }
      if (!torch::cuda::is_available()) {
        return new absl::Status(absl::FailedPreconditionError(StrCat(
            prefix, " has CUDA but finds no GPU (torch::cuda::is_available() is false: no "
                    "device, or no driver)")));
      }
    } catch (const std::exception& e) {
      return new absl::Status(
          absl::FailedPreconditionError(StrCat(prefix, " cannot ask CUDA for GPUs: ", e.what())));
    }
    return new absl::Status();
  }();
  return *status;
}

// Pinned host memory from LibTorch's caching host allocator (a CUDA LibTorch's), for the
// batch buffers a GPU instance copies to its device: a byte tensor keeps the block, which
// goes back to LibTorch's cache when the buffer drops it. A null block when it cannot.
BatchBuffer::Block PinnedBlock(size_t bytes) {
  try {
    auto tensor = std::make_shared<torch::Tensor>(
        torch::empty({static_cast<int64_t>(bytes)},
                     torch::TensorOptions().dtype(torch::kByte).pinned_memory(true)));
    return {static_cast<char*>(tensor->data_ptr()), tensor};
  } catch (const std::exception& e) {
    LOG_ERROR << "pytorch: cannot allocate " << bytes << " bytes of pinned host memory: " << e.what();
    return {};
  }
}

// "INPUT__3" -> 3; -1 when the name does not follow the convention.
int IndexSuffix(const std::string& name) {
  const size_t pos = name.rfind("__");
  if (pos == std::string::npos || pos + 2 >= name.size()) return -1;
  int v = 0;
  for (size_t i = pos + 2; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// Triton's ParseBoolValue: true/on/1 and false/off/0, any case; anything else is an error.
absl::StatusOr<std::optional<bool>> BoolParam(const config::ModelConfig& c, const char* key) {
  auto v = config::GetParameter(c, key);
  if (!v) return std::optional<bool>();
  if (std::optional<bool> b = config::ParseTritonBool(*v)) return b;
  return absl::InvalidArgumentError(StrCat("model '", c.name(), "': parameter '", key,
                                           "' must be true/false, on/off or 1/0, got '", *v, "'"));
}

absl::StatusOr<std::optional<int>> IntParam(const config::ModelConfig& c, const char* key) {
  auto v = config::GetParameter(c, key);
  if (!v) return std::optional<int>();
  int parsed;
  if (!absl::SimpleAtoi(*v, &parsed)) {
    return absl::InvalidArgumentError(StrCat("model '", c.name(), "': parameter '", key,
                                             "' must be an integer, got '", *v, "'"));
  }
  return std::optional<int>(parsed);
}

// A model's LibTorch settings, read once at load. LibTorch keeps them in globals (thread counts
// per OpenMP thread, the JIT switches per process), so, as Triton's backend does, each
// instance applies its model's values around every forward() instead of once at load, where
// the last model loaded would set them for every model.
struct TorchSettings {
  int intra_op_threads = 1;               // INTRA_OP_THREAD_COUNT (default: the CPU budget)
  std::optional<int> inter_op_threads;    // INTER_OP_THREAD_COUNT (process-wide, first wins)
  bool optimized_execution = true;        // !DISABLE_OPTIMIZED_EXECUTION
  bool inference_mode = true;             // INFERENCE_MODE
  std::optional<bool> jit_executor;       // ENABLE_JIT_EXECUTOR: left alone unless set
  std::optional<bool> jit_profiling;      // ENABLE_JIT_PROFILING: left alone unless set
  std::optional<bool> tensor_fuser;       // ENABLE_TENSOR_FUSER: left alone unless set
  bool weight_sharing = false;            // ENABLE_WEIGHT_SHARING
};

absl::StatusOr<TorchSettings> ReadSettings(const config::ModelConfig& c, int default_threads) {
  TorchSettings s;
  auto intra = IntParam(c, "INTRA_OP_THREAD_COUNT");
  if (!intra.ok()) return intra.status();
  s.intra_op_threads = intra->value_or(0) > 0 ? **intra : default_threads;
  auto inter = IntParam(c, "INTER_OP_THREAD_COUNT");
  if (!inter.ok()) return inter.status();
  if (inter->value_or(0) > 0) s.inter_op_threads = **inter;
  struct {
    const char* key;
    std::optional<bool>* out;
  } optional_bools[] = {{"ENABLE_JIT_EXECUTOR", &s.jit_executor},
                        {"ENABLE_JIT_PROFILING", &s.jit_profiling},
                        {"ENABLE_TENSOR_FUSER", &s.tensor_fuser}};
  for (const auto& b : optional_bools) {
    auto v = BoolParam(c, b.key);
    if (!v.ok()) return v.status();
    *b.out = *v;
  }
  struct {
    const char* key;
    bool* out;
    bool negate;
  } bools[] = {{"DISABLE_OPTIMIZED_EXECUTION", &s.optimized_execution, true},
               {"INFERENCE_MODE", &s.inference_mode, false},
               {"ENABLE_WEIGHT_SHARING", &s.weight_sharing, false},
               {"ENABLE_CACHE_CLEANING", nullptr, false},
               {"DISABLE_CUDNN", nullptr, false}};
  for (const auto& b : bools) {
    auto v = BoolParam(c, b.key);
    if (!v.ok()) return v.status();
    if (*v && b.out != nullptr) *b.out = b.negate ? !**v : **v;
  }
  return s;
}

std::string DescribeSettings(const TorchSettings& s) {
  auto opt = [](const std::optional<bool>& v) { return v ? (*v ? "1" : "0") : "unchanged"; };
  return StrCat("INTRA_OP_THREAD_COUNT=", s.intra_op_threads, " INTER_OP_THREAD_COUNT=",
                s.inter_op_threads ? std::to_string(*s.inter_op_threads) : "default",
                " DISABLE_OPTIMIZED_EXECUTION=", !s.optimized_execution,
                " INFERENCE_MODE=", s.inference_mode, " ENABLE_JIT_EXECUTOR=", opt(s.jit_executor),
                " ENABLE_JIT_PROFILING=", opt(s.jit_profiling),
                " ENABLE_TENSOR_FUSER=", opt(s.tensor_fuser),
                " ENABLE_WEIGHT_SHARING=", s.weight_sharing);
}

// The process-wide JIT switches a model sets explicitly, written only when they change. The
// fuser switch is a plain bool inside LibTorch: the writes are serialized here.
void ApplyJitSwitches(const TorchSettings& s) {
  if (s.jit_profiling && torch::jit::getProfilingMode().load() != *s.jit_profiling) {
    torch::jit::getProfilingMode() = *s.jit_profiling;
  }
  if (s.jit_executor && torch::jit::getExecutorMode().load() != *s.jit_executor) {
    torch::jit::getExecutorMode() = *s.jit_executor;
  }
  if (s.tensor_fuser) {
    static inferd::Mutex mu;
    inferd::MutexLock lock(&mu);
    if (torch::jit::tensorExprFuserEnabled() != *s.tensor_fuser) {
      torch::jit::setTensorExprFuserEnabled(*s.tensor_fuser);
    }
  }
}

// How a request's tensors become forward() arguments.
struct InputPlan {
  bool dict_input = false;                 // forward(Dict[str, Tensor])
  std::vector<std::string> ordered_names;  // config input names in argument order
};

struct OutputPlan {
  std::vector<std::string> names;  // config output names
  std::vector<int> index;          // position in a tuple/list output (-1: by dict key or single)
};

// One loaded module, on its instances' device; instances of a model with ENABLE_WEIGHT_SHARING
// on the same device share it and run forward() on it concurrently (TorchScript methods are
// reentrant), as Triton's do.
struct SharedModule {
  torch::jit::Module module;
  torch::Device device{torch::kCPU};

  // A GPU module's parameters go back to LibTorch's caching allocator when it is released;
  // emptying the cache then returns them (and any other block no tensor uses) to the driver,
  // so unloading a model frees its GPU memory as nvidia-smi sees it, as Triton's
  // ENABLE_CACHE_CLEANING does after each run.
  ~SharedModule() {
    if (!device.is_cuda()) return;
    module = torch::jit::Module();
#ifdef INFERD_EMPTY_CUDA_CACHE
    try {
      c10::cuda::CUDACachingAllocator::emptyCache();
    } catch (const std::exception& e) {
      LOG_ERROR << "pytorch: emptying LibTorch's CUDA cache failed: " << e.what();
    }
#endif
  }
};

class TorchInstance : public ModelInstance {
 public:
  // `stream`: set for an instance on a GPU (`device`), a stream of that device from
  // LibTorch's pool that every copy and kernel of this instance's batches runs on.
  TorchInstance(const config::ModelConfig* config, std::shared_ptr<SharedModule> module,
                InputPlan inputs, OutputPlan outputs, TorchSettings settings,
                torch::Device device, std::optional<c10::Stream> stream)
      : config_(config), module_(std::move(module)), inputs_(std::move(inputs)),
        outputs_(std::move(outputs)), settings_(std::move(settings)), device_(device),
        stream_(stream) {}

  int ThreadCount() const override { return settings_.intra_op_threads; }

  // Takes effect only while an Execute runs (a call between runs changes nothing): the run
  // throws at its next operator, and Execute answers with that error.
  void CancelExecution() override {
    inferd::MutexLock lock(&stop_mu_);
    if (running_) stop_.store(true, std::memory_order_relaxed);
  }

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    absl::Status status;
    try {
      // This model's settings, on this instance's thread, for this execution only. The
      // OpenMP thread count is per calling thread, the optimizer switch thread-local.
      if (at::get_num_threads() != settings_.intra_op_threads) {
        at::set_num_threads(settings_.intra_op_threads);
      }
      torch::jit::GraphOptimizerEnabledGuard optimize(settings_.optimized_execution);
      ApplyJitSwitches(settings_);
      {
        inferd::MutexLock lock(&stop_mu_);
        running_ = true;
        stop_.store(false, std::memory_order_relaxed);
      }
      struct Done {
        TorchInstance* self;
        ~Done() {
          inferd::MutexLock lock(&self->stop_mu_);
          self->running_ = false;
          self->stop_.store(false, std::memory_order_relaxed);
        }
      } done{this};
      // A GPU instance's batch runs on its stream (and device): the input copies, forward()'s
      // kernels and the output copies, in order; Run synchronizes the stream before it
      // responds, and SyncStream again on the way out, so an error part-way leaves nothing
      // in flight that reads the pinned buffers the next batch reuses.
      std::optional<c10::StreamGuard> on_stream;
      if (stream_) on_stream.emplace(*stream_);
      struct Synced {
        TorchInstance* self;
        ~Synced() { self->SyncStream(); }
      } synced{this};
      status = Run(requests, responses, times);
    } catch (const c10::Error& e) {
      status = absl::InternalError(StrCat("pytorch: forward() of model '", config_->name(),
                                          "' failed: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      status = absl::InternalError(StrCat("pytorch: forward() of model '", config_->name(),
                                          "' failed: ", e.what()));
    }
    if (!status.ok()) {
      FailBatch(responses, status);
    }
  }

 private:
  void SyncStream() noexcept {
    if (!stream_) return;
    try {
      stream_->synchronize();
    } catch (const std::exception& e) {
      LOG_ERROR << "pytorch: model '" << config_->name() << "': synchronizing " << device_.str()
                << " failed: " << e.what();
    }
  }

  // Maps the gathered batch to forward()'s arguments and its result back through the
  // responder: gathering, slicing and output filtering are batch_io.h's. On a GPU: the inputs
  // gathered into pinned buffers, each copied once per batch to the device (non-blocking, on
  // the instance's stream), forward() there, each output copied back into pinned host memory
  // (non-blocking), and one synchronization before the responses see the outputs.
  absl::Status Run(std::span<core::InferRequest* const> requests,
                   std::span<core::InferResponse* const> responses, ExecutionTimes* times) {
    const bool batching = config_->max_batch_size() > 0;
    const bool gpu = device_.is_cuda();
    const MemoryPlacement destination =
        gpu ? MemoryPlacement{MemoryPlacement::Kind::kPinnedHost, device_.index()}
            : MemoryPlacement{};
    BatchInputCollector collector(requests, batching, &batch_buffers_,
                                  gpu ? BatchBuffer::Allocator(&PinnedBlock) : nullptr);
    std::vector<torch::Tensor> tensors;
    // The memory the tensors view (the requests' bytes or the batch buffers), which an output
    // must not keep: the requests go away and the buffers are reused by the next batch.
    std::vector<std::string_view> viewed;
    for (const std::string& name : inputs_.ordered_names) {
      const inference::ModelInput* cfg = nullptr;
      for (const auto& c : config_->input()) {
        if (c.name() == name) cfg = &c;
      }
      if (cfg == nullptr) return absl::InternalError(StrCat("input '", name, "' is not in the config"));
      auto batch = collector.Gather(*cfg, destination);
      if (absl::IsNotFound(batch.status())) {
        return absl::InvalidArgumentError(
            StrCat("input '", name, "' is missing; the pytorch backend needs every input"));
      }
      if (!batch.ok()) return batch.status();
      auto type = ToTorch(batch->datatype);
      if (!type) {
        return absl::InvalidArgumentError(StrCat("input '", name, "': ",
                                                 DataTypeName(batch->datatype),
                                                 " is not supported by the pytorch backend"));
      }
      // A view, no copy: forward() does not keep its arguments past the call. On a GPU the
      // view is of pinned memory, copied to the device without blocking.
      torch::Tensor host = torch::from_blob(const_cast<char*>(batch->data.data()), batch->shape,
                                            torch::TensorOptions().dtype(*type));
      tensors.push_back(gpu ? host.to(torch::TensorOptions().device(device_), /*non_blocking=*/true)
                            : host);
      viewed.push_back(batch->data);
    }
    std::vector<torch::jit::IValue> args;
    if (inputs_.dict_input) {
      c10::Dict<std::string, torch::Tensor> dict;
      for (size_t i = 0; i < tensors.size(); ++i) dict.insert(inputs_.ordered_names[i], tensors[i]);
      args.emplace_back(dict);
    } else {
      for (auto& t : tensors) args.emplace_back(t);
    }
    times->input_end_ns = core::NowNs();
    torch::jit::IValue result;
    {
      // INFERENCE_MODE supersedes no-grad; with it off, forward() still records no gradients.
      c10::InferenceMode inference(settings_.inference_mode);
      torch::NoGradGuard no_grad;
      StopScope stop(&stop_);
      result = module_->module.forward(args);
    }
    times->output_start_ns = core::NowNs();

    auto outs = ConfigOutputs(result);
    if (!outs.ok()) return outs.status();
    std::vector<torch::Tensor> host_outputs;
    for (auto& [name, tensor] : *outs) {
      if (tensor.device().is_cpu()) {
        host_outputs.push_back(tensor.contiguous());
        continue;
      }
      torch::Tensor dev = tensor.contiguous();
      torch::Tensor host = torch::empty(
          dev.sizes(), dev.options().device(torch::kCPU).pinned_memory(true));
      host.copy_(dev, /*non_blocking=*/true);
      host_outputs.push_back(host);
    }
    SyncStream();  // the host copies are complete from here on
    BatchOutputResponder responder(requests, responses, batching);
    for (size_t i = 0; i < outs->size(); ++i) {
      const std::string& name = (*outs)[i].first;
      auto holder = std::make_shared<torch::Tensor>(host_outputs[i]);
      // An output that shares an input's memory (forward() returned an input, or a view of
      // one) must not outlive the request or see the next batch: it gets its own copy.
      if (AliasesAny(*holder, viewed)) *holder = holder->clone();
      const DataType dtype = FromTorch(holder->scalar_type());
      const DataType expected = ExpectedOutputType(name);
      if (dtype != expected) {
        return absl::InternalError(StrCat(
            "pytorch: model '", config_->name(), "': configuration expects datatype ",
            config::ProtoTypeName(config::ToProto(expected)), " for output '", name,
            "', model provides ",
            dtype == DataType::kInvalid ? std::string(c10::toString(holder->scalar_type()))
                                        : config::ProtoTypeName(config::ToProto(dtype))));
      }
      const Shape shape(holder->sizes().begin(), holder->sizes().end());
      const std::string_view data(static_cast<const char*>(holder->data_ptr()), holder->nbytes());
      if (auto st = responder.Respond(nullptr, name, dtype, shape, data, holder); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }

  // The tensors forward() returned, by config output name: a tensor (the first output), a
  // tuple or list (by the names' __N index, else position), or a dict (by name).
  absl::StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> ConfigOutputs(
      const torch::jit::IValue& result) const {
    std::vector<std::pair<std::string, torch::Tensor>> outs;
    if (result.isTensor()) {
      if (!outputs_.names.empty()) outs.emplace_back(outputs_.names[0], result.toTensor());
    } else if (result.isTuple() || result.isList()) {
      std::vector<torch::jit::IValue> items;
      if (result.isTuple()) {
        items = result.toTuple()->elements().vec();
      } else {
        for (const auto& v : result.toList()) items.push_back(v);
      }
      for (size_t i = 0; i < outputs_.names.size(); ++i) {
        const int idx = outputs_.index[i] >= 0 ? outputs_.index[i] : static_cast<int>(i);
        if (idx >= static_cast<int>(items.size()) || !items[idx].isTensor()) {
          return absl::InternalError(StrCat("output '", outputs_.names[i], "': forward() returned ",
                                            items.size(), " values, no tensor at position ", idx));
        }
        outs.emplace_back(outputs_.names[i], items[idx].toTensor());
      }
    } else if (result.isGenericDict()) {
      auto dict = result.toGenericDict();
      for (const auto& name : outputs_.names) {
        auto it = dict.find(name);
        if (it == dict.end() || !it->value().isTensor()) {
          return absl::InternalError(StrCat("output '", name, "' is not a key of the dict forward() returned"));
        }
        outs.emplace_back(name, it->value().toTensor());
      }
    } else {
      return absl::InternalError("forward() must return a tensor, a tuple or list of tensors, or a dict of tensors");
    }
    return outs;
  }

  static bool AliasesAny(const torch::Tensor& t, const std::vector<std::string_view>& memory) {
    const char* begin = static_cast<const char*>(t.storage().data());
    const char* end = begin + t.storage().nbytes();
    for (std::string_view m : memory) {
      if (m.data() < end && begin < m.data() + m.size()) return true;
    }
    return false;
  }

  DataType ExpectedOutputType(const std::string& name) const {
    for (const auto& out : config_->output()) {
      if (out.name() == name) return config::FromProto(out.data_type());
    }
    return DataType::kInvalid;
  }

  const config::ModelConfig* config_;
  std::shared_ptr<SharedModule> module_;
  InputPlan inputs_;
  OutputPlan outputs_;
  const TorchSettings settings_;
  const torch::Device device_;                // kCPU, or cuda:<id>
  const std::optional<c10::Stream> stream_;   // a GPU instance's stream
  inferd::Mutex stop_mu_;
  bool running_ ABSL_GUARDED_BY(stop_mu_) = false;  // an Execute is on
  std::atomic<bool> stop_{false};  // CancelExecution during this run
  // Batch input buffers, one per input, reused by every batch (Execute runs on one thread at a
  // time, and the inputs are views that forward() does not keep).
  std::vector<BatchBuffer> batch_buffers_;
};

// The `parameters` keys CreateInstance reads; add a key here when it gets read. Inputs are
// reshaped (BackendInputShape); outputs keep the shape the module returns.
constexpr std::string_view kParameters[] = {
    "INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT", "INFERENCE_MODE",
    "DISABLE_OPTIMIZED_EXECUTION", "ENABLE_JIT_EXECUTOR", "ENABLE_JIT_PROFILING",
    "ENABLE_TENSOR_FUSER", "ENABLE_WEIGHT_SHARING"};
// Keys Triton's PyTorch backend reads that act on CUDA only. inferd does not apply them, on
// CPU or GPU instances: a WARNING line each, saying what stays as it is.
constexpr UnappliedParameter kUnapplied[] = {
    {"ENABLE_CACHE_CLEANING",
     "it would empty PyTorch's CUDA caching allocator after each execution; inferd keeps the "
     "cache (GPU memory is measured at load and stays with the model)"},
    {"DISABLE_CUDNN",
     "it would turn cuDNN off for GPU execution; inferd's GPU instances run with LibTorch's "
     "default (cuDNN on)"},
    {"ENABLE_NVFUSER",
     "it would turn TorchScript's NVFuser (a CUDA kernel fuser) on or off; inferd leaves "
     "LibTorch's default (ENABLE_TENSOR_FUSER sets the CPU fuser)"},
};
constexpr ConfigSupport kConfigSupport = {
    .parameters = kParameters, .unapplied = kUnapplied, .input_reshape = true};

class LibTorchBackend : public Backend {
 public:
  std::string_view name() const override { return "pytorch"; }

  // OK with a CUDA LibTorch that sees a GPU; else why not (a CPU build, no driver).
  absl::Status GpuInstanceSupport() const override { return TorchCudaSupport(); }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstanceOn(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const InstanceDevice& device) override {
    if (!device.gpu) return CreateInstance(spec, group, index);
    const std::string where = StrCat("model '", spec.config->name(), "': instance '", device.name,
                                     "' on GPU ", device.id, ": ");
    if (absl::Status st = TorchCudaSupport(); !st.ok()) {
      return absl::FailedPreconditionError(StrCat(where, st.message()));
    }
    std::optional<c10::Stream> stream;
    try {
      const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
      if (device.id < 0 || device.id >= count) {
        return absl::FailedPreconditionError(
            StrCat(where, "LibTorch sees ", count, " GPU(s) (CUDA_VISIBLE_DEVICES?)"));
      }
      // A stream of the instance's own from LibTorch's pool for that device (round-robin
      // over the pool), so instances on one GPU do not serialize on the default stream.
      const torch::Device gpu(torch::kCUDA, static_cast<c10::DeviceIndex>(device.id));
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      stream = impl.getStreamFromGlobalPool(gpu, /*isHighPriority=*/false);
    } catch (const std::exception& e) {
      return absl::FailedPreconditionError(StrCat(where, "no CUDA stream: ", e.what()));
    }
    return Create(spec, index, stream->device(), stream);
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    return Create(spec, index, torch::Device(torch::kCPU), std::nullopt);
  }

 private:
  // An instance on `device` (the CPU, or a GPU with its `stream`).
  absl::StatusOr<std::unique_ptr<ModelInstance>> Create(const ModelSpec& spec, int index,
                                                        torch::Device device,
                                                        std::optional<c10::Stream> stream) {
    if (auto st = CheckConfigSupport(spec, name(), kConfigSupport, index); !st.ok()) return st;
    const auto& cfg = *spec.config;
    if (cfg.output_size() == 0) {
      // As Triton's PyTorch backend: outputs are bound by name, so none would answer nothing.
      return absl::InvalidArgumentError(StrCat(
          "pytorch: model '", cfg.name(), "': config.pbtxt must list at least one output, none "
          "were specified (the PyTorch backend does not read them from the model file)"));
    }
    for (const auto& in : cfg.input()) {
      if (!ToTorch(config::FromProto(in.data_type()))) {
        return absl::InvalidArgumentError(StrCat("model '", cfg.name(), "': input '", in.name(), "' is ",
                                                 config::ProtoTypeName(in.data_type()),
                                                 ", which the pytorch backend does not support"));
      }
    }
    auto settings =
        ReadSettings(cfg, std::max(1, spec.cpu_cores / std::max(1, spec.total_instances)));
    if (!settings.ok()) return settings.status();
    const bool weight_sharing = settings->weight_sharing;
    if (settings->inter_op_threads) {
      // The inter-op pool (torch.jit.fork) is one per process and can be sized only before
      // its first use: as in Triton, the first model that sets it decides.
      const int inter = *settings->inter_op_threads;
      static std::once_flag once;
      std::call_once(once, [inter] {
        try {
          at::set_num_interop_threads(inter);
        } catch (const c10::Error&) {
        }
      });
    }
    if (index == 0) {
      LOG_INFO << "pytorch: model '" << cfg.name() << "' on LibTorch " << TORCH_VERSION << ": "
               << DescribeSettings(*settings) << " (inter-op pool: "
               << at::get_num_interop_threads() << " threads)"
               << (device.is_cuda() ? StrCat(" on ", device.str()) : std::string());
    }
    // Shared per file and device: a module lives on one device.
    const std::string shared_key = StrCat(spec.model_path, "@", device.str());
    std::shared_ptr<SharedModule> module;
    {
      inferd::MutexLock lock(&shared_mu_);
      auto it = shared_.find(shared_key);
      if (weight_sharing && it != shared_.end()) module = it->second.lock();
    }
    if (!module) {
      module = std::make_shared<SharedModule>();
      module->device = device;
      try {
        c10::InferenceMode inference(settings->inference_mode);  // Triton loads under it too
        // Loaded onto the instance's device (its parameters and buffers copied there once).
        module->module = torch::jit::load(spec.model_path, device);
        module->module.eval();
      } catch (const c10::Error& e) {
        return absl::InvalidArgumentError(StrCat("pytorch: cannot load '", spec.model_path, "': ",
                                                 e.what_without_backtrace()));
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(StrCat("pytorch: cannot load '", spec.model_path, "': ", e.what()));
      }
      if (weight_sharing) {
        inferd::MutexLock lock(&shared_mu_);
        shared_[shared_key] = module;
      }
    }
    auto inputs = PlanInputs(cfg, module->module);
    if (!inputs.ok()) return inputs.status();
    OutputPlan outputs;
    for (const auto& out : cfg.output()) {
      outputs.names.push_back(out.name());
      outputs.index.push_back(IndexSuffix(out.name()));
    }
    return std::unique_ptr<ModelInstance>(new TorchInstance(
        spec.config, std::move(module), *std::move(inputs), std::move(outputs),
        *std::move(settings), device, stream));
  }

  static absl::StatusOr<InputPlan> PlanInputs(const config::ModelConfig& cfg,
                                              torch::jit::Module& module) {
    InputPlan plan;
    std::vector<std::string> arg_names;
    bool dict_arg = false;
    try {
      const auto& schema = module.get_method("forward").function().getSchema();
      for (size_t i = 1; i < schema.arguments().size(); ++i) {  // skip self
        arg_names.push_back(schema.arguments()[i].name());
        if (schema.arguments()[i].type()->kind() == c10::TypeKind::DictType) dict_arg = true;
      }
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(StrCat("pytorch: model '", cfg.name(), "' has no usable forward(): ",
                                               e.what_without_backtrace()));
    }
    if (dict_arg && arg_names.size() == 1) {
      plan.dict_input = true;
      for (const auto& in : cfg.input()) plan.ordered_names.push_back(in.name());
      return plan;
    }
    // <name>__<index> names give the argument position; otherwise forward()'s argument names.
    bool all_indexed = true;
    for (const auto& in : cfg.input()) all_indexed &= IndexSuffix(in.name()) >= 0;
    std::vector<std::string> ordered(cfg.input_size());
    for (const auto& in : cfg.input()) {
      int pos = all_indexed ? IndexSuffix(in.name()) : -1;
      if (!all_indexed) {
        auto it = std::find(arg_names.begin(), arg_names.end(), in.name());
        if (it == arg_names.end()) {
          return absl::InvalidArgumentError(StrCat(
              "pytorch: model '", cfg.name(), "': input '", in.name(),
              "' is neither named <name>__<index> nor an argument of forward() (",
              StrJoin(arg_names, ", "), ")"));
        }
        pos = static_cast<int>(it - arg_names.begin());
      }
      if (pos >= cfg.input_size() || !ordered[pos].empty()) {
        return absl::InvalidArgumentError(StrCat("pytorch: model '", cfg.name(), "': input '", in.name(),
                                                 "' maps to argument ", pos, ", which is out of range or taken"));
      }
      ordered[pos] = in.name();
    }
    if (!arg_names.empty() && arg_names.size() != ordered.size()) {
      return absl::InvalidArgumentError(StrCat("pytorch: model '", cfg.name(), "': forward() takes ",
                                               arg_names.size(), " arguments but config.pbtxt lists ",
                                               ordered.size(), " inputs"));
    }
    plan.ordered_names = std::move(ordered);
    return plan;
  }

  inferd::Mutex shared_mu_;
  std::map<std::string, std::weak_ptr<SharedModule>> shared_ ABSL_GUARDED_BY(shared_mu_);
};

}  // namespace

std::unique_ptr<Backend> MakeLibTorchBackend() { return std::make_unique<LibTorchBackend>(); }

}  // namespace inferd::backends

// The module's entry point (backends/module_backend.h).
extern "C" __attribute__((visibility("default"))) inferd::backends::Backend* InferdCreateBackend() {
  return inferd::backends::MakeLibTorchBackend().release();
}
