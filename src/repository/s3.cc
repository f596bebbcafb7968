#include "repository/s3.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "common/mutex.h"
#include "common/strings.h"

namespace inferd::repository {
namespace fs = std::filesystem;
namespace {

// SHA-256 of the empty payload: HEAD and GET send no body.
constexpr const char* kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// Bodies kept in memory: a listing page (1000 keys is a few hundred KB) and error bodies.
constexpr size_t kMaxBody = size_t{64} << 20;
constexpr size_t kMaxErrorBody = size_t{64} << 10;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters stay, '/' stays in keys.
std::string UriEncode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string S3Name(const S3Location& location) {
  return StrCat("s3://", location.bucket, "/", location.key);
}

// ---- XML: the few flat elements S3 answers with ---------------------------------------------

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes XML's five named entities and numeric references (S3 writes control characters in
// keys as &#13; and the like). An unknown entity is kept as written.
std::string XmlUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    if (semi == std::string_view::npos || semi - i > 10) {
      out.push_back(s[i]);
      continue;
    }
    const std::string_view ent = s.substr(i + 1, semi - i - 1);
    static constexpr std::pair<std::string_view, char> kNamed[] = {
        {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
    bool done = false;
    for (const auto& [name, c] : kNamed) {
      if (ent == name) {
        out.push_back(c);
        done = true;
      }
    }
    if (!done && ent.size() > 1 && ent[0] == '#') {
      const bool hex = ent[1] == 'x' || ent[1] == 'X';
      const std::string_view digits = ent.substr(hex ? 2 : 1);
      uint32_t cp = 0;
      auto [p, ec] =
          std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
      if (ec == std::errc() && p == digits.data() + digits.size() && cp <= 0x10FFFF) {
        AppendUtf8(&out, cp);
        done = true;
      }
    }
    if (!done) {
      out.append(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

// The decoded text of the first <tag>...</tag> in `xml`.
std::optional<std::string> XmlText(std::string_view xml, std::string_view tag) {
  const std::string open = StrCat("<", tag, ">");
  const std::string close = StrCat("</", tag, ">");
  const size_t a = xml.find(open);
  if (a == std::string_view::npos) return std::nullopt;
  const size_t b = xml.find(close, a + open.size());
  if (b == std::string_view::npos) return std::nullopt;
  return XmlUnescape(xml.substr(a + open.size(), b - a - open.size()));
}

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

// ---- one HTTP request -----------------------------------------------------------------------

struct S3Request {
  std::string url;
  bool head = false;
  std::string range;  // "a-b" (inclusive); empty: the whole object
  // When set, a success answer with another ETag delivers no byte: the object changed.
  std::string expected_etag;
  // Receives the body of a success answer (200, or 206 to a ranged request); false stops the
  // transfer. Null: the body is kept in S3Response::body.
  std::function<bool(const char*, size_t)> on_body;
};

struct S3Response {
  long status = 0;
  std::string etag;
  int64_t length = -1;
  std::string body;           // an error body, or a success body when there is no on_body
  bool stopped = false;       // on_body returned false
  bool etag_changed = false;  // expected_etag did not match
};

struct Transfer {
  const S3Request* request;
  S3Response* response;
  CURL* curl;
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Transfer*>(user)->response;
  std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new answer (after a 100 Continue, say)
    r->etag.clear();
    r->length = -1;
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  for (auto& c : name) c = AsciiLower(c);
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) {
    value.remove_suffix(1);
  }
  if (name == "etag") {
    r->etag = Unquote(std::string(value));
  } else if (name == "content-length") {
    int64_t v = -1;
    std::from_chars(value.data(), value.data() + value.size(), v);
    r->length = v;
  }
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  const bool success = status == (t->request->range.empty() ? 200 : 206);
  if (success && t->request->on_body) {
    if (!t->request->expected_etag.empty() && !t->response->etag.empty() &&
        t->response->etag != t->request->expected_etag) {
      t->response->etag_changed = true;
      return 0;  // makes curl fail the transfer with CURLE_WRITE_ERROR
    }
    if (!t->request->on_body(data, bytes)) {
      t->response->stopped = true;
      return 0;
    }
    return bytes;
  }
  std::string& body = t->response->body;
  const size_t cap = success ? kMaxBody : kMaxErrorBody;
  if (body.size() < cap) body.append(data, std::min(bytes, cap - body.size()));
  return bytes;
}

// One easy handle per thread, reset before each request: its connection cache lets the parts
// and files of one fetch reuse their connections.
CURL* ThreadCurl() {
  static const bool initialized = curl_global_init(CURL_GLOBAL_DEFAULT) == 0;
  (void)initialized;
  thread_local std::unique_ptr<CURL, void (*)(CURL*)> handle(curl_easy_init(), curl_easy_cleanup);
  if (handle) curl_easy_reset(handle.get());
  return handle.get();
}

// "scheme://host:port" of a URL, for messages about reaching it.
std::string_view Origin(std::string_view url) {
  const size_t scheme = url.find("://");
  const size_t slash = scheme == std::string_view::npos ? url.find('/') : url.find('/', scheme + 3);
  return url.substr(0, slash);
}

absl::Status TransportError(std::string_view what, std::string_view url, CURLcode rc,
                            const char* detail) {
  // curl's error buffer says more than curl_easy_strerror and usually repeats it.
  const std::string why = *detail ? std::string(detail) : std::string(curl_easy_strerror(rc));
  if (rc == CURLE_PARTIAL_FILE) {
    return absl::DataLossError(StrCat(what, ": the download ended early (", why, ")"));
  }
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    return absl::UnavailableError(
        StrCat(what, ": timed out talking to ", Origin(url), " (", why, ")"));
  }
  return absl::UnavailableError(StrCat(what, ": cannot reach ", Origin(url), " (", why, ")"));
}

// Performs one signed request. A transport failure is an error; an HTTP error status is not
// (the caller decides what it means).
absl::StatusOr<S3Response> Perform(const S3Config& config, const S3Request& request,
                                   std::string_view what) {
  CURL* c = ThreadCurl();
  if (c == nullptr) return absl::InternalError("curl_easy_init failed");
  S3Response response;
  Transfer transfer{&request, &response, c};
  curl_slist* headers = nullptr;
  headers =
      curl_slist_append(headers, StrCat("x-amz-content-sha256: ", kEmptyPayloadSha256).c_str());
  if (!config.session_token.empty()) {
    headers =
        curl_slist_append(headers, StrCat("x-amz-security-token: ", config.session_token).c_str());
  }
  if (!request.expected_etag.empty()) {
    // Real S3 answers 412 when the object changed; the ETag check in OnBody covers servers
    // that ignore If-Match.
    headers =
        curl_slist_append(headers, StrCat("If-Match: \"", request.expected_etag, "\"").c_str());
  }
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> header_guard(headers, curl_slist_free_all);
  char error[CURL_ERROR_SIZE] = "";
  const S3TransferOptions& t = config.transfer;
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  // S3 over HTTP/2 has been unreliable (Triton pins 1.1 too); one connection per part anyway.
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, t.connect_timeout_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, t.low_speed_bytes);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, t.low_speed_seconds);
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 256L << 10);  // fewer, larger writes into the sinks
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &transfer);
  if (request.head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (!request.range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, request.range.c_str());
  const std::string sigv4 = StrCat("aws:amz:", config.region, ":s3");
  const std::string userpwd = StrCat(config.access_key, ":", config.secret_key);
  if (!config.access_key.empty()) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  if (rc != CURLE_OK && !response.stopped && !response.etag_changed) {
    return TransportError(what, request.url, rc, error);
  }
  return response;
}

// What an HTTP error status means for `what`, with S3's own code and message.
absl::Status HttpError(std::string_view what, const S3Response& r) {
  const std::string code = XmlText(r.body, "Code").value_or("");
  const std::string message = XmlText(r.body, "Message").value_or("");
  const std::string detail = StrCat(" (HTTP ", r.status, code.empty() ? "" : " ", code,
                                    message.empty() ? "" : ": ", message, ")");
  switch (r.status) {
    case 404:
      return absl::NotFoundError(StrCat(what, " does not exist", detail));
    case 401:
    case 403:
      return absl::PermissionDeniedError(StrCat(what, ": access denied", detail));
    case 400:
      return absl::InvalidArgumentError(StrCat(what, ": bad request", detail));
    case 301:
    case 307:
      return absl::FailedPreconditionError(
          StrCat(what, ": the bucket is elsewhere; check AWS_REGION or the endpoint", detail));
    case 412:
      return absl::AbortedError(StrCat(what, " changed while downloading; retry", detail));
    default:
      break;
  }
  if (r.status == 429 || r.status >= 500) {
    return absl::UnavailableError(StrCat(what, ": the server is unavailable", detail));
  }
  return absl::UnknownError(StrCat(what, ": unexpected answer", detail));
}

// Transient failures, worth another try: unreachable, timed out, 5xx, cut short.
bool Retryable(const absl::Status& st) { return absl::IsUnavailable(st) || absl::IsDataLoss(st); }

void Backoff(int attempt) {
  std::this_thread::sleep_for(std::chrono::milliseconds(100) * (1 << (2 * attempt)));
}

// A request whose answer must be `expected`, with the body kept; retried when transient.
absl::StatusOr<S3Response> PerformExpecting(const S3Config& config, const S3Request& request,
                                            std::string_view what, long expected) {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<S3Response> r = Perform(config, request, what);
    if (r.ok() && r->status != expected) r = HttpError(what, *r);
    if (r.ok() || attempt >= config.transfer.retries || !Retryable(r.status())) return r;
    Backoff(attempt);
  }
}

