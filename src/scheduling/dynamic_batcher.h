// Triton's dynamic batcher: requests wait in bounded per-priority queues; one batcher thread
// forms batches (batch_policy.h) whenever an instance is free and submits each batch to the
// model's InstancePool, which runs the backend once for the whole batch.
//
// Batch sizes: Triton's rules (batch_policy.h), except that with no preferred_batch_size (or
// only max_batch_size, the one Triton's normalization fills in when none is given) the
// batcher learns which batch sizes the model runs cheapest per request and may send fewer
// than all the queued requests when a smaller batch has run clearly cheaper (ShrinkBatch).
//
// Queue policy: priority levels (1 is highest), per-level max_queue_size (a full level rejects
// at once with UNAVAILABLE), timeouts with REJECT or DELAY (a delayed request goes behind every
// request of its level and above that has not timed out), request timeouts that may only
// lower the configured one when allow_timeout_override is set. preserve_ordering returns
// responses in arrival order across instances.
//
// Deadlines and cancellation: a request past its deadline (queue policy timeout with REJECT, or
// the client's gRPC deadline) or cancelled by its client leaves the queue when that happens,
// also while every instance is busy (the batcher wakes at the earliest deadline, and a
// cancellation wakes it), answered DEADLINE_EXCEEDED (504, the time waited in the message) or
// CANCELLED, and counted TIMEOUT or CANCELED; a batch is formed only from requests whose
// deadline has not passed at that instant. When every request of a running batch is cancelled
// the instance is asked to stop the run (ModelInstance::CancelExecution).
//
// Thread-safe. Locking: mu_ guards the queues; callbacks run outside it.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "backends/backend.h"
#include "config/model_config_util.h"
#include "metrics/model_stats.h"
#include "scheduling/batch_policy.h"
#include "scheduling/instance_pool.h"
#include "scheduling/scheduler.h"

namespace inferd::scheduling {

class DynamicBatcher : public Scheduler {
 public:
  // `now_ns` is the clock (tests inject one); `stats` must outlive the batcher.
  DynamicBatcher(const config::ModelConfig& config, int64_t version,
                 std::vector<std::unique_ptr<backends::ModelInstance>> instances,
                 size_t server_max_queue_size, metrics::ModelStats* stats,
                 std::function<uint64_t()> now_ns = core::NowNs);
  ~DynamicBatcher() override;

  void Enqueue(std::unique_ptr<core::InferRequest> request) override;
  void Shutdown() override;
  size_t InFlight() const override;
  size_t Queued() const override;

 private:
  struct Pending {
    std::unique_ptr<core::InferRequest> request;
    std::string shape_key;
    uint64_t enqueue_ns = 0;
    uint64_t deadline_ns = 0;  // queue policy timeout (REJECT or DELAY); 0: none
    uint64_t timeout_us = 0;   // the timeout that set deadline_ns, for the message
    uint64_t client_deadline_ns = 0;  // the client's own deadline; always rejects; 0: none
    uint64_t sequence = 0;
    metrics::FailureReason drop = metrics::FailureReason::kOther;  // why ExpireLocked took it
  };
  struct Level {
    inference::ModelQueuePolicy policy;
    std::deque<Pending> live;
    std::deque<Pending> delayed;
  };

  void BatcherLoop();
  // DecideBatch and ShrinkBatch over the queue in scheduling order (`order`): how many of its
  // first requests to send now (d->take; 0: wait, until d->wait_until_ns if set).
  size_t DecideLocked(uint64_t now, std::vector<Pending*>* order, BatchDecision* d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the first `count` queued requests to idle `instance`.
  void SubmitLocked(size_t instance, size_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On the thread at hand (an Enqueue, or the instance's own on_free): sends idle `instance`
  // the batch the policy says to send now; false when it would wait, when a queued request
  // must leave unrun (the batcher thread answers it), or when stopping. Saves the batcher
  // thread's wake-up on the common path.
  bool TrySubmitLocked(size_t instance) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves timed-out requests out of the live queues (DELAY) and returns the ones to answer now:
  // cancelled, past the client's deadline, or past a REJECT timeout (`drop` says which).
  std::vector<Pending> ExpireLocked(uint64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The completion of a request that leaves the queue unrun (ExpireLocked's `drop`).
  std::function<void()> DropLater(Pending p);
  // Queued requests in scheduling order.
  std::vector<Pending*> OrderLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NextDeadlineLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t QueuedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string model_name_;
  const int64_t version_;
  const BatchPolicy policy_;
  const bool preserve_ordering_;
  const uint64_t default_level_;
  const size_t server_max_queue_size_;
  metrics::ModelStats* const stats_;
  const std::function<uint64_t()> now_ns_;
  std::vector<std::string> ragged_inputs_;  // inputs with allow_ragged_batch

  mutable inferd::Mutex mu_;
  inferd::CondVar batcher_cv_;
  std::map<uint64_t, Level> levels_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;  // arrival order, for preserve_ordering
  // Instances free for a batch, as the pool reported them (on_free) and this thread took them:
  // the batcher thread looks here on every wake-up without taking the pool's lock.
  std::vector<bool> idle_ ABSL_GUARDED_BY(mu_);
  // ShrinkBatch's count of the batches it would have made smaller.
  uint64_t shrinks_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Each batch size's run time per request, from the instance threads (batch_policy.h);
  // learned only when the config names no preferred_batch_size other than max_batch_size.
  const bool learn_sizes_;
  BatchCosts costs_;

  // Declared after the queues: destroyed first, so no instance thread runs on.
  InstancePool pool_;
  std::thread batcher_;
};

}  // namespace inferd::scheduling
