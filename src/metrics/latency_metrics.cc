#include "metrics/latency_metrics.h"

#include <time.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <limits>

#include "common/strings.h"

namespace inferd::metrics {
namespace {

absl::Status Bad(std::string_view setting, std::string_view why) {
  return absl::InvalidArgumentError(
      inferd::StrCat("--metrics-config ", setting, ": ", why));
}

absl::Status ParseBool(std::string_view setting, std::string_view value, bool* out) {
  if (value == "true") {
    *out = true;
  } else if (value == "false") {
    *out = false;
  } else {
    return Bad(setting, "the value must be true or false");
  }
  return absl::OkStatus();
}

bool ParseDouble(std::string_view text, double* out) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty()) return false;
  auto r = std::from_chars(text.data(), text.data() + text.size(), *out);
  return r.ec == std::errc() && r.ptr == text.data() + text.size() && std::isfinite(*out);
}

}  // namespace

absl::Status ApplyMetricsConfigSetting(std::string_view setting, LatencyMetricsConfig* config) {
  const size_t eq = setting.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == setting.size()) {
    return Bad(setting, "the format is <setting>=<value>");
  }
  const std::string_view key = setting.substr(0, eq);
  const std::string_view value = setting.substr(eq + 1);
  if (key == "counter_latencies") return ParseBool(setting, value, &config->counters);
  if (key == "histogram_latencies") return ParseBool(setting, value, &config->histograms);
  if (key == "summary_latencies") return ParseBool(setting, value, &config->summaries);
  if (key == "summary_quantiles") {
    // tritonserver's format: "<quantile>:<error>" pairs separated by commas.
    std::vector<std::pair<double, double>> quantiles;
    size_t pos = 0;
    while (pos <= value.size()) {
      size_t end = value.find(',', pos);
      if (end == std::string_view::npos) end = value.size();
      const std::string_view pair = value.substr(pos, end - pos);
      const size_t colon = pair.find(':');
      double q = 0, err = 0;
      if (colon == std::string_view::npos || !ParseDouble(pair.substr(0, colon), &q) ||
          !ParseDouble(pair.substr(colon + 1), &err)) {
        return Bad(setting, inferd::StrCat("'", pair, "' is not <quantile>:<error>"));
      }
      if (q < 0 || q > 1 || err < 0 || err > 1) {
        return Bad(setting, inferd::StrCat("'", pair,
                                           "': the quantile and its error must be within [0, 1]"));
      }
      quantiles.emplace_back(q, err);
      pos = end + 1;
    }
    config->quantiles = std::move(quantiles);
    return absl::OkStatus();
  }
  return Bad(setting, inferd::StrCat("unknown setting '", key,
                                     "' (known: counter_latencies, histogram_latencies, "
                                     "summary_latencies, summary_quantiles)"));
}

LatencyHistogram::LatencyHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void LatencyHistogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(static_cast<uint64_t>(value), std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Get() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = static_cast<double>(sum_.load(std::memory_order_relaxed));
  return s;
}

int LatencySummary::BucketOf(uint64_t value) {
  constexpr uint64_t kExact = 1ull << (kSubBits + 1);  // 64
  if (value < kExact) return static_cast<int>(value);
  const int e = 63 - std::countl_zero(value);  // >= kSubBits + 1
  const int shift = e - kSubBits;
  const int bucket = (shift << kSubBits) + static_cast<int>(value >> shift);
  return std::min(bucket, kBuckets - 1);
}

double LatencySummary::BucketValue(int bucket) {
  constexpr int kExact = 1 << (kSubBits + 1);
  if (bucket < kExact) return bucket;
  const int shift = (bucket >> kSubBits) - 1;
  const uint64_t m = static_cast<uint64_t>((bucket & ((1 << kSubBits) - 1)) + (1 << kSubBits));
  const double low = static_cast<double>(m << shift);
  const double high = static_cast<double>((m + 1) << shift);
  return (low + high) / 2;
}

void LatencySummary::Observe(uint64_t value, uint64_t now_ns) {
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  const uint64_t epoch = now_ns / (kMaxAgeNs / kAgeBuckets);
  Slot& slot = slots_[epoch % kAgeBuckets];
  uint64_t seen = slot.epoch.load(std::memory_order_acquire);
  if (seen != epoch) {
    if (seen != kNoEpoch && seen > epoch) return;  // a clock read from before a rotation
    // The slot last held an epoch that has left the window: the thread that claims it clears
    // it. Observations racing with the rotation may land on either side of it.
    if (slot.epoch.compare_exchange_strong(seen, epoch, std::memory_order_acq_rel) &&
        seen != kNoEpoch) {
      for (auto& c : slot.counts) c.store(0, std::memory_order_relaxed);
    }
  }
  slot.counts[BucketOf(value)].fetch_add(1, std::memory_order_relaxed);
}

LatencySummary::Snapshot LatencySummary::Get(
    const std::vector<std::pair<double, double>>& quantiles, uint64_t now_ns) const {
  Snapshot s;
  s.count = count_.load(std::memory_order_relaxed);
  s.sum = sum_.load(std::memory_order_relaxed);
  const uint64_t epoch = now_ns / (kMaxAgeNs / kAgeBuckets);
  std::vector<uint64_t> merged(kBuckets, 0);
  uint64_t total = 0;
  for (const Slot& slot : slots_) {
    const uint64_t e = slot.epoch.load(std::memory_order_acquire);
    if (e == kNoEpoch || e > epoch || epoch - e >= kAgeBuckets) continue;
    for (int i = 0; i < kBuckets; ++i) {
      const uint64_t c = slot.counts[i].load(std::memory_order_relaxed);
      merged[i] += c;
      total += c;
    }
  }
  for (const auto& [q, err] : quantiles) {
    double value = std::numeric_limits<double>::quiet_NaN();
    if (total > 0) {
      // The smallest observation with at least q of them at or below it.
      const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * total)));
      uint64_t running = 0;
      for (int i = 0; i < kBuckets; ++i) {
        running += merged[i];
        if (running >= rank) {
          value = BucketValue(i);
          break;
        }
      }
    }
    s.quantiles.emplace_back(q, value);
  }
  return s;
}

uint64_t CoarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace inferd::metrics
