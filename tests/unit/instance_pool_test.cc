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

// Caller runs (InstancePool::SubmitAny with Options::caller_runs): a model whose runs take
// microseconds runs on the submitting thread when an instance is idle and nothing is queued.
class ThreadRecordingInstance : public backends::ModelInstance {
 public:
  ThreadRecordingInstance(bool any_thread, std::chrono::microseconds run_time, Done* gate = nullptr)
      : any_thread_(any_thread), run_time_(run_time), gate_(gate) {}
  bool RunsOnAnyThread() const override { return any_thread_; }
  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses,
               backends::ExecutionTimes*) override {
    const int concurrent = in_execute_.fetch_add(1) + 1;
    int seen = max_concurrent.load();
    while (concurrent > seen && !max_concurrent.compare_exchange_weak(seen, concurrent)) {
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.push_back(std::this_thread::get_id());
    }
    started.Notify();
    if (gate_ != nullptr && gated_.load()) EXPECT_TRUE(gate_->Wait(std::chrono::seconds(30)));
    if (run_time_.count() > 0) std::this_thread::sleep_for(run_time_);
    for (size_t i = 0; i < requests.size(); ++i) {
      auto holder = std::make_shared<std::string>(requests[i]->id);
      responses[i]->outputs.push_back({"y", DataType::kBytes, {1}, *holder, holder});
    }
    in_execute_.fetch_sub(1);
  }
  std::thread::id ThreadOfRun(size_t k) {
    std::lock_guard<std::mutex> lock(mu_);
    return k < threads.size() ? threads[k] : std::thread::id();
  }
  void Gate(bool on) { gated_.store(on); }

  std::atomic<int> max_concurrent{0};
  Done started;

 private:
  const bool any_thread_;
  const std::chrono::microseconds run_time_;
  Done* gate_;
  std::atomic<bool> gated_{false};
  std::atomic<int> in_execute_{0};
  std::mutex mu_;
  std::vector<std::thread::id> threads;
};

class CallerRunsTest : public InstancePoolTest {
 protected:
  // A run counts as short up to `max_run` (a second by default: a loaded machine may stop a
  // run of nothing for milliseconds, and that must not make the tests flaky).
  ThreadRecordingInstance* StartOne(bool any_thread, std::chrono::microseconds run_time,
                                    bool caller_runs = true,
                                    std::chrono::nanoseconds max_run = std::chrono::seconds(1)) {
    auto inst = std::make_unique<ThreadRecordingInstance>(any_thread, run_time, &gates_[0]);
    ThreadRecordingInstance* raw = inst.get();
    std::vector<std::unique_ptr<backends::ModelInstance>> list;
    list.push_back(std::move(inst));
    pool_ = std::make_unique<InstancePool>(
        InstancePool::Options{.model_name = "m", .version = 3, .stats = &stats_,
                              .caller_runs = caller_runs,
                              .caller_run_max_ns = static_cast<uint64_t>(max_run.count())},
        std::move(list), nullptr);
    return raw;
  }
  // Until the instance is free again: its thread frees it just after the answer went out.
  void WaitIdle() {
    for (int i = 0; i < 2000 && pool_->Executing() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(pool_->Executing(), 0u);
  }
  // SubmitAny of one request; true when it was answered before SubmitAny returned.
  bool SubmitOne(const std::string& id) {
    Batch b;
    b.requests.push_back(Request(id));
    pool_->SubmitAny(std::move(b), 100);
    std::lock_guard<std::mutex> lock(mu_);
    return status_.count(id) > 0;
  }
};

TEST_F(CallerRunsTest, ATinyModelRunsOnTheSubmittingThreadOnceItsRunTimeIsKnown) {
  ThreadRecordingInstance* inst = StartOne(/*any_thread=*/true, std::chrono::microseconds(0));
  SubmitOne("first");  // no run time known yet: the instance's thread runs it
  WaitCompleted(1);
  WaitIdle();
  EXPECT_NE(inst->ThreadOfRun(0), std::this_thread::get_id());
  for (int i = 0; i < 20; ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_TRUE(SubmitOne(id)) << id << " was not answered on the submitting thread";
    EXPECT_EQ(inst->ThreadOfRun(1 + i), std::this_thread::get_id());
  }
  WaitCompleted(21);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, st] : status_) EXPECT_TRUE(st.ok()) << id << ": " << st;
  EXPECT_EQ(output_["r7"], "r7");
  EXPECT_EQ(stats_.Snapshot().success.count, 21u);
  EXPECT_EQ(pool_->Executing(), 0u);
}

TEST_F(CallerRunsTest, NotForAnInstanceBoundToItsThreadNorWhenThePoolDoesNotAllowIt) {
  for (bool caller_runs : {true, false}) {
    ThreadRecordingInstance* inst =
        StartOne(/*any_thread=*/!caller_runs, std::chrono::microseconds(0), caller_runs);
    for (int i = 0; i < 5; ++i) {
      SubmitOne("x" + std::to_string(i));
      WaitCompleted(static_cast<size_t>(i) + 1);
      WaitIdle();
      EXPECT_NE(inst->ThreadOfRun(i), std::this_thread::get_id());
    }
    pool_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    completed_.clear();
    status_.clear();
  }
}

