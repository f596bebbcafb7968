#include "common/worker_pool.h"

namespace inferd {

WorkerPool::WorkerPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Stop() {
  {
    inferd::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  // Joined by the one caller that finds them joinable; Stop is called from one thread (the
  // owner's shutdown, then its destructor).
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool WorkerPool::Submit(std::function<void()> task) {
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_ || tasks_.size() >= max_queued_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.Signal();
  return true;
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      inferd::MutexLock lock(&mu_);
      while (tasks_.empty() && !stopping_) cv_.Wait(&mu_);
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace inferd
