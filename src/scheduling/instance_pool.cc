#include "scheduling/instance_pool.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "common/strings.h"
#include "scheduling/run_cancellation.h"

namespace inferd::scheduling {
namespace {
constexpr size_t kInline = 8;
constexpr size_t kNoInstance = ~size_t{0};

bool AllRunOnAnyThread(const std::vector<std::unique_ptr<backends::ModelInstance>>& instances) {
  for (const auto& i : instances) {
    if (!i->RunsOnAnyThread()) return false;
  }
  return !instances.empty();
}
}  // namespace

InstancePool::InstancePool(Options options,
                           std::vector<std::unique_ptr<backends::ModelInstance>> instances,
                           std::function<void(size_t)> on_free)
    : options_(std::move(options)),
      instances_(std::move(instances)),
      on_free_(std::move(on_free)),
      caller_runs_(options_.caller_runs && on_free_ == nullptr && AllRunOnAnyThread(instances_)) {
  {
    inferd::MutexLock lock(&mu_);
    for (size_t i = 0; i < instances_.size(); ++i) slots_.push_back(std::make_unique<Slot>());
  }
  for (size_t i = 0; i < instances_.size(); ++i) {
    threads_.emplace_back([this, i] { InstanceLoop(i); });
  }
}

InstancePool::~InstancePool() { Shutdown(); }

std::optional<size_t> InstancePool::FreeInstance() const {
  inferd::MutexLock lock(&mu_);
  if (stopping_) return std::nullopt;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i]->busy) return i;
  }
  return std::nullopt;
}

bool InstancePool::IsFree(size_t instance) const {
  inferd::MutexLock lock(&mu_);
  return !stopping_ && !slots_[instance]->busy;
}

void InstancePool::Submit(size_t instance, Batch batch) {
  absl::Status refused;
  Slot* wake = nullptr;
  {
    inferd::MutexLock lock(&mu_);
    Slot& slot = *slots_[instance];
    if (exit_) {
      refused = absl::UnavailableError(StrCat("model '", options_.model_name, "' version ",
                                              options_.version, " is unloading"));
    } else if (slot.busy) {
      refused = absl::InternalError(StrCat("model '", options_.model_name, "': instance ",
                                           instance, " was given a batch while busy"));
    } else {
      slot.busy = true;
      executing_ += batch.requests.size();
      slot.batch = std::move(batch);
      wake = &slot;
    }
  }
  if (wake != nullptr) {
    wake->cv.Signal();  // outside the lock: the instance can take it at once
    return;
  }
  for (auto& r : batch.requests) {
    if (r->cancel) r->cancel->ClearListener();
    core::CompleteWithError(std::move(r), refused);
  }
}

void InstancePool::SubmitAny(Batch batch, size_t max_queued) {
  absl::Status refused;
  Slot* wake = nullptr;
  size_t caller = kNoInstance;
  const bool may_run_here =
      caller_runs_ && recent_run_ns_.load(std::memory_order_relaxed) <= options_.caller_run_max_ns;
  {
    inferd::MutexLock lock(&mu_);
    if (may_run_here && !stopping_ && queued_.empty() && !handing_off_) {
      // An idle instance with no wake-up on its way: this thread runs the batch on it.
      bool caller_running = false;
      for (size_t i = 0; i < slots_.size(); ++i) {
        Slot& s = *slots_[i];
        if (!s.busy && !s.woken) {
          s.busy = true;
          s.caller = true;
          executing_ += batch.requests.size();
          caller = i;
          break;
        }
        caller_running |= s.caller;
      }
      // Every instance busy. Held by another thread's caller run (two event loops sharing one
      // instance, say): the batch is queued and that thread runs it right after its own
      // (RunOnCaller), no thread woken. Held by instance threads: the model is saturated; hand
      // off from now on, as without caller runs: the instance threads take the queue without
      // sleeping between runs and each loop is woken once per batch of answers, where mixing
      // the two paths costs more than either. Until an instance thread finds the queue empty
      // and sleeps (InstanceLoop).
      if (caller == kNoInstance && !caller_running) handing_off_ = true;
    }
    if (caller != kNoInstance) {
      // Run below, without the lock.
    } else if (stopping_) {
      refused = absl::UnavailableError(StrCat("model '", options_.model_name, "' version ",
                                              options_.version, " is unloading"));
    } else if (queued_.size() >= max_queued) {
      refused = absl::UnavailableError(
          StrCat("model '", options_.model_name, "' has ", queued_.size(),
                 " requests queued, the limit (--max-queue-size); retry later"));
    } else {
      queued_.push_back(std::move(batch));
      // Wake one idle instance that is not already on its way to the queue; with none, the
      // next instance to finish its run takes it.
      for (auto& s : slots_) {
        if (!s->busy && !s->woken) {
          s->woken = true;
          wake = s.get();
          break;
        }
      }
      if (wake == nullptr) return;
    }
  }
  if (caller != kNoInstance) {
    RunOnCaller(caller, std::move(batch));
    return;
  }
  if (wake != nullptr) {
    wake->cv.Signal();  // outside the lock: the instance can take it at once
    return;
  }
  for (auto& r : batch.requests) {
    if (r->cancel) r->cancel->ClearListener();
    options_.stats->RecordFailure(core::NowNs() - r->times.received_ns,
                                  metrics::FailureReason::kRejected);
    core::CompleteWithError(std::move(r), refused);
  }
}

