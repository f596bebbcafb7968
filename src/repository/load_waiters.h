// The requests waiting for an on-demand load, and the reaper that answers the ones whose wait
// ran out. A request for a model that is not loaded joins that model's pending load (the first
// one starts it); the load's end answers every waiter of it, once; the reaper thread answers a
// waiter whose wait limit (--model-load-wait-secs) passed (UNAVAILABLE), whose client left
// (CANCELLED) or whose own deadline passed (DEADLINE_EXCEEDED), and the load goes on for the
// others.
//
// Each waiter is answered exactly once, whoever gets there first (the load, the reaper, the
// shutdown), never under a lock: `then` may take any lock, start a request, or join again.
//
// Thread-safe. Its mutex is a leaf for the model store (which calls it under its own lock);
// a cancellation token's listener takes it, so no token's listener is set or cleared under it.
// The reaper thread runs from construction to StopReaper (or destruction).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "core/cancellation.h"

namespace inferd::repository {

class LoadWaiters {
 public:
  // A request waiting for a load; answered exactly once (load done, timed out, left, shutdown).
  struct Waiter {
    std::string name;
    std::function<void(absl::Status)> then;
    std::atomic<bool> fired{false};
    uint64_t deadline_ns = 0;          // the wait limit, set when it joins a load
    uint64_t request_deadline_ns = 0;  // the request's own deadline; 0: none
    std::shared_ptr<core::CancellationToken> cancel;  // carries a listener until fired
  };
  // The waiting request's own limits (the server's WaitLimits).
  struct Limits {
    std::shared_ptr<core::CancellationToken> cancel;
    uint64_t deadline_ns = 0;  // monotonic (core::NowNs); 0: none
  };

  explicit LoadWaiters(absl::Duration wait_limit);
  ~LoadWaiters();  // StopReaper; answers nobody (FireAll does)

  absl::Duration wait_limit() const { return wait_limit_; }

  // A waiter for `name` that calls `then`. With `limits.cancel`, a cancellation from now on
  // wakes the reaper (which answers CANCELLED once the waiter joined a load).
  std::shared_ptr<Waiter> NewWaiter(std::string name, std::function<void(absl::Status)> then,
                                    const Limits& limits) ABSL_LOCKS_EXCLUDED(mu_);

  // The source a pending load of `name` loads (empty: the name itself); nullopt when none is
  // pending, or when it failed and is only answering its waiters (a failed load binds no name).
  std::optional<std::string> PendingSource(std::string_view name) const ABSL_LOCKS_EXCLUDED(mu_);
  // True while a load of `name` is pending, until each of its waiters has been answered.
  bool IsPending(std::string_view name) const ABSL_LOCKS_EXCLUDED(mu_);

  enum class Joined { kNo, kJoined, kStarted };
  // Makes `w` wait for `name`'s pending load; when none is pending and `may_start`, creates it
  // (kStarted: the caller starts the load and calls Finish when it ends; `source_name` is what
  // it loads). kNo (w untouched) when none is pending and not `may_start`. A failed load that is
  // still answering its waiters is joined only for its own source (the waiter gets its error);
  // for another source it counts as none pending. The wait limit starts now.
  Joined Join(const std::string& name, const std::string& source_name,
              const std::shared_ptr<Waiter>& w, bool may_start) ABSL_LOCKS_EXCLUDED(mu_);
  // The end of `name`'s load: answers each of its waiters with `status`, those that join
  // meanwhile too, then ends it (IsPending false). No-op when none is pending.
  void Finish(const std::string& name, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Answers `w` with `status` unless it was answered already. Never call it under a lock the
  // waiter's `then` or its token's listener takes.
  static void Fire(const std::shared_ptr<Waiter>& w, const absl::Status& status);

  // Stops the reaper thread (idempotent): from now on only Finish and FireAll answer.
  void StopReaper() ABSL_LOCKS_EXCLUDED(mu_);
  // Answers every waiter not answered yet with `status` (shutdown).
  void FireAll(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Waiters answered UNAVAILABLE because the load outlasted the wait limit.
  uint64_t timeouts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One pending load: who waits for it.
  struct Pending {
    std::vector<std::shared_ptr<Waiter>> waiters;
    std::string source_name;
    bool failed = false;  // Finish is answering its waiters with an error
  };
  void Reap();

  const absl::Duration wait_limit_;
  mutable inferd::Mutex mu_;
  std::map<std::string, std::shared_ptr<Pending>, std::less<>> pending_ ABSL_GUARDED_BY(mu_);
  // Every waiter that joined a load and may still time out; the reaper's list.
  std::vector<std::shared_ptr<Waiter>> timed_ ABSL_GUARDED_BY(mu_);
  uint64_t timeouts_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  inferd::CondVar reaper_cv_;
  std::thread reaper_;  // last: starts once the rest is built
};

}  // namespace inferd::repository
