// EnsembleScheduler and BuildEnsembleGraph: graph checks with their exact messages, data-flow
// dispatch (independent steps together, a step once its inputs exist), zero-copy hand-off,
// error propagation naming the step, requested outputs, max_inflight_requests backpressure.
// Steps go to a hand-pumped dispatcher standing in for the server, so every interleaving here
// is deterministic.
#include "scheduling/ensemble_scheduler.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <thread>

#include "core/response_sender.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::scheduling {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// (A + B)^2 and A - B: "add" and "sub" are independent, "square" reads add's output.
constexpr char kEnsemble[] = R"pb(
  name: "ens"
  platform: "ensemble"
  input { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }
  input { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
  output { name: "SUM_SQ" data_type: TYPE_FP32 dims: [ 4 ] }
  output { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] }
  ensemble_scheduling {
    step {
      model_name: "add" model_version: -1
      input_map { key: "X" value: "A" }
      input_map { key: "Y" value: "B" }
      output_map { key: "Z" value: "s" }
    }
    step {
      model_name: "sub" model_version: -1
      input_map { key: "X" value: "A" }
      input_map { key: "Y" value: "B" }
      output_map { key: "Z" value: "DIFF" }
    }
    step {
      model_name: "square" model_version: 2
      input_map { key: "X" value: "s" }
      output_map { key: "Z" value: "SUM_SQ" }
    }
  }
)pb";

config::ModelConfig Parse(const std::string& text) {
  auto cfg = config::ParseModelConfigText(text, "test");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return *cfg;
}

std::string GraphError(const std::string& text) {
  auto g = BuildEnsembleGraph(Parse(text));
  EXPECT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(g.status().message());
}

// Holds step requests until the test runs or fails them.
class Pump {
 public:
  StepDispatcher Dispatcher() {
    return [this](std::unique_ptr<core::InferRequest> r) {
      inferd::MutexLock lock(&mu_);
      pending_.push_back(std::move(r));
    };
  }
  std::vector<std::string> Pending() {
    inferd::MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (const auto& r : pending_) names.push_back(r->model_name);
    return names;
  }
  std::unique_ptr<core::InferRequest> Take(const std::string& model) {
    inferd::MutexLock lock(&mu_);
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if ((*it)->model_name == model) {
        auto r = std::move(*it);
        pending_.erase(it);
        return r;
      }
    }
    ADD_FAILURE() << "no pending step for model " << model;
    return nullptr;
  }
  // Runs the fake model `model` on its pending request; returns the input pointers it read.
  std::vector<const char*> Run(const std::string& model) {
    auto r = Take(model);
    std::vector<const char*> seen;
    for (const auto& in : r->inputs) seen.push_back(in.data.data());
    auto x = Floats(*r->FindInput("X"));
    std::vector<float> z(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      if (model == "square") {
        z[i] = x[i] * x[i];
      } else {
        const float y = Floats(*r->FindInput("Y"))[i];
        z[i] = model == "add" ? x[i] + y : x[i] - y;
      }
    }
    auto bytes = std::make_shared<std::string>(reinterpret_cast<const char*>(z.data()),
                                               z.size() * sizeof(float));
    auto resp = std::make_unique<core::InferResponse>();
    core::OutputTensor out;
    out.name = "Z";
    out.datatype = DataType::kFp32;
    out.shape = {static_cast<int64_t>(z.size())};
    out.data = *bytes;
    out.holder = bytes;
    output_pointers_[model] = bytes->data();
    resp->outputs.push_back(std::move(out));
    auto cb = std::move(r->on_complete);
    r.reset();
    cb(std::move(resp));
    return seen;
  }
  // The pending step request for `model` (still owned by the pump), or null.
  const core::InferRequest* Peek(const std::string& model) {
    inferd::MutexLock lock(&mu_);
    for (const auto& r : pending_) {
      if (r->model_name == model) return r.get();
    }
    return nullptr;
  }
  // Fails every pending step (so a failed expectation does not leave the scheduler waiting).
  void FailAll() {
    std::vector<std::unique_ptr<core::InferRequest>> all;
    {
      inferd::MutexLock lock(&mu_);
      all.swap(pending_);
    }
    for (auto& r : all) core::CompleteWithError(std::move(r), absl::CancelledError("test end"));
  }
  void Fail(const std::string& model, absl::Status status) {
    auto r = Take(model);
    core::CompleteWithError(std::move(r), std::move(status));
  }
  const char* OutputPointer(const std::string& model) { return output_pointers_[model]; }

  static std::vector<float> Floats(const core::InputTensor& t) {
    std::vector<float> v(t.data.size() / sizeof(float));
    std::memcpy(v.data(), t.data.data(), t.data.size());
    return v;
  }

 private:
  inferd::Mutex mu_;
  std::vector<std::unique_ptr<core::InferRequest>> pending_;
  std::map<std::string, const char*> output_pointers_;
};

