// The serving map: what a lookup finds after publish and unpublish, which version it picks, the
// uses it counts, and lookups on other threads while one publishes (every answer is one the
// writer published, whatever the interleaving).
#include "repository/serving_map.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace inferd::repository {
namespace {

struct FakeModel {
  int64_t version;
};
using Map = BasicServingMap<FakeModel>;

std::shared_ptr<const FakeModel> M(int64_t version) {
  return std::make_shared<const FakeModel>(FakeModel{version});
}

Map::Versions Of(std::initializer_list<int64_t> versions) {
  Map::Versions out;
  for (int64_t v : versions) out.emplace(v, M(v));
  return out;
}

TEST(ServingMapTest, PublishLookupUnpublish) {
  Map map;
  EXPECT_EQ(map.Find("m", -1, false), nullptr);
  map.Publish("m", Of({1}), nullptr);
  auto found = map.Find("m", -1, false);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->version, 1);
  EXPECT_EQ(map.Find("other", -1, false), nullptr);
  map.Unpublish("m");
  EXPECT_EQ(map.Find("m", -1, false), nullptr);
  EXPECT_TRUE(map.ReadyVersions("m").empty());
  map.Unpublish("m");  // twice: nothing to do
}

TEST(ServingMapTest, PublishingNoVersionsUnpublishes) {
  Map map;
  map.Publish("m", Of({1}), nullptr);
  map.Publish("m", {}, nullptr);
  EXPECT_EQ(map.Find("m", -1, false), nullptr);
  EXPECT_TRUE(map.All().empty());
}

TEST(ServingMapTest, ARepublishReplacesTheWholeSet) {
  Map map;
  map.Publish("m", Of({1, 2}), nullptr);
  map.Publish("m", Of({3}), nullptr);
  EXPECT_EQ(map.Find("m", 1, false), nullptr);
  EXPECT_EQ(map.Find("m", 2, false), nullptr);
  ASSERT_NE(map.Find("m", 3, false), nullptr);
  ASSERT_EQ(map.ReadyVersions("m").size(), 1u);
}

TEST(ServingMapTest, NegativeVersionIsTheNewestReadyOtherwiseExactly) {
  Map map;
  map.Publish("m", Of({1, 3, 2}), nullptr);
  EXPECT_EQ(map.Find("m", -1, false)->version, 3);
  EXPECT_EQ(map.Find("m", 1, false)->version, 1);
  EXPECT_EQ(map.Find("m", 2, false)->version, 2);
  EXPECT_EQ(map.Find("m", 3, false)->version, 3);
  // Version 0 is a version like any other (the store's callers map "no version" to -1).
  EXPECT_EQ(map.Find("m", 0, false), nullptr);
  EXPECT_EQ(map.Find("m", 4, false), nullptr);
  std::vector<int64_t> ascending;
  for (const auto& model : map.ReadyVersions("m")) ascending.push_back(model->version);
  EXPECT_EQ(ascending, (std::vector<int64_t>{1, 2, 3}));
}

TEST(ServingMapTest, TheSameModelIsReturned) {
  Map map;
  auto model = M(7);
  map.Publish("m", {{7, model}}, nullptr);
  EXPECT_EQ(map.Find("m", 7, false).get(), model.get());
  // The map holds a reference: the store counts it when it asks whether a request holds one.
  EXPECT_EQ(model.use_count(), 2);
  map.Clear();
  EXPECT_EQ(model.use_count(), 1);
  EXPECT_EQ(map.Find("m", 7, false), nullptr);
}

TEST(ServingMapTest, OnlyRequestLookupsCountUses) {
  Map map;
  auto usage = std::make_shared<ModelUsage>();
  map.Publish("m", Of({1}), usage);
  ASSERT_NE(map.Find("m", -1, /*count_use=*/false), nullptr);
  EXPECT_EQ(usage->uses.load(), 0u);
  EXPECT_EQ(usage->last_used_ns.load(), 0u);
  ASSERT_NE(map.Find("m", 1, /*count_use=*/true), nullptr);
  ASSERT_NE(map.Find("m", -1, /*count_use=*/true), nullptr);
  EXPECT_EQ(usage->uses.load(), 2u);
  EXPECT_GT(usage->last_used_ns.load(), 0u);
  EXPECT_EQ(map.Find("m", 5, /*count_use=*/true), nullptr);  // a miss is no use
  EXPECT_EQ(usage->uses.load(), 2u);
}

TEST(ServingMapTest, AllListsEveryServedVersion) {
  Map map;
  map.Publish("a", Of({1, 2}), nullptr);
  map.Publish("b", Of({5}), nullptr);
  EXPECT_EQ(map.All().size(), 3u);
}

// One thread publishes versions 1..N of "m" (each publish serves versions {v-1, v}) and then
// unpublishes; others look "m" up all along. Whatever the interleaving, a lookup finds either
// nothing or a model the writer published for what was asked, and the newest version a reader
// sees never goes back. Readers stop when the writer is done, not after a time.
TEST(ServingMapTest, LookupsWhilePublishingSeeOnlyPublishedSets) {
  Map map;
  constexpr int64_t kVersions = 2000;
  std::atomic<bool> done{false};
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> found_any{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      int64_t newest_seen = 0;
      while (!done.load(std::memory_order_acquire)) {
        if (auto newest = map.Find("m", -1, true)) {
          if (newest->version < newest_seen) ++errors;  // went back
          newest_seen = newest->version;
          ++found_any;
          // The version below the newest is served in the same set (except for version 1).
          const int64_t below = newest->version - 1;
          if (below >= 1) {
            auto older = map.Find("m", below, false);
            // Published later sets no longer hold `below` ({below+1, below+2}...): null is fine,
            // a wrong model is not.
            if (older && older->version != below) ++errors;
          }
        }
        if (auto exact = map.Find("m", 1 + r, false); exact && exact->version != 1 + r) ++errors;
        for (const auto& model : map.ReadyVersions("m")) {
          if (model->version < 1 || model->version > kVersions) ++errors;
        }
      }
    });
  }
  auto usage = std::make_shared<ModelUsage>();
  for (int64_t v = 1; v <= kVersions; ++v) {
    Map::Versions set = Of({v});
    if (v > 1) set.emplace(v - 1, M(v - 1));
    map.Publish("m", std::move(set), usage);
    map.Publish("other", Of({v}), nullptr);  // writes to another key on the way
  }
  // The readers' lookups keep going until they have seen something, whatever the scheduler did.
  while (found_any.load() == 0) std::this_thread::yield();
  map.Unpublish("m");
  EXPECT_EQ(map.Find("m", -1, false), nullptr);
  done.store(true, std::memory_order_release);
  for (auto& t : readers) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(found_any.load(), 0);
  EXPECT_EQ(usage->uses.load(), static_cast<uint64_t>(found_any.load()));
  EXPECT_EQ(map.Find("other", -1, false)->version, kVersions);
}

}  // namespace
}  // namespace inferd::repository
