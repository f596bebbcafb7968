// HTTP content codings for inference bodies, as Triton's HTTP frontend applies them:
// `Content-Encoding: gzip|deflate` request bodies are inflated before parsing, and a response
// is compressed with the coding the client's `Accept-Encoding` prefers (gzip or deflate, by
// q-value; identity otherwise). Inference-Header-Content-Length always counts the
// uncompressed JSON header. zlib; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "frontends/http/http_server.h"

namespace inferd::http {

enum class ContentCoding { kIdentity, kGzip, kDeflate };

// The inflated body. INVALID_ARGUMENT for an unknown coding or a corrupt stream (naming which),
// OUT_OF_RANGE when it inflates past `max_bytes` (answer 413).
absl::StatusOr<std::string> DecodeBody(std::string_view content_encoding, std::string_view body,
                                       size_t max_bytes);

// The coding to answer with for an Accept-Encoding header value ("gzip;q=0.5, deflate").
ContentCoding ChooseResponseCoding(std::string_view accept_encoding);

// `pieces`, concatenated, as one gzip member (RFC 1952) or zlib stream (RFC 1950, HTTP's
// "deflate") at deflate level 1, or Huffman coding only for a large input (a tensor's numbers),
// which is also compressed in slices on the slice helpers (parallel_slices.h). nullopt for the identity coding or a zlib failure.
std::optional<std::string> Compress(ContentCoding coding,
                                    const std::vector<std::string_view>& pieces);
// The same in exactly `slices` slices (>= 1), whatever the size; for tests.
std::optional<std::string> CompressInSlices(ContentCoding coding,
                                            const std::vector<std::string_view>& pieces,
                                            size_t slices);

// Compresses body + tail into `body` (tail and holders cleared) and adds Content-Encoding.
// Leaves a streamed response, or one with the identity coding, as it is.
void CompressResponse(ContentCoding coding, HttpResponse* response);

}  // namespace inferd::http