struct Result {
  std::unique_ptr<core::InferResponse> response;
  int calls = 0;
};

std::unique_ptr<core::InferRequest> MakeRequest(Result* result, std::vector<float> a,
                                                std::vector<float> b) {
  auto req = std::make_unique<core::InferRequest>();
  req->model_name = "ens";
  req->id = "req-1";
  for (auto [name, values] : {std::pair{"A", a}, std::pair{"B", b}}) {
    std::string& data = req->owned.emplace_back(reinterpret_cast<const char*>(values.data()),
                                                values.size() * sizeof(float));
    req->inputs.push_back({name, DataType::kFp32, {4}, data});
  }
  req->times.received_ns = core::NowNs();
  req->on_complete = [result](std::unique_ptr<core::InferResponse> r) {
    result->response = std::move(r);
    ++result->calls;
  };
  return req;
}

std::vector<float> OutputFloats(const core::InferResponse& r, const std::string& name) {
  for (const auto& o : r.outputs) {
    if (o.name == name) {
      std::vector<float> v(o.data.size() / sizeof(float));
      std::memcpy(v.data(), o.data.data(), o.data.size());
      return v;
    }
  }
  ADD_FAILURE() << "no output " << name;
  return {};
}

TEST(EnsembleGraphTest, BuildsStepsConsumersAndOrder) {
  auto g = BuildEnsembleGraph(Parse(kEnsemble));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->steps.size(), 3u);
  EXPECT_EQ(g->num_inputs, 2u);
  EXPECT_EQ(g->steps[0].model_version, -1);
  EXPECT_EQ(g->steps[2].model_version, 2);
  EXPECT_EQ(g->steps[0].distinct_inputs, 0u);  // reads only ensemble inputs
  EXPECT_EQ(g->steps[2].distinct_inputs, 1u);
  // "square" comes after "add" in any valid order.
  auto pos = [&](size_t s) { return std::find(g->order.begin(), g->order.end(), s) - g->order.begin(); };
  EXPECT_LT(pos(0), pos(2));
  EXPECT_EQ(g->order.size(), 3u);
  EXPECT_THAT(g->consumers[0], ElementsAre(0, 1));  // A is read by add and sub
}

TEST(EnsembleGraphTest, ErrorsNameTheStepAndTensor) {
  const std::string head = R"pb(
    name: "ens" platform: "ensemble"
    input { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }
    output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }
  )pb";
  EXPECT_EQ(GraphError(head), "ensemble 'ens': ensemble_scheduling must have at least one step");
  EXPECT_EQ(GraphError(head + R"pb(ensemble_scheduling { step {
      model_name: "m" input_map { key: "X" value: "nope" } output_map { key: "Z" value: "OUT" } } })pb"),
            "ensemble 'ens' step 0 (model 'm'): input 'X' reads tensor 'nope', which is neither an "
            "ensemble input nor written by any step");
  EXPECT_EQ(GraphError(head + R"pb(ensemble_scheduling {
      step { model_name: "m" input_map { key: "X" value: "A" } output_map { key: "Z" value: "OUT" } }
      step { model_name: "n" input_map { key: "X" value: "A" } output_map { key: "Z" value: "OUT" } } })pb"),
            "ensemble 'ens' step 1 (model 'n'): output 'Z' writes tensor 'OUT', which step 0 "
            "(model 'm') also writes");
  EXPECT_EQ(GraphError(head + R"pb(ensemble_scheduling { step {
      model_name: "m" input_map { key: "X" value: "A" } output_map { key: "Z" value: "other" } } })pb"),
            "ensemble 'ens': output 'OUT' is not written by any step");
  EXPECT_EQ(GraphError(head + R"pb(input { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
      ensemble_scheduling { step {
      model_name: "m" input_map { key: "X" value: "A" } output_map { key: "Z" value: "OUT" } } })pb"),
            "ensemble 'ens': input 'B' is not read by any step");
  EXPECT_EQ(GraphError(head + R"pb(ensemble_scheduling { step {
      model_name: "m" input_map { key: "X" value: "A" } output_map { key: "Z" value: "OUT" }
      output_map { key: "W" value: "spare" } } })pb"),
            "ensemble 'ens' step 0 (model 'm'): output 'W' writes tensor 'spare', which no step "
            "reads and is not an ensemble output");
  EXPECT_EQ(GraphError(head + R"pb(ensemble_scheduling {
      step { model_name: "m" input_map { key: "X" value: "A" } input_map { key: "Y" value: "t2" }
             output_map { key: "Z" value: "t1" } }
      step { model_name: "n" input_map { key: "X" value: "t1" } output_map { key: "Z" value: "t2" }
             output_map { key: "W" value: "OUT" } } })pb"),
            "ensemble 'ens' has a cycle: ensemble 'ens' step 0 (model 'm') reads, through other "
            "steps, a tensor that depends on its own output");
  EXPECT_EQ(GraphError(head + R"pb(ensemble_scheduling { step {
      model_name: "ens" input_map { key: "X" value: "A" } output_map { key: "Z" value: "OUT" } } })pb"),
            "ensemble 'ens' step 0 (model 'ens'): a step cannot run the ensemble itself");
  EXPECT_EQ(GraphError(head + R"pb(ensemble_scheduling { step {
      model_name: "m" input_map { key: "X" value: "A" } output_map { key: "Z" value: "A" } } })pb"),
            "ensemble 'ens' step 0 (model 'm'): output 'Z' writes tensor 'A', which is an "
            "ensemble input");
}

