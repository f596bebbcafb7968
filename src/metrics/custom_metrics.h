// Metrics a model defines itself, Triton's custom metrics (TRITONSERVER_MetricFamily and
// TRITONSERVER_Metric, which the Python backend's pb_utils.MetricFamily / Metric wrap): counter,
// gauge and histogram families with labelled series, shown on GET /metrics beside the server's
// own, as Triton shows them (prometheus-cpp's text: labels in name order, a histogram as
// <name>_count, <name>_sum and cumulative <name>_bucket{le=...} lines ending with le="+Inf").
//
// Families and series are reached through handles (ids). A family is shared by every handle
// made with its name (the first description stays; another kind is refused), and a series by
// every handle made with its family and labels, as prometheus-cpp's Family::Add returns the
// same series for the same labels. Each lives while a handle on it does: the Python backend
// releases a process's handles when the model deletes its objects or the process ends.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "metrics/prometheus.h"

namespace inferd::metrics {

// Triton's TRITONSERVER_MetricKind values, which pb_utils.MetricFamily.COUNTER... carry.
enum class CustomKind { kCounter = 0, kGauge = 1, kHistogram = 2 };

// Thread-safe.
class CustomMetrics {
 public:
  // Adds the collector that renders every live family to `registry` (may be null: tests).
  explicit CustomMetrics(MetricsRegistry* registry);
  CustomMetrics(const CustomMetrics&) = delete;
  CustomMetrics& operator=(const CustomMetrics&) = delete;

  // A handle on family `name`. InvalidArgument: a name Prometheus does not accept, an unknown
  // kind, or a family of that name that exists with another kind.
  absl::StatusOr<uint64_t> NewFamily(std::string_view name, std::string_view description,
                                     int kind);
  // A handle on the series of `family` with `labels` (names as Prometheus accepts them).
  // A histogram needs `buckets` (strictly increasing upper bounds, possibly none); others take
  // none. InvalidArgument naming what was wrong; NotFound: no such family handle.
  absl::StatusOr<uint64_t> NewMetric(uint64_t family, Labels labels,
                                     std::optional<std::vector<double>> buckets);
  // Releases a handle; unknown ids are ignored (a process may release what it never got).
  void ReleaseFamily(uint64_t family);
  void ReleaseMetric(uint64_t metric);

  // The operations each kind takes (Triton's): a counter only grows (Increment with a value
  // >= 0), a gauge takes Increment (any sign) and Set, a histogram takes only Observe; Value
  // answers counters and gauges. FailedPrecondition names the refused operation.
  absl::Status Increment(uint64_t metric, double value);
  absl::Status Set(uint64_t metric, double value);
  absl::Status Observe(uint64_t metric, double value);
  absl::StatusOr<double> Value(uint64_t metric) const;

  void Render(PrometheusWriter& w) const;

 private:
  struct Series {
    Labels labels;                // sorted by name
    std::vector<double> buckets;  // histogram upper bounds
    std::vector<uint64_t> bucket_counts;  // per bucket, not cumulative; last: +Inf
    double value = 0;             // counter, gauge; a histogram's sum
    uint64_t count = 0;           // histogram observations
    int refs = 0;
  };
  struct Family {
    std::string name, description;
    CustomKind kind;
    int refs = 0;  // family handles and the series' handles
    std::map<Labels, std::unique_ptr<Series>> series;
  };
  struct MetricHandle {
    Family* family;
    Series* series;
  };

  absl::StatusOr<MetricHandle> Find(uint64_t metric) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unref(Family* family) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable inferd::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // By name, in creation order for rendering (Triton's order is its registry's; any order
  // is valid Prometheus text).
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Family*> family_handles_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, MetricHandle> metric_handles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::metrics
