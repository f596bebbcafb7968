// A small blocking HTTP/1.1 client for inferd-perf: one keep-alive connection, requests with a
// Content-Length body, responses with Content-Length. Reconnects once when the server has
// closed an idle connection. Not thread-safe: one client per thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::perf {

struct HttpResponse {
  int status = 0;
  std::string body;
  int64_t inference_header_length = -1;  // Inference-Header-Content-Length, when present
  uint64_t send_ns = 0;  // writing the request
  uint64_t recv_ns = 0;  // from the first response byte to the last
};

class HttpClient {
 public:
  HttpClient(std::string host, int port);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // `headers`: extra header lines without CRLF ("Name: value").
  absl::StatusOr<HttpResponse> Request(const std::string& method, const std::string& path,
                                       const std::vector<std::string>& headers,
                                       const std::string& body);

 private:
  absl::Status Connect();
  absl::StatusOr<HttpResponse> RequestOnce(const std::string& head, const std::string& body);
  void Close();

  std::string host_;
  int port_;
  int fd_ = -1;
  std::string buffer_;  // bytes read past the last response
};

// "host:port" -> {host, port}; the default port when none is given.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& url, int default_port);

}  // namespace inferd::perf
