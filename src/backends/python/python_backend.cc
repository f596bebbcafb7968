#include "backends/python/python_backend.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <variant>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "backends/batch_io.h"
#include "backends/module_backend.h"
#include "backends/tensor_places.h"
#include "gpu/copy.h"
#include "config/model_files.h"
#include "backends/python/python_stub_process.h"
#include "common/archive.h"
#include "common/http_status_hint.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/rooted_dir.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferd::backends {
namespace fs = std::filesystem;
using python::LaunchSpec;
using python::StubProcess;

namespace {

constexpr uint64_t kAlign = 64;
// The smallest staging buffer a Python instance allocates on a GPU (PlaceGpuInputs), so that
// small inputs do not reallocate it batch after batch.
constexpr uint64_t kMinStagingBytes = 1 << 20;
constexpr uint64_t kInitTimeoutNs = 300ull * 1000000000ull;  // initialize(): model downloads
constexpr uint64_t kFinalizeTimeoutNs = 5ull * 1000000000ull;
// How long each side spins on the socket for the other's next message before it sleeps.
constexpr uint64_t kDefaultSpinUs = 0;

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

void Key(JsonWriter& w, std::string_view k) { w.Key(k.data(), static_cast<rapidjson::SizeType>(k.size())); }
void Str(JsonWriter& w, std::string_view s) { w.String(s.data(), static_cast<rapidjson::SizeType>(s.size())); }

std::string_view GetString(const rapidjson::Value& v, const char* key) {
  if (!v.IsObject()) return {};
  auto it = v.FindMember(key);
  if (it == v.MemberEnd() || !it->value.IsString()) return {};
  return {it->value.GetString(), it->value.GetStringLength()};
}

int64_t GetInt(const rapidjson::Value& v, const char* key, int64_t fallback) {
  if (!v.IsObject()) return fallback;
  auto it = v.FindMember(key);
  if (it == v.MemberEnd() || !it->value.IsInt64()) return fallback;
  return it->value.GetInt64();
}

// TritonError codes (TRITONSERVER_Error_Code) to and from absl's.
absl::Status StatusFromTritonCode(int64_t code, std::string message) {
  switch (code) {
    case 2: return absl::NotFoundError(message);
    case 3: return absl::InvalidArgumentError(message);
    case 4: return absl::UnavailableError(message);
    case 5: return absl::UnimplementedError(message);
    // Triton's HTTP frontend answers 400 for these two (HttpCodeFromError); gRPC keeps the code.
    case 6: return WithHttpStatus(absl::AlreadyExistsError(message), 400);
    case 7: return absl::CancelledError(message);
    case 0: return WithHttpStatus(absl::UnknownError(message), 400);
    default: return absl::InternalError(message);
  }
}

int TritonCodeFromStatus(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kNotFound: return 2;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return 3;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded: return 4;
    case absl::StatusCode::kUnimplemented: return 5;
    case absl::StatusCode::kAlreadyExists: return 6;
    case absl::StatusCode::kCancelled: return 7;
    case absl::StatusCode::kUnknown: return 0;
    default: return 1;
  }
}

// A tensor the stub wrote: {"name", "datatype", "shape", "offset", "size"}.
struct TensorDesc {
  std::string name;
  DataType datatype = DataType::kInvalid;
  Shape shape;
  uint64_t offset = 0;
  uint64_t size = 0;
};

absl::StatusOr<TensorDesc> ParseTensorDesc(const rapidjson::Value& v) {
  TensorDesc d;
  d.name = std::string(GetString(v, "name"));
  d.datatype = DataTypeFromString(GetString(v, "datatype"));
  if (d.datatype == DataType::kInvalid) {
    return absl::InternalError(inferd::StrCat("tensor '", d.name, "' has an unknown data type"));
  }
  auto shape = v.FindMember("shape");
  if (shape != v.MemberEnd() && shape->value.IsArray()) {
    for (const auto& x : shape->value.GetArray()) d.shape.push_back(x.IsInt64() ? x.GetInt64() : -1);
  }
  d.offset = static_cast<uint64_t>(GetInt(v, "offset", 0));
  d.size = static_cast<uint64_t>(GetInt(v, "size", 0));
  return d;
}

void WriteTensorDesc(JsonWriter& w, std::string_view name, DataType type, const Shape& shape,
                     uint64_t offset, uint64_t size) {
  w.StartObject();
  Key(w, "name");
  Str(w, name);
  Key(w, "datatype");
  Str(w, DataTypeName(type));
  Key(w, "shape");
  w.StartArray();
  for (int64_t d : shape) w.Int64(d);
  w.EndArray();
  Key(w, "offset");
  w.Uint64(offset);
  Key(w, "size");
  w.Uint64(size);
  w.EndObject();
}

// Writes `tensors` into the process's region from offset 0 and their descriptors into `w`
// (as an array under the current key).
template <typename T>
absl::Status WriteTensors(StubProcess* proc, const std::vector<const T*>& tensors, JsonWriter& w) {
  uint64_t total = 0;
  for (const T* t : tensors) total = AlignUp(total + t->data.size());
  auto base = proc->Reserve(std::max<uint64_t>(total, 1));
  if (!base.ok()) return base.status();
  uint64_t off = 0;
  w.StartArray();
  for (const T* t : tensors) {
    if (!t->data.empty()) std::memcpy(*base + off, t->data.data(), t->data.size());
    WriteTensorDesc(w, t->name, t->datatype, t->shape, off, t->data.size());
    off = AlignUp(off + t->data.size());
  }
  w.EndArray();
  return absl::OkStatus();
}

// Copies the tensors a message names out of the region into one buffer; views into it.
absl::StatusOr<std::vector<core::OutputTensor>> CopyTensors(StubProcess* proc,
                                                            std::vector<TensorDesc> descs) {
  uint64_t total = 0;
  for (const TensorDesc& d : descs) total += d.size;
  auto buffer = std::make_shared<std::string>();
  buffer->resize(total);
  std::vector<core::OutputTensor> out;
  uint64_t pos = 0;
  for (const TensorDesc& d : descs) {
    auto region = proc->Region(d.offset, d.size);
    if (!region.ok()) return region.status();
    std::memcpy(buffer->data() + pos, region->data(), d.size);
    core::OutputTensor t;
    t.name = d.name;
    t.datatype = d.datatype;
    t.shape = d.shape;
    t.data = std::string_view(buffer->data() + pos, d.size);
    t.holder = buffer;
    out.push_back(std::move(t));
    pos += d.size;
  }
  return out;
}

absl::StatusOr<std::vector<core::OutputTensor>> ReadTensors(StubProcess* proc,
                                                            const rapidjson::Value& list) {
  std::vector<TensorDesc> descs;
  if (list.IsArray()) {
    for (const auto& v : list.GetArray()) {
      auto d = ParseTensorDesc(v);
      if (!d.ok()) return d.status();
      descs.push_back(*std::move(d));
    }
  }
  return CopyTensors(proc, std::move(descs));
}

absl::StatusOr<rapidjson::Document> ParseMessage(const std::string& text, std::string_view label) {
  rapidjson::Document doc;
  doc.Parse(text.data(), text.size());
  if (doc.HasParseError() || !doc.IsObject()) {
    return absl::InternalError(
        inferd::StrCat("the Python process of ", label, " sent a message that is not JSON"));
  }
  return doc;
}

// A response's parameters, a JSON object the stub checked (keys str, values bool, int or
// str, as Triton's stub checks them), onto the response. Other values are skipped.
void SetResponseParameters(std::string_view json, core::InferResponse* response) {
  if (json.empty() || json == "{}") return;
  rapidjson::Document doc;
  doc.Parse(json.data(), json.size());
  if (doc.HasParseError() || !doc.IsObject()) return;
  for (const auto& kv : doc.GetObject()) {
    core::ResponseParameter p;
    p.name.assign(kv.name.GetString(), kv.name.GetStringLength());
    if (kv.value.IsBool()) {
      p.value = kv.value.GetBool();
    } else if (kv.value.IsInt64()) {
      p.value = kv.value.GetInt64();
    } else if (kv.value.IsString()) {
      p.value = std::string(kv.value.GetString(), kv.value.GetStringLength());
    } else {
      continue;
    }
    response->parameters.push_back(std::move(p));
  }
}

// The response's parameters as the JSON object text a BLS caller's response.parameters()
// answers.
std::string ResponseParametersJson(const core::InferResponse& response) {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  for (const auto& p : response.parameters) {
    w.Key(p.name.data(), static_cast<rapidjson::SizeType>(p.name.size()));
    if (const bool* b = std::get_if<bool>(&p.value)) {
      w.Bool(*b);
    } else if (const int64_t* n = std::get_if<int64_t>(&p.value)) {
      w.Int64(*n);
    } else {
      const std::string& v = std::get<std::string>(p.value);
      w.String(v.data(), static_cast<rapidjson::SizeType>(v.size()));
    }
  }
  w.EndObject();
  return std::string(buf.GetString(), buf.GetSize());
}

