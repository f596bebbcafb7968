#include "metrics/gpu_metrics.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/time/time.h"
#include "common/logging.h"
#include "common/strings.h"

// NVML's C ABI, declared here because no NVML header is installed on the build machines (the
// library ships with the driver). Only what is called; layouts as in nvml.h (CUDA 12/13). The
// structs keep nvml.h's tag names at global scope, so that a function's type is the same here
// and in a library declaring them as nvml.h does (UBSan's -fsanitize=function compares them
// when it calls tests/fakes' NVML).
struct nvmlUtilization_st {
  unsigned int gpu;     // percent of time a kernel ran over the last sample period
  unsigned int memory;  // percent of time memory was read or written
};
struct nvmlMemory_st {  // nvmlDeviceGetMemoryInfo (v1), bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

namespace inferd::metrics {
namespace {

using nvmlReturn_t = int;  // enum nvmlReturn_enum; NVML_SUCCESS is 0
constexpr nvmlReturn_t kNvmlSuccess = 0;
using nvmlDevice_t = void*;  // struct nvmlDevice_st*
using nvmlUtilization_t = ::nvmlUtilization_st;
using nvmlMemory_t = ::nvmlMemory_st;

// NVML_DEVICE_UUID_V2_BUFFER_SIZE and NVML_DEVICE_NAME_V2_BUFFER_SIZE.
constexpr unsigned int kUuidBufferSize = 96;
constexpr unsigned int kNameBufferSize = 96;

}  // namespace

struct NvmlLibrary::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  const char* (*error_string)(nvmlReturn_t);  // optional
  nvmlReturn_t (*device_count)(unsigned int*);
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int*);  // milliwatts
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned int*);  // milliwatts
  nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*);  // millijoules

  std::string Error(nvmlReturn_t r) const {
    const char* s = error_string != nullptr ? error_string(r) : nullptr;
    return inferd::StrCat("NVML error ", r, s != nullptr ? inferd::StrCat(": ", s) : "");
  }
};

namespace {

template <typename Fn>
bool Resolve(void* handle, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*out == nullptr) {
    if (!missing->empty()) missing->append(", ");
    missing->append(symbol);
    return false;
  }
  return true;
}

}  // namespace

std::string NvmlLibrary::DefaultPath() {
  const char* env = std::getenv("INFERD_NVML_LIBRARY");
  return env != nullptr && *env != '\0' ? std::string(env) : "libnvidia-ml.so.1";
}

