// InstancePool with a gated instance: the hand-off, delivery in arrival order, cancellation of
// a running batch and of a submitted one before it starts, statistics, shutdown draining what
// was submitted; and the shared DeadlineSweeper.
#include "scheduling/instance_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduling/deadline_sweeper.h"

namespace inferd::scheduling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A notification on std::mutex, visible to ThreadSanitizer (Debian's Abseil is not built
// with it).
class Done {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  bool Wait(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// Answers each request with its id as output "y"; with a gate, holds each run until the gate
// opens or the run is cancelled (then fails it, as a backend whose run was stopped).
class GatedInstance : public backends::ModelInstance {
 public:
  explicit GatedInstance(Done* gate = nullptr) : gate_(gate) {}
  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses,
               backends::ExecutionTimes*) override {
    runs.fetch_add(1);
    batch_sizes.fetch_add(requests.size());
    started.Notify();
    if (gate_ != nullptr) EXPECT_TRUE(gate_->Wait(std::chrono::seconds(30)));
    for (size_t i = 0; i < requests.size(); ++i) {
      if (stopped_.load()) {
        responses[i]->status = absl::CancelledError("run stopped");
        continue;
      }
      auto holder = std::make_shared<std::string>(requests[i]->id);
      responses[i]->outputs.push_back({"y", DataType::kBytes, {1}, *holder, holder});
    }
  }
  void CancelExecution() override {
    cancel_calls.fetch_add(1);
    stopped_.store(true);
    if (gate_ != nullptr) gate_->Notify();
  }

  std::atomic<int> runs{0};
  std::atomic<size_t> batch_sizes{0};
  std::atomic<int> cancel_calls{0};
  Done started;

 private:
  Done* gate_;
  std::atomic<bool> stopped_{false};
};

class InstancePoolTest : public ::testing::Test {
 protected:
  // Instance i is gated by gates_[i] when `gated[i]`.
  void Start(std::vector<bool> gated, bool preserve_ordering = false) {
    std::vector<std::unique_ptr<backends::ModelInstance>> list;
    for (size_t i = 0; i < gated.size(); ++i) {
      auto inst = std::make_unique<GatedInstance>(gated[i] ? &gates_[i] : nullptr);
      instances_.push_back(inst.get());
      list.push_back(std::move(inst));
    }
    pool_ = std::make_unique<InstancePool>(
        InstancePool::Options{.model_name = "m", .version = 3, .stats = &stats_,
                              .preserve_ordering = preserve_ordering},
        std::move(list), [this](size_t i) {
          std::lock_guard<std::mutex> lock(mu_);
          freed_.push_back(i);
          cv_.notify_all();
        });
  }

  std::unique_ptr<core::InferRequest> Request(const std::string& id,
                                              std::shared_ptr<core::CancellationToken> cancel = nullptr) {
    auto r = std::make_unique<core::InferRequest>();
    r->id = id;
    r->cancel = std::move(cancel);
    r->times.received_ns = core::NowNs();
    r->times.queue_start_ns = r->times.received_ns;
    r->on_complete = [this, id](std::unique_ptr<core::InferResponse> resp) {
      std::lock_guard<std::mutex> lock(mu_);
      completed_.push_back(id);
      status_[id] = resp->status;
      if (!resp->outputs.empty()) output_[id] = std::string(resp->outputs[0].data);
      if (resp->status.ok()) {
        EXPECT_EQ(resp->model_name, "m");
        EXPECT_EQ(resp->model_version, 3);
      }
      cv_.notify_all();
    };
    return r;
  }

  Batch BatchOf(std::vector<std::unique_ptr<core::InferRequest>> requests,
                std::vector<uint64_t> order = {}) {
    Batch b;
    b.requests = std::move(requests);
    b.order = std::move(order);
    return b;
  }

  void Submit(size_t instance, std::unique_ptr<core::InferRequest> r, std::vector<uint64_t> order = {}) {
    std::vector<std::unique_ptr<core::InferRequest>> v;
    v.push_back(std::move(r));
    pool_->Submit(instance, BatchOf(std::move(v), std::move(order)));
  }

  void WaitCompleted(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(10), [&] { return completed_.size() >= n; }));
  }
  void WaitFreed(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(10), [&] { return freed_.size() >= n; }));
  }

  void TearDown() override {
    for (auto& g : gates_) g.Notify();
    pool_.reset();
  }

  Done gates_[2];
  std::vector<GatedInstance*> instances_;
  metrics::ModelStats stats_;
  std::unique_ptr<InstancePool> pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> completed_;
  std::map<std::string, absl::Status> status_;
  std::map<std::string, std::string> output_;
  std::vector<size_t> freed_;
};

