// Replays one seeded request trace through the model store's eviction policies (the real
// classes of src/repository/eviction_policy.h) and adds up the time spent loading models.
//
// The trace: `--models` models with sizes log-uniform in 10 MB - 2 GB, requested with Zipf
// popularity (exponent `--zipf`) shuffled against size and load time, so the most popular
// models are neither simply the smallest nor the quickest to load. Each model's load time is
// one of (`--load-time`):
//   - mixed (the default): a size-proportional part, 1.5 s/GB times log-normal noise per model
//     (sigma 0.35), plus an initialization time of the model's own, log-uniform in
//     0.05 s - 10 s and independent of its size. Real catalogs look like this: an ONNX model
//     that is mostly weights loads at about disk speed (bench/mme.sh: a 100 MB MatMul model's
//     ONNX Runtime session took 0.20-0.26 s, about 2.5 s/GB), while what happens after the
//     weights are read takes its own time however small the model is: 0.05 s is about the
//     least any model costs (a small ONNX graph's session, with its graph optimizations);
//     seconds are a Python-backend model (an interpreter and its imports: `import torch` alone
//     takes 1-3 s), a TorchScript model frozen and optimized at load, LibTorch opened on first
//     use (0.3-0.5 s here, bench/RESULTS.md), or warmup samples (100 samples of ResNet-50 at
//     44 ms on this machine: 4.4 s). 10 s bounds the warmups and JIT passes of a CPU model;
//     TensorRT engine builds (minutes) are left out. Log-uniform because these spread over
//     orders of magnitude; the median is 0.7 s.
//   - proportional (the first version of this benchmark): 0.02 s + 1.5 s/GB, times the same
//     per-model noise, so load time per byte barely varies between models.
// Either way each load varies a little more (log-normal, sigma 0.1). The initialization times
// come from a random stream of their own: for one seed both variants have the same sizes,
// popularity and requests, and differ only in load times. A fraction `--one-off`
// of the requests go to models requested once and never again (10-100 MB): the scan that must
// not push the hot models out. `--shift` reshuffles popularity halfway through. The budget
// holds `--budget` of the catalog's total size (one-off models not counted).
//
// Each policy serves the trace one request at a time: a request for a resident model is a hit;
// otherwise the policy chooses victims, they are unloaded and the model is loaded, paying that
// load's time. Printed per policy: misses, load seconds, reloads of the 10 most popular models
// ("hot"), and the mean share of the budget held by one-off models.
//
// References, computed on the same trace:
//   - gdsf: GreedyDual-Size-Frequency (H = L + F * load_seconds / bytes, L rising to each
//     evicted H, frequencies remembered after eviction), the classic cost-aware policy, as a
//     bench-only class: the design inferd's policy was measured against.
//   - online oracle: knows every catalog model's true request probability at that point of the
//     trace and that one-off models never return, and evicts the lowest
//     probability x load_seconds / bytes first: what inferd's policy would do with perfect
//     frequency estimates.
//   - offline reference, an upper bound on the optimum (exact optimization with sizes and costs
//     is NP-hard): the better of two schedules that know the future, Belady (evict the model
//     requested again farthest ahead first) and a cost-aware Belady (evict the lowest
//     load_seconds / (bytes x distance to its next request) first).
//   - lower bound on the optimum: the Lagrangian dual of the LP relaxation of the trace. Each
//     stretch between two requests to one model is either kept resident, occupying its bytes at
//     every request in between, or paid for with one load (fractions allowed); at each request
//     the kept stretches must fit the budget less the requested model. Any non-negative
//     multipliers give a valid bound; the best single multiplier is found by golden-section
//     search and then improved by projected subgradient ascent, one multiplier per request. The optimum lies between the two, so inferd / optimum lies between
//     inferd / offline reference and inferd / lower bound.
//
// Usage: eviction_trace [--seed=N] [--requests=N] [--models=N] [--zipf=S] [--one-off=F]
//                       [--budget=F] [--shift] [--load-time=mixed|proportional]
//                       [--init-seconds=LO:HI]   (the mixed variant's range, to test how much
//                                                 the figure owes to it)
// The last lines are the ratios; bench/eviction_trace.sh runs several traces.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include "repository/eviction_policy.h"

