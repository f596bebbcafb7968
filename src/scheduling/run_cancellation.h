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
  RunCancellation(backends::ModelInstance* instance, std::span<core::InferRequest* const> batch) {
    if (batch.empty()) return;
    for (const core::InferRequest* r : batch) {
      if (!r->cancel) return;
    }
    if (batch.size() == 1) {
      // One request: its cancellation is the whole batch's. The token runs the listener under
      // its own mutex and ClearListener waits it out, so no shared state is needed; the
      // capture (one pointer) fits std::function's inline storage: no allocation per run.
      single_ = batch[0]->cancel.get();
      single_->SetListener([instance] { instance->CancelExecution(); });
      return;
    }
    std::vector<core::CancellationToken*> tokens;
    tokens.reserve(batch.size());
    for (const core::InferRequest* r : batch) tokens.push_back(r->cancel.get());
    state_ = std::make_shared<State>();
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
    if (single_ != nullptr) {
      single_->ClearListener();
      single_ = nullptr;
      return;
    }
    if (state_ == nullptr) return;
    {
      inferd::MutexLock lock(&state_->mu);
      state_->active = false;
    }
    for (core::CancellationToken* t : tokens_) t->ClearListener();
    tokens_.clear();
    state_.reset();
  }

 private:
  struct State {
    inferd::Mutex mu;
    bool active ABSL_GUARDED_BY(mu) = false;
    backends::ModelInstance* instance ABSL_GUARDED_BY(mu) = nullptr;
    std::vector<core::CancellationToken*> tokens ABSL_GUARDED_BY(mu);
  };
  core::CancellationToken* single_ = nullptr;     // a one-request run's token, listener set
  std::shared_ptr<State> state_;                  // a larger run's shared state (else null)
  std::vector<core::CancellationToken*> tokens_;  // the ones carrying our listener
};

}  // namespace inferd::scheduling
