// Cancellation of one inference request. The frontend that owns the client's connection creates
// a token per request and cancels it when the client can no longer receive the answer (HTTP
// disconnect, gRPC cancellation or deadline, a ModelStreamInfer stream ending); whoever holds
// the request at that moment observes it: a scheduler drops a queued request without running
// it, a backend stops a run whose every request is cancelled.
//
// Thread-safe. Shared (std::shared_ptr) between the frontend and the request's current holder.
// Exactly one listener at a time: the holder installs one when it takes the request (a queue:
// "wake the batcher"; a running batch: "terminate the run when all are cancelled") and clears
// it before handing the request on. The listener runs under the token's own mutex, so
// ClearListener returning means no call of it is running or will start; therefore neither
// SetListener nor ClearListener may be called while holding a lock the listener takes, and a
// listener must not touch its own token's listener.
#pragma once

#include <atomic>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace inferd::core {

class CancellationToken {
 public:
  bool IsCancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Idempotent. The first call runs the installed listener, on the calling thread.
  void Cancel() {
    if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
    inferd::MutexLock lock(&mu_);
    if (listener_) listener_();
  }

  // Installs the function Cancel runs (replacing any). When the token is already cancelled it
  // runs now, on this thread, so a cancellation between a check and the install is not lost.
  void SetListener(std::function<void()> listener) {
    inferd::MutexLock lock(&mu_);
    listener_ = std::move(listener);
    if (cancelled_.load(std::memory_order_acquire) && listener_) listener_();
  }

  // Removes the listener; once it returns, the listener is not running and will not run.
  void ClearListener() {
    inferd::MutexLock lock(&mu_);
    listener_ = nullptr;
  }

 private:
  std::atomic<bool> cancelled_{false};
  inferd::Mutex mu_;
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::core