TEST_F(InstancePoolTest, RunsABatchCountsItAndFreesTheInstance) {
  Start({false});
  ASSERT_EQ(pool_->FreeInstance(), 0u);
  std::vector<std::unique_ptr<core::InferRequest>> v;
  v.push_back(Request("a"));
  v.push_back(Request("b"));
  pool_->Submit(0, BatchOf(std::move(v)));
  WaitCompleted(2);
  WaitFreed(1);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(output_["a"], "a");
  EXPECT_EQ(output_["b"], "b");
  EXPECT_EQ(instances_[0]->runs.load(), 1);
  const auto s = stats_.Snapshot();
  EXPECT_EQ(s.success.count, 2u);
  EXPECT_EQ(s.execution_count, 1u);
  EXPECT_EQ(s.inference_count, 2u);
  EXPECT_EQ(pool_->Executing(), 0u);
  EXPECT_TRUE(pool_->IsFree(0));
}

TEST_F(InstancePoolTest, BusyInstanceIsNotFreeAndRefusesASecondBatch) {
  Start({true, false});
  Submit(0, Request("held"));
  ASSERT_TRUE(instances_[0]->started.Wait());
  EXPECT_FALSE(pool_->IsFree(0));
  EXPECT_EQ(pool_->FreeInstance(), 1u);
  EXPECT_EQ(pool_->Executing(), 1u);
  Submit(0, Request("extra"));  // a scheduler bug: answered, not queued behind
  WaitCompleted(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(status_["extra"].code(), absl::StatusCode::kInternal);
    EXPECT_THAT(status_["extra"].message(), HasSubstr("busy"));
  }
  gates_[0].Notify();
  WaitCompleted(2);
}

TEST_F(InstancePoolTest, PreserveOrderingDeliversInArrivalOrderAcrossInstances) {
  Start({true, false}, /*preserve_ordering=*/true);
  Submit(0, Request("first"), {0});
  ASSERT_TRUE(instances_[0]->started.Wait());
  Submit(1, Request("second"), {1});
  ASSERT_TRUE(instances_[1]->started.Wait());
  WaitFreed(1);  // instance 1 is done, its response held back
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_TRUE(completed_.empty());
  }
  gates_[0].Notify();
  WaitCompleted(2);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_THAT(completed_, ElementsAre("first", "second"));
}

TEST_F(InstancePoolTest, DeliverKeepsTheArrivalPlaceOfADroppedRequest) {
  Start({false}, /*preserve_ordering=*/true);
  Submit(0, Request("late"), {1});
  WaitFreed(1);
  std::vector<std::pair<uint64_t, std::function<void()>>> done;
  done.emplace_back(0, [this] {
    std::lock_guard<std::mutex> lock(mu_);
    completed_.push_back("dropped");
    cv_.notify_all();
  });
  pool_->Deliver(std::move(done));
  WaitCompleted(2);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_THAT(completed_, ElementsAre("dropped", "late"));
}

