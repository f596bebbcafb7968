#include "metrics/model_stats.h"

#include <chrono>

namespace inferd::metrics {
namespace {
uint64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ModelStats::ModelStats(const LatencyMetricsConfig& config) : quantiles_(config.quantiles) {
  if (config.histograms) {
    first_response_ms_ = std::make_unique<LatencyHistogram>(config.first_response_buckets);
  }
  if (config.summaries) summaries_us_ = std::make_unique<LatencySummary[]>(kSummaryCount);
}

void ModelStats::RecordSuccess(uint64_t request_ns, uint64_t queue_ns, uint64_t input_ns,
                               uint64_t infer_ns, uint64_t output_ns, uint64_t batch_size) {
  // Whole units, as tritonserver observes them.
  if (first_response_ms_) first_response_ms_->Observe(static_cast<double>(request_ns / 1'000'000));
  if (summaries_us_) {
    const uint64_t now = CoarseNowNs();
    summaries_us_[0].Observe(request_ns / 1000, now);
    summaries_us_[1].Observe(queue_ns / 1000, now);
    summaries_us_[2].Observe(input_ns / 1000, now);
    summaries_us_[3].Observe(infer_ns / 1000, now);
    summaries_us_[4].Observe(output_ns / 1000, now);
  }
  success_.Add(request_ns);
  queue_.Add(queue_ns);
  compute_input_.Add(input_ns);
  compute_infer_.Add(infer_ns);
  compute_output_.Add(output_ns);
  inference_count_.fetch_add(batch_size, std::memory_order_relaxed);
  last_inference_ms_.store(WallMs(), std::memory_order_relaxed);
}

void ModelStats::RecordFailure(uint64_t request_ns, FailureReason reason) {
  fail_.Add(request_ns);
  fail_by_reason_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  last_inference_ms_.store(WallMs(), std::memory_order_relaxed);
}

void ModelStats::RecordExecution(uint64_t batch_size, uint64_t input_ns, uint64_t infer_ns,
                                 uint64_t output_ns) {
  execution_count_.fetch_add(1, std::memory_order_relaxed);
  inferd::MutexLock lock(&batch_mu_);
  BatchStats& b = batch_stats_[batch_size];
  b.compute_input.count++;
  b.compute_input.ns += input_ns;
  b.compute_infer.count++;
  b.compute_infer.ns += infer_ns;
  b.compute_output.count++;
  b.compute_output.ns += output_ns;
}

void ModelStats::RecordCacheHit(uint64_t request_ns, uint64_t queue_ns, uint64_t lookup_ns) {
  success_.Add(request_ns);
  queue_.Add(queue_ns);
  cache_hit_.Add(lookup_ns);
  last_inference_ms_.store(WallMs(), std::memory_order_relaxed);
}

void ModelStats::RecordCacheMiss(uint64_t lookup_and_insert_ns) {
  cache_miss_.Add(lookup_and_insert_ns);
}

ModelStatsSnapshot ModelStats::Snapshot() const {
  ModelStatsSnapshot s;
  s.last_inference_ms = last_inference_ms_.load();
  s.inference_count = inference_count_.load();
  s.execution_count = execution_count_.load();
  s.success = success_.Get();
  s.fail = fail_.Get();
  s.queue = queue_.Get();
  s.compute_input = compute_input_.Get();
  s.compute_infer = compute_infer_.Get();
  s.compute_output = compute_output_.Get();
  s.cache_hit = cache_hit_.Get();
  s.cache_miss = cache_miss_.Get();
  for (int i = 0; i < kNumFailureReasons; ++i) s.fail_by_reason[i] = fail_by_reason_[i].load();
  inferd::MutexLock lock(&batch_mu_);
  s.batch_stats = batch_stats_;
  return s;
}

LatencySnapshot ModelStats::Latencies() const {
  LatencySnapshot s;
  if (first_response_ms_) s.first_response_ms = first_response_ms_->Get();
  if (summaries_us_) {
    const uint64_t now = CoarseNowNs();
    for (int i = 0; i < kSummaryCount; ++i) s.summaries_us.push_back(summaries_us_[i].Get(quantiles_, now));
  }
  return s;
}

}  // namespace inferd::metrics
