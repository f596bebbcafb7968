// GPU utilization, memory, power and energy from NVML, exported with Triton's names
// (nv_gpu_utilization, nv_gpu_memory_total_bytes, nv_gpu_memory_used_bytes, nv_gpu_power_usage,
// nv_gpu_power_limit, nv_energy_consumption), labelled gpu_uuid="GPU-...".
//
// NVML (libnvidia-ml.so.1) ships with the NVIDIA driver, not with the CUDA toolkit, and there
// is no NVML header on the build machines: it is loaded with dlopen and the few functions used
// are declared in gpu_metrics.cc. A build with or without CUDA has the same code; a host
// without the driver has no GPU metrics and one INFO line saying why.
//
// Test seam: the environment variable INFERD_NVML_LIBRARY names another library to load
// instead (tests/fakes/fake_nvml.cc, two GPUs with fixed figures). Not for production use.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "metrics/prometheus.h"

namespace inferd::metrics {

// One NVML device as it was found at Open().
struct NvmlDevice {
  int index = 0;
  std::string uuid;  // "GPU-5fb0d0e9-...", Triton's gpu_uuid label
  std::string name;  // "NVIDIA A10G"
};

// One reading of one device, in the units Triton exports. A figure NVML could not give (a
// GPU without power readings answers NOT_SUPPORTED) is absent: its `has_` flag is false.
struct NvmlReading {
  bool has_utilization = false;
  double utilization = 0;  // [0.0, 1.0]; NVML gives percent
  bool has_memory = false;
  uint64_t memory_total_bytes = 0;
  uint64_t memory_used_bytes = 0;
  bool has_power_usage = false;
  double power_usage_watts = 0;  // NVML gives milliwatts
  bool has_power_limit = false;
  double power_limit_watts = 0;  // NVML gives milliwatts
  bool has_energy = false;
  uint64_t energy_millijoules = 0;  // since the driver was loaded, as NVML counts it
};

// NVML, opened and initialized; shut down and closed by the destructor. Thread-compatible:
// Read() from one thread at a time (the sampler's).
class NvmlLibrary {
 public:
  // The library the process should use: $INFERD_NVML_LIBRARY if set, else "libnvidia-ml.so.1".
  static std::string DefaultPath();

  // dlopen(path), resolves the functions, nvmlInit_v2, lists the devices. UNAVAILABLE naming
  // the path when the library is missing or lacks a function, or when nvmlInit fails (no
  // driver loaded); the message is meant for the one INFO line.
  static absl::StatusOr<std::unique_ptr<NvmlLibrary>> Open(const std::string& path);

  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const std::vector<NvmlDevice>& devices() const { return devices_; }
  // `i` indexes devices().
  NvmlReading Read(size_t i) const;

  struct Api;  // the resolved functions (gpu_metrics.cc)

 private:
  NvmlLibrary(void* handle, std::unique_ptr<Api> api);

  void* handle_;
  std::unique_ptr<Api> api_;
  std::vector<NvmlDevice> devices_;
  std::vector<void*> device_handles_;  // nvmlDevice_t, parallel to devices_
};

// Samples every device every --metrics-interval-ms on its own thread and renders the six
// families. Energy is a counter of joules since this object started (Triton: "since the Triton
// Server started"): the first reading is its zero. Thread-safe.
class GpuMetrics {
 public:
  // Registers a collector on `registry` (which must outlive this) and starts the sampler.
  GpuMetrics(MetricsRegistry* registry, std::unique_ptr<NvmlLibrary> nvml, int interval_ms);
  ~GpuMetrics();

  // Reads every device now, as the sampler thread does every interval.
  void Sample();

 private:
  struct DeviceState {
    NvmlReading last;
    bool have_energy_base = false;
    uint64_t last_energy_mj = 0;
    double energy_joules = 0;
  };
  void Loop();
  void Render(PrometheusWriter& w) const;

  const int interval_ms_;
  std::unique_ptr<NvmlLibrary> nvml_;
  mutable inferd::Mutex mu_;
  std::vector<DeviceState> state_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  inferd::CondVar cv_;
  std::thread thread_;
};

// What app calls: opens NVML at DefaultPath() and, when it has devices, returns the sampler
// (logging one INFO line per GPU, as Triton's "Collecting metrics for GPU 0: <name>"); else
// logs one INFO line saying why there are no GPU metrics and returns null.
std::unique_ptr<GpuMetrics> StartGpuMetrics(MetricsRegistry* registry, int interval_ms);

}  // namespace inferd::metrics
