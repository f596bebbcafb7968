// The one executor under every scheduler: a model's instances, one thread each, and everything
// that happens to a batch once a scheduler has decided it: the hand-off to a free instance, the
// drop of a request cancelled before it starts, the compute timestamps, stopping a running
// batch whose clients have all gone (RunCancellation), the statistics, the delivery of the
// responses (in arrival order when the model asks for it) and an ordered shutdown.
//
// Schedulers (InstancePoolScheduler, DynamicBatcher, SequenceBatcher) only decide which
// requests run together and on which instance, and Submit the batch here, as Triton's
// schedulers hand their payloads to one rate limiter that runs them on model instances. A
// device and stream of a GPU instance belong to this layer.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "backends/backend.h"
#include "common/mutex.h"
#include "core/infer_request.h"
#include "metrics/model_stats.h"

namespace inferd::scheduling {

// One execution: the requests a scheduler decided to run together on one instance.
struct Batch {
  std::vector<std::unique_ptr<core::InferRequest>> requests;
  // With preserve_ordering: each request's place in arrival order (InstancePool::Deliver);
  // otherwise empty.
  std::vector<uint64_t> order;
  // Runs on the instance thread for each request that ran, after Execute and before the
  // statistics and the delivery; `index` is the request's place in `requests` as submitted.
  // It may change the response (the sequence batcher keeps the state outputs and drops them).
  std::function<void(size_t index, core::InferResponse& response)> after_execute;
  // Runs on the instance thread once every response of the batch has been delivered, before
  // the instance takes new work (the sequence batcher frees the batch's sequences here).
  std::function<void()> after_delivery;
  // When an instance picks the batch up at or after `deadline_ns` (core::NowNs; 0: never), it
  // does not run: each request goes to `expired` (listener cleared), which answers it.
  uint64_t deadline_ns = 0;
  std::function<void(std::unique_ptr<core::InferRequest>, uint64_t now_ns)> expired;
};

// Thread-safe. Owns the instances and their threads; `stats` must outlive the pool.
// Lock order: a scheduler may call FreeInstance, IsFree and Submit holding its own lock; the
// pool never calls back into a scheduler while holding its own, and `on_free` runs with no
// pool lock held.
class InstancePool {
 public:
  struct Options {
    std::string model_name;
    int64_t version = 0;
    metrics::ModelStats* stats = nullptr;
    bool preserve_ordering = false;
    // SubmitAny may run a batch on the submitting thread (see there). Takes effect only for a
    // pool without `on_free` whose instances all RunsOnAnyThread().
    bool caller_runs = false;
    // The longest recent run (a moving average of each run's Execute time) for which it
    // does: about what the two thread hand-offs it saves cost.
    uint64_t caller_run_max_ns = 20'000;
    // Runs on the instance thread after each run in which a request succeeded, with the
    // batch's total size and the run's time (Execute, from gathering inputs to scattering
    // outputs): the dynamic batcher learns its batch sizes from it (batch_policy.h).
    std::function<void(int64_t batch_total, uint64_t run_ns)> on_run = nullptr;
  };

  // `on_free(i)` runs on instance i's thread each time the instance becomes free (after the
  // batch's after_delivery); a scheduler wakes its batcher there, or submits the next batch
  // from inside it (no thread hop). Not called after Shutdown began draining the last batch.
  InstancePool(Options options, std::vector<std::unique_ptr<backends::ModelInstance>> instances,
               std::function<void(size_t instance)> on_free);
  ~InstancePool();
  InstancePool(const InstancePool&) = delete;
  InstancePool& operator=(const InstancePool&) = delete;

  size_t size() const { return instances_.size(); }

  // A free instance (the lowest index), or none. An instance becomes busy only by Submit and
  // free only by the pool, so a scheduler that serializes its Submits under its own lock may
  // submit to the instance this returns.
  std::optional<size_t> FreeInstance() const;
  bool IsFree(size_t instance) const;

  // Runs `batch` on free instance `instance`. Always takes ownership: after Shutdown, or onto
  // a busy instance (a scheduler bug), the requests are answered with an error.
  void Submit(size_t instance, Batch batch);

