// The model store's eviction policies as plain bookkeeping: every call scripted, no clock, no
// models loaded. A small Store keeps the resident bytes the way the model store will.
#include "repository/eviction_policy.h"

#include <map>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::repository {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kMB = 1'000'000;
constexpr int64_t kGB = 1'000'000'000;

// Drives a policy as the model store does and checks the ChooseVictims contract on each call.
class Store {
 public:
  Store(std::unique_ptr<EvictionPolicy> policy, int64_t budget)
      : policy_(std::move(policy)), budget_(budget) {}

  std::string_view policy_name() const { return policy_->name(); }
  void Load(const std::string& name, int64_t bytes, double seconds) {
    policy_->OnLoaded(name, bytes, seconds);
    resident_[name] = bytes;
  }
  void Use(const std::string& name, int times = 1) {
    for (int i = 0; i < times; ++i) policy_->OnUsed(name);
  }
  void UseBatch(const std::vector<RequestCount>& counts) { policy_->OnUsedBatch(counts); }
  void Unload(const std::string& name) {
    resident_.erase(name);
    policy_->OnUnloaded(name);
  }
  int64_t resident_bytes() const {
    int64_t sum = 0;
    for (const auto& [name, bytes] : resident_) sum += bytes;
    return sum;
  }
  // The victims for a load of `bytes`, checked: resident, evictable, no repeats, and enough.
  absl::StatusOr<std::vector<std::string>> Victims(
      int64_t bytes, const std::function<bool(const std::string&)>& evictable =
                         [](const std::string&) { return true; }) {
    auto victims = policy_->ChooseVictims(bytes, resident_bytes(), budget_, evictable);
    if (!victims.ok()) return victims;
    int64_t freed = 0;
    std::set<std::string> seen;
    for (const std::string& v : *victims) {
      EXPECT_TRUE(resident_.count(v)) << v << " is not resident";
      EXPECT_TRUE(evictable(v)) << v << " is not evictable";
      EXPECT_TRUE(seen.insert(v).second) << v << " chosen twice";
      freed += resident_.count(v) ? resident_.at(v) : 0;
    }
    EXPECT_LE(resident_bytes() - freed + bytes, budget_) << "the victims do not make room";
    return victims;
  }
  // Evicts what the policy chooses and loads the model, as the store will.
  std::vector<std::string> LoadEvicting(const std::string& name, int64_t bytes, double seconds) {
    auto victims = Victims(bytes);
    EXPECT_TRUE(victims.ok()) << victims.status();
    if (!victims.ok()) return {};
    for (const std::string& v : *victims) Unload(v);
    Load(name, bytes, seconds);
    Use(name);
    return *victims;
  }

 private:
  std::unique_ptr<EvictionPolicy> policy_;
  int64_t budget_;
  std::map<std::string, int64_t> resident_;
};

Store CostAware(int64_t budget, CostAwareOptions options = {}) {
  return Store(MakeCostAwarePolicy(options), budget);
}
Store Lru(int64_t budget) { return Store(MakeLruPolicy(), budget); }
std::vector<Store> BothPolicies(int64_t budget) {
  std::vector<Store> stores;
  stores.push_back(CostAware(budget));
  stores.push_back(Lru(budget));
  return stores;
}
CostAwareOptions NoDecay() {
  CostAwareOptions options;
  options.frequency_half_life_requests = 0;
  return options;
}

TEST(EvictionPolicyTest, Names) {
  EXPECT_EQ(MakeCostAwarePolicy()->name(), "cost-aware");
  EXPECT_EQ(MakeLruPolicy()->name(), "lru");
}

// Equal in size, load time and use: both policies evict the least recently used first (the
// cost-aware one also without decay, where their counts tie exactly).
TEST(EvictionPolicyTest, EqualModelsGoLeastRecentlyUsedFirst) {
  std::vector<Store> stores = BothPolicies(300 * kMB);
  stores.push_back(CostAware(300 * kMB, NoDecay()));
  for (Store& store : stores) {
    SCOPED_TRACE(store.policy_name());
    for (const char* name : {"a", "b", "c"}) store.Load(name, 100 * kMB, 0.2);
    store.Use("b");
    store.Use("a");
    store.Use("c");
    EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("b"));
    EXPECT_THAT(*store.Victims(200 * kMB), ElementsAre("b", "a"));
    EXPECT_THAT(*store.Victims(300 * kMB), ElementsAre("b", "a", "c"));
  }
}

