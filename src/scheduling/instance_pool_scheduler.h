// Triton's default scheduler: a bounded FIFO queue shared by all instances of a model, one
// execution thread per instance, one request per execution.
//
// Deadlines and cancellation: a queued request whose `timeout` parameter (from its arrival) or
// client deadline passes, or whose client cancels it, is answered at that moment by a sweeper
// thread (DEADLINE_EXCEEDED with the time waited, or CANCELLED), even while every instance is
// busy, and never runs; a running request whose client cancels it asks the instance to stop
// (ModelInstance::CancelExecution). Unlike the dynamic batcher there is no queue policy here,
// so the request's own `timeout` always applies.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "backends/backend.h"
#include "metrics/model_stats.h"
#include "scheduling/scheduler.h"

namespace inferd::scheduling {

// Thread-safe. Owns the instances; `stats` must outlive the scheduler.
class InstancePoolScheduler : public Scheduler {
 public:
  InstancePoolScheduler(std::string model_name, int64_t version,
                        std::vector<std::unique_ptr<backends::ModelInstance>> instances,
                        size_t max_queue_size, metrics::ModelStats* stats);
  ~InstancePoolScheduler() override;

  void Enqueue(std::unique_ptr<core::InferRequest> request) override;
  void Shutdown() override;
  size_t InFlight() const override;
  size_t Queued() const override;

 private:
  void WorkerLoop(backends::ModelInstance* instance);
  void SweeperLoop();
  // Answers a request that leaves the queue unrun: cancelled, or past its deadline.
  void Drop(std::unique_ptr<core::InferRequest> request, uint64_t now);
  void Complete(std::unique_ptr<core::InferRequest> request,
                std::unique_ptr<core::InferResponse> response, uint64_t input_ns,
                uint64_t infer_ns, uint64_t output_ns);

  const std::string model_name_;
  const int64_t version_;
  const size_t max_queue_size_;
  metrics::ModelStats* const stats_;
  std::vector<std::unique_ptr<backends::ModelInstance>> instances_;
  std::vector<std::thread> workers_;
  std::thread sweeper_;

  mutable inferd::Mutex mu_;
  inferd::CondVar work_available_;
  inferd::CondVar sweep_;  // a cancellation, or a request with a deadline, arrived
  std::deque<std::unique_ptr<core::InferRequest>> queue_ ABSL_GUARDED_BY(mu_);
  size_t executing_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace inferd::scheduling
