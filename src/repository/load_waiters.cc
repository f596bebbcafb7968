#include "repository/load_waiters.h"

#include <algorithm>

#include "common/strings.h"
#include "core/infer_request.h"

namespace inferd::repository {

LoadWaiters::LoadWaiters(absl::Duration wait_limit)
    : wait_limit_(wait_limit), reaper_([this] { Reap(); }) {}

LoadWaiters::~LoadWaiters() { StopReaper(); }

std::shared_ptr<LoadWaiters::Waiter> LoadWaiters::NewWaiter(std::string name,
                                                            std::function<void(absl::Status)> then,
                                                            const Limits& limits) {
  auto waiter = std::make_shared<Waiter>();
  waiter->then = std::move(then);
  waiter->name = std::move(name);
  waiter->request_deadline_ns = limits.deadline_ns;
  if (limits.cancel) {
    // Installed before the waiter can fire (Fire clears it), never under mu_: a cancellation
    // wakes the reaper, which answers the waiter.
    waiter->cancel = limits.cancel;
    waiter->cancel->SetListener([this, weak = std::weak_ptr<Waiter>(waiter)] {
      auto w = weak.lock();
      if (!w || w->fired.load()) return;
      inferd::MutexLock lock(&mu_);
      reaper_cv_.SignalAll();
    });
  }
  return waiter;
}

std::optional<std::string> LoadWaiters::PendingSource(std::string_view name) const {
  inferd::ReaderMutexLock lock(&mu_);
  auto it = pending_.find(name);
  if (it == pending_.end() || it->second->failed) return std::nullopt;
  return it->second->source_name;
}

bool LoadWaiters::IsPending(std::string_view name) const {
  inferd::ReaderMutexLock lock(&mu_);
  return pending_.find(name) != pending_.end();
}

LoadWaiters::Joined LoadWaiters::Join(const std::string& name, const std::string& source_name,
                                      const std::shared_ptr<Waiter>& w, bool may_start) {
  Joined joined = Joined::kJoined;
  {
    inferd::MutexLock lock(&mu_);
    auto& pending = pending_[name];
    // A failed load answering its waiters: a request for another source must not get its
    // error; it starts a load of its own (Finish erases only the entry it owns).
    if (pending && pending->failed && pending->source_name != source_name) pending.reset();
    if (!pending) {
      if (!may_start) {
        pending_.erase(name);
        return Joined::kNo;
      }
      pending = std::make_shared<Pending>();
      pending->source_name = source_name;
      joined = Joined::kStarted;
    }
    pending->waiters.push_back(w);
    w->deadline_ns = core::NowNs() + static_cast<uint64_t>(absl::ToInt64Nanoseconds(wait_limit_));
    timed_.push_back(w);
  }
  reaper_cv_.SignalAll();  // a new deadline, or a cancellation that came before the join
  return joined;
}

void LoadWaiters::Finish(const std::string& name, const absl::Status& status) {
  std::shared_ptr<Pending> pending;
  {
    inferd::MutexLock lock(&mu_);
    auto it = pending_.find(name);
    if (it == pending_.end()) return;
    pending = it->second;
    // Before any answer goes out: a client that got this error and asks at once for another
    // source must find the name free, not bound to the source that failed.
    pending->failed = !status.ok();
  }
  // OK: each waiter looks the model up itself (and gets its real state). The load stays
  // pending until every waiter has been answered, so that the model store evicts nothing
  // between its load and the lookups of the requests that waited for it. A request that
  // joined meanwhile is answered too.
  size_t answered = 0;
  for (;;) {
    std::vector<std::shared_ptr<Waiter>> batch;
    {
      inferd::MutexLock lock(&mu_);
      batch.assign(pending->waiters.begin() + static_cast<std::ptrdiff_t>(answered),
                   pending->waiters.end());
      answered = pending->waiters.size();
      if (batch.empty()) {
        if (auto it = pending_.find(name); it != pending_.end() && it->second == pending) {
          pending_.erase(it);
        }
        break;
      }
    }
    for (auto& w : batch) Fire(w, status);
  }
}

void LoadWaiters::Fire(const std::shared_ptr<Waiter>& w, const absl::Status& status) {
  if (w->fired.exchange(true)) return;
  // Cleared before `then`, which hands the request on to a holder that installs its own
  // listener (the listener takes mu_: never called under it).
  if (w->cancel) w->cancel->ClearListener();
  w->then(status);
}

void LoadWaiters::StopReaper() {
  {
    inferd::MutexLock lock(&mu_);
    stopping_ = true;
  }
  reaper_cv_.SignalAll();
  if (reaper_.joinable() && reaper_.get_id() != std::this_thread::get_id()) reaper_.join();
}

void LoadWaiters::FireAll(const absl::Status& status) {
  std::vector<std::shared_ptr<Waiter>> left;
  {
    inferd::MutexLock lock(&mu_);
    left.swap(timed_);  // every waiter that joined a load (answered ones are skipped by Fire)
  }
  for (auto& w : left) Fire(w, status);
}

uint64_t LoadWaiters::timeouts() const {
  inferd::ReaderMutexLock lock(&mu_);
  return timeouts_;
}

void LoadWaiters::Reap() {
  inferd::MutexLock lock(&mu_);
  while (!stopping_) {
    const uint64_t now = core::NowNs();
    uint64_t next = UINT64_MAX;
    std::vector<std::shared_ptr<Waiter>> expired;
    auto keep = timed_.begin();
    // The request's own end (its client gone, its deadline) leaves the wait; the load goes on.
    std::vector<std::pair<std::shared_ptr<Waiter>, absl::Status>> left;
    for (auto& w : timed_) {
      if (w->fired.load()) continue;
      if (w->cancel && w->cancel->IsCancelled()) {
        left.emplace_back(std::move(w), absl::CancelledError(""));
        continue;
      }
      if (w->request_deadline_ns != 0 && w->request_deadline_ns <= now &&
          w->request_deadline_ns <= w->deadline_ns) {
        left.emplace_back(std::move(w), absl::DeadlineExceededError(""));
        continue;
      }
      if (w->deadline_ns <= now) {
        expired.push_back(std::move(w));
        continue;
      }
      next = std::min(next, w->deadline_ns);
      if (w->request_deadline_ns != 0) next = std::min(next, w->request_deadline_ns);
      *keep++ = std::move(w);
    }
    timed_.erase(keep, timed_.end());
    if (!expired.empty() || !left.empty()) {
      timeouts_ += expired.size();
      mu_.Unlock();
      for (auto& w : expired) {
        Fire(w, absl::UnavailableError(StrCat(
                    "model '", w->name, "' is still loading after ",
                    absl::FormatDuration(wait_limit_),
                    " (--model-load-wait-secs); retry later")));
      }
      for (auto& [w, st] : left) Fire(w, st);
      mu_.Lock();
      continue;
    }
    const absl::Duration wait =
        next == UINT64_MAX ? absl::Seconds(60) : absl::Nanoseconds(next - now);
    reaper_cv_.WaitWithTimeout(&mu_, wait);
  }
}

}  // namespace inferd::repository
