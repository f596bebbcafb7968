// HTTP content codings for inference bodies, as Triton's HTTP frontend applies them:
// `Content-Encoding: gzip|deflate` request bodies are inflated before parsing, and a response
// is compressed with the coding the client's `Accept-Encoding` prefers (gzip or deflate, by
// q-value; identity otherwise). Inference-Header-Content-Length always counts the
// uncompressed JSON header. zlib; pure functions, safe from any thread.
#pragma once

#include <string>
#include <string_view>

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

// Compresses body + tail into `body` (tail and holders cleared) and adds Content-Encoding.
// Leaves a streamed response, or one with the identity coding, as it is.
void CompressResponse(ContentCoding coding, HttpResponse* response);

}  // namespace inferd::http
