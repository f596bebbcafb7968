// The dynamic batcher's decisions, with explicit times: deterministic to the nanosecond.
#include "scheduling/batch_policy.h"

#include <algorithm>

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


// ---- learned batch sizes ---------------------------------------------------------------------

// `runs` runs of `total` at `ms_per_item` milliseconds per request.
void Learn(BatchCosts* costs, int64_t total, double ms_per_item, int runs = 8) {
  for (int i = 0; i < runs; ++i) {
    costs->Record(total, static_cast<uint64_t>(ms_per_item * 1e6 * static_cast<double>(total)));
  }
}

TEST(BatchCostsTest, AverageMovesByAnEighthAndClipsOutliers) {
  BatchCosts costs(8);
  EXPECT_EQ(costs.Get(3).samples, 0u);
  costs.Record(3, 3'000'000);
  EXPECT_EQ(costs.Get(3).ns_per_item, 1'000'000u);
  costs.Record(3, 3 * 1'800'000);  // 1.8 ms per request: 7/8 of 1 ms + 1/8 of 1.8 ms
  EXPECT_EQ(costs.Get(3).ns_per_item, 1'100'000u);
  // A run preempted for a second counts as twice the average, no more.
  costs.Record(3, 3'000'000'000);
  EXPECT_EQ(costs.Get(3).ns_per_item, 1'100'000u - 137'500u + 275'000u);
  EXPECT_EQ(costs.Get(3).samples, 3u);
  // Sizes out of range are ignored.
  costs.Record(9, 1);
  costs.Record(0, 1);
  EXPECT_EQ(costs.Get(9).samples, 0u);
}

TEST(BatchCostsTest, ASmallerBatchThatRunsClearlyCheaperIsSent) {
  // ResNet-50 with two threads: 3 runs 13% slower per image than 2 or 4.
  BatchCosts costs(8);
  Learn(&costs, 2, 54.0);
  Learn(&costs, 3, 62.0);
  Learn(&costs, 4, 54.0);
  uint64_t shrinks = 0;
  auto q3 = Queue({{0, 1}, {1, 1}, {2, 1}});
  EXPECT_EQ(ShrinkBatch(q3, 3, costs, &shrinks), 2u);
  EXPECT_EQ(shrinks, 1u);
  // Four queued: 4 is as cheap as anything smaller; sent whole.
  auto q4 = Queue({{0, 1}, {1, 1}, {2, 1}, {3, 1}});
  EXPECT_EQ(ShrinkBatch(q4, 4, costs, &shrinks), 4u);
  // Requests of batch size 2 and 1: prefixes total 2 and 3.
  auto mixed = Queue({{0, 2}, {1, 1}});
  EXPECT_EQ(ShrinkBatch(mixed, 2, costs, &shrinks), 1u);
}

TEST(BatchCostsTest, TheCheapestPrefixWins) {
  BatchCosts costs(8);
  Learn(&costs, 1, 60.0);
  Learn(&costs, 2, 50.0);
  Learn(&costs, 3, 55.0);
  Learn(&costs, 4, 70.0);
  uint64_t shrinks = 0;
  auto q = Queue({{0, 1}, {1, 1}, {2, 1}, {3, 1}});
  EXPECT_EQ(ShrinkBatch(q, 4, costs, &shrinks), 2u);
}

TEST(BatchCostsTest, NoSplitWithoutEnoughKnowledgeOrMargin) {
  uint64_t shrinks = 0;
  auto q3 = Queue({{0, 1}, {1, 1}, {2, 1}});
  {
    BatchCosts costs(8);  // the whole has too few runs: it runs, and is learned
    Learn(&costs, 2, 10.0);
    Learn(&costs, 3, 20.0, BatchCosts::kMinSamples - 1);
    EXPECT_EQ(ShrinkBatch(q3, 3, costs, &shrinks), 3u);
  }
  {
    BatchCosts costs(8);  // the prefix has too few runs
    Learn(&costs, 2, 10.0, BatchCosts::kMinSamples - 1);
    Learn(&costs, 3, 20.0);
    EXPECT_EQ(ShrinkBatch(q3, 3, costs, &shrinks), 3u);
  }
  {
    BatchCosts costs(8);  // 4% cheaper is within the noise
    Learn(&costs, 2, 48.0);
    Learn(&costs, 3, 50.0);
    EXPECT_EQ(ShrinkBatch(q3, 3, costs, &shrinks), 3u);
  }
  {
    BatchCosts costs(8);  // runs under a millisecond are never split
    Learn(&costs, 2, 0.01);
    Learn(&costs, 3, 0.3);
    EXPECT_EQ(ShrinkBatch(q3, 3, costs, &shrinks), 3u);
  }
  EXPECT_EQ(shrinks, 0u);
}

TEST(BatchCostsTest, EveryEighthSplitSendsTheWholeToRelearnIt) {
  BatchCosts costs(8);
  Learn(&costs, 2, 50.0);
  Learn(&costs, 3, 60.0);
  uint64_t shrinks = 0;
  auto q3 = Queue({{0, 1}, {1, 1}, {2, 1}});
  std::vector<size_t> sent;
  for (int i = 0; i < 16; ++i) sent.push_back(ShrinkBatch(q3, 3, costs, &shrinks));
  EXPECT_EQ(std::count(sent.begin(), sent.end(), 3u), 2);
  EXPECT_EQ(sent[7], 3u);
  EXPECT_EQ(sent[15], 3u);
}

}  // namespace
}  // namespace inferd::scheduling
