// DynamicBatcher with a scripted instance: batch formation, queue limits, priorities,
// timeouts (REJECT and DELAY), client deadlines, cancellation and response ordering.
#include "scheduling/dynamic_batcher.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::scheduling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records each batch (request ids); the first execution can be held until released.
class ScriptedInstance : public backends::ModelInstance {
 public:
  ScriptedInstance(inferd::Mutex* mu, std::vector<std::vector<std::string>>* batches,
                   absl::Notification* gate)
      : mu_(mu), batches_(batches), gate_(gate) {}
  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses,
               backends::ExecutionTimes*) override {
    std::vector<std::string> ids;
    for (auto* r : requests) ids.push_back(r->id);
    {
      inferd::MutexLock lock(mu_);
      batches_->push_back(ids);
    }
    if (gate_ != nullptr) gate_->WaitForNotification();
    if (stopped_.load()) {
      for (auto* r : responses) r->status = absl::CancelledError("stopped");
    }
  }
  // Stops the held execution, as a backend would stop its run.
  void CancelExecution() override {
    cancel_calls.fetch_add(1);
    stopped_.store(true);
    if (gate_ != nullptr && !gate_->HasBeenNotified()) gate_->Notify();
  }
  static inline std::atomic<int> cancel_calls{0};

 private:
  std::atomic<bool> stopped_{false};
  inferd::Mutex* mu_;
  std::vector<std::vector<std::string>>* batches_;
  absl::Notification* gate_;
};

class DynamicBatcherTest : public ::testing::Test {
 protected:
  void Start(const std::string& batching, int instances = 1, bool hold_first = false) {
    auto cfg = config::ParseModelConfigText(
        "name: \"m\" backend: \"identity\" max_batch_size: 8 "
        "input [{name: \"x\" data_type: TYPE_FP32 dims: [1]}] "
        "output [{name: \"y\" data_type: TYPE_FP32 dims: [1]}] dynamic_batching { " + batching + " }",
        "c");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    config_ = *cfg;
    std::vector<std::unique_ptr<backends::ModelInstance>> list;
    for (int i = 0; i < instances; ++i) {
      list.push_back(std::make_unique<ScriptedInstance>(&mu_, &batches_, hold_first ? &gate_ : nullptr));
    }
    batcher_ = std::make_unique<DynamicBatcher>(config_, 1, std::move(list), 1000, &stats_);
  }

  void Send(const std::string& id, uint32_t priority = 0, uint64_t timeout_us = 0,
            std::shared_ptr<core::CancellationToken> cancel = nullptr, uint64_t deadline_ns = 0) {
    auto r = std::make_unique<core::InferRequest>();
    r->id = id;
    r->priority = priority;
    r->timeout_us = timeout_us;
    r->cancel = std::move(cancel);
    r->deadline_ns = deadline_ns;
    r->inputs.push_back({"x", DataType::kFp32, {1, 1}, "abcd"});
    r->times.received_ns = core::NowNs();
    r->on_complete = [this, id](std::unique_ptr<core::InferResponse> resp) {
      inferd::MutexLock lock(&mu_);
      completed_.push_back(id);
      if (!resp->status.ok()) errors_[id] = std::string(resp->status.message());
    };
    batcher_->Enqueue(std::move(r));
  }

  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completed_.size() >= target_; }
  bool HasBatch() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !batches_.empty(); }

  void WaitCompleted(size_t n) {
    inferd::MutexLock lock(&mu_);
    target_ = n;
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(this, &DynamicBatcherTest::Done), absl::Seconds(10)));
  }
  // Waits until the first request occupies the (held) instance.
  void WaitFirstBatch() {
    inferd::MutexLock lock(&mu_);
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(this, &DynamicBatcherTest::HasBatch), absl::Seconds(10)));
  }

  // A test that failed with the instance still held must not hang in the batcher's shutdown.
  void TearDown() override {
    if (!gate_.HasBeenNotified()) gate_.Notify();
    batcher_.reset();
  }

  size_t target_ = 0;

  inferd::Mutex mu_;
  std::vector<std::vector<std::string>> batches_;
  std::vector<std::string> completed_;
  std::map<std::string, std::string> errors_;
  absl::Notification gate_;
  metrics::ModelStats stats_;
  config::ModelConfig config_;
  std::unique_ptr<DynamicBatcher> batcher_;
};

