// Fuzzes the HTTP/1.1 request parser, including chunked bodies, with tight limits so the
// limit paths are reached too.
#include <cstddef>
#include <cstdint>
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
  while (!input.empty()) {
    auto r = inferd::http::ParseHttpRequest(input, limits, &request, &chunked);
    if (r.state != inferd::http::ParseState::kComplete || r.consumed == 0) break;
    (void)request.Header("content-type");
    input.remove_prefix(r.consumed);
  }
  return 0;
}
