#include "scheduling/ensemble_scheduler.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "backends/backend.h"
#include "backends/tensor_places.h"
#include "common/strings.h"
#include "core/response_sender.h"

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

  // The tensors one flow sees (the class comment). Flow 0 is the request's own; a response of
  // a decoupled step forks a child of the flow its step ran in.
  struct Flow {
    std::vector<core::OutputTensor> values;  // per tensor
    std::vector<size_t> waiting;             // per step: tensors still unwritten here
    // Per step: it read a tensor written in this flow (not inherited from an ancestor), so it
    // runs here; an inherited tensor alone would run a step a second time.
    std::vector<bool> own;
    size_t outputs_left = 0;   // ensemble outputs still unwritten here
    bool outputs_own = false;  // one of them was written in this flow
    bool answered = false;     // its response went out; its tensors are released
    std::vector<size_t> children;
  };

  EnsembleScheduler* const scheduler;
  std::shared_ptr<core::InferRequest> request;  // the client's request: ensemble inputs view it
  core::InferCallback on_complete;
  // Decoupled (the request's ResponseSender): one response per complete flow, then the final
  // flag. Null: one response, when every step finished.
  std::shared_ptr<core::ResponseSender> sender;
  uint64_t start_ns = 0;

  inferd::Mutex mu;
  std::vector<Flow> flows ABSL_GUARDED_BY(mu);  // by index: children refer to their parents
  std::vector<bool> absent ABSL_GUARDED_BY(mu);  // optional ensemble input not sent
  size_t outstanding ABSL_GUARDED_BY(mu) = 0;   // step requests not yet finished (final flag)
  bool finished ABSL_GUARDED_BY(mu) = false;  // the final response was delivered (or an error)
  // One token per dispatched step, cancelled with the client's (each scheduler holding a step
  // installs its own listener, so steps cannot share the client's token), and on an error.
  std::vector<std::shared_ptr<core::CancellationToken>> step_tokens ABSL_GUARDED_BY(mu);
  uint64_t deadline_ns = 0;  // DeadlineOf(*request)

  // Writes `value` as tensor `t` of flow `f` and of every flow forked from it, collecting the
  // steps that become ready there and the flows that now have every ensemble output.
  void Write(size_t f, size_t t, const core::OutputTensor& value, bool direct,
             std::vector<Job>* ready, std::vector<size_t>* complete)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const EnsembleGraph& graph = scheduler->graph_;
    Flow& flow = flows[f];
    if (flow.answered) return;  // its outputs are all out: nothing runs in it any more
    flow.values[t] = value;
    for (size_t c : graph.consumers[t]) {
      if (direct) flow.own[c] = true;
      if (--flow.waiting[c] == 0 && flow.own[c]) ready->push_back({f, c});
    }
    if (scheduler->is_output_[t]) {
      if (direct) flow.outputs_own = true;
      if (--flow.outputs_left == 0 && flow.outputs_own) complete->push_back(f);
    }
    for (size_t child : flow.children) Write(child, t, value, false, ready, complete);
  }
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
  is_output_.assign(graph_.tensors.size(), false);
  for (size_t t : graph_.outputs) is_output_[t] = true;
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
  ctx->sender = request->response_sender;
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
  std::vector<Job> ready;
  {
    inferd::MutexLock lock(&ctx->mu);
    Context::Flow& root = ctx->flows.emplace_back();
    root.values.resize(graph_.tensors.size());
    root.own.assign(graph_.steps.size(), false);
    root.outputs_left = graph_.outputs.size();
    ctx->absent.assign(graph_.tensors.size(), false);
    for (size_t t = 0; t < graph_.num_inputs; ++t) {
      const core::InputTensor* in = ctx->request->FindInput(graph_.tensors[t]);
      if (in == nullptr) {
        ctx->absent[t] = true;
        continue;
      }
      core::OutputTensor& v = root.values[t];
      v.datatype = in->datatype;
      v.shape = in->shape;
      v.data = in->data;
      v.place = in->place;
      v.holder = ctx->request;
    }
    root.waiting.resize(graph_.steps.size());
    for (size_t s = 0; s < graph_.steps.size(); ++s) {
      root.waiting[s] = graph_.steps[s].distinct_inputs;
      if (root.waiting[s] == 0) ready.push_back({0, s});
    }
    ctx->outstanding = ready.size();
  }
  Dispatch(ctx, std::move(ready));
}

