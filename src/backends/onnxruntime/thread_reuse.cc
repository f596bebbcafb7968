#include "backends/onnxruntime/thread_reuse.h"

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace inferd::backends::ort {
namespace {

// Idle OS threads kept past this many end instead of parking.
constexpr size_t kMaxParked = 64;

// One OS thread. States: parked (no job) -> running a job (fn set) -> finished (done) ->
// parked again once the pool that borrowed it joins; or told to exit while parked.
class Worker {
 public:
  Worker() : thread_([this] { Loop(); }) {}

  // Runs fn(param) on this thread. Only while parked.
  void Start(OrtThreadWorkerFn fn, void* param) {
    MutexLock lock(&mu_);
    fn_ = fn;
    param_ = param;
    done_ = false;
  }

  // Waits until the job's function returned.
  void WaitDone() {
    MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  // Ends the thread (parked only) and joins it.
  void Exit() {
    {
      MutexLock lock(&mu_);
      exit_ = true;
    }
    thread_.join();
  }

 private:
  void Loop() {
    while (true) {
      OrtThreadWorkerFn fn;
      void* param;
      {
        MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->exit_ || w->fn_ != nullptr; },
            this));
        if (fn_ == nullptr) return;  // exit_
        fn = fn_;
        param = param_;
      }
      fn(param);
      MutexLock lock(&mu_);
      fn_ = nullptr;
      param_ = nullptr;
      done_ = true;
    }
  }

  Mutex mu_;
  OrtThreadWorkerFn fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  void* param_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool done_ ABSL_GUARDED_BY(mu_) = true;
  bool exit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields it reads are initialized
};

// The process-wide set. Never destroyed (like ONNX Runtime's environment): parked threads stay
// blocked until the process exits.
class ThreadSet {
 public:
  static ThreadSet& Get() {
    static ThreadSet* set = new ThreadSet();
    return *set;
  }

  Worker* Borrow() {
    {
      MutexLock lock(&mu_);
      if (!parked_.empty()) {
        Worker* w = parked_.back().release();
        parked_.pop_back();
        return w;
      }
      ++started_;
    }
    return new Worker();
  }

  void GiveBack(Worker* w) {
    std::unique_ptr<Worker> owned(w);
    {
      MutexLock lock(&mu_);
      if (parked_.size() < kMaxParked) {
        parked_.push_back(std::move(owned));
        return;
      }
    }
    owned->Exit();
  }

  ReusedThreadCounts Counts() {
    MutexLock lock(&mu_);
    return {started_, parked_.size()};
  }

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<Worker>> parked_ ABSL_GUARDED_BY(mu_);
  size_t started_ ABSL_GUARDED_BY(mu_) = 0;
};

OrtCustomThreadHandle CreateThread(void* /*options*/, OrtThreadWorkerFn fn, void* param) {
  Worker* w = ThreadSet::Get().Borrow();
  w->Start(fn, param);
  return reinterpret_cast<OrtCustomThreadHandle>(w);
}

void JoinThread(OrtCustomThreadHandle handle) {
  // ONNX Runtime's handle type is an opaque const pointer; it is the Worker CreateThread made.
  Worker* w = const_cast<Worker*>(reinterpret_cast<const Worker*>(handle));
  w->WaitDone();
  ThreadSet::Get().GiveBack(w);
}

}  // namespace

void UseReusedThreads(Ort::SessionOptions* options) {
  Ort::ThrowOnError(Ort::GetApi().SessionOptionsSetCustomCreateThreadFn(*options, &CreateThread));
  Ort::ThrowOnError(Ort::GetApi().SessionOptionsSetCustomJoinThreadFn(*options, &JoinThread));
}

ReusedThreadCounts GetReusedThreadCounts() { return ThreadSet::Get().Counts(); }

}  // namespace inferd::backends::ort
