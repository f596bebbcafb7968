#include "backends/onnxruntime/onnxruntime_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "backends/batch_io.h"
#include "backends/tensor_places.h"
#include "backends/onnxruntime/session_settings.h"
#include "backends/onnxruntime/thread_reuse.h"
#include "common/logging.h"
#include "gpu/copy.h"
#include "gpu/runtime.h"
#include "onnxruntime_cxx_api.h"
#include "onnxruntime_run_options_config_keys.h"
#include "onnxruntime_session_options_config_keys.h"

namespace inferd::backends {
namespace {

using ort::SessionSettings;

Ort::Env& GlobalEnv() {
  static Ort::Env* env = new Ort::Env(ORT_LOGGING_LEVEL_WARNING, "inferd");
  return *env;
}

DataType FromOrt(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return DataType::kBool;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return DataType::kUint8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return DataType::kUint16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return DataType::kUint32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return DataType::kUint64;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return DataType::kInt8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return DataType::kInt16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return DataType::kInt32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return DataType::kInt64;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return DataType::kFp16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return DataType::kFp32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return DataType::kFp64;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return DataType::kBytes;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return DataType::kBf16;
    default: return DataType::kInvalid;
  }
}

ONNXTensorElementDataType ToOrt(DataType t) {
  switch (t) {
    case DataType::kBool: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
    case DataType::kUint8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case DataType::kUint16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
    case DataType::kUint32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32;
    case DataType::kUint64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64;
    case DataType::kInt8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case DataType::kInt16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16;
    case DataType::kInt32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case DataType::kInt64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case DataType::kFp16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case DataType::kFp32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case DataType::kFp64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
    case DataType::kBytes: return ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING;
    case DataType::kBf16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  }
}

// One input or output of a model file, as ONNX Runtime reads it.
struct ModelIo {
  std::string name;
  DataType type = DataType::kInvalid;
  std::vector<int64_t> shape;  // -1 for a variable dimension; empty for a scalar or unknown rank
};

std::string_view OnnxTypeName(ONNXType t) {
  switch (t) {
    case ONNX_TYPE_SEQUENCE: return "a sequence type";
    case ONNX_TYPE_MAP: return "a map type";
    case ONNX_TYPE_OPAQUE: return "an opaque type";
    case ONNX_TYPE_SPARSETENSOR: return "a sparse tensor type";
    case ONNX_TYPE_OPTIONAL: return "an optional type";
    default: return "not a tensor type";
  }
}

// The model file's inputs (input = true) or outputs. Triton's onnxruntime backend serves tensor
// inputs and outputs only; a sequence, map, optional or sparse one (sklearn's ZipMap output,
// say) fails the load here, naming it, instead of reaching code that reads it as a tensor.
absl::StatusOr<std::vector<ModelIo>> ListModelIo(Ort::Session& session, bool input) {
  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<ModelIo> ios;
  const size_t count = input ? session.GetInputCount() : session.GetOutputCount();
  for (size_t i = 0; i < count; ++i) {
    ModelIo io;
    io.name = input ? session.GetInputNameAllocated(i, alloc).get()
                    : session.GetOutputNameAllocated(i, alloc).get();
    Ort::TypeInfo ti = input ? session.GetInputTypeInfo(i) : session.GetOutputTypeInfo(i);
    const ONNXType kind = ti.GetONNXType();
    if (kind != ONNX_TYPE_TENSOR) {
      return absl::InvalidArgumentError(inferd::StrCat(
          input ? "input '" : "output '", io.name, "' is ", OnnxTypeName(kind),
          "; inferd serves tensor ", input ? "inputs" : "outputs", " only"));
    }
    auto tinfo = ti.GetTensorTypeAndShapeInfo();
    const ONNXTensorElementDataType element = tinfo.GetElementType();
    io.type = FromOrt(element);
    if (io.type == DataType::kInvalid) {
      return absl::InvalidArgumentError(inferd::StrCat(
          input ? "input '" : "output '", io.name, "' has ONNX element type ",
          static_cast<int>(element), ", which inferd does not serve"));
    }
    io.shape = tinfo.GetShape();
    ios.push_back(std::move(io));
  }
  return ios;
}

// Keeps an output value, and the session whose allocator owns its memory, alive until the
// response is sent. Members are destroyed in reverse order: the value before the session.
struct OutputHolder {
  std::shared_ptr<Ort::Session> session;
  Ort::Value value{nullptr};
  std::string bytes;  // BYTES outputs, serialized as 4-byte length + bytes
};

absl::Status ApplySettings(const SessionSettings& s, Ort::SessionOptions* options) {
  options->SetIntraOpNumThreads(s.intra_op_threads);
  options->SetInterOpNumThreads(s.inter_op_threads);
  options->SetExecutionMode(s.parallel_execution ? ORT_PARALLEL : ORT_SEQUENTIAL);
  // Pool threads are borrowed from a process-wide set, not started and ended per session:
  // each ended ONNX Runtime thread left heap behind (thread_reuse.h).
  ort::UseReusedThreads(options);
  if (!s.mem_arena) options->DisableCpuMemArena();
  if (!s.mem_pattern) options->DisableMemPattern();
  // allow_spinning (inferd's) sets both pools' spinning unless a session.* key sets it.
  auto has_entry = [&s](std::string_view key) {
    return std::any_of(s.session_entries.begin(), s.session_entries.end(),
                       [key](const auto& e) { return e.first == key; });
  };
  for (const char* key :
       {kOrtSessionOptionsConfigAllowIntraOpSpinning, kOrtSessionOptionsConfigAllowInterOpSpinning}) {
    if (!has_entry(key)) options->AddConfigEntry(key, s.allow_spinning ? "1" : "0");
  }
  if (s.spin_during_runs_only && !has_entry(kOrtSessionOptionsConfigForceSpinningStop)) {
    options->AddConfigEntry(kOrtSessionOptionsConfigForceSpinningStop, "1");
  }
  for (const auto& entry : s.session_entries) {
    options->AddConfigEntry(entry.first.c_str(), entry.second.c_str());
  }
  options->SetGraphOptimizationLevel(
      s.graph_level == ort::GraphLevel::kBasic        ? ORT_ENABLE_BASIC
      : s.graph_level == ort::GraphLevel::kExtended   ? ORT_ENABLE_EXTENDED
      : s.graph_level == ort::GraphLevel::kDisableAll ? ORT_DISABLE_ALL
                                                      : ORT_ENABLE_ALL);
  if (!s.optimized_model_filepath.empty()) {
    options->SetOptimizedModelFilePath(s.optimized_model_filepath.c_str());
  }
  return absl::OkStatus();
}

// A GPU instance's means to read inputs on its GPU (ModelInstance::GpuInputsOn): the CUDA
// provider's device memory description, under which ONNX Runtime takes a tensor in that GPU's
// memory as it is, and a stream of the instance's own for the gathers.
struct GpuInputs {
  int device = 0;
  Ort::ConstMemoryInfo memory{nullptr};  // the provider's, lives as long as the process
  std::unique_ptr<gpu::Stream> stream;
};

class OrtInstance : public ModelInstance {
 public:
  OrtInstance(const config::ModelConfig* config, std::shared_ptr<Ort::Session> session,
              SessionSettings settings, bool gpu, std::unique_ptr<GpuInputs> gpu_inputs = nullptr)
      : config_(config),
        session_(std::move(session)),
        settings_(std::move(settings)),
        gpu_(gpu),
        gpu_inputs_(std::move(gpu_inputs)) {
    if (!settings_.arena_shrinkage.empty()) {
      run_options_.AddConfigEntry(kOrtRunOptionsConfigEnableMemoryArenaShrinkage,
                                  settings_.arena_shrinkage.c_str());
    }
    for (const auto& out : config_->output()) output_names_.push_back(out.name());
  }