// The per-request path (an execute and its answer) uses compact binary messages instead of
// JSON; everything else (initialize, BLS, logging, ...) stays JSON. A binary message starts with
// its kind byte (JSON starts with '{'). Little-endian; strings are a length then the bytes.
//   execute (to the stub): u8 1, u8 flags (1: decoupled), u16 requests; per request: str16 id,
//     u64 timeout_us, str32 parameters (JSON object), u8 sequence flags (1 START, 2 END, 4 the
//     correlation ID is a string), the correlation ID (str16 or u64), u16 inputs, u16 outputs,
//     the inputs
//     (str16 name, u8 datatype (TRITONSERVER_DataType), u8 dims, i64 x dims, u64 offset,
//     u64 size), the requested output names (str16). An input left on a GPU for model.py
//     (FORCE_CPU_ONLY_INPUT_TENSORS 'no') has kGpuInputBit set in its datatype byte, its
//     offset is inside the CUDA allocation rather than the region, and i32 device id plus the
//     64-byte cudaIpcMemHandle_t follow its size; the stub opens the handle for the call.
//   gpu_inputs_failed (JSON, from the stub instead of an answer): {"op", "message"}: it could
//     not open an input's handle (no CUDA runtime, the driver refused) and ran nothing; the
//     execute is sent again with every input in the region.
//   done (from the stub): u8 2, u8 0, u16 responses; per response: u8 0 (outputs: u16 count,
//     then tensors as above) or u8 1 (error: u8 TritonError code, str32 message).
//     A response with parameters is u8 2, str32 parameters (a JSON object), then as u8 0.
constexpr char kBinExecute = 1;
constexpr char kBinDone = 2;
constexpr uint8_t kGpuInputBit = 0x80;

class BinWriter {
 public:
  explicit BinWriter(std::string* out) : out_(out) {}
  template <typename T>
  void Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // x86/ARM Linux: little-endian
    out_->append(b, sizeof(T));
  }
  void Str16(std::string_view s) {
    Put<uint16_t>(static_cast<uint16_t>(std::min<size_t>(s.size(), 0xffff)));
    out_->append(s.data(), std::min<size_t>(s.size(), 0xffff));
  }
  void Str32(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_->append(s);
  }

 private:
  std::string* out_;
};

class BinReader {
 public:
  explicit BinReader(std::string_view in) : p_(in.data()), end_(in.data() + in.size()) {}
  template <typename T>
  T Get() {
    T v{};
    if (end_ - p_ < static_cast<ptrdiff_t>(sizeof(T))) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string_view Bytes(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) {
      ok_ = false;
      return {};
    }
    std::string_view v(p_, n);
    p_ += n;
    return v;
  }
  std::string_view Str16() { return Bytes(Get<uint16_t>()); }
  std::string_view Str32() { return Bytes(Get<uint32_t>()); }
  bool ok() const { return ok_; }

 private:
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

void PutTensorDesc(BinWriter& w, std::string_view name, DataType type, const Shape& shape,
                   uint64_t offset, uint64_t size) {
  w.Str16(name);
  w.Put<uint8_t>(static_cast<uint8_t>(type));
  w.Put<uint8_t>(static_cast<uint8_t>(shape.size()));
  for (int64_t d : shape) w.Put<int64_t>(d);
  w.Put<uint64_t>(offset);
  w.Put<uint64_t>(size);
}

absl::StatusOr<TensorDesc> GetTensorDesc(BinReader& r) {
  TensorDesc d;
  d.name = std::string(r.Str16());
  const uint8_t type = r.Get<uint8_t>();
  const uint8_t dims = r.Get<uint8_t>();
  for (uint8_t i = 0; i < dims; ++i) d.shape.push_back(r.Get<int64_t>());
  d.offset = r.Get<uint64_t>();
  d.size = r.Get<uint64_t>();
  if (!r.ok()) return absl::InternalError("a truncated tensor description");
  if (type == 0 || type > static_cast<uint8_t>(DataType::kBf16)) {
    return absl::InternalError(inferd::StrCat("tensor '", d.name, "' has an unknown data type"));
  }
  d.datatype = static_cast<DataType>(type);
  return d;
}

// One WARNING per model version whose GPU inputs cannot go to model.py through CUDA IPC (they
// are copied to the host instead), whichever instance meets it first. Thread-safe.
class IpcFallbackWarnings {
 public:
  // True the first time for `model`.
  bool First(const std::string& model) {
    inferd::MutexLock lock(&mu_);
    return warned_.insert(model).second;
  }

 private:
  inferd::Mutex mu_;
  absl::flat_hash_set<std::string> warned_ ABSL_GUARDED_BY(mu_);
};

// Settings shared by every Python model (--backend-config=python,...; SAGEMAKER_TRITON_SHM_*).
struct BackendSettings {
  uint64_t shm_default_bytes = 1 << 20;
  uint64_t shm_growth_bytes = 1 << 20;
  uint64_t spin_us = kDefaultSpinUs;  // INFERD_PYTHON_SPIN_US
};

// The interpreter and PYTHONPATH a model's EXECUTION_ENV_PATH asks for.
absl::Status ResolveEnvironment(const config::ModelConfig& cfg, const std::string& model_dir,
                                LaunchSpec* spec) {
  auto env_path = config::GetParameter(cfg, "EXECUTION_ENV_PATH");
  if (!env_path || env_path->empty()) return absl::OkStatus();
  // Inside the model's folder only (config/model_files.h), links resolved.
  absl::StatusOr<std::string> inside = config::ResolveInside(
      model_dir, "parameters EXECUTION_ENV_PATH", config::ExpandModelDirectory(*env_path, model_dir));
  if (!inside.ok()) {
    return absl::InvalidArgumentError(inferd::StrCat("model '", cfg.name(), "': ", inside.status().message()));
  }
  const std::string path = *std::move(inside);
  std::error_code ec;
  std::string root;
  if (fs::is_directory(path, ec)) {
    root = path;
  } else if (fs::is_regular_file(path, ec)) {
    // A packed environment (conda-pack, or a venv/site-packages tarball): extracted once, keyed
    // by its path, size and modification time, into a folder private to this user (a name
    // in a shared /tmp could be planted in advance). libarchive through the same extractor as
    // model archives: no shell, nothing written outside the folder. Links out of it are kept
    // (a venv's bin/python3 -> /usr/bin/python3.11): only the model's own Python follows them.
    const auto size = fs::file_size(path, ec);
    const auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
    const std::string base = inferd::StrCat(DefaultPrivateCacheDir(), "/python-env");
    if (absl::Status st = EnsurePrivateDir(base, "EXECUTION_ENV_PATH"); !st.ok()) {
      return absl::InternalError(st.message());  // the server's folder: 500, not 400
    }
    root = inferd::StrCat(base, "/", std::hash<std::string>{}(inferd::StrCat(
                                         fs::absolute(path).string(), ":", size, ":", mtime)));
    if (!fs::exists(root + "/.complete", ec)) {
      static std::atomic<uint64_t> counter{0};
      const std::string partial =
          inferd::StrCat(root, ".partial-", ::getpid(), "-", counter.fetch_add(1));
      fs::remove_all(partial, ec);
      ExtractLimits limits;
      limits.keep_links_out = true;
      if (absl::Status st = ExtractArchive(path, partial, limits); !st.ok()) {
        fs::remove_all(partial, ec);
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", cfg.name(), "': parameters EXECUTION_ENV_PATH '", *env_path,
            "' could not be extracted (expected a .tar.gz of a Python environment): ",
            st.message()));
      }
      std::ofstream(partial + "/.complete") << "ok\n";
      fs::rename(partial, root, ec);
      if (ec) fs::remove_all(partial, ec);  // another instance got there first: use its copy
    }
  } else {
    return absl::InvalidArgumentError(inferd::StrCat("model '", cfg.name(),
                                                     "': parameters EXECUTION_ENV_PATH '",
                                                     *env_path, "' does not exist"));
  }
  if (fs::exists(root + "/bin/python3", ec)) spec->python = root + "/bin/python3";
  // site-packages of the environment, whichever Python version it was packed for.
  bool found = false;
  for (const char* lib : {"/lib", "/lib64"}) {
    if (!fs::is_directory(root + lib, ec)) continue;
    for (const auto& e : fs::directory_iterator(root + lib, ec)) {
      const std::string sp = e.path().string() + "/site-packages";
      if (e.path().filename().string().rfind("python3", 0) == 0 && fs::is_directory(sp, ec)) {
        spec->python_path.push_back(sp);
        found = true;
      }
    }
  }
  if (!found) spec->python_path.push_back(root);
  return absl::OkStatus();
}

// One instance of a Python model: one stub process, a monitor thread that restarts it when it
// dies. Execute runs on the model's instance thread (one at a time); Ready and the monitor run
// on other threads, so the process handle is guarded by mu_.
class PythonInstance : public ModelInstance {
 public:
  // `gpu_inputs`: model.py takes inputs where they are, on any GPU of `gpus`, as CUDA tensors
  // (FORCE_CPU_ONLY_INPUT_TENSORS 'no' on a host with GPUs); `warnings` outlives the instance.
  PythonInstance(const ModelSpec& spec, LaunchSpec launch, const InstanceDevice& device,
                 gpu::Runtime* gpus, bool gpu_inputs, IpcFallbackWarnings* warnings)
      : spec_(spec),
        config_(*spec.config),
        launch_(std::move(launch)),
        instance_name_(device.name),
        device_(device),
        label_(inferd::StrCat("model '", config_.name(), "' instance '", instance_name_, "'")),
        gpus_(gpus),
        gpu_inputs_(gpu_inputs),
        warnings_(warnings) {
    launch_.label = label_;
  }