void InstancePool::RunOnCaller(size_t index, Batch batch) {
  // Batches other threads queued meanwhile run here too (each thread that found the instance
  // held by this run queued its batch and went on), up to four runs' worth of the bound
  // (caller_run_max_ns) by the recent runs' average, 64 at most; what is left after that goes
  // to the instance's own thread. Their answers reach their own threads as an instance
  // thread's would (one wake per batch of answers), and no thread was woken to run them. Runs,
  // not wall time: a loop preempted in the middle (2 cores, the load generator beside it) has
  // not run longer, and handing the queue to the instance thread then turns the model over to
  // hand-offs for as long as it stays saturated.
  const uint64_t recent = std::max<uint64_t>(1, recent_run_ns_.load(std::memory_order_relaxed));
  const uint64_t max_runs =
      std::clamp<uint64_t>(4 * options_.caller_run_max_ns / recent, 4, 64);
  uint64_t runs = 0;
  for (;;) {
    const size_t n = batch.requests.size();
    Run(instances_[index].get(), std::move(batch));
    Slot* wake = nullptr;
    bool again = false;
    {
      inferd::MutexLock lock(&mu_);
      Slot& slot = *slots_[index];
      slot.busy = false;
      slot.caller = false;
      executing_ -= n;
      if (stopping_) all_free_.SignalAll();
      if (!queued_.empty() && !slot.woken) {
        if (!stopping_ && ++runs < max_runs &&
            recent_run_ns_.load(std::memory_order_relaxed) <= options_.caller_run_max_ns) {
          batch = std::move(queued_.front());
          queued_.pop_front();
          slot.busy = true;
          slot.caller = true;
          executing_ += batch.requests.size();
          again = true;
        } else {
          // The instance's own thread takes the rest, as it would had it run this batch.
          slot.woken = true;
          wake = &slot;
        }
      }
    }
    if (wake != nullptr) wake->cv.Signal();
    if (!again) return;
  }
}

void InstancePool::NoteRunTime(uint64_t ns) {
  const uint64_t old = recent_run_ns_.load(std::memory_order_relaxed);
  recent_run_ns_.store(old == kUnknownRunNs ? ns : old - old / 8 + ns / 8,
                       std::memory_order_relaxed);
}

std::vector<Batch> InstancePool::TakeQueuedIf(absl::FunctionRef<bool(const Batch&)> take) {
  std::vector<Batch> taken;
  inferd::MutexLock lock(&mu_);
  for (auto it = queued_.begin(); it != queued_.end();) {
    if (take(*it)) {
      taken.push_back(std::move(*it));
      it = queued_.erase(it);
    } else {
      ++it;
    }
  }
  if (stopping_ && !taken.empty()) all_free_.SignalAll();  // Shutdown waits for the queue too
  return taken;
}

size_t InstancePool::Queued() const {
  inferd::MutexLock lock(&mu_);
  return queued_.size();
}

size_t InstancePool::InFlight() const {
  inferd::MutexLock lock(&mu_);
  size_t n = executing_;
  for (const Batch& b : queued_) n += b.requests.size();
  return n;
}