TEST(EvictionPolicyTest, NothingToEvictWhenTheLoadFits) {
  for (Store& store : BothPolicies(1 * kGB)) {
    SCOPED_TRACE(store.policy_name());
    store.Load("a", 600 * kMB, 1.0);
    store.Use("a");
    EXPECT_THAT(*store.Victims(400 * kMB), IsEmpty());
  }
}

// The case: a large model that takes seconds to load is not thrown out to make room for
// a small one used once, although it was used less recently. LRU throws it out.
TEST(EvictionPolicyTest, LargeSlowModelIsNotEvictedForASmallOneUsedOnce) {
  for (int big_uses : {1, 3}) {
    SCOPED_TRACE(big_uses);
    Store cost_aware = CostAware(2200 * kMB);
    Store lru = Lru(2200 * kMB);
    for (Store* store : {&cost_aware, &lru}) {
      store->Load("big", 2 * kGB, 4.0);
      store->Use("big", big_uses);
      store->Load("small", 100 * kMB, 0.05);
      store->Use("small");
    }
    EXPECT_THAT(cost_aware.LoadEvicting("one-off", 200 * kMB, 0.1), ElementsAre("small"));
    EXPECT_THAT(lru.LoadEvicting("one-off", 200 * kMB, 0.1), ElementsAre("big"));
    // A stream of small one-off models then evicts only each other.
    for (int i = 0; i < 20; ++i) {
      EXPECT_THAT(cost_aware.LoadEvicting("one-off" + std::to_string(i), 200 * kMB, 0.1),
                  ElementsAre(i == 0 ? "one-off" : "one-off" + std::to_string(i - 1)));
    }
  }
}

// Of two models equal in size and load time, the one used often stays although the other was
// used last; LRU evicts the frequent one.
TEST(EvictionPolicyTest, FrequencyBeatsRecency) {
  Store cost_aware = CostAware(200 * kMB);
  Store lru = Lru(200 * kMB);
  for (Store* store : {&cost_aware, &lru}) {
    store->Load("frequent", 100 * kMB, 0.5);
    store->Use("frequent", 10);
    store->Load("recent", 100 * kMB, 0.5);
    store->Use("recent");
  }
  EXPECT_THAT(*cost_aware.Victims(100 * kMB), ElementsAre("recent"));
  EXPECT_THAT(*lru.Victims(100 * kMB), ElementsAre("frequent"));
}

// ...but only while the requests are recent: a count halves every half-life of requests to
// the store, so a model popular long ago yields to one in use now.
TEST(EvictionPolicyTest, OldPopularityFades) {
  CostAwareOptions options;
  options.frequency_half_life_requests = 100;
  Store store = CostAware(300 * kMB, options);
  store.Load("was-popular", 100 * kMB, 0.5);
  store.Use("was-popular", 50);
  store.Load("busy", 100 * kMB, 0.5);
  store.Use("busy", 1000);  // 10 half-lives: 50 requests weigh less than 1 now
  store.Load("new", 100 * kMB, 0.5);
  store.Use("new", 2);
  EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("was-popular"));

  // One new request does not bring the old count back.
  store.Unload("new");
  store.Load("recent", 100 * kMB, 0.5);
  store.Use("recent", 10);
  store.Use("was-popular");
  EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("was-popular"));

  // Without decay the count never fades.
  Store no_decay = CostAware(300 * kMB, NoDecay());
  no_decay.Load("was-popular", 100 * kMB, 0.5);
  no_decay.Use("was-popular", 50);
  no_decay.Load("busy", 100 * kMB, 0.5);
  no_decay.Use("busy", 1000);
  no_decay.Load("new", 100 * kMB, 0.5);
  no_decay.Use("new", 2);
  EXPECT_THAT(*no_decay.Victims(100 * kMB), ElementsAre("new"));
}

// The value weighed is load time saved per byte held: of two models used alike, the one that
// loads slowly for its size stays.
TEST(EvictionPolicyTest, LoadTimePerByteDecides) {
  Store store = CostAware(2 * kGB);
  store.Load("slow", 1 * kGB, 8.0);
  store.Use("slow", 2);
  store.Load("fast", 1 * kGB, 0.5);
  store.Use("fast", 2);
  EXPECT_THAT(*store.Victims(500 * kMB), ElementsAre("fast"));
}

