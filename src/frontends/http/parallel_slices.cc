#include "frontends/http/parallel_slices.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <system_error>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "common/cpu_budget.h"
#include "common/mutex.h"

namespace inferd::http {
namespace {

constexpr size_t kMaxThreads = 4;

size_t UsableCpus() {
  static const size_t cpus = static_cast<size_t>(std::max(1, DetectCpuBudget().cpus));
  return cpus;
}

// Helper threads started once (std::thread per request took up to a millisecond to get going on
// a busy 2-core host: longer than the slice it was to run).
class SliceHelpers {
 public:
  static SliceHelpers& Get() {
    static SliceHelpers* helpers = new SliceHelpers();  // never destroyed: its threads live on
    return *helpers;
  }

  void Run(size_t n, const std::function<void(size_t)>& fn) {
    Batch batch;
    batch.n = n;
    batch.fn = &fn;
    const size_t tickets = std::min(n - 1, threads_);
    {
      MutexLock lock(&mu_);
      for (size_t t = 0; t < tickets; ++t) queue_.push_back(&batch);
    }
    fn(0);
    for (size_t i; (i = batch.next.fetch_add(1)) < n;) fn(i);
    MutexLock lock(&mu_);
    std::erase(queue_, &batch);  // tickets no helper took: nothing left for them to do
    mu_.Await(absl::Condition(+[](Batch* b) { return b->active == 0; }, &batch));
  }

 private:
  struct Batch {
    const std::function<void(size_t)>* fn = nullptr;
    size_t n = 0;
    std::atomic<size_t> next{1};
    size_t active = 0;  // helpers inside fn (guarded by mu_)
  };

  SliceHelpers() {
    threads_ = std::min(UsableCpus(), kMaxThreads) - 1;
    for (size_t t = 0; t < threads_; ++t) {
      try {
        std::thread([this] {
          pthread_setname_np(pthread_self(), "json-slices");
          Loop();
        }).detach();
      } catch (const std::system_error&) {
        threads_ = t;  // the callers run every slice themselves
        break;
      }
    }
  }

  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); }

  // The lock is released after each decrement of `active` (not only by the next Await): the
  // caller's Await must see it, and under ThreadSanitizer inferd::Mutex wakes waiters on
  // Unlock only.
  [[noreturn]] void Loop() {
    for (;;) {
      mu_.Lock();
      mu_.Await(absl::Condition(this, &SliceHelpers::HasWork));
      Batch* batch = queue_.front();
      queue_.pop_front();
      ++batch->active;
      mu_.Unlock();
      for (size_t i; (i = batch->next.fetch_add(1)) < batch->n;) (*batch->fn)(i);
      mu_.Lock();
      --batch->active;  // the batch may be gone once the lock is released
      mu_.Unlock();
    }
  }

  size_t threads_ = 0;
  Mutex mu_;
  std::deque<Batch*> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

size_t SlicesFor(size_t bytes) {
  return std::max<size_t>(1, std::min({UsableCpus(), kMaxThreads, bytes / (256 * 1024)}));
}

void RunSlices(size_t n, const std::function<void(size_t)>& fn) {
  if (n <= 1) {
    if (n == 1) fn(0);
    return;
  }
  SliceHelpers::Get().Run(n, fn);
}

}  // namespace inferd::http
