#include "frontends/http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/strings.h"

namespace inferd::http {
namespace {

constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
constexpr size_t kMinFree = 16 * 1024;
constexpr int64_t kSweepIntervalNs = 1'000'000'000;

// A growable byte buffer that, unlike std::string, does not zero what it allocates: each
// request's bytes are read straight into it and it becomes the request's body owner. Grown
// while the size is unknown (a chunked body), it becomes mapped pages from 1 MiB on, grown by
// mremap: the kernel moves the pages, nothing is copied, and pages not yet read into are not
// resident; with the chunked body decoded in place, the buffer is the body, held once.
struct ReadBuffer {
  char* data = nullptr;
  size_t size = 0;
  size_t capacity = 0;
  bool mapped = false;
  // The size of the whole request at the front, once its headers are in and it has a
  // Content-Length (0: not known yet; kGrow: chunked or malformed, grow geometrically).
  size_t expected = 0;
  static constexpr size_t kGrow = ~size_t{0};
  static constexpr size_t kMapFrom = 1 << 20;
  ChunkedDecoder chunked;  // a chunked body being decoded in place

  ReadBuffer() = default;
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;
  ~ReadBuffer() {
    if (mapped) {
      munmap(data, capacity);
    } else {
      delete[] data;
    }
  }

  // Exactly n bytes (a known request size): one heap allocation.
  void Reserve(size_t n) {
    if (n <= capacity) return;
    if (mapped) return Grow(n);
    char* fresh = new char[n];
    if (size) std::memcpy(fresh, data, size);
    delete[] data;
    data = fresh;
    capacity = n;
  }
  // At least n bytes, size unknown: mapped pages from kMapFrom on.
  void Grow(size_t n) {
    if (n <= capacity) return;
    if (n < kMapFrom && !mapped) return Reserve(n);
    const size_t page = 4096;
    n = (n + page - 1) / page * page;
    void* p = mapped ? mremap(data, capacity, n, MREMAP_MAYMOVE)
                     : mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (!mapped) {
      if (size) std::memcpy(p, data, size);
      delete[] data;
      mapped = true;
    }
    data = static_cast<char*>(p);
    capacity = n;
  }
  std::string_view view() const { return {data, size}; }
};

std::string_view StatusText(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 403: return "Forbidden";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    default: return "Unknown";
  }
}

thread_local EventLoop* tls_loop = nullptr;

}  // namespace

class EventLoop {
 public:
  EventLoop(const HttpServerOptions* options, const HttpHandler* handler, int listen_fd,
            std::atomic<int>* connections, int max_connections)
      : options_(options), handler_(handler), listen_fd_(listen_fd), connections_(connections),
        max_connections_(max_connections) {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenId;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    ev.data.u64 = kWakeId;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  }

  ~EventLoop() {
    for (int fd : rejected_) ::close(fd);
    for (auto& [id, c] : conns_) {
      ::close(c->fd);
      connections_->fetch_sub(1, std::memory_order_relaxed);
    }
    ::close(listen_fd_);
    ::close(wake_fd_);
    ::close(epfd_);
  }

