#include "server/response_cache.h"

#include <algorithm>
#include <charconv>

#include "absl/hash/hash.h"
#include "common/strings.h"

namespace inferd::server {

struct ResponseCache::Entry {
  std::vector<core::OutputTensor> outputs;  // data views into `buffers`
  std::vector<std::string> buffers;
  uint64_t bytes = 0;
};

namespace {
// What one entry costs beyond its tensor bytes (index, list node, names, shapes).
constexpr uint64_t kEntryOverhead = 128;
constexpr uint64_t kOutputOverhead = 64;
}  // namespace

absl::StatusOr<CacheConfig> ParseCacheConfig(
    const std::vector<std::pair<std::string, std::pair<std::string, std::string>>>& settings) {
  CacheConfig config;
  bool has_size = false;
  for (const auto& [cache, kv] : settings) {
    if (cache != "local") {
      return absl::InvalidArgumentError(inferd::StrCat(
          "--cache-config: cache '", cache, "' is not available; this server has the 'local' cache"));
    }
    config.name = cache;
    if (kv.first == "size") {
      uint64_t n = 0;
      const std::string& v = kv.second;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (v.empty() || ec != std::errc() || p != v.data() + v.size()) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "--cache-config local,size=<bytes>: '", v, "' is not a non-negative integer"));
      }
      config.size_bytes = n;
      has_size = true;
    } else {
      return absl::InvalidArgumentError(inferd::StrCat(
          "--cache-config: the local cache has no setting '", kv.first, "' (it takes size)"));
    }
  }
  if (!config.name.empty() && !has_size) {
    return absl::InvalidArgumentError("--cache-config local needs size=<bytes>");
  }
  return config;
}

ResponseCache::Key ResponseCache::MakeKey(const core::InferRequest& request) {
  std::vector<const core::InputTensor*> inputs;
  inputs.reserve(request.inputs.size());
  for (const auto& in : request.inputs) inputs.push_back(&in);
  std::sort(inputs.begin(), inputs.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  Key key;
  std::string& sig = key.signature;
  sig.reserve(64 + request.model_name.size());
  sig.append(request.model_name).push_back('\0');
  sig.append(inferd::StrCat(request.model_version)).push_back('\0');
  for (const auto* in : inputs) {
    sig.append(in->name).push_back('\0');
    sig.append(DataTypeName(in->datatype)).push_back('[');
    for (int64_t d : in->shape) sig.append(inferd::StrCat(d, ","));
    sig.append(inferd::StrCat("]", in->data.size())).push_back('\0');
  }
  sig.push_back('>');
  for (const auto& out : request.outputs) {
    sig.append(out.name).append(inferd::StrCat(":", out.classification)).push_back('\0');
  }
  size_t h = absl::HashOf(std::string_view(sig));
  for (const auto* in : inputs) h = absl::HashOf(h, in->data);
  key.hash = static_cast<uint64_t>(h);
  return key;
}

std::optional<std::vector<core::OutputTensor>> ResponseCache::Lookup(const Key& key) {
  std::shared_ptr<const Entry> entry;
  {
    inferd::MutexLock lock(&mu_);
    ++counters_.lookups;
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++counters_.misses;
      return std::nullopt;
    }
    ++counters_.hits;
    lru_.splice(lru_.begin(), lru_, it->second);
    entry = it->second->second;
  }
  std::vector<core::OutputTensor> outputs = entry->outputs;
  for (auto& o : outputs) o.holder = entry;
  return outputs;
}

bool ResponseCache::Insert(const Key& key, const core::InferResponse& response) {
  auto entry = std::make_shared<Entry>();
  entry->bytes = kEntryOverhead + key.signature.size();
  entry->buffers.reserve(response.outputs.size());
  for (const auto& out : response.outputs) {
    entry->bytes += kOutputOverhead + out.name.size() + out.data.size();
  }
  if (entry->bytes > capacity_) return false;
  for (const auto& out : response.outputs) {
    std::string& buf = entry->buffers.emplace_back(out.data);
    core::OutputTensor copy;
    copy.name = out.name;
    copy.datatype = out.datatype;
    copy.shape = out.shape;
    copy.data = buf;
    entry->outputs.push_back(std::move(copy));
  }
  // Old entries are destroyed outside the lock.
  std::vector<std::shared_ptr<const Entry>> evicted;
  inferd::MutexLock lock(&mu_);
  if (index_.count(key)) return true;  // a concurrent miss inserted it first
  while (bytes_ + entry->bytes > capacity_ && !lru_.empty()) {
    auto& last = lru_.back();
    bytes_ -= last.second->bytes;
    evicted.push_back(std::move(last.second));
    index_.erase(last.first);
    lru_.pop_back();
    ++counters_.evictions;
  }
  bytes_ += entry->bytes;
  lru_.emplace_front(key, std::move(entry));
  index_.emplace(key, lru_.begin());
  ++counters_.insertions;
  return true;
}

ResponseCache::Counters ResponseCache::GetCounters() const {
  inferd::MutexLock lock(&mu_);
  Counters c = counters_;
  c.entries = lru_.size();
  c.bytes = bytes_;
  c.capacity = capacity_;
  return c;
}

}  // namespace inferd::server
