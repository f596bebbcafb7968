// Per model-version counters behind the statistics extension (and, later, Prometheus). Each
// loaded model version owns one ModelStats; schedulers record into it, frontends snapshot it.
// Thread-safe: counters are atomics; batch statistics take a short mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "metrics/latency_metrics.h"

namespace inferd::metrics {

struct Duration {
  uint64_t count = 0;
  uint64_t ns = 0;
};

struct BatchStats {
  Duration compute_input;
  Duration compute_infer;
  Duration compute_output;
};

// Why a request failed, as Triton labels nv_inference_request_failure (REJECTED, CANCELED,
// BACKEND, OTHER), plus TIMEOUT: a deadline (the `timeout` parameter, the queue policy's
// timeout, a gRPC deadline) expired before it ran. Triton counts those as REJECTED; inferd
// keeps them apart so an overloaded model (REJECTED) and a too-tight deadline are told apart.
enum class FailureReason { kRejected = 0, kCanceled = 1, kBackend = 2, kOther = 3, kTimeout = 4 };
inline constexpr int kNumFailureReasons = 5;
inline constexpr const char* kFailureReasonNames[kNumFailureReasons] = {
    "REJECTED", "CANCELED", "BACKEND", "OTHER", "TIMEOUT"};

struct ModelStatsSnapshot {
  uint64_t last_inference_ms = 0;
  uint64_t inference_count = 0;
  uint64_t execution_count = 0;
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  Duration cache_hit, cache_miss;
  std::map<uint64_t, BatchStats> batch_stats;  // by batch size
  uint64_t fail_by_reason[kNumFailureReasons] = {};
};

// The latency distributions `--metrics-config` turned on, at one instant.
struct LatencySnapshot {
  std::optional<LatencyHistogram::Snapshot> first_response_ms;
  // request, queue, compute_input, compute_infer, compute_output (microseconds); empty when
  // summaries are off.
  std::vector<LatencySummary::Snapshot> summaries_us;
};

class ModelStats {
 public:
  ModelStats() = default;
  // With latency histograms and/or summaries, as `config` asks.
  explicit ModelStats(const LatencyMetricsConfig& config);

  // One request finished successfully. Durations in ns.
  void RecordSuccess(uint64_t request_ns, uint64_t queue_ns, uint64_t input_ns, uint64_t infer_ns,
                     uint64_t output_ns, uint64_t batch_size);
  void RecordFailure(uint64_t request_ns, FailureReason reason = FailureReason::kOther);
  // One backend execution of `batch_size` items.
  void RecordExecution(uint64_t batch_size, uint64_t input_ns, uint64_t infer_ns,
                       uint64_t output_ns);

  // A request answered from the response cache: counts as a success (request and queue time)
  // and a cache hit taking `lookup_ns`; no inference or execution. A miss adds the lookup and
  // insertion time; the request's execution is recorded as usual.
  void RecordCacheHit(uint64_t request_ns, uint64_t queue_ns, uint64_t lookup_ns);
  void RecordCacheMiss(uint64_t lookup_and_insert_ns);

  ModelStatsSnapshot Snapshot() const;
  // Quantiles are computed here, at scrape time.
  LatencySnapshot Latencies() const;

 private:
  struct Counter {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> ns{0};
    void Add(uint64_t d) {
      count.fetch_add(1, std::memory_order_relaxed);
      ns.fetch_add(d, std::memory_order_relaxed);
    }
    Duration Get() const { return {count.load(), ns.load()}; }
  };
  std::atomic<uint64_t> last_inference_ms_{0};
  std::atomic<uint64_t> inference_count_{0};
  std::atomic<uint64_t> execution_count_{0};
  std::atomic<uint64_t> fail_by_reason_[kNumFailureReasons] = {};
  Counter success_, fail_, queue_, compute_input_, compute_infer_, compute_output_;
  Counter cache_hit_, cache_miss_;
  mutable inferd::Mutex batch_mu_;
  std::map<uint64_t, BatchStats> batch_stats_ ABSL_GUARDED_BY(batch_mu_);
  // Null unless turned on; set at construction only.
  std::unique_ptr<LatencyHistogram> first_response_ms_;
  std::unique_ptr<LatencySummary[]> summaries_us_;  // kSummaryCount
  std::vector<std::pair<double, double>> quantiles_;
  static constexpr int kSummaryCount = 5;
};

}  // namespace inferd::metrics
