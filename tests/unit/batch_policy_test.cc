// The dynamic batcher's decisions, with explicit times: deterministic to the nanosecond.
#include "scheduling/batch_policy.h"

#include "gtest/gtest.h"

namespace inferd::scheduling {
namespace {

const std::string kA = "a";
const std::string kB = "b";

std::vector<QueuedItem> Queue(std::initializer_list<std::pair<uint64_t, int64_t>> items,
                              const std::string* key = &kA) {
  std::vector<QueuedItem> q;
  for (auto [t, b] : items) q.push_back({t, b, key});
  return q;
}

TEST(BatchPolicyTest, LargestPreferredSizeIsSentAtOnce) {
  BatchPolicy p{8, {2, 4}, 1'000'000};
  auto q = Queue({{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}});
  EXPECT_EQ(DecideBatch(p, q, 5).take, 4u);
  auto three = Queue({{0, 1}, {1, 1}, {2, 1}});
  EXPECT_EQ(DecideBatch(p, three, 5).take, 2u);
}

TEST(BatchPolicyTest, RequestsCountByTheirBatchSize) {
  BatchPolicy p{8, {4}, 1'000'000};
  auto q = Queue({{0, 3}, {1, 1}, {2, 2}});
  EXPECT_EQ(DecideBatch(p, q, 3).take, 2u);  // 3 + 1 = 4 is preferred
  auto over = Queue({{0, 5}, {1, 4}});
  EXPECT_EQ(DecideBatch(p, over, 3).take, 1u);  // 9 > max: the first goes alone, at once
}

TEST(BatchPolicyTest, DelayIsHonouredToTheNanosecond) {
  BatchPolicy p{8, {}, 100'000};
  auto q = Queue({{1'000, 1}, {5'000, 1}});
  BatchDecision wait = DecideBatch(p, q, 100'999);
  EXPECT_EQ(wait.take, 0u);
  EXPECT_EQ(wait.wait_until_ns, 101'000u);
  EXPECT_EQ(DecideBatch(p, q, 101'000).take, 2u);
}

TEST(BatchPolicyTest, FullBatchGoesWithoutWaiting) {
  BatchPolicy p{4, {}, 1'000'000'000};
  auto q = Queue({{0, 2}, {1, 2}, {2, 1}});
  EXPECT_EQ(DecideBatch(p, q, 2).take, 2u);
}

TEST(BatchPolicyTest, NoDelaySendsWhatThereIs) {
  BatchPolicy p{8, {}, 0};
  auto q = Queue({{0, 1}, {1, 1}, {2, 1}});
  EXPECT_EQ(DecideBatch(p, q, 2).take, 3u);
}

TEST(BatchPolicyTest, DifferentShapesNeverShareABatch) {
  BatchPolicy p{8, {}, 1'000'000};
  std::vector<QueuedItem> q = {{0, 1, &kA}, {1, 1, &kA}, {2, 1, &kB}, {3, 1, &kA}};
  // The third request cannot join, so waiting cannot grow the batch: send the first two now.
  EXPECT_EQ(DecideBatch(p, q, 3).take, 2u);
}

TEST(BatchPolicyTest, PreferredSizeNotReachableWaitsForTheDelay) {
  BatchPolicy p{8, {4, 8}, 50};
  auto q = Queue({{10, 1}, {20, 1}, {30, 1}});
  EXPECT_EQ(DecideBatch(p, q, 40).wait_until_ns, 60u);
  EXPECT_EQ(DecideBatch(p, q, 60).take, 3u);
}

TEST(BatchPolicyTest, EmptyQueueWaitsForArrivals) {
  BatchPolicy p{8, {}, 50};
  BatchDecision d = DecideBatch(p, {}, 0);
  EXPECT_EQ(d.take, 0u);
  EXPECT_EQ(d.wait_until_ns, 0u);
}

}  // namespace
}  // namespace inferd::scheduling