  // Session::Run is thread-safe and a CPU session keeps nothing per thread; a CUDA-bound one
  // stays on its instance thread (its stream and current device).
  bool RunsOnAnyThread() const override { return !gpu_; }

  // A CUDA-bound instance reads inputs on its GPU: a tensor there is bound through IoBinding
  // with the provider's device memory description, where ONNX Runtime would otherwise be
  // handed host bytes and copy them up itself.
  std::optional<int> GpuInputsOn() const override {
    if (gpu_inputs_ == nullptr) return std::nullopt;
    return gpu_inputs_->device;
  }

  // OutputsMayBeOnGpu stays false: an output stays on the GPU (bound there through IoBinding,
  // all but BYTES) only for a batch whose every request's consumer reads it there (an
  // ensemble's step: InferRequest::gpu_outputs_ok; a CUDA shared-memory region on this GPU:
  // RequestedOutput::gpu_region_on, copied device-to-device into it by the server's edge);
  // every other output comes back to the host inside Session::Run.

  int ThreadCount() const override {
    return settings_.intra_op_threads * (settings_.parallel_execution ? settings_.inter_op_threads : 1);
  }

  // Every client of the running batch left: RunOptions' terminate flag makes Session::Run
  // return at the next operator boundary with an error (the scheduler answers CANCELLED).
  void CancelExecution() override {
    inferd::MutexLock lock(&terminate_mu_);
    if (!running_) return;
    run_options_.SetTerminate();
    terminated_ = true;
  }

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    absl::Status status;
    try {
      status = Run(requests, responses, times);
    } catch (const Ort::Exception& e) {
      status = absl::InternalError(inferd::StrCat("onnxruntime: ", e.what()));
    } catch (const std::exception& e) {
      status = absl::InternalError(inferd::StrCat("onnxruntime backend: ", e.what()));
    }
    if (!status.ok()) {
      FailBatch(responses, status);
    }
  }

