#include "scheduling/ensemble_scheduler.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "backends/backend.h"
#include "backends/tensor_places.h"
#include "common/strings.h"

namespace inferd::scheduling {
namespace {

std::string StepName(const std::string& ensemble, size_t index, const std::string& model) {
  return inferd::StrCat("ensemble '", ensemble, "' step ", index, " (model '", model, "')");
}

// When the ensemble request stops being worth answering (0: never): its `timeout` parameter
// from arrival (the ensemble scheduler has no queue policy, like Triton's default scheduler),
// or the client's deadline, whichever is first. Its steps carry it as their deadline.
uint64_t DeadlineOf(const core::InferRequest& r) {
  uint64_t d = r.timeout_us ? r.times.received_ns + r.timeout_us * 1000 : 0;
  if (r.deadline_ns != 0 && (d == 0 || r.deadline_ns < d)) d = r.deadline_ns;
  return d;
}

}  // namespace

absl::StatusOr<EnsembleGraph> BuildEnsembleGraph(const config::ModelConfig& config) {
  const std::string& name = config.name();
  const auto& scheduling = config.ensemble_scheduling();
  if (scheduling.step_size() == 0) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "ensemble '", name, "': ensemble_scheduling must have at least one step"));
  }
  EnsembleGraph g;
  absl::flat_hash_map<std::string, size_t> index;
  auto intern = [&](const std::string& tensor) {
    auto [it, inserted] = index.try_emplace(tensor, g.tensors.size());
    if (inserted) g.tensors.push_back(tensor);
    return it->second;
  };
  for (const auto& in : config.input()) intern(in.name());
  g.num_inputs = g.tensors.size();

  std::map<size_t, size_t> produced_by;  // tensor -> step
  for (int i = 0; i < scheduling.step_size(); ++i) {
    const auto& step = scheduling.step(i);
    const std::string where = StepName(name, i, step.model_name());
    if (step.model_name().empty()) {
      return absl::InvalidArgumentError(
          inferd::StrCat("ensemble '", name, "' step ", i, ": model_name is empty"));
    }
    if (step.model_name() == name) {
      return absl::InvalidArgumentError(inferd::StrCat(where, ": a step cannot run the ensemble itself"));
    }
    if (step.output_map().empty()) {
      return absl::InvalidArgumentError(inferd::StrCat(where, ": output_map is empty"));
    }
    EnsembleGraph::Step s;
    s.model_name = step.model_name();
    s.model_version = step.model_version() > 0 ? step.model_version() : -1;
    // Protobuf maps have no order; sort so requests and errors are deterministic.
    std::map<std::string, std::string> inputs(step.input_map().begin(), step.input_map().end());
    std::map<std::string, std::string> outputs(step.output_map().begin(), step.output_map().end());
    for (const auto& [model_tensor, tensor] : inputs) {
      s.inputs.push_back({model_tensor, intern(tensor)});
    }
    for (const auto& [model_tensor, tensor] : outputs) {
      const size_t t = intern(tensor);
      if (t < g.num_inputs) {
        return absl::InvalidArgumentError(inferd::StrCat(
            where, ": output '", model_tensor, "' writes tensor '", tensor,
            "', which is an ensemble input"));
      }
      if (auto prev = produced_by.find(t); prev != produced_by.end()) {
        // This step is not in g.steps yet: another output of it is named apart.
        if (prev->second == static_cast<size_t>(i)) {
          return absl::InvalidArgumentError(inferd::StrCat(
              where, ": output '", model_tensor, "' writes tensor '", tensor,
              "', which another output of this step also writes"));
        }
        return absl::InvalidArgumentError(inferd::StrCat(
            where, ": output '", model_tensor, "' writes tensor '", tensor,
            "', which step ", prev->second, " (model '", g.steps[prev->second].model_name,
            "') also writes"));
      }
      produced_by[t] = i;
      s.outputs.push_back({model_tensor, t});
    }
    g.steps.push_back(std::move(s));
  }

  g.producer.assign(g.tensors.size(), -1);
  for (const auto& [t, step] : produced_by) g.producer[t] = static_cast<int>(step);
  g.consumers.assign(g.tensors.size(), {});
  for (size_t i = 0; i < g.steps.size(); ++i) {
    auto& s = g.steps[i];
    std::vector<size_t> seen;
    for (const auto& b : s.inputs) {
      if (b.tensor >= g.num_inputs && g.producer[b.tensor] < 0) {
        return absl::InvalidArgumentError(inferd::StrCat(
            StepName(name, i, s.model_name), ": input '", b.model_tensor, "' reads tensor '",
            g.tensors[b.tensor], "', which is neither an ensemble input nor written by any step"));
      }
      if (std::find(seen.begin(), seen.end(), b.tensor) != seen.end()) continue;
      seen.push_back(b.tensor);
      g.consumers[b.tensor].push_back(i);
      if (b.tensor >= g.num_inputs) ++s.distinct_inputs;
    }
  }
  std::vector<bool> is_output(g.tensors.size(), false);
  for (const auto& out : config.output()) {
    auto it = index.find(out.name());
    if (it == index.end() || g.producer[it->second] < 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "ensemble '", name, "': output '", out.name(), "' is not written by any step"));
    }
    g.outputs.push_back(it->second);
    is_output[it->second] = true;
  }
  for (size_t t = 0; t < g.num_inputs; ++t) {
    if (g.consumers[t].empty()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "ensemble '", name, "': input '", g.tensors[t], "' is not read by any step"));
    }
  }
  for (size_t t = g.num_inputs; t < g.tensors.size(); ++t) {
    if (g.consumers[t].empty() && !is_output[t]) {
      const auto& s = g.steps[g.producer[t]];
      std::string model_tensor;
      for (const auto& b : s.outputs) {
        if (b.tensor == t) model_tensor = b.model_tensor;
      }
      return absl::InvalidArgumentError(inferd::StrCat(
          StepName(name, g.producer[t], s.model_name), ": output '", model_tensor,
          "' writes tensor '", g.tensors[t], "', which no step reads and is not an ensemble output"));
    }
  }

  // Kahn's algorithm: a step is ready once every step-written tensor it reads is written.
  std::vector<size_t> waiting(g.steps.size());
  std::vector<size_t> ready;
  for (size_t i = 0; i < g.steps.size(); ++i) {
    waiting[i] = g.steps[i].distinct_inputs;
    if (waiting[i] == 0) ready.push_back(i);
  }
  while (!ready.empty()) {
    const size_t s = ready.back();
    ready.pop_back();
    g.order.push_back(s);
    for (const auto& b : g.steps[s].outputs) {
      for (size_t c : g.consumers[b.tensor]) {
        if (--waiting[c] == 0) ready.push_back(c);
      }
    }
  }
  if (g.order.size() != g.steps.size()) {
    for (size_t i = 0; i < g.steps.size(); ++i) {
      if (waiting[i] > 0) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "ensemble '", name, "' has a cycle: ", StepName(name, i, g.steps[i].model_name),
            " reads, through other steps, a tensor that depends on its own output"));
      }
    }
  }
  return g;
}

