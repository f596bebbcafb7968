// The model cache's size cap. Archives extracted and S3 models downloaded stay in
// --model-cache-dir across unloads and restarts (a reload is then a cache hit), so without a
// cap a small disk fills with the extractions of models nobody loads any more and new loads
// fail with ENOSPC until someone clears it. After each new extraction or download the cache
// is trimmed back under its cap, removing whole entries least recently used first, and never
// an entry a loaded (or loading) model uses.
//
// An entry is one model's extraction or download: `<cache>/local/<archive>@<stamp>` or
// `<cache>/s3/<bucket>/<prefix>/<model>@<fingerprint>` (with its `.done` marker beside it).
// Its last use is its folder's modification time, set on each cache hit; an entry used in the
// last minute is never removed (a load may be reading it before the store records the model).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace inferd::repository {

// Answers whether a cache entry (a folder path) holds a model that is loaded or being loaded.
using CacheInUse = std::function<bool(const std::string& entry)>;

// The default cap: half of the space free on the cache's file system when the server starts
// (0 when that cannot be read: no cap).
uint64_t DefaultCacheCapBytes(const std::string& cache_dir);

// Thread safety: Trim and Touch may be called from any thread; trims run one at a time.
// Lifetime: shared by every Source of one server (held by shared_ptr in SourceOptions).
class ModelCacheCap {
 public:
  // `max_bytes` 0: no cap.
  ModelCacheCap(std::string cache_dir, uint64_t max_bytes)
      : dir_(std::move(cache_dir)), max_bytes_(max_bytes) {}

  uint64_t max_bytes() const { return max_bytes_; }

  // Set once, before the first Fetch, by the model store: which entries are in use.
  void SetInUse(CacheInUse in_use);

  // Marks `entry` used now (a cache hit), so it is the last to go.
  static void Touch(const std::string& entry);

  // Removes entries, least recently used first, until the cache fits in its cap; never `keep`
  // (the entry just made) nor one in use. Returns the bytes removed.
  uint64_t Trim(const std::string& keep);

  struct Entry {
    std::string path;
    uint64_t bytes = 0;
    int64_t last_use_ns = 0;
  };
  // Every entry in the cache, for Trim and tests.
  std::vector<Entry> ListEntries() const;

 private:
  const std::string dir_;
  const uint64_t max_bytes_;
  inferd::Mutex mu_;  // one trim at a time
  CacheInUse in_use_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::repository