absl::StatusOr<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Open(const std::string& path) {
  // RTLD_LOCAL: NVML's symbols stay out of the global namespace the backend modules see.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::UnavailableError(
        inferd::StrCat("cannot load ", path, " (", err != nullptr ? err : "dlopen failed",
                       "); the NVIDIA driver is not installed"));
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  Resolve(handle, "nvmlInit_v2", &api->init, &missing);
  Resolve(handle, "nvmlShutdown", &api->shutdown, &missing);
  Resolve(handle, "nvmlDeviceGetCount_v2", &api->device_count, &missing);
  Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", &api->handle_by_index, &missing);
  Resolve(handle, "nvmlDeviceGetUUID", &api->uuid, &missing);
  Resolve(handle, "nvmlDeviceGetName", &api->name, &missing);
  Resolve(handle, "nvmlDeviceGetUtilizationRates", &api->utilization, &missing);
  Resolve(handle, "nvmlDeviceGetMemoryInfo", &api->memory, &missing);
  Resolve(handle, "nvmlDeviceGetPowerUsage", &api->power_usage, &missing);
  // DCGM's DCGM_FI_DEV_POWER_MGMT_LIMIT, which Triton exports, is this figure.
  Resolve(handle, "nvmlDeviceGetPowerManagementLimit", &api->power_limit, &missing);
  Resolve(handle, "nvmlDeviceGetTotalEnergyConsumption", &api->energy, &missing);
  std::string optional_missing;
  Resolve(handle, "nvmlErrorString", &api->error_string, &optional_missing);
  if (!missing.empty()) {
    dlclose(handle);
    return absl::UnavailableError(
        inferd::StrCat(path, " lacks NVML function(s) ", missing, " (driver too old?)"));
  }
  if (nvmlReturn_t r = api->init(); r != kNvmlSuccess) {
    std::string err = api->Error(r);
    dlclose(handle);
    return absl::UnavailableError(
        inferd::StrCat("nvmlInit_v2 in ", path, " failed (", err, "): no NVIDIA driver loaded?"));
  }
  std::unique_ptr<NvmlLibrary> lib(new NvmlLibrary(handle, std::move(api)));
  unsigned int count = 0;
  if (nvmlReturn_t r = lib->api_->device_count(&count); r != kNvmlSuccess) {
    return absl::UnavailableError(
        inferd::StrCat("nvmlDeviceGetCount_v2 failed (", lib->api_->Error(r), ")"));
  }
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t r = lib->api_->handle_by_index(i, &dev); r != kNvmlSuccess) {
      LOG_WARNING << "no GPU metrics for NVML device " << i << ": nvmlDeviceGetHandleByIndex_v2 "
                  << "failed (" << lib->api_->Error(r) << ")";
      continue;
    }
    char uuid[kUuidBufferSize] = {};
    if (nvmlReturn_t r = lib->api_->uuid(dev, uuid, sizeof(uuid)); r != kNvmlSuccess) {
      // The uuid is the label: without it the device's series could not be told apart.
      LOG_WARNING << "no GPU metrics for NVML device " << i << ": nvmlDeviceGetUUID failed ("
                  << lib->api_->Error(r) << ")";
      continue;
    }
    char name[kNameBufferSize] = {};
    if (lib->api_->name(dev, name, sizeof(name)) != kNvmlSuccess) name[0] = '\0';
    uuid[sizeof(uuid) - 1] = '\0';
    name[sizeof(name) - 1] = '\0';
    lib->devices_.push_back(NvmlDevice{static_cast<int>(i), uuid, name});
    lib->device_handles_.push_back(dev);
  }
  return lib;
}

NvmlLibrary::NvmlLibrary(void* handle, std::unique_ptr<Api> api)
    : handle_(handle), api_(std::move(api)) {}

NvmlLibrary::~NvmlLibrary() {
  api_->shutdown();
  dlclose(handle_);
}

NvmlReading NvmlLibrary::Read(size_t i) const {
  NvmlReading r;
  nvmlDevice_t dev = device_handles_.at(i);
  nvmlUtilization_t util{};
  if (api_->utilization(dev, &util) == kNvmlSuccess) {
    r.has_utilization = true;
    r.utilization = std::min(util.gpu, 100u) / 100.0;
  }
  nvmlMemory_t mem{};
  if (api_->memory(dev, &mem) == kNvmlSuccess) {
    r.has_memory = true;
    r.memory_total_bytes = mem.total;
    r.memory_used_bytes = mem.used;
  }
  unsigned int mw = 0;
  if (api_->power_usage(dev, &mw) == kNvmlSuccess) {
    r.has_power_usage = true;
    r.power_usage_watts = mw / 1000.0;
  }
  if (api_->power_limit(dev, &mw) == kNvmlSuccess) {
    r.has_power_limit = true;
    r.power_limit_watts = mw / 1000.0;
  }
  unsigned long long mj = 0;
  if (api_->energy(dev, &mj) == kNvmlSuccess) {
    r.has_energy = true;
    r.energy_millijoules = mj;
  }
  return r;
}

GpuMetrics::GpuMetrics(MetricsRegistry* registry, std::unique_ptr<NvmlLibrary> nvml,
                       int interval_ms)
    : interval_ms_(std::max(100, interval_ms)), nvml_(std::move(nvml)) {
  {
    inferd::MutexLock lock(&mu_);
    state_.resize(nvml_->devices().size());
  }
  Sample();
  registry->AddCollector([this](PrometheusWriter& w) { Render(w); });
  thread_ = std::thread([this] { Loop(); });
}