size_t InstancePool::Executing() const {
  inferd::MutexLock lock(&mu_);
  return executing_;
}

void InstancePool::InstanceLoop(size_t index) {
  backends::ModelInstance* instance = instances_[index].get();
  mu_.Lock();
  Slot* slot = slots_[index].get();
  for (;;) {
    // A batch submitted to this instance, else the oldest queued one; the lock is taken once
    // between two runs.
    // `woken` says a wake-up is on its way to this instance; it is cleared before every wait,
    // not only once work is found: woken for a queued batch that another instance took, or
    // that a sweep took back (cancelled, expired), the instance must be wakeable again, or
    // SubmitAny would pass it over and leave the queue to wait forever.
    // `busy` with no batch of its own: a caller run holds the instance (SubmitAny), and the
    // queue waits until it ends (RunOnCaller wakes this thread for it).
    while (!slot->batch.has_value() && (queued_.empty() || slot->busy) && !exit_) {
      if (queued_.empty()) handing_off_ = false;  // the saturation is over
      slot->woken = false;
      slot->cv.Wait(&mu_);
    }
    slot->woken = false;
    Batch batch;
    if (slot->batch.has_value()) {
      batch = *std::move(slot->batch);
      slot->batch.reset();
    } else if (!queued_.empty() && !slot->busy) {
      batch = std::move(queued_.front());
      queued_.pop_front();
      slot->busy = true;
      executing_ += batch.requests.size();
    } else {
      break;  // shutting down, nothing left
    }
    const size_t n = batch.requests.size();
    mu_.Unlock();
    Run(instance, std::move(batch));
    mu_.Lock();
    slot->busy = false;
    executing_ -= n;
    if (stopping_) all_free_.SignalAll();
    if (on_free_) {
      mu_.Unlock();
      on_free_(index);
      mu_.Lock();
    }
  }
  mu_.Unlock();
}

