#include "frontends/http/http_parser.h"

#include <charconv>
#include <cstring>

#include "common/strings.h"

namespace inferd::http {
namespace {

// RFC 9110's character classes, one table lookup per byte (the request line and header fields
// of every request go through them).
struct CharClasses {
  bool token[256] = {};         // tchar: a method, a field name
  bool bad_in_value[256] = {};  // a control other than HTAB, or DEL: refused in a field value
  bool bad_in_target[256] = {}; // a control, SP or DEL: refused in the request target
  constexpr CharClasses() {
    for (int c = 0; c < 256; ++c) {
      token[c] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      bad_in_value[c] = (c < 0x20 && c != '\t') || c == 0x7f;
      bad_in_target[c] = c <= 0x20 || c == 0x7f;
    }
    for (char c : std::string_view("!#$%&'*+-.^_`|~")) token[static_cast<unsigned char>(c)] = true;
  }
};
constexpr CharClasses kChars;

bool AllToken(std::string_view s) {
  bool ok = true;
  for (char c : s) ok &= kChars.token[static_cast<unsigned char>(c)];
  return ok;
}

bool AnyOf(const bool (&table)[256], std::string_view s) {
  bool any = false;
  for (char c : s) any |= table[static_cast<unsigned char>(c)];
  return any;
}

ParseResult Error(int status, std::string message) {
  ParseResult r;
  r.state = ParseState::kError;
  r.error_status = status;
  r.error = std::move(message);
  return r;
}

// The end of the line starting at `pos`: where its terminator (CRLF, or a bare LF as RFC 9112
// section 2.2 allows) starts, and the first byte after it; nullopt while the line is incomplete.
struct LineEnd {
  size_t eol;
  size_t next;
};
std::optional<LineEnd> FindLineEnd(std::string_view buffer, size_t pos) {
  const size_t nl = buffer.find('\n', pos);
  if (nl == std::string_view::npos) return std::nullopt;
  return LineEnd{nl > pos && buffer[nl - 1] == '\r' ? nl - 1 : nl, nl + 1};
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::optional<std::string_view> HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (inferd::EqualsIgnoreCase(k, name)) return v;
  }
  return std::nullopt;
}

namespace {

// Decodes a chunked body starting at `pos`. kNeedMore until the last chunk and the trailers
// have arrived.
ParseResult ParseChunkedBody(std::string_view buffer, size_t pos, const ParserLimits& limits,
                             std::string* out) {
  out->clear();
  for (;;) {
    const auto end = FindLineEnd(buffer, pos);
    if (!end) {
      if (buffer.size() - pos > 1024) return Error(400, "malformed chunk size line");
      return {};
    }
    std::string_view line = buffer.substr(pos, end->eol - pos);
    if (size_t semi = line.find(';'); semi != std::string_view::npos) line = line.substr(0, semi);
    line = Trim(line);
    size_t size = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
    if (ec != std::errc() || p != line.data() + line.size() || line.empty()) {
      return Error(400, "malformed chunk size in a chunked request body");
    }
    pos = end->next;
    if (size == 0) {
      // Trailer fields, then an empty line.
      for (;;) {
        const auto trailer = FindLineEnd(buffer, pos);
        if (!trailer) return {};
        if (trailer->eol == pos) {
          ParseResult r;
          r.state = ParseState::kComplete;
          r.consumed = trailer->next;
          return r;
        }
        pos = trailer->next;
      }
    }
    if (size > limits.max_body_bytes || out->size() + size > limits.max_body_bytes) {
      return Error(413, inferd::StrCat("request body exceeds the limit of ", limits.max_body_bytes,
                                       " bytes (--http-max-input-size)"));
    }
    if (buffer.size() - pos < size + 1) return {};
    size_t after = pos + size;
    if (buffer[after] == '\r') {
      if (buffer.size() - after < 2) return {};
      ++after;
    }
    if (buffer[after] != '\n') return Error(400, "chunk data is not followed by CRLF");
    out->append(buffer.data() + pos, size);
    pos = after + 1;
  }
}

// A chunk size line (extensions after ';' ignored): the size, or nullopt when malformed.
std::optional<size_t> ChunkSize(std::string_view line) {
  if (size_t semi = line.find(';'); semi != std::string_view::npos) line = line.substr(0, semi);
  line = Trim(line);
  size_t size = 0;
  auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
  if (ec != std::errc() || p != line.data() + line.size() || line.empty()) return std::nullopt;
  return size;
}

ParseResult BodyTooLarge(const ParserLimits& limits) {
  return Error(413, inferd::StrCat("request body exceeds the limit of ", limits.max_body_bytes,
                                   " bytes (--http-max-input-size)"));
}

}  // namespace

ParseResult DecodeChunkedInPlace(char* buffer, size_t* size, const ParserLimits& limits,
                                 ChunkedDecoder* d) {
  using Phase = ChunkedDecoder::Phase;
  size_t raw = d->body_end;  // the undecoded bytes start here
  auto compact = [&] {
    const size_t rest = *size - raw;
    if (raw != d->body_end && rest) std::memmove(buffer + d->body_end, buffer + raw, rest);
    *size = d->body_end + rest;
  };
  for (;;) {
    const std::string_view avail(buffer + raw, *size - raw);
    switch (d->phase) {
      case Phase::kSize: {
        const auto end = FindLineEnd(avail, 0);
        if (!end) {
          if (avail.size() > 1024) return Error(400, "malformed chunk size line");
          compact();
          return {};
        }
        const auto chunk = ChunkSize(avail.substr(0, end->eol));
        if (!chunk) return Error(400, "malformed chunk size in a chunked request body");
        raw += end->next;
        if (*chunk == 0) {
          d->phase = Phase::kTrailers;
        } else {
          if (*chunk > limits.max_body_bytes ||
              d->body_end - d->body_start + *chunk > limits.max_body_bytes) {
            return BodyTooLarge(limits);
          }
          d->chunk_left = *chunk;
          d->phase = Phase::kData;
        }
        break;
      }
      case Phase::kData: {
        const size_t n = std::min(d->chunk_left, avail.size());
        if (n && raw != d->body_end) std::memmove(buffer + d->body_end, buffer + raw, n);
        d->body_end += n;
        raw += n;
        d->chunk_left -= n;
        if (d->chunk_left) {
          compact();
          return {};
        }
        d->phase = Phase::kDataEnd;
        break;
      }
      case Phase::kDataEnd:
        // CRLF, or a bare LF.
        if (avail.empty() || (avail[0] == '\r' && avail.size() < 2)) {
          compact();
          return {};
        }
        if (avail[0] == '\n') {
          raw += 1;
        } else if (avail[0] == '\r' && avail[1] == '\n') {
          raw += 2;
        } else {
          return Error(400, "chunk data is not followed by CRLF");
        }
        d->phase = Phase::kSize;
        break;
      case Phase::kTrailers: {
        // Trailer fields (ignored), then an empty line.
        const auto end = FindLineEnd(avail, 0);
        if (!end) {
          if (avail.size() > limits.max_header_bytes) {
            return Error(431, inferd::StrCat("request trailers exceed ", limits.max_header_bytes, " bytes"));
          }
          compact();
          return {};
        }
        raw += end->next;
        if (end->eol == 0) {
          compact();
          ParseResult r;
          r.state = ParseState::kComplete;
          r.consumed = d->body_end;
          return r;
        }
        break;
      }
    }
  }
}

ParseResult ParseHttpRequest(std::string_view buffer, const ParserLimits& limits,
                             HttpRequest* request, std::string* chunked_body,
                             ChunkedDecoder* in_place) {
  // Lines end in CRLF, or in a bare LF, which RFC 9112 section 2.2 lets a server accept (curl
  // and browsers send CRLF; hand-written clients and netcat often send LF). Empty lines before
  // a request are tolerated (same section).
  size_t start = 0;
  for (;;) {
    if (start < buffer.size() && buffer[start] == '\n') {
      start += 1;
    } else if (start + 1 < buffer.size() && buffer[start] == '\r' && buffer[start + 1] == '\n') {
      start += 2;
    } else {
      break;
    }
  }
  // The header section: lines up to the first empty one.
  size_t header_end = std::string_view::npos;  // where the empty line starts
  size_t body_start = 0;
  for (size_t pos = start;;) {
    const size_t nl = buffer.find('\n', pos);
    if (nl == std::string_view::npos || nl - start > limits.max_header_bytes) {
      if (buffer.size() - start > limits.max_header_bytes) {
        return Error(431, inferd::StrCat("request headers exceed ", limits.max_header_bytes, " bytes"));
      }
      return {};
    }
    if (nl == pos || (nl == pos + 1 && buffer[pos] == '\r')) {
      header_end = pos;
      body_start = nl + 1;
      break;
    }
    pos = nl + 1;
  }
  *request = HttpRequest();
  // The next line of the header section at `*pos` without its terminator (pos moves past it).
  auto next_line = [&buffer, header_end](size_t* pos) {
    size_t nl = buffer.find('\n', *pos);
    if (nl == std::string_view::npos || nl > header_end) nl = header_end;
    const size_t end = nl > *pos && buffer[nl - 1] == '\r' ? nl - 1 : nl;
    std::string_view line = buffer.substr(*pos, end - *pos);
    *pos = nl + 1;
    return line;
  };
  size_t pos = start;

  // Request line: METHOD SP target SP HTTP/1.x
  std::string_view line = next_line(&pos);
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0) return Error(400, "malformed request line");
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1) return Error(400, "malformed request line");
  request->method = line.substr(0, sp1);
  if (!AllToken(request->method)) return Error(400, "malformed request method");
  request->target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (version == "HTTP/1.1") {
    request->minor_version = 1;
  } else if (version == "HTTP/1.0") {
    request->minor_version = 0;
    request->keep_alive = false;
  } else {
    return Error(505, "only HTTP/1.0 and HTTP/1.1 are supported");
  }
  if (request->target.empty() || request->target[0] != '/') {
    return Error(400, "request target must be an absolute path");
  }
  if (AnyOf(kChars.bad_in_target, request->target)) {
    return Error(400, "request target contains a control character");
  }
  size_t q = request->target.find('?');
  request->path = request->target.substr(0, q);
  if (q != std::string_view::npos) request->query = request->target.substr(q + 1);

  // Header fields.
  std::optional<size_t> content_length;
  bool chunked = false;
  while (pos < header_end) {
    std::string_view field = next_line(&pos);
    size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0) return Error(400, "malformed header line");
    std::string_view name = field.substr(0, colon);
    if (!AllToken(name)) return Error(400, "malformed header name");
    std::string_view value = Trim(field.substr(colon + 1));
    if (AnyOf(kChars.bad_in_value, value)) {
      return Error(400, inferd::StrCat("header '", name, "' contains a control character"));
    }
    request->headers.emplace_back(name, value);
    if (inferd::EqualsIgnoreCase(name, "Content-Length")) {
      size_t n = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || p != value.data() + value.size() || value.empty()) {
        return Error(400, "invalid Content-Length");
      }
      if (content_length && *content_length != n) return Error(400, "conflicting Content-Length headers");
      content_length = n;
    } else if (inferd::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      if (inferd::EqualsIgnoreCase(value, "chunked") && (chunked_body != nullptr || in_place != nullptr)) {
        chunked = true;
      } else if (!inferd::EqualsIgnoreCase(value, "identity")) {
        return Error(501, inferd::StrCat("Transfer-Encoding '", value, "' is not supported"));
      }
    } else if (inferd::EqualsIgnoreCase(name, "Connection")) {
      if (inferd::ContainsIgnoreCase(value, "close")) request->keep_alive = false;
      if (inferd::ContainsIgnoreCase(value, "keep-alive")) request->keep_alive = true;
    } else if (inferd::EqualsIgnoreCase(name, "Expect")) {
      if (inferd::EqualsIgnoreCase(value, "100-continue")) request->expect_continue = true;
    }
  }

  if (chunked) {
    if (content_length) return Error(400, "a request cannot have both Content-Length and chunked Transfer-Encoding");
    if (in_place != nullptr) {
      *in_place = ChunkedDecoder();
      in_place->active = true;
      in_place->body_start = in_place->body_end = body_start;
      ParseResult r;
      r.headers_complete = true;
      r.expect_continue = request->expect_continue;
      return r;
    }
    ParseResult r = ParseChunkedBody(buffer, body_start, limits, chunked_body);
    r.headers_complete = true;
    if (r.state == ParseState::kComplete) request->body = *chunked_body;
    return r;
  }
  const size_t body_len = content_length.value_or(0);
  if (body_len > limits.max_body_bytes) {
    return Error(413, inferd::StrCat("request body of ", body_len,
                                   " bytes exceeds the limit of ", limits.max_body_bytes,
                                   " bytes (--http-max-input-size)"));
  }
  ParseResult r;
  r.headers_complete = true;
  r.expected_total = body_start + body_len;
  if (buffer.size() - body_start < body_len) {
    r.state = ParseState::kNeedMore;
    r.expect_continue = request->expect_continue;
    return r;
  }
  request->body = buffer.substr(body_start, body_len);
  r.state = ParseState::kComplete;
  r.consumed = body_start + body_len;
  return r;
}

std::optional<std::string> PercentDecode(std::string_view s) {
  if (std::memchr(s.data(), '%', s.size()) == nullptr) return std::string(s);  // most paths
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    int v = 0;
    auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (ec != std::errc() || p != s.data() + i + 3) return std::nullopt;
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

}  // namespace inferd::http
