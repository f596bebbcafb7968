// The Scheduler interface: how a loaded model accepts requests and hands them to its
// instances. Implementations: InstancePoolScheduler (one request per execution, as Triton's
// default scheduler), DynamicBatcher, SequenceBatcher (each deciding batches and running them
// on one InstancePool; CreateScheduler in scheduler_factory.h picks one from the config) and
// EnsembleScheduler (a pipeline of other models).
#pragma once

#include <memory>

#include "core/infer_request.h"

namespace inferd::scheduling {

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // Always takes ownership. A request the scheduler cannot accept (queue full, shutting down)
  // is completed with an error by the scheduler itself, UNAVAILABLE for overload.
  // Thread-safe.
  virtual void Enqueue(std::unique_ptr<core::InferRequest> request) = 0;

  // Stops accepting, completes everything already queued, and joins the threads. Idempotent.
  virtual void Shutdown() = 0;

  // Requests queued or executing.
  virtual size_t InFlight() const = 0;
  // Requests not executing yet (tritonserver's pending count). A scheduler that cannot tell
  // reports InFlight().
  virtual size_t Queued() const { return InFlight(); }
};

}  // namespace inferd::scheduling
