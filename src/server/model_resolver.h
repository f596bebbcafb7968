// Residency: the one step between a request naming a model and the model that serves it. Every
// call of the server facade that needs a model (infer, metadata, config; ensemble steps too)
// resolves it here, once, so no frontend asks "is it loaded? may it load? how long may it
// wait?". The step either runs the continuation now (the model is resident: one lookup, no
// allocation, no other lock), or parks it on the store's load (on-demand, an evicted model, a
// SageMaker TargetModel) and runs it from the loader thread when the load ends, or answers it
// with the failure:
//
//   NOT_FOUND (404)            unknown model; SageMaker's "model '<m>' is not loaded"
//   UNAVAILABLE (503)          not ready; too many loads queued; --model-load-wait-secs passed
//   DEADLINE_EXCEEDED (504)    the request's `timeout` or the client's deadline passed first
//   CANCELLED                  the client left while it waited
//   RESOURCE_EXHAUSTED (507)   the memory budget cannot hold the model
//   ALREADY_EXISTS (409)       the name serves another TargetModel
//
// The store is a template parameter (repository::ModelLifecycle in the server; a fake in the unit
// test), so the hot path is inlined and costs what the lookup alone costs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/strings.h"
#include "core/cancellation.h"
#include "core/infer_request.h"

namespace inferd::server {

// What bounds a request's wait for its model's load, besides the store's wait limit. Read only
// before Resolve returns or calls its continuation; `cancel` is copied only when it must wait.
struct WaitBounds {
  const std::shared_ptr<core::CancellationToken>* cancel = nullptr;  // null: none
  uint64_t received_ns = 0;  // arrival (monotonic); the messages say how long it waited
  uint64_t timeout_us = 0;   // the request's `timeout` parameter, from received_ns; 0: none
  uint64_t deadline_ns = 0;  // the client's own deadline (gRPC), monotonic; 0: none

  static WaitBounds Of(const core::InferRequest& request) {
    return {&request.cancel, request.times.received_ns, request.timeout_us, request.deadline_ns};
  }
};

// What a request asks of residency beyond its name and version.
struct ResolveOptions {
  // SageMaker's X-Amzn-SageMaker-Target-Model: the repository entry an on-demand load loads as
  // the request's model. Checked against the entry the name is bound to even when the model is
  // resident (409). Such a wait has only the store's limit (the store takes a source or a
  // request's bounds, not both).
  std::string_view source_name;
  // SageMaker's multi-model invoke: a model neither resident, nor loaded through the
  // multi-model API (and maybe evicted since), nor loadable on demand is NOT_FOUND "model '<m>'
  // is not loaded" at once.
  bool multi_model = false;
};

// Whether a failed lookup may end by waiting for a load (the store decides whether it loads).
inline bool MayWaitForLoad(const absl::Status& lookup) {
  return lookup.code() == absl::StatusCode::kNotFound ||
         lookup.code() == absl::StatusCode::kUnavailable;
}

// The store's answer to a wait, in the request's words: CANCELLED and DEADLINE_EXCEEDED name the
// model, the time waited and the limit that ended the wait.
absl::Status WaitFailure(absl::Status status, std::string_view model_name,
                         const std::shared_ptr<core::CancellationToken>& cancel,
                         uint64_t received_ns, uint64_t timeout_us, uint64_t now_ns);

// `Store` provides (as repository::ModelLifecycle does):
//   absl::StatusOr<std::shared_ptr<const M>> Get(std::string_view name, int64_t version);
//   void WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
//                      const std::string& source_name);
//   void WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
//                      const typename Store::WaitLimits& limits);  // {cancel, deadline_ns}
//   std::map<std::string, std::string> UrlModels() const;
// Thread-safe as the store is; holds no state of its own.
template <typename Store>
class ModelResolver {
 public:
  using ModelPtr = typename std::decay_t<decltype(std::declval<Store&>().Get(
      std::string_view(), int64_t{}))>::value_type;

  // `on_demand`: --model-control-mode=on-demand (the multi-model rule asks it).
  ModelResolver(Store* store, bool on_demand) : store_(store), on_demand_(on_demand) {}

  // Calls `next(absl::StatusOr<ModelPtr>)` exactly once: now, on this thread, with the resident
  // model or a failure that no load can change; or, after a load this request waits for, on the
  // loader thread (or on the thread that cancelled it), with the model or the failure. `next`
  // is moved to the heap only when the request must wait. `name` must stay valid until
  // Resolve returns or calls `next`, whichever comes first.
  template <typename Next>
  void Resolve(std::string_view name, int64_t version, const WaitBounds& bounds,
               const ResolveOptions& options, Next&& next) const {
    auto model = store_->Get(name, version);
    if (model.ok() && options.source_name.empty()) return next(std::move(model));
    if (!model.ok()) {
      if (options.multi_model && !on_demand_ && !store_->UrlModels().count(std::string(name))) {
        return next(absl::NotFoundError(StrCat("model '", name, "' is not loaded")));
      }
      if (!MayWaitForLoad(model.status())) return next(std::move(model));
    }
    Wait(std::string(name), version, bounds, options.source_name,
         model.ok() ? *std::move(model) : ModelPtr(), std::forward<Next>(next));
  }

 private:
  // The request must wait for a load (or, with a source, for the store's check of the name's
  // binding: `resident` is then the model the lookup found, used when the store says OK).
  template <typename Next>
  void Wait(std::string name, int64_t version, const WaitBounds& bounds,
            std::string_view source_name, ModelPtr resident, Next&& next) const {
    auto k = std::make_shared<std::decay_t<Next>>(std::forward<Next>(next));
    typename Store::WaitLimits limits;
    if (bounds.cancel != nullptr) limits.cancel = *bounds.cancel;
    if (bounds.timeout_us != 0) limits.deadline_ns = bounds.received_ns + bounds.timeout_us * 1000;
    if (bounds.deadline_ns != 0 &&
        (limits.deadline_ns == 0 || bounds.deadline_ns < limits.deadline_ns)) {
      limits.deadline_ns = bounds.deadline_ns;
    }
    auto then = [store = store_, k, name, version, resident = std::move(resident),
                 cancel = limits.cancel, received = bounds.received_ns,
                 timeout_us = bounds.timeout_us](absl::Status st) {
      if (!st.ok()) {
        return (*k)(absl::StatusOr<ModelPtr>(
            WaitFailure(std::move(st), name, cancel, received, timeout_us, core::NowNs())));
      }
      if (resident != nullptr) return (*k)(absl::StatusOr<ModelPtr>(resident));
      (*k)(store->Get(name, version));
    };
    if (!source_name.empty()) {
      store_->WhenAvailable(name, std::move(then), std::string(source_name));
    } else {
      store_->WhenAvailable(name, std::move(then), limits);
    }
  }

  Store* const store_;
  const bool on_demand_;
};

}  // namespace inferd::server