// One ensemble request in flight. Held by the callbacks of its outstanding steps; the last one
// to finish frees it, which tells the scheduler (ContextDone).
struct EnsembleScheduler::Context {
  explicit Context(EnsembleScheduler* s) : scheduler(s) {}
  ~Context() { scheduler->ContextDone(); }

  EnsembleScheduler* const scheduler;
  std::shared_ptr<core::InferRequest> request;  // the client's request: ensemble inputs view it
  core::InferCallback on_complete;
  uint64_t start_ns = 0;

  inferd::Mutex mu;
  std::vector<core::OutputTensor> values ABSL_GUARDED_BY(mu);  // per tensor
  std::vector<bool> absent ABSL_GUARDED_BY(mu);  // optional ensemble input not sent
  std::vector<size_t> waiting ABSL_GUARDED_BY(mu);  // per step: tensors still unwritten
  size_t steps_left ABSL_GUARDED_BY(mu) = 0;
  bool finished ABSL_GUARDED_BY(mu) = false;  // response delivered
  // One token per dispatched step, cancelled with the client's (each scheduler holding a step
  // installs its own listener, so steps cannot share the client's token).
  std::vector<std::shared_ptr<core::CancellationToken>> step_tokens ABSL_GUARDED_BY(mu);
  uint64_t deadline_ns = 0;  // DeadlineOf(*request)
};

EnsembleScheduler::EnsembleScheduler(const config::ModelConfig& config, int64_t version,
                                     EnsembleGraph graph, StepDispatcher dispatch,
                                     size_t max_queue_size, metrics::ModelStats* stats,
                                     gpu::Runtime* gpus)
    : name_(config.name()),
      version_(version),
      graph_(std::move(graph)),
      dispatch_(std::move(dispatch)),
      max_inflight_(config.ensemble_scheduling().max_inflight_requests()),
      max_queue_size_(max_queue_size),
      stats_(stats),
      gpus_(gpus) {
  output_names_.reserve(config.output_size());
  for (const auto& out : config.output()) output_names_.push_back(out.name());
}