  std::optional<int> GpuInputsOn() const override {
    return gpu_inputs_ ? std::optional<int>(kAnyGpu) : std::nullopt;
  }

  ~PythonInstance() override { Stop(); }

  // Starts the process and runs initialize(); fails with the model's error.
  absl::Status Start() {
    auto proc = Launch();
    if (!proc.ok()) return proc.status();
    {
      inferd::MutexLock lock(&mu_);
      proc_ = *std::move(proc);
    }
    ready_.store(true);
    monitor_ = std::thread([this] { Monitor(); });
    return absl::OkStatus();
  }

  bool Ready() const override { return ready_.load(); }

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    std::shared_ptr<Proc> proc = CurrentProcess();
    if (proc == nullptr) {
      std::string why;
      {
        inferd::MutexLock lock(&mu_);
        why = last_failure_;
      }
      FailBatch(responses, absl::UnavailableError(inferd::StrCat(label_, " is not ready: ", why)));
      return;
    }
    uint64_t deadline = 0;
    for (const auto* r : requests) {
      if (r->timeout_us == 0) continue;
      const uint64_t d = r->times.received_ns + r->timeout_us * 1000;
      deadline = deadline == 0 ? d : std::min(deadline, d);
    }
    absl::Status st = RunExecute(proc.get(), requests, responses, times, deadline);
    if (st.ok()) return;
    // The process failed (died, hung past a deadline, broke the protocol): fail the batch,
    // report the instance not ready and let the monitor restart it.
    ready_.store(false);
    if (st.code() == absl::StatusCode::kDeadlineExceeded) {
      kill(proc->stub->pid(), SIGKILL);
    } else if (st.code() == absl::StatusCode::kInternal) {
      kill(proc->stub->pid(), SIGKILL);  // protocol broken: start over
    }
    std::string cause = WaitForExit(proc.get());
    const absl::StatusCode code = st.code() == absl::StatusCode::kDeadlineExceeded
                                      ? absl::StatusCode::kDeadlineExceeded
                                      : absl::StatusCode::kInternal;
    absl::Status err(code, inferd::StrCat(label_, ": the Python process ",
                                          cause.empty() ? "failed" : cause, " during execute (",
                                          st.message(), "); it is being restarted"));
    FailBatch(responses, err);
  }

 private:
  struct Proc {
    std::unique_ptr<StubProcess> stub;
    bool exited = false;      // guarded by the instance's mu_
    std::string exit_cause;   // guarded by the instance's mu_
    // The custom-metric handles this process holds (its pb_utils.MetricFamily and Metric
    // objects), released when the process is gone: its objects went with it. Only the thread
    // talking to the process at the time (load, execute, finalize: never two at once) touches
    // them.
    metrics::CustomMetrics* custom_metrics = nullptr;
    std::set<uint64_t> metric_families, metric_series;
    ~Proc() {
      if (custom_metrics == nullptr) return;
      for (uint64_t id : metric_series) custom_metrics->ReleaseMetric(id);
      for (uint64_t id : metric_families) custom_metrics->ReleaseFamily(id);
    }
  };

  std::shared_ptr<Proc> CurrentProcess() {
    inferd::MutexLock lock(&mu_);
    // A restart in progress: wait for it (a bounded time) rather than failing at once.
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](PythonInstance* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                               return !self->restarting_ || self->stopping_;
                             },
                             this),
                         absl::Seconds(60));
    if (restarting_ || stopping_ || proc_ == nullptr || proc_->exited) return nullptr;
    return proc_;
  }

  // The cause of the process's exit, once the monitor has reaped it (waits up to 2 s).
  std::string WaitForExit(Proc* proc) {
    inferd::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&proc->exited), absl::Seconds(2));
    return proc->exited ? proc->exit_cause : std::string();
  }

  absl::StatusOr<std::shared_ptr<Proc>> Launch() {
    auto stub = StubProcess::Spawn(launch_);
    if (!stub.ok()) return stub.status();
    auto proc = std::make_shared<Proc>();
    proc->stub = *std::move(stub);
    proc->custom_metrics = spec_.custom_metrics;
    {
      inferd::MutexLock lock(&mu_);
      launching_pid_ = proc->stub->pid();
    }
    absl::Status st = Initialize(proc.get());
    {
      inferd::MutexLock lock(&mu_);
      launching_pid_ = -1;
    }
    if (!st.ok()) {
      inferd::KillAndReap(proc->stub->pid());
      return st;
    }
    return proc;
  }

  absl::Status Initialize(Proc* proc) {
    StubProcess* stub = proc->stub.get();
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    w.StartObject();
    Key(w, "op");
    Str(w, "init");
    Key(w, "model_path");
    Str(w, spec_.model_path);
    Key(w, "model_dir");
    Str(w, spec_.version_dir);
    Key(w, "args");
    w.StartObject();
    const std::pair<std::string_view, std::string> args[] = {
        {"model_config", config::ModelConfigToJson(config_)},
        {"model_instance_kind", device_.gpu ? "GPU" : "CPU"},
        {"model_instance_name", instance_name_},
        {"model_instance_device_id", inferd::StrCat(device_.gpu ? device_.id : 0)},
        {"model_repository", spec_.model_dir},
        {"model_version", inferd::StrCat(spec_.version)},
        {"model_name", config_.name()},
    };
    for (const auto& [k, v] : args) {
      Key(w, k);
      Str(w, v);
    }
    w.EndObject();
    w.EndObject();
    if (auto st = stub->Send({buf.GetString(), buf.GetSize()}); !st.ok()) return st;
    for (;;) {
      auto reply = stub->Receive(core::NowNs() + kInitTimeoutNs);
      if (!reply.ok()) {
        return absl::FailedPreconditionError(inferd::StrCat(
            label_, ": the Python process did not start: ", reply.status().message(),
            " (see the log for its output)"));
      }
      auto doc = ParseMessage(*reply, label_);
      if (!doc.ok()) return doc.status();
      const std::string_view op = GetString(*doc, "op");
      if (op == "ok") return absl::OkStatus();
      if (op == "error") {
        return absl::InvalidArgumentError(inferd::StrCat(
            label_, ": initialize() failed: ", GetString(*doc, "message")));
      }
      // initialize() calls into the server as execute() does (log lines, is_model_ready,
      // load_model, metrics); it has no requests, and BLS is refused in the process.
      ModelCalls calls;
      if (absl::Status st = AnswerModelCall(proc, *doc, op, {}, 0, &calls); !st.ok()) {
        return absl::InternalError(inferd::StrCat(label_, ": initialize() failed: ",
                                                  st.message()));
      }
    }
  }

  // A custom-metric call of the model (pb_utils.MetricFamily / Metric): metric_family,
  // metric_new, metric_update and metric_value are answered ({"op":"metric"} with "id" or
  // "value", or {"op":"metric_error","message"}); metric_release (an object the model
  // deleted) comes on the socket and is not. A process reaches only the handles it made.
  // A non-OK result: the process could not be answered.
  absl::Status HandleMetricCall(Proc* proc, const rapidjson::Value& doc, std::string_view op) {
    metrics::CustomMetrics* m = proc->custom_metrics;
    auto number = [&](const char* key) -> double {
      return doc.HasMember(key) && doc[key].IsNumber() ? doc[key].GetDouble() : 0.0;
    };
    const auto id = static_cast<uint64_t>(std::max<int64_t>(GetInt(doc, "id", 0), 0));
    if (op == "metric_release") {
      if (m == nullptr) return absl::OkStatus();
      if (proc->metric_series.erase(id) > 0) m->ReleaseMetric(id);
      if (proc->metric_families.erase(id) > 0) m->ReleaseFamily(id);
      return absl::OkStatus();
    }
    absl::StatusOr<double> result = 0.0;
    if (m == nullptr) {
      result = absl::UnimplementedError("custom metrics are not available in this server");
    } else if (op == "metric_family") {
      auto family = m->NewFamily(GetString(doc, "name"), GetString(doc, "description"),
                                 static_cast<int>(GetInt(doc, "kind", -1)));
      if (family.ok()) proc->metric_families.insert(*family);
      result = family.ok() ? absl::StatusOr<double>(static_cast<double>(*family)) : family.status();
    } else if (op == "metric_new") {
      metrics::Labels labels;
      if (doc.HasMember("labels") && doc["labels"].IsObject()) {
        for (const auto& kv : doc["labels"].GetObject()) {
          labels.emplace_back(kv.name.GetString(),
                              kv.value.IsString() ? kv.value.GetString() : "");
        }
      }
      std::optional<std::vector<double>> buckets;
      if (doc.HasMember("buckets") && doc["buckets"].IsArray()) {
        buckets.emplace();
        for (const auto& b : doc["buckets"].GetArray()) {
          buckets->push_back(b.IsNumber() ? b.GetDouble() : std::nan(""));
        }
      }
      absl::StatusOr<uint64_t> metric = absl::NotFoundError("no metric family with that handle");
      if (proc->metric_families.count(id) > 0) metric = m->NewMetric(id, std::move(labels), std::move(buckets));
      if (metric.ok()) proc->metric_series.insert(*metric);
      result = metric.ok() ? absl::StatusOr<double>(static_cast<double>(*metric)) : metric.status();
    } else if (proc->metric_series.count(id) == 0) {
      result = absl::NotFoundError("no metric with that handle");
    } else if (op == "metric_value") {
      result = m->Value(id);
    } else if (op == "metric_update") {
      const std::string_view what = GetString(doc, "what");
      const double v = number("value");
      absl::Status st = what == "increment" ? m->Increment(id, v)
                        : what == "set"     ? m->Set(id, v)
                        : what == "observe" ? m->Observe(id, v)
                                            : absl::InvalidArgumentError("unknown metric update");
      result = st.ok() ? absl::StatusOr<double>(0.0) : st;
    } else {
      return absl::InternalError(inferd::StrCat("unexpected message '", op, "'"));
    }
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    w.StartObject();
    Key(w, "op");
    if (result.ok()) {
      Str(w, "metric");
      Key(w, op == "metric_value" ? "value" : "id");
      w.Double(*result);
    } else {
      Str(w, "metric_error");
      Key(w, "message");
      const absl::string_view message = result.status().message();
      Str(w, std::string_view(message.data(), message.size()));
    }
    w.EndObject();
    return proc->stub->Send({buf.GetString(), buf.GetSize()});
  }

  // pb_utils.load_model(name, config, files) / unload_model(name, unload_dependents): the
  // server's load and unload on this thread; answered {"op":"ok"} or {"op":"error",
  // "message"}. `files` come base64-encoded ("file:<path>" keys, as the repository API's).
  absl::Status HandleModelControl(StubProcess* stub, const rapidjson::Value& doc,
                                  std::string_view op) {
    const std::string name(GetString(doc, "name"));
    absl::Status st;
    if (name == config_.name()) {
      // Its own load waits for this very call (an unload, for the request in flight).
      st = absl::InvalidArgumentError(inferd::StrCat(
          "model '", name, "' cannot ", op == "load_model" ? "load" : "unload", " itself"));
    } else if (op == "load_model") {
      std::optional<std::string> config;
      if (const std::string_view c = GetString(doc, "config"); !c.empty()) config.emplace(c);
      std::map<std::string, std::string> files;
      if (doc.HasMember("files") && doc["files"].IsObject()) {
        for (const auto& kv : doc["files"].GetObject()) {
          const std::string_view key(kv.name.GetString(), kv.name.GetStringLength());
          std::string content;
          if (!key.starts_with("file:") || !kv.value.IsString() ||
              !absl::Base64Unescape(
                  absl::string_view(kv.value.GetString(), kv.value.GetStringLength()), &content)) {
            st = absl::InvalidArgumentError(inferd::StrCat(
                "load_model('", name, "'): files takes 'file:<path>' keys with bytes, got '",
                key, "'"));
            break;
          }
          files[std::string(key.substr(5))] = std::move(content);
        }
      }
      if (st.ok()) {
        st = spec_.load_model ? spec_.load_model(name, config, files)
                              : absl::UnimplementedError("this server loads no model for model.py");
      }
    } else {
      const bool dependents = doc.HasMember("unload_dependents") &&
                              doc["unload_dependents"].IsBool() &&
                              doc["unload_dependents"].GetBool();
      st = spec_.unload_model ? spec_.unload_model(name, dependents)
                              : absl::UnimplementedError("this server unloads no model for model.py");
    }
    if (st.ok()) return stub->Send(R"({"op":"ok"})");
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    w.StartObject();
    Key(w, "op");
    Str(w, "error");
    Key(w, "message");
    const absl::string_view message = st.message();
    Str(w, std::string_view(message.data(), message.size()));
    w.EndObject();
    return stub->Send({buf.GetString(), buf.GetSize()});
  }

  void HandleLog(const rapidjson::Value& doc) {
    const int64_t level = GetInt(doc, "level", 0);
    const std::string_view message = GetString(doc, "message");
    switch (level) {
      case 1: LOG_WARNING << label_ << ": " << message; break;
      case 2: LOG_ERROR << label_ << ": " << message; break;
      case 3: LOG_VERBOSE << label_ << ": " << message; break;
      default: LOG_INFO << label_ << ": " << message; break;
    }
  }

  // One BLS call a model made: the request went to the server; the completion lands here.
  struct BlsCall {
    inferd::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    std::unique_ptr<core::InferResponse> response ABSL_GUARDED_BY(mu);
    // exec(decoupled=True): every response in order, the last one with final (its response
    // may be null: the flag alone).
    bool decoupled = false;
    std::deque<std::pair<std::unique_ptr<core::InferResponse>, bool>> stream ABSL_GUARDED_BY(mu);
  };

  std::shared_ptr<BlsCall> StartBls(StubProcess* stub, const rapidjson::Value& doc,
                                    absl::Status* error) {
    auto call = std::make_shared<BlsCall>();
    if (!spec_.dispatch) {
      *error = absl::UnimplementedError("BLS calls are not available in this server");
      return nullptr;
    }
    auto req = std::make_unique<core::InferRequest>();
    req->model_name = std::string(GetString(doc, "model_name"));
    req->model_version = GetInt(doc, "model_version", -1);
    if (req->model_version <= 0) req->model_version = -1;
    req->id = std::string(GetString(doc, "id"));
    req->timeout_us = static_cast<uint64_t>(std::max<int64_t>(GetInt(doc, "timeout", 0), 0));
    req->times.received_ns = core::NowNs();
    auto inputs = doc.FindMember("inputs");
    if (inputs != doc.MemberEnd()) {
      auto tensors = ReadTensors(stub, inputs->value);
      if (!tensors.ok()) {
        *error = tensors.status();
        return nullptr;
      }
      if (!tensors->empty()) req->payload = tensors->front().holder;
      for (auto& t : *tensors) {
        core::InputTensor in;
        in.name = t.name;
        in.datatype = t.datatype;
        in.shape = t.shape;
        in.data = t.data;
        req->inputs.push_back(std::move(in));
      }
    }
    auto outputs = doc.FindMember("outputs");
    if (outputs != doc.MemberEnd() && outputs->value.IsArray()) {
      for (const auto& o : outputs->value.GetArray()) {
        if (!o.IsString()) continue;
        core::RequestedOutput out;
        out.name = o.GetString();
        req->outputs.push_back(std::move(out));
      }
    }
    if (auto p = GetString(doc, "parameters"); !p.empty() && p != "{}") req->parameters = p;
    call->decoupled = doc.HasMember("decoupled") && doc["decoupled"].IsBool() &&
                      doc["decoupled"].GetBool();
    if (call->decoupled) {
      // The called model may answer any number of times (a model that is not decoupled: once).
      req->on_response = [call](std::unique_ptr<core::InferResponse> response, bool final) {
        inferd::MutexLock lock(&call->mu);
        if (call->done) return;
        call->stream.emplace_back(std::move(response), final);
        call->done = final;
      };
      req->on_complete = [call](std::unique_ptr<core::InferResponse> response) {
        inferd::MutexLock lock(&call->mu);
        if (call->done) return;
        call->stream.emplace_back(std::move(response), true);
        call->done = true;
      };
    } else {
      req->on_complete = [call](std::unique_ptr<core::InferResponse> response) {
        inferd::MutexLock lock(&call->mu);
        call->response = std::move(response);
        call->done = true;
      };
    }
    spec_.dispatch(std::move(req));
    return call;
  }

  // Waits for `call` and writes its result (outputs into the region) as the reply.
  absl::Status FinishBls(StubProcess* stub, BlsCall* call, uint64_t deadline) {
    std::unique_ptr<core::InferResponse> response;
    {
      inferd::MutexLock lock(&call->mu);
      auto cond = absl::Condition(&call->done);
      if (deadline == 0) {
        call->mu.Await(cond);
      } else {
        const uint64_t now = core::NowNs();
        call->mu.AwaitWithTimeout(cond, absl::Nanoseconds(deadline > now ? deadline - now : 0));
      }
      if (!call->done) {
        return absl::DeadlineExceededError("a BLS call did not finish before the request's timeout");
      }
      response = std::move(call->response);
    }
    return SendBlsResult(stub, response.get(), nullptr);
  }

  // The "bls_result" reply for one response (null: an empty one, the bare final flag of a
  // decoupled call); `final` set for a decoupled call's responses.
  absl::Status SendBlsResult(StubProcess* stub, const core::InferResponse* response,
                             const bool* final) {
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    w.StartObject();
    Key(w, "op");
    Str(w, "bls_result");
    if (final != nullptr) {
      Key(w, "final");
      w.Bool(*final);
    }
    if (response == nullptr) {
      Key(w, "outputs");
      w.StartArray();
      w.EndArray();
    } else if (!response->status.ok()) {
      Key(w, "error");
      Str(w, std::string(response->status.message()));
      Key(w, "code");
      w.Int(TritonCodeFromStatus(response->status));
    } else {
      std::vector<const core::OutputTensor*> outs;
      for (const auto& o : response->outputs) outs.push_back(&o);
      Key(w, "outputs");
      if (auto st = WriteTensors(stub, outs, w); !st.ok()) return st;
      if (!response->parameters.empty()) {
        Key(w, "parameters");
        Str(w, ResponseParametersJson(*response));
      }
    }
    w.EndObject();
    return stub->Send({buf.GetString(), buf.GetSize()});
  }

  // The next response of a decoupled BLS call (waits for it); `*final` when it was the last.
  absl::Status NextBlsResponse(StubProcess* stub, BlsCall* call, uint64_t deadline, bool* final) {
    std::unique_ptr<core::InferResponse> response;
    {
      inferd::MutexLock lock(&call->mu);
      auto cond = absl::Condition(
          +[](std::deque<std::pair<std::unique_ptr<core::InferResponse>, bool>>* q) {
            return !q->empty();
          },
          &call->stream);
      if (deadline == 0) {
        call->mu.Await(cond);
      } else {
        const uint64_t now = core::NowNs();
        call->mu.AwaitWithTimeout(cond, absl::Nanoseconds(deadline > now ? deadline - now : 0));
      }
      if (call->stream.empty()) {
        return absl::DeadlineExceededError(
            "a BLS call did not answer before the request's timeout");
      }
      response = std::move(call->stream.front().first);
      *final = call->stream.front().second;
      call->stream.pop_front();
    }
    return SendBlsResult(stub, response.get(), final);
  }

  absl::Status SendBlsError(StubProcess* stub, const absl::Status& error) {
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    w.StartObject();
    Key(w, "op");
    Str(w, "bls_result");
    Key(w, "error");
    Str(w, std::string(error.message()));
    Key(w, "code");
    w.Int(TritonCodeFromStatus(error));
    w.EndObject();
    return stub->Send({buf.GetString(), buf.GetSize()});
  }

  // One execute round trip (plus whatever BLS, logging and readiness calls the model makes
  // meanwhile). A non-OK result means the process itself failed; the model's own errors are
  // set on the responses.
  absl::Status RunExecute(Proc* proc, std::span<core::InferRequest* const> requests,
                          std::span<core::InferResponse* const> responses, ExecutionTimes* times,
                          uint64_t deadline) {
    StubProcess* stub = proc->stub.get();
    // Inputs on a GPU: their CUDA IPC handles, or a host copy where there is none. An input
    // that reaches model.py neither way fails the batch (the process is fine).
    std::vector<std::optional<gpu::IpcExport>> exports;
    if (absl::Status st = PlaceGpuInputs(requests, &exports); !st.ok()) {
      FailBatch(responses, st);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(WriteExecute(stub, requests, exports, &message_));
    times->input_end_ns = core::NowNs();
    RETURN_IF_ERROR(stub->Send(message_));

    ModelCalls calls;
    for (;;) {
      auto reply = stub->Receive(deadline);
      if (!reply.ok()) return reply.status();
      if (!reply->empty() && (*reply)[0] == kBinDone) {
        times->output_start_ns = core::NowNs();
        return CollectBinaryResponses(stub, *reply, requests, responses);
      }
      auto parsed = ParseMessage(*reply, label_);
      if (!parsed.ok()) return parsed.status();
      const rapidjson::Document& doc = *parsed;
      const std::string_view op = GetString(doc, "op");
      if (op == "done") {
        times->output_start_ns = core::NowNs();
        return CollectResponses(stub, doc, requests, responses);
      }
      if (op == "gpu_inputs_failed") {
        // The process could not open an input's CUDA IPC handle and ran nothing: from now on
        // this instance sends host copies; this execute goes again with them.
        ipc_off_ = true;
        WarnIpcFallback(GetString(doc, "message"));
        if (absl::Status st = PlaceGpuInputs(requests, &exports); !st.ok()) {
          FailBatch(responses, st);
          return absl::OkStatus();
        }
        RETURN_IF_ERROR(WriteExecute(stub, requests, exports, &message_));
        RETURN_IF_ERROR(stub->Send(message_));
        continue;
      }
      if (op == "error") {
        // The stub could not run execute at all (a bug in the message or the model module).
        FailBatch(responses, absl::InternalError(inferd::StrCat(
                                 "Failed to process the request(s) for ", label_,
                                 ", message: ", GetString(doc, "message"))));
        return absl::OkStatus();
      }
      RETURN_IF_ERROR(AnswerModelCall(proc, doc, op, requests, deadline, &calls));
    }
  }

  // The execute message (binary): every request's id, timeout, parameters, input descriptors
  // and requested output names; the input bytes go into the process's region, each request's
  // tensors at aligned offsets (the model sees each request on its own, as Triton's Python
  // backend shows them: no batch is gathered). `msg` is reused: its capacity stays.
  // `exports` (PlaceGpuInputs): one entry per input of every request in order, set for an
  // input that stays on its GPU.
  absl::Status WriteExecute(StubProcess* stub, std::span<core::InferRequest* const> requests,
                            const std::vector<std::optional<gpu::IpcExport>>& exports,
                            std::string* msg) {
    msg->clear();
    BinWriter w(msg);
    w.Put<uint8_t>(kBinExecute);
    w.Put<uint8_t>(config_.model_transaction_policy().decoupled() ? 1 : 0);
    w.Put<uint16_t>(static_cast<uint16_t>(requests.size()));
    uint64_t total = 0;
    size_t k = 0;
    for (const auto* r : requests) {
      for (const auto& in : r->inputs) {
        if (!exports[k++].has_value()) total = AlignUp(total + in.data.size());
      }
    }
    auto base = stub->Reserve(std::max<uint64_t>(total, 1));
    if (!base.ok()) return base.status();
    uint64_t off = 0;
    k = 0;
    for (const auto* r : requests) {
      w.Str16(r->id);
      w.Put<uint64_t>(r->timeout_us);
      w.Str32(r->parameters);
      // The sequence batcher's correlation ID and START/END flags (request.correlation_id(),
      // request.flags()).
      w.Put<uint8_t>(static_cast<uint8_t>((r->sequence_start ? 1 : 0) | (r->sequence_end ? 2 : 0) |
                                          (r->sequence_id.is_string ? 4 : 0)));
      if (r->sequence_id.is_string) {
        w.Str16(r->sequence_id.text);
      } else {
        w.Put<uint64_t>(r->sequence_id.number);
      }
      w.Put<uint16_t>(static_cast<uint16_t>(r->inputs.size()));
      w.Put<uint16_t>(static_cast<uint16_t>(r->outputs.empty() ? config_.output_size()
                                                               : r->outputs.size()));
      for (const auto& in : r->inputs) {
        if (const std::optional<gpu::IpcExport>& ex = exports[k++]; ex.has_value()) {
          w.Str16(in.name);
          w.Put<uint8_t>(static_cast<uint8_t>(in.datatype) | kGpuInputBit);
          w.Put<uint8_t>(static_cast<uint8_t>(in.shape.size()));
          for (int64_t d : in.shape) w.Put<int64_t>(d);
          w.Put<uint64_t>(ex->offset);
          w.Put<uint64_t>(in.data.size());
          w.Put<int32_t>(in.place.device_id);
          msg->append(ex->handle);
          continue;
        }
        if (!in.data.empty()) std::memcpy(*base + off, in.data.data(), in.data.size());
        PutTensorDesc(w, in.name, in.datatype, in.shape, off, in.data.size());
        off = AlignUp(off + in.data.size());
      }
      if (r->outputs.empty()) {
        for (const auto& o : config_.output()) w.Str16(o.name());
      } else {
        for (const auto& o : r->outputs) w.Str16(o.name);
      }
    }
    return absl::OkStatus();
  }

  // For each input of `requests` (in order) on a GPU: its CUDA IPC handle in `exports`, which
  // the process opens to hand model.py a CUDA tensor over the same memory (the request holds
  // that memory until Execute returns, and the process answers before that, a decoupled model
  // included). Memory the runtime cannot export (a CUDA shared-memory region, which is itself
  // mapped from a client's handle; an allocator's pool) is first copied, device to device, into
  // this instance's staging buffer on the same GPU, which can be exported (StageInputs), as
  // Triton's Python backend copies such inputs into its CUDA memory pool. Where neither works
  // (no driver, the staging copy failed, or the process could not open a handle before:
  // ipc_off_), the request's GPU inputs are copied to the host (one WARNING per model) and their
  // entries stay empty. Host inputs: empty entries. The error names the input that reaches
  // model.py neither way.
  absl::Status PlaceGpuInputs(std::span<core::InferRequest* const> requests,
                              std::vector<std::optional<gpu::IpcExport>>* exports) {
    exports->clear();
    std::vector<StagedInput> staged;
    for (core::InferRequest* r : requests) {
      const size_t first = exports->size();
      bool to_host = false;
      std::string why;
      for (auto& in : r->inputs) {
        if (in.place.OnHost()) {
          exports->emplace_back();
          continue;
        }
        if (in.data.empty()) {  // nothing to map: an empty host tensor
          in.place = MemoryPlace::Host();
          exports->emplace_back();
          continue;
        }
        if (!to_host && !ipc_off_) {
          absl::StatusOr<gpu::IpcExport> ex =
              gpus_->IpcGetMemHandle(in.place.device_id, in.data.data());
          if (ex.ok()) {
            exports->push_back(*std::move(ex));
            continue;
          }
          if (!staging_off_ && !absl::IsUnimplemented(ex.status())) {
            staged.push_back({exports->size(), in.place.device_id, in.data, in.name});
            exports->emplace_back();
            continue;
          }
          why = inferd::StrCat("input '", in.name, "' on ", in.place.ToString(), ": ",
                               ex.status().message());
          WarnIpcFallback(why);
        }
        to_host = true;
        exports->emplace_back();
      }
      if (!to_host) continue;
      exports->resize(first, std::nullopt);
      if (absl::Status st = PlaceInputsFor(gpus_, r, std::nullopt); !st.ok()) {
        return absl::InternalError(inferd::StrCat(
            label_, ": ", st.message(), " (model.py cannot read it on the GPU either: ",
            why.empty() ? "the Python process could not open CUDA IPC handles" : why, ")"));
      }
      exports->resize(first + r->inputs.size(), std::nullopt);
    }
    if (staged.empty()) return absl::OkStatus();
    if (absl::Status st = StageInputs(staged, exports); !st.ok()) {
      // No staging from now on (the device is out of memory, or exports fail): this batch and
      // the next go the host way, which the second pass takes.
      staging_off_ = true;
      WarnIpcFallback(std::string(st.message()));
      return PlaceGpuInputs(requests, exports);
    }
    return absl::OkStatus();
  }

  // An input the runtime could not export: where its entry in `exports` is, and its bytes.
  struct StagedInput {
    size_t index;
    int device;
    std::string_view data;
    std::string_view name;
  };

  // Copies each of `staged` (device to device, waited for) into staging_'s buffer on its GPU at
  // aligned offsets, growing the buffer where the batch needs more, and sets its entry in
  // `exports` to the buffer's handle and the copy's offset. The buffer is reused by the next
  // call (Execute runs on one thread at a time, and the process has closed its mappings by the
  // time Execute returns).
  absl::Status StageInputs(std::span<const StagedInput> staged,
                           std::vector<std::optional<gpu::IpcExport>>* exports) {
    std::map<int, uint64_t> need;  // device -> bytes
    std::vector<uint64_t> offsets;
    offsets.reserve(staged.size());
    for (const StagedInput& s : staged) {
      uint64_t& end = need[s.device];
      offsets.push_back(end);
      end = AlignUp(end + s.data.size());
    }
    std::map<int, gpu::IpcExport> handles;
    for (const auto& [device, bytes] : need) {
      std::unique_ptr<gpu::DeviceBuffer>& buffer = staging_[device];
      if (buffer == nullptr || buffer->size() < bytes) {
        buffer.reset();  // freed before its successor is allocated
        absl::StatusOr<std::unique_ptr<gpu::DeviceBuffer>> grown =
            gpus_->AllocateDevice(device, std::max<uint64_t>(bytes, kMinStagingBytes));
        if (!grown.ok()) {
          return absl::ResourceExhaustedError(inferd::StrCat(
              "staging ", bytes, " bytes on GPU ", device, ": ", grown.status().message()));
        }
        buffer = *std::move(grown);
      }
      absl::StatusOr<gpu::IpcExport> ex = gpus_->IpcGetMemHandle(device, buffer->data());
      if (!ex.ok()) {
        return absl::InternalError(inferd::StrCat("exporting the staging buffer on GPU ", device,
                                                  ": ", ex.status().message()));
      }
      handles[device] = *std::move(ex);
    }
    for (size_t i = 0; i < staged.size(); ++i) {
      const StagedInput& s = staged[i];
      char* dst = static_cast<char*>(staging_[s.device]->data()) + offsets[i];
      const MemoryPlace gpu = MemoryPlace::Gpu(s.device);
      if (absl::Status st = gpu::CopyNow(gpus_, dst, gpu, s.data.data(), gpu, s.data.size());
          !st.ok()) {
        return absl::InternalError(inferd::StrCat("staging input '", s.name, "' on GPU ",
                                                  s.device, ": ", st.message()));
      }
      gpu::IpcExport ex = handles[s.device];
      ex.offset += offsets[i];
      (*exports)[s.index] = std::move(ex);
    }
    return absl::OkStatus();
  }

  void WarnIpcFallback(std::string_view why) {
    if (!warnings_->First(inferd::StrCat(config_.name(), ":", spec_.version))) return;
    LOG_WARNING << "model '" << config_.name() << "': parameters FORCE_CPU_ONLY_INPUT_TENSORS "
                << "'no': an input on a GPU could not be handed to model.py through CUDA IPC ("
                << why << "); such inputs are copied to the host, and model.py receives them in "
                << "host memory";
  }

  // The BLS calls a model started during one execute and has not awaited yet.
  struct ModelCalls {
    std::map<int64_t, std::shared_ptr<BlsCall>> pending;
    int64_t next_call = 0;
  };

  // Answers a call the model makes into the server while execute() runs: a log line, a
  // readiness or cancellation check, a BLS call, a decoupled response. A non-OK result means
  // the process broke the protocol or went away.
  absl::Status AnswerModelCall(Proc* proc, const rapidjson::Document& doc,
                               std::string_view op, std::span<core::InferRequest* const> requests,
                               uint64_t deadline, ModelCalls* calls) {
    StubProcess* stub = proc->stub.get();
    if (op == "log") {
      HandleLog(doc);
    } else if (op.starts_with("metric_")) {
      RETURN_IF_ERROR(HandleMetricCall(proc, doc, op));
    } else if (op == "load_model" || op == "unload_model") {
      RETURN_IF_ERROR(HandleModelControl(stub, doc, op));
    } else if (op == "is_model_ready") {
      bool ready = false;
      if (spec_.is_model_ready) {
        int64_t version = -1;
        const std::string_view v = GetString(doc, "version");
        if (!v.empty() && !absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &version)) version = -2;
        ready = version != -2 &&
                spec_.is_model_ready(std::string(GetString(doc, "name")), version > 0 ? version : -1);
      }
      RETURN_IF_ERROR(stub->Send(ready ? R"({"op":"ready","ready":true})"
                                          : R"({"op":"ready","ready":false})"));
    } else if (op == "bls") {
      absl::Status error;
      auto call = StartBls(stub, doc, &error);
      const bool wait = doc.HasMember("wait") && doc["wait"].IsBool() && doc["wait"].GetBool();
      if (call == nullptr) {
        RETURN_IF_ERROR(SendBlsError(stub, error));
      } else if (wait) {
        RETURN_IF_ERROR(FinishBls(stub, call.get(), deadline));
      } else {
        const int64_t id = calls->next_call++;
        calls->pending[id] = std::move(call);
        RETURN_IF_ERROR(stub->Send(inferd::StrCat(R"({"op":"bls_id","call":)", id, "}")));
      }
    } else if (op == "bls_next") {
      auto it = calls->pending.find(GetInt(doc, "call", -1));
      if (it == calls->pending.end() || !it->second->decoupled) {
        RETURN_IF_ERROR(SendBlsError(stub, absl::InvalidArgumentError(
                                                  "this BLS call has no more responses")));
      } else {
        bool final = false;
        std::shared_ptr<BlsCall> call = it->second;
        RETURN_IF_ERROR(NextBlsResponse(stub, call.get(), deadline, &final));
        if (final) calls->pending.erase(it);
      }
    } else if (op == "bls_wait") {
      auto it = calls->pending.find(GetInt(doc, "call", -1));
      if (it == calls->pending.end() || it->second->decoupled) {
        RETURN_IF_ERROR(SendBlsError(stub, absl::InvalidArgumentError(
                                                  "this BLS call was already awaited")));
      } else {
        auto call = std::move(it->second);
        calls->pending.erase(it);
        RETURN_IF_ERROR(FinishBls(stub, call.get(), deadline));
      }
    } else if (op == "is_cancelled") {
      // request.is_cancelled() / the response sender's: the client went away.
      const int64_t index = GetInt(doc, "request", -1);
      bool cancelled = false;
      if (index >= 0 && static_cast<size_t>(index) < requests.size()) {
        const core::InferRequest& r = *requests[static_cast<size_t>(index)];
        cancelled = r.IsCancelled() ||
                    (r.response_sender != nullptr && r.response_sender->IsCancelled());
      }
      RETURN_IF_ERROR(stub->Send(cancelled ? R"({"op":"cancelled","cancelled":true})"
                                           : R"({"op":"cancelled","cancelled":false})"));
    } else if (op == "send") {
      RETURN_IF_ERROR(HandleSend(stub, doc, requests));
      RETURN_IF_ERROR(stub->Send(R"({"op":"ok"})"));
    } else {
      return absl::InternalError(inferd::StrCat("unexpected message '", op, "'"));
    }
    return absl::OkStatus();
  }

  // A response of a decoupled model (get_response_sender().send), during or after execute().
  absl::Status HandleSend(StubProcess* stub, const rapidjson::Document& doc,
                          std::span<core::InferRequest* const> requests) {
    const int64_t index = GetInt(doc, "request", -1);
    if (index < 0 || static_cast<size_t>(index) >= requests.size()) {
      return absl::InternalError("a response for a request that is not in this execute");
    }
    const core::InferRequest& req = *requests[static_cast<size_t>(index)];
    if (req.response_sender == nullptr) return absl::OkStatus();  // not decoupled here
    const bool final = doc.HasMember("final") && doc["final"].IsBool() && doc["final"].GetBool();
    std::unique_ptr<core::InferResponse> response;
    if (doc.HasMember("error")) {
      response = req.response_sender->MakeResponse();
      response->status =
          StatusFromTritonCode(GetInt(doc, "code", 1), std::string(GetString(doc, "error")));
    } else if (doc.HasMember("outputs")) {
      response = req.response_sender->MakeResponse();
      auto tensors = ReadTensors(stub, doc["outputs"]);
      if (!tensors.ok()) return tensors.status();
      AddRequestedOutputs(req, *std::move(tensors), response.get());
      SetResponseParameters(GetString(doc, "parameters"), response.get());
    }
    absl::Status st = req.response_sender->Send(std::move(response), final);
    if (!st.ok()) {
      LOG_WARNING << label_ << ": a response could not be sent: " << st.message();
    }
    return absl::OkStatus();
  }

  absl::Status CollectResponses(StubProcess* stub, const rapidjson::Document& doc,
                                std::span<core::InferRequest* const> requests,
                                std::span<core::InferResponse* const> responses) {
    const std::string_view batch_error = GetString(doc, "error");
    if (!batch_error.empty()) {
      FailBatch(responses, absl::InternalError(inferd::StrCat(
                               "Failed to process the request(s) for ", label_,
                               ", message: ", batch_error)));
      return absl::OkStatus();
    }
    if (config_.model_transaction_policy().decoupled()) return absl::OkStatus();
    auto list = doc.FindMember("responses");
    if (list == doc.MemberEnd() || !list->value.IsArray() ||
        list->value.Size() != responses.size()) {
      return absl::InternalError("the Python process answered a different number of responses");
    }
    for (size_t i = 0; i < responses.size(); ++i) {
      const rapidjson::Value& v = list->value[static_cast<rapidjson::SizeType>(i)];
      core::InferResponse& resp = *responses[i];
      if (v.HasMember("error")) {
        resp.status = StatusFromTritonCode(GetInt(v, "code", 1), std::string(GetString(v, "error")));
        continue;
      }
      auto outs = v.FindMember("outputs");
      if (outs == v.MemberEnd()) continue;
      auto tensors = ReadTensors(stub, outs->value);
      if (!tensors.ok()) return tensors.status();
      AddRequestedOutputs(*requests[i], *std::move(tensors), &resp);
    }
    return absl::OkStatus();
  }

  absl::Status CollectBinaryResponses(StubProcess* stub, std::string_view message,
                                      std::span<core::InferRequest* const> requests,
                                      std::span<core::InferResponse* const> responses) {
    BinReader r(message);
    r.Get<uint8_t>();
    r.Get<uint8_t>();
    const uint16_t count = r.Get<uint16_t>();
    if (!r.ok() || count != responses.size()) {
      return absl::InternalError("the Python process answered a different number of responses");
    }
    for (size_t i = 0; i < responses.size(); ++i) {
      core::InferResponse& resp = *responses[i];
      const uint8_t kind = r.Get<uint8_t>();
      if (kind == 1) {
        const uint8_t code = r.Get<uint8_t>();
        resp.status = StatusFromTritonCode(code, std::string(r.Str32()));
        if (!r.ok()) return absl::InternalError("a truncated response from the Python process");
        continue;
      }
      if (kind == 2) SetResponseParameters(r.Str32(), &resp);
      const uint16_t n = r.Get<uint16_t>();
      std::vector<TensorDesc> descs;
      descs.reserve(n);
      for (uint16_t k = 0; k < n; ++k) {
        auto d = GetTensorDesc(r);
        if (!d.ok()) return d.status();
        descs.push_back(*std::move(d));
      }
      auto tensors = CopyTensors(stub, std::move(descs));
      if (!tensors.ok()) return tensors.status();
      AddRequestedOutputs(*requests[i], *std::move(tensors), &resp);
    }
    return absl::OkStatus();
  }

  // Reaps the process; when it dies outside a shutdown, starts a new one (retrying with a
  // growing pause) and reports the instance ready again once initialize() has run.
  void Monitor() {
    for (;;) {
      std::shared_ptr<Proc> proc;
      {
        inferd::MutexLock lock(&mu_);
        proc = proc_;
      }
      const std::string cause =
          inferd::DescribeWaitStatus(inferd::WaitForExit(proc->stub->pid()));
      {
        inferd::MutexLock lock(&mu_);
        proc->exited = true;
        proc->exit_cause = cause;
        if (stopping_) return;
        restarting_ = true;
        last_failure_ = inferd::StrCat("the Python process ", cause);
      }
      ready_.store(false);
      LOG_WARNING << label_ << ": the Python process " << cause << "; restarting it";
      absl::Duration pause = absl::Milliseconds(100);
      for (;;) {
        auto next = Launch();
        inferd::MutexLock lock(&mu_);
        if (next.ok()) {
          if (stopping_) {
            inferd::KillAndReap((*next)->stub->pid());
            restarting_ = false;
            return;
          }
          proc_ = *std::move(next);
          restarting_ = false;
          ready_.store(true);
          LOG_INFO << label_ << ": the Python process is running again";
          break;
        }
        last_failure_ = std::string(next.status().message());
        LOG_ERROR << label_ << ": restart failed: " << next.status().message();
        if (stopping_) {
          restarting_ = false;
          return;
        }
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), pause);
        if (stopping_) {
          restarting_ = false;
          return;
        }
        pause = std::min(pause * 2, absl::Seconds(10));
      }
    }
  }

  void Stop() {
    std::shared_ptr<Proc> proc;
    bool restarting;
    {
      inferd::MutexLock lock(&mu_);
      stopping_ = true;
      proc = proc_;
      restarting = restarting_;
      if (launching_pid_ > 0) kill(launching_pid_, SIGKILL);
    }
    if (proc != nullptr && !restarting) {
      // finalize(), then the process exits by itself.
      bool exited;
      {
        inferd::MutexLock lock(&mu_);
        exited = proc->exited;
      }
      if (!exited && proc->stub->Send(R"({"op":"finalize"})").ok()) {
        // The log lines finalize() wrote (its error, as Triton logs it) come before the answer.
        const uint64_t deadline = core::NowNs() + kFinalizeTimeoutNs;
        for (;;) {
          auto reply = proc->stub->Receive(deadline);
          if (!reply.ok()) break;
          auto doc = ParseMessage(*reply, label_);
          if (!doc.ok()) break;
          const std::string_view op = GetString(*doc, "op");
          if (op == "ok" || op == "error") break;
          ModelCalls calls;
          if (!AnswerModelCall(proc.get(), *doc, op, {}, 0, &calls).ok()) break;
        }
      }
      inferd::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&proc->exited), absl::Seconds(5));
      if (!proc->exited) kill(proc->stub->pid(), SIGKILL);
    }
    if (monitor_.joinable()) monitor_.join();
  }


  const ModelSpec spec_;
  const config::ModelConfig& config_;
  LaunchSpec launch_;
  const std::string instance_name_;
  const InstanceDevice device_;  // where the config placed it; model.py reads it from args
  const std::string label_;
  std::atomic<bool> ready_{false};
  std::thread monitor_;
  inferd::Mutex mu_;
  std::shared_ptr<Proc> proc_ ABSL_GUARDED_BY(mu_);
  bool restarting_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  pid_t launching_pid_ ABSL_GUARDED_BY(mu_) = -1;
  std::string last_failure_ ABSL_GUARDED_BY(mu_);
  std::string message_;  // the execute message, reused (Execute runs on one thread at a time)
  gpu::Runtime* const gpus_;
  const bool gpu_inputs_;
  IpcFallbackWarnings* const warnings_;
  // The process could not open a CUDA IPC handle: GPU inputs go as host copies from then on.
  // Read and written by Execute only (one thread at a time).
  bool ipc_off_ = false;
  // Per GPU, device memory this instance allocated for inputs the runtime cannot export
  // (StageInputs); grown to the largest batch's need, freed with the instance. Execute only.
  std::map<int, std::unique_ptr<gpu::DeviceBuffer>> staging_;
  // Staging failed (no memory, no export): such inputs go as host copies from then on.
  bool staging_off_ = false;
};

