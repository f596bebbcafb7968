// CPU utilization and memory of the machine, sampled every --metrics-interval-ms from /proc,
// exported as Triton's nv_cpu_utilization, nv_cpu_memory_total_bytes and
// nv_cpu_memory_used_bytes. Owns one sampler thread; thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "common/mutex.h"
#include "metrics/prometheus.h"

namespace inferd::metrics {

class SystemMetrics {
 public:
  SystemMetrics(MetricsRegistry* registry, int interval_ms);
  ~SystemMetrics();

 private:
  void Sample();
  void Loop();

  const int interval_ms_;
  std::atomic<double> utilization_{0};
  std::atomic<uint64_t> mem_total_{0};
  std::atomic<uint64_t> mem_used_{0};
  uint64_t last_busy_ = 0;
  uint64_t last_total_ = 0;
  inferd::Mutex mu_;
  inferd::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace inferd::metrics
