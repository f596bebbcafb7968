// Fuzzes the HTTP/1.1 request parser, including chunked bodies, with tight limits so the
// limit paths are reached too.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "frontends/http/http_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  inferd::http::ParserLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_body_bytes = 1 << 16;
  inferd::http::HttpRequest request;
  std::string chunked;
  // Parse as a pipeline: every complete request, then whatever is left.
  const std::string_view whole = input;
  while (!input.empty()) {
    auto r = inferd::http::ParseHttpRequest(input, limits, &request, &chunked);
    if (r.state != inferd::http::ParseState::kComplete || r.consumed == 0) break;
    (void)request.Header("content-type");
    input.remove_prefix(r.consumed);
  }
  // The server's way for a chunked body: decoded in place as the bytes arrive (here in pieces
  // of a size taken from the input); it must agree with the copying decoder above.
  if (whole.empty()) return 0;
  const size_t step = static_cast<unsigned char>(whole[0]) % 64 + 1;
  std::string buf(whole.size(), '\0');
  size_t have = 0, fed = 0;
  inferd::http::ChunkedDecoder d;
  inferd::http::ParseResult r;
  while (fed < whole.size()) {
    const size_t n = std::min(step, whole.size() - fed);
    std::memcpy(buf.data() + have, whole.data() + fed, n);
    have += n;
    fed += n;
    if (!d.active) {
      r = inferd::http::ParseHttpRequest(std::string_view(buf.data(), have), limits, &request,
                                         nullptr, &d);
      if (r.state != inferd::http::ParseState::kNeedMore) return 0;
      if (!d.active) continue;
    }
    r = inferd::http::DecodeChunkedInPlace(buf.data(), &have, limits, &d);
    if (r.state != inferd::http::ParseState::kNeedMore) break;
  }
  inferd::http::HttpRequest copied;
  std::string body;
  const auto c = inferd::http::ParseHttpRequest(whole, limits, &copied, &body);
  if (d.active && r.state == inferd::http::ParseState::kComplete) {
    if (c.state != inferd::http::ParseState::kComplete ||
        std::string_view(buf.data() + d.body_start, d.body_end - d.body_start) != body) {
      __builtin_trap();
    }
  } else if (d.active && r.state == inferd::http::ParseState::kError && r.error_status != 431) {
    // (431: trailers past the header limit, which only the in-place decoder bounds.)
    if (c.state != inferd::http::ParseState::kError || c.error_status != r.error_status) __builtin_trap();
  }
  return 0;
}