// Two outputs of one step writing one tensor (Triton's qa/L0_model_config
// output_to_tensor_overmapped): refused like two steps writing it. The message read the step's
// entry before it existed, and the server died at start-up (std::bad_alloc).
TEST(EnsembleGraphTest, TwoOutputsOfOneStepWritingOneTensorAreRefused) {
  EXPECT_EQ(GraphError(R"pb(
    name: "ens" platform: "ensemble"
    input { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }
    output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }
    ensemble_scheduling { step { model_name: "m" input_map { key: "X" value: "A" }
      output_map { key: "W" value: "OUT" } output_map { key: "Z" value: "OUT" } } })pb"),
            "ensemble 'ens' step 0 (model 'm'): output 'Z' writes tensor 'OUT', which another "
            "output of this step also writes");
}

class EnsembleSchedulerTest : public ::testing::Test {
 protected:
  void Make(const std::string& text, size_t max_queue = 16) {
    cfg_ = Parse(text);
    auto g = BuildEnsembleGraph(cfg_);
    ASSERT_TRUE(g.ok()) << g.status();
    scheduler_ = std::make_unique<EnsembleScheduler>(cfg_, 1, *std::move(g), pump_.Dispatcher(),
                                                     max_queue, &stats_);
  }
  config::ModelConfig cfg_;
  Pump pump_;
  metrics::ModelStats stats_;
  std::unique_ptr<EnsembleScheduler> scheduler_;
};

TEST_F(EnsembleSchedulerTest, RunsIndependentStepsTogetherAndPassesTensorsWithoutCopies) {
  Make(kEnsemble);
  Result result;
  scheduler_->Enqueue(MakeRequest(&result, {1, 2, 3, 4}, {10, 20, 30, 40}));
  // Both steps that read only ensemble inputs are in flight at once; "square" waits.
  EXPECT_THAT(pump_.Pending(), UnorderedElementsAre("add", "sub"));
  EXPECT_EQ(scheduler_->InFlight(), 1u);
  pump_.Run("add");
  EXPECT_THAT(pump_.Pending(), UnorderedElementsAre("sub", "square"));
  auto square_inputs = pump_.Run("square");
  // "square" read add's output buffer itself, not a copy.
  ASSERT_EQ(square_inputs.size(), 1u);
  EXPECT_EQ(square_inputs[0], pump_.OutputPointer("add"));
  EXPECT_EQ(result.calls, 0);
  pump_.Run("sub");
  ASSERT_EQ(result.calls, 1);
  ASSERT_TRUE(result.response->status.ok()) << result.response->status;
  EXPECT_EQ(result.response->model_name, "ens");
  EXPECT_EQ(result.response->model_version, 1);
  EXPECT_EQ(result.response->id, "req-1");
  EXPECT_THAT(OutputFloats(*result.response, "SUM_SQ"), ElementsAre(121, 484, 1089, 1936));
  EXPECT_THAT(OutputFloats(*result.response, "DIFF"), ElementsAre(-9, -18, -27, -36));
  // The ensemble's output is square's buffer, again without a copy.
  for (const auto& o : result.response->outputs) {
    if (o.name == "SUM_SQ") {
      EXPECT_EQ(o.data.data(), pump_.OutputPointer("square"));
    }
  }
  EXPECT_EQ(scheduler_->InFlight(), 0u);
  auto snap = stats_.Snapshot();
  EXPECT_EQ(snap.success.count, 1u);
  EXPECT_EQ(snap.fail.count, 0u);
}

