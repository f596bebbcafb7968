// An HTTP/1.1 server on epoll: one event loop per thread, each with its own SO_REUSEPORT
// listening socket, keep-alive, and pipelining handled by answering one request at a time per
// connection in order. Handlers may answer later from any thread through a Responder; the
// answer is handed to the loop that owns the connection (an eventfd wakes it), so all socket
// I/O and response serialization happen on that loop's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "frontends/http/http_parser.h"

namespace inferd::http {

struct HttpResponse {
  int status = 200;
  std::string content_type;  // empty: no Content-Type header
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Sent after `body` without copying (binary tensors); `holders` keep them alive.
  std::vector<std::string_view> tail;
  std::vector<std::shared_ptr<const void>> holders;
  bool close = false;
  // A response in parts (chunked transfer encoding, e.g. server-sent events): one kStart (the
  // status and headers, `body` as the first chunk), any kChunk, one kEnd (`body`, then the
  // last chunk). Each part is one Responder::Post, in order; `tail` is not used.
  enum class Stream : uint8_t { kWhole, kStart, kChunk, kEnd };
  Stream stream = Stream::kWhole;
};

class EventLoop;

// Answers one request. Exactly one of Send or Post must be called, once, from any thread;
// a streamed response (HttpResponse::stream) is several Posts, its parts in order.
// Destroying a Responder that was never used answers 500.
class Responder {
 public:
  Responder(EventLoop* loop, uint64_t connection_id) : loop_(loop), connection_id_(connection_id) {}
  ~Responder();
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  void Send(HttpResponse response);
  // Runs `make` on the connection's loop thread and sends its result: for work (like
  // serializing a large response) that belongs on the I/O thread.
  void Post(std::function<HttpResponse()> make);

 private:
  EventLoop* loop_;
  uint64_t connection_id_;
  bool used_ = false;
};

// `body_owner` keeps the bytes `request.body` (and every other view in `request`) points into
// alive for as long as the handler holds it.
using HttpHandler = std::function<void(const HttpRequest& request,
                                       std::shared_ptr<const void> body_owner,
                                       std::unique_ptr<Responder> responder)>;

struct HttpServerOptions {
  std::string address = "0.0.0.0";
  int port = 8000;
  int threads = 2;
  ParserLimits limits;
  // A connection with no request in progress is closed after this long without traffic.
  int idle_timeout_secs = 300;
  // A request must arrive whole within this long of its first byte, or it is answered 408 and
  // the connection closed (a client trickling bytes cannot hold a connection forever).
  int request_timeout_secs = 60;
  // Connections beyond this many are answered 503 and closed at once (0: the process's
  // descriptor limit less a reserve for models and files).
  int max_connections = 0;
  // A client that disconnects (or shuts its sending side) before its answer cancels the request
  // in flight (core/cancellation.h). Off: the request runs and its answer is dropped.
  bool cancel_on_disconnect = true;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();

  // Binds and starts the loops. Fails when the address cannot be bound.
  absl::Status Start();
  // Stops accepting and closes every connection; joins the loop threads.
  void Stop();
  int port() const { return port_; }

 private:
  HttpServerOptions options_;
  HttpHandler handler_;
  int port_ = 0;
  std::atomic<int> connections_{0};
  std::vector<std::unique_ptr<EventLoop>> loops_;
  std::vector<std::thread> threads_;
};

}  // namespace inferd::http