 private:
  // Maps the gathered batch to ONNX Runtime's tensors, runs the session, and hands its outputs
  // back through the responder: gathering, slicing and output filtering are batch_io.h's.
  absl::Status Run(std::span<core::InferRequest* const> requests,
                   std::span<core::InferResponse* const> responses, ExecutionTimes* times) {
    const bool batching = config_->max_batch_size() > 0;
    BatchInputCollector collector(requests, batching, &batch_buffers_);
    if (gpu_inputs_ != nullptr) {
      // Inputs on this GPU are gathered there: one copy per request on the instance's stream,
      // or none for a lone request.
      collector.TakeGpuInputs(
          gpu_inputs_->device, &device_batch_buffers_,
          [device = gpu_inputs_->device](size_t bytes) -> BatchBuffer::Block {
            auto memory = gpu::SystemRuntime().AllocateDevice(device, bytes);
            if (!memory.ok()) return {};
            char* data = static_cast<char*>((*memory)->data());
            return {data, std::shared_ptr<gpu::DeviceBuffer>(*std::move(memory))};
          },
          [this](void* dst, const void* src, MemoryPlace src_place, size_t bytes) {
            return gpu::CopyBetween(gpu::SystemRuntime(), dst, MemoryPlace::Gpu(gpu_inputs_->device),
                                    src, src_place, bytes, gpu_inputs_->stream.get());
          });
    }
    std::vector<Ort::Value> inputs;
    std::vector<const char*> input_names;
    bool on_gpu = false;  // some input is in GPU memory: bound through IoBinding
    for (const auto& in_cfg : config_->input()) {
      auto batch = collector.Gather(in_cfg);
      if (absl::IsNotFound(batch.status())) continue;  // optional input left out
      if (!batch.ok()) return batch.status();
      input_names.push_back(in_cfg.name().c_str());
      if (!batch->place.OnHost()) {
        on_gpu = true;
        inputs.push_back(Ort::Value::CreateTensor(
            gpu_inputs_->memory, const_cast<char*>(batch->data.data()), batch->data.size(),
            batch->shape.data(), batch->shape.size(), ToOrt(batch->datatype)));
        continue;
      }
      auto value = ToOrtValue(*batch);
      if (!value.ok()) return value.status();
      inputs.push_back(*std::move(value));
    }
    if (on_gpu) {
      // The gathers must be in place before the provider's own stream reads them.
      if (absl::Status st = gpu_inputs_->stream->Synchronize(); !st.ok()) {
        return absl::InternalError(
            inferd::StrCat("gathering inputs on GPU ", gpu_inputs_->device, ": ", st.message()));
      }
    }

    // Ask only for outputs some request wants.
    BatchOutputResponder responder(requests, responses, batching);
    std::vector<size_t> wanted;  // indexes into config_->output()
    std::vector<const char*> names;
    for (size_t o = 0; o < output_names_.size(); ++o) {
      if (!responder.AnyRequested(output_names_[o])) continue;
      wanted.push_back(o);
      names.push_back(output_names_[o].c_str());
    }
    // An output stays on the GPU when every request's consumer reads it there: an ensemble's
    // next step, or a CUDA shared-memory region on this GPU (tensor_places.h); never BYTES.
    // Sized only when some output may stay there: a host batch allocates nothing for it.
    std::vector<bool> output_on_gpu;
    bool outputs_on_gpu = false;
    if (gpu_inputs_ != nullptr) {
      for (size_t k = 0; k < names.size(); ++k) {
        if (config_->output(static_cast<int>(wanted[k])).data_type() == inference::TYPE_STRING ||
            !BatchOutputMayStayOnGpu(requests, names[k], gpu_inputs_->device)) {
          continue;
        }
        if (output_on_gpu.empty()) output_on_gpu.assign(names.size(), false);
        output_on_gpu[k] = true;
        outputs_on_gpu = true;
      }
    }
    if (on_gpu && output_on_gpu.empty()) output_on_gpu.assign(names.size(), false);
    times->input_end_ns = core::NowNs();
    std::vector<Ort::Value> outputs =
        on_gpu || outputs_on_gpu ? RunBound(input_names, inputs, names, output_on_gpu)
                                 : RunSession(input_names, inputs, names);
    times->output_start_ns = core::NowNs();

    for (size_t k = 0; k < outputs.size(); ++k) {
      auto holder = std::make_shared<OutputHolder>();
      holder->session = session_;
      holder->value = std::move(outputs[k]);
      Ort::TensorTypeAndShapeInfo info = holder->value.GetTensorTypeAndShapeInfo();
      const DataType dtype = FromOrt(info.GetElementType());
      if (dtype == DataType::kInvalid) {
        return absl::InternalError(
            inferd::StrCat("output '", names[k], "' has a data type inferd does not support"));
      }
      std::string_view data;
      if (dtype == DataType::kBytes) {
        const size_t count = info.GetElementCount();
        for (size_t i = 0; i < count; ++i) {
          AppendBytesElement(holder->value.GetStringTensorElement(i), &holder->bytes);
        }
        data = holder->bytes;
      } else {
        data = std::string_view(static_cast<const char*>(holder->value.GetTensorRawData()),
                                info.GetElementCount() * DataTypeSize(dtype));
      }
      MemoryPlacement source;
      if (!output_on_gpu.empty() && output_on_gpu[k]) {
        source = {MemoryPlacement::Kind::kGpu, gpu_inputs_->device};
      }
      auto st = responder.Respond(&config_->output(static_cast<int>(wanted[k])), names[k], dtype,
                                  info.GetShape(), data, holder, source);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // An ONNX Runtime tensor over a gathered batch input: a view of its bytes (the batch buffer or
  // the request's own), or for BYTES a string tensor holding copies of the elements.
  absl::StatusOr<Ort::Value> ToOrtValue(const BatchInput& batch) {
    if (batch.datatype != DataType::kBytes) {
      return Ort::Value::CreateTensor(memory_info_, const_cast<char*>(batch.data.data()),
                                      batch.data.size(), batch.shape.data(), batch.shape.size(),
                                      ToOrt(batch.datatype));
    }
    Ort::Value v = Ort::Value::CreateTensor(allocator_, batch.shape.data(), batch.shape.size(),
                                            ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING);
    size_t i = 0;
    auto st = ForEachBytesElement(batch.data, [&](std::string_view e) {
      char* dst = v.GetResizedStringTensorElementBuffer(i++, e.size());
      if (!e.empty()) std::memcpy(dst, e.data(), e.size());
    });
    if (!st.ok()) return st;
    return v;
  }

  // Session::Run through an IoBinding, for a batch with inputs in GPU memory or outputs to
  // leave there: each input bound where it is (ONNX Runtime copies a host one up itself), each
  // output bound to the GPU's memory where `on_gpu[k]`, else to host memory. ONNX Runtime
  // waits for the provider's stream at the end of the run (RunOptions'
  // disable_synchronize_execution_providers is left off), so GPU outputs are complete when
  // this returns.
  std::vector<Ort::Value> RunBound(const std::vector<const char*>& input_names,
                                   const std::vector<Ort::Value>& inputs,
                                   const std::vector<const char*>& output_names,
                                   const std::vector<bool>& on_gpu) {
    Ort::IoBinding binding(*session_);
    for (size_t i = 0; i < inputs.size(); ++i) binding.BindInput(input_names[i], inputs[i]);
    for (size_t k = 0; k < output_names.size(); ++k) {
      if (on_gpu[k]) {
        binding.BindOutput(output_names[k], gpu_inputs_->memory);
      } else {
        binding.BindOutput(output_names[k], memory_info_);
      }
    }
    RunGuarded([&] { session_->Run(run_options_, binding); });
    return binding.GetOutputValues();
  }

  // Session::Run with the cancellation seam.
  std::vector<Ort::Value> RunSession(const std::vector<const char*>& input_names,
                                     const std::vector<Ort::Value>& inputs,
                                     const std::vector<const char*>& output_names) {
    std::vector<Ort::Value> outputs;
    RunGuarded([&] {
      outputs = session_->Run(run_options_, input_names.data(), inputs.data(), inputs.size(),
                              output_names.data(), output_names.size());
    });
    return outputs;
  }

  // Runs `run` (a Session::Run) with the cancellation seam: CancelExecution may set the
  // terminate flag only while this runs; the flag is sticky on the RunOptions, so it is
  // cleared before the next.
  template <typename F>
  void RunGuarded(F run) {
    {
      inferd::MutexLock lock(&terminate_mu_);
      running_ = true;
    }
    struct Unset {
      OrtInstance* self;
      ~Unset() {
        inferd::MutexLock lock(&self->terminate_mu_);
        self->running_ = false;
        if (self->terminated_) self->run_options_.UnsetTerminate();
        self->terminated_ = false;
      }
    } unset{this};
    run();
  }

  const config::ModelConfig* config_;
  std::shared_ptr<Ort::Session> session_;
  SessionSettings settings_;
  const bool gpu_;
  Ort::RunOptions run_options_;
  inferd::Mutex terminate_mu_;
  bool running_ ABSL_GUARDED_BY(terminate_mu_) = false;
  bool terminated_ ABSL_GUARDED_BY(terminate_mu_) = false;
  Ort::MemoryInfo memory_info_ = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPU);
  Ort::AllocatorWithDefaultOptions allocator_;
  std::vector<std::string> output_names_;
  // Batch input buffers, one per input, reused by every batch of this instance (Execute runs
  // on one thread at a time, and ONNX Runtime does not keep inputs past Run). They grow to the
  // largest batch seen, at most max_batch_size requests' worth.
  std::vector<BatchBuffer> batch_buffers_;
  // GPU instances: inputs on the GPU, and their batch buffers there (as batch_buffers_).
  std::unique_ptr<GpuInputs> gpu_inputs_;
  std::vector<BatchBuffer> device_batch_buffers_;
};

// Triton's rules for a tensor from the model file into the config.
void CompleteTensorDims(const std::vector<int64_t>& model_shape, bool batching,
                        google::protobuf::RepeatedField<int64_t>* dims,
                        inference::ModelTensorReshape* reshape, bool* has_reshape) {
  size_t start = batching ? 1 : 0;
  for (size_t i = start; i < model_shape.size(); ++i) {
    // A config dim is >= 1 or -1; a zero-size dimension in the file (ONNX's tests have them:
    // an empty `axes`, a [0, 3] data tensor) is given as -1, and ONNX Runtime holds the
    // request to the file's 0.
    dims->Add(model_shape[i] <= 0 ? -1 : model_shape[i]);
  }
  if (dims->empty()) {
    // A scalar is presented as [1] and reshaped to [] for the model.
    dims->Add(1);
    reshape->Clear();
    *has_reshape = true;
  }
}

// The `parameters` keys session_settings.cc reads; add a key here when it gets read there.
constexpr std::string_view kParameters[] = {
    "intra_op_thread_count", "inter_op_thread_count", "execution_mode", "enable_mem_arena",
    "enable_mem_pattern", "memory.enable_memory_arena_shrinkage", "allow_spinning", "session.*",
    "optimized_model_filepath"};
// A key a published article uses that no Triton backend reads (CPU and GPU instances alike).
constexpr UnappliedParameter kCpuMemArenaUnapplied = {
    "enable_cpu_mem_arena",
    "it is ONNX Runtime's Python name for the CPU memory arena, which Triton's onnxruntime "
    "backend does not read either; the key for that is 'enable_mem_arena' (default true)"};
// Keys Triton's onnxruntime backend gives the CUDA execution provider of GPU instances (and one
// a published article uses that no Triton backend reads): a WARNING line each.
constexpr UnappliedParameter kUnapplied[] = {
    {"gpu_mem_limit",
     "it would cap the CUDA execution provider's memory arena of a GPU instance; this server has "
     "no GPU"},
    {"cudnn_conv_algo_search",
     "it would choose how cuDNN searches convolution algorithms on a GPU instance; this server "
     "has no GPU"},
    {"do_copy_in_default_stream",
     "it would make the CUDA execution provider copy on the default CUDA stream; this server has "
     "no GPU"},
    {"arena_extend_strategy",
     "it would set how the CUDA execution provider's arena grows (Triton gives it to that "
     "provider only, not to the CPU arena); this server has no GPU"},
    kCpuMemArenaUnapplied,
};
constexpr ConfigSupport kConfigSupport = {.parameters = kParameters,
                                          .unapplied = kUnapplied,
                                          .input_reshape = true,
                                          .output_reshape = true};
// A GPU instance gives the CUDA keys to the CUDA execution provider (ort::CudaProviderOptions).
constexpr std::string_view kGpuParameters[] = {
    "intra_op_thread_count", "inter_op_thread_count", "execution_mode", "enable_mem_arena",
    "enable_mem_pattern", "memory.enable_memory_arena_shrinkage", "allow_spinning", "session.*",
    "optimized_model_filepath", "gpu_mem_limit", "cudnn_conv_algo_search",
    "do_copy_in_default_stream", "arena_extend_strategy"};
constexpr UnappliedParameter kGpuUnapplied[] = {
    kCpuMemArenaUnapplied,
};
constexpr ConfigSupport kGpuConfigSupport = {.parameters = kGpuParameters,
                                             .unapplied = kGpuUnapplied,
                                             .input_reshape = true,
                                             .output_reshape = true};

// The ONNX file a model's `default_model_filename` names: where that is a folder, the model is
// <folder>/model.onnx beside its external data files (how models over ONNX's 2 GB protobuf limit
// ship), as Triton's onnxruntime backend reads it.
std::string OnnxFilePath(const std::string& model_path) {
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) return model_path + "/model.onnx";
  return model_path;
}

