// Custom metrics (Triton's TRITONSERVER_MetricFamily / Metric): sharing by name and labels,
// each kind's operations, handle lifetimes, and the text GET /metrics shows.
#include "metrics/custom_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace inferd::metrics {
namespace {

std::string Text(const CustomMetrics& m) {
  PrometheusWriter w;
  m.Render(w);
  return w.text();
}

TEST(CustomMetricsTest, SameNameSharesTheFamilyAndSameLabelsTheSeries) {
  CustomMetrics m(nullptr);
  auto f1 = m.NewFamily("reqs", "first", 0);
  auto f2 = m.NewFamily("reqs", "second", 0);
  ASSERT_TRUE(f1.ok() && f2.ok());
  EXPECT_EQ(m.NewFamily("reqs", "x", 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto a = m.NewMetric(*f1, {{"b", "2"}, {"a", "1"}}, std::nullopt);
  auto b = m.NewMetric(*f2, {{"a", "1"}, {"b", "2"}}, std::nullopt);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(m.Increment(*a, 2.5).ok());
  EXPECT_EQ(*m.Value(*b), 2.5);
  EXPECT_EQ(Text(m), "# HELP reqs first\n# TYPE reqs counter\nreqs{a=\"1\",b=\"2\"} 2.5\n");
  // The family stays while any handle on it (or on a series of it) lives.
  m.ReleaseFamily(*f1);
  m.ReleaseFamily(*f2);
  m.ReleaseMetric(*a);
  EXPECT_NE(Text(m).find("reqs{a=\"1\",b=\"2\"} 2.5"), std::string::npos);
  m.ReleaseMetric(*b);
  EXPECT_EQ(Text(m), "");
  m.ReleaseMetric(*b);  // twice: ignored
}

TEST(CustomMetricsTest, EachKindTakesItsOperations) {
  CustomMetrics m(nullptr);
  auto c = m.NewMetric(*m.NewFamily("c", "", 0), {}, std::nullopt);
  auto g = m.NewMetric(*m.NewFamily("g", "", 1), {}, std::nullopt);
  auto h = m.NewMetric(*m.NewFamily("h", "", 2), {}, std::vector<double>{1, 2.5});
  ASSERT_TRUE(c.ok() && g.ok() && h.ok());
  EXPECT_FALSE(m.Increment(*c, -1).ok());
  EXPECT_FALSE(m.Set(*c, 1).ok());
  EXPECT_FALSE(m.Observe(*c, 1).ok());
  EXPECT_TRUE(m.Increment(*g, -1).ok());
  EXPECT_TRUE(m.Set(*g, 4).ok());
  EXPECT_FALSE(m.Observe(*g, 1).ok());
  EXPECT_FALSE(m.Increment(*h, 1).ok());
  EXPECT_FALSE(m.Value(*h).ok());
  for (double v : {0.5, 1.0, 2.0, 9.0}) EXPECT_TRUE(m.Observe(*h, v).ok());
  const std::string text = Text(m);
  EXPECT_NE(text.find("g 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE h histogram\nh_count 4\nh_sum 12.5\nh_bucket{le=\"1\"} 2\n"
                      "h_bucket{le=\"2.5\"} 3\nh_bucket{le=\"+Inf\"} 4\n"),
            std::string::npos)
      << text;
}

TEST(CustomMetricsTest, RefusesWhatPrometheusCannotShow) {
  CustomMetrics m(nullptr);
  EXPECT_FALSE(m.NewFamily("1bad", "", 0).ok());
  EXPECT_FALSE(m.NewFamily("ok", "", 7).ok());
  auto h = m.NewFamily("hist", "", 2);
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(m.NewMetric(*h, {}, std::nullopt).ok());
  EXPECT_FALSE(m.NewMetric(*h, {}, std::vector<double>{2, 1}).ok());
  EXPECT_FALSE(m.NewMetric(*h, {}, std::vector<double>{1, 1}).ok());
  EXPECT_FALSE(m.NewMetric(*h, {{"le", "x"}}, std::vector<double>{}).ok());
  EXPECT_TRUE(m.NewMetric(*h, {}, std::vector<double>{}).ok());
  auto c = m.NewFamily("cnt", "", 0);
  EXPECT_FALSE(m.NewMetric(*c, {{"bad-label", "x"}}, std::nullopt).ok());
  EXPECT_FALSE(m.NewMetric(*c, {}, std::vector<double>{1}).ok());
  EXPECT_EQ(m.NewMetric(12345, {}, std::nullopt).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace inferd::metrics