// ---- parts: one object over several connections ---------------------------------------------

// Where the parts of one object go. Begin/Write/End for a part come from the one thread that
// downloads it; parts run on several threads at once.
class PartSink {
 public:
  virtual ~PartSink() = default;
  // Before part `index` is requested; may wait (a stream bounds how far ahead downloads run).
  // Not OK: stop downloading.
  virtual absl::Status Begin(size_t index) = 0;
  // `n` bytes at `offset` within part `index`. Not OK: stop downloading.
  virtual absl::Status Write(size_t index, int64_t offset, const char* data, size_t n) = 0;
  virtual void End(size_t index) = 0;
  // The download failed: every later Begin and Write returns the first such status.
  virtual void Fail(const absl::Status& status) = 0;
};

// Downloads part `index` (resuming where a failed attempt stopped) into `sink`.
absl::Status GetPart(const S3Config& config, const std::string& url, std::string_view what,
                     const S3Object& info, const std::vector<S3Part>& parts, size_t index,
                     PartSink& sink) {
  const S3Part& part = parts[index];
  const int64_t length = part.end - part.begin;
  int64_t got = 0;
  for (int attempt = 0;; ++attempt) {
    absl::Status write_status;
    S3Request request;
    request.url = url;
    request.expected_etag = info.etag;
    if (parts.size() > 1 || got > 0) request.range = StrCat(part.begin + got, "-", part.end - 1);
    request.on_body = [&](const char* data, size_t n) {
      if (got + static_cast<int64_t>(n) > length) {
        write_status = absl::DataLossError(
            StrCat(what, ": the server sent more than the ", info.size, " bytes listed"));
        return false;
      }
      write_status = sink.Write(index, got, data, n);
      if (!write_status.ok()) return false;
      got += static_cast<int64_t>(n);
      return true;
    };
    absl::StatusOr<S3Response> r = Perform(config, request, what);
    absl::Status st;
    if (!write_status.ok()) return write_status;  // the sink stopped, or too many bytes
    const long expected = request.range.empty() ? 200 : 206;
    if (!r.ok()) {
      st = r.status();
    } else if (r->etag_changed) {
      return absl::AbortedError(StrCat(what, " changed while downloading (ETag ", r->etag,
                                       ", listed ", info.etag, "); retry"));
    } else if (r->status == 200 && expected == 206) {
      return absl::UnimplementedError(StrCat(what, ": the server ignored the Range header"));
    } else if (r->status != expected) {
      st = HttpError(what, *r);
    } else if (got != length) {
      st = absl::DataLossError(StrCat(what, ": received ", got, " of the ", length,
                                      " bytes at offset ", part.begin, " (object of ", info.size,
                                      " bytes)"));
    } else {
      return absl::OkStatus();
    }
    if (attempt >= config.transfer.retries || !Retryable(st)) return st;
    Backoff(attempt);
  }
}

