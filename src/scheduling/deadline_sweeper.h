// One timer thread for the whole server that answers queued requests whose deadline passed or
// whose client cancelled them, while every instance of their model is busy. Each scheduler that
// needs it (the default scheduler: the batchers wake their own batcher thread) registers a
// sweep function and says when it must next run; before, each model kept a sweeper thread of
// its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace inferd::scheduling {

// Thread-safe. Sweeps run on the sweeper's thread, one at a time; a sweep answers what it
// takes out of its queue itself, so it should hand responses on and return.
class DeadlineSweeper {
 public:
  class Client;

  DeadlineSweeper();
  // Joins the thread. Every Client must be gone first.
  ~DeadlineSweeper();
  DeadlineSweeper(const DeadlineSweeper&) = delete;
  DeadlineSweeper& operator=(const DeadlineSweeper&) = delete;

  // The server's sweeper, started on first use and never destroyed (schedulers of models still
  // unloading at exit may use it).
  static DeadlineSweeper* Shared();

  // `sweep(now_ns)` answers what has expired or been cancelled and returns when it must run
  // next (a core::NowNs() time; 0: only when woken).
  std::unique_ptr<Client> Register(std::function<uint64_t(uint64_t now_ns)> sweep);

 private:
  void Loop();
  void WakeAt(Client* client, uint64_t ns);

  inferd::Mutex mu_;
  inferd::CondVar wake_;      // an earlier wake time, a new client, or stopping
  inferd::CondVar finished_;  // a sweep returned
  struct Entry {
    Client* client;
    uint64_t wake_ns;  // 0: not scheduled
  };
  std::vector<Entry> clients_ ABSL_GUARDED_BY(mu_);
  Client* running_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// One scheduler's registration. Thread-safe; WakeNow may be called from a cancellation
// listener. Destroying it unregisters: once the destructor returns the sweep is not running
// and will not run.
class DeadlineSweeper::Client {
 public:
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sweep no later than `ns` (core::NowNs() time); an earlier wake already asked for stays.
  void WakeAt(uint64_t ns) { owner_->WakeAt(this, ns); }
  void WakeNow() { WakeAt(1); }

 private:
  friend class DeadlineSweeper;
  Client(DeadlineSweeper* owner, std::function<uint64_t(uint64_t)> sweep)
      : owner_(owner), sweep_(std::move(sweep)) {}

  DeadlineSweeper* const owner_;
  const std::function<uint64_t(uint64_t)> sweep_;
};

}  // namespace inferd::scheduling