  void Run() {
    tls_loop = this;
    epoll_event events[128];
    int64_t next_sweep = NowNs() + kSweepIntervalNs;
    while (!stop_.load(std::memory_order_acquire)) {
      // Wake at least once a second to close idle and too-slow connections.
      int n = epoll_wait(epfd_, events, 128, conns_.empty() && rejected_.empty() ? -1 : 1000);
      const int64_t now = NowNs();
      if (now >= next_sweep) {
        Sweep(now);
        next_sweep = now + kSweepIntervalNs;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        LOG_ERROR << "epoll_wait: " << std::strerror(errno);
        break;
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          Accept();
        } else if (id == kWakeId) {
          uint64_t v;
          ssize_t unused = ::read(wake_fd_, &v, sizeof(v));
          (void)unused;
          DrainPending();
        } else {
          auto it = conns_.find(id);
          if (it == conns_.end()) continue;
          Connection* c = it->second.get();
          if (events[i].events & (EPOLLERR | EPOLLHUP)) {
            c->dead = true;
          } else {
            if (events[i].events & EPOLLOUT) Flush(c);
            if (events[i].events & (EPOLLIN | EPOLLRDHUP)) {
              Read(c);
              ProcessInput(c);
              if ((events[i].events & EPOLLRDHUP) && !c->peer_closed) {
                // The client's FIN came in the same read as its request: Read stopped at the
                // short read, before the recv that returns 0, and edge-triggered epoll reports
                // the FIN no more. The request just handed off is abandoned like any other
                // whose client went away (docs/cancellation.md).
                c->peer_closed = true;
                if (!c->in_flight) c->dead = true;
                CancelInFlight(c);
              }
            }
          }
          CloseIfDead(c);
        }
      }
    }
    tls_loop = nullptr;
  }

  void Stop() {
    stop_.store(true, std::memory_order_release);
    Wake();
  }

  // Thread-safe: queue a response for a connection owned by this loop.
  void Deliver(uint64_t id, std::function<HttpResponse()> make) {
    if (tls_loop == this) {
      Respond(id, make());
      return;
    }
    bool wake;
    {
      inferd::MutexLock lock(&pending_mu_);
      // One wake-up per batch of completions: the loop drains everything queued.
      wake = pending_.empty();
      pending_.emplace_back(id, std::move(make));
    }
    if (wake) Wake();
  }

 private:
  struct Connection {
    int fd = -1;
    uint64_t id = 0;
    std::shared_ptr<ReadBuffer> in = std::make_shared<ReadBuffer>();
    std::string out;  // bytes a partial write left behind
    bool in_flight = false;
    bool close_after = false;
    bool sent_continue = false;
    bool processing = false;
    bool dead = false;
    bool peer_closed = false;
    // Read stopped with bytes possibly left in the socket (the in-flight limit, or a whole
    // request already buffered). The socket is edge-triggered, so no event comes for those
    // bytes: the answer's Respond reads them. Otherwise every read has drained the socket and
    // a read after the answer would only return EAGAIN (one syscall per request for nothing).
    bool read_paused = false;
    int64_t last_io_ns = 0;        // last byte read or written
    int64_t request_start_ns = 0;  // first byte of the request being received (0: none)
    // The request in flight's; cancelled when the client goes away before its answer.
    std::shared_ptr<core::CancellationToken> cancel;
  };

  // The client can no longer receive the answer of the request in flight: let whoever holds
  // it drop it (a queued request never runs; a running batch may stop).
  static void CancelInFlight(Connection* c) {
    if (c->in_flight && c->cancel) c->cancel->Cancel();
    c->cancel.reset();
  }

  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Closes connections idle past idle_timeout_secs and answers 408 to requests that have not
  // arrived whole within request_timeout_secs.
  void Sweep(int64_t now) {
    for (int fd : rejected_) {
      char sink[4096];
      while (::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
      }
      ::close(fd);
    }
    rejected_.clear();
    const int64_t idle_ns = int64_t{options_->idle_timeout_secs} * 1'000'000'000;
    const int64_t request_ns = int64_t{options_->request_timeout_secs} * 1'000'000'000;
    std::vector<Connection*> expired;
    for (auto& [id, c] : conns_) {
      if (c->in_flight || c->dead) continue;
      if (c->in->size > 0 && c->request_start_ns != 0 && now - c->request_start_ns > request_ns) {
        expired.push_back(c.get());
      } else if (now - c->last_io_ns > idle_ns) {
        c->dead = true;
        expired.push_back(c.get());
      }
    }
    for (Connection* c : expired) {
      if (c->dead) {
        CloseIfDead(c);
        continue;
      }
      HttpResponse resp;
      resp.status = 408;
      resp.content_type = "application/json";
      resp.body = inferd::StrCat("{\"error\":\"the request did not arrive whole within ",
                                 options_->request_timeout_secs, " seconds\"}");
      resp.close = true;
      c->in_flight = true;
      c->in->size = 0;
      Respond(c->id, std::move(resp));
    }
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t unused = ::write(wake_fd_, &one, sizeof(one));
    (void)unused;
  }

  void Accept() {
    for (;;) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;  // EAGAIN, or out of descriptors: try again on the next event
      }
      if (connections_->fetch_add(1, std::memory_order_relaxed) >= max_connections_) {
        connections_->fetch_sub(1, std::memory_order_relaxed);
        static constexpr std::string_view kBusy =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Content-Length: 50\r\nConnection: close\r\n\r\n"
            "{\"error\":\"the server has too many connections\"}";
        ssize_t unused = ::send(fd, kBusy.data(), kBusy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)unused;
        // Closing now, with the client's request unread, would reset the connection and could
        // destroy the answer before the client reads it: finish sending, close on the next sweep.
        shutdown(fd, SHUT_WR);
        rejected_.push_back(fd);
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      c->id = next_id_++;
      c->last_io_ns = NowNs();
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      ev.data.u64 = c->id;
      epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
      conns_[c->id] = std::move(c);
    }
  }

  void Read(Connection* c) {
    c->read_paused = false;
    for (;;) {
      ReadBuffer& in = *c->in;
      // While a request is in flight, read no more than one more request's worth.
      if (c->in_flight &&
          in.size > options_->limits.max_body_bytes + options_->limits.max_header_bytes) {
        c->read_paused = true;
        return;
      }
      if (in.capacity - in.size < kMinFree) {
        // A body too large for the first buffer: once its size is known, allocate the whole
        // request once and read into place (doubling would copy it ~once more and hold 1.5-2x
        // of it at the switch); until then, or when chunked, grow geometrically.
        if (in.expected == 0) in.expected = ExpectedRequestSize(in.view());
        if (in.expected != ReadBuffer::kGrow && in.expected != 0) {
          if (in.size >= in.expected) {  // whole: ProcessInput hands it off first
            c->read_paused = true;
            return;
          }
          in.Reserve(in.expected);
        } else {
          in.Grow(std::max(in.capacity * 2, in.size + kMinFree));
        }
      }
      const size_t want = in.capacity - in.size;
      ssize_t n = ::recv(c->fd, in.data + in.size, want, 0);
      if (n > 0) {
        c->last_io_ns = NowNs();
        if (in.size == 0 && !c->in_flight) c->request_start_ns = c->last_io_ns;
        in.size += n;
        if (static_cast<size_t>(n) < want) return;  // drained for now
        continue;
      }
      if (n == 0) {
        // End of stream (the client closed, or shut its sending side: HTTP/1.1 clients that
        // still wait for an answer do not; the request in flight is treated as abandoned).
        c->peer_closed = true;
        if (!c->in_flight) c->dead = true;
        CancelInFlight(c);
        return;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) c->dead = true;
      return;
    }
  }

  // The whole size of the request `buffer` starts with, when its headers give it (0: the
  // headers are not all in yet; kGrow: chunked or malformed, ProcessInput deals with it).
  size_t ExpectedRequestSize(std::string_view buffer) const {
    HttpRequest request;
    ParseResult r = ParseHttpRequest(buffer, options_->limits, &request, nullptr);
    if (r.state == ParseState::kComplete) return r.consumed;
    if (r.state == ParseState::kError) return ReadBuffer::kGrow;
    return r.headers_complete ? r.expected_total : 0;
  }

  void ProcessInput(Connection* c) {
    if (c->processing) return;
    c->processing = true;
    while (!c->in_flight && !c->dead && c->in->size > 0) {
      HttpRequest request;
      ChunkedDecoder& chunked = c->in->chunked;
      ParseResult r;
      if (!chunked.active) {
        r = ParseHttpRequest(c->in->view(), options_->limits, &request, nullptr, &chunked);
        if (r.state == ParseState::kNeedMore && chunked.active) {
          // A chunked body: decoded in place as it arrives (the buffer becomes the body).
          if (r.expect_continue && !c->sent_continue) {
            c->sent_continue = true;
            WriteRaw(c, "HTTP/1.1 100 Continue\r\n\r\n");
          }
          continue;
        }
      } else {
        r = DecodeChunkedInPlace(c->in->data, &c->in->size, options_->limits, &chunked);
        if (r.state == ParseState::kComplete) {
          // The headers again (untouched at the front), and the body decoded behind them.
          ChunkedDecoder again;
          ParseHttpRequest(std::string_view(c->in->data, chunked.body_start), options_->limits,
                           &request, nullptr, &again);
          request.body = std::string_view(c->in->data + chunked.body_start,
                                          chunked.body_end - chunked.body_start);
        }
      }
      if (r.state == ParseState::kNeedMore) {
        if (r.headers_complete) {
          // Read the body straight into place: one allocation of the whole request.
          c->in->Reserve(r.expected_total);
          if (r.expect_continue && !c->sent_continue) {
            c->sent_continue = true;
            WriteRaw(c, "HTTP/1.1 100 Continue\r\n\r\n");
          }
        }
        break;
      }
      if (r.state == ParseState::kError) {
        HttpResponse resp;
        resp.status = r.error_status;
        resp.content_type = "application/json";
        resp.body = inferd::StrCat("{\"error\":\"", r.error, "\"}");
        resp.close = true;
        c->in_flight = true;
        Respond(c->id, std::move(resp));
        break;
      }
      // Hand the buffer to the request; keep what follows it (a pipelined request).
      std::shared_ptr<ReadBuffer> owner = c->in;
      c->in = std::make_shared<ReadBuffer>();
      if (r.consumed < owner->size) {
        const size_t rest = owner->size - r.consumed;
        c->in->Reserve(std::max(rest, kMinFree));
        std::memcpy(c->in->data, owner->data + r.consumed, rest);
        c->in->size = rest;
      }
      c->in_flight = true;
      c->sent_continue = false;
      c->close_after = !request.keep_alive;
      c->request_start_ns = 0;
      if (options_->cancel_on_disconnect) {
        c->cancel = std::make_shared<core::CancellationToken>();
        request.cancel = c->cancel;
      }
      std::shared_ptr<const void> body_owner = owner;
      try {
        (*handler_)(request, body_owner, std::make_unique<Responder>(this, c->id));
      } catch (const std::exception& e) {
        LOG_ERROR << "HTTP handler threw: " << e.what();
      }
    }
    c->processing = false;
  }

  void DrainPending() {
    std::vector<std::pair<uint64_t, std::function<HttpResponse()>>> batch;
    {
      inferd::MutexLock lock(&pending_mu_);
      batch.swap(pending_);
    }
    for (auto& [id, make] : batch) Respond(id, make());
  }

  // On the loop thread: one part of a chunked response. True when it ended the response.
  bool RespondPart(Connection* c, const HttpResponse& resp) {
    c->last_io_ns = NowNs();
    std::string out;
    if (resp.stream == HttpResponse::Stream::kStart) {
      out = inferd::StrCat("HTTP/1.1 ", resp.status, " ", StatusText(resp.status),
                           "\r\nTransfer-Encoding: chunked\r\n");
      if (!resp.content_type.empty()) inferd::StrAppend(&out, "Content-Type: ", resp.content_type, "\r\n");
      for (const auto& [k, v] : resp.headers) inferd::StrAppend(&out, k, ": ", v, "\r\n");
      if (resp.close || c->close_after || c->peer_closed) {
        out.append("Connection: close\r\n");
        c->close_after = true;
      }
      out.append("\r\n");
    }
    if (!resp.body.empty()) {
      char size[24];
      std::snprintf(size, sizeof(size), "%zx\r\n", resp.body.size());
      inferd::StrAppend(&out, size, resp.body, "\r\n");
    }
    const bool end = resp.stream == HttpResponse::Stream::kEnd;
    if (end) out.append("0\r\n\r\n");
    WriteRaw(c, out);
    return end;
  }

  // On the loop thread: write a response and go on with the connection's next request.
  void Respond(uint64_t id, HttpResponse resp) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;  // the client went away
    Connection* c = it->second.get();
    const bool streamed = resp.stream != HttpResponse::Stream::kWhole;
    if (streamed && !RespondPart(c, resp)) {
      if (!c->processing) CloseIfDead(c);
      return;
    }
    c->in_flight = false;
    c->cancel.reset();
    c->last_io_ns = NowNs();
    // Pipelined bytes already read start the next request's clock now.
    if (c->in->size > 0) c->request_start_ns = c->last_io_ns;
    const bool close = resp.close || c->close_after || c->peer_closed;
    if (!streamed) WriteWhole(c, resp, close);
    if (close) {
      c->close_after = true;
      if (c->out.empty()) c->dead = true;
    }
    if (!c->dead) {
      ProcessInput(c);
      if (!c->in_flight && c->read_paused) {
        Read(c);
        ProcessInput(c);
      }
    }
    if (!c->processing) CloseIfDead(c);
  }

  void WriteWhole(Connection* c, HttpResponse& resp, bool close) {
    size_t body_size = resp.body.size();
    for (auto& t : resp.tail) body_size += t.size();
    // One allocation for the head and the body in front: its size is known up to the digits.
    size_t head_size = 96 + resp.content_type.size() + resp.body.size();
    for (const auto& [k, v] : resp.headers) head_size += k.size() + v.size() + 4;
    std::string head;
    head.reserve(head_size);
    inferd::StrAppend(&head, "HTTP/1.1 ", resp.status, " ", StatusText(resp.status),
                      "\r\nContent-Length: ", body_size, "\r\n");
    if (!resp.content_type.empty()) inferd::StrAppend(&head, "Content-Type: ", resp.content_type, "\r\n");
    for (const auto& [k, v] : resp.headers) inferd::StrAppend(&head, k, ": ", v, "\r\n");
    if (close) head.append("Connection: close\r\n");
    head.append("\r\n");
    head.append(resp.body);
    absl::InlinedVector<iovec, 8> iov;
    iov.push_back({head.data(), head.size()});
    for (auto& t : resp.tail) {
      if (!t.empty()) iov.push_back({const_cast<char*>(t.data()), t.size()});
    }
    WriteV(c, absl::MakeSpan(iov));
  }

  void WriteRaw(Connection* c, std::string_view data) {
    iovec one{const_cast<char*>(data.data()), data.size()};
    WriteV(c, absl::MakeSpan(&one, 1));
  }

  void WriteV(Connection* c, absl::Span<iovec> iov) {
    size_t idx = 0;
    if (c->out.empty()) {
      while (idx < iov.size()) {
        ssize_t n = ::writev(c->fd, iov.data() + idx, std::min<size_t>(iov.size() - idx, IOV_MAX));
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          c->dead = true;
          return;
        }
        size_t left = n;
        while (idx < iov.size() && left >= iov[idx].iov_len) {
          left -= iov[idx].iov_len;
          ++idx;
        }
        if (idx < iov.size()) {
          iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + left;
          iov[idx].iov_len -= left;
        }
      }
    }
    // Whatever the socket did not take waits in `out` for EPOLLOUT.
    for (; idx < iov.size(); ++idx) {
      c->out.append(static_cast<const char*>(iov[idx].iov_base), iov[idx].iov_len);
    }
  }

  void Flush(Connection* c) {
    while (!c->out.empty()) {
      ssize_t n = ::send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c->dead = true;
        return;
      }
      c->out.erase(0, n);
      c->last_io_ns = NowNs();
    }
    if (c->close_after && !c->in_flight) c->dead = true;
  }

  void CloseIfDead(Connection* c) {
    if (!c->dead) return;
    CancelInFlight(c);
    ::close(c->fd);
    connections_->fetch_sub(1, std::memory_order_relaxed);
    conns_.erase(c->id);
  }

  const HttpServerOptions* options_;
  const HttpHandler* handler_;
  int listen_fd_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  std::atomic<int>* connections_;
  const int max_connections_;
  std::vector<int> rejected_;  // over the connection cap: answered 503, closed on the next sweep
  uint64_t next_id_ = 2;
  std::atomic<bool> stop_{false};
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  inferd::Mutex pending_mu_;
  std::vector<std::pair<uint64_t, std::function<HttpResponse()>>> pending_
      ABSL_GUARDED_BY(pending_mu_);
};

