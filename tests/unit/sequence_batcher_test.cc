// SequenceBatcher with an accumulator instance (OUT = ACC + X, state ACC / ACC_OUT): state
// carried between requests, control inputs, refusals, the idle limit on an injected clock, the
// backlog, and `oldest` batching several sequences into one execution.
#include "scheduling/sequence_batcher.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::scheduling {
namespace {

using ::testing::HasSubstr;

int32_t I32(std::string_view d) {
  int32_t v;
  std::memcpy(&v, d.data(), 4);
  return v;
}

// A notification on std::mutex (the instance thread answers, the test thread reads): Debian's
// Abseil is not built with ThreadSanitizer, which would not see absl::Notification's ordering.
class Done {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  bool HasBeenNotified() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [this] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// OUT = ACC + X and ACC_OUT = the same; START_OUT echoes START; records batch sizes. With a
// gate, each execution first waits until the gate opens or the run is cancelled (then it
// fails, as a backend whose run was stopped).
class Accumulator : public backends::ModelInstance {
 public:
  Accumulator(std::vector<size_t>* batches, inferd::Mutex* mu, Done* gate = nullptr,
              Done* running = nullptr)
      : batches_(batches), mu_(mu), gate_(gate), running_(running) {}
  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, backends::ExecutionTimes*) override {
    {
      inferd::MutexLock lock(mu_);
      batches_->push_back(requests.size());
    }
    stopped_.store(false);  // a stop asked for during an earlier run
    if (running_ != nullptr) running_->Notify();
    if (gate_ != nullptr) EXPECT_TRUE(gate_->WaitForNotificationWithTimeout(absl::Seconds(30)));
    if (stopped_.load()) {
      for (auto* r : responses) r->status = absl::CancelledError("run stopped");
      return;
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      const core::InputTensor* x = requests[i]->FindInput("X");
      const core::InputTensor* acc = requests[i]->FindInput("ACC");
      const core::InputTensor* start = requests[i]->FindInput("START");
      const core::InputTensor* corrid = requests[i]->FindInput("CORRID");
      if (!x || !acc || !start || !corrid) {
        responses[i]->status = absl::InternalError("missing input");
        continue;
      }
      auto holder = std::make_shared<std::string>();
      const int32_t sum = I32(x->data) + I32(acc->data);
      holder->append(reinterpret_cast<const char*>(&sum), 4);
      holder->append(start->data);
      holder->append(corrid->data);
      std::string_view all = *holder;
      responses[i]->outputs.push_back({"OUT", DataType::kInt32, {1, 1}, all.substr(0, 4), holder});
      responses[i]->outputs.push_back({"ACC_OUT", DataType::kInt32, {1, 1}, all.substr(0, 4), holder});
      responses[i]->outputs.push_back({"START_OUT", DataType::kInt32, {1, 1}, all.substr(4, 4), holder});
      responses[i]->outputs.push_back({"CORRID_OUT", DataType::kUint64, {1, 1}, all.substr(8, 8), holder});
    }
  }
  void CancelExecution() override {
    cancel_calls.fetch_add(1);
    stopped_.store(true);
    if (gate_ != nullptr) gate_->Notify();
  }
  std::atomic<int> cancel_calls{0};

 private:
  std::vector<size_t>* batches_;
  inferd::Mutex* mu_;
  Done* gate_;
  Done* running_;
  std::atomic<bool> stopped_{false};
};

struct Result {
  Done done;
  absl::Status status;
  std::map<std::string, std::string> outputs;
};

class SequenceBatcherTest : public ::testing::Test {
 protected:
  void Start(const std::string& strategy, int max_batch_size = 2, int instances = 1,
             uint64_t idle_us = 0, bool gated = false) {
    auto cfg = config::ParseModelConfigText(
        "name: \"m\" backend: \"identity\" max_batch_size: " + std::to_string(max_batch_size) +
            " input [{name: \"X\" data_type: TYPE_INT32 dims: [1]}] "
            "output [{name: \"OUT\" data_type: TYPE_INT32 dims: [1]}, "
            "{name: \"START_OUT\" data_type: TYPE_INT32 dims: [1]}, "
            "{name: \"CORRID_OUT\" data_type: TYPE_UINT64 dims: [1]}] "
            "sequence_batching { " + strategy +
            (idle_us ? " max_sequence_idle_microseconds: " + std::to_string(idle_us) : "") +
            " control_input [{name: \"START\" control [{kind: CONTROL_SEQUENCE_START "
            "int32_false_true: [0, 1]}]}, {name: \"CORRID\" control [{kind: "
            "CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64}]}] "
            "state [{input_name: \"ACC\" output_name: \"ACC_OUT\" data_type: TYPE_INT32 dims: [1]}] }",
        "c");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    std::vector<std::unique_ptr<backends::ModelInstance>> list;
    for (int i = 0; i < instances; ++i) {
      auto instance = std::make_unique<Accumulator>(&batches_, &mu_, gated ? &gate_ : nullptr,
                                                    gated ? &running_ : nullptr);
      if (i == 0) first_ = instance.get();
      list.push_back(std::move(instance));
    }
    auto b = SequenceBatcher::Create(*cfg, "/nonexistent", 1, std::move(list), 2, &stats_,
                                     [this] { return now_.load(); });
    ASSERT_TRUE(b.ok()) << b.status();
    batcher_ = *std::move(b);
  }