// Fetches every part, up to `connections` at a time, the calling thread being one of them.
// Parts are handed out in order, so a stream's window never waits on a part nobody fetches.
absl::Status DownloadParts(const S3Config& config, const std::string& url, std::string_view what,
                           const S3Object& info, const std::vector<S3Part>& parts, PartSink& sink) {
  std::atomic<size_t> next{0};
  inferd::Mutex mu;
  absl::Status first_error;
  auto work = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= parts.size()) return;
      absl::Status st = sink.Begin(i);
      if (st.ok()) st = GetPart(config, url, what, info, parts, i, sink);
      if (!st.ok()) {
        sink.Fail(st);
        inferd::MutexLock lock(&mu);
        if (first_error.ok()) first_error = st;
        return;
      }
      sink.End(i);
    }
  };
  const size_t workers = std::clamp<size_t>(config.transfer.connections, 1, parts.size());
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer connections; the parts still all get fetched
    }
  }
  work();
  for (auto& t : threads) t.join();
  inferd::MutexLock lock(&mu);
  return first_error;
}

// Parts written straight into a file at their offsets.
class FileSink final : public PartSink {
 public:
  FileSink(int fd, const std::vector<S3Part>& parts, std::string path)
      : fd_(fd), parts_(parts), path_(std::move(path)) {}