Responder::~Responder() {
  if (!used_) {
    HttpResponse resp;
    resp.status = 500;
    resp.content_type = "application/json";
    resp.body = "{\"error\":\"internal error: request was dropped without an answer\"}";
    Send(std::move(resp));
  }
}

void Responder::Send(HttpResponse response) {
  used_ = true;
  auto shared = std::make_shared<HttpResponse>(std::move(response));
  loop_->Deliver(connection_id_, [shared]() { return std::move(*shared); });
}

void Responder::Post(std::function<HttpResponse()> make) {
  used_ = true;
  loop_->Deliver(connection_id_, std::move(make));
}

namespace {

// A listening TCP socket on `address`:`port` (IPv4 address: IPv4 only; "0.0.0.0" and "::": both
// families), non-blocking, SO_REUSEADDR, and SO_REUSEPORT where `reuse_port`.
absl::StatusOr<int> OpenListener(const std::string& address, int port, bool reuse_port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool v6 = fd >= 0;
  if (!v6) fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  auto set_reuse = [&](int s) {
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuse_port) setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  };
  set_reuse(fd);
  sockaddr_storage addr{};
  socklen_t len;
  in_addr a4{};
  if (inet_pton(AF_INET, address.c_str(), &a4) == 1 && address != "0.0.0.0") {
    if (v6) {
      ::close(fd);
      fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      set_reuse(fd);
    }
    auto* sin = reinterpret_cast<sockaddr_in*>(&addr);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    sin->sin_addr = a4;
    len = sizeof(sockaddr_in);
  } else if (v6) {
    const int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&addr);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    if (address == "0.0.0.0" || address == "::") {
      sin6->sin6_addr = in6addr_any;
    } else if (inet_pton(AF_INET6, address.c_str(), &sin6->sin6_addr) != 1) {
      ::close(fd);
      return absl::InvalidArgumentError(inferd::StrCat("invalid --http-address '", address, "'"));
    }
    len = sizeof(sockaddr_in6);
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(&addr);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    sin->sin_addr.s_addr = htonl(INADDR_ANY);
    len = sizeof(sockaddr_in);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 1024) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        inferd::StrCat("cannot listen on ", address, ":", port, ": ", std::strerror(err)));
  }
  return fd;
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start() {
  int port = options_.port;
  int max_connections = options_.max_connections;
  if (max_connections <= 0) {
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    // Leave descriptors for model files, the gRPC and metrics servers and logs.
    max_connections = static_cast<int>(std::clamp<rlim_t>(lim.rlim_cur, 256, 1 << 20)) - 128;
  }
  // Every event loop has its own SO_REUSEPORT socket, and the kernel lets any socket with that
  // option join them on the port: another server (a second inferd, or this one's metrics port
  // given the HTTP port's number) would then take a share of the connections silently. A probe
  // bound without the option first fails on a port anything listens on, as Triton's bind does.
  if (port != 0) {
    absl::StatusOr<int> probe = OpenListener(options_.address, port, /*reuse_port=*/false);
    if (!probe.ok()) return probe.status();
    ::close(*probe);
  }
  for (int i = 0; i < std::max(1, options_.threads); ++i) {
    absl::StatusOr<int> listener = OpenListener(options_.address, port, /*reuse_port=*/true);
    if (!listener.ok()) return listener.status();
    const int fd = *listener;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (port == 0) {
      // Port 0 picks an ephemeral port once; the other loops share it.
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    }
    loops_.push_back(
        std::make_unique<EventLoop>(&options_, &handler_, fd, &connections_, max_connections));
  }
  port_ = port;
  for (auto& loop : loops_) threads_.emplace_back([l = loop.get()] { l->Run(); });
  return absl::OkStatus();
}

void HttpServer::Stop() {
  for (auto& loop : loops_) loop->Stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace inferd::http
