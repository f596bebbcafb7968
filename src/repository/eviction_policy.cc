#include "repository/eviction_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/strings.h"

namespace inferd::repository {
namespace {

absl::Status NoRoomError(int64_t needed_bytes, int64_t resident_bytes, int64_t budget_bytes,
                         int64_t evictable_bytes) {
  return absl::ResourceExhaustedError(StrCat(
      "a load of ", needed_bytes, " bytes does not fit the memory budget of ", budget_bytes,
      " bytes: ", resident_bytes, " bytes are resident and only ", evictable_bytes,
      " of them belong to idle, unpinned models that could be evicted"));
}

// Evicts in ascending order of the load time a model saves per byte it holds,
//     F * load_seconds / bytes,
// F being its request count with each request's weight halving every half-life of requests to
// the store (an LRFU-style count: recent requests weigh more, old ones fade). For a trace whose
// popularity does not change this is the density order of the fractional knapsack, and it
// matched an oracle that knows every model's true request rate (bench/eviction_trace.cc).
// GreedyDual-Size-Frequency (L + F * cost / size, L inflating to the last evicted priority) was
// the starting point; it spent 5-15% more time loading than this on every trace of the
// benchmark: its inflation term lets a model used once recently outrank one used steadily.
//
// The priority is kept in the log domain so that it need not change between requests:
//     ln F(r) + ln 2 * r / half_life + ln(load_seconds / bytes),
// r being the store's request count at the model's last request; comparing it orders models by
// F decayed to the present, for all of them decay by the same factor from r to now.
class CostAwarePolicy final : public EvictionPolicy {
 public:
  explicit CostAwarePolicy(CostAwareOptions options) : options_(options) {}

  std::string_view name() const override { return "cost-aware"; }

  void OnLoaded(const std::string& model, int64_t bytes, double load_seconds) override {
    auto [it, added] = models_.try_emplace(model);
    Stats& s = it->second;
    if (!added && !s.resident) --unloaded_;  // back from history, with its count
    s.resident = true;
    s.bytes = std::max<int64_t>(bytes, 1);
    load_seconds = std::max(load_seconds, 0.0);
    // The mean of the last few loads: one load from a cold disk or a warm page cache should
    // not decide alone.
    s.load_seconds = s.loads == 0 ? load_seconds
                                  : s.load_seconds + (load_seconds - s.load_seconds) /
                                                         static_cast<double>(std::min<int64_t>(
                                                             s.loads + 1, 4));
    ++s.loads;
    s.frequency = Decayed(s);
    s.frequency_at = requests_;
    s.sequence = ++sequence_;
    s.priority = Priority(s);
  }

  void OnUsed(const std::string& model) override {
    auto it = models_.find(model);
    if (it == models_.end()) return;
    // Counted even while unloaded (a request waiting for its load): the count is of requests.
    Stats& s = it->second;
    ++requests_;
    s.frequency = Decayed(s) + 1;
    s.frequency_at = requests_;
    s.sequence = ++sequence_;
    s.priority = Priority(s);
  }

  void OnUsedBatch(const std::vector<RequestCount>& counts) override {
    std::vector<std::pair<Stats*, uint64_t>> known;
    uint64_t total = 0;
    for (const RequestCount& c : counts) {
      auto it = models_.find(c.model);
      if (it == models_.end() || c.requests == 0) continue;
      known.push_back({&it->second, c.requests});
      total += c.requests;
    }
    if (total == 0) return;
    requests_ += total;
    // A request at an even random place in the batch weighs, at its end, the mean of
    // 2^(-age / half_life) over ages 0..total.
    double weight = 1;
    const double half_life = options_.frequency_half_life_requests;
    if (half_life > 0) {
      const double span = static_cast<double>(total) / half_life;
      weight = -std::expm1(-span * std::log(2.0)) / (span * std::log(2.0));
    }
    for (auto [s, n] : known) {
      s->frequency = Decayed(*s) + static_cast<double>(n) * weight;
      s->frequency_at = requests_;
      s->sequence = ++sequence_;
      s->priority = Priority(*s);
    }
  }

  void OnUnloaded(const std::string& model) override {
    auto it = models_.find(model);
    if (it == models_.end() || !it->second.resident) return;
    it->second.resident = false;
    ++unloaded_;
    while (unloaded_ > options_.history_limit) ForgetOldest();
  }

