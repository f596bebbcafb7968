// The latency histogram and summary behind --metrics-config: bucket arithmetic, quantiles against
// an exact computation, the sliding window (with an injected clock) and the setting parser.
#include "metrics/latency_metrics.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace inferd::metrics {
namespace {

constexpr uint64_t kSec = 1'000'000'000ull;

TEST(LatencySummaryTest, BucketValueIsWithinOnePointSixPercent) {
  for (uint64_t v = 0; v < 64; ++v) EXPECT_EQ(LatencySummary::BucketValue(LatencySummary::BucketOf(v)), v);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t v = rng() >> (rng() % 40 + 24);  // below 2^40
    const double got = LatencySummary::BucketValue(LatencySummary::BucketOf(v));
    ASSERT_LE(std::fabs(got - double(v)), double(v) / 64 + 1) << v;
  }
  // Buckets are ordered like the values.
  for (uint64_t v = 1; v < 100000; ++v) {
    ASSERT_LE(LatencySummary::BucketOf(v - 1), LatencySummary::BucketOf(v));
  }
}

TEST(LatencySummaryTest, QuantilesMatchTheObservations) {
  LatencySummary s;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(8.0, 1.0);  // ~3 ms median, in us
  std::vector<uint64_t> values;
  for (int i = 0; i < 50000; ++i) {
    values.push_back(static_cast<uint64_t>(dist(rng)));
    s.Observe(values.back(), 100 * kSec);
  }
  std::sort(values.begin(), values.end());
  const std::vector<std::pair<double, double>> qs = {{0.5, 0.05}, {0.9, 0.01}, {0.99, 0.001}};
  auto snap = s.Get(qs, 100 * kSec);
  ASSERT_EQ(snap.quantiles.size(), 3u);
  EXPECT_EQ(snap.count, 50000u);
  uint64_t sum = 0;
  for (uint64_t v : values) sum += v;
  EXPECT_EQ(snap.sum, sum);
  for (const auto& [q, got] : snap.quantiles) {
    const double want = double(values[static_cast<size_t>(std::ceil(q * values.size())) - 1]);
    EXPECT_NEAR(got, want, want / 64 + 1) << "quantile " << q;
  }
}

TEST(LatencySummaryTest, WindowForgetsOldObservations) {
  LatencySummary s;
  const std::vector<std::pair<double, double>> qs = {{0.5, 0.05}};
  for (int i = 0; i < 100; ++i) s.Observe(1000, 10 * kSec);
  EXPECT_EQ(s.Get(qs, 10 * kSec).quantiles[0].second, LatencySummary::BucketValue(LatencySummary::BucketOf(1000)));
  // 40 s later the old ones are still inside the window; a newer, larger majority moves it.
  for (int i = 0; i < 300; ++i) s.Observe(20, 50 * kSec);
  EXPECT_EQ(s.Get(qs, 50 * kSec).quantiles[0].second, 20);
  // After 60 s the first batch is gone: only 20s remain even at the top.
  EXPECT_EQ(s.Get({{0.99, 0.001}}, 75 * kSec).quantiles[0].second, 20);
  // And after another minute nothing is left: NaN, as Prometheus' summary reports.
  EXPECT_TRUE(std::isnan(s.Get(qs, 185 * kSec).quantiles[0].second));
  // A slot is reused after a rotation without the old counts.
  for (int i = 0; i < 3; ++i) s.Observe(5, 185 * kSec);
  auto snap = s.Get({{0.999, 0.001}}, 185 * kSec);
  EXPECT_EQ(snap.quantiles[0].second, 5);
  EXPECT_EQ(snap.count, 403u);  // _count is cumulative
}

TEST(LatencySummaryTest, ConcurrentObservationsAreAllCounted) {
  LatencySummary s;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&s] {
      for (int i = 0; i < 20000; ++i) s.Observe(static_cast<uint64_t>(i % 500), 5 * kSec);
    });
  }
  for (auto& t : threads) t.join();
  auto snap = s.Get({{0.5, 0.05}}, 5 * kSec);
  EXPECT_EQ(snap.count, 80000u);
  EXPECT_NEAR(snap.quantiles[0].second, 249, 249 / 64.0 + 1);
}

TEST(LatencyHistogramTest, CumulativeBuckets) {
  LatencyHistogram h({100, 500, 2000, 5000});
  for (double v : {0.0, 100.0, 101.0, 499.0, 2500.0, 9999.0}) h.Observe(v);
  auto snap = h.Get();
  EXPECT_EQ(snap.cumulative, (std::vector<uint64_t>{2, 4, 4, 5, 6}));
  EXPECT_EQ(snap.count, 6u);
  EXPECT_EQ(snap.sum, 0 + 100 + 101 + 499 + 2500 + 9999);
}

TEST(MetricsConfigTest, TritonKeysAndRefusals) {
  LatencyMetricsConfig c;
  EXPECT_TRUE(ApplyMetricsConfigSetting("counter_latencies=false", &c).ok());
  EXPECT_FALSE(c.counters);
  EXPECT_TRUE(ApplyMetricsConfigSetting("histogram_latencies=true", &c).ok());
  EXPECT_TRUE(c.histograms);
  EXPECT_TRUE(ApplyMetricsConfigSetting("summary_latencies=true", &c).ok());
  EXPECT_TRUE(c.summaries);
  ASSERT_TRUE(ApplyMetricsConfigSetting("summary_quantiles=0.5:0.05,0.9:0.01", &c).ok());
  EXPECT_EQ(c.quantiles, (std::vector<std::pair<double, double>>{{0.5, 0.05}, {0.9, 0.01}}));
  auto st = ApplyMetricsConfigSetting("summary_max_age=30", &c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("summary_max_age"), std::string::npos);
  EXPECT_FALSE(ApplyMetricsConfigSetting("summary_latencies=yes", &c).ok());
  EXPECT_FALSE(ApplyMetricsConfigSetting("summary_quantiles=0.5", &c).ok());
  EXPECT_FALSE(ApplyMetricsConfigSetting("summary_quantiles=1.5:0.1", &c).ok());
  EXPECT_FALSE(ApplyMetricsConfigSetting("summary_latencies", &c).ok());
}

}  // namespace
}  // namespace inferd::metrics
