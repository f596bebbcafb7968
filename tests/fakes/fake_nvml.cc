// A stand-in for NVML (libnvidia-ml.so.1) for tests on hosts without an NVIDIA driver: the
// functions inferd's GPU metrics call (src/metrics/gpu_metrics.cc), with fixed figures for two
// GPUs. inferd loads it when INFERD_NVML_LIBRARY names it.
//
//   GPU 0 "Fake A10G"  GPU-00000000-1111-2222-3333-444444444444  37 %, 24 GiB total, 1 GiB used,
//                      61.234 W of a 300 W limit
//   GPU 1 "Fake T4"    GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee  100 %, 16 GiB total, 512 MiB
//                      used, 70 W, no power limit (NVML_ERROR_NOT_SUPPORTED)
//   Energy: each nvmlDeviceGetTotalEnergyConsumption call returns 2500 mJ more than the last
//   (GPU 0 from 1000000 mJ, GPU 1 from 5000 mJ), so that the exported counter moves by 2.5 J a
//   sample.
//   FAKE_NVML_INIT_ERROR=<n>: nvmlInit_v2 returns n (9 is NVML_ERROR_DRIVER_NOT_LOADED).
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kInsufficientSize = 7;

struct FakeGpu {
  const char* uuid;
  const char* name;
  unsigned int utilization_percent;
  unsigned long long total, used;
  unsigned int power_mw;
  int power_limit_mw;  // < 0: not supported
  unsigned long long energy_start_mj;
};

constexpr FakeGpu kGpus[] = {
    {"GPU-00000000-1111-2222-3333-444444444444", "Fake A10G", 37, 24ull << 30, 1ull << 30, 61234,
     300000, 1000000},
    {"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "Fake T4", 100, 16ull << 30, 512ull << 20, 70000,
     -1, 5000},
};
constexpr unsigned int kCount = sizeof(kGpus) / sizeof(kGpus[0]);
std::atomic<unsigned long long> energy_calls[kCount];

const FakeGpu* Gpu(void* device) {
  for (unsigned int i = 0; i < kCount; ++i) {
    if (device == &kGpus[i]) return &kGpus[i];
  }
  return nullptr;
}

int CopyString(const char* s, char* out, unsigned int length) {
  if (out == nullptr) return kInvalidArgument;
  if (std::strlen(s) + 1 > length) return kInsufficientSize;
  std::strcpy(out, s);
  return kSuccess;
}

}  // namespace

// nvml.h's tag names at global scope, as src/metrics/gpu_metrics.cc declares them.
struct nvmlUtilization_st {
  unsigned int gpu, memory;
};
struct nvmlMemory_st {
  unsigned long long total, free, used;
};
using nvmlUtilization_t = nvmlUtilization_st;
using nvmlMemory_t = nvmlMemory_st;

extern "C" {

int nvmlInit_v2() {
  const char* e = std::getenv("FAKE_NVML_INIT_ERROR");
  return e != nullptr ? std::atoi(e) : kSuccess;
}
int nvmlShutdown() { return kSuccess; }
const char* nvmlErrorString(int r) {
  return r == 9 ? "Driver Not Loaded" : r == kNotSupported ? "Not Supported" : "Unknown Error";
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = kCount;
  return kSuccess;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= kCount) return kInvalidArgument;
  *device = const_cast<FakeGpu*>(&kGpus[index]);
  return kSuccess;
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  const FakeGpu* g = Gpu(device);
  return g == nullptr ? kInvalidArgument : CopyString(g->uuid, uuid, length);
}
int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  const FakeGpu* g = Gpu(device);
  return g == nullptr ? kInvalidArgument : CopyString(g->name, name, length);
}
int nvmlDeviceGetUtilizationRates(void* device, nvmlUtilization_t* u) {
  const FakeGpu* g = Gpu(device);
  if (g == nullptr) return kInvalidArgument;
  u->gpu = g->utilization_percent;
  u->memory = g->utilization_percent / 2;
  return kSuccess;
}
int nvmlDeviceGetMemoryInfo(void* device, nvmlMemory_t* m) {
  const FakeGpu* g = Gpu(device);
  if (g == nullptr) return kInvalidArgument;
  m->total = g->total;
  m->used = g->used;
  m->free = g->total - g->used;
  return kSuccess;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* mw) {
  const FakeGpu* g = Gpu(device);
  if (g == nullptr) return kInvalidArgument;
  *mw = g->power_mw;
  return kSuccess;
}
int nvmlDeviceGetPowerManagementLimit(void* device, unsigned int* mw) {
  const FakeGpu* g = Gpu(device);
  if (g == nullptr) return kInvalidArgument;
  if (g->power_limit_mw < 0) return kNotSupported;
  *mw = static_cast<unsigned int>(g->power_limit_mw);
  return kSuccess;
}
int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* mj) {
  const FakeGpu* g = Gpu(device);
  if (g == nullptr) return kInvalidArgument;
  const unsigned long long n = energy_calls[g - kGpus].fetch_add(1);
  *mj = g->energy_start_mj + 2500 * n;
  return kSuccess;
}

}  // extern "C"