  absl::Status Begin(size_t) override { return status(); }
  absl::Status Write(size_t index, int64_t offset, const char* data, size_t n) override {
    if (absl::Status st = status(); !st.ok()) return st;
    off_t at = parts_[index].begin + offset;
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, data, n, at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        return absl::InternalError(StrCat("cannot write '", path_, "': ", strerror(errno)));
      }
      data += w;
      n -= static_cast<size_t>(w);
      at += w;
    }
    return absl::OkStatus();
  }
  void End(size_t) override {}
  void Fail(const absl::Status& st) override {
    inferd::MutexLock lock(&mu_);
    if (status_.ok()) status_ = st;
  }

 private:
  absl::Status status() {
    inferd::MutexLock lock(&mu_);
    return status_;
  }
  const int fd_;
  const std::vector<S3Part>& parts_;
  const std::string path_;
  inferd::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Parts reassembled in order into one stream for a single reader: the download threads fill
// part buffers, the reader (the extraction) takes each part's bytes as soon as they arrive
// and frees the part once read. A part starts only within `window` parts of the one being
// read, which bounds memory to `window` parts.
class PartStream final : public PartSink {
 public:
  PartStream(const std::vector<S3Part>& parts, size_t window)
      : parts_(parts),
        window_(window),
        buffers_(parts.size()),
        filled_(parts.size(), 0),
        done_(parts.size(), false) {}

