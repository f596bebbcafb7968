#include "server/response_cache.h"

#include <cstring>

#include "gtest/gtest.h"

namespace inferd::server {
namespace {

core::InferRequest Request(std::string_view data, std::string model = "m") {
  core::InferRequest r;
  r.model_name = std::move(model);
  r.model_version = 1;
  core::InputTensor t;
  t.name = "x";
  t.datatype = DataType::kUint8;
  t.shape = {static_cast<int64_t>(data.size())};
  t.data = data;
  r.inputs.push_back(t);
  return r;
}

core::InferResponse Response(const std::string& bytes) {
  core::InferResponse r;
  core::OutputTensor o;
  o.name = "y";
  o.datatype = DataType::kUint8;
  o.shape = {static_cast<int64_t>(bytes.size())};
  o.data = bytes;
  r.outputs.push_back(o);
  return r;
}

TEST(ResponseCacheTest, KeyCoversEveryPartOfTheRequest) {
  const std::string a = "abcd", b = "abce";
  const auto base = ResponseCache::MakeKey(Request(a));
  EXPECT_EQ(base, ResponseCache::MakeKey(Request(std::string("abcd"))));
  EXPECT_FALSE(base == ResponseCache::MakeKey(Request(b)));               // one byte
  EXPECT_FALSE(base == ResponseCache::MakeKey(Request(a, "other")));      // model
  auto r = Request(a);
  r.model_version = 2;
  EXPECT_FALSE(base == ResponseCache::MakeKey(r));                        // version
  r = Request(a);
  r.inputs[0].shape = {2, 2};
  EXPECT_FALSE(base == ResponseCache::MakeKey(r));                        // shape
  r = Request(a);
  r.inputs[0].datatype = DataType::kInt8;
  EXPECT_FALSE(base == ResponseCache::MakeKey(r));                        // datatype
  r = Request(a);
  core::RequestedOutput y;
  y.name = "y";
  r.outputs.push_back(y);
  EXPECT_FALSE(base == ResponseCache::MakeKey(r));                        // requested outputs
}

TEST(ResponseCacheTest, HitReturnsACopyThatOutlivesEviction) {
  ResponseCache cache(1000);
  const std::string d = "1";
  const auto key = ResponseCache::MakeKey(Request(d));
  EXPECT_FALSE(cache.Lookup(key).has_value());
  std::string out(100, 'a');
  ASSERT_TRUE(cache.Insert(key, Response(out)));
  out.assign(100, 'b');  // the cache copied it
  auto hit = cache.Lookup(key);
  ASSERT_TRUE(hit.has_value());
  ASSERT_EQ(hit->size(), 1u);
  EXPECT_EQ((*hit)[0].data, std::string(100, 'a'));
  // Fill the cache with others: the first is evicted but the hit's views stay valid.
  for (int i = 0; i < 20; ++i) {
    const std::string k = std::to_string(i + 10);
    cache.Insert(ResponseCache::MakeKey(Request(k)), Response(std::string(100, 'c')));
  }
  EXPECT_FALSE(cache.Lookup(key).has_value());
  EXPECT_EQ((*hit)[0].data, std::string(100, 'a'));
  const auto c = cache.GetCounters();
  EXPECT_GT(c.evictions, 0u);
  EXPECT_LE(c.bytes, 1000u);
}

TEST(ResponseCacheTest, LeastRecentlyUsedGoesFirst) {
  // Entries of ~300 bytes in a 1000-byte cache: three fit.
  ResponseCache cache(1000);
  std::vector<std::string> data = {"a", "b", "c", "d"};
  std::vector<ResponseCache::Key> keys;
  for (const auto& s : data) keys.push_back(ResponseCache::MakeKey(Request(s)));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache.Insert(keys[i], Response(std::string(100, 'x'))));
  EXPECT_EQ(cache.GetCounters().entries, 3u);
  ASSERT_TRUE(cache.Lookup(keys[0]).has_value());  // a is now the most recent; b the least
  ASSERT_TRUE(cache.Insert(keys[3], Response(std::string(100, 'x'))));
  EXPECT_TRUE(cache.Lookup(keys[0]).has_value());
  EXPECT_FALSE(cache.Lookup(keys[1]).has_value());
  EXPECT_TRUE(cache.Lookup(keys[2]).has_value());
  EXPECT_TRUE(cache.Lookup(keys[3]).has_value());
}

TEST(ResponseCacheTest, ResponseLargerThanTheCacheIsNotKept) {
  ResponseCache cache(500);
  const std::string d = "z";
  const auto key = ResponseCache::MakeKey(Request(d));
  EXPECT_FALSE(cache.Insert(key, Response(std::string(1000, 'x'))));
  EXPECT_FALSE(cache.Lookup(key).has_value());
}

TEST(ResponseCacheTest, ParseCacheConfig) {
  auto c = ParseCacheConfig({{"local", {"size", "1048576"}}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size_bytes, 1048576u);
  EXPECT_FALSE(ParseCacheConfig({{"redis", {"host", "x"}}}).ok());
  EXPECT_FALSE(ParseCacheConfig({{"local", {"size", "-1"}}}).ok());
  EXPECT_FALSE(ParseCacheConfig({{"local", {"bogus", "1"}}}).ok());
  EXPECT_TRUE(ParseCacheConfig({}).ok());
}

}  // namespace
}  // namespace inferd::server