// ONNX Runtime's CUDA execution provider, a plugin library (inferd's ONNX Runtime core is a CPU
// build, where AppendExecutionProvider_CUDA answers "not enabled in this build"):
// INFERD_ORT_CUDA_EP_LIBRARY, else beside libonnxruntime, where scripts/setup.sh puts it when
// INFERD_FETCH_ORT_CUDA=1.
std::string CudaEpLibraryPath() {
  if (const char* path = std::getenv("INFERD_ORT_CUDA_EP_LIBRARY"); path != nullptr && *path) {
    return path;
  }
  return INFERD_ORT_CUDA_EP_DEFAULT;
}

// The CUDA provider registered with the process's Env once (RegisterExecutionProviderLibrary),
// and its GPU devices (GetEpDevices), in the provider's order, which is CUDA's device order.
struct CudaEp {
  absl::Status status;
  std::vector<Ort::ConstEpDevice> devices;
};

const CudaEp& RegisteredCudaEp() {
  static const CudaEp* const ep = [] {
    auto* out = new CudaEp;
    const std::string path = CudaEpLibraryPath();
    try {
      GlobalEnv().RegisterExecutionProviderLibrary("CUDA", path);
      for (const Ort::ConstEpDevice& d : GlobalEnv().GetEpDevices()) {
        if (std::strcmp(d.EpName(), "CUDAExecutionProvider") == 0 &&
            d.Device().Type() == OrtHardwareDeviceType_GPU) {
          out->devices.push_back(d);
        }
      }
      if (out->devices.empty()) {
        out->status = absl::FailedPreconditionError(inferd::StrCat(
            "ONNX Runtime's CUDA execution provider ('", path, "') lists no GPU"));
      } else {
        LOG_INFO << "onnxruntime: CUDA execution provider '" << path << "' registered, "
                 << out->devices.size() << " GPU(s)";
      }
    } catch (const std::exception& e) {
      out->status = absl::FailedPreconditionError(inferd::StrCat(
          "cannot load ONNX Runtime's CUDA execution provider '", path, "': ", e.what()));
    }
    return out;
  }();
  return *ep;
}