  // Queues `batch` for whichever instance is free first, in FIFO order (Triton's default
  // scheduler): the producer and the instance thread each take the pool's lock once, no
  // thread in between. Always takes ownership: with `max_queued` batches already waiting
  // (--max-queue-size), or once Shutdown began, its requests are answered UNAVAILABLE and
  // counted REJECTED.
  // Caller runs (Options::caller_runs): when nothing is queued, an instance is idle and the
  // model's recent runs took at most Options::caller_run_max_ns, the batch runs here, on the
  // submitting thread (an HTTP loop, a gRPC thread, an ensemble step's completion), and its
  // responses are delivered before SubmitAny returns. For a model that runs in microseconds
  // the two hand-offs (wake the instance thread, wake the frontend's loop with the answer)
  // cost more than the run. A submitter that finds every instance busy with another thread's
  // caller run queues its batch and returns; that thread runs the queued batches after its own
  // (no thread woken; a frontend thread is held at most about four such runs longer, then the
  // instance thread takes the rest). One that finds every instance busy on its own thread
  // hands batches off until an instance thread finds the queue empty (a saturated model:
  // hand-offs then cost little, one wake per batch of answers, and mixing the two paths costs
  // more than either).
  void SubmitAny(Batch batch, size_t max_queued);
  // Takes out the batches SubmitAny queued for which `take` returns true (cancelled, past a
  // deadline). `take` runs under the pool's lock: it must not call into the pool.
  std::vector<Batch> TakeQueuedIf(absl::FunctionRef<bool(const Batch&)> take);
  // Batches SubmitAny queued that no instance has picked up yet.
  size_t Queued() const;

  // Hands out completions (each: its arrival number and the call that delivers it). With
  // preserve_ordering they run strictly in arrival order, each once every earlier one has run;
  // a scheduler answers the requests it drops unrun (queue timeouts) through here so they keep
  // their place. Without it they run now, on this thread.
  void Deliver(std::vector<std::pair<uint64_t, std::function<void()>>> done);

  // Requests in submitted batches not delivered yet.
  size_t Executing() const;
  // Queued() batches' requests plus Executing(), read at one instant.
  size_t InFlight() const;

  // Waits until every submitted batch (SubmitAny's queue included) has been delivered, then
  // joins the threads. A batcher stops submitting first. Idempotent.
  void Shutdown();

 private:
  struct Slot {
    std::optional<Batch> batch;  // submitted, not picked up yet
    bool busy = false;           // from Submit (or a pick from queued_, or a caller run)
                                 // until delivered
    bool caller = false;         // busy with a caller run (RunOnCaller): it takes queued_
                                 // work after its own, no wake needed
    bool woken = false;          // signalled for queued_ work, not awake yet
    inferd::CondVar cv;
  };

  void InstanceLoop(size_t index);
  void Run(backends::ModelInstance* instance, Batch batch);
  // SubmitAny's caller run on instance `index`, which it marked busy.
  void RunOnCaller(size_t index, Batch batch);
  // Folds one run's Execute time into recent_run_ns_.
  void NoteRunTime(uint64_t ns);

  const Options options_;
  std::vector<std::unique_ptr<backends::ModelInstance>> instances_;
  const std::function<void(size_t)> on_free_;
  const bool caller_runs_;
  // A moving average of Execute's time per run (1/8 weight to the newest), or kUnknownRunNs
  // before the first run. Racy updates lose a sample at most; nothing else reads it.
  static constexpr uint64_t kUnknownRunNs = ~uint64_t{0};
  std::atomic<uint64_t> recent_run_ns_{kUnknownRunNs};

  mutable inferd::Mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  std::deque<Batch> queued_ ABSL_GUARDED_BY(mu_);  // SubmitAny's, for the first free instance
  size_t executing_ ABSL_GUARDED_BY(mu_) = 0;
  // SubmitAny found every instance busy: no caller runs until an instance thread finds the
  // queue empty.
  bool handing_off_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool exit_ ABSL_GUARDED_BY(mu_) = false;
  inferd::CondVar all_free_;  // signalled when an instance becomes free while stopping

  // preserve_ordering: completions wait here until every earlier request has completed.
  inferd::Mutex order_mu_;
  uint64_t next_release_ ABSL_GUARDED_BY(order_mu_) = 0;
  std::map<uint64_t, std::function<void()>> held_ ABSL_GUARDED_BY(order_mu_);

  std::vector<std::thread> threads_;
};

}  // namespace inferd::scheduling