TEST_F(DynamicBatcherTest, QueuedRequestsFormOneBatchWhileTheInstanceIsBusy) {
  Start("max_queue_delay_microseconds: 0", 1, /*hold_first=*/true);
  Send("a");
  // Wait for "a" to occupy the instance, then queue three more.
  WaitFirstBatch();
  Send("b");
  Send("c");
  Send("d");
  gate_.Notify();
  WaitCompleted(4);
  inferd::MutexLock lock(&mu_);
  ASSERT_EQ(batches_.size(), 2u);
  EXPECT_THAT(batches_[1], ElementsAre("b", "c", "d"));
  auto snap = stats_.Snapshot();
  EXPECT_EQ(snap.inference_count, 4u);
  EXPECT_EQ(snap.execution_count, 2u);
  EXPECT_EQ(snap.batch_stats.at(3).compute_infer.count, 1u);
}

TEST_F(DynamicBatcherTest, DelayGathersABatch) {
  Start("max_queue_delay_microseconds: 300000 preferred_batch_size: [3]");
  Send("a");
  Send("b");
  Send("c");  // a preferred batch of 3 goes at once, well before the 300 ms delay
  WaitCompleted(3);
  inferd::MutexLock lock(&mu_);
  ASSERT_EQ(batches_.size(), 1u);
  EXPECT_THAT(batches_[0], ElementsAre("a", "b", "c"));
}

TEST_F(DynamicBatcherTest, FullQueueRejectsAtOnce) {
  Start("default_queue_policy { max_queue_size: 1 }", 1, true);
  Send("a");
  WaitFirstBatch();
  Send("b");  // queued
  Send("c");  // queue full
  {
    inferd::MutexLock lock(&mu_);
    ASSERT_EQ(completed_.size(), 1u);
    EXPECT_EQ(completed_[0], "c");
    EXPECT_THAT(errors_["c"], HasSubstr("is full (1 requests, max_queue_size)"));
  }
  gate_.Notify();
  WaitCompleted(3);
}

TEST_F(DynamicBatcherTest, HigherPriorityGoesFirst) {
  Start("priority_levels: 2 default_priority_level: 2 max_queue_delay_microseconds: 0", 1, true);
  Send("first");
  WaitFirstBatch();
  Send("low1");
  Send("high", 1);
  Send("low2");
  gate_.Notify();
  WaitCompleted(4);
  inferd::MutexLock lock(&mu_);
  ASSERT_EQ(batches_.size(), 2u);
  EXPECT_THAT(batches_[1], ElementsAre("high", "low1", "low2"));
}

TEST_F(DynamicBatcherTest, TimedOutRequestsAreRejected) {
  // Only "late" carries a timeout, so "a" surely reaches the instance first.
  Start("default_queue_policy { timeout_action: REJECT allow_timeout_override: true }", 1, true);
  Send("a");
  WaitFirstBatch();
  Send("late", 0, /*timeout_us=*/1000);
  WaitCompleted(1);  // "late" times out while "a" holds the only instance
  {
    inferd::MutexLock lock(&mu_);
    EXPECT_THAT(errors_["late"], HasSubstr("timed out"));
  }
  gate_.Notify();
  WaitCompleted(2);
}

TEST_F(DynamicBatcherTest, DelayedRequestsRunAfterTheOthers) {
  Start("default_queue_policy { timeout_action: DELAY allow_timeout_override: true } "
        "max_queue_delay_microseconds: 0", 1, true);
  Send("a");
  WaitFirstBatch();
  Send("old", 0, /*timeout_us=*/1000);
  absl::SleepFor(absl::Milliseconds(20));  // "old" passes its timeout and is delayed
  Send("new");
  gate_.Notify();
  WaitCompleted(3);
  inferd::MutexLock lock(&mu_);
  EXPECT_TRUE(errors_.empty());
  ASSERT_EQ(batches_.size(), 2u);
  EXPECT_THAT(batches_[1], ElementsAre("new", "old"));
}

TEST_F(DynamicBatcherTest, RequestTimeoutMayOnlyLowerTheDefault) {
  Start("default_queue_policy { default_timeout_microseconds: 60000000 allow_timeout_override: true }", 1, true);
  Send("a");
  WaitFirstBatch();
  Send("short", 0, /*timeout_us=*/1000);
  Send("long", 0, /*timeout_us=*/600000000);  // cannot raise the 60 s default
  WaitCompleted(1);
  {
    inferd::MutexLock lock(&mu_);
    EXPECT_EQ(completed_[0], "short");
    EXPECT_THAT(errors_["short"], HasSubstr("timed out"));
  }
  gate_.Notify();
  WaitCompleted(3);
  inferd::MutexLock lock(&mu_);
  EXPECT_EQ(errors_.count("long"), 0u);
}

TEST_F(DynamicBatcherTest, ShutdownCompletesEverythingQueued) {
  Start("max_queue_delay_microseconds: 10000000", 2);
  for (int i = 0; i < 20; ++i) Send(std::to_string(i));
  batcher_->Shutdown();
  inferd::MutexLock lock(&mu_);
  EXPECT_EQ(completed_.size(), 20u);
  EXPECT_TRUE(errors_.empty());
}