  absl::Status Begin(size_t index) override {
    inferd::MutexLock lock(&mu_);
    auto may_start = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !status_.ok() || index < next_ + window_;
    };
    mu_.Await(absl::Condition(&may_start));
    if (!status_.ok()) return status_;
    buffers_[index] = std::make_unique_for_overwrite<char[]>(
        static_cast<size_t>(parts_[index].end - parts_[index].begin));
    return absl::OkStatus();
  }

  absl::Status Write(size_t index, int64_t offset, const char* data, size_t n) override {
    char* buffer = nullptr;
    {
      inferd::MutexLock lock(&mu_);
      if (!status_.ok()) return status_;
      buffer = buffers_[index].get();
    }
    // Outside the lock: the reader only reads below filled_[index], published below.
    memcpy(buffer + offset, data, n);
    inferd::MutexLock lock(&mu_);
    filled_[index] = offset + static_cast<int64_t>(n);
    return absl::OkStatus();
  }

  void End(size_t index) override {
    inferd::MutexLock lock(&mu_);
    done_[index] = true;
  }

  void Fail(const absl::Status& st) override {
    inferd::MutexLock lock(&mu_);
    if (status_.ok()) status_ = st;
  }

  // The reader stopped (the extraction failed): the downloads stop too.
  void Stop() { Fail(absl::CancelledError("the extraction stopped")); }

  // The bytes that arrived since the last call (valid until the next call); empty at the end.
  absl::StatusOr<std::string_view> Next() {
    inferd::MutexLock lock(&mu_);
    while (next_ < parts_.size()) {
      const size_t i = next_;
      auto readable = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !status_.ok() || filled_[i] > read_pos_ || done_[i];
      };
      mu_.Await(absl::Condition(&readable));
      if (!status_.ok()) return status_;
      if (filled_[i] > read_pos_) {
        std::string_view chunk(buffers_[i].get() + read_pos_, filled_[i] - read_pos_);
        read_pos_ = filled_[i];
        return chunk;
      }
      // Part i is downloaded and read: free it, which lets part i + window start.
      buffers_[i].reset();
      ++next_;
      read_pos_ = 0;
    }
    return std::string_view();
  }

 private:
  const std::vector<S3Part>& parts_;
  const size_t window_;
  inferd::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;       // the part being read
  int64_t read_pos_ ABSL_GUARDED_BY(mu_) = 0;  // within it
  std::vector<std::unique_ptr<char[]>> buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> filled_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);
};

bool IsHostPort(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size() ||
      s.size() - colon - 1 > 5) {
    return false;
  }
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    const bool ok = i < colon ? (isalnum(c) || c == '-' || c == '.') : (i == colon || isdigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsBucketName(std::string_view s) {
  if (s.empty() || s.size() > 255 || !isalnum(static_cast<unsigned char>(s.front()))) return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return isalnum(c) || c == '-' || c == '.' || c == '_';
  });
}

}  // namespace

absl::StatusOr<S3Location> ParseS3Url(std::string_view url) {
  constexpr std::string_view kScheme = "s3://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return absl::InvalidArgumentError(StrCat("'", url, "' is not an s3:// URL"));
  }
  std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == 0 || slash == std::string_view::npos || slash + 1 == rest.size()) {
    return absl::InvalidArgumentError(StrCat("'", url, "' must be s3://<bucket>/<key>"));
  }
  return S3Location{std::string(rest.substr(0, slash)), std::string(rest.substr(slash + 1))};
}

absl::StatusOr<S3RepositoryUrl> ParseS3RepositoryUrl(std::string_view url) {
  constexpr std::string_view kScheme = "s3://";
  const auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("model repository '", url, "': ", why,
                                             " (expected s3://bucket/prefix or "
                                             "s3://host:port/bucket/prefix)"));
  };
  if (url.substr(0, kScheme.size()) != kScheme) return invalid("not an s3:// URL");
  std::string_view rest = url.substr(kScheme.size());
  std::string scheme = "http://";
  bool scheme_given = false;
  for (std::string_view s : {"http://", "https://"}) {
    if (rest.substr(0, s.size()) == s) {
      scheme = std::string(s);
      scheme_given = true;
      rest.remove_prefix(s.size());
    }
  }
  // Empty components drop out: Triton collapses repeated slashes too.
  std::vector<std::string_view> parts;
  for (size_t pos = 0; pos <= rest.size();) {
    size_t slash = rest.find('/', pos);
    if (slash == std::string_view::npos) slash = rest.size();
    if (slash > pos) parts.push_back(rest.substr(pos, slash - pos));
    pos = slash + 1;
  }
  S3RepositoryUrl out;
  size_t first = 0;
  if (!parts.empty() && IsHostPort(parts[0])) {
    out.endpoint = StrCat(scheme, parts[0]);
    first = 1;
  } else if (scheme_given) {
    return invalid("an http:// or https:// endpoint needs host:port");
  }
  if (first >= parts.size()) return invalid("no bucket");
  if (!IsBucketName(parts[first]))
    return invalid(StrCat("'", parts[first], "' is not a bucket name"));
  out.bucket = std::string(parts[first]);
  for (size_t i = first + 1; i < parts.size(); ++i) StrAppend(&out.prefix, parts[i], "/");
  return out;
}