EnsembleScheduler::~EnsembleScheduler() { Shutdown(); }

void EnsembleScheduler::Enqueue(std::unique_ptr<core::InferRequest> request) {
  request->times.queue_start_ns = core::NowNs();
  absl::Status refused;
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_) {
      refused = absl::UnavailableError(
          inferd::StrCat("model '", name_, "' version ", version_, " is unloading"));
    } else if (max_inflight_ > 0 && running_ >= max_inflight_) {
      // Backpressure: max_inflight_requests are running; wait for one to finish.
      if (waiting_.size() >= max_queue_size_) {
        refused = absl::UnavailableError(inferd::StrCat(
            "ensemble '", name_, "' has ", running_, " requests in flight (max_inflight_requests) and ",
            waiting_.size(), " waiting, the limit (--max-queue-size); retry later"));
      } else {
        waiting_.push_back(std::move(request));
        return;
      }
    } else {
      ++running_;
    }
  }
  if (!refused.ok()) {
    stats_->RecordFailure(core::NowNs() - request->times.received_ns,
                          metrics::FailureReason::kRejected);
    core::CompleteWithError(std::move(request), std::move(refused));
    return;
  }
  Start(std::move(request));
}

void EnsembleScheduler::Start(std::unique_ptr<core::InferRequest> request) {
  auto ctx = std::make_shared<Context>(this);
  ctx->start_ns = core::NowNs();
  ctx->on_complete = std::move(request->on_complete);
  ctx->request = std::shared_ptr<core::InferRequest>(request.release());
  ctx->deadline_ns = DeadlineOf(*ctx->request);
  if (absl::Status gone = Expired(*ctx, ctx->start_ns); !gone.ok()) {
    Fail(ctx.get(), std::move(gone));
    return;
  }
  if (const auto& token = ctx->request->cancel) {
    // The client going cancels every step in flight; a weak reference, as the context owns
    // the request that owns the token. Cleared before the answer (Deliver).
    token->SetListener([weak = std::weak_ptr<Context>(ctx)] {
      auto c = weak.lock();
      if (!c) return;
      std::vector<std::shared_ptr<core::CancellationToken>> steps;
      {
        inferd::MutexLock lock(&c->mu);
        steps = c->step_tokens;
      }
      for (auto& t : steps) t->Cancel();
    });
  }
  std::vector<size_t> ready;
  {
    inferd::MutexLock lock(&ctx->mu);
    ctx->values.resize(graph_.tensors.size());
    ctx->absent.assign(graph_.tensors.size(), false);
    for (size_t t = 0; t < graph_.num_inputs; ++t) {
      const core::InputTensor* in = ctx->request->FindInput(graph_.tensors[t]);
      if (in == nullptr) {
        ctx->absent[t] = true;
        continue;
      }
      core::OutputTensor& v = ctx->values[t];
      v.datatype = in->datatype;
      v.shape = in->shape;
      v.data = in->data;
      v.place = in->place;
      v.holder = ctx->request;
    }
    ctx->steps_left = graph_.steps.size();
    ctx->waiting.resize(graph_.steps.size());
    for (size_t s = 0; s < graph_.steps.size(); ++s) {
      ctx->waiting[s] = graph_.steps[s].distinct_inputs;
      if (ctx->waiting[s] == 0) ready.push_back(s);
    }
  }
  Dispatch(ctx, std::move(ready));
}