namespace {

using inferd::repository::CostAwareOptions;
using inferd::repository::EvictionPolicy;

constexpr double kMB = 1e6;
constexpr double kGB = 1e9;
constexpr int kHot = 10;  // the most popular models, whose reloads are counted apart
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

struct Options {
  uint64_t seed = 1;
  int64_t requests = 100'000;
  int models = 60;
  double zipf = 1.0;
  double one_off = 0.10;
  double budget = 0.25;
  bool shift = false;
  bool mixed_load_times = true;  // --load-time=mixed (default) or proportional
  double init_lo = 0.05, init_hi = 10;  // --init-seconds=LO:HI, the mixed variant's range
};

// SplitMix64 and hand-written distributions: the same trace for a seed with any standard library.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double LogUniform(double lo, double hi) {
    return std::exp(std::log(lo) + Uniform() * (std::log(hi) - std::log(lo)));
  }
  double Normal() {
    const double u = 1.0 - Uniform(), v = Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2 * M_PI * v);
  }
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Next() % i]);
  }

 private:
  uint64_t state_;
};

struct Trace {
  // Per model id: the catalog first, then one one-off model per one-off request.
  std::vector<std::string> names;
  std::vector<int64_t> bytes;
  std::vector<double> load_s;  // the typical load time
  std::vector<bool> one_off;
  // Per request.
  std::vector<int> model;
  std::vector<double> cost;  // the load time paid if this request misses
  // Popularity: rank_of[phase][model] for catalog models (0: most popular) and the probability
  // of each rank; the phase changes at request `shift_at` with --shift.
  std::vector<std::vector<int>> rank_of;
  std::vector<double> probability_of_rank;
  int64_t shift_at = kNever;
  int64_t budget_bytes = 0;
  int64_t catalog_bytes = 0;

  int Phase(size_t k) const { return static_cast<int64_t>(k) >= shift_at ? 1 : 0; }
  bool Hot(int m, size_t k) const { return !one_off[m] && rank_of[Phase(k)][m] < kHot; }
};

// The typical load time of a model of `bytes` (see the top). `rng` draws the per-model noise
// (one draw, as the proportional variant always did, so that the trace's other draws are the
// same in both variants); `init_rng` the initialization time of the mixed variant.
double LoadSeconds(const Options& o, Random& rng, Random& init_rng, double bytes) {
  const double noise = std::exp(0.35 * rng.Normal());
  if (!o.mixed_load_times) return (0.02 + 1.5 * bytes / kGB) * noise;
  return 1.5 * bytes / kGB * noise + init_rng.LogUniform(o.init_lo, o.init_hi);
}