TEST_F(EnsembleSchedulerTest, StepFailureFailsTheRequestOnceNamingTheStep) {
  Make(kEnsemble);
  Result result;
  scheduler_->Enqueue(MakeRequest(&result, {1, 2, 3, 4}, {1, 1, 1, 1}));
  pump_.Fail("sub", absl::InvalidArgumentError("input 'X' has shape [3]"));
  ASSERT_EQ(result.calls, 1);
  EXPECT_EQ(result.response->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.response->status.message(),
            "in ensemble 'ens' step 1 (model 'sub'): input 'X' has shape [3]");
  // Steps already in flight finish; nothing after them is dispatched, no second response.
  pump_.Run("add");
  EXPECT_THAT(pump_.Pending(), ElementsAre());
  EXPECT_EQ(result.calls, 1);
  EXPECT_EQ(scheduler_->InFlight(), 0u);
  EXPECT_EQ(stats_.Snapshot().fail.count, 1u);
}

TEST_F(EnsembleSchedulerTest, ReturnsOnlyRequestedOutputs) {
  Make(kEnsemble);
  Result result;
  auto req = MakeRequest(&result, {1, 2, 3, 4}, {1, 1, 1, 1});
  req->outputs.push_back({"DIFF"});
  scheduler_->Enqueue(std::move(req));
  pump_.Run("add");
  pump_.Run("sub");
  pump_.Run("square");
  ASSERT_EQ(result.calls, 1);
  ASSERT_EQ(result.response->outputs.size(), 1u);
  EXPECT_EQ(result.response->outputs[0].name, "DIFF");
  EXPECT_THAT(OutputFloats(*result.response, "DIFF"), ElementsAre(0, 1, 2, 3));
}

TEST_F(EnsembleSchedulerTest, MaxInflightRequestsHoldsLaterRequestsBack) {
  std::string text = kEnsemble;
  text.replace(text.find("ensemble_scheduling {"), 21,
               "ensemble_scheduling { max_inflight_requests: 1");
  Make(text, /*max_queue=*/1);
  Result first, second, third;
  scheduler_->Enqueue(MakeRequest(&first, {1, 1, 1, 1}, {1, 1, 1, 1}));
  scheduler_->Enqueue(MakeRequest(&second, {2, 2, 2, 2}, {1, 1, 1, 1}));
  // Only the first request's steps are out; the second waits; a third overflows the queue.
  EXPECT_THAT(pump_.Pending(), UnorderedElementsAre("add", "sub"));
  EXPECT_EQ(scheduler_->InFlight(), 2u);
  scheduler_->Enqueue(MakeRequest(&third, {3, 3, 3, 3}, {1, 1, 1, 1}));
  ASSERT_EQ(third.calls, 1);
  EXPECT_EQ(third.response->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(third.response->status.message(),
            "ensemble 'ens' has 1 requests in flight (max_inflight_requests) and 1 waiting, the "
            "limit (--max-queue-size); retry later");
  pump_.Run("add");
  pump_.Run("sub");
  pump_.Run("square");
  ASSERT_EQ(first.calls, 1);
  EXPECT_TRUE(first.response->status.ok());
  // The first one's completion started the second.
  EXPECT_THAT(pump_.Pending(), UnorderedElementsAre("add", "sub"));
  pump_.Run("add");
  pump_.Run("sub");
  pump_.Run("square");
  ASSERT_EQ(second.calls, 1);
  EXPECT_THAT(OutputFloats(*second.response, "SUM_SQ"), ElementsAre(9, 9, 9, 9));
  EXPECT_EQ(scheduler_->InFlight(), 0u);
}

TEST_F(EnsembleSchedulerTest, ShutdownWaitsForStepsInFlightAndRefusesNewRequests) {
  Make(kEnsemble);
  Result result, late;
  scheduler_->Enqueue(MakeRequest(&result, {1, 1, 1, 1}, {1, 1, 1, 1}));
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    scheduler_->Shutdown();
    done = true;
  });
  std::deque<Result> probes;  // a probe that gets in completes later: keep it alive
  while (true) {  // Shutdown has marked the scheduler stopping once a new request is refused.
    Result& probe = probes.emplace_back();
    scheduler_->Enqueue(MakeRequest(&probe, {1, 1, 1, 1}, {1, 1, 1, 1}));
    if (probe.response && !probe.response->status.ok()) {
      EXPECT_EQ(probe.response->status.message(), "model 'ens' version 1 is unloading");
      break;
    }
    pump_.Run("add");  // a probe that got in before Shutdown: drain it
    pump_.Run("sub");
    pump_.Run("square");
  }
  EXPECT_FALSE(done.load());
  pump_.Run("add");
  pump_.Run("sub");
  pump_.Run("square");
  stopper.join();
  EXPECT_TRUE(done.load());
  ASSERT_EQ(result.calls, 1);
  EXPECT_TRUE(result.response->status.ok());
}