GpuMetrics::~GpuMetrics() {
  {
    inferd::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.Signal();
  thread_.join();
}

void GpuMetrics::Loop() {
  for (;;) {
    {
      inferd::MutexLock lock(&mu_);
      if (!stopping_) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(interval_ms_));
      if (stopping_) return;
    }
    Sample();
  }
}

void GpuMetrics::Sample() {
  // NVML calls take a while (tens of microseconds each, a driver ioctl); outside the lock so
  // that a scrape never waits for them.
  std::vector<NvmlReading> readings;
  readings.reserve(nvml_->devices().size());
  for (size_t i = 0; i < nvml_->devices().size(); ++i) readings.push_back(nvml_->Read(i));
  inferd::MutexLock lock(&mu_);
  for (size_t i = 0; i < readings.size(); ++i) {
    DeviceState& s = state_[i];
    const NvmlReading& r = readings[i];
    if (r.has_energy) {
      // The first reading is the zero. NVML's count only grows while the driver stays loaded;
      // a smaller value (driver reloaded) adds nothing rather than moving the counter back.
      if (s.have_energy_base && r.energy_millijoules > s.last_energy_mj) {
        s.energy_joules += (r.energy_millijoules - s.last_energy_mj) / 1000.0;
      }
      s.have_energy_base = true;
      s.last_energy_mj = r.energy_millijoules;
    }
    s.last = r;
  }
}

void GpuMetrics::Render(PrometheusWriter& w) const {
  std::vector<DeviceState> state;  // a copy: the lambdas below run outside the lock's scope
  {
    inferd::MutexLock lock(&mu_);
    state = state_;
  }
  const std::vector<NvmlDevice>& devices = nvml_->devices();
  auto family = [&](const char* name, const char* help, const char* type, auto has, auto get) {
    w.Family(name, help, type);
    for (size_t i = 0; i < devices.size(); ++i) {
      if (!has(state[i])) continue;
      w.Sample(name, {{"gpu_uuid", devices[i].uuid}}, get(state[i]));
    }
  };
  // Help strings and types as Triton's (core/src/metrics.cc).
  family("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge",
         [](const DeviceState& s) { return s.last.has_utilization; },
         [](const DeviceState& s) { return s.last.utilization; });
  family("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge",
         [](const DeviceState& s) { return s.last.has_memory; },
         [](const DeviceState& s) { return static_cast<double>(s.last.memory_total_bytes); });
  family("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge",
         [](const DeviceState& s) { return s.last.has_memory; },
         [](const DeviceState& s) { return static_cast<double>(s.last.memory_used_bytes); });
  family("nv_gpu_power_usage", "GPU power usage in watts", "gauge",
         [](const DeviceState& s) { return s.last.has_power_usage; },
         [](const DeviceState& s) { return s.last.power_usage_watts; });
  family("nv_gpu_power_limit", "GPU power management limit in watts", "gauge",
         [](const DeviceState& s) { return s.last.has_power_limit; },
         [](const DeviceState& s) { return s.last.power_limit_watts; });
  family("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started",
         "counter", [](const DeviceState& s) { return s.have_energy_base; },
         [](const DeviceState& s) { return s.energy_joules; });
}

std::unique_ptr<GpuMetrics> StartGpuMetrics(MetricsRegistry* registry, int interval_ms) {
  const std::string path = NvmlLibrary::DefaultPath();
  absl::StatusOr<std::unique_ptr<NvmlLibrary>> nvml = NvmlLibrary::Open(path);
  if (!nvml.ok()) {
    LOG_INFO << "no GPU metrics: " << nvml.status().message();
    return nullptr;
  }
  if ((*nvml)->devices().empty()) {
    LOG_INFO << "no GPU metrics: NVML (" << path << ") lists no GPU";
    return nullptr;
  }
  for (const NvmlDevice& d : (*nvml)->devices()) {
    LOG_INFO << "Collecting metrics for GPU " << d.index << ": " << d.name << " (" << d.uuid
             << ")";
  }
  return std::make_unique<GpuMetrics>(registry, *std::move(nvml), interval_ms);
}

}  // namespace inferd::metrics