TEST_F(InstancePoolTest, RunningBatchStopsWhenAllItsClientsCancel) {
  Start({true});
  auto t1 = std::make_shared<core::CancellationToken>();
  auto t2 = std::make_shared<core::CancellationToken>();
  std::vector<std::unique_ptr<core::InferRequest>> v;
  v.push_back(Request("a", t1));
  v.push_back(Request("b", t2));
  pool_->Submit(0, BatchOf(std::move(v)));
  ASSERT_TRUE(instances_[0]->started.Wait());
  t1->Cancel();
  EXPECT_EQ(instances_[0]->cancel_calls.load(), 0);  // "b" still waits
  t2->Cancel();
  WaitCompleted(2);
  EXPECT_EQ(instances_[0]->cancel_calls.load(), 1);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(status_["a"].code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(status_["a"].message(), HasSubstr("cancelled by the client"));
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kCanceled)], 2u);
}

TEST_F(InstancePoolTest, RunningOneRequestBatchStopsWhenItsClientCancels) {
  Start({true});
  auto t = std::make_shared<core::CancellationToken>();
  std::vector<std::unique_ptr<core::InferRequest>> v;
  v.push_back(Request("a", t));
  pool_->Submit(0, BatchOf(std::move(v)));
  ASSERT_TRUE(instances_[0]->started.Wait());
  t->Cancel();
  WaitCompleted(1);
  EXPECT_EQ(instances_[0]->cancel_calls.load(), 1);
  // The run is over: a later cancel of the same token reaches no instance.
  t->Cancel();
  EXPECT_EQ(instances_[0]->cancel_calls.load(), 1);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(status_["a"].code(), absl::StatusCode::kCancelled);
}

TEST_F(InstancePoolTest, RequestCancelledBeforeItStartsNeverRuns) {
  Start({false});
  auto token = std::make_shared<core::CancellationToken>();
  token->Cancel();
  std::vector<std::unique_ptr<core::InferRequest>> v;
  v.push_back(Request("gone", token));
  v.push_back(Request("kept"));
  pool_->Submit(0, BatchOf(std::move(v)));
  WaitCompleted(2);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(status_["gone"].code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(status_["kept"].ok());
  EXPECT_EQ(instances_[0]->batch_sizes.load(), 1u);  // only "kept" ran
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kCanceled)], 1u);
}

TEST_F(InstancePoolTest, ShutdownDeliversWhatWasSubmittedThenRefuses) {
  Start({true});
  Submit(0, Request("running"));
  ASSERT_TRUE(instances_[0]->started.Wait());
  std::atomic<bool> returned{false};
  std::thread stopper([&] {
    pool_->Shutdown();
    returned.store(true);
  });
  // Not before the running batch is delivered.
  EXPECT_FALSE(returned.load());
  gates_[0].Notify();
  stopper.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_THAT(completed_, ElementsAre("running"));
    EXPECT_TRUE(status_["running"].ok());
  }
  EXPECT_FALSE(pool_->FreeInstance().has_value());
  Submit(0, Request("after"));
  WaitCompleted(2);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(status_["after"].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status_["after"].message(), HasSubstr("unloading"));
}

TEST_F(InstancePoolTest, SubmitAnyQueuesInOrderForTheFirstFreeInstanceAndIsBounded) {
  Start({true});
  auto one = [&](const std::string& id) {
    Batch b;
    b.requests.push_back(Request(id));
    return b;
  };
  pool_->SubmitAny(one("a"), 2);
  ASSERT_TRUE(instances_[0]->started.Wait());
  pool_->SubmitAny(one("b"), 2);
  pool_->SubmitAny(one("c"), 2);
  EXPECT_EQ(pool_->Queued(), 2u);
  EXPECT_EQ(pool_->InFlight(), 3u);
  pool_->SubmitAny(one("d"), 2);  // the queue is full: refused at once
  WaitCompleted(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(status_["d"].code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(status_["d"].message(), HasSubstr("2 requests queued"));
  }
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kRejected)], 1u);
  gates_[0].Notify();
  WaitCompleted(4);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_THAT(completed_, ElementsAre("d", "a", "b", "c"));
}