// The client's cancellation reaches every step in flight through a token of its own (each
// holder installs its own listener), the steps still to come are never dispatched, and the
// ensemble answers CANCELLED, counted as such.
TEST_F(EnsembleSchedulerTest, ClientCancellationCancelsStepsInFlightAndStartsNoMore) {
  Make(kEnsemble);
  Result result;
  auto req = MakeRequest(&result, {1, 2, 3, 4}, {10, 20, 30, 40});
  auto token = std::make_shared<core::CancellationToken>();
  req->cancel = token;
  scheduler_->Enqueue(std::move(req));
  const core::InferRequest* add = pump_.Peek("add");
  const core::InferRequest* sub = pump_.Peek("sub");
  ASSERT_NE(add, nullptr);
  ASSERT_NE(sub, nullptr);
  EXPECT_NE(add->cancel, nullptr);
  EXPECT_NE(add->cancel, token);
  EXPECT_NE(add->cancel, sub->cancel);
  EXPECT_FALSE(add->IsCancelled());
  token->Cancel();
  EXPECT_TRUE(add->IsCancelled());
  EXPECT_TRUE(sub->IsCancelled());
  pump_.Run("add");  // finished anyway: "square" must not start
  EXPECT_THAT(pump_.Pending(), ElementsAre("sub"));
  EXPECT_EQ(result.calls, 1);
  if (result.response != nullptr) {
    EXPECT_EQ(result.response->status.code(), absl::StatusCode::kCancelled);
    EXPECT_THAT(std::string(result.response->status.message()),
                ::testing::HasSubstr("request for model 'ens' was cancelled by the client"));
  }
  pump_.FailAll();
  EXPECT_EQ(result.calls, 1);
  EXPECT_EQ(scheduler_->InFlight(), 0u);
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kCanceled)], 1u);
}

// A request cancelled before the ensemble starts it dispatches nothing.
TEST_F(EnsembleSchedulerTest, AlreadyCancelledRequestDispatchesNothing) {
  Make(kEnsemble);
  Result result;
  auto req = MakeRequest(&result, {1, 2, 3, 4}, {10, 20, 30, 40});
  req->cancel = std::make_shared<core::CancellationToken>();
  req->cancel->Cancel();
  scheduler_->Enqueue(std::move(req));
  EXPECT_TRUE(pump_.Pending().empty());
  pump_.FailAll();
  ASSERT_EQ(result.calls, 1);
  EXPECT_EQ(result.response->status.code(), absl::StatusCode::kCancelled);
}