S3Config S3ConfigFromEnvironment() {
  S3Config c;
  c.access_key = Env("AWS_ACCESS_KEY_ID");
  c.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  c.session_token = Env("AWS_SESSION_TOKEN");
  if (std::string r = Env("AWS_REGION"); !r.empty()) {
    c.region = r;
  } else if (std::string d = Env("AWS_DEFAULT_REGION"); !d.empty()) {
    c.region = d;
  }
  c.endpoint = Env("AWS_ENDPOINT_URL");
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  return c;
}

std::string S3ObjectUrl(const S3Config& config, const S3Location& location) {
  if (!config.endpoint.empty()) {
    return StrCat(config.endpoint, "/", location.bucket, "/", UriEncode(location.key, true));
  }
  return StrCat("https://", location.bucket, ".s3.", config.region, ".amazonaws.com/",
                UriEncode(location.key, true));
}

std::string S3ListUrl(const S3Config& config, std::string_view bucket, std::string_view prefix,
                      std::string_view continuation_token, int max_keys) {
  std::string url = config.endpoint.empty()
                        ? StrCat("https://", bucket, ".s3.", config.region, ".amazonaws.com/?")
                        : StrCat(config.endpoint, "/", bucket, "?");
  // In SigV4's canonical order (sorted by name).
  if (!continuation_token.empty()) {
    StrAppend(&url, "continuation-token=", UriEncode(continuation_token, false), "&");
  }
  StrAppend(&url, "list-type=2&max-keys=", max_keys);
  if (!prefix.empty()) StrAppend(&url, "&prefix=", UriEncode(prefix, false));
  return url;
}

absl::StatusOr<S3ListPage> ParseListObjectsV2(std::string_view xml) {
  const auto malformed = [](std::string_view why) {
    return absl::InternalError(StrCat("malformed ListObjectsV2 answer: ", why));
  };
  if (xml.find("<ListBucketResult") == std::string_view::npos) {
    return malformed("no <ListBucketResult>");
  }
  S3ListPage page;
  constexpr std::string_view kOpen = "<Contents>", kClose = "</Contents>";
  // Searching only between <Contents> blocks for the page's own elements is unnecessary:
  // keys are escaped, so "<IsTruncated>" cannot appear inside one.
  for (size_t pos = xml.find(kOpen); pos != std::string_view::npos; pos = xml.find(kOpen, pos)) {
    const size_t end = xml.find(kClose, pos);
    if (end == std::string_view::npos) return malformed("unterminated <Contents>");
    const std::string_view block = xml.substr(pos + kOpen.size(), end - pos - kOpen.size());
    S3Object object;
    std::optional<std::string> key = XmlText(block, "Key");
    std::optional<std::string> size = XmlText(block, "Size");
    if (!key || !size) return malformed("<Contents> without <Key> or <Size>");
    object.key = *std::move(key);
    object.etag = Unquote(XmlText(block, "ETag").value_or(""));
    auto [p, ec] = std::from_chars(size->data(), size->data() + size->size(), object.size);
    if (ec != std::errc() || p != size->data() + size->size() || object.size < 0) {
      return malformed(StrCat("bad <Size> '", *size, "' of '", object.key, "'"));
    }
    page.objects.push_back(std::move(object));
    pos = end + kClose.size();
  }
  page.truncated = XmlText(xml, "IsTruncated").value_or("false") == "true";
  if (page.truncated) {
    page.next_token = XmlText(xml, "NextContinuationToken").value_or("");
    if (page.next_token.empty()) return malformed("truncated without <NextContinuationToken>");
  }
  return page;
}