TEST_F(DynamicBatcherTest, PreserveOrderingAcrossInstances) {
  Start("preserve_ordering: true max_queue_delay_microseconds: 0", 3);
  for (int i = 0; i < 50; ++i) Send(std::to_string(i));
  WaitCompleted(50);
  inferd::MutexLock lock(&mu_);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(completed_[i], std::to_string(i));
}

}  // namespace
}  // namespace inferd::scheduling

namespace inferd::scheduling {
namespace {

TEST_F(DynamicBatcherTest, CancelledQueuedRequestIsAnsweredAtOnceAndNeverRuns) {
  Start("max_queue_delay_microseconds: 0", 1, /*hold_first=*/true);
  Send("a");
  WaitFirstBatch();
  auto token = std::make_shared<core::CancellationToken>();
  Send("gone", 0, 0, token);
  Send("b");
  token->Cancel();
  WaitCompleted(1);  // while "a" still holds the only instance
  {
    inferd::MutexLock lock(&mu_);
    ASSERT_EQ(completed_.size(), 1u);
    EXPECT_EQ(completed_[0], "gone");
    EXPECT_THAT(errors_["gone"], HasSubstr("cancelled by the client"));
  }
  gate_.Notify();
  WaitCompleted(3);
  inferd::MutexLock lock(&mu_);
  ASSERT_EQ(batches_.size(), 2u);
  EXPECT_THAT(batches_[1], ElementsAre("b"));  // "gone" never ran
  const auto s = stats_.Snapshot();
  EXPECT_EQ(s.fail_by_reason[static_cast<int>(metrics::FailureReason::kCanceled)], 1u);
  EXPECT_EQ(s.fail_by_reason[static_cast<int>(metrics::FailureReason::kTimeout)], 0u);
}

TEST_F(DynamicBatcherTest, ClientDeadlineFiresWhileTheInstanceIsBusy) {
  // No queue policy timeout: the client's own deadline applies regardless.
  Start("max_queue_delay_microseconds: 0", 1, /*hold_first=*/true);
  Send("a");
  WaitFirstBatch();
  Send("late", 0, 0, nullptr, core::NowNs() + 20'000'000);
  WaitCompleted(1);
  {
    inferd::MutexLock lock(&mu_);
    ASSERT_EQ(completed_.size(), 1u);
    EXPECT_EQ(completed_[0], "late");
    EXPECT_THAT(errors_["late"], HasSubstr("timed out: waited"));
    EXPECT_THAT(errors_["late"], HasSubstr("the client's deadline"));
  }
  gate_.Notify();
  WaitCompleted(2);
  inferd::MutexLock lock(&mu_);
  EXPECT_EQ(batches_.size(), 1u);
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kTimeout)], 1u);
}

TEST_F(DynamicBatcherTest, RunStopsOnlyWhenAllOfItsRequestsAreCancelled) {
  ScriptedInstance::cancel_calls.store(0);
  Start("max_queue_delay_microseconds: 0", 1, /*hold_first=*/true);
  auto t1 = std::make_shared<core::CancellationToken>();
  Send("a", 0, 0, t1);
  WaitFirstBatch();
  t1->Cancel();  // the only request of the running batch: the run is stopped
  WaitCompleted(1);
  inferd::MutexLock lock(&mu_);
  EXPECT_EQ(ScriptedInstance::cancel_calls.load(), 1);
  EXPECT_THAT(errors_["a"], HasSubstr("cancelled by the client"));
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kCanceled)], 1u);
}

TEST_F(DynamicBatcherTest, RunGoesOnWhileOneOfItsRequestsStillWaits) {
  ScriptedInstance::cancel_calls.store(0);
  Start("max_queue_delay_microseconds: 200000", 1, /*hold_first=*/true);
  auto t1 = std::make_shared<core::CancellationToken>();
  Send("b", 0, 0, t1);
  Send("c");  // no token: its client cannot leave
  WaitFirstBatch();
  {
    inferd::MutexLock lock(&mu_);
    ASSERT_THAT(batches_[0], ElementsAre("b", "c"));
  }
  t1->Cancel();  // "c" still waits for the answer: the run goes on
  EXPECT_EQ(ScriptedInstance::cancel_calls.load(), 0);
  gate_.Notify();
  WaitCompleted(2);
  inferd::MutexLock lock(&mu_);
  EXPECT_TRUE(errors_.empty());
}


