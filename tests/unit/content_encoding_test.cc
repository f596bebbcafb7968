// Response compression: whatever the slicing, the answer is one ordinary gzip member or zlib
// stream that zlib inflates back to the input, with no bytes after its end.
#include "frontends/http/content_encoding.h"

#include <zlib.h>

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace inferd::http {
namespace {

// Inflates one stream (gzip or zlib wrapper); fails the test on bytes after its end, which a
// client that reads one gzip member (curl) would drop.
std::string InflateOne(const std::string& in, bool gzip) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, gzip ? 15 + 16 : 15), Z_OK);
  std::string out;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  char buf[65536];
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - z.avail_out);
  }
  EXPECT_EQ(rc, Z_STREAM_END) << z.msg;
  EXPECT_EQ(z.avail_in, 0u) << "bytes after the end of the stream";
  inflateEnd(&z);
  return out;
}

// JSON numbers as inferd prints them: compressible, but not trivially.
std::string JsonNumbers(size_t bytes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  std::string s = "[";
  while (s.size() < bytes) {
    s += std::to_string(d(rng));
    s += ',';
  }
  s.back() = ']';
  return s;
}

TEST(CompressTest, RoundTripsInAnySlicingAndPieces) {
  const std::string text = JsonNumbers(3 << 20);
  std::string noise(200000, '\0');
  std::mt19937 rng(1);
  for (char& c : noise) c = static_cast<char>(rng());
  for (ContentCoding coding : {ContentCoding::kGzip, ContentCoding::kDeflate}) {
    const bool gzip = coding == ContentCoding::kGzip;
    for (size_t slices : {1, 2, 3, 4, 7}) {
      // One piece; a header piece and binary tails; an empty piece in the middle.
      const std::vector<std::vector<std::string_view>> inputs = {
          {text},
          {std::string_view(text).substr(0, 1000), noise, std::string_view(text).substr(1000)},
          {std::string_view(text).substr(0, 5), "", std::string_view(text).substr(5, 70000)},
      };
      for (const auto& pieces : inputs) {
        std::string joined;
        for (auto p : pieces) joined.append(p);
        auto out = CompressInSlices(coding, pieces, slices);
        ASSERT_TRUE(out.has_value());
        EXPECT_LT(out->size(), joined.size());
        EXPECT_EQ(InflateOne(*out, gzip), joined) << "slices " << slices;
      }
    }
  }
}

TEST(CompressTest, TinyAndEmptyInputs) {
  for (ContentCoding coding : {ContentCoding::kGzip, ContentCoding::kDeflate}) {
    const bool gzip = coding == ContentCoding::kGzip;
    for (size_t slices : {1, 3}) {
      for (std::string s : {std::string(), std::string("{}"), std::string("x")}) {
        auto out = CompressInSlices(coding, {s}, slices);
        ASSERT_TRUE(out.has_value());
        EXPECT_EQ(InflateOne(*out, gzip), s);
      }
      auto none = CompressInSlices(coding, {}, slices);
      ASSERT_TRUE(none.has_value());
      EXPECT_EQ(InflateOne(*none, gzip), "");
    }
  }
  EXPECT_FALSE(Compress(ContentCoding::kIdentity, {"abc"}).has_value());
}

// Slices are primed with the window before them, so slicing costs almost nothing in size.
TEST(CompressTest, SlicesCompressAlmostAsWellAsOneStream) {
  const std::string text = JsonNumbers(2 << 20);
  const size_t one = CompressInSlices(ContentCoding::kGzip, {text}, 1)->size();
  const size_t four = CompressInSlices(ContentCoding::kGzip, {text}, 4)->size();
  EXPECT_LT(static_cast<double>(four), one * 1.01);
  const std::string small = JsonNumbers(100000);  // LZ77 below the parallel size
  EXPECT_LT(CompressInSlices(ContentCoding::kGzip, {small}, 4)->size(),
            CompressInSlices(ContentCoding::kGzip, {small}, 1)->size() * 1.05);
}

}  // namespace
}  // namespace inferd::http