void InstancePool::Run(backends::ModelInstance* instance, Batch batch) {
  if (batch.deadline_ns != 0 && batch.expired) {
    const uint64_t now = core::NowNs();
    if (now >= batch.deadline_ns) {  // never run what nobody waits for
      for (auto& r : batch.requests) {
        if (r->cancel) r->cancel->ClearListener();
        batch.expired(std::move(r), now);
      }
      if (batch.after_delivery) batch.after_delivery();
      return;
    }
  }
  std::vector<std::pair<uint64_t, std::function<void()>>> done;
  auto order_of = [&batch](size_t i) { return batch.order.empty() ? 0 : batch.order[i]; };
  // The scheduler's queue listeners go (RunCancellation installs its own); a request cancelled
  // since the batch was decided does not run.
  // On the stack up to a batch of kInline (the default scheduler runs one request at a time).
  absl::InlinedVector<size_t, kInline> ran;  // indices into batch.requests
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    core::InferRequest& r = *batch.requests[i];
    if (r.cancel) r.cancel->ClearListener();
    if (!r.IsCancelled()) {
      ran.push_back(i);
      continue;
    }
    auto req = std::make_shared<std::unique_ptr<core::InferRequest>>(std::move(batch.requests[i]));
    done.emplace_back(order_of(i), [this, req] {
      const uint64_t now = core::NowNs();
      options_.stats->RecordFailure(now - (*req)->times.received_ns,
                                    metrics::FailureReason::kCanceled);
      absl::Status st = core::CancelledError(**req, now);
      core::CompleteWithError(std::move(*req), std::move(st));
    });
  }

  const size_t n = ran.size();
  absl::InlinedVector<core::InferRequest*, kInline> reqs(n);
  absl::InlinedVector<std::unique_ptr<core::InferResponse>, kInline> resps(n);
  absl::InlinedVector<core::InferResponse*, kInline> resp_ptrs(n);
  int64_t total = 0;
  const uint64_t start = core::NowNs();
  for (size_t k = 0; k < n; ++k) {
    reqs[k] = batch.requests[ran[k]].get();
    reqs[k]->times.compute_start_ns = start;
    total += reqs[k]->batch_size;
    resps[k] = std::make_unique<core::InferResponse>();
    resps[k]->model_name = options_.model_name;
    resps[k]->model_version = options_.version;
    resps[k]->id = reqs[k]->id;
    resp_ptrs[k] = resps[k].get();
  }
  backends::ExecutionTimes times;
  if (n > 0) {
    RunCancellation run_cancel(instance, reqs);
    instance->Execute(reqs, resp_ptrs, &times);
    run_cancel.End();
  }
  const uint64_t end = core::NowNs();
  if (n > 0 && caller_runs_) NoteRunTime(end - start);
  if (times.input_end_ns == 0) times.input_end_ns = start;
  if (times.output_start_ns == 0) times.output_start_ns = end;
  const uint64_t input_ns = times.input_end_ns - start;
  const uint64_t infer_ns = times.output_start_ns - times.input_end_ns;
  const uint64_t output_ns = end - times.output_start_ns;
  if (batch.after_execute) {
    for (size_t k = 0; k < n; ++k) batch.after_execute(ran[k], *resps[k]);
  }
  bool any_ok = false;
  metrics::ModelStats* stats = options_.stats;
  for (size_t k = 0; k < n; ++k) {
    core::InferRequest& r = *reqs[k];
    r.times.compute_input_end_ns = times.input_end_ns;  // for the trace extension
    r.times.compute_output_start_ns = times.output_start_ns;
    r.times.compute_end_ns = end;
    core::InferResponse& resp = *resps[k];
    if (!resp.status.ok() && r.IsCancelled()) {
      // A run stopped because its clients left.
      resp.status = core::CancelledError(r, end);
      resp.outputs.clear();
      stats->RecordFailure(end - r.times.received_ns, metrics::FailureReason::kCanceled);
    } else if (resp.status.ok()) {
      any_ok = true;
      stats->RecordSuccess(end - r.times.received_ns, start - r.times.queue_start_ns, input_ns,
                           infer_ns, output_ns, r.batch_size);
    } else {
      stats->RecordFailure(end - r.times.received_ns, metrics::FailureReason::kBackend);
    }
  }
  if (any_ok) {
    stats->RecordExecution(total, input_ns, infer_ns, output_ns);
    if (options_.on_run) options_.on_run(total, end - start);
  }
  if (done.empty() && batch.order.empty()) {
    // The common case: deliver straight from here, without wrapping each completion.
    for (size_t k = 0; k < n; ++k) {
      core::InferCallback cb = std::move(reqs[k]->on_complete);
      batch.requests[ran[k]].reset();
      if (cb) cb(std::move(resps[k]));
    }
  } else {
    for (size_t k = 0; k < n; ++k) {
      auto req = std::make_shared<std::unique_ptr<core::InferRequest>>(
          std::move(batch.requests[ran[k]]));
      auto resp = std::make_shared<std::unique_ptr<core::InferResponse>>(std::move(resps[k]));
      done.emplace_back(order_of(ran[k]), [req, resp] {
        core::InferCallback cb = std::move((*req)->on_complete);
        req->reset();
        if (cb) cb(std::move(*resp));
      });
    }
    Deliver(std::move(done));
  }
  if (batch.after_delivery) batch.after_delivery();
}

void InstancePool::Deliver(std::vector<std::pair<uint64_t, std::function<void()>>> done) {
  if (!options_.preserve_ordering) {
    for (auto& [seq, fn] : done) fn();
    return;
  }
  // Completions run under order_mu_ so they are delivered strictly in arrival order; each
  // only hands a response to its frontend, so the section stays short.
  inferd::MutexLock lock(&order_mu_);
  for (auto& [seq, fn] : done) held_[seq] = std::move(fn);
  for (auto it = held_.find(next_release_); it != held_.end(); it = held_.find(next_release_)) {
    std::function<void()> fn = std::move(it->second);
    held_.erase(it);
    ++next_release_;
    fn();
  }
}

void InstancePool::Shutdown() {
  {
    inferd::MutexLock lock(&mu_);
    if (exit_ && threads_.empty()) return;
    stopping_ = true;
    // Every batch submitted or queued runs and is delivered; FreeInstance reports none and
    // SubmitAny refuses from now on.
    for (;;) {
      bool busy = !queued_.empty();
      for (const auto& s : slots_) busy = busy || s->busy;
      if (!busy) break;
      all_free_.Wait(&mu_);
    }
    exit_ = true;
    for (auto& s : slots_) s->cv.SignalAll();
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

}  // namespace inferd::scheduling