// Learned batch sizes: an instance that runs a batch of 3 slowly (30 ms) and a batch of 2 at
// once. Each round holds the instance with a lone request, queues requests behind it, then
// lets it go, so the batch that follows is exactly what was queued.
class SlowThreeInstance : public backends::ModelInstance {
 public:
  SlowThreeInstance(inferd::Mutex* mu, std::vector<std::vector<std::string>>* batches)
      : mu_(mu), batches_(batches) {}
  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const>, backends::ExecutionTimes*) override {
    std::vector<std::string> ids;
    for (auto* r : requests) ids.push_back(r->id);
    {
      inferd::MutexLock lock(mu_);
      batches_->push_back(ids);
      if (ids[0].rfind("hold", 0) == 0) {
        ++held_;
        auto released = [this]() { return released_ >= held_; };
        mu_->Await(absl::Condition(&released));
        return;
      }
    }
    if (ids.size() == 3) absl::SleepFor(absl::Milliseconds(30));
  }
  // Lets the held run go. The caller holds *mu_ (the fixture's mutex, which the thread-safety
  // analysis cannot tell from this pointer to it).
  void Release() { ++released_; }
  int held() const { return held_; }

 private:
  inferd::Mutex* mu_;
  std::vector<std::vector<std::string>>* batches_;
  // Guarded by *mu_.
  int held_ = 0;
  int released_ = 0;
};

class LearnedSizesTest : public DynamicBatcherTest {
 protected:
  void StartSlowThree(const std::string& batching) {
    auto cfg = config::ParseModelConfigText(
        "name: \"m\" backend: \"identity\" max_batch_size: 8 "
        "input [{name: \"x\" data_type: TYPE_FP32 dims: [1]}] "
        "output [{name: \"y\" data_type: TYPE_FP32 dims: [1]}] dynamic_batching { " +
            batching + " }",
        "c");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    config_ = *cfg;
    auto instance = std::make_unique<SlowThreeInstance>(&mu_, &batches_);
    instance_ = instance.get();
    std::vector<std::unique_ptr<backends::ModelInstance>> list;
    list.push_back(std::move(instance));
    batcher_ = std::make_unique<DynamicBatcher>(config_, 1, std::move(list), 1000, &stats_);
  }
  // One round: a held lone request, `n` queued behind it, then the release; returns the
  // batches the queued ones ran in.
  std::vector<std::vector<std::string>> Round(int n) {
    const std::string tag = std::to_string(round_++);
    size_t first;
    int held;
    {
      inferd::MutexLock lock(&mu_);
      first = batches_.size();
      held = instance_->held();
    }
    Send("hold" + tag);
    {
      inferd::MutexLock lock(&mu_);
      auto holding = [&]() { return instance_->held() > held; };
      EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&holding), absl::Seconds(10)));
    }
    for (int i = 0; i < n; ++i) Send(tag + "-" + std::to_string(i));
    {
      inferd::MutexLock lock(&mu_);
      instance_->Release();
    }
    WaitCompleted(sent_ += n + 1);
    inferd::MutexLock lock(&mu_);
    return {batches_.begin() + static_cast<std::ptrdiff_t>(first) + 1, batches_.end()};
  }
  SlowThreeInstance* instance_ = nullptr;
  int round_ = 0;
  size_t sent_ = 0;
};

TEST_F(LearnedSizesTest, ASizeThatRunsSlowlyIsSplitOnceLearned) {
  StartSlowThree("max_queue_delay_microseconds: 0");
  for (uint32_t i = 0; i < BatchCosts::kMinSamples; ++i) {
    ASSERT_EQ(Round(3).size(), 1u);  // not learned yet: all three together
    ASSERT_EQ(Round(2).size(), 1u);
  }
  // Three queued now run as 2 + 1: a batch of 2 has run far cheaper per request.
  auto split = Round(3);
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split[0].size(), 2u);
  EXPECT_EQ(split[1].size(), 1u);
}

TEST_F(LearnedSizesTest, APreferredBatchSizeKeepsTritonsRules) {
  StartSlowThree("max_queue_delay_microseconds: 0 preferred_batch_size: [ 4 ]");
  for (uint32_t i = 0; i < BatchCosts::kMinSamples; ++i) {
    ASSERT_EQ(Round(3).size(), 1u);
    ASSERT_EQ(Round(2).size(), 1u);
  }
  EXPECT_EQ(Round(3).size(), 1u);
}

// preferred_batch_size [max_batch_size] is what the config's normalization writes when the
// config names none (as Triton's): the model still learns its sizes.
TEST_F(LearnedSizesTest, TritonsDefaultPreferredSizeStillLearns) {
  StartSlowThree("max_queue_delay_microseconds: 0 preferred_batch_size: [ 8 ]");
  for (uint32_t i = 0; i < BatchCosts::kMinSamples; ++i) {
    ASSERT_EQ(Round(3).size(), 1u);
    ASSERT_EQ(Round(2).size(), 1u);
  }
  EXPECT_EQ(Round(3).size(), 2u);
}

}  // namespace
}  // namespace inferd::scheduling