// The ensemble's deadline (its `timeout` from arrival, or the client's) is every step's
// deadline; past it, the ensemble answers DEADLINE_EXCEEDED naming itself and the time waited,
// and starts no later step.
TEST_F(EnsembleSchedulerTest, DeadlineGoesToTheStepsAndEndsTheEnsemble) {
  Make(kEnsemble);
  Result result;
  auto req = MakeRequest(&result, {1, 2, 3, 4}, {10, 20, 30, 40});
  req->timeout_us = 20000;
  const uint64_t received = req->times.received_ns;
  scheduler_->Enqueue(std::move(req));
  const core::InferRequest* add = pump_.Peek("add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->deadline_ns, received + 20000 * 1000);  // the step expires with the ensemble
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  pump_.Run("add");
  EXPECT_THAT(pump_.Pending(), ElementsAre("sub"));
  EXPECT_EQ(result.calls, 1);
  if (result.response != nullptr) {
    EXPECT_EQ(result.response->status.code(), absl::StatusCode::kDeadlineExceeded);
    const std::string msg(result.response->status.message());
    EXPECT_THAT(msg, ::testing::HasSubstr("request for model 'ens' timed out: waited "));
    EXPECT_THAT(msg, ::testing::HasSubstr("(timeout 20000 us)"));
  }
  pump_.FailAll();
  EXPECT_EQ(stats_.Snapshot().fail_by_reason[static_cast<int>(metrics::FailureReason::kTimeout)], 1u);
}

// ---- decoupled steps: one flow per response ----------------------------------------------------

// s = A + B ("add"); "gen" (decoupled) answers any number of times, each response g a flow;
// d = A - B ("sub", independent of gen, may finish after gen's responses); OUT = g + d ("join").
constexpr char kDecoupledEnsemble[] = R"pb(
  name: "ens"
  platform: "ensemble"
  input { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }
  input { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
  output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }
  model_transaction_policy { decoupled: true }
  ensemble_scheduling {
    step {
      model_name: "add" model_version: -1
      input_map { key: "X" value: "A" }
      input_map { key: "Y" value: "B" }
      output_map { key: "Z" value: "s" }
    }
    step {
      model_name: "gen" model_version: -1
      input_map { key: "X" value: "s" }
      output_map { key: "Z" value: "g" }
    }
    step {
      model_name: "sub" model_version: -1
      input_map { key: "X" value: "A" }
      input_map { key: "Y" value: "B" }
      output_map { key: "Z" value: "d" }
    }
    step {
      model_name: "join" model_version: -1
      input_map { key: "X" value: "g" }
      input_map { key: "Y" value: "d" }
      output_map { key: "Z" value: "OUT" }
    }
  }
)pb";

std::unique_ptr<core::InferResponse> ZResponse(const std::vector<float>& z) {
  auto bytes = std::make_shared<std::string>(reinterpret_cast<const char*>(z.data()),
                                             z.size() * sizeof(float));
  auto resp = std::make_unique<core::InferResponse>();
  core::OutputTensor out;
  out.name = "Z";
  out.datatype = DataType::kFp32;
  out.shape = {static_cast<int64_t>(z.size())};
  out.data = *bytes;
  out.holder = bytes;
  resp->outputs.push_back(std::move(out));
  return resp;
}

// What the client of a decoupled ensemble sees: every (response, final) its sender sent.
struct Stream {
  std::vector<std::pair<std::unique_ptr<core::InferResponse>, bool>> got;
  int completions = 0;
};

std::unique_ptr<core::InferRequest> MakeStreamRequest(Stream* stream) {
  Result unused;
  auto req = MakeRequest(&unused, {1, 2, 3, 4}, {10, 20, 30, 40});
  req->on_complete = nullptr;
  req->on_response = [stream](std::unique_ptr<core::InferResponse> r, bool final) {
    stream->got.emplace_back(std::move(r), final);
  };
  // As the server does for a decoupled model whose scheduler streams (server::Server::InferOn).
  EXPECT_TRUE(core::PrepareDecoupledRequest(req.get(), /*backend_streams=*/true).ok());
  return req;
}

class DecoupledEnsembleTest : public EnsembleSchedulerTest {
 protected:
  // The server's part for a decoupled step: its sender over the step's on_response.
  std::unique_ptr<core::InferRequest> TakeDecoupled(const std::string& model) {
    auto r = pump_.Take(model);
    EXPECT_TRUE(core::PrepareDecoupledRequest(r.get(), /*backend_streams=*/true).ok());
    return r;
  }
  // Runs the pending "join": OUT = X + Y.
  void RunJoin() {
    auto r = pump_.Take("join");
    auto x = Pump::Floats(*r->FindInput("X"));
    auto y = Pump::Floats(*r->FindInput("Y"));
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    auto cb = std::move(r->on_complete);
    r.reset();
    cb(ZResponse(x));
  }
  static std::vector<float> Times(std::vector<float> v, float k) {
    for (float& x : v) x *= k;
    return v;
  }
};