void EnsembleScheduler::Dispatch(const std::shared_ptr<Context>& ctx, std::vector<size_t> steps) {
  for (size_t s : steps) {
    const EnsembleGraph::Step& step = graph_.steps[s];
    auto req = std::make_unique<core::InferRequest>();
    req->model_name = step.model_name;
    req->model_version = step.model_version;
    req->id = ctx->request->id;
    req->priority = ctx->request->priority;
    // As Triton (each step gets the ensemble request's correlation ID and START/END flags): a
    // step on a sequence model continues the client's sequence; perf_analyzer drives such an
    // ensemble with sequence_id/sequence_start/sequence_end on the ensemble request.
    req->sequence_id = ctx->request->sequence_id;
    req->sequence_start = ctx->request->sequence_start;
    req->sequence_end = ctx->request->sequence_end;
    req->timeout_us = ctx->request->timeout_us;
    req->parameters = ctx->request->parameters;  // as Triton: every step sees the request's
    req->deadline_ns = ctx->deadline_ns;
    req->times.received_ns = core::NowNs();
    if (ctx->request->cancel) {
      req->cancel = std::make_shared<core::CancellationToken>();
      {
        inferd::MutexLock lock(&ctx->mu);
        ctx->step_tokens.push_back(req->cancel);
      }
      // After it is listed: a cancellation from here on reaches it through the listener.
      if (ctx->request->cancel->IsCancelled()) req->cancel->Cancel();
    }
    // The step's inputs view the tensors where they are (the client's request or an earlier
    // step's output); the payload keeps each owner alive.
    auto keep = std::make_shared<std::vector<std::shared_ptr<const void>>>();
    {
      inferd::MutexLock lock(&ctx->mu);
      for (const auto& b : step.inputs) {
        if (ctx->absent[b.tensor]) continue;
        const core::OutputTensor& v = ctx->values[b.tensor];
        core::InputTensor& in = req->inputs.emplace_back();
        in.name = b.model_tensor;
        in.datatype = v.datatype;
        in.shape = v.shape;
        in.data = v.data;
        in.place = v.place;  // a GPU output stays there; the step's server entry decides
        if (std::find(keep->begin(), keep->end(), v.holder) == keep->end()) {
          keep->push_back(v.holder);
        }
      }
    }
    req->payload = std::move(keep);
    for (const auto& b : step.outputs) req->outputs.push_back({b.model_tensor});
    req->gpu_outputs_ok = true;  // the next step, or Finish, decides where they go
    req->on_complete = [this, ctx, s](std::unique_ptr<core::InferResponse> response) {
      OnStepDone(ctx, s, std::move(response));
    };
    dispatch_(std::move(req));
  }
}

void EnsembleScheduler::OnStepDone(const std::shared_ptr<Context>& ctx, size_t s,
                                   std::unique_ptr<core::InferResponse> response) {
  const EnsembleGraph::Step& step = graph_.steps[s];
  std::vector<size_t> ready;
  absl::Status error;
  bool finish = false;
  const uint64_t now = core::NowNs();
  // The client gone or its deadline passed: answer that, and start no later step.
  absl::Status gone = Expired(*ctx, now);
  {
    inferd::MutexLock lock(&ctx->mu);
    --ctx->steps_left;
    if (ctx->finished) return;  // an earlier step failed; the response is gone
    if (!gone.ok()) {
      error = std::move(gone);
    } else if (!response->status.ok()) {
      // A composing model that is not loaded makes the ensemble unavailable, not unknown.
      const absl::StatusCode code = response->status.code() == absl::StatusCode::kNotFound
                                        ? absl::StatusCode::kUnavailable
                                        : response->status.code();
      error = absl::Status(code,
                           inferd::StrCat("in ", StepName(name_, s, step.model_name), ": ",
                                          response->status.message()));
    } else {
      for (const auto& b : step.outputs) {
        auto out = std::find_if(response->outputs.begin(), response->outputs.end(),
                                [&](const core::OutputTensor& o) { return o.name == b.model_tensor; });
        if (out == response->outputs.end()) {
          error = absl::InternalError(inferd::StrCat("in ", StepName(name_, s, step.model_name),
                                                     ": the model returned no output '",
                                                     b.model_tensor, "'"));
          break;
        }
        ctx->values[b.tensor] = std::move(*out);
        for (size_t c : graph_.consumers[b.tensor]) {
          if (--ctx->waiting[c] == 0) ready.push_back(c);
        }
      }
    }
    if (!error.ok()) {
      ctx->finished = true;
      ready.clear();
    } else if (ctx->steps_left == 0) {
      ctx->finished = true;
      finish = true;
    }
  }
  response.reset();
  if (!error.ok()) {
    Fail(ctx.get(), std::move(error));
    return;
  }
  if (!ready.empty()) Dispatch(ctx, std::move(ready));
  if (finish) Finish(ctx.get());
}

