// The serving map (TF Serving's ServingMap): the model store's view of what serves right now,
// name -> ready versions -> the model, which request lookups read. The store publishes into it
// on every transition that changes what serves (a version becomes READY, is swapped out by a
// reload, unloaded, evicted, removed by a poll); a lookup takes only this map's reader lock and
// one hash lookup, never the store's own lock, so a load or an unload in progress (which holds
// the store's lock while it bookkeeps) does not stall requests for other models.
//
// Only ready versions are here. A miss (an unknown name, a version that is not ready, a name
// that needs --model-namespacing's resolution) is the store's to explain: it looks again under
// its own lock, where the states and reasons are.
//
// The map holds a reference to each model it serves: a model the store takes out of service is
// freed once it is unpublished and the requests that looked it up before have let go.
//
// A template over the model type only so that its tests need no backend (ServingMap below is
// the store's). Thread-safe. Its mutex is a leaf: the store publishes while holding its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "core/infer_request.h"  // core::NowNs

namespace inferd::repository {

class Model;

// How often and how recently a model is used (the eviction policy's inputs). Counted by the
// lookups that serve a request, read and reset by the store.
struct ModelUsage {
  std::atomic<uint64_t> uses{0};
  std::atomic<uint64_t> last_used_ns{0};
};

template <typename M>
class BasicServingMap {
 public:
  // Ready versions of one model: version -> model, ascending.
  using Versions = std::map<int64_t, std::shared_ptr<const M>>;

  // Makes `versions` what `key` serves, in place of what it served before (one step: a lookup
  // sees the old set or the new one). No versions: the same as Unpublish. `usage` (may be
  // null) counts the lookups that serve a request.
  void Publish(std::string_view key, Versions versions, std::shared_ptr<ModelUsage> usage) {
    if (versions.empty()) return Unpublish(key);
    Served served{std::move(versions), std::move(usage)};
    inferd::MutexLock lock(&mu_);
    auto it = map_.find(Key(key));
    if (it == map_.end()) {
      map_.emplace(std::string(key), std::move(served));
    } else {
      // The old models are released after the lock (a last reference runs ~Model, which drains).
      std::swap(it->second, served);
    }
  }

  // `key` serves nothing any more.
  void Unpublish(std::string_view key) {
    Served gone;
    inferd::MutexLock lock(&mu_);
    auto it = map_.find(Key(key));
    if (it == map_.end()) return;
    gone = std::move(it->second);
    map_.erase(it);
  }

  // Everything unpublished (the store's UnloadAll).
  void Clear() {
    absl::flat_hash_map<std::string, Served> gone;
    inferd::MutexLock lock(&mu_);
    gone.swap(map_);
  }

  // The model `key` serves as `version`: the newest ready version when `version` < 0, else
  // exactly that version. Null when it is not served (the caller asks the store why). With
  // `count_use`, counts a use of the model (a request's lookup, not a readiness probe).
  std::shared_ptr<const M> Find(std::string_view key, int64_t version, bool count_use) const {
    inferd::ReaderMutexLock lock(&mu_);
    auto it = map_.find(Key(key));
    if (it == map_.end()) return nullptr;
    const Served& served = it->second;
    const std::shared_ptr<const M>* found;
    if (version < 0) {
      found = &served.versions.rbegin()->second;  // never empty (Publish)
    } else {
      auto v = served.versions.find(version);
      if (v == served.versions.end()) return nullptr;
      found = &v->second;
    }
    if (count_use && served.usage) {
      served.usage->uses.fetch_add(1, std::memory_order_relaxed);
      served.usage->last_used_ns.store(core::NowNs(), std::memory_order_relaxed);
    }
    return *found;
  }

  // Every version `key` serves, ascending (empty when none).
  std::vector<std::shared_ptr<const M>> ReadyVersions(std::string_view key) const {
    std::vector<std::shared_ptr<const M>> out;
    inferd::ReaderMutexLock lock(&mu_);
    auto it = map_.find(Key(key));
    if (it == map_.end()) return out;
    for (const auto& [v, model] : it->second.versions) out.push_back(model);
    return out;
  }

  // Every version of every model served, in no particular order.
  std::vector<std::shared_ptr<const M>> All() const {
    std::vector<std::shared_ptr<const M>> out;
    inferd::ReaderMutexLock lock(&mu_);
    for (const auto& [key, served] : map_) {
      for (const auto& [v, model] : served.versions) out.push_back(model);
    }
    return out;
  }

 private:
  // The map's heterogeneous key (this Abseil's string_view is its own type, not std's).
  static absl::string_view Key(std::string_view key) { return {key.data(), key.size()}; }
  struct Served {
    Versions versions;  // never empty while in map_
    std::shared_ptr<ModelUsage> usage;
  };
  mutable inferd::Mutex mu_;
  absl::flat_hash_map<std::string, Served> map_ ABSL_GUARDED_BY(mu_);
};

using ServingMap = BasicServingMap<Model>;

}  // namespace inferd::repository