// A store that counts requests outside its mutex reports them in batches. Model after model,
// one OnUsed per request, the first model's requests would look a whole batch older than the
// last one's; OnUsedBatch counts them as interleaved.
TEST(EvictionPolicyTest, BatchedRequestsCountAsInterleaved) {
  Store batched = CostAware(200 * kMB);
  Store one_by_one = CostAware(200 * kMB);
  for (Store* store : {&batched, &one_by_one}) {
    store->Load("a", 100 * kMB, 0.5);
    store->Load("b", 100 * kMB, 0.5);
  }
  batched.UseBatch({{"a", 4100}, {"b", 4000}});
  one_by_one.Use("a", 4100);
  one_by_one.Use("b", 4000);
  EXPECT_THAT(*batched.Victims(100 * kMB), ElementsAre("b"));     // a had more requests
  EXPECT_THAT(*one_by_one.Victims(100 * kMB), ElementsAre("a"));  // a's look older
}

// A batch of one model's requests weighs as those requests one by one (both decay alike).
TEST(EvictionPolicyTest, BatchOfOneModelWeighsAsItsRequests) {
  Store batched = CostAware(200 * kMB);
  Store one_by_one = CostAware(200 * kMB);
  for (Store* store : {&batched, &one_by_one}) {
    store->Load("old", 100 * kMB, 0.5);
    store->Load("new", 100 * kMB, 0.5);
  }
  batched.UseBatch({{"old", 3000}});
  one_by_one.Use("old", 3000);
  for (Store* store : {&batched, &one_by_one}) {
    store->Use("new", 2000);  // "old" halves to ~930 requests; "new" has ~1440
    EXPECT_THAT(*store->Victims(100 * kMB), ElementsAre("old"));
  }
}

// Unknown models and empty counts in a batch are ignored; LRU takes the batch's order as the
// order of use.
TEST(EvictionPolicyTest, BatchesIgnoreUnknownModelsAndKeepTheOrder) {
  for (Store& store : BothPolicies(300 * kMB)) {
    SCOPED_TRACE(store.policy_name());
    for (const char* name : {"a", "b", "c"}) store.Load(name, 100 * kMB, 0.5);
    store.UseBatch({{"never-loaded", 5}, {"b", 1}, {"a", 1}, {"c", 0}});
    EXPECT_THAT(*store.Victims(300 * kMB), ElementsAre("c", "b", "a"));
  }
}

// Requests for models never loaded (404s, say) do not age the counts of the others.
TEST(EvictionPolicyTest, UnknownModelsDoNotAgeTheOthers) {
  CostAwareOptions options;
  options.frequency_half_life_requests = 100;
  Store store = CostAware(200 * kMB, options);
  store.Load("regular", 100 * kMB, 0.5);
  store.Use("regular", 10);
  store.Use("never-loaded", 1000);
  store.UseBatch({{"never-loaded-either", 1000}});
  store.Load("new", 100 * kMB, 0.5);
  store.Use("new", 2);
  EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("new"));
}

// Of two models that take as long to load and are used alike, the larger goes: evicting it
// frees more memory for the same reload time.
TEST(EvictionPolicyTest, LargerModelGoesWhenReloadsCostTheSame) {
  Store store = CostAware(1100 * kMB);
  store.Load("large", 1 * kGB, 1.0);
  store.Load("small", 100 * kMB, 1.0);
  store.Use("small", 3);
  store.Use("large", 3);
  EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("large"));
}

// A cheap model first in line is spared when the large one behind it frees enough alone.
TEST(EvictionPolicyTest, VictimsNotNeededAreSpared) {
  Store store = CostAware(1100 * kMB);
  store.Load("cheap", 100 * kMB, 0.01);
  store.Use("cheap");
  store.Load("large", 1 * kGB, 1.5);
  store.Use("large");
  // Cheapest per byte first: cheap (0.1 s/GB), then large (1.5 s/GB); large alone frees 1 GB.
  EXPECT_THAT(*store.Victims(900 * kMB), ElementsAre("large"));
  EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("cheap"));
}