Trace MakeTrace(const Options& o) {
  Random rng(o.seed);
  Random init_rng(o.seed ^ 0x5ca1ab1e0ddba11ull);
  Trace t;
  for (int i = 0; i < o.models; ++i) {
    const double b = rng.LogUniform(10 * kMB, 2 * kGB);
    t.names.push_back("model" + std::to_string(i));
    t.bytes.push_back(static_cast<int64_t>(b));
    t.load_s.push_back(LoadSeconds(o, rng, init_rng, b));
    t.one_off.push_back(false);
    t.catalog_bytes += static_cast<int64_t>(b);
  }
  t.budget_bytes = static_cast<int64_t>(o.budget * static_cast<double>(t.catalog_bytes));
  // Rank r has weight 1 / (r + 1)^s; which model holds which rank is shuffled.
  std::vector<double> cumulative(o.models);
  double sum = 0;
  for (int r = 0; r < o.models; ++r) cumulative[r] = sum += 1.0 / std::pow(r + 1, o.zipf);
  for (int r = 0; r < o.models; ++r) {
    t.probability_of_rank.push_back((1 - o.one_off) / std::pow(r + 1, o.zipf) / sum);
  }
  std::vector<int> by_rank(o.models);
  std::iota(by_rank.begin(), by_rank.end(), 0);
  auto new_phase = [&] {
    rng.Shuffle(by_rank);
    t.rank_of.emplace_back(o.models);
    for (int r = 0; r < o.models; ++r) t.rank_of.back()[by_rank[r]] = r;
  };
  new_phase();
  if (o.shift) t.shift_at = o.requests / 2;
  for (int64_t k = 0; k < o.requests; ++k) {
    if (k == t.shift_at) new_phase();
    int m;
    if (rng.Uniform() < o.one_off) {
      const double b = rng.LogUniform(10 * kMB, 100 * kMB);
      m = static_cast<int>(t.names.size());
      t.names.push_back("one-off" + std::to_string(k));
      t.bytes.push_back(static_cast<int64_t>(b));
      t.load_s.push_back(LoadSeconds(o, rng, init_rng, b));
      t.one_off.push_back(true);
    } else {
      const double u = rng.Uniform() * sum;
      m = by_rank[std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin()];
    }
    t.model.push_back(m);
    t.cost.push_back(t.load_s[m] * std::exp(0.1 * rng.Normal()));
  }
  return t;
}

struct Result {
  std::string name;
  int64_t misses = 0;
  double load_seconds = 0;
  int64_t hot_reloads = 0;  // misses on a top-10 model that had been loaded before
  double hot_reload_seconds = 0;
  double one_off_share = 0;  // mean over requests of (one-off bytes resident) / budget
};

// The resident set and the bookkeeping shared by every way of serving the trace.
class Store {
 public:
  Store(const Trace& t, std::string name)
      : t_(t), resident_(t.names.size(), false), loaded_before_(t.names.size(), false) {
    result_.name = std::move(name);
  }
  bool Resident(int m) const { return resident_[m]; }
  int64_t resident_bytes() const { return resident_bytes_; }
  void Evict(int m, const char* who) {
    if (!resident_[m]) Fail(who, "evicted a model that is not resident");
    resident_[m] = false;
    resident_bytes_ -= t_.bytes[m];
    if (t_.one_off[m]) one_off_bytes_ -= t_.bytes[m];
  }
  void Load(int m, size_t k) {
    if (resident_bytes_ + t_.bytes[m] > t_.budget_bytes) Fail("", "did not make room");
    resident_[m] = true;
    resident_bytes_ += t_.bytes[m];
    if (t_.one_off[m]) one_off_bytes_ += t_.bytes[m];
    ++result_.misses;
    result_.load_seconds += t_.cost[k];
    if (loaded_before_[m] && t_.Hot(m, k)) {
      ++result_.hot_reloads;
      result_.hot_reload_seconds += t_.cost[k];
    }
    loaded_before_[m] = true;
  }
  void EndOfRequest() {
    share_sum_ += static_cast<double>(one_off_bytes_) / static_cast<double>(t_.budget_bytes);
  }
  Result Finish() {
    result_.one_off_share = share_sum_ / static_cast<double>(t_.model.size());
    return result_;
  }
  [[noreturn]] void Fail(const std::string& detail, const char* what) {
    std::fprintf(stderr, "%s %s %s\n", result_.name.c_str(), what, detail.c_str());
    std::exit(1);
  }

 private:
  const Trace& t_;
  Result result_;
  std::vector<bool> resident_, loaded_before_;
  int64_t resident_bytes_ = 0, one_off_bytes_ = 0;
  double share_sum_ = 0;
};

