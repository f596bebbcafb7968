#include "repository/s3.h"

#include <curl/curl.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>

#include "common/strings.h"

namespace inferd::repository {
namespace fs = std::filesystem;
namespace {

// SHA-256 of the empty payload: HEAD and GET send no body.
constexpr const char* kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string UriEncodeKey(std::string_view key) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

struct Response {
  long status = 0;
  std::string etag;
  long long length = -1;
  std::string body;  // error bodies only
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Response*>(user);
  std::string_view line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    for (auto& c : name) c = static_cast<char>(tolower(c));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) {
      value.remove_suffix(1);
    }
    if (name == "etag") {
      r->etag = std::string(value);
      if (r->etag.size() >= 2 && r->etag.front() == '"') r->etag = r->etag.substr(1, r->etag.size() - 2);
    } else if (name == "content-length") {
      r->length = std::atoll(std::string(value).c_str());
    }
  }
  return size * n;
}

struct Sink {
  FILE* file = nullptr;
  Response* response = nullptr;
  CURL* curl = nullptr;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  long status = 0;
  curl_easy_getinfo(sink->curl, CURLINFO_RESPONSE_CODE, &status);
  if (sink->file != nullptr && status / 100 == 2) {
    return fwrite(data, size, n, sink->file) * size;
  }
  if (sink->response->body.size() < 4096) sink->response->body.append(data, size * n);
  return size * n;
}

// One signed request; `file` receives a 2xx body when non-null.
absl::StatusOr<Response> Request(const S3Config& config, const std::string& url, bool head,
                                 FILE* file) {
  static const bool initialized = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == 0; }();
  (void)initialized;
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) return absl::InternalError("curl_easy_init failed");
  Response response;
  Sink sink{file, &response, curl.get()};
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, StrCat("x-amz-content-sha256: ", kEmptyPayloadSha256).c_str());
  if (!config.session_token.empty()) {
    headers = curl_slist_append(headers, StrCat("x-amz-security-token: ", config.session_token).c_str());
  }
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> header_guard(headers, curl_slist_free_all);
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &response);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  if (head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  const std::string sigv4 = StrCat("aws:amz:", config.region, ":s3");
  const std::string userpwd = StrCat(config.access_key, ":", config.secret_key);
  if (!config.access_key.empty()) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
  }
  const CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(StrCat("S3 request to ", url, " failed: ", curl_easy_strerror(rc)));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

absl::Status HttpError(const std::string& what, const Response& r) {
  std::string detail;
  if (const size_t a = r.body.find("<Message>"); a != std::string::npos) {
    const size_t b = r.body.find("</Message>", a);
    if (b != std::string::npos) detail = StrCat(": ", r.body.substr(a + 9, b - a - 9));
  }
  if (r.status == 404) return absl::NotFoundError(StrCat(what, " does not exist (HTTP 404)", detail));
  if (r.status == 401 || r.status == 403) {
    return absl::PermissionDeniedError(StrCat(what, ": access denied (HTTP ", r.status, ")", detail));
  }
  return absl::UnavailableError(StrCat(what, ": HTTP ", r.status, detail));
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
    return StrCat(config.endpoint, "/", location.bucket, "/", UriEncodeKey(location.key));
  }
  return StrCat("https://", location.bucket, ".s3.", config.region, ".amazonaws.com/",
                UriEncodeKey(location.key));
}

absl::StatusOr<std::string> FetchS3Object(const S3Config& config, const S3Location& location,
                                          const std::string& cache_dir, bool* cache_hit) {
  const std::string url = S3ObjectUrl(config, location);
  const std::string what = StrCat("s3://", location.bucket, "/", location.key);
  auto head = Request(config, url, /*head=*/true, nullptr);
  if (!head.ok()) return head.status();
  if (head->status / 100 != 2) return HttpError(what, *head);
  std::string tag = head->etag;
  for (auto& ch : tag) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  std::string flat = StrCat(location.bucket, "_", location.key);
  for (auto& ch : flat) {
    if (ch == '/') ch = '_';
  }
  const fs::path dir = fs::path(cache_dir) / "s3" / StrCat(flat, "-", tag.empty() ? "noetag" : tag);
  const fs::path file = dir / fs::path(location.key).filename();
  std::error_code ec;
  if (!tag.empty() && fs::exists(file, ec) && head->length >= 0 &&
      static_cast<long long>(fs::file_size(file, ec)) == head->length) {
    if (cache_hit) *cache_hit = true;
    return file.string();
  }
  if (cache_hit) *cache_hit = false;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(StrCat("cannot create '", dir.string(), "': ", ec.message()));
  const fs::path partial = dir / ".partial";
  FILE* out = std::fopen(partial.c_str(), "wb");
  if (out == nullptr) return absl::InternalError(StrCat("cannot write '", partial.string(), "'"));
  auto got = Request(config, url, /*head=*/false, out);
  std::fclose(out);
  if (!got.ok()) {
    fs::remove(partial, ec);
    return got.status();
  }
  if (got->status / 100 != 2) {
    fs::remove(partial, ec);
    return HttpError(what, *got);
  }
  const auto size = static_cast<long long>(fs::file_size(partial, ec));
  const long long expected = got->length >= 0 ? got->length : head->length;
  if (expected >= 0 && size != expected) {
    fs::remove(partial, ec);
    return absl::DataLossError(StrCat(what, ": downloaded ", size, " bytes, expected ", expected));
  }
  fs::rename(partial, file, ec);
  if (ec) return absl::InternalError(StrCat("cannot rename into '", file.string(), "': ", ec.message()));
  return file.string();
}

}  // namespace inferd::repository
