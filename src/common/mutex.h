// inferd::Mutex, MutexLock, ReaderMutexLock and CondVar: Abseil's, except under
// ThreadSanitizer. Debian's Abseil is not built with TSan, so TSan cannot see inferd::Mutex
// lock and unlock and would report every access it guards; in a TSan build these are thin
// wrappers over the standard library's primitives, which TSan understands. Same API subset,
// same thread-safety annotations.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#define INFERD_STD_SYNC 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define INFERD_STD_SYNC 1
#endif
#endif

#ifdef INFERD_STD_SYNC
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#endif

namespace inferd {

#ifndef INFERD_STD_SYNC

using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using ReaderMutexLock = absl::ReaderMutexLock;
using CondVar = absl::CondVar;

#else

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Wakes Await callers so they re-check their condition, as absl::Mutex does on unlock.
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.unlock();
    changed_.notify_all();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }
  // Called with the lock held; returns with it held. True when `cond` holds.
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout) {
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    std::unique_lock<std::shared_mutex> lock(mu_, std::adopt_lock);
    bool ok = true;
    while (!cond.Eval()) {
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
        ok = cond.Eval();
        break;
      }
    }
    lock.release();
    return ok;
  }
  void Await(const absl::Condition& cond) {
    std::unique_lock<std::shared_mutex> lock(mu_, std::adopt_lock);
    while (!cond.Eval()) changed_.wait(lock);
    lock.release();
  }
  std::shared_mutex& native() { return mu_; }

 private:
  std::shared_mutex mu_;
  std::condition_variable_any changed_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* mu_;
};

class CondVar {
 public:
  void Wait(Mutex* mu) {
    std::unique_lock<std::shared_mutex> lock(mu->native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // True when the timeout expired, as inferd::CondVar::WaitWithTimeout.
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    std::unique_lock<std::shared_mutex> lock(mu->native(), std::adopt_lock);
    const bool expired = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout)) ==
                         std::cv_status::timeout;
    lock.release();
    return expired;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

#endif

}  // namespace inferd
