// The response cache (Triton's `local` cache, --cache-config local,size=N): successful
// responses of models with `response_cache { enable: true }`, keyed by a hash of the request,
// kept least recently used first within a byte budget shared by every model.
//
// The key hashes what Triton's does (model name, version, each input's name and bytes, inputs in
// name order) plus what makes two requests with equal bytes differ here: each input's datatype
// and shape, and the requested outputs (names, classification). A hit returns views of the
// entry's own buffers: the entry stays alive, through the outputs' holders, while any response
// uses it, even after eviction.
//
// Thread-safe: one mutex around the index and the LRU list; hashing and copying happen outside.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "core/infer_request.h"

namespace inferd::server {

// --cache-config settings: cache name -> key -> value.
struct CacheConfig {
  std::string name;  // "local"; empty: no cache
  uint64_t size_bytes = 0;
};

// Parses the --cache-config settings ("local" with "size"). Errors name the bad setting.
absl::StatusOr<CacheConfig> ParseCacheConfig(
    const std::vector<std::pair<std::string, std::pair<std::string, std::string>>>& settings);

class ResponseCache {
 public:
  struct Key {
    uint64_t hash = 0;
    std::string signature;  // model, version, names, types, shapes, outputs: no tensor bytes
    bool operator==(const Key& o) const { return hash == o.hash && signature == o.signature; }
  };
  struct Counters {
    uint64_t entries = 0, bytes = 0, capacity = 0, lookups = 0, hits = 0, misses = 0,
             insertions = 0, evictions = 0;
  };

  explicit ResponseCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The request after validation (model_version resolved).
  static Key MakeKey(const core::InferRequest& request);

  // Outputs viewing the cached entry (their holders keep it alive), or nullopt on a miss.
  std::optional<std::vector<core::OutputTensor>> Lookup(const Key& key);
  // Copies the response's outputs in; evicts least recently used entries to make room. A
  // response larger than the whole cache is not kept (false).
  bool Insert(const Key& key, const core::InferResponse& response);

  Counters GetCounters() const;

 private:
  struct Entry;
  struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.hash); }
  };
  using Lru = std::list<std::pair<Key, std::shared_ptr<const Entry>>>;

  const uint64_t capacity_;
  mutable inferd::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  std::unordered_map<Key, Lru::iterator, KeyHash> index_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::server
