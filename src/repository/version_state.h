// The state machine of one model version in the model store (TF Serving's LoaderHarness): the
// states a version passes through, the transitions allowed between them, written down in one
// table, and a refusal (with a log line) of any other, instead of a silent jump.
//
//   kLoading ──► kReady ──► kUnloading ──► kUnavailable ──► kLoading (loaded again)
//       └──────────────────────────────────────┘ (the load failed, or the version was
//                                                  unloaded or evicted before it was ready)
//
// A version slot exists only once a load of it has begun, so a new one starts in kLoading (TF
// Serving's kNew and kLoadRequested are folded into it: the store decides before it creates
// the slot). kUnloading is the step in which the store takes the version out of service; it
// then frees the model outside its lock (draining the requests in flight), no longer reachable.
// A reload that fails leaves a kReady version kReady: only its reason changes (set_reason).
//
// Not thread-safe: the model store guards each slot with its own mutex.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace inferd::repository {

// As the repository index and the ready endpoint spell them (ModelStateName).
enum class ModelState { kLoading, kReady, kUnloading, kUnavailable };
std::string_view ModelStateName(ModelState state);

class VersionState {
 public:
  // `what` names the version in log lines and errors ("model 'm' version 2").
  explicit VersionState(std::string what = "a model version") : what_(std::move(what)) {}

  ModelState state() const { return state_; }
  bool ready() const { return state_ == ModelState::kReady; }
  // Why the version is not (or no longer, or not newly) serving; empty when there is nothing
  // to say.
  const std::string& reason() const { return reason_; }
  void set_reason(std::string reason) { reason_ = std::move(reason); }
  const std::string& what() const { return what_; }
  void set_what(std::string what) { what_ = std::move(what); }

  // Moves to `next` with `reason` (cleared when empty). FAILED_PRECONDITION naming both states
  // (and logged as an ERROR) when the table does not allow it; the state then stays as it was.
  absl::Status TransitionTo(ModelState next, std::string reason = "");

  // The table: true when `from` -> `to` is a legal transition.
  static bool IsValidTransition(ModelState from, ModelState to);

 private:
  std::string what_;
  ModelState state_ = ModelState::kLoading;
  std::string reason_;
};

}  // namespace inferd::repository
