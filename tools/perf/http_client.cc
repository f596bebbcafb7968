#include "tools/perf/http_client.h"

#include "tools/perf/perf_lib.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <strings.h>

namespace inferd::perf {
namespace {

constexpr int kIoTimeoutSeconds = 60;

bool HeaderIs(std::string_view line, std::string_view name, std::string_view* value) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  if (strncasecmp(line.data(), name.data(), name.size()) != 0) return false;
  std::string_view v = line.substr(name.size() + 1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\r')) v.remove_suffix(1);
  *value = v;
  return true;
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& url, int default_port) {
  std::string u = url;
  if (u.rfind("http://", 0) == 0) u = u.substr(7);
  if (!u.empty() && u.back() == '/') u.pop_back();
  const size_t colon = u.rfind(':');
  if (colon == std::string::npos) return std::make_pair(u, default_port);
  int port = 0;
  auto [p, ec] = std::from_chars(u.data() + colon + 1, u.data() + u.size(), port);
  if (ec != std::errc() || p != u.data() + u.size() || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError("-u takes host:port, got '" + url + "'");
  }
  return std::make_pair(u.substr(0, colon), port);
}

HttpClient::HttpClient(std::string host, int port) : host_(std::move(host)), port_(port) {}

HttpClient::~HttpClient() { Close(); }

void HttpClient::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buffer_.clear();
}

absl::Status HttpClient::Connect() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(port_);
  if (int rc = getaddrinfo(host_.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError("cannot resolve '" + host_ + "': " + gai_strerror(rc));
  }
  int err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      // A stalled server fails the request instead of hanging the run.
      timeval timeout{kIoTimeoutSeconds, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
      fd_ = fd;
      break;
    }
    err = errno;
    ::close(fd);
  }
  freeaddrinfo(res);
  if (fd_ < 0) {
    return absl::UnavailableError("cannot connect to " + host_ + ":" + port + ": " + std::strerror(err));
  }
  return absl::OkStatus();
}

absl::StatusOr<HttpResponse> HttpClient::Request(const std::string& method, const std::string& path,
                                                 const std::vector<std::string>& headers,
                                                 const std::string& body) {
  std::string head = method + " " + path + " HTTP/1.1\r\nHost: " + host_ + "\r\n";
  for (const auto& h : headers) head += h + "\r\n";
  if (!body.empty() || method == "POST") head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  head += "\r\n";
  const bool fresh = fd_ < 0;
  auto r = RequestOnce(head, body);
  if (!r.ok() && !fresh && absl::IsAborted(r.status())) {
    // The server closed the kept-alive connection before this request: retry once.
    Close();
    r = RequestOnce(head, body);
  }
  if (!r.ok()) Close();
  return r;
}

absl::StatusOr<HttpResponse> HttpClient::RequestOnce(const std::string& head, const std::string& body) {
  if (fd_ < 0) {
    if (absl::Status st = Connect(); !st.ok()) return st;
  }
  HttpResponse resp;
  const uint64_t send_start = NowNs();
  size_t sent = 0;
  const size_t total = head.size() + body.size();
  while (sent < total) {
    iovec iov[2];
    int n = 0;
    if (sent < head.size()) {
      iov[n++] = {const_cast<char*>(head.data()) + sent, head.size() - sent};
      if (!body.empty()) iov[n++] = {const_cast<char*>(body.data()), body.size()};
    } else {
      iov[n++] = {const_cast<char*>(body.data()) + (sent - head.size()), total - sent};
    }
    ssize_t w = ::writev(fd_, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::AbortedError(std::string("write failed: ") + std::strerror(errno));
    }
    sent += static_cast<size_t>(w);
  }
  resp.send_ns = NowNs() - send_start;

  uint64_t first_byte = 0;
  auto fill = [&]() -> absl::Status {
    char tmp[65536];
    for (;;) {
      ssize_t r = ::read(fd_, tmp, sizeof(tmp));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return absl::DeadlineExceededError("no answer within " + std::to_string(kIoTimeoutSeconds) + " s");
      }
      if (r < 0) return absl::UnavailableError(std::string("read failed: ") + std::strerror(errno));
      if (r == 0) return absl::AbortedError("the server closed the connection");
      if (first_byte == 0) first_byte = NowNs();
      buffer_.append(tmp, static_cast<size_t>(r));
      return absl::OkStatus();
    }
  };
  size_t header_end;
  while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (absl::Status st = fill(); !st.ok()) return st;
    if (buffer_.size() > (1 << 20)) return absl::DataLossError("response header too long");
  }
  std::string_view headers(buffer_.data(), header_end);
  if (headers.size() < 12 || headers.substr(0, 5) != "HTTP/") {
    return absl::DataLossError("malformed HTTP status line");
  }
  resp.status = std::atoi(std::string(headers.substr(9, 3)).c_str());
  int64_t content_length = -1;
  size_t pos = headers.find("\r\n");
  while (pos != std::string_view::npos && pos < headers.size()) {
    size_t next = headers.find("\r\n", pos + 2);
    std::string_view line = headers.substr(pos + 2, next == std::string_view::npos ? std::string_view::npos : next - pos - 2);
    std::string_view value;
    if (HeaderIs(line, "Content-Length", &value)) {
      std::from_chars(value.data(), value.data() + value.size(), content_length);
    } else if (HeaderIs(line, "Inference-Header-Content-Length", &value)) {
      std::from_chars(value.data(), value.data() + value.size(), resp.inference_header_length);
    }
    pos = next;
  }
  if (content_length < 0) return absl::DataLossError("response without Content-Length");
  const size_t need = header_end + 4 + static_cast<size_t>(content_length);
  while (buffer_.size() < need) {
    if (absl::Status st = fill(); !st.ok()) return st;
  }
  resp.body = buffer_.substr(header_end + 4, static_cast<size_t>(content_length));
  buffer_.erase(0, need);
  resp.recv_ns = NowNs() - (first_byte ? first_byte : NowNs());
  return resp;
}

}  // namespace inferd::perf