// Each response of the decoupled step runs the downstream step once, with the tensor of the
// independent branch that finished after it; upstream steps run once; the final flag follows
// the last flow.
TEST_F(DecoupledEnsembleTest, EachResponseIsAFlowJoinedWithTheSharedBranch) {
  Make(kDecoupledEnsemble);
  Stream stream;
  scheduler_->Enqueue(MakeStreamRequest(&stream));
  EXPECT_THAT(pump_.Pending(), UnorderedElementsAre("add", "sub"));
  pump_.Run("add");
  auto gen = TakeDecoupled("gen");
  const std::vector<float> s = Pump::Floats(*gen->FindInput("X"));
  EXPECT_THAT(s, ElementsAre(11, 22, 33, 44));
  auto sender = gen->response_sender;
  ASSERT_TRUE(sender->Send(ZResponse(Times(s, 1)), false).ok());
  ASSERT_TRUE(sender->Send(ZResponse(Times(s, 2)), false).ok());
  // "join" also needs d, which "sub" has not written yet.
  EXPECT_THAT(pump_.Pending(), ElementsAre("sub"));
  pump_.Run("sub");
  // d reaches both flows: one join each, none in the request's own flow.
  EXPECT_THAT(pump_.Pending(), ElementsAre("join", "join"));
  RunJoin();
  RunJoin();
  ASSERT_EQ(stream.got.size(), 2u);
  // A response after d exists: its flow runs join at once.
  ASSERT_TRUE(sender->Send(ZResponse(Times(s, 3)), false).ok());
  EXPECT_THAT(pump_.Pending(), ElementsAre("join"));
  RunJoin();
  ASSERT_EQ(stream.got.size(), 3u);
  const std::vector<float> d = {-9, -18, -27, -36};
  for (int k = 1; k <= 3; ++k) {
    const auto& [r, final] = stream.got[k - 1];
    ASSERT_NE(r, nullptr);
    ASSERT_TRUE(r->status.ok()) << r->status;
    EXPECT_FALSE(final);
    EXPECT_EQ(r->model_name, "ens");
    EXPECT_EQ(r->id, "req-1");
    std::vector<float> want = Times(s, static_cast<float>(k));
    for (size_t i = 0; i < want.size(); ++i) want[i] += d[i];
    EXPECT_EQ(OutputFloats(*r, "OUT"), want) << "response " << k;
  }
  EXPECT_EQ(scheduler_->InFlight(), 1u);
  ASSERT_TRUE(sender->SendFinal().ok());
  gen.reset();
  ASSERT_EQ(stream.got.size(), 4u);
  EXPECT_EQ(stream.got[3].first, nullptr);
  EXPECT_TRUE(stream.got[3].second);
  EXPECT_THAT(pump_.Pending(), ElementsAre());
  EXPECT_EQ(scheduler_->InFlight(), 0u);
  EXPECT_EQ(stats_.Snapshot().success.count, 1u);  // one request, whatever its responses
}

// A decoupled step that sends only the final flag: no response, and the flag waits for the
// steps still running.
TEST_F(DecoupledEnsembleTest, ZeroResponsesSendOnlyTheFinalFlagOnceEveryStepIsDone) {
  Make(kDecoupledEnsemble);
  Stream stream;
  scheduler_->Enqueue(MakeStreamRequest(&stream));
  pump_.Run("add");
  auto gen = TakeDecoupled("gen");
  ASSERT_TRUE(gen->response_sender->SendFinal().ok());
  gen.reset();
  EXPECT_TRUE(stream.got.empty());
  pump_.Run("sub");
  EXPECT_THAT(pump_.Pending(), ElementsAre());
  ASSERT_EQ(stream.got.size(), 1u);
  EXPECT_EQ(stream.got[0].first, nullptr);
  EXPECT_TRUE(stream.got[0].second);
  EXPECT_EQ(scheduler_->InFlight(), 0u);
}