// Serves the trace with `policy` as the model store would, checking its contract.
Result Replay(const Trace& t, EvictionPolicy& policy, std::string label) {
  Store store(t, std::move(label));
  std::unordered_map<std::string, int> id;
  const auto evictable = [](const std::string&) { return true; };  // one request at a time
  for (size_t k = 0; k < t.model.size(); ++k) {
    const int m = t.model[k];
    if (!store.Resident(m)) {
      auto victims = policy.ChooseVictims(t.bytes[m], store.resident_bytes(), t.budget_bytes,
                                          evictable);
      if (!victims.ok()) store.Fail(victims.status().ToString(), "failed:");
      for (const std::string& v : *victims) {
        auto it = id.find(v);
        if (it == id.end()) store.Fail(v, "chose an unknown model:");
        store.Evict(it->second, v.c_str());
        policy.OnUnloaded(v);
      }
      store.Load(m, k);
      policy.OnLoaded(t.names[m], t.bytes[m], t.cost[k]);
      id[t.names[m]] = m;
    }
    policy.OnUsed(t.names[m]);
    store.EndOfRequest();
  }
  return store.Finish();
}

// GreedyDual-Size-Frequency with frequencies kept after eviction: the reference described at
// the top (bench-only).
class GdsfReference final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "gdsf"; }
  void OnLoaded(const std::string& model, int64_t bytes, double load_seconds) override {
    Entry& e = entries_[model];
    e.bytes = std::max<int64_t>(bytes, 1);
    e.cost = load_seconds;
    e.resident = true;
    Touch(e);
  }
  void OnUsed(const std::string& model) override {
    auto it = entries_.find(model);
    if (it == entries_.end()) return;
    it->second.frequency += 1;
    Touch(it->second);
  }
  void OnUsedBatch(const std::vector<inferd::repository::RequestCount>& counts) override {
    for (const auto& c : counts) {
      for (uint64_t i = 0; i < c.requests; ++i) OnUsed(c.model);
    }
  }
  void OnUnloaded(const std::string& model) override { entries_[model].resident = false; }
  absl::StatusOr<std::vector<std::string>> ChooseVictims(
      int64_t needed_bytes, int64_t resident_bytes, int64_t budget_bytes,
      const std::function<bool(const std::string&)>& evictable) override {
    const int64_t to_free = resident_bytes + needed_bytes - budget_bytes;
    std::vector<std::pair<std::pair<double, uint64_t>, const std::string*>> order;
    for (const auto& [name, e] : entries_) {
      if (e.resident && evictable(name)) order.push_back({{e.priority, e.sequence}, &name});
    }
    std::sort(order.begin(), order.end());
    std::vector<std::string> victims;
    for (int64_t freed = 0; freed < to_free;) {
      if (victims.size() == order.size()) return absl::ResourceExhaustedError("no room");
      const std::string& name = *order[victims.size()].second;
      victims.push_back(name);
      freed += entries_[name].bytes;
      inflation_ = std::max(inflation_, entries_[name].priority);
    }
    return victims;
  }

 private:
  struct Entry {
    int64_t bytes = 1;
    double cost = 0, frequency = 0, priority = 0;
    uint64_t sequence = 0;
    bool resident = false;
  };
  void Touch(Entry& e) {
    e.priority = inflation_ + e.frequency * e.cost / static_cast<double>(e.bytes);
    e.sequence = ++sequence_;
  }
  std::unordered_map<std::string, Entry> entries_;
  double inflation_ = 0;
  uint64_t sequence_ = 0;
};

// For every request, the index of the next request to the same model (or kNever).
std::vector<int64_t> NextUse(const Trace& t) {
  std::vector<int64_t> next(t.model.size(), kNever);
  std::vector<int64_t> upcoming(t.names.size(), kNever);
  for (size_t k = t.model.size(); k-- > 0;) {
    next[k] = upcoming[t.model[k]];
    upcoming[t.model[k]] = static_cast<int64_t>(k);
  }
  return next;
}

