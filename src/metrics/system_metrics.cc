#include "metrics/system_metrics.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/time.h"

namespace inferd::metrics {

SystemMetrics::SystemMetrics(MetricsRegistry* registry, int interval_ms)
    : interval_ms_(std::max(100, interval_ms)) {
  Sample();
  registry->AddCollector([this](PrometheusWriter& w) {
    w.Family("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge");
    w.Sample("nv_cpu_utilization", {}, utilization_.load());
    w.Family("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge");
    w.Sample("nv_cpu_memory_total_bytes", {}, static_cast<double>(mem_total_.load()));
    w.Family("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge");
    w.Sample("nv_cpu_memory_used_bytes", {}, static_cast<double>(mem_used_.load()));
  });
  thread_ = std::thread([this] { Loop(); });
}

SystemMetrics::~SystemMetrics() {
  {
    inferd::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.Signal();
  thread_.join();
}

void SystemMetrics::Loop() {
  inferd::MutexLock lock(&mu_);
  while (!stopping_) {
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(interval_ms_));
    if (stopping_) break;
    Sample();
  }
}

void SystemMetrics::Sample() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) {
    const uint64_t busy = user + nice + system + irq + softirq + steal;
    const uint64_t total = busy + idle + iowait;
    if (last_total_ != 0 && total > last_total_) {
      utilization_.store(static_cast<double>(busy - last_busy_) / (total - last_total_));
    }
    last_busy_ = busy;
    last_total_ = total;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  uint64_t value = 0, total_kb = 0, available_kb = 0;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemTotal:") total_kb = value;
    if (key == "MemAvailable:") available_kb = value;
  }
  mem_total_.store(total_kb * 1024);
  mem_used_.store((total_kb - available_kb) * 1024);
}

}  // namespace inferd::metrics