TEST_F(CallerRunsTest, NotForAModelWhoseRunsTakeLonger) {
  ThreadRecordingInstance* inst = StartOne(/*any_thread=*/true, std::chrono::microseconds(2000),
                                           /*caller_runs=*/true, std::chrono::microseconds(500));
  for (int i = 0; i < 4; ++i) {
    // Which thread ran it is the claim. Whether it was answered before SubmitAny returned is
    // not: the instance's thread may finish a 2 ms run while this thread is preempted.
    SubmitOne("s" + std::to_string(i));
    WaitCompleted(static_cast<size_t>(i) + 1);
    WaitIdle();
    EXPECT_NE(inst->ThreadOfRun(i), std::this_thread::get_id());
  }
}

// Starts a caller run of `id` on a thread of its own, held inside Execute by the gate, and
// waits until it runs (run number `run`).
std::thread HoldCallerRun(ThreadRecordingInstance* inst, size_t run,
                          const std::string& id,
                          const std::function<bool(const std::string&)>& submit) {
  inst->Gate(true);
  std::thread caller([submit, id] { submit(id); });
  for (int i = 0; i < 1000 && inst->ThreadOfRun(run) == std::thread::id(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  inst->Gate(false);
  return caller;
}

TEST_F(CallerRunsTest, WorkQueuedDuringACallerRunRunsOnThatThreadAfterItNeverAlongsideIt) {
  ThreadRecordingInstance* inst = StartOne(/*any_thread=*/true, std::chrono::microseconds(0));
  SubmitOne("warm");
  WaitCompleted(1);
  WaitIdle();
  ASSERT_TRUE(SubmitOne("warm2"));  // the run time is known: runs on this thread
  std::thread caller =
      HoldCallerRun(inst, 2, "held", [this](const std::string& id) { return SubmitOne(id); });
  const std::thread::id caller_id = caller.get_id();
  ASSERT_EQ(inst->ThreadOfRun(2), caller_id);
  // The only instance is held by `caller`'s run: queued, not run here, no thread woken.
  EXPECT_FALSE(SubmitOne("queued1"));
  EXPECT_FALSE(SubmitOne("queued2"));
  EXPECT_EQ(pool_->Queued(), 2u);
  gates_[0].Notify();
  caller.join();  // `caller` ran both before SubmitAny returned to it
  WaitCompleted(5);
  EXPECT_EQ(inst->ThreadOfRun(3), caller_id);
  EXPECT_EQ(inst->ThreadOfRun(4), caller_id);
  EXPECT_EQ(inst->max_concurrent.load(), 1);
  WaitIdle();
  EXPECT_TRUE(SubmitOne("after"));  // still caller runs: no hand-off mode was entered
  EXPECT_EQ(inst->ThreadOfRun(5), std::this_thread::get_id());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_TRUE(status_["queued1"].ok()) << status_["queued1"];
  EXPECT_EQ(output_["queued2"], "queued2");
  EXPECT_EQ(output_["held"], "held");
}

TEST_F(CallerRunsTest, ACallerRunTakesAtMost64QueuedRunsThenLeavesTheRestToTheInstanceThread) {
  ThreadRecordingInstance* inst = StartOne(/*any_thread=*/true, std::chrono::microseconds(0));
  SubmitOne("warm");
  WaitCompleted(1);
  WaitIdle();
  ASSERT_TRUE(SubmitOne("warm2"));
  std::thread caller =
      HoldCallerRun(inst, 2, "held", [this](const std::string& id) { return SubmitOne(id); });
  const std::thread::id caller_id = caller.get_id();
  ASSERT_EQ(inst->ThreadOfRun(2), caller_id);
  constexpr int kQueued = 70;
  for (int i = 0; i < kQueued; ++i) EXPECT_FALSE(SubmitOne("q" + std::to_string(i)));
  gates_[0].Notify();
  caller.join();
  WaitCompleted(3 + kQueued);
  // Its own run and 63 queued ones on `caller`, in order; the other 7 on the instance thread.
  for (int k = 2; k < 2 + 64; ++k) EXPECT_EQ(inst->ThreadOfRun(k), caller_id) << k;
  for (int k = 2 + 64; k < 3 + kQueued; ++k) {
    EXPECT_NE(inst->ThreadOfRun(k), caller_id) << k;
    EXPECT_NE(inst->ThreadOfRun(k), std::this_thread::get_id()) << k;
  }
  EXPECT_EQ(inst->max_concurrent.load(), 1);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(output_["q69"], "q69");
}

TEST_F(CallerRunsTest, WorkQueuedBehindTheInstanceThreadRunsThereThenCallerRunsResume) {
  ThreadRecordingInstance* inst = StartOne(/*any_thread=*/true, std::chrono::microseconds(0));
  // No run time known yet: the instance's thread runs "held" (held by the gate).
  inst->Gate(true);
  SubmitOne("held");
  for (int i = 0; i < 1000 && inst->ThreadOfRun(0) == std::thread::id(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  inst->Gate(false);
  const std::thread::id instance_thread = inst->ThreadOfRun(0);
  ASSERT_NE(instance_thread, std::this_thread::get_id());
  // Every instance busy on its own thread: queued for it.
  EXPECT_FALSE(SubmitOne("queued"));
  gates_[0].Notify();
  WaitCompleted(2);
  EXPECT_EQ(inst->ThreadOfRun(1), instance_thread);
  // The instance thread ran the queue dry and sleeps (Executing() is 0 only once it waits):
  // caller runs again.
  WaitIdle();
  EXPECT_TRUE(SubmitOne("after"));
  EXPECT_EQ(inst->ThreadOfRun(2), std::this_thread::get_id());
  EXPECT_EQ(inst->max_concurrent.load(), 1);
}

}  // namespace
}  // namespace inferd::scheduling
