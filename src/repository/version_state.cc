#include "repository/version_state.h"

#include "common/logging.h"
#include "common/strings.h"

namespace inferd::repository {

namespace {

struct Transition {
  ModelState from;
  ModelState to;
};

// Every legal transition, and only those.
constexpr Transition kTransitions[] = {
    {ModelState::kLoading, ModelState::kReady},          // the load succeeded
    {ModelState::kLoading, ModelState::kUnavailable},    // it failed, or was unloaded meanwhile
    {ModelState::kReady, ModelState::kUnloading},        // unloaded, evicted, replaced, removed
    {ModelState::kUnloading, ModelState::kUnavailable},  // out of service
    {ModelState::kUnavailable, ModelState::kLoading},    // loaded again
};

}  // namespace

std::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading: return "LOADING";
    case ModelState::kReady: return "READY";
    case ModelState::kUnloading: return "UNLOADING";
    case ModelState::kUnavailable: return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

bool VersionState::IsValidTransition(ModelState from, ModelState to) {
  for (const Transition& t : kTransitions) {
    if (t.from == from && t.to == to) return true;
  }
  return false;
}

absl::Status VersionState::TransitionTo(ModelState next, std::string reason) {
  if (!IsValidTransition(state_, next)) {
    absl::Status st = absl::FailedPreconditionError(
        StrCat(what_, ": invalid state transition from ", ModelStateName(state_), " to ",
               ModelStateName(next)));
    LOG_ERROR << st.message();
    return st;
  }
  state_ = next;
  reason_ = std::move(reason);
  return absl::OkStatus();
}

}  // namespace inferd::repository
