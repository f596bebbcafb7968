// Which idle models to unload when a load would exceed the model store's memory budget.
//
// The store tells a policy what happens to its models (loaded, with the measured size and load
// time; used, once per request; unloaded) and, when a load does not fit, asks it for victims.
// The policy only chooses: the store decides what may go (`evictable`: idle and not pinned),
// unloads the victims and reports each with OnUnloaded.
//
// Policies are bookkeeping only: no lock, no clock, no I/O. The owner serializes every call
// under its own mutex. Recency is the order of the calls (requests), not wall time: on the
// trace benchmark (bench/eviction_trace.cc) the best frequency half-life in seconds moved with
// the request rate, while in requests it stayed put, so no policy needs the time.
//
// MakeCostAwarePolicy (the default) keeps the models that save the most load time per byte
// they hold: it evicts the lowest (recent request count) x (measured load seconds) / bytes
// first. A large model that takes seconds to load and is used steadily is not thrown out to
// make room for a small one used once, and a burst of one-off models evicts only each other.
// It remembers models after they are unloaded (request count, load time), so a model that
// comes back is not treated as new: that is what stops thrashing.
// MakeLruPolicy is plain least-recently-used, for comparison and --model-eviction-policy=lru.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::repository {

// Requests for one model, counted by the owner outside its mutex and reported at once.
struct RequestCount {
  std::string model;
  uint64_t requests = 0;
};

// Not thread-safe: the owner serializes every call (the model store holds its mutex while it
// calls). A policy lives as long as the store that owns it.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // "cost-aware" or "lru", as --model-eviction-policy spells it.
  virtual std::string_view name() const = 0;

  // `model` is now resident, holding `bytes`; loading it took `load_seconds` (what evicting it
  // would cost again). Calling it again for a resident model (a reload) updates both.
  virtual void OnLoaded(const std::string& model, int64_t bytes, double load_seconds) = 0;
  // One request for `model`: call it for every request, including the one that caused the
  // load (after OnLoaded). Requests for a model that was never loaded are ignored; the
  // cost-aware policy counts those for a model it remembers, even while it is unloaded.
  virtual void OnUsed(const std::string& model) = 0;
  // The same for requests counted outside the owner's mutex (an atomic per model, so that
  // serving a request takes no exclusive lock) and reported together, before ChooseVictims:
  // the requests per model since the last report, least recently used model first. How they
  // interleaved is unknown, so they count as spread evenly over the batch; reporting them with
  // one OnUsed per request, model after model, would make the first model's requests look
  // older than the last one's by the whole batch.
  virtual void OnUsedBatch(const std::vector<RequestCount>& counts) = 0;
  // `model` is no longer resident (evicted, or unloaded on request). Ignored if not resident.
  virtual void OnUnloaded(const std::string& model) = 0;

  // The resident models to unload, in order, so that a load of `needed_bytes` fits:
  //   resident_bytes - (the victims' bytes) + needed_bytes <= budget_bytes,
  // where a victim's bytes are those given to OnLoaded. Only models for which
  // `evictable(name)` is true are chosen (the caller passes idle, unpinned models; the model
  // being loaded is not resident yet). Empty when the load already fits.
  // RESOURCE_EXHAUSTED (HTTP 507) when even unloading every evictable model would not make room.
  // The caller unloads the victims and calls OnUnloaded for each; a victim that became busy
  // meanwhile is kept, and the caller asks again.
  virtual absl::StatusOr<std::vector<std::string>> ChooseVictims(
      int64_t needed_bytes, int64_t resident_bytes, int64_t budget_bytes,
      const std::function<bool(const std::string&)>& evictable) = 0;
};

struct CostAwareOptions {
  // A model's request count halves every this many requests to the store (to all models), so
  // popularity that moved on is forgotten. 0: never (pure frequency). On the benchmark's
  // 60-model trace 1000-4000 did best; a catalog of thousands of models wants more.
  double frequency_half_life_requests = 2000;
  // Unloaded models remembered; past it the least recently used are forgotten. 0: none.
  size_t history_limit = 4096;
};

std::unique_ptr<EvictionPolicy> MakeCostAwarePolicy(CostAwareOptions options = {});
std::unique_ptr<EvictionPolicy> MakeLruPolicy();

}  // namespace inferd::repository