absl::StatusOr<S3ListPage> ListS3Page(const S3Config& config, const std::string& bucket,
                                      const std::string& prefix, const std::string& token,
                                      int max_keys) {
  const std::string what = StrCat("s3://", bucket, "/", prefix);
  S3Request request;
  request.url = S3ListUrl(config, bucket, prefix, token, max_keys);
  absl::StatusOr<S3Response> r = PerformExpecting(config, request, what, 200);
  if (!r.ok()) return r.status();
  absl::StatusOr<S3ListPage> page = ParseListObjectsV2(r->body);
  if (!page.ok()) return absl::InternalError(StrCat(what, ": ", page.status().message()));
  return page;
}

absl::StatusOr<std::vector<S3Object>> ListS3Objects(const S3Config& config,
                                                    const std::string& bucket,
                                                    const std::string& prefix) {
  std::vector<S3Object> all;
  std::string token;
  for (;;) {
    absl::StatusOr<S3ListPage> page =
        ListS3Page(config, bucket, prefix, token, config.transfer.list_max_keys);
    if (!page.ok()) return page.status();
    for (auto& o : page->objects) all.push_back(std::move(o));
    if (!page->truncated) return all;
    if (page->next_token == token) {
      return absl::InternalError(
          StrCat("s3://", bucket, "/", prefix, ": the listing repeats its continuation token"));
    }
    token = std::move(page->next_token);
  }
}

absl::StatusOr<S3Object> HeadS3Object(const S3Config& config, const S3Location& location) {
  const std::string what = S3Name(location);
  S3Request request;
  request.url = S3ObjectUrl(config, location);
  request.head = true;
  absl::StatusOr<S3Response> r = PerformExpecting(config, request, what, 200);
  if (!r.ok()) return r.status();
  if (r->length < 0) return absl::UnavailableError(StrCat(what, ": HEAD gave no Content-Length"));
  return S3Object{location.key, r->etag, r->length};
}

std::vector<S3Part> PlanS3Parts(int64_t size, const S3TransferOptions& options) {
  if (size <= options.parallel_threshold || options.part_size <= 0) return {{0, size}};
  std::vector<S3Part> parts;
  for (int64_t begin = 0; begin < size; begin += options.part_size) {
    parts.push_back({begin, std::min(size, begin + options.part_size)});
  }
  return parts;
}

absl::Status DownloadS3Object(const S3Config& config, const S3Location& location,
                              const S3Object& info, const std::string& path) {
  // A new file in a fresh snapshot: never through a link, never over an existing file.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(StrCat("cannot write '", path, "': ", strerror(errno)));
  const std::vector<S3Part> parts = PlanS3Parts(info.size, config.transfer);
  FileSink sink(fd, parts, path);
  absl::Status st =
      DownloadParts(config, S3ObjectUrl(config, location), S3Name(location), info, parts, sink);
  if (::close(fd) != 0 && st.ok()) {
    st = absl::InternalError(StrCat("cannot write '", path, "': ", strerror(errno)));
  }
  return st;
}

absl::Status ExtractS3Archive(const S3Config& config, const S3Location& location,
                              const S3Object& info, const std::string& dest_dir,
                              const ExtractLimits& limits) {
  const std::string what = S3Name(location);
  const std::string url = S3ObjectUrl(config, location);
  const std::vector<S3Part> parts = PlanS3Parts(info.size, config.transfer);
  PartStream stream(parts, static_cast<size_t>(std::max(config.transfer.connections, 1)) + 1);
  absl::Status download;
  std::thread downloader;
  try {
    downloader =
        std::thread([&] { download = DownloadParts(config, url, what, info, parts, stream); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        StrCat(what, ": cannot start a download thread: ", e.what()));
  }
  absl::Status extracted = ExtractArchiveStream([&stream] { return stream.Next(); }, what, dest_dir,
                                                limits, [&stream] { stream.Stop(); });
  stream.Stop();  // nobody reads any more: downloads waiting for room give up (none after success)
  downloader.join();
  // A failed download also fails the extraction; the download's reason is the one to report.
  if (!download.ok() && !absl::IsCancelled(download)) return download;
  return extracted;
}

}  // namespace inferd::repository
