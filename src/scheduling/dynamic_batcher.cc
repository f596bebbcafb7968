#include "scheduling/dynamic_batcher.h"

#include <algorithm>

#include "absl/time/time.h"
#include "common/strings.h"

namespace inferd::scheduling {
namespace {

BatchPolicy PolicyFrom(const config::ModelConfig& config) {
  BatchPolicy p;
  p.max_batch_size = std::max(1, config.max_batch_size());
  // A preferred size equal to max_batch_size is what Triton's normalization (and
  // config::NormalizeAndValidate) writes when the config names none, and it forms the batches
  // no preferred size forms: it is left out, so such a model still learns its batch sizes.
  for (int32_t s : config.dynamic_batching().preferred_batch_size()) {
    if (s != p.max_batch_size) p.preferred_batch_sizes.push_back(s);
  }
  p.max_queue_delay_ns = config.dynamic_batching().max_queue_delay_microseconds() * 1000;
  return p;
}

// Requests with equal keys may share a batch: same inputs, types and non-batch shapes, except
// that the shape of an input with `allow_ragged_batch` may differ (the backend takes each
// request's tensor as it is).
std::string ShapeKey(const core::InferRequest& r, const std::vector<std::string>& ragged) {
  std::string key;
  for (const auto& in : r.inputs) {
    StrAppend(&key, in.name, ":", DataTypeName(in.datatype), ":");
    if (std::find(ragged.begin(), ragged.end(), in.name) == ragged.end()) {
      for (size_t i = 1; i < in.shape.size(); ++i) StrAppend(&key, in.shape[i], ",");
    }
    key.push_back(';');
  }
  return key;
}

}  // namespace

DynamicBatcher::DynamicBatcher(const config::ModelConfig& config, int64_t version,
                               std::vector<std::unique_ptr<backends::ModelInstance>> instances,
                               size_t server_max_queue_size, metrics::ModelStats* stats,
                               std::function<uint64_t()> now_ns)
    : model_name_(config.name()),
      version_(version),
      policy_(PolicyFrom(config)),
      preserve_ordering_(config.dynamic_batching().preserve_ordering()),
      default_level_(config.dynamic_batching().priority_levels() == 0
                         ? 0
                         : std::max<uint64_t>(1, config.dynamic_batching().default_priority_level())),
      server_max_queue_size_(server_max_queue_size),
      stats_(stats),
      now_ns_(std::move(now_ns)),
      learn_sizes_(policy_.preferred_batch_sizes.empty() && policy_.max_batch_size > 1),
      costs_(policy_.max_batch_size),
      pool_({.model_name = model_name_,
             .version = version_,
             .stats = stats_,
             .preserve_ordering = preserve_ordering_,
             .on_run = learn_sizes_ ? std::function<void(int64_t, uint64_t)>(
                                          [this](int64_t total, uint64_t ns) {
                                            costs_.Record(total, ns);
                                          })
                                    : nullptr},
            std::move(instances), [this](size_t instance) {
              bool wake;
              {
                inferd::MutexLock lock(&mu_);
                idle_[instance] = true;
                // The freed instance's next batch, formed here: the instance thread runs it
                // without sleeping and no other thread wakes. Anything left queued (a split
                // batch, work for another free instance, a deadline to time) is the batcher
                // thread's.
                TrySubmitLocked(instance);
                wake = QueuedLocked() > 0 || stopping_;
              }
              if (wake) batcher_cv_.Signal();  // outside the lock: it can take it at once
            }) {
  for (const auto& in : config.input()) {
    if (in.allow_ragged_batch()) ragged_inputs_.push_back(in.name());
  }
  const auto& db = config.dynamic_batching();
  {
    inferd::MutexLock lock(&mu_);
    if (db.priority_levels() == 0) {
      levels_[0].policy = db.default_queue_policy();
    } else {
      for (uint64_t l = 1; l <= db.priority_levels(); ++l) {
        auto it = db.priority_queue_policy().find(l);
        levels_[l].policy = it != db.priority_queue_policy().end() ? it->second : db.default_queue_policy();
      }
    }
    idle_.assign(pool_.size(), true);
  }
  batcher_ = std::thread([this] { BatcherLoop(); });
}

DynamicBatcher::~DynamicBatcher() { Shutdown(); }

void DynamicBatcher::Enqueue(std::unique_ptr<core::InferRequest> request) {
  absl::Status refused;
  if (request->cancel) {
    // Installed before mu_ is taken (the listener takes it): a cancellation wakes the batcher,
    // which answers the request at once, even while every instance is busy.
    request->cancel->SetListener([this] {
      inferd::MutexLock lock(&mu_);
      batcher_cv_.Signal();
    });
  }
  {
    inferd::MutexLock lock(&mu_);
    uint64_t level = default_level_;
    if (level != 0 && request->priority >= 1 && levels_.count(request->priority)) {
      level = request->priority;
    }
    Level& l = levels_[level];
    const size_t cap = l.policy.max_queue_size() > 0 ? l.policy.max_queue_size() : server_max_queue_size_;
    if (stopping_) {
      refused = absl::UnavailableError(
          StrCat("model '", model_name_, "' version ", version_, " is unloading"));
    } else if (l.live.size() + l.delayed.size() >= cap) {
      refused = absl::UnavailableError(StrCat(
          "model '", model_name_, "': the queue", level ? StrCat(" of priority level ", level) : "",
          " is full (", cap, l.policy.max_queue_size() > 0 ? " requests, max_queue_size" : " requests, --max-queue-size",
          "); retry later"));
    } else if (QueuedLocked() >= server_max_queue_size_) {
      refused = absl::UnavailableError(StrCat("model '", model_name_, "' has ", QueuedLocked(),
                                              " requests queued (--max-queue-size); retry later"));
    } else {
      Pending p;
      p.enqueue_ns = now_ns_();
      request->times.queue_start_ns = core::NowNs();
      uint64_t timeout_us = l.policy.default_timeout_microseconds();
      if (l.policy.allow_timeout_override() && request->timeout_us > 0) {
        timeout_us = timeout_us == 0 ? request->timeout_us : std::min(timeout_us, request->timeout_us);
      }
      p.deadline_ns = timeout_us ? p.enqueue_ns + timeout_us * 1000 : 0;
      p.timeout_us = timeout_us;
      p.client_deadline_ns = request->deadline_ns;
      p.shape_key = ShapeKey(*request, ragged_inputs_);
      p.sequence = next_sequence_++;
      p.request = std::move(request);
      l.live.push_back(std::move(p));
      // An idle instance runs it at once, without a wake of the batcher thread.
      const auto free = std::find(idle_.begin(), idle_.end(), true);
      if (free != idle_.end() && TrySubmitLocked(static_cast<size_t>(free - idle_.begin())) &&
          QueuedLocked() == 0) {
        return;
      }
    }
  }
  if (!refused.ok()) {
    if (request->cancel) request->cancel->ClearListener();
    stats_->RecordFailure(core::NowNs() - request->times.received_ns,
                          metrics::FailureReason::kRejected);
    core::CompleteWithError(std::move(request), std::move(refused));
    return;
  }
  batcher_cv_.Signal();
}

std::function<void()> DynamicBatcher::DropLater(Pending p) {
  auto shared = std::make_shared<Pending>(std::move(p));
  return [this, shared] {
    core::InferRequest& r = *shared->request;
    if (r.cancel) r.cancel->ClearListener();
    const uint64_t now = core::NowNs();
    absl::Status st;
    switch (shared->drop) {
      case metrics::FailureReason::kCanceled:
        st = core::CancelledError(r, now);
        break;
      case metrics::FailureReason::kTimeout:
        st = shared->timeout_us
                 ? core::DeadlineError(r, now, StrCat("queue timeout ", shared->timeout_us,
                                                      " us, timeout_action REJECT"))
                 : core::DeadlineError(r, now, "the client's deadline");
        break;
      default:
        st = absl::InternalError("request dropped from the queue");
    }
    stats_->RecordFailure(now - r.times.received_ns, shared->drop);
    core::CompleteWithError(std::move(shared->request), std::move(st));
  };
}

size_t DynamicBatcher::QueuedLocked() const {
  size_t n = 0;
  for (const auto& [level, l] : levels_) n += l.live.size() + l.delayed.size();
  return n;
}

std::vector<DynamicBatcher::Pending> DynamicBatcher::ExpireLocked(uint64_t now) {
  std::vector<Pending> rejected;
  // Past the client's deadline or cancelled: gone whatever the queue policy says. The deadline
  // first: gRPC cancels a call whose deadline passed, and that is a timeout.
  auto gone = [&](Pending& p) {
    if (p.client_deadline_ns != 0 && now >= p.client_deadline_ns) {
      p.drop = metrics::FailureReason::kTimeout;
      p.timeout_us = 0;
    } else if (p.request->IsCancelled()) {
      p.drop = metrics::FailureReason::kCanceled;
    } else {
      return false;
    }
    rejected.push_back(std::move(p));
    return true;
  };
  for (auto& [level, l] : levels_) {
    if (l.live.empty() && l.delayed.empty()) continue;
    std::deque<Pending> keep;
    for (auto& p : l.live) {
      if (gone(p)) continue;
      if (p.deadline_ns != 0 && now >= p.deadline_ns) {
        if (l.policy.timeout_action() == inference::ModelQueuePolicy::DELAY) {
          p.deadline_ns = 0;  // delayed once; it will run after the others
          l.delayed.push_back(std::move(p));
        } else {
          p.drop = metrics::FailureReason::kTimeout;
          rejected.push_back(std::move(p));
        }
      } else {
        keep.push_back(std::move(p));
      }
    }
    l.live.swap(keep);
    if (l.delayed.empty()) continue;
    std::deque<Pending> keep_delayed;
    for (auto& p : l.delayed) {
      if (!gone(p)) keep_delayed.push_back(std::move(p));
    }
    l.delayed.swap(keep_delayed);
  }
  return rejected;
}

std::vector<DynamicBatcher::Pending*> DynamicBatcher::OrderLocked() {
  std::vector<Pending*> order;
  for (auto& [level, l] : levels_) {
    for (auto& p : l.live) order.push_back(&p);
    for (auto& p : l.delayed) order.push_back(&p);
  }
  return order;
}

uint64_t DynamicBatcher::NextDeadlineLocked() const {
  uint64_t next = 0;
  auto earliest = [&next](uint64_t t) {
    if (t != 0 && (next == 0 || t < next)) next = t;
  };
  for (const auto& [level, l] : levels_) {
    for (const auto& p : l.live) {
      earliest(p.deadline_ns);
      earliest(p.client_deadline_ns);
    }
    for (const auto& p : l.delayed) earliest(p.client_deadline_ns);
  }
  return next;
}

size_t DynamicBatcher::DecideLocked(uint64_t now, std::vector<Pending*>* order,
                                    BatchDecision* d) {
  *order = OrderLocked();
  std::vector<QueuedItem> items;
  items.reserve(order->size());
  for (Pending* p : *order) items.push_back({p->enqueue_ns, p->request->batch_size, &p->shape_key});
  BatchPolicy policy = policy_;
  if (stopping_) policy.max_queue_delay_ns = 0;  // drain without waiting
  *d = DecideBatch(policy, items, now);
  if (d->take > 1 && learn_sizes_ && !stopping_) {
    d->take = ShrinkBatch(items, d->take, costs_, &shrinks_);
  }
  return d->take;
}

void DynamicBatcher::SubmitLocked(size_t instance, size_t count) {
  Batch run;
  run.requests.reserve(count);
  if (preserve_ordering_) run.order.reserve(count);
  auto take = [&](std::deque<Pending>& from) {
    if (preserve_ordering_) run.order.push_back(from.front().sequence);
    run.requests.push_back(std::move(from.front().request));
    from.pop_front();
  };
  size_t left = count;
  for (auto& [level, l] : levels_) {
    for (; left > 0 && !l.live.empty(); --left) take(l.live);
    for (; left > 0 && !l.delayed.empty(); --left) take(l.delayed);
  }
  idle_[instance] = false;
  pool_.Submit(instance, std::move(run));
}

bool DynamicBatcher::TrySubmitLocked(size_t instance) {
  if (stopping_ || QueuedLocked() == 0) return false;
  const uint64_t now = now_ns_();
  std::vector<Pending*> order;
  BatchDecision d;
  if (DecideLocked(now, &order, &d) == 0) return false;  // it waits: the batcher's timer
  // A request that must leave the queue unrun (cancelled, past a deadline, or a timeout that
  // moves it behind the others) is the batcher thread's to answer, never run here.
  for (Pending* p : order) {
    if (p->request->IsCancelled() || (p->client_deadline_ns != 0 && now >= p->client_deadline_ns) ||
        (p->deadline_ns != 0 && now >= p->deadline_ns)) {
      return false;
    }
  }
  SubmitLocked(instance, d.take);
  return true;
}

void DynamicBatcher::BatcherLoop() {
  mu_.Lock();
  for (;;) {
    const uint64_t now = now_ns_();
    std::vector<Pending> rejected = ExpireLocked(now);
    if (!rejected.empty()) {
      mu_.Unlock();
      std::vector<std::pair<uint64_t, std::function<void()>>> done;
      for (auto& p : rejected) {
        const uint64_t seq = p.sequence;
        done.emplace_back(seq, DropLater(std::move(p)));
      }
      pool_.Deliver(std::move(done));
      mu_.Lock();
      continue;
    }
    if (QueuedLocked() == 0) {
      if (stopping_) break;
      batcher_cv_.Wait(&mu_);
      continue;
    }
    const auto free = std::find(idle_.begin(), idle_.end(), true);
    const std::optional<size_t> idle =
        free == idle_.end() ? std::nullopt : std::optional<size_t>(free - idle_.begin());
    const uint64_t timeout_deadline = NextDeadlineLocked();
    if (!idle) {
      if (timeout_deadline) {
        batcher_cv_.WaitWithTimeout(&mu_, absl::Nanoseconds(timeout_deadline > now ? timeout_deadline - now : 0));
      } else {
        batcher_cv_.Wait(&mu_);
      }
      continue;
    }
    std::vector<Pending*> order;
    BatchDecision d;
    if (DecideLocked(now, &order, &d) > 0) {
      SubmitLocked(*idle, d.take);
      continue;
    }
    uint64_t until = d.wait_until_ns;
    if (timeout_deadline && (until == 0 || timeout_deadline < until)) until = timeout_deadline;
    if (until) {
      batcher_cv_.WaitWithTimeout(&mu_, absl::Nanoseconds(until > now ? until - now : 0));
    } else {
      batcher_cv_.Wait(&mu_);
    }
  }
  mu_.Unlock();
}

void DynamicBatcher::Shutdown() {
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_ && !batcher_.joinable()) return;
    stopping_ = true;
  }
  batcher_cv_.SignalAll();
  if (batcher_.joinable()) batcher_.join();  // returns once every queued request is batched
  pool_.Shutdown();
}

size_t DynamicBatcher::Queued() const {
  inferd::MutexLock lock(&mu_);
  return QueuedLocked();
}

size_t DynamicBatcher::InFlight() const {
  inferd::MutexLock lock(&mu_);
  return QueuedLocked() + pool_.Executing();
}

}  // namespace inferd::scheduling
