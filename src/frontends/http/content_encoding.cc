#include "frontends/http/content_encoding.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/strings.h"
#include "frontends/http/parallel_slices.h"

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

namespace {

// An inference answer is written once and read once, so the time spent shrinking it must stay
// below what the smaller transfer saves. Small answers: deflate level 1, as nginx's
// gzip_comp_level defaults to. Large ones (kParallelMinBytes+) are tensors, mostly JSON numbers,
// whose digits do not repeat: Huffman coding alone shrinks them as well as LZ77 does (a
// 1x3x224x224 FP32 answer: 0.468 of its size, against 0.477 at level 1 and 0.433 at zlib's
// default level 6) in 2/3 of level 1's time and 1/23 of level 6's (bench/json_gzip.sh).
constexpr int kLevel = Z_BEST_SPEED;
constexpr size_t kWindow = 32 * 1024;  // deflate's history: the dictionary a slice is primed with

// Calls fn(part) for each part of the concatenation of `pieces` within [from, to).
template <typename Fn>
void ForEachPart(const std::vector<std::string_view>& pieces, size_t from, size_t to, Fn&& fn) {
  size_t at = 0;
  for (std::string_view p : pieces) {
    const size_t begin = std::max(from, at), end = std::min(to, at + p.size());
    if (begin < end) fn(p.substr(begin - at, end - begin));
    at += p.size();
    if (at >= to) break;
  }
}

// One slice of the stream: raw deflate of [from, to), primed with the window before `from` so
// the slice compresses as well as it would inside one stream, and ending on a byte boundary
// (Z_SYNC_FLUSH: an empty stored block, not final) unless it is the last (Z_FINISH). `check` is
// the slice's own crc32 (gzip) or adler32 (zlib wrapper). False on a zlib error.
bool DeflateSlice(const std::vector<std::string_view>& pieces, size_t from, size_t to, bool last,
                  bool gzip, bool huffman_only, std::string* out, uLong* check) {
  z_stream z{};
  if (deflateInit2(&z, kLevel, Z_DEFLATED, -15, 8,
                   huffman_only ? Z_HUFFMAN_ONLY : Z_DEFAULT_STRATEGY) != Z_OK) {
    return false;
  }
  if (from > 0 && !huffman_only) {
    std::string dict;
    dict.reserve(kWindow);
    ForEachPart(pieces, from - std::min(from, kWindow), from,
                [&](std::string_view part) { dict.append(part); });
    deflateSetDictionary(&z, reinterpret_cast<const Bytef*>(dict.data()),
                         static_cast<uInt>(dict.size()));
  }
  out->resize(deflateBound(&z, to - from) + 64);
  z.next_out = reinterpret_cast<Bytef*>(out->data());
  z.avail_out = static_cast<uInt>(out->size());
  uLong sum = gzip ? crc32(0, Z_NULL, 0) : adler32(0, Z_NULL, 0);
  int rc = Z_OK;
  ForEachPart(pieces, from, to, [&](std::string_view part) {
    constexpr size_t kStep = size_t{1} << 30;  // avail_in is 32 bits
    for (size_t off = 0; off < part.size() && rc == Z_OK; off += kStep) {
      const std::string_view step = part.substr(off, kStep);
      const auto* bytes = reinterpret_cast<const Bytef*>(step.data());
      const auto n = static_cast<uInt>(step.size());
      sum = gzip ? crc32(sum, bytes, n) : adler32(sum, bytes, n);
      z.next_in = const_cast<Bytef*>(bytes);
      z.avail_in = n;
      rc = deflate(&z, Z_NO_FLUSH);
      if (z.avail_in != 0) rc = Z_BUF_ERROR;  // the bound was not enough: never expected
    }
  });
  if (rc == Z_OK) rc = deflate(&z, last ? Z_FINISH : Z_SYNC_FLUSH);
  const bool ok = last ? rc == Z_STREAM_END : rc == Z_OK && z.avail_out > 0;
  out->resize(out->size() - z.avail_out);
  deflateEnd(&z);
  *check = sum;
  return ok;
}

void PutLittleEndian32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

std::optional<std::string> Compress(ContentCoding coding,
                                    const std::vector<std::string_view>& pieces) {
  size_t total = 0;
  for (auto p : pieces) total += p.size();
  return CompressInSlices(coding, pieces, SlicesFor(total));
}

std::optional<std::string> CompressInSlices(ContentCoding coding,
                                            const std::vector<std::string_view>& pieces,
                                            size_t n) {
  if (coding == ContentCoding::kIdentity || n == 0) return std::nullopt;
  const bool gzip = coding == ContentCoding::kGzip;
  size_t total = 0;
  for (auto p : pieces) total += p.size();
  // A large answer is compressed in slices on the slice helpers, as pigz does, into ONE
  // ordinary gzip member or zlib stream (curl and some other clients stop after the first gzip
  // member, so concatenated members would not do).
  std::vector<std::string> parts(n);
  std::vector<uLong> checks(n, 0);
  std::vector<char> ok(n, 0);
  const bool huffman_only = total >= kParallelMinBytes;
  RunSlices(n, [&](size_t i) {
    ok[i] = DeflateSlice(pieces, total * i / n, total * (i + 1) / n, i + 1 == n, gzip,
                         huffman_only, &parts[i], &checks[i]);
  });
  uLong check = gzip ? crc32(0, Z_NULL, 0) : adler32(0, Z_NULL, 0);
  size_t size = 18;
  for (size_t i = 0; i < n; ++i) {
    if (!ok[i]) return std::nullopt;
    const auto len = static_cast<z_off_t>(total * (i + 1) / n - total * i / n);
    check = gzip ? crc32_combine(check, checks[i], len) : adler32_combine(check, checks[i], len);
    size += parts[i].size();
  }
  std::string out;
  out.reserve(size);
  if (gzip) {
    // RFC 1952: magic, CM = deflate, no flags, no mtime, XFL 4 (fastest), OS 3 (Unix).
    out.append("\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\x03", 10);
  } else {
    out.append("\x78\x01", 2);  // RFC 1950: deflate, 32 KiB window, FLEVEL 0 (fastest)
  }
  for (const auto& part : parts) out.append(part);
  if (gzip) {
    PutLittleEndian32(static_cast<uint32_t>(check), &out);
    PutLittleEndian32(static_cast<uint32_t>(total), &out);  // ISIZE: the size modulo 2^32
  } else {
    for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((check >> (8 * i)) & 0xff));
  }
  return out;
}

void CompressResponse(ContentCoding coding, HttpResponse* response) {
  if (coding == ContentCoding::kIdentity || response->stream != HttpResponse::Stream::kWhole) return;
  std::vector<std::string_view> pieces{response->body};
  pieces.insert(pieces.end(), response->tail.begin(), response->tail.end());
  std::optional<std::string> out = Compress(coding, pieces);
  if (!out) return;  // answer uncompressed
  response->body = std::move(*out);
  response->tail.clear();
  response->holders.clear();
  response->headers.emplace_back("Content-Encoding",
                                 coding == ContentCoding::kGzip ? "gzip" : "deflate");
}

}  // namespace inferd::http
