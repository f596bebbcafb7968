// Triton's default scheduler: a bounded FIFO queue shared by all instances of a model, one
// request per execution. The queue is the InstancePool's own (SubmitAny): a request goes from
// Enqueue to the first free instance with no thread in between.
//
// Deadlines and cancellation: a queued request whose `timeout` parameter (from its arrival) or
// client deadline passes, or whose client cancels it, is answered at that moment by the
// server's DeadlineSweeper (DEADLINE_EXCEEDED with the time waited, or CANCELLED), even while
// every instance is busy, and never runs; a running request whose client cancels it asks the
// instance to stop (InstancePool). Unlike the dynamic batcher there is no queue policy here, so
// the request's own `timeout` always applies.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "metrics/model_stats.h"
#include "scheduling/deadline_sweeper.h"
#include "scheduling/instance_pool.h"
#include "scheduling/scheduler.h"

namespace inferd::scheduling {

// Thread-safe. Owns the instances; `stats` and `sweeper` must outlive the scheduler. No thread
// of its own.
class InstancePoolScheduler : public Scheduler {
 public:
  InstancePoolScheduler(std::string model_name, int64_t version,
                        std::vector<std::unique_ptr<backends::ModelInstance>> instances,
                        size_t max_queue_size, metrics::ModelStats* stats,
                        DeadlineSweeper* sweeper = DeadlineSweeper::Shared());
  ~InstancePoolScheduler() override;

  void Enqueue(std::unique_ptr<core::InferRequest> request) override;
  void Shutdown() override;
  size_t InFlight() const override;
  size_t Queued() const override;

 private:
  // Takes the cancelled and expired requests out of the queue and answers them; returns the
  // next deadline of a queued request (0: none). Runs on the sweeper's thread.
  uint64_t Sweep(uint64_t now);
  // Answers a request that leaves the queue unrun: cancelled, or past its deadline.
  void Drop(std::unique_ptr<core::InferRequest> request, uint64_t now);

  const size_t max_queue_size_;
  metrics::ModelStats* const stats_;
  InstancePool pool_;
  // Declared after pool_: unregistered first, so no sweep runs on a pool being destroyed.
  std::unique_ptr<DeadlineSweeper::Client> sweep_;
};

}  // namespace inferd::scheduling