// A schedule that knows more than a policy can: on a miss at request k, evicts resident models
// in ascending score(model, requests until its next use, k) until the model fits, then keeps
// any victim not needed after all, the highest scored first (as inferd's policy does).
template <typename Score>
Result ServeKnowing(const Trace& t, const std::vector<int64_t>& next, Score score,
                    std::string label) {
  Store store(t, std::move(label));
  std::vector<int> resident;
  std::vector<int64_t> next_of(t.names.size(), kNever);
  for (size_t k = 0; k < t.model.size(); ++k) {
    const int m = t.model[k];
    if (!store.Resident(m)) {
      const int64_t to_free = store.resident_bytes() + t.bytes[m] - t.budget_bytes;
      if (to_free > 0) {
        std::vector<std::pair<double, int>> order;
        for (int c : resident) {
          const double distance = next_of[c] == kNever
                                      ? std::numeric_limits<double>::infinity()
                                      : static_cast<double>(next_of[c] - static_cast<int64_t>(k));
          order.push_back({score(c, distance, k), c});
        }
        std::sort(order.begin(), order.end());
        size_t n = 0;
        int64_t freed = 0;
        while (freed < to_free) freed += t.bytes[order[n++].second];
        for (size_t i = n; i-- > 0;) {
          if (freed - t.bytes[order[i].second] >= to_free) {
            freed -= t.bytes[order[i].second];
            order[i].second = -1;  // stays
          }
        }
        for (size_t i = 0; i < n; ++i) {
          const int c = order[i].second;
          if (c < 0) continue;
          store.Evict(c, "");
          resident.erase(std::find(resident.begin(), resident.end(), c));
        }
      }
      store.Load(m, k);
      resident.push_back(m);
    }
    next_of[m] = next[k];
    store.EndOfRequest();
  }
  return store.Finish();
}

// The lower bound described at the top. A stretch is the requests strictly between two
// requests to one model, [start, end); the second request pays `cost` unless it was kept.
double LagrangianBound(const Trace& t, double upper_bound) {
  const size_t steps = t.model.size();
  struct Stretch {
    int64_t start, end;  // requests [start, end)
    double bytes, cost;
  };
  std::vector<Stretch> stretches;
  std::vector<int64_t> last(t.names.size(), -1);
  double compulsory = 0;
  for (size_t k = 0; k < steps; ++k) {
    const int m = t.model[k];
    if (last[m] < 0) {
      compulsory += t.cost[k];
    } else if (static_cast<int64_t>(k) - last[m] >= 2) {
      stretches.push_back({last[m] + 1, static_cast<int64_t>(k), static_cast<double>(t.bytes[m]),
                           t.cost[k]});
    }
    last[m] = static_cast<int64_t>(k);
  }
  std::vector<double> capacity(steps);  // what kept stretches may occupy at each request
  for (size_t k = 0; k < steps; ++k) {
    capacity[k] = static_cast<double>(t.budget_bytes - t.bytes[t.model[k]]);
  }

  // One multiplier per request (blocks of requests sharing one gave looser bounds).
  std::vector<double> prefix(steps + 1);
  std::vector<double> occupied(steps + 1);
  auto evaluate = [&](const std::vector<double>& mu, std::vector<double>* gradient) {
    prefix[0] = 0;
    for (size_t k = 0; k < steps; ++k) prefix[k + 1] = prefix[k] + mu[k];
    double value = compulsory;
    if (gradient) std::fill(occupied.begin(), occupied.end(), 0.0);
    for (const Stretch& j : stretches) {
      const double keep = j.bytes * (prefix[j.end] - prefix[j.start]);
      if (keep < j.cost) {
        value += keep;
        if (gradient) {
          occupied[j.start] += j.bytes;
          occupied[j.end] -= j.bytes;
        }
      } else {
        value += j.cost;
      }
    }
    for (size_t k = 0; k < steps; ++k) value -= mu[k] * capacity[k];
    if (gradient) {  // d value / d mu[k]: the bytes kept at request k less the room there
      gradient->resize(steps);
      double running = 0;
      for (size_t k = 0; k < steps; ++k) {
        running += occupied[k];
        (*gradient)[k] = running - capacity[k];
      }
    }
    return value;
  };

  // One multiplier for all requests first: the bound is concave in it, so golden-section search.
  std::vector<double> mu(steps, 0);
  auto at = [&](double log_mu) {
    std::fill(mu.begin(), mu.end(), std::exp(log_mu));
    return evaluate(mu, nullptr);
  };
  double lo = std::log(1e-20), hi = std::log(1e-6);
  const double phi = (std::sqrt(5.0) - 1) / 2;
  double a = hi - phi * (hi - lo), b = lo + phi * (hi - lo);
  double fa = at(a), fb = at(b);
  for (int i = 0; i < 80; ++i) {
    if (fa < fb) {
      lo = a, a = b, fa = fb, b = lo + phi * (hi - lo), fb = at(b);
    } else {
      hi = b, b = a, fb = fa, a = hi - phi * (hi - lo), fa = at(a);
    }
  }
  std::fill(mu.begin(), mu.end(), std::exp((lo + hi) / 2));
  double best = std::max(0.0, evaluate(mu, nullptr));

  // Then projected subgradient ascent with Polyak steps towards the offline upper bound.
  std::vector<double> gradient;
  double lambda = 1.0;
  int since_better = 0;
  for (int it = 0; it < 1000; ++it) {
    const double value = evaluate(mu, &gradient);
    if (value > best) {
      best = value;
      since_better = 0;
    } else if (++since_better >= 15) {
      lambda /= 2;
      since_better = 0;
    }
    double norm2 = 0;
    for (double g : gradient) norm2 += g * g;
    if (norm2 == 0 || lambda < 1e-4) break;
    const double step = lambda * (upper_bound - value) / norm2;
    for (size_t k = 0; k < steps; ++k) mu[k] = std::max(0.0, mu[k] + step * gradient[k]);
  }
  return best;
}