void EnsembleScheduler::Finish(Context* ctx) {
  auto response = std::make_unique<core::InferResponse>();
  response->model_name = name_;
  response->model_version = version_;
  response->id = ctx->request->id;
  {
    inferd::MutexLock lock(&ctx->mu);
    for (size_t j = 0; j < graph_.outputs.size(); ++j) {
      if (!backends::IsOutputRequested(*ctx->request, output_names_[j])) continue;
      core::OutputTensor out = ctx->values[graph_.outputs[j]];
      out.name = output_names_[j];
      response->outputs.push_back(std::move(out));
    }
  }
  // The edge: a consumer that reads host bytes gets them (backends/tensor_places.h); an output
  // bound for a CUDA region on the GPU it is on stays there (copied device-to-device into it).
  if (!ctx->request->gpu_outputs_ok && backends::AnyOutputOnGpu(*response) &&
      !backends::MakeOutputsHostReadable(
          gpus_, response.get(), [&](const core::OutputTensor& o) {
            return backends::OutputMayStayOnGpu(*ctx->request, o.name, o.place.device_id);
          })) {
    Fail(ctx, response->status);
    return;
  }
  const uint64_t end = core::NowNs();
  const auto& times = ctx->request->times;
  stats_->RecordSuccess(end - times.received_ns, ctx->start_ns - times.queue_start_ns, 0, 0, 0,
                        ctx->request->batch_size);
  Deliver(ctx, std::move(response));
}

absl::Status EnsembleScheduler::Expired(const Context& ctx, uint64_t now) const {
  const core::InferRequest& r = *ctx.request;
  // The deadline first: gRPC cancels a call whose deadline passed, and that is a timeout.
  if (ctx.deadline_ns != 0 && now >= ctx.deadline_ns) {
    return core::DeadlineError(r, now,
                               r.timeout_us && r.times.received_ns + r.timeout_us * 1000 <= now
                                   ? inferd::StrCat("timeout ", r.timeout_us, " us")
                                   : std::string("the client's deadline"));
  }
  if (r.IsCancelled()) return core::CancelledError(r, now);
  return absl::OkStatus();
}

void EnsembleScheduler::Fail(Context* ctx, absl::Status error) {
  const auto reason = error.code() == absl::StatusCode::kDeadlineExceeded ? metrics::FailureReason::kTimeout
                      : error.code() == absl::StatusCode::kCancelled      ? metrics::FailureReason::kCanceled
                                                                          : metrics::FailureReason::kBackend;
  stats_->RecordFailure(core::NowNs() - ctx->request->times.received_ns, reason);
  auto failed = std::make_unique<core::InferResponse>();
  failed->status = std::move(error);
  failed->model_name = name_;
  failed->model_version = version_;
  failed->id = ctx->request->id;
  Deliver(ctx, std::move(failed));
}

void EnsembleScheduler::Deliver(Context* ctx, std::unique_ptr<core::InferResponse> response) {
  // Not under ctx->mu: the listener takes it.
  if (ctx->request->cancel) ctx->request->cancel->ClearListener();
  if (auto cb = std::move(ctx->on_complete)) cb(std::move(response));
}

namespace {
// Requests a finishing context starts, run by the outermost ContextDone on this thread so a
// chain of requests that fail at once does not recurse.
struct Pending {
  EnsembleScheduler* scheduler;
  std::unique_ptr<core::InferRequest> request;
};
thread_local std::vector<Pending>* trampoline = nullptr;
}  // namespace

void EnsembleScheduler::ContextDone() {
  std::unique_ptr<core::InferRequest> next;
  {
    inferd::MutexLock lock(&mu_);
    if (!waiting_.empty()) {
      next = std::move(waiting_.front());
      waiting_.pop_front();
    } else {
      --running_;
    }
  }
  // Without `next`, Shutdown may be destroying this scheduler now: touch nothing.
  if (!next) return;
  if (trampoline != nullptr) {
    trampoline->push_back({this, std::move(next)});
    return;
  }
  std::vector<Pending> local;
  trampoline = &local;
  Start(std::move(next));
  while (!local.empty()) {
    Pending p = std::move(local.back());
    local.pop_back();
    p.scheduler->Start(std::move(p.request));
  }
  trampoline = nullptr;
}

void EnsembleScheduler::Shutdown() {
  std::deque<std::unique_ptr<core::InferRequest>> refused;
  {
    inferd::MutexLock lock(&mu_);
    stopping_ = true;
    refused.swap(waiting_);
  }
  for (auto& r : refused) {
    stats_->RecordFailure(core::NowNs() - r->times.received_ns, metrics::FailureReason::kRejected);
    core::CompleteWithError(std::move(r), absl::UnavailableError(inferd::StrCat(
                                              "model '", name_, "' version ", version_, " is unloading")));
  }
  inferd::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](size_t* running) { return *running == 0; }, &running_));
}

size_t EnsembleScheduler::InFlight() const {
  inferd::MutexLock lock(&mu_);
  return running_ + waiting_.size();
}

}  // namespace inferd::scheduling
