#include "frontends/http/content_encoding.h"

#include <zlib.h>

#include <cstdlib>
#include <vector>

#include "common/strings.h"

namespace inferd::http {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<std::string> DecodeBody(std::string_view content_encoding, std::string_view body,
                                       size_t max_bytes) {
  const std::string_view coding = Trim(content_encoding);
  if (coding.empty() || EqualsIgnoreCase(coding, "identity")) return std::string(body);
  if (!EqualsIgnoreCase(coding, "gzip") && !EqualsIgnoreCase(coding, "deflate")) {
    return absl::InvalidArgumentError(StrCat(
        "unsupported Content-Encoding '", coding, "' (gzip, deflate and identity are)"));
  }
  z_stream z{};
  // 15 + 32: a zlib or a gzip header, detected; a raw deflate stream (what some clients send
  // as "deflate") is retried with -15 below.
  for (int window_bits : {15 + 32, -15}) {
    z = z_stream{};
    if (inflateInit2(&z, window_bits) != Z_OK) return absl::InternalError("zlib: inflateInit2 failed");
    std::string out;
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data()));
    z.avail_in = static_cast<uInt>(body.size());
    int rc = Z_OK;
    char chunk[64 * 1024];
    while (rc == Z_OK) {
      z.next_out = reinterpret_cast<Bytef*>(chunk);
      z.avail_out = sizeof(chunk);
      rc = inflate(&z, Z_NO_FLUSH);
      out.append(chunk, sizeof(chunk) - z.avail_out);
      if (out.size() > max_bytes) {
        inflateEnd(&z);
        return absl::OutOfRangeError(StrCat("the ", coding, " body inflates past the ",
                                            max_bytes, "-byte limit"));
      }
      if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // truncated
    }
    inflateEnd(&z);
    if (rc == Z_STREAM_END) return out;
    if (window_bits < 0 || !EqualsIgnoreCase(coding, "deflate")) {
      return absl::InvalidArgumentError(StrCat(
          "the request body is not valid ", coding, " data (Content-Encoding: ", coding, ")",
          rc == Z_BUF_ERROR ? ": it ends early" : ""));
    }
  }
  return absl::InvalidArgumentError("unreachable");
}

ContentCoding ChooseResponseCoding(std::string_view accept_encoding) {
  ContentCoding best = ContentCoding::kIdentity;
  double best_q = 0;
  while (!accept_encoding.empty()) {
    const size_t comma = accept_encoding.find(',');
    std::string_view item = accept_encoding.substr(0, comma);
    accept_encoding = comma == std::string_view::npos ? "" : accept_encoding.substr(comma + 1);
    double q = 1;
    if (const size_t semi = item.find(';'); semi != std::string_view::npos) {
      std::string_view param = Trim(item.substr(semi + 1));
      if (param.size() > 2 && (param[0] == 'q' || param[0] == 'Q') && param[1] == '=') {
        q = std::strtod(std::string(param.substr(2)).c_str(), nullptr);
      }
      item = item.substr(0, semi);
    }
    item = Trim(item);
    ContentCoding coding;
    if (EqualsIgnoreCase(item, "gzip")) {
      coding = ContentCoding::kGzip;
    } else if (EqualsIgnoreCase(item, "deflate")) {
      coding = ContentCoding::kDeflate;
    } else {
      continue;
    }
    if (q > best_q) {  // the first listed wins a tie
      best = coding;
      best_q = q;
    }
  }
  return best;
}

void CompressResponse(ContentCoding coding, HttpResponse* response) {
  if (coding == ContentCoding::kIdentity || response->stream != HttpResponse::Stream::kWhole) return;
  z_stream z{};
  // gzip: 15 + 16 writes the gzip wrapper; deflate: the zlib wrapper (RFC 9110's "deflate").
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED,
                   coding == ContentCoding::kGzip ? 15 + 16 : 15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return;  // answer uncompressed
  }
  std::vector<std::string_view> pieces{response->body};
  pieces.insert(pieces.end(), response->tail.begin(), response->tail.end());
  size_t total = 0;
  for (auto p : pieces) total += p.size();
  std::string out;
  out.resize(deflateBound(&z, total) + 64);
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  int rc = Z_OK;
  for (size_t i = 0; i < pieces.size() && rc == Z_OK; ++i) {
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(pieces[i].data()));
    z.avail_in = static_cast<uInt>(pieces[i].size());
    rc = deflate(&z, i + 1 == pieces.size() ? Z_FINISH : Z_NO_FLUSH);
  }
  if (pieces.empty()) rc = deflate(&z, Z_FINISH);
  const size_t written = out.size() - z.avail_out;
  deflateEnd(&z);
  if (rc != Z_STREAM_END) return;  // answer uncompressed
  out.resize(written);
  response->body = std::move(out);
  response->tail.clear();
  response->holders.clear();
  response->headers.emplace_back("Content-Encoding",
                                 coding == ContentCoding::kGzip ? "gzip" : "deflate");
}

}  // namespace inferd::http
