// A fixed set of threads running submitted tasks in order, with a bounded queue. Used for
// model loads so a slow load never blocks an I/O thread. Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace inferd {

class WorkerPool {
 public:
  WorkerPool(int threads, size_t max_queued);
  ~WorkerPool();  // Stop().

  // Runs what is queued, then joins the threads; Submit refuses everything from now on, so the
  // pool may stay reachable from other threads. Call it from the owner's thread only.
  void Stop();

  // False (and the task is dropped) when the queue is full or the pool is stopping.
  bool Submit(std::function<void()> task);

 private:
  void Loop();
  const size_t max_queued_;
  inferd::Mutex mu_;
  inferd::CondVar cv_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace inferd