void EnsembleScheduler::Dispatch(const std::shared_ptr<Context>& ctx, std::vector<Job> jobs) {
  // Steps get their own tokens when the client can cancel, and when the ensemble streams: an
  // error in one flow then stops the decoupled steps still streaming into the others.
  const bool tokens = ctx->request->cancel != nullptr || ctx->sender != nullptr;
  for (const Job& job : jobs) {
    const size_t s = job.step;
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
    if (tokens) {
      req->cancel = std::make_shared<core::CancellationToken>();
      bool cancelled;
      {
        inferd::MutexLock lock(&ctx->mu);
        ctx->step_tokens.push_back(req->cancel);
        cancelled = ctx->finished;
      }
      // After it is listed: a cancellation from here on reaches it through the listener.
      if (cancelled || (ctx->request->cancel && ctx->request->cancel->IsCancelled())) {
        req->cancel->Cancel();
      }
    }
    // The step's inputs view the tensors where they are (the client's request or an earlier
    // step's output); the payload keeps each owner alive.
    auto keep = std::make_shared<std::vector<std::shared_ptr<const void>>>();
    {
      inferd::MutexLock lock(&ctx->mu);
      const Context::Flow& flow = ctx->flows[job.flow];
      for (const auto& b : step.inputs) {
        // (An answered flow runs nothing: every step of it ran before its outputs existed.)
        if (ctx->absent[b.tensor] || flow.answered) continue;
        const core::OutputTensor& v = flow.values[b.tensor];
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
    // Both callbacks: a step model that is not decoupled answers once through on_complete; a
    // decoupled one gets a ResponseSender over on_response (core/response_sender.h), which
    // replaces on_complete, so which one is called tells the two apart.
    const size_t f = job.flow;
    req->on_complete = [this, ctx, f, s](std::unique_ptr<core::InferResponse> response) {
      OnStepResponse(ctx, f, s, std::move(response), /*final=*/true, /*forks=*/false);
    };
    req->on_response = [this, ctx, f, s](std::unique_ptr<core::InferResponse> response,
                                         bool final) {
      OnStepResponse(ctx, f, s, std::move(response), final, /*forks=*/true);
    };
    dispatch_(std::move(req));
  }
}

void EnsembleScheduler::OnStepResponse(const std::shared_ptr<Context>& ctx, size_t f, size_t s,
                                       std::unique_ptr<core::InferResponse> response, bool final,
                                       bool forks) {
  const EnsembleGraph::Step& step = graph_.steps[s];
  std::vector<Job> ready;
  std::vector<size_t> complete;
  absl::Status error;
  std::vector<std::shared_ptr<core::CancellationToken>> to_cancel;
  // The client gone or its deadline passed: answer that, and start no later step.
  absl::Status gone = Expired(*ctx, core::NowNs());
  {
    inferd::MutexLock lock(&ctx->mu);
    if (!ctx->finished) {
      if (!gone.ok()) {
        error = std::move(gone);
      } else if (response != nullptr && !response->status.ok()) {
        // A composing model that is not loaded makes the ensemble unavailable, not unknown.
        const absl::StatusCode code = response->status.code() == absl::StatusCode::kNotFound
                                          ? absl::StatusCode::kUnavailable
                                          : response->status.code();
        error = absl::Status(code,
                             inferd::StrCat("in ", StepName(name_, s, step.model_name), ": ",
                                            response->status.message()));
      } else if (response != nullptr) {
        size_t target = f;
        if (forks) {
          // A response of a decoupled step: a new flow, a copy of the one its step ran in.
          Context::Flow child;
          child.values = ctx->flows[f].values;
          child.waiting = ctx->flows[f].waiting;
          child.own.assign(graph_.steps.size(), false);
          child.outputs_left = ctx->flows[f].outputs_left;
          target = ctx->flows.size();
          ctx->flows.push_back(std::move(child));
          ctx->flows[f].children.push_back(target);
        }
        for (const auto& b : step.outputs) {
          auto out = std::find_if(
              response->outputs.begin(), response->outputs.end(),
              [&](const core::OutputTensor& o) { return o.name == b.model_tensor; });
          if (out == response->outputs.end()) {
            error = absl::InternalError(inferd::StrCat("in ", StepName(name_, s, step.model_name),
                                                       ": the model returned no output '",
                                                       b.model_tensor, "'"));
            break;
          }
          ctx->Write(target, b.tensor, *out, /*direct=*/true, &ready, &complete);
        }
      }
      if (!error.ok()) {
        ctx->finished = true;
        ready.clear();
        complete.clear();
        to_cancel = ctx->step_tokens;
      }
      // The steps that became ready count from now, so the final flag waits for them.
      ctx->outstanding += ready.size();
    }
  }
  response.reset();
  if (!error.ok()) {
    Fail(ctx.get(), std::move(error));
    for (auto& t : to_cancel) t->Cancel();  // the other steps' answers have nowhere to go
  }
  if (!complete.empty() && ctx->sender != nullptr) {
    for (size_t flow : complete) {
      auto answer = BuildResponse(ctx.get(), flow);
      if (!answer->status.ok()) {
        {
          inferd::MutexLock lock(&ctx->mu);
          if (ctx->finished) break;
          ctx->finished = true;
          to_cancel = ctx->step_tokens;
        }
        Fail(ctx.get(), answer->status);
        for (auto& t : to_cancel) t->Cancel();
        break;
      }
      (void)ctx->sender->Send(std::move(answer), /*final=*/false);
    }
  }
  if (!ready.empty()) Dispatch(ctx, std::move(ready));
  if (!final) return;
  // Last: this step request's final flag ends the ensemble request only after the responses
  // it produced went out (above).
  bool finish = false;
  {
    inferd::MutexLock lock(&ctx->mu);
    if (--ctx->outstanding == 0 && !ctx->finished) {
      ctx->finished = true;
      finish = true;
    }
  }
  if (finish) Finish(ctx.get());
}

std::unique_ptr<core::InferResponse> EnsembleScheduler::BuildResponse(Context* ctx, size_t f) {
  auto response = std::make_unique<core::InferResponse>();
  response->model_name = name_;
  response->model_version = version_;
  response->id = ctx->request->id;
  {
    inferd::MutexLock lock(&ctx->mu);
    Context::Flow& flow = ctx->flows[f];
    if (flow.outputs_left != 0) {
      // Only when a step is decoupled while the ensemble is not (the repository marks such
      // an ensemble decoupled): its outputs went to flows this one answer cannot carry.
      response->status = absl::InternalError(inferd::StrCat(
          "ensemble '", name_, "': a step answered more than once (decoupled) and the ensemble's "
          "outputs are not all in one flow; call it over a streaming endpoint"));
      return response;
    }
    for (size_t j = 0; j < graph_.outputs.size(); ++j) {
      if (!backends::IsOutputRequested(*ctx->request, output_names_[j])) continue;
      core::OutputTensor out = flow.values[graph_.outputs[j]];
      out.name = output_names_[j];
      response->outputs.push_back(std::move(out));
    }
    // Nothing runs in a flow that has every output (each step of it ran before them): its
    // tensors can go now rather than with the request.
    if (ctx->sender != nullptr) {
      flow.answered = true;
      flow.values = {};
    }
  }
  // The edge: a consumer that reads host bytes gets them (backends/tensor_places.h); an output
  // bound for a CUDA region on the GPU it is on stays there (copied device-to-device into it).
  if (!ctx->request->gpu_outputs_ok && backends::AnyOutputOnGpu(*response) &&
      !backends::MakeOutputsHostReadable(
          gpus_, response.get(), [&](const core::OutputTensor& o) {
            return backends::OutputMayStayOnGpu(*ctx->request, o.name, o.place.device_id);
          })) {
    response->outputs.clear();
    if (response->status.ok()) response->status = absl::InternalError("copying outputs failed");
  }
  return response;
}

void EnsembleScheduler::Finish(Context* ctx) {
  const uint64_t end = core::NowNs();
  const auto& times = ctx->request->times;
  if (ctx->sender != nullptr) {
    // Every flow already answered; the flag alone ends the stream (as Triton's ensemble, whose
    // final flag may come with no response, e.g. a decoupled step that sent none).
    stats_->RecordSuccess(end - times.received_ns, ctx->start_ns - times.queue_start_ns, 0, 0,
                          0, ctx->request->batch_size);
    (void)ctx->sender->SendFinal();
    auto done = std::make_unique<core::InferResponse>();
    done->model_name = name_;
    done->model_version = version_;
    done->id = ctx->request->id;
    Deliver(ctx, std::move(done));  // the sender is closed: nothing more is written
    return;
  }
  auto response = BuildResponse(ctx, 0);
  if (!response->status.ok()) {
    Fail(ctx, response->status);
    return;
  }
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
