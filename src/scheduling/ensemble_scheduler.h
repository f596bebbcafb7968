// Triton's ensemble scheduler: runs a `platform: "ensemble"` model as a data-flow graph of
// steps, each an inference request on a composing model. A step is dispatched as soon as every
// tensor it reads exists, so independent steps run concurrently; composing models keep their
// own schedulers (dynamic batchers, instances), so steps of many ensemble requests batch
// together inside them. Tensors move between steps as views kept alive by their producer's
// holder: no copies.
//
// The graph is checked when the ensemble loads (BuildEnsembleGraph: producers, consumers,
// cycles); the composing models' tensors and types are checked by the repository, which can
// see them.
//
// Decoupled steps (as Triton): each response of a decoupled step starts its own *flow*, a copy
// of the tensors its request saw plus the response's outputs, in which the downstream steps run
// again; a tensor written later upstream (a step not downstream of that decoupled step) reaches
// every flow forked below it. A step runs in a flow only when it reads a tensor written in that
// flow, so steps upstream of the decoupled step run once. An ensemble with a decoupled step is
// itself decoupled (the repository marks it): each flow that has all of the ensemble's outputs
// is one response through the request's ResponseSender, and the final flag follows once every
// step request of every flow has finished. The repository refuses graphs where a step (or the
// ensemble's outputs) would join tensors from different decoupled steps ("decoupled
// branching"), so a flow never needs tensors of two sibling flows.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "config/model_config_util.h"
#include "core/infer_request.h"
#include "gpu/runtime.h"
#include "metrics/model_stats.h"
#include "scheduling/scheduler.h"

namespace inferd::scheduling {

// The steps of an ensemble, with tensor names resolved to indices.
struct EnsembleGraph {
  struct Binding {
    std::string model_tensor;  // the composing model's input or output name
    size_t tensor = 0;         // index into `tensors`
  };
  struct Step {
    std::string model_name;
    int64_t model_version = -1;
    std::vector<Binding> inputs;
    std::vector<Binding> outputs;
    size_t distinct_inputs = 0;  // distinct tensors read, for readiness counting
  };
  std::vector<std::string> tensors;  // every tensor name: ensemble inputs first
  size_t num_inputs = 0;             // tensors[0, num_inputs) are the ensemble inputs
  std::vector<size_t> outputs;       // tensor index of each ensemble output, config order
  std::vector<Step> steps;
  std::vector<std::vector<size_t>> consumers;  // per tensor: steps that read it (distinct)
  std::vector<int> producer;                   // per tensor: producing step, -1 for inputs
  std::vector<size_t> order;                   // a topological order of the steps
};

// Checks `config.ensemble_scheduling` and builds its graph. Errors are INVALID_ARGUMENT and
// name the ensemble, the step (index and model) and the tensor: a tensor read but never
// produced, produced twice, produced but never read, an ensemble input no step reads, an
// ensemble output no step produces, a cycle.
absl::StatusOr<EnsembleGraph> BuildEnsembleGraph(const config::ModelConfig& config);

// Hands one step's request to the server (which validates it against the composing model and
// routes it to that model's scheduler). Must not block.
using StepDispatcher = std::function<void(std::unique_ptr<core::InferRequest>)>;

// Tensors on a GPU (backends/tensor_places.h): a step's output keeps its place when it is
// handed to the next step (whose server entry copies it to the host unless that step's
// instances take GPU inputs on its GPU); the ensemble's own outputs are copied to the host
// before the answer, unless the request says its consumer reads GPU bytes
// (InferRequest::gpu_outputs_ok: a step of an enclosing ensemble).
//
// Thread-safe. `stats` and `gpus` (may be null: no GPU) must outlive the scheduler.
class EnsembleScheduler : public Scheduler {
 public:
  EnsembleScheduler(const config::ModelConfig& config, int64_t version, EnsembleGraph graph,
                    StepDispatcher dispatch, size_t max_queue_size, metrics::ModelStats* stats,
                    gpu::Runtime* gpus = nullptr);
  ~EnsembleScheduler() override;

  void Enqueue(std::unique_ptr<core::InferRequest> request) override;
  // Stops accepting and waits until every ensemble request in flight has finished all of its
  // steps.
  void Shutdown() override;
  size_t InFlight() const override;

 private:
  struct Context;
  friend struct Context;
  void Start(std::unique_ptr<core::InferRequest> request);
  struct Job {
    size_t flow;
    size_t step;
  };
  void Dispatch(const std::shared_ptr<Context>& ctx, std::vector<Job> jobs);
  // One response of step `step` run in flow `flow`: `forks` for a response of a decoupled step
  // (through the step request's sender; `response` null for the final flag alone), false for
  // the one answer of a step that is not decoupled (`final` then true).
  void OnStepResponse(const std::shared_ptr<Context>& ctx, size_t flow, size_t step,
                      std::unique_ptr<core::InferResponse> response, bool final, bool forks);
  // The ensemble's outputs as they are in `flow`, host-readable unless the caller reads GPU
  // bytes; error status when an output is missing or cannot be copied.
  std::unique_ptr<core::InferResponse> BuildResponse(Context* ctx, size_t flow);
  // Every step request has finished: the one response (or, decoupled, the final flag).
  void Finish(Context* ctx);
  // CANCELLED when the client went, DEADLINE_EXCEEDED (with the time waited) past its deadline.
  absl::Status Expired(const Context& ctx, uint64_t now) const;
  void Fail(Context* ctx, absl::Status error);  // answers the client with `error`
  void Deliver(Context* ctx, std::unique_ptr<core::InferResponse> response);
  void ContextDone();

  const std::string name_;
  const int64_t version_;
  const EnsembleGraph graph_;
  std::vector<std::string> output_names_;  // the ensemble's outputs, config order
  std::vector<bool> is_output_;            // per tensor: an ensemble output
  const StepDispatcher dispatch_;
  const size_t max_inflight_;  // 0: no limit
  const size_t max_queue_size_;
  metrics::ModelStats* const stats_;
  gpu::Runtime* const gpus_;

  mutable inferd::Mutex mu_;
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;  // started and not yet freed
  // Past max_inflight_requests: waiting for a running request to finish (backpressure).
  std::deque<std::unique_ptr<core::InferRequest>> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace inferd::scheduling