// Pinned models and models with requests in flight (the caller's `evictable`) are never chosen,
// even when they are the cheapest to evict.
TEST(EvictionPolicyTest, NonEvictableModelsAreNeverChosen) {
  for (Store& store : BothPolicies(300 * kMB)) {
    SCOPED_TRACE(store.policy_name());
    store.Load("pinned", 100 * kMB, 0.01);
    store.Load("busy", 100 * kMB, 0.01);
    store.Load("idle", 100 * kMB, 5.0);
    store.Use("idle", 10);
    const auto evictable = [](const std::string& name) { return name == "idle"; };
    EXPECT_THAT(*store.Victims(100 * kMB, evictable), ElementsAre("idle"));
    auto none = store.Victims(200 * kMB, evictable);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  }
}

// RESOURCE_EXHAUSTED (507) when evicting every evictable model would not make room; the
// message gives the numbers.
TEST(EvictionPolicyTest, ImpossibleLoadIsResourceExhausted) {
  for (Store& store : BothPolicies(1 * kGB)) {
    SCOPED_TRACE(store.policy_name());
    store.Load("a", 400 * kMB, 1.0);
    store.Use("a");
    auto too_big = store.Victims(1100 * kMB);
    ASSERT_FALSE(too_big.ok());
    EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(too_big.status().message(), HasSubstr("1100000000 bytes"));
    EXPECT_THAT(too_big.status().message(), HasSubstr("budget of 1000000000 bytes"));
    EXPECT_THAT(*store.Victims(1 * kGB), ElementsAre("a"));  // exactly the budget fits
    auto nothing_evictable = store.Victims(700 * kMB, [](const std::string&) { return false; });
    ASSERT_FALSE(nothing_evictable.ok());
    EXPECT_EQ(nothing_evictable.status().code(), absl::StatusCode::kResourceExhausted);
  }
}

// A model that comes back after an eviction keeps its request count: it is not evicted again
// in favour of a model used less. Without history it would be (the thrashing history stops).
TEST(EvictionPolicyTest, HistorySurvivesEviction) {
  for (size_t history : {size_t{4096}, size_t{0}}) {
    SCOPED_TRACE(history);
    CostAwareOptions options;
    options.history_limit = history;
    Store store = CostAware(200 * kMB, options);
    store.Load("regular", 100 * kMB, 0.5);
    store.Use("regular", 5);
    store.Unload("regular");
    store.Load("other", 100 * kMB, 0.5);
    store.Use("other", 2);
    store.Load("regular", 100 * kMB, 0.5);
    store.Use("regular");
    EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre(history > 0 ? "other" : "regular"));
  }
}

// History is bounded: past the limit the model unloaded longest ago is forgotten.
TEST(EvictionPolicyTest, HistoryIsBounded) {
  CostAwareOptions options;
  options.history_limit = 2;
  Store store = CostAware(200 * kMB, options);
  for (const char* name : {"first", "second", "third"}) {
    store.Load(name, 100 * kMB, 0.5);
    store.Use(name, 5);
    store.Unload(name);  // "first" is forgotten when "third" goes
  }
  store.Load("other", 100 * kMB, 0.5);
  store.Use("other", 2);
  store.Load("first", 100 * kMB, 0.5);
  store.Use("first");
  EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("first"));  // new again: 1 request
  store.Unload("first");
  store.Load("third", 100 * kMB, 0.5);
  store.Use("third");
  EXPECT_THAT(*store.Victims(100 * kMB), ElementsAre("other"));  // remembered: 6 requests
}

// The model store may report a request before the load or an unload twice; neither confuses
// the policy. A reload updates the size the policy counts on.
TEST(EvictionPolicyTest, StrayCallsAreIgnoredAndReloadsUpdateTheSize) {
  for (Store& store : BothPolicies(1 * kGB)) {
    SCOPED_TRACE(store.policy_name());
    store.Use("never-loaded");
    store.Load("gone", 100 * kMB, 0.5);
    store.Use("gone");
    store.Unload("gone");
    store.Unload("gone");
    store.Load("grown", 300 * kMB, 0.5);
    store.Use("grown");
    store.Load("kept", 100 * kMB, 0.5);
    store.Use("kept", 10);
    store.Load("grown", 800 * kMB, 0.5);  // reloaded, larger: alone it frees enough
    store.Use("kept");
    EXPECT_THAT(*store.Victims(500 * kMB), ElementsAre("grown"));
  }
}

}  // namespace
}  // namespace inferd::repository