void Print(const Result& r) {
  std::printf("  %-34s misses %6lld  load %8.1f s  hot reloads %5lld (%7.1f s)  "
              "one-off share %4.1f%%\n",
              r.name.c_str(), static_cast<long long>(r.misses), r.load_seconds,
              static_cast<long long>(r.hot_reloads), r.hot_reload_seconds, 100 * r.one_off_share);
}

bool ParseFlag(const char* arg, const char* flag, const char** value) {
  const size_t n = std::strlen(flag);
  if (std::strncmp(arg, flag, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const char* v;
    if (ParseFlag(argv[i], "--seed", &v)) {
      o.seed = std::strtoull(v, nullptr, 10);
    } else if (ParseFlag(argv[i], "--requests", &v)) {
      o.requests = std::strtoll(v, nullptr, 10);
    } else if (ParseFlag(argv[i], "--models", &v)) {
      o.models = std::atoi(v);
    } else if (ParseFlag(argv[i], "--zipf", &v)) {
      o.zipf = std::strtod(v, nullptr);
    } else if (ParseFlag(argv[i], "--one-off", &v)) {
      o.one_off = std::strtod(v, nullptr);
    } else if (ParseFlag(argv[i], "--budget", &v)) {
      o.budget = std::strtod(v, nullptr);
    } else if (std::strcmp(argv[i], "--shift") == 0) {
      o.shift = true;
    } else if (ParseFlag(argv[i], "--init-seconds", &v)) {
      char* end;
      o.init_lo = std::strtod(v, &end);
      o.init_hi = *end == ':' ? std::strtod(end + 1, nullptr) : 0;
    } else if (std::strcmp(argv[i], "--load-time=mixed") == 0) {
      o.mixed_load_times = true;
    } else if (std::strcmp(argv[i], "--load-time=proportional") == 0) {
      o.mixed_load_times = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seed=N] [--requests=N] [--models=N] [--zipf=S] [--one-off=F] "
                   "[--budget=F] [--shift] [--load-time=mixed|proportional] "
                   "[--init-seconds=LO:HI]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.requests < 2 || o.models < 1 || o.budget <= 0 || o.one_off < 0 || o.one_off >= 1 ||
      o.init_lo <= 0 || o.init_hi < o.init_lo) {
    std::fprintf(stderr, "need --requests >= 2, --models >= 1, --budget > 0, 0 <= --one-off < 1, "
                 "--init-seconds=LO:HI with 0 < LO <= HI\n");
    return 2;
  }
  const Trace t = MakeTrace(o);
  if (*std::max_element(t.bytes.begin(), t.bytes.end()) > t.budget_bytes) {
    std::fprintf(stderr, "the budget is smaller than the largest model: raise --budget\n");
    return 2;
  }
  char load_times[96] = "proportional (0.02 s + 1.5 s/GB)";
  if (o.mixed_load_times) {
    std::snprintf(load_times, sizeof load_times, "mixed (1.5 s/GB + init log-uniform %g-%g s)",
                  o.init_lo, o.init_hi);
  }
  std::printf("trace: seed %llu, %lld requests, %d models (%.1f GB), zipf %.2f%s, %.0f%% of "
              "requests to one-off models, budget %.2f GB (%.0f%% of the catalog), load times %s\n",
              static_cast<unsigned long long>(o.seed), static_cast<long long>(o.requests),
              o.models, t.catalog_bytes / kGB, o.zipf,
              o.shift ? ", popularity reshuffled halfway" : "", 100 * o.one_off,
              t.budget_bytes / kGB, 100 * o.budget,
              load_times);

  const Result lru = Replay(t, *inferd::repository::MakeLruPolicy(), "lru");
  const Result inferd =
      Replay(t, *inferd::repository::MakeCostAwarePolicy(), "cost-aware (inferd's default)");
  std::vector<Result> variants;
  {
    CostAwareOptions no_history;
    no_history.history_limit = 0;
    variants.push_back(
        Replay(t, *inferd::repository::MakeCostAwarePolicy(no_history), "  without history"));
    for (double half_life : {0.0, 500.0, 8000.0}) {
      CostAwareOptions options;
      options.frequency_half_life_requests = half_life;
      variants.push_back(Replay(t, *inferd::repository::MakeCostAwarePolicy(options),
                                half_life == 0 ? "  without decay"
                                               : "  half-life " +
                                                     std::to_string(static_cast<int>(half_life)) +
                                                     " requests"));
    }
  }
  GdsfReference gdsf;
  const Result gdsf_result = Replay(t, gdsf, "gdsf (reference)");

  const std::vector<int64_t> next = NextUse(t);
  const Result oracle = ServeKnowing(
      t, next,
      [&](int c, double, size_t k) {
        if (t.one_off[c]) return 0.0;
        return t.probability_of_rank[t.rank_of[t.Phase(k)][c]] * t.load_s[c] /
               static_cast<double>(t.bytes[c]);
      },
      "online oracle (true popularity)");
  const Result belady = ServeKnowing(
      t, next, [&](int, double distance, size_t) { return -distance; }, "offline: belady");
  const Result cost_belady = ServeKnowing(
      t, next,
      [&](int c, double distance, size_t) {
        return t.load_s[c] / (static_cast<double>(t.bytes[c]) * distance);
      },
      "offline: cost-aware belady");
  const Result& offline = belady.load_seconds < cost_belady.load_seconds ? belady : cost_belady;
  const double bound = LagrangianBound(t, offline.load_seconds);

  Print(lru);
  Print(inferd);
  for (const Result& r : variants) Print(r);
  Print(gdsf_result);
  Print(oracle);
  Print(belady);
  Print(cost_belady);
  std::printf("  %-34s                load %8.1f s\n", "lower bound (LP relaxation, Lagrangian)",
              bound);
  std::printf("gdsf / lru = %.3f; online oracle / lru = %.3f\n",
              gdsf_result.load_seconds / lru.load_seconds, oracle.load_seconds / lru.load_seconds);
  std::printf("cost-aware / optimum: between %.3f (/ offline reference, %s) and %.3f "
              "(/ lower bound); lru / optimum: between %.3f and %.3f\n",
              inferd.load_seconds / offline.load_seconds,
              offline.name.c_str() + std::strlen("offline: "), inferd.load_seconds / bound,
              lru.load_seconds / offline.load_seconds, lru.load_seconds / bound);
  std::printf("cost-aware / lru = %.3f\n", inferd.load_seconds / lru.load_seconds);
  return 0;
}
