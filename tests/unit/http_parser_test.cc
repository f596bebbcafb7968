#include "frontends/http/http_parser.h"

#include <cstdio>
#include <cstring>

#include "common/strings.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::http {
namespace {

using ::testing::HasSubstr;

TEST(HttpParserTest, ParsesRequestWithBody) {
  std::string raw =
      "POST /v2/models/simple/infer?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
      "Inference-Header-Content-Length: 2\r\n\r\nabcdNEXT";
  HttpRequest req;
  ParseResult r = ParseHttpRequest(raw, {}, &req);
  ASSERT_EQ(r.state, ParseState::kComplete);
  EXPECT_EQ(r.consumed, raw.size() - 4);
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/v2/models/simple/infer");
  EXPECT_EQ(req.query, "x=1");
  EXPECT_EQ(req.body, "abcd");
  EXPECT_TRUE(req.keep_alive);
  EXPECT_EQ(req.Header("inference-header-content-length").value_or(""), "2");
  EXPECT_FALSE(req.Header("missing").has_value());
}

TEST(HttpParserTest, IncompleteHeadersAndBodyNeedMore) {
  HttpRequest req;
  EXPECT_EQ(ParseHttpRequest("GET / HTTP/1.1\r\nHost:", {}, &req).state, ParseState::kNeedMore);
  ParseResult r = ParseHttpRequest(
      "POST / HTTP/1.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\nabc", {}, &req);
  EXPECT_EQ(r.state, ParseState::kNeedMore);
  EXPECT_TRUE(r.headers_complete);
  EXPECT_TRUE(r.expect_continue);
  EXPECT_EQ(r.expected_total, r.expected_total);
}

TEST(HttpParserTest, ConnectionCloseAndHttp10) {
  HttpRequest req;
  ASSERT_EQ(ParseHttpRequest("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", {}, &req).state,
            ParseState::kComplete);
  EXPECT_FALSE(req.keep_alive);
  ASSERT_EQ(ParseHttpRequest("GET / HTTP/1.0\r\n\r\n", {}, &req).state, ParseState::kComplete);
  EXPECT_FALSE(req.keep_alive);
  ASSERT_EQ(ParseHttpRequest("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", {}, &req).state,
            ParseState::kComplete);
  EXPECT_TRUE(req.keep_alive);
}

TEST(HttpParserTest, RejectsMalformedRequests) {
  struct Case {
    std::string raw;
    int status;
    const char* message;
  } cases[] = {
      {"GARBAGE\r\n\r\n", 400, "request line"},
      {"GET / HTTP/2.0\r\n\r\n", 505, "HTTP/1"},
      {"GET nopath HTTP/1.1\r\n\r\n", 400, "absolute path"},
      {"GET / HTTP/1.1\r\nbad header\r\n\r\n", 400, "header"},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "conflicting"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"},
      {"POST / HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n", 413, "--http-max-input-size"},
  };
  for (const auto& c : cases) {
    HttpRequest req;
    ParseResult r = ParseHttpRequest(c.raw, {}, &req);
    EXPECT_EQ(r.state, ParseState::kError) << c.raw;
    EXPECT_EQ(r.error_status, c.status) << c.raw;
    EXPECT_THAT(r.error, HasSubstr(c.message)) << c.raw;
  }
}

TEST(HttpParserTest, ChunkedBodyIsDecoded) {
  std::string raw =
      "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  HttpRequest req;
  std::string body;
  for (size_t cut = 0; cut < raw.size() - 4; ++cut) {
    EXPECT_EQ(ParseHttpRequest(std::string_view(raw).substr(0, cut), {}, &req, &body).state,
              ParseState::kNeedMore) << cut;
  }
  ParseResult r = ParseHttpRequest(raw, {}, &req, &body);
  ASSERT_EQ(r.state, ParseState::kComplete);
  EXPECT_EQ(req.body, "abcdefg");
  EXPECT_EQ(r.consumed, raw.size() - 4);
  EXPECT_EQ(ParseHttpRequest("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", {}, &req, &body).error_status, 400);
  // Without a place to decode into, chunked bodies are refused.
  EXPECT_EQ(ParseHttpRequest("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", {}, &req).error_status, 501);
}

// The server's way (issue 19): the chunked body decoded in place as it arrives, in pieces of
// any size; the body ends in the buffer itself, behind the headers, and what follows the request
// (a pipelined one) is kept just after it. Same body and errors as the copying decoder.
TEST(HttpParserTest, ChunkedBodyIsDecodedInPlace) {
  std::string raw = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n";
  std::string want;
  for (int i = 0; i < 40; ++i) {
    std::string payload;
    for (int j = 0; j < (i * 37) % 300 + 1; ++j) payload.push_back(static_cast<char>('a' + (i + j) % 26));
    char size_line[32];
    std::snprintf(size_line, sizeof(size_line), "%zx%s\r\n", payload.size(), i % 3 ? "" : ";name=value");
    raw += inferd::StrCat(size_line, payload, "\r\n");
    want += payload;
  }
  raw += "0\r\nTrailer: x\r\n\r\nGET /next HTTP/1.1\r\n\r\n";
  for (size_t step : {1, 2, 3, 7, 64, 1000, 100000}) {
    std::string buf(raw.size(), '\0');
    size_t size = 0, fed = 0;
    ChunkedDecoder d;
    HttpRequest req;
    ParseResult r;
    while (fed < raw.size()) {
      const size_t n = std::min(step, raw.size() - fed);
      std::memcpy(buf.data() + size, raw.data() + fed, n);
      size += n;
      fed += n;
      if (!d.active) {
        r = ParseHttpRequest(std::string_view(buf.data(), size), {}, &req, nullptr, &d);
        ASSERT_NE(r.state, ParseState::kError);
        if (!d.active) continue;
        EXPECT_TRUE(r.expect_continue);
      }
      r = DecodeChunkedInPlace(buf.data(), &size, {}, &d);
      ASSERT_NE(r.state, ParseState::kError) << r.error;
      EXPECT_LE(size, d.body_end + 1024) << "undecoded bytes are only a partial size line";
      if (r.state == ParseState::kComplete) break;
    }
    ASSERT_EQ(r.state, ParseState::kComplete) << step;
    EXPECT_EQ(std::string_view(buf.data() + d.body_start, d.body_end - d.body_start), want) << step;
    EXPECT_EQ(r.consumed, d.body_end);
    EXPECT_EQ(std::string(buf.data() + d.body_end, size - d.body_end) + raw.substr(fed),
              "GET /next HTTP/1.1\r\n\r\n") << step;
    // The headers are still there for a second look.
    ChunkedDecoder again;
    HttpRequest head;
    ParseHttpRequest(std::string_view(buf.data(), d.body_start), {}, &head, nullptr, &again);
    EXPECT_EQ(head.path, "/x");
  }
  // Errors, as the copying decoder gives them.
  ParserLimits small;
  small.max_body_bytes = 8;
  for (auto [body, status] : std::vector<std::pair<std::string, int>>{
           {"zz\r\n", 400}, {"3\r\nabcX\r\n", 400}, {"5\r\nabcde\r\n5\r\nfghij\r\n", 413},
           {std::string(2000, '1'), 400}}) {
    std::string buf = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + body;
    ChunkedDecoder d;
    HttpRequest req;
    ParseHttpRequest(buf, small, &req, nullptr, &d);
    ASSERT_TRUE(d.active);
    size_t size = buf.size();
    ParseResult r = DecodeChunkedInPlace(buf.data(), &size, small, &d);
    EXPECT_EQ(r.state, ParseState::kError) << body;
    EXPECT_EQ(r.error_status, status) << body;
    std::string copy;
    EXPECT_EQ(ParseHttpRequest("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + body, small,
                               &req, &copy).error_status, status) << body;
  }
}

// RFC 9112 section 2.2: a server may take a bare LF as a line terminator (and ignore a CR
// before it). Requests from netcat or hand-written clients end their lines so; they are parsed
// the same as with CRLF, and at once, not left waiting for an empty line that never comes.
TEST(HttpParserTest, AcceptsBareLfLineEnds) {
  for (const std::string raw : {
           std::string("POST /v2/models/m/infer?x=1 HTTP/1.1\nHost: a\nContent-Length: 4\n\nabcdNEXT"),
           std::string("POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: a\nContent-Length: 4\r\n\nabcdNEXT"),
           std::string("\nPOST /v2/models/m/infer?x=1 HTTP/1.1\nHost: a\nContent-Length: 4\r\n\r\nabcdNEXT")}) {
    HttpRequest req;
    ParseResult r = ParseHttpRequest(raw, {}, &req);
    ASSERT_EQ(r.state, ParseState::kComplete) << raw;
    EXPECT_EQ(r.consumed, raw.size() - 4) << raw;
    EXPECT_EQ(req.method, "POST");
    EXPECT_EQ(req.path, "/v2/models/m/infer");
    EXPECT_EQ(req.query, "x=1");
    EXPECT_EQ(req.Header("host").value_or(""), "a");
    EXPECT_EQ(req.Header("content-length").value_or(""), "4") << "no CR left in the value";
    EXPECT_EQ(req.body, "abcd");
  }
  HttpRequest req;
  EXPECT_EQ(ParseHttpRequest("GET / HTTP/1.1\nHost: a\n", {}, &req).state, ParseState::kNeedMore);
  ParseResult get = ParseHttpRequest("GET /v2/health/live HTTP/1.0\n\n", {}, &req);
  ASSERT_EQ(get.state, ParseState::kComplete);
  EXPECT_EQ(req.path, "/v2/health/live");
  EXPECT_FALSE(req.keep_alive);
  // A CR that does not end a line is still refused.
  EXPECT_EQ(ParseHttpRequest("GET / HTTP/1.1\nX: a\rb\n\n", {}, &req).error_status, 400);
  // Chunked bodies with LF line ends, by both decoders.
  const std::string chunked =
      "POST /x HTTP/1.1\nTransfer-Encoding: chunked\n\n3\nabc\n2;ext=1\r\nde\n0\nT: x\n\nNEXT";
  std::string body;
  ParseResult copied = ParseHttpRequest(chunked, {}, &req, &body);
  ASSERT_EQ(copied.state, ParseState::kComplete) << copied.error;
  EXPECT_EQ(req.body, "abcde");
  EXPECT_EQ(chunked.substr(copied.consumed), "NEXT");
  std::string buf = chunked;
  ChunkedDecoder d;
  ParseHttpRequest(buf, {}, &req, nullptr, &d);
  ASSERT_TRUE(d.active);
  size_t size = buf.size();
  ParseResult r = DecodeChunkedInPlace(buf.data(), &size, {}, &d);
  ASSERT_EQ(r.state, ParseState::kComplete) << r.error;
  EXPECT_EQ(std::string_view(buf.data() + d.body_start, d.body_end - d.body_start), "abcde");
  EXPECT_EQ(std::string(buf.data() + d.body_end, size - d.body_end), "NEXT");
}

TEST(HttpParserTest, HeaderLimit) {
  ParserLimits limits;
  limits.max_header_bytes = 64;
  HttpRequest req;
  std::string raw = "GET / HTTP/1.1\r\nX: " + std::string(100, 'a');
  ParseResult r = ParseHttpRequest(raw, limits, &req);
  EXPECT_EQ(r.state, ParseState::kError);
  EXPECT_EQ(r.error_status, 431);
}

TEST(HttpParserTest, PercentDecode) {
  EXPECT_EQ(PercentDecode("a%2Fb").value_or(""), "a/b");
  EXPECT_FALSE(PercentDecode("a%2").has_value());
  EXPECT_FALSE(PercentDecode("a%zz").has_value());
  EXPECT_FALSE(PercentDecode("%").has_value());
}

}  // namespace
}  // namespace inferd::http