class PythonBackend : public Backend {
 public:
  // `backend_file`: a Python-based backend's model.py (Triton's <backend dir>/<name>/model.py),
  // run for every model with `backend: "<name>"`; empty for the "python" backend, whose
  // models bring their own.
  PythonBackend(gpu::Runtime* gpus, std::string name, std::string backend_file)
      : gpus_(gpus), name_(std::move(name)), backend_file_(std::move(backend_file)) {
    // SageMaker's Triton container names (its serve script turns them into --backend-config).
    ReadSize("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE", &settings_.shm_default_bytes);
    ReadSize("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE", &settings_.shm_growth_bytes);
    if (const char* v = std::getenv("INFERD_PYTHON_SPIN_US"); v != nullptr) {
      (void)absl::SimpleAtoi(v, &settings_.spin_us);
    }
  }

  std::string_view name() const override { return name_; }
  bool AutoCompletesWithoutModelFile() const override { return !backend_file_.empty(); }
  bool CreatesInstancesConcurrently() const override { return true; }
  bool SupportsDecoupled() const override { return true; }

  absl::StatusOr<std::vector<std::string>> Configure(
      const std::map<std::string, std::string>& settings) override {
    std::vector<std::string> unread;
    for (const auto& [key, value] : settings) {
      uint64_t* target = key == "shm-default-byte-size"  ? &settings_.shm_default_bytes
                         : key == "shm-growth-byte-size" ? &settings_.shm_growth_bytes
                                                         : nullptr;
      if (target == nullptr) {
        unread.push_back(key);
        continue;
      }
      if (!absl::SimpleAtoi(absl::string_view(value), target) || *target == 0) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "--backend-config: python's ", key, " takes a positive byte count, got '", value, "'"));
      }
    }
    return unread;
  }

  absl::Status AutoCompleteConfig(const std::string& repository_path,
                                  config::ModelConfig* config) override {
    // A Python-based backend's file stands in for the model's own; the model's folder stays
    // what the environment and get_model_dir() see.
    const std::string& model_path = backend_file_.empty() ? repository_path : backend_file_;
    // Starting Python costs ~0.1 s: only when the file defines auto_complete_config.
    std::ifstream in(model_path);
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find("auto_complete_config") == std::string::npos) return absl::OkStatus();
    const std::string model_dir = fs::path(repository_path).parent_path().parent_path().string();
    LaunchSpec launch = BaseLaunch(inferd::StrCat("model '", config->name(), "' (auto-complete)"));
    RETURN_IF_ERROR(ResolveEnvironment(*config, model_dir, &launch));
    auto stub = StubProcess::Spawn(launch);
    if (!stub.ok()) return stub.status();
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    w.StartObject();
    Key(w, "op");
    Str(w, "auto_complete");
    Key(w, "model_path");
    Str(w, model_path);
    Key(w, "model_dir");
    Str(w, fs::path(repository_path).parent_path().string());
    Key(w, "name");
    Str(w, config->name());
    Key(w, "config");
    Str(w, config::ModelConfigToJson(*config));
    w.EndObject();
    absl::Status st = (*stub)->Send({buf.GetString(), buf.GetSize()});
    absl::StatusOr<std::string> reply = st.ok() ? (*stub)->Receive(core::NowNs() + kInitTimeoutNs)
                                                : absl::StatusOr<std::string>(st);
    (void)(*stub)->Send(R"({"op":"finalize"})");
    const pid_t pid = (*stub)->pid();
    stub->reset();  // closes the socket: the stub exits on EOF
    inferd::WaitForExit(pid);
    if (!reply.ok()) return reply.status();
    auto doc = ParseMessage(*reply, config->name());
    if (!doc.ok()) return doc.status();
    if (GetString(*doc, "op") != "ok") {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", config->name(), "': auto_complete_config failed: ", GetString(*doc, "message")));
    }
    auto completed = config::ParseModelConfigJson(GetString(*doc, "config"));
    if (!completed.ok()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", config->name(), "': auto_complete_config returned a configuration that does "
          "not parse: ", completed.status().message()));
    }
    *config = *std::move(completed);
    return absl::OkStatus();
  }

  // Triton's Python backend takes KIND_GPU: model.py still runs in its process on the CPU, and
  // args["model_instance_kind"] == "GPU" with "model_instance_device_id" tell it which GPU to put
  // its own work on (torch, CuPy).
  absl::Status GpuInstanceSupport() const override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    // Triton's instance names: <group name>_<index within the group>.
    int first = 0;
    for (const auto& g : spec.config->instance_group()) {
      if (&g == &group) break;
      first += g.count();
    }
    return CreateInstanceOn(spec, group, index,
                            InstanceDevice{false, 0, inferd::StrCat(group.name(), "_", index - first)});
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstanceOn(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const InstanceDevice& device) override {
    // model.py receives the whole config (args["model_config"]) and reads its own keys
    // (tokenizer paths, thresholds), as in Triton: every key passes, with no warning.
    static constexpr ConfigSupport kSupport{.backend_checks_parameters = true};
    RETURN_IF_ERROR(CheckConfigSupport(spec, name(), kSupport, index));
    const config::ModelConfig& cfg = *spec.config;
    gpu::Runtime& gpus = gpus_ != nullptr ? *gpus_ : gpu::SystemRuntime();
    bool gpu_inputs = false;
    if (auto force = config::GetParameter(cfg, "FORCE_CPU_ONLY_INPUT_TENSORS"); force) {
      if (*force != "yes" && *force != "no") {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", cfg.name(), "': parameters FORCE_CPU_ONLY_INPUT_TENSORS takes 'yes' or "
            "'no', got '", *force, "'"));
      }
      // 'no', as in Triton: an input on a GPU (an ensemble step's GPU output, a CUDA
      // shared-memory region) reaches model.py there, as a CUDA tensor, through a CUDA IPC
      // handle; host inputs stay host tensors. Without a GPU there is nothing to hand over:
      // one WARNING per version (instance 0).
      if (*force == "no") {
        gpu_inputs = gpus.DeviceCount() > 0;
        if (!gpu_inputs && index == 0) {
          LOG_WARNING << "model '" << cfg.name() << "': parameters FORCE_CPU_ONLY_INPUT_TENSORS "
                      << "'no' has no effect on this host (no GPU: " << gpus.UnavailableReason()
                      << "): model.py receives its inputs in host memory";
        }
      }
    }
    ModelSpec own = spec;
    if (!backend_file_.empty()) own.model_path = backend_file_;
    std::error_code ec;
    if (!fs::is_regular_file(own.model_path, ec)) {
      return absl::NotFoundError(inferd::StrCat("model '", cfg.name(), "': '", own.model_path,
                                                "' not found"));
    }
    LaunchSpec launch = BaseLaunch("");
    RETURN_IF_ERROR(ResolveEnvironment(cfg, spec.model_dir, &launch));
    auto instance = std::make_unique<PythonInstance>(own, std::move(launch), device, &gpus,
                                                     gpu_inputs, &ipc_warnings_);
    RETURN_IF_ERROR(instance->Start());
    return instance;
  }

 private:
  static void ReadSize(const char* env, uint64_t* out) {
    const char* v = std::getenv(env);
    uint64_t n = 0;
    if (v != nullptr && absl::SimpleAtoi(v, &n) && n > 0) *out = n;
  }

  LaunchSpec BaseLaunch(std::string label) const {
    LaunchSpec l;
    l.stub_dir = PythonStubDirectory();
    l.shm_default_bytes = settings_.shm_default_bytes;
    l.shm_growth_bytes = settings_.shm_growth_bytes;
    l.label = std::move(label);
    if (const char* py = std::getenv("INFERD_PYTHON"); py != nullptr && *py) l.python = py;
    l.spin_us = settings_.spin_us;
    return l;
  }

  BackendSettings settings_;  // written by Configure before any load, then read-only
  gpu::Runtime* const gpus_;   // null: gpu::SystemRuntime()
  const std::string name_;
  const std::string backend_file_;  // a Python-based backend's model.py; empty: "python"
  IpcFallbackWarnings ipc_warnings_;
};

}  // namespace

std::string PythonStubDirectory() {
  std::error_code ec;
  auto has_stub = [&](const std::string& dir) {
    return fs::is_regular_file(dir + "/inferd_python_stub.py", ec);
  };
  if (const char* env = std::getenv("INFERD_PYTHON_BACKEND_DIR"); env != nullptr && *env) return env;
  const std::string exe = ExecutableDirectory();
  for (const std::string& dir : {exe + "/python_backend", exe + "/../lib/inferd/python_backend"}) {
    if (has_stub(dir)) return dir;
  }
  return INFERD_PYTHON_STUB_SOURCE_DIR;
}

std::unique_ptr<Backend> MakePythonBackend(gpu::Runtime* gpus) {
  return std::make_unique<PythonBackend>(gpus, "python", "");
}

std::unique_ptr<Backend> MakePythonBasedBackend(std::string name, std::string model_py) {
  return std::make_unique<PythonBackend>(nullptr, std::move(name), std::move(model_py));
}

}  // namespace inferd::backends
