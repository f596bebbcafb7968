// Stopping a running batch whose clients have all gone: while one backend Execute runs, each
// request's cancellation token carries a listener that, once every request of the batch is
// cancelled, asks the instance to stop (ModelInstance::CancelExecution). Shared by the
// schedulers that run batches.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "backends/backend.h"
#include "common/mutex.h"
#include "core/cancellation.h"
#include "core/infer_request.h"

namespace inferd::scheduling {

// Scoped to one Execute on one thread: construct right before Execute, call End right after
// it returns (before the requests are completed). After End, CancelExecution is not running
// and will not be called for this run. When some request of the batch has no token, nothing
// is installed (the run cannot be cancelled as a whole). Not thread-safe itself.
class RunCancellation {
 public:
  RunCancellation(backends::ModelInstance* instance, std::span<core::InferRequest* const> batch)
      : state_(std::make_shared<State>()) {
    if (batch.empty()) return;
    std::vector<core::CancellationToken*> tokens;
    for (const core::InferRequest* r : batch) {
      if (!r->cancel) return;
      tokens.push_back(r->cancel.get());
    }
    {
      inferd::MutexLock lock(&state_->mu);
      state_->instance = instance;
      state_->tokens = tokens;
      state_->active = true;
    }
    tokens_ = std::move(tokens);
    for (core::CancellationToken* t : tokens_) {
      t->SetListener([s = state_] {
        inferd::MutexLock lock(&s->mu);
        if (!s->active) return;
        for (core::CancellationToken* other : s->tokens) {
          if (!other->IsCancelled()) return;
        }
        s->active = false;  // once is enough
        s->instance->CancelExecution();
      });
    }
  }
  ~RunCancellation() { End(); }
  RunCancellation(const RunCancellation&) = delete;
  RunCancellation& operator=(const RunCancellation&) = delete;

  void End() {
    {
      inferd::MutexLock lock(&state_->mu);
      state_->active = false;
    }
    for (core::CancellationToken* t : tokens_) t->ClearListener();
    tokens_.clear();
  }

 private:
  struct State {
    inferd::Mutex mu;
    bool active ABSL_GUARDED_BY(mu) = false;
    backends::ModelInstance* instance ABSL_GUARDED_BY(mu) = nullptr;
    std::vector<core::CancellationToken*> tokens ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
  std::vector<core::CancellationToken*> tokens_;  // the ones carrying our listener
};

}  // namespace inferd::scheduling