TEST_F(InstancePoolTest, QueuedBatchPastItsDeadlineIsHandedBackUnrun) {
  Start({true});
  Submit(0, Request("busy"));
  ASSERT_TRUE(instances_[0]->started.Wait());
  Batch late;
  late.requests.push_back(Request("late"));
  late.deadline_ns = core::NowNs();  // passed by the time the instance is free
  late.expired = [this](std::unique_ptr<core::InferRequest> r, uint64_t) {
    core::CompleteWithError(std::move(r), absl::DeadlineExceededError("expired"));
  };
  pool_->SubmitAny(std::move(late), 10);
  Batch kept;
  kept.requests.push_back(Request("kept"));
  pool_->SubmitAny(std::move(kept), 10);
  // The sweep's view: take what is abandoned out of the queue.
  auto taken = pool_->TakeQueuedIf([](const Batch& b) { return b.requests.front()->id == "kept"; });
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(pool_->Queued(), 1u);
  gates_[0].Notify();
  WaitCompleted(2);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(status_["late"].code(), absl::StatusCode::kDeadlineExceeded);
  }
  EXPECT_EQ(instances_[0]->runs.load(), 1);  // only "busy" ran
  core::CompleteWithError(std::move(taken[0].requests[0]), absl::CancelledError("taken"));
}

TEST(DeadlineSweeperTest, SweepsAtTheTimeAskedAndWhenWoken) {
  DeadlineSweeper sweeper;
  std::mutex mu;
  std::condition_variable cv;
  int sweeps = 0;
  auto client = sweeper.Register([&](uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ++sweeps;
    cv.notify_all();
    return uint64_t{0};
  });
  auto wait_sweeps = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return sweeps >= n; });
  };
  client->WakeAt(core::NowNs() + 20'000'000);  // 20 ms
  EXPECT_TRUE(wait_sweeps(1));
  client->WakeNow();
  EXPECT_TRUE(wait_sweeps(2));
  client.reset();  // unregisters; the sweeper's thread joins cleanly
}

TEST(DeadlineSweeperTest, ASweepAsksForItsNextDeadline) {
  DeadlineSweeper sweeper;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> at;
  auto client = sweeper.Register([&](uint64_t now) {
    std::lock_guard<std::mutex> lock(mu);
    at.push_back(now);
    cv.notify_all();
    return at.size() == 1 ? now + 5'000'000 : uint64_t{0};  // once more, 5 ms later
  });
  client->WakeNow();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return at.size() >= 2; }));
  EXPECT_GE(at[1], at[0] + 5'000'000);
}

}  // namespace
}  // namespace inferd::scheduling

namespace inferd::scheduling {
namespace {

// An idle instance woken for a queued batch that someone else took first (a cancelled or
// expired request swept out of the queue) must stay wakeable: the queue is not left to wait
// forever for a wake-up no one sends (seen as a whole server stalling under wrk, whose closing
// connections cancel what they had queued).
TEST_F(InstancePoolTest, AnInstanceWokenForATakenBatchCanBeWokenAgain) {
  Start({false});
  for (int i = 0; i < 300; ++i) {
    Batch gone;
    gone.requests.push_back(Request("gone" + std::to_string(i)));
    pool_->SubmitAny(std::move(gone), 10);
    // Taken back before the instance gets to it (most of the time: the wake-up is slower).
    auto taken = pool_->TakeQueuedIf([](const Batch&) { return true; });
    for (auto& b : taken) {
      core::CompleteWithError(std::move(b.requests[0]), absl::CancelledError("taken"));
    }
    Batch next;
    next.requests.push_back(Request("next" + std::to_string(i)));
    pool_->SubmitAny(std::move(next), 10);
    WaitCompleted(2 * static_cast<size_t>(i) + 2);
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_EQ(completed_.size(), 2 * static_cast<size_t>(i) + 2) << "stalled at round " << i;
  }
}

}  // namespace
}  // namespace inferd::scheduling