  absl::StatusOr<std::vector<std::string>> ChooseVictims(
      int64_t needed_bytes, int64_t resident_bytes, int64_t budget_bytes,
      const std::function<bool(const std::string&)>& evictable) override {
    const int64_t to_free = resident_bytes + needed_bytes - budget_bytes;
    if (to_free <= 0) return std::vector<std::string>{};
    std::vector<Candidate> candidates;
    int64_t evictable_bytes = 0;
    for (const auto& [name, s] : models_) {
      if (!s.resident || !evictable(name)) continue;
      candidates.push_back({&name, &s});
      evictable_bytes += s.bytes;
    }
    if (evictable_bytes < to_free) {
      return NoRoomError(needed_bytes, resident_bytes, budget_bytes, evictable_bytes);
    }
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      if (a.stats->priority != b.stats->priority) return a.stats->priority < b.stats->priority;
      return a.stats->sequence < b.stats->sequence;  // equal value: least recently used first
    });
    // The cheapest prefix that frees enough...
    size_t n = 0;
    int64_t freed = 0;
    while (freed < to_free) freed += candidates[n++].stats->bytes;
    // ...less the victims it turns out not to need, the most valuable first: when a large
    // model ends the prefix, the small ones before it may stay.
    std::vector<bool> stays(n, false);
    for (size_t i = n; i-- > 0;) {
      if (freed - candidates[i].stats->bytes >= to_free) {
        freed -= candidates[i].stats->bytes;
        stays[i] = true;
      }
    }
    std::vector<std::string> victims;
    for (size_t i = 0; i < n; ++i) {
      if (!stays[i]) victims.push_back(*candidates[i].name);
    }
    return victims;
  }

 private:
  struct Stats {
    int64_t bytes = 1;
    double load_seconds = 0;  // mean of the last few measured loads
    int64_t loads = 0;
    double frequency = 0;       // decayed request count, as of request number frequency_at
    uint64_t frequency_at = 0;  // the store's request count when `frequency` was updated
    uint64_t sequence = 0;      // order of the last call about this model (recency)
    double priority = 0;        // see the class comment; higher stays longer
    bool resident = false;
  };
  struct Candidate {
    const std::string* name;
    const Stats* stats;
  };

  // Below any real count or time, so that ln() stays finite for a model loaded but not used.
  static constexpr double kFloor = 1e-9;

  double Decayed(const Stats& s) const {
    if (options_.frequency_half_life_requests <= 0) return s.frequency;
    return s.frequency * std::exp2(-static_cast<double>(requests_ - s.frequency_at) /
                                   options_.frequency_half_life_requests);
  }

  double Priority(const Stats& s) const {
    double p = std::log(std::max(s.frequency, kFloor)) +
               std::log(std::max(s.load_seconds, kFloor) / static_cast<double>(s.bytes));
    if (options_.frequency_half_life_requests > 0) {
      p += std::log(2.0) * static_cast<double>(s.frequency_at) /
           options_.frequency_half_life_requests;
    }
    return p;
  }

  // Forgets the unloaded model touched longest ago. Linear in the models known, once per
  // unload past the limit: small beside the unload itself.
  void ForgetOldest() {
    auto oldest = models_.end();
    for (auto it = models_.begin(); it != models_.end(); ++it) {
      if (it->second.resident) continue;
      if (oldest == models_.end() || it->second.sequence < oldest->second.sequence) oldest = it;
    }
    models_.erase(oldest);
    --unloaded_;
  }

  const CostAwareOptions options_;
  absl::flat_hash_map<std::string, Stats> models_;  // resident, and remembered after unload
  size_t unloaded_ = 0;                             // entries with resident == false
  uint64_t requests_ = 0;                           // OnUsed calls for known models
  uint64_t sequence_ = 0;
};

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }

  void OnLoaded(const std::string& model, int64_t bytes, double) override {
    Stats& s = models_[model];
    s.bytes = std::max<int64_t>(bytes, 1);
    s.sequence = ++sequence_;
  }
  void OnUsed(const std::string& model) override {
    auto it = models_.find(model);
    if (it != models_.end()) it->second.sequence = ++sequence_;
  }
  void OnUsedBatch(const std::vector<RequestCount>& counts) override {
    for (const RequestCount& c : counts) {
      if (c.requests > 0) OnUsed(c.model);  // only the order matters here
    }
  }
  void OnUnloaded(const std::string& model) override { models_.erase(model); }

  absl::StatusOr<std::vector<std::string>> ChooseVictims(
      int64_t needed_bytes, int64_t resident_bytes, int64_t budget_bytes,
      const std::function<bool(const std::string&)>& evictable) override {
    const int64_t to_free = resident_bytes + needed_bytes - budget_bytes;
    if (to_free <= 0) return std::vector<std::string>{};
    std::vector<std::pair<const std::string*, const Stats*>> candidates;
    int64_t evictable_bytes = 0;
    for (const auto& [name, s] : models_) {
      if (!evictable(name)) continue;
      candidates.push_back({&name, &s});
      evictable_bytes += s.bytes;
    }
    if (evictable_bytes < to_free) {
      return NoRoomError(needed_bytes, resident_bytes, budget_bytes, evictable_bytes);
    }
    std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
      return a.second->sequence < b.second->sequence;
    });
    std::vector<std::string> victims;
    for (int64_t freed = 0; freed < to_free;) {
      const auto& [name, s] = candidates[victims.size()];
      victims.push_back(*name);
      freed += s->bytes;
    }
    return victims;
  }

 private:
  struct Stats {
    int64_t bytes = 1;
    uint64_t sequence = 0;  // order of the last load or request
  };

  absl::flat_hash_map<std::string, Stats> models_;  // resident only
  uint64_t sequence_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeCostAwarePolicy(CostAwareOptions options) {
  return std::make_unique<CostAwarePolicy>(options);
}

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace inferd::repository