// An error in one flow ends the request with it (final); the decoupled step still streaming is
// cancelled, later responses and steps go nowhere, and the context is freed once all are done.
TEST_F(DecoupledEnsembleTest, AnErrorInOneFlowEndsTheRequestAndCancelsTheRest) {
  Make(kDecoupledEnsemble);
  Stream stream;
  scheduler_->Enqueue(MakeStreamRequest(&stream));
  pump_.Run("add");
  pump_.Run("sub");
  auto gen = TakeDecoupled("gen");
  auto sender = gen->response_sender;
  ASSERT_TRUE(sender->Send(ZResponse({1, 1, 1, 1}), false).ok());
  ASSERT_TRUE(sender->Send(ZResponse({2, 2, 2, 2}), false).ok());
  EXPECT_THAT(pump_.Pending(), ElementsAre("join", "join"));
  ASSERT_NE(gen->cancel, nullptr);
  EXPECT_FALSE(gen->cancel->IsCancelled());
  pump_.Fail("join", absl::InvalidArgumentError("bad value"));
  ASSERT_EQ(stream.got.size(), 1u);
  ASSERT_NE(stream.got[0].first, nullptr);
  EXPECT_TRUE(stream.got[0].second);
  EXPECT_EQ(stream.got[0].first->status.message(),
            "in ensemble 'ens' step 3 (model 'join'): bad value");
  EXPECT_TRUE(gen->cancel->IsCancelled());
  RunJoin();  // the other flow's answer has nowhere to go
  ASSERT_TRUE(sender->Send(ZResponse({3, 3, 3, 3}), false).ok());
  EXPECT_THAT(pump_.Pending(), ElementsAre());  // no new flow after the error
  EXPECT_EQ(scheduler_->InFlight(), 1u);  // gen still holds the request
  ASSERT_TRUE(sender->SendFinal().ok());
  gen.reset();
  EXPECT_EQ(stream.got.size(), 1u);
  EXPECT_EQ(scheduler_->InFlight(), 0u);
  EXPECT_EQ(stats_.Snapshot().fail.count, 1u);
}

// Shutdown (unload) waits for a decoupled step that is still streaming.
TEST_F(DecoupledEnsembleTest, ShutdownWaitsForADecoupledStepStillStreaming) {
  Make(kDecoupledEnsemble);
  Stream stream;
  scheduler_->Enqueue(MakeStreamRequest(&stream));
  pump_.Run("add");
  pump_.Run("sub");
  auto gen = TakeDecoupled("gen");
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    scheduler_->Shutdown();
    done = true;
  });
  ASSERT_TRUE(gen->response_sender->Send(ZResponse({5, 5, 5, 5}), false).ok());
  RunJoin();
  EXPECT_FALSE(done.load());
  ASSERT_TRUE(gen->response_sender->SendFinal().ok());
  gen.reset();
  stopper.join();
  EXPECT_TRUE(done.load());
  ASSERT_EQ(stream.got.size(), 2u);
  EXPECT_THAT(OutputFloats(*stream.got[0].first, "OUT"), ElementsAre(-4, -13, -22, -31));
  EXPECT_TRUE(stream.got[1].second);
}

// A step beside the decoupled one ("tail", reading only d) runs once, in the request's own flow,
// even though d reaches every flow forked before it; its output is in every response.
TEST_F(DecoupledEnsembleTest, AStepBesideTheDecoupledOneRunsOnceAndItsOutputIsInEveryResponse) {
  std::string text = kDecoupledEnsemble;
  text.replace(text.find("  model_transaction_policy"), 0,
               "  output { name: \"TAIL\" data_type: TYPE_FP32 dims: [ 4 ] }\n");
  text.replace(text.rfind("  }\n"), 0,
               "    step {\n      model_name: \"square\" model_version: -1\n"
               "      input_map { key: \"X\" value: \"d\" }\n"
               "      output_map { key: \"Z\" value: \"TAIL\" }\n    }\n");
  Make(text);
  Stream stream;
  scheduler_->Enqueue(MakeStreamRequest(&stream));
  pump_.Run("add");
  auto gen = TakeDecoupled("gen");
  ASSERT_TRUE(gen->response_sender->Send(ZResponse({1, 1, 1, 1}), false).ok());
  ASSERT_TRUE(gen->response_sender->Send(ZResponse({2, 2, 2, 2}), false).ok());
  pump_.Run("sub");
  EXPECT_THAT(pump_.Pending(), UnorderedElementsAre("join", "join", "square"));
  pump_.Run("square");
  RunJoin();
  RunJoin();
  ASSERT_TRUE(gen->response_sender->SendFinal().ok());
  gen.reset();
  EXPECT_THAT(pump_.Pending(), ElementsAre());
  ASSERT_EQ(stream.got.size(), 3u);
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(stream.got[k].first->status.ok()) << stream.got[k].first->status;
    EXPECT_THAT(OutputFloats(*stream.got[k].first, "TAIL"), ElementsAre(81, 324, 729, 1296));
    EXPECT_THAT(OutputFloats(*stream.got[k].first, "OUT"),
                ElementsAre(k - 8, k - 17, k - 26, k - 35));
  }
  EXPECT_TRUE(stream.got[2].second);
  EXPECT_EQ(scheduler_->InFlight(), 0u);
}

}  // namespace
}  // namespace inferd::scheduling
