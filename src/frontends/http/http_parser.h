// An HTTP/1.1 request parser: a pure function of the bytes received so far, so it is unit-
// tested and fuzzed without sockets. Views point into the caller's buffer; nothing is copied.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "core/cancellation.h"

namespace inferd::http {

struct HttpRequest {
  std::string_view method;
  std::string_view target;  // path and query, as sent
  std::string_view path;
  std::string_view query;
  int minor_version = 1;
  // Inline up to 16 fields: no allocation for a usual request.
  absl::InlinedVector<std::pair<std::string_view, std::string_view>, 16> headers;
  std::string_view body;
  bool keep_alive = true;
  bool expect_continue = false;
  // Cancelled by the event loop when the client disconnects before its answer is written
  // (core/cancellation.h); handlers hand it to the InferRequest. Null outside a server.
  std::shared_ptr<core::CancellationToken> cancel;

  // Case-insensitive header lookup.
  std::optional<std::string_view> Header(std::string_view name) const;
};

struct ParserLimits {
  size_t max_header_bytes = 64 * 1024;
  size_t max_body_bytes = 64 * 1024 * 1024;
};

enum class ParseState {
  kComplete,          // `request` is filled; `consumed` bytes form it
  kNeedMore,          // headers or body incomplete
  kError,             // malformed; answer `error_status` and close
};

struct ParseResult {
  ParseState state = ParseState::kNeedMore;
  size_t consumed = 0;
  // With kNeedMore once the headers are complete: the whole request's size, so the caller can
  // reserve the buffer, and whether the client waits for "100 Continue".
  size_t expected_total = 0;
  bool headers_complete = false;
  bool expect_continue = false;
  int error_status = 0;
  std::string error;
};

// A chunked body decoded in place (DecodeChunkedInPlace): the server's read buffer becomes the
// body, with no second copy of it.
struct ChunkedDecoder {
  bool active = false;     // the headers announced a chunked body; decoding is under way
  size_t body_start = 0;   // just past the headers
  size_t body_end = 0;     // buffer[body_start, body_end) is the body decoded so far
  size_t chunk_left = 0;   // payload bytes of the current chunk still to come
  enum class Phase { kSize, kData, kDataEnd, kTrailers } phase = Phase::kSize;
};

// With `Transfer-Encoding: chunked`: given `in_place`, the headers are parsed, `*in_place` is
// set up (active) and the result is kNeedMore with headers_complete, for DecodeChunkedInPlace
// to go on; else, given `chunked_body`, the decoded body is written to it and `request->body`
// views it; with neither such a request is answered 501.
ParseResult ParseHttpRequest(std::string_view buffer, const ParserLimits& limits,
                             HttpRequest* request, std::string* chunked_body = nullptr,
                             ChunkedDecoder* in_place = nullptr);

// Decodes the chunked body in buffer[0, *size) as far as it has arrived, in place: each chunk's
// payload is moved down over the framing before it, so buffer[body_start, body_end) is the body
// so far and *size shrinks to body_end plus what is left undecoded (a partial size line). Each
// byte moves at most once. kComplete: the body is whole, whatever followed the request now
// starts at body_end and `consumed` is body_end. Errors as ParseHttpRequest's (400, 413).
ParseResult DecodeChunkedInPlace(char* buffer, size_t* size, const ParserLimits& limits,
                                 ChunkedDecoder* decoder);

// Decodes %XX escapes; nullopt when an escape is malformed.
std::optional<std::string> PercentDecode(std::string_view s);

}  // namespace inferd::http
