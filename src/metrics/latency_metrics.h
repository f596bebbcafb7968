// Latency distributions behind `--metrics-config`: tritonserver's first-response histogram
// (nv_inference_first_response_histogram_ms) and its latency summaries
// (nv_inference_*_summary_us), recorded on the request path at almost no cost.
//
// Recording is lock-free: a histogram is one relaxed atomic add per observation; a summary is a
// log-linear sketch (exact below 64, then 32 buckets per power of two, so a reported quantile is
// within 1.6% of the observed value) kept in `kAgeBuckets` time slots of relaxed atomic counters.
// Quantiles are computed only when /metrics is scraped, by merging the live slots: the
// observations of the last 48 to 60 seconds, as prometheus-cpp's summary (max_age 60 s, 5 age
// buckets) that tritonserver uses. Thread-safe; Observe never blocks and never allocates.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace inferd::metrics {

struct LatencyMetricsConfig {
  bool counters = true;     // counter_latencies: the nv_inference_*_duration_us counters
  bool histograms = false;  // histogram_latencies
  bool summaries = false;   // summary_latencies
  // summary_quantiles: (quantile, error) pairs; tritonserver's defaults.
  std::vector<std::pair<double, double>> quantiles = {
      {0.5, 0.05}, {0.9, 0.01}, {0.95, 0.001}, {0.99, 0.001}, {0.999, 0.001}};
  // Bucket bounds of nv_inference_first_response_histogram_ms (a model's config.pbtxt
  // model_metrics can replace them for that model).
  std::vector<double> first_response_buckets = {100, 500, 2000, 5000};
};

// Applies one `--metrics-config <key>=<value>` setting: counter_latencies, histogram_latencies,
// summary_latencies (true/false) and summary_quantiles ("<q>:<err>,..."), the keys tritonserver
// documents. Unknown keys and bad values are INVALID_ARGUMENT naming them.
absl::Status ApplyMetricsConfigSetting(std::string_view setting, LatencyMetricsConfig* config);

// A Prometheus histogram with fixed upper bounds (plus +Inf).
class LatencyHistogram {
 public:
  explicit LatencyHistogram(std::vector<double> bounds);
  void Observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Get() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> sum_{0};                      // values are whole milliseconds
};

// A Prometheus summary over a sliding window, see the header comment.
class LatencySummary {
 public:
  static constexpr int kAgeBuckets = 5;
  static constexpr uint64_t kMaxAgeNs = 60'000'000'000ull;
  static constexpr int kSubBits = 5;
  static constexpr int kBuckets = 1152;  // values up to 2^40

  // `now_ns` is a monotonic time (tests pass their own).
  void Observe(uint64_t value, uint64_t now_ns);
  struct Snapshot {
    std::vector<std::pair<double, double>> quantiles;  // (quantile, value); NaN when empty
    uint64_t count = 0;                                // since start, as Prometheus counts
    uint64_t sum = 0;
  };
  Snapshot Get(const std::vector<std::pair<double, double>>& quantiles, uint64_t now_ns) const;

  static int BucketOf(uint64_t value);
  static double BucketValue(int bucket);  // the middle of the bucket's range

 private:
  static constexpr uint64_t kNoEpoch = ~0ull;
  struct Slot {
    std::atomic<uint64_t> epoch{kNoEpoch};
    std::atomic<uint32_t> counts[kBuckets] = {};
  };
  Slot slots_[kAgeBuckets];
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_{0};
};

// A monotonic clock cheap enough to read per request (CLOCK_MONOTONIC_COARSE).
uint64_t CoarseNowNs();

}  // namespace inferd::metrics
