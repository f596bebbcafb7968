// Prometheus text exposition (format 0.0.4) and the registry of collectors behind
// GET /metrics. The registry is created by `app` and handed to whoever contributes metrics
// (the server for per-model figures, SystemMetrics for CPU and memory); nothing is global.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace inferd::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class PrometheusWriter {
 public:
  // Starts a metric family: "# HELP" and "# TYPE" lines. type: counter, gauge.
  void Family(std::string_view name, std::string_view help, std::string_view type);
  void Sample(std::string_view name, const Labels& labels, double value);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// Thread-safe. Collectors are called in registration order on every Render.
class MetricsRegistry {
 public:
  using Collector = std::function<void(PrometheusWriter&)>;
  void AddCollector(Collector collector);
  std::string Render() const;

 private:
  mutable inferd::Mutex mu_;
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::metrics