  std::shared_ptr<Result> Send(uint64_t seq, int32_t x, bool start = false, bool end = false,
                               std::shared_ptr<core::CancellationToken> cancel = nullptr) {
    auto r = std::make_unique<core::InferRequest>();
    r->cancel = std::move(cancel);
    r->sequence_id.number = seq;
    r->sequence_start = start;
    r->sequence_end = end;
    r->owned.emplace_back(reinterpret_cast<const char*>(&x), 4);
    r->inputs.push_back({"X", DataType::kInt32, {1, 1}, r->owned.back()});
    r->times.received_ns = core::NowNs();
    auto result = std::make_shared<Result>();
    r->on_complete = [result](std::unique_ptr<core::InferResponse> resp) {
      result->status = resp->status;
      for (const auto& o : resp->outputs) result->outputs[o.name] = std::string(o.data);
      result->done.Notify();
    };
    batcher_->Enqueue(std::move(r));
    return result;
  }
  std::shared_ptr<Result> Wait(std::shared_ptr<Result> r) {
    EXPECT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return r;
  }
  // Until the instance thread has marked every sequence idle again (it does so right after
  // delivering the answers).
  void WaitIdle() {
    for (int i = 0; i < 10000 && batcher_->InFlight() != 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  }

  // A test that failed with the instance still held must not hang in the batcher's shutdown.
  void TearDown() override {
    gate_.Notify();
    batcher_.reset();
  }

  Done gate_;
  Done running_;
  Accumulator* first_ = nullptr;
  std::atomic<uint64_t> now_{1000};
  inferd::Mutex mu_;
  std::vector<size_t> batches_;
  metrics::ModelStats stats_;
  std::unique_ptr<SequenceBatcher> batcher_;
};

TEST_F(SequenceBatcherTest, CarriesStateAndInjectsControls) {
  Start("direct {}");
  auto a = Wait(Send(7, 5, /*start=*/true));
  ASSERT_TRUE(a->status.ok()) << a->status;
  EXPECT_EQ(I32(a->outputs["OUT"]), 5);
  EXPECT_EQ(I32(a->outputs["START_OUT"]), 1);
  uint64_t corrid;
  std::memcpy(&corrid, a->outputs["CORRID_OUT"].data(), 8);
  EXPECT_EQ(corrid, 7u);
  EXPECT_EQ(a->outputs.count("ACC_OUT"), 0u);  // the state stays in the server
  auto b = Wait(Send(7, 3));
  EXPECT_EQ(I32(b->outputs["OUT"]), 8);
  EXPECT_EQ(I32(b->outputs["START_OUT"]), 0);
  auto c = Wait(Send(7, -1, false, /*end=*/true));
  EXPECT_EQ(I32(c->outputs["OUT"]), 7);
  auto d = Wait(Send(7, 1));
  EXPECT_EQ(d->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d->status.message(), HasSubstr("sequence 7 to model 'm' must specify the START flag"));
}

TEST_F(SequenceBatcherTest, CancelledRequestIsAnsweredUnrunAndLeavesTheState) {
  Start("direct {}");
  ASSERT_TRUE(Wait(Send(3, 10, true))->status.ok());
  auto token = std::make_shared<core::CancellationToken>();
  token->Cancel();
  auto r = Wait(Send(3, 100, false, false, token));
  EXPECT_EQ(r->status.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(r->status.message(), HasSubstr("sequence 3"));
  EXPECT_EQ(I32(Wait(Send(3, 1, false, true))->outputs["OUT"]), 11);
}

// A running sequence batch whose every client has gone is stopped (ModelInstance::
// CancelExecution), answered CANCELLED and counted CANCELED, as under the other schedulers.
TEST_F(SequenceBatcherTest, RunningBatchIsStoppedWhenItsClientCancels) {
  Start("direct {}", 2, 1, 0, /*gated=*/true);
  auto token = std::make_shared<core::CancellationToken>();
  auto r = Send(5, 1, /*start=*/true, false, token);
  ASSERT_TRUE(running_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  token->Cancel();
  Wait(r);
  EXPECT_EQ(first_->cancel_calls.load(), 1);
  EXPECT_EQ(r->status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kCanceled)], 1u);
  // The sequence goes on from the state it had before the stopped request (the initial 0).
  auto next = Wait(Send(5, 3));
  ASSERT_TRUE(next->status.ok()) << next->status;
  EXPECT_EQ(I32(next->outputs["OUT"]), 3);
}

// One tensor named for two controls would carry whichever was written last (Triton refuses it:
// qa/L0_model_config control_tensor_multiple).
TEST(SequenceBackendConfigTest, RefusesOneTensorForTwoControls) {
  auto cfg = config::ParseModelConfigText(
      "name: \"m\" backend: \"identity\" max_batch_size: 2 "
      "input [{name: \"X\" data_type: TYPE_INT32 dims: [1]}] "
      "output [{name: \"OUT\" data_type: TYPE_INT32 dims: [1]}] "
      "sequence_batching { control_input ["
      "{name: \"START\" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]}, "
      "{name: \"START\" control [{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}]}] }",
      "c");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto backend = SequenceBackendConfig(*cfg);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(backend.status().message(), HasSubstr("control tensor 'START'"));
}

TEST_F(SequenceBatcherTest, RefusesRequestsWithoutACorrelationId) {
  Start("direct {}");
  auto r = Wait(Send(0, 1, true));
  EXPECT_EQ(r->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r->status.message(), HasSubstr("non-zero or non-empty correlation ID"));
}

TEST_F(SequenceBatcherTest, IdleSequenceLosesItsSlot) {
  Start("direct {}", 1, 1, /*idle_us=*/1000);
  ASSERT_TRUE(Wait(Send(1, 1, true))->status.ok());
  WaitIdle();
  now_ += 999'000;  // just inside the limit
  EXPECT_EQ(I32(Wait(Send(1, 1))->outputs["OUT"]), 2);
  WaitIdle();
  now_ += 1'000'001;
  auto r = Wait(Send(1, 1));
  EXPECT_EQ(r->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r->status.message(), HasSubstr("idle longer than max_sequence_idle_microseconds (1000 us)"));
  // Its slot is free: a new sequence starts at once.
  EXPECT_TRUE(Wait(Send(2, 1, true))->status.ok());
}

TEST_F(SequenceBatcherTest, NewSequenceWaitsInTheBacklogForASlot) {
  Start("direct {}", 1);  // one slot
  ASSERT_TRUE(Wait(Send(1, 10, true))->status.ok());
  auto second = Send(2, 4, true);
  EXPECT_FALSE(second->done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_EQ(I32(Wait(Send(1, 1, false, true))->outputs["OUT"]), 11);
  EXPECT_EQ(I32(Wait(second)->outputs["OUT"]), 4);
}

TEST_F(SequenceBatcherTest, OldestBatchesDifferentSequences) {
  Start("oldest { max_candidate_sequences: 4 preferred_batch_size: [4] "
        "max_queue_delay_microseconds: 10000000 }", 4);
  std::vector<std::shared_ptr<Result>> rs;
  for (uint64_t s = 1; s <= 4; ++s) rs.push_back(Send(s, static_cast<int32_t>(s), true));
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(I32(Wait(rs[i])->outputs["OUT"]), static_cast<int32_t>(i + 1));
  }
  inferd::MutexLock lock(&mu_);
  EXPECT_EQ(batches_, std::vector<size_t>{4});
}

}  // namespace
}  // namespace inferd::scheduling