class OnnxRuntimeBackend : public Backend {
 public:
  std::string_view name() const override { return "onnxruntime"; }

  // Triton's onnxruntime backend reads default-max-batch-size (the max_batch_size auto-complete
  // gives a model that can batch; tritonserver passes 4 unless told otherwise). Its other keys
  // (enable-global-threadpool and the global pool's thread counts) are not read here.
  absl::StatusOr<std::vector<std::string>> Configure(
      const std::map<std::string, std::string>& settings) override {
    std::vector<std::string> unread;
    for (const auto& [key, value] : settings) {
      if (key != "default-max-batch-size") {
        unread.push_back(key);
        continue;
      }
      int n;
      if (!absl::SimpleAtoi(value, &n)) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "--backend-config: onnxruntime's default-max-batch-size takes an integer, got '",
            value, "'"));
      }
      default_max_batch_size_ = std::max(n, 0);
    }
    return unread;
  }

  absl::Status AutoCompleteConfig(const std::string& model_path,
                                  config::ModelConfig* config) override {
    if (config->input_size() > 0 && config->output_size() > 0) return absl::OkStatus();
    try {
      Ort::SessionOptions options;
      options.SetIntraOpNumThreads(1);
      options.SetGraphOptimizationLevel(ORT_DISABLE_ALL);
      Ort::Session session(GlobalEnv(), OnnxFilePath(model_path).c_str(), options);
      auto listed_ins = ListModelIo(session, true);
      if (!listed_ins.ok()) return AutoCompleteError(model_path, listed_ins.status());
      auto listed_outs = ListModelIo(session, false);
      if (!listed_outs.ok()) return AutoCompleteError(model_path, listed_outs.status());
      const std::vector<ModelIo>& ins = *listed_ins;
      const std::vector<ModelIo>& outs = *listed_outs;
      // Batching is assumed when every input and output has a variable first dimension.
      bool can_batch = !ins.empty() || !outs.empty();
      for (const auto* list : {&ins, &outs}) {
        for (const auto& io : *list) {
          if (io.shape.empty() || io.shape[0] != -1) can_batch = false;
        }
      }
      if (can_batch) {
        if (config->max_batch_size() == 0) config->set_max_batch_size(default_max_batch_size_);
        // As Triton's backend does: a model that batches gets the dynamic batcher unless the
        // config chose a scheduler.
        if (config->max_batch_size() > 1 && !config->has_dynamic_batching() &&
            !config->has_sequence_batching() && !config->has_ensemble_scheduling()) {
          config->mutable_dynamic_batching();
        }
      }
      const bool batching = config->max_batch_size() > 0;
      // Fills a config input or output (ModelInput / ModelOutput) from the session's tensor.
      auto complete = [batching](const auto& io, auto* tensor) {
        tensor->set_name(io.name);
        tensor->set_data_type(config::ToProto(io.type));
        bool has_reshape = false;
        inference::ModelTensorReshape reshape;
        CompleteTensorDims(io.shape, batching, tensor->mutable_dims(), &reshape, &has_reshape);
        if (has_reshape) *tensor->mutable_reshape() = reshape;
      };
      if (config->input_size() == 0) {
        for (const auto& io : ins) complete(io, config->add_input());
      }
      if (config->output_size() == 0) {
        for (const auto& io : outs) complete(io, config->add_output());
      }
    } catch (const std::exception& e) {  // Ort::Exception, and std::bad_alloc on a huge file
      return AutoCompleteError(model_path, absl::InvalidArgumentError(e.what()));
    }
    return absl::OkStatus();
  }

  static absl::Status AutoCompleteError(const std::string& model_path, const absl::Status& why) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "cannot read '", model_path, "' to auto-complete its config: ", why.message()));
  }

  // GPU instances need the CUDA execution provider's library; whether it loads and sees the
  // GPU is known only when the first GPU instance registers it.
  absl::Status GpuInstanceSupport() const override {
    const std::string path = CudaEpLibraryPath();
    if (access(path.c_str(), R_OK) != 0) {
      return absl::FailedPreconditionError(inferd::StrCat(
          "backend 'onnxruntime' cannot run on a GPU: ONNX Runtime's CUDA execution provider "
          "is not installed ('", path, "' cannot be read; scripts/setup.sh fetches it with "
          "INFERD_FETCH_ORT_CUDA=1, or INFERD_ORT_CUDA_EP_LIBRARY names it)"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstanceOn(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const InstanceDevice& device) override {
    if (!device.gpu) return CreateInstance(spec, group, index);
    const std::string where = inferd::StrCat("model '", spec.config->name(), "': instance '",
                                             device.name, "' on GPU ", device.id, ": ");
    if (absl::Status st = GpuInstanceSupport(); !st.ok()) {
      return absl::FailedPreconditionError(inferd::StrCat(where, st.message()));
    }
    const CudaEp& ep = RegisteredCudaEp();
    if (!ep.status.ok()) return absl::FailedPreconditionError(inferd::StrCat(where, ep.status.message()));
    if (device.id < 0 || device.id >= static_cast<int>(ep.devices.size())) {
      return absl::FailedPreconditionError(inferd::StrCat(
          where, "ONNX Runtime's CUDA execution provider lists ", ep.devices.size(), " GPU(s)"));
    }
    auto cuda_options = ort::CudaProviderOptions(*spec.config, device.id);
    if (!cuda_options.ok()) return cuda_options.status();
    return Create(spec, index, &*cuda_options, &ep.devices[device.id], device.id);
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    return Create(spec, index, nullptr, nullptr);
  }

 private:
  // A CPU instance, or with `cuda_options` and `ep_device` one bound to that CUDA device.
  absl::StatusOr<std::unique_ptr<ModelInstance>> Create(
      const ModelSpec& spec, int index,
      const std::vector<std::pair<std::string, std::string>>* cuda_options,
      const Ort::ConstEpDevice* ep_device, int gpu_device = 0) {
    const bool gpu = ep_device != nullptr;
    if (auto st = CheckConfigSupport(spec, name(), gpu ? kGpuConfigSupport : kConfigSupport, index);
        !st.ok()) {
      return st;
    }
    auto settings = ort::SettingsFromConfig(*spec.config, spec.total_instances, spec.cpu_cores);
    if (!settings.ok()) return settings.status();
    if (gpu) settings->not_applying.clear();  // the CUDA keys go to the CUDA provider
    if (index == 0) {
      const std::string_view why =
          gpu ? "this build has no TensorRT (libnvinfer); the CUDA execution provider runs the "
                "model"
              : "Triton adds it (the TensorRT or CUDA execution provider) to GPU instances "
                "only; this model's instances run on the CPU";
      for (const auto& acc :
           spec.config->optimization().execution_accelerators().gpu_execution_accelerator()) {
        if (gpu && acc.name() == "cuda") continue;  // its parameters go to the CUDA provider
        LOG_WARNING << "model '" << spec.config->name() << "' version " << spec.version
                    << ": gpu_execution_accelerator '" << acc.name() << "' has no effect: "
                    << why;
      }
    }
    if (index == 0 && !gpu &&
        spec.config->optimization().execution_accelerators().cpu_execution_accelerator_size()) {
      LOG_WARNING << "model '" << spec.config->name() << "' version " << spec.version
                  << ": cpu_execution_accelerator 'openvino' has no effect: this build has no "
                     "OpenVINO execution provider; ONNX Runtime's CPU provider runs the model";
    }
    try {
      Ort::SessionOptions options;
      auto st = ApplySettings(*settings, &options);
      if (!st.ok()) return st;
      // --log-verbose: ONNX Runtime's own log of this session (INFO) goes to the server's
      // stderr, opening with its "Session Options { ... }" line: the options as the session
      // holds them (enable_cpu_mem_arena, enable_mem_pattern, execution_mode, ...), read back
      // by the runtime rather than echoed from config.pbtxt.
      if (inferd::LogEnabled(inferd::LogLevel::kVerbose)) {
        options.SetLogSeverityLevel(ORT_LOGGING_LEVEL_INFO);
      }
      std::string cuda_described;
      if (gpu) {
        std::unordered_map<std::string, std::string> ep_options(cuda_options->begin(),
                                                                cuda_options->end());
        options.AppendExecutionProvider_V2(GlobalEnv(), {*ep_device}, ep_options);
        for (const auto& [k, v] : *cuda_options) inferd::StrAppend(&cuda_described, " ", k, "=", v);
      }
      auto session =
          std::make_shared<Ort::Session>(GlobalEnv(), OnnxFilePath(spec.model_path).c_str(), options);
      LOG_INFO << "onnxruntime: model '" << spec.config->name() << "' version " << spec.version
               << " instance " << index << ": " << ort::DescribeSettings(*settings)
               << (gpu ? inferd::StrCat("; CUDA execution provider:", cuda_described) : "");
      auto status = CheckIo(*spec.config, *session);
      if (!status.ok()) return status;
      std::unique_ptr<GpuInputs> gpu_inputs;
      if (gpu) gpu_inputs = GpuInputsFor(spec, index, *ep_device, gpu_device);
      return std::unique_ptr<ModelInstance>(new OrtInstance(
          spec.config, std::move(session), *std::move(settings), gpu, std::move(gpu_inputs)));
    } catch (const std::exception& e) {  // Ort::Exception, and std::bad_alloc on a huge file
      return absl::InvalidArgumentError(inferd::StrCat("onnxruntime: failed to load '",
                                                     OnnxFilePath(spec.model_path), "': ",
                                                     e.what()));
    }
  }

  int default_max_batch_size_ = 4;  // written by Configure before any load, then read-only

  // What a GPU instance needs to read inputs on `device`, or null (it then takes host inputs,
  // as before, and logs why): the provider's device memory description and a stream.
  static std::unique_ptr<GpuInputs> GpuInputsFor(const ModelSpec& spec, int index,
                                                 const Ort::ConstEpDevice& ep_device, int device) {
    auto out = std::make_unique<GpuInputs>();
    out->device = device;
    out->memory = ep_device.GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
    std::string why;
    if (static_cast<const OrtMemoryInfo*>(out->memory) == nullptr) {
      why = "the CUDA execution provider describes no device memory";
    } else if (auto stream = gpu::SystemRuntime().CreateStream(device); !stream.ok()) {
      why = std::string(stream.status().message());
    } else {
      out->stream = *std::move(stream);
      return out;
    }
    LOG_WARNING << "onnxruntime: model '" << spec.config->name() << "' instance " << index
                << " on GPU " << device << " takes inputs in host memory only: " << why;
    return nullptr;
  }

  // Every config input and output must exist in the model file with the same data type and a
  // shape the file allows (Triton's onnxruntime backend: ValidateInputs / ValidateOutputs). The
  // shape compared is the reshape where the config has one, after the batch dimension where
  // the model batches; a dimension the file leaves variable (-1) matches any.
  static absl::Status CheckIo(const config::ModelConfig& config, Ort::Session& session) {
    auto ins = ListModelIo(session, true);
    if (!ins.ok()) return Prefixed(config, ins.status());
    auto outs = ListModelIo(session, false);
    if (!outs.ok()) return Prefixed(config, outs.status());
    const bool batching = config.max_batch_size() > 0;
    auto check = [&](bool input, const std::vector<ModelIo>& ios, const std::string& name,
                     inference::DataType type, const google::protobuf::RepeatedField<int64_t>& dims,
                     const inference::ModelTensorReshape* reshape) -> absl::Status {
      const char* kind = input ? "input" : "output";
      for (const ModelIo& io : ios) {
        if (io.name != name) continue;
        if (io.type != config::FromProto(type)) {
          return absl::InvalidArgumentError(inferd::StrCat(
              "model '", config.name(), "': ", kind, " '", name, "' is ", DataTypeName(io.type),
              " in the model file but ", config::ProtoTypeName(type), " in config.pbtxt"));
        }
        // An empty shape is a scalar or a tensor of unknown rank: ONNX Runtime does not say
        // which, so nothing is compared.
        if (io.shape.empty()) return absl::OkStatus();
        Shape expected;
        if (batching) expected.push_back(-1);
        const auto& config_dims = reshape != nullptr ? reshape->shape() : dims;
        expected.insert(expected.end(), config_dims.begin(), config_dims.end());
        bool matches = expected.size() == io.shape.size();
        for (size_t i = 0; matches && i < expected.size(); ++i) {
          // -1 in the file (variable) takes any config dim; 0 in the file (zero-size) is
          // given -1 in a config (CompleteTensorDims).
          if (io.shape[i] < 0 || (io.shape[i] == 0 && expected[i] == -1)) continue;
          if (expected[i] != io.shape[i]) matches = false;
        }
        if (!matches) {
          return absl::InvalidArgumentError(inferd::StrCat(
              "model '", config.name(), "': ", kind, " '", name, "' has shape ",
              ShapeToString(io.shape), " in the model file but config.pbtxt gives ",
              ShapeToString(expected),
              batching ? " (max_batch_size > 0 adds the batch dimension first)" : "",
              reshape != nullptr ? " (its reshape)" : ""));
        }
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", config.name(), "': ", kind, " '", name, "' in config.pbtxt is not in the model file"));
    };
    for (const auto& in : config.input()) {
      auto st = check(true, *ins, in.name(), in.data_type(), in.dims(),
                      in.has_reshape() ? &in.reshape() : nullptr);
      if (!st.ok()) return st;
    }
    for (const auto& out : config.output()) {
      auto st = check(false, *outs, out.name(), out.data_type(), out.dims(),
                      out.has_reshape() ? &out.reshape() : nullptr);
      if (!st.ok()) return st;
    }
    // And the other way (Triton's "configuration expects N inputs, model provides M"): an
    // input the file requires (an initializer with a default is not listed) that the config
    // leaves out would fail every request.
    for (const auto& io : *ins) {
      bool declared = false;
      for (const auto& in : config.input()) declared |= in.name() == io.name;
      if (!declared) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", config.name(), "': input '", io.name, "' of the model file is not in "
            "config.pbtxt (the model file requires ", ins->size(), " inputs, config.pbtxt "
            "declares ", config.input_size(), ")"));
      }
    }
    return absl::OkStatus();
  }

  static absl::Status Prefixed(const config::ModelConfig& config, const absl::Status& st) {
    return absl::InvalidArgumentError(inferd::StrCat("model '", config.name(), "': ", st.message()));
  }
};

}  // namespace

std::unique_ptr<Backend> MakeOnnxRuntimeBackend() { return std::make_unique<OnnxRuntimeBackend>(); }

}  // namespace inferd::backends
