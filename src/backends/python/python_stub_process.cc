#include "backends/python/python_stub_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/strings.h"
#include "core/infer_request.h"

extern char** environ;

namespace inferd::backends::python {
namespace {

absl::Status Errno(std::string_view what) {
  return absl::InternalError(inferd::StrCat(what, ": ", std::strerror(errno)));
}

// A descriptor moved above the range the child uses (3, 4), close-on-exec.
int HighFd(int fd) {
  int high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  return high;
}

}  // namespace

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return inferd::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return inferd::StrCat("was killed by signal ", sig, " (", name ? name : "?", ")");
  }
  return inferd::StrCat("stopped (wait status ", status, ")");
}

absl::StatusOr<std::unique_ptr<StubProcess>> StubProcess::Spawn(const LaunchSpec& spec) {
  std::unique_ptr<StubProcess> p(new StubProcess());
  p->label_ = spec.label;
  p->growth_ = std::max<uint64_t>(spec.shm_growth_bytes, 4096);
  p->spin_ns_ = spec.spin_us * 1000;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return Errno("socketpair");
  p->sock_ = fds[0];
  const int child_sock = HighFd(fds[1]);
  int memfd = memfd_create("inferd-python", MFD_CLOEXEC);
  if (memfd < 0) {
    close(child_sock);
    return Errno("memfd_create");
  }
  p->shm_fd_ = HighFd(memfd);
  if (ftruncate(p->shm_fd_, static_cast<off_t>(std::max<uint64_t>(spec.shm_default_bytes, 4096))) != 0) {
    close(child_sock);
    return Errno(inferd::StrCat("sizing the shared memory of ", spec.label, " to ",
                                spec.shm_default_bytes, " bytes"));
  }
  if (auto st = p->Remap(); !st.ok()) {
    close(child_sock);
    return st;
  }

  std::vector<std::string> env_strings;
  std::string python_path;
  for (const auto& dir : spec.python_path) {
    if (!python_path.empty()) python_path += ":";
    python_path += dir;
  }
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    if (kv.rfind("INFERD_PYTHON_", 0) == 0) continue;
    if (kv.rfind("PYTHONPATH=", 0) == 0) {
      if (!python_path.empty()) python_path += ":";
      python_path += std::string(kv.substr(11));
      continue;
    }
    bool overridden = false;
    for (const auto& [k, v] : spec.extra_env) overridden |= kv.rfind(k + "=", 0) == 0;
    if (!overridden) env_strings.emplace_back(kv);
  }
  if (!python_path.empty()) env_strings.push_back("PYTHONPATH=" + python_path);
  for (const auto& [k, v] : spec.extra_env) env_strings.push_back(k + "=" + v);
  env_strings.push_back("INFERD_PYTHON_FD=3");
  env_strings.push_back("INFERD_PYTHON_SHM_FD=4");
  env_strings.push_back(inferd::StrCat("INFERD_PYTHON_SHM_GROWTH=", p->growth_));
  env_strings.push_back("PYTHONUNBUFFERED=1");
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::string stub = spec.stub_dir + "/inferd_python_stub.py";
  std::string python = spec.python;
  std::vector<char*> argv = {python.data(), stub.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_sock, 3);
  posix_spawn_file_actions_adddup2(&actions, p->shm_fd_, 4);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The child must not inherit inferd's blocked signals (main blocks SIGTERM/SIGINT for sigwait).
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigset_t defaults;
  sigfillset(&defaults);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, python.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(child_sock);
  if (rc != 0) {
    return absl::FailedPreconditionError(inferd::StrCat(
        spec.label, ": cannot start the Python interpreter '", python, "': ", std::strerror(rc)));
  }
  p->pid_ = pid;
  return p;
}

StubProcess::~StubProcess() {
  if (base_ != nullptr) munmap(base_, mapped_);
  if (sock_ >= 0) close(sock_);
  if (shm_fd_ >= 0) close(shm_fd_);
}

absl::Status StubProcess::Remap() {
  struct stat st;
  if (fstat(shm_fd_, &st) != 0) return Errno("fstat of the shared memory");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size <= mapped_) return absl::OkStatus();
  void* addr = base_ == nullptr
                   ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd_, 0)
                   : mremap(base_, mapped_, size, MREMAP_MAYMOVE);
  if (addr == MAP_FAILED) return Errno(inferd::StrCat("mapping ", size, " bytes of shared memory"));
  base_ = static_cast<uint8_t*>(addr);
  mapped_ = size;
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> StubProcess::Reserve(uint64_t bytes) {
  if (bytes > mapped_) {
    struct stat st;
    if (fstat(shm_fd_, &st) != 0) return Errno("fstat of the shared memory");
    if (static_cast<uint64_t>(st.st_size) < bytes) {
      const uint64_t size = (bytes + growth_ - 1) / growth_ * growth_;
      if (ftruncate(shm_fd_, static_cast<off_t>(size)) != 0) {
        return absl::ResourceExhaustedError(inferd::StrCat(
            label_, ": cannot grow the shared memory to ", size, " bytes: ", std::strerror(errno)));
      }
    }
    if (auto st2 = Remap(); !st2.ok()) return st2;
  }
  return base_;
}

absl::StatusOr<std::string_view> StubProcess::Region(uint64_t offset, uint64_t size) {
  if (offset + size > mapped_) {
    if (auto st = Remap(); !st.ok()) return st;
    if (offset + size > mapped_ || offset + size < offset) {
      return absl::InternalError(inferd::StrCat(label_, ": the Python process named bytes ",
                                                offset, "+", size, " past the shared memory (",
                                                mapped_, " bytes)"));
    }
  }
  return std::string_view(reinterpret_cast<const char*>(base_) + offset, size);
}

absl::Status StubProcess::Send(std::string_view message) {
  const uint32_t n = static_cast<uint32_t>(message.size());
  const unsigned char header[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                   static_cast<unsigned char>(n >> 16),
                                   static_cast<unsigned char>(n >> 24)};
  struct iovec iov[2] = {{const_cast<unsigned char*>(header), 4},
                         {const_cast<char*>(message.data()), message.size()}};
  size_t left = 4 + message.size();
  int first = 0;
  while (left > 0) {
    struct msghdr msg = {};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = 2 - first;
    const ssize_t w = sendmsg(sock_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(inferd::StrCat("the Python process of ", label_,
                                                   " is gone (", std::strerror(errno), ")"));
    }
    left -= static_cast<size_t>(w);
    size_t done = static_cast<size_t>(w);
    while (first < 2 && done >= iov[first].iov_len) {
      done -= iov[first].iov_len;
      ++first;
    }
    if (first < 2) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + done;
      iov[first].iov_len -= done;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> StubProcess::ReadSome(char* out, size_t cap, uint64_t deadline_ns) {
  // A short spin first: an answer that comes within spin_ns_ is taken without the scheduler's
  // wake-up (tens of microseconds on a virtual machine).
  const uint64_t spin_until = spin_ns_ != 0 ? core::NowNs() + spin_ns_ : 0;
  for (;;) {
    const bool wait = spin_until == 0 || core::NowNs() >= spin_until;
    if (wait && deadline_ns != 0) {
      const uint64_t now = core::NowNs();
      if (now >= deadline_ns) {
        return absl::DeadlineExceededError(
            inferd::StrCat("the Python process of ", label_, " did not answer in time"));
      }
      struct pollfd pfd = {sock_, POLLIN, 0};
      const int ms = static_cast<int>(std::min<uint64_t>((deadline_ns - now) / 1000000 + 1, 1 << 30));
      const int r = poll(&pfd, 1, ms);
      if (r < 0 && errno != EINTR) return Errno("poll");
      if (r <= 0) continue;
    }
    const ssize_t k = recv(sock_, out, cap, wait && deadline_ns == 0 ? 0 : MSG_DONTWAIT);
    if (k > 0) return static_cast<size_t>(k);
    if (k == 0) {
      return absl::UnavailableError(
          inferd::StrCat("the Python process of ", label_, " closed its connection"));
    }
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
      // Leaves the CPU to whatever else wants it (the Python process itself, when both share
      // a core), so a spin never starves the side it waits for.
      sched_yield();
      continue;
    }
    return absl::UnavailableError(inferd::StrCat("reading from the Python process of ", label_,
                                                 ": ", std::strerror(errno)));
  }
}

absl::StatusOr<std::string> StubProcess::Receive(uint64_t deadline_ns) {
  // Messages may arrive together (a model's log lines, then its answer): whatever one read
  // returns past the current message stays in in_ for the next call. in_ only grows (resizing
  // a string by the read size per message zero-filled 64 KiB each time).
  for (;;) {
    const size_t avail = in_len_ - in_pos_;
    if (avail >= 4) {
      const auto* h = reinterpret_cast<const unsigned char*>(in_.data() + in_pos_);
      const uint32_t n = h[0] | (h[1] << 8) | (h[2] << 16) | (uint32_t{h[3]} << 24);
      if (avail >= 4 + uint64_t{n}) {
        std::string body(in_.data() + in_pos_ + 4, n);
        in_pos_ += 4 + n;
        if (in_pos_ == in_len_) in_pos_ = in_len_ = 0;
        return body;
      }
    }
    if (in_pos_ > 0) {
      std::memmove(in_.data(), in_.data() + in_pos_, avail);
      in_len_ = avail;
      in_pos_ = 0;
    }
    if (in_.size() - in_len_ < kReadChunk) in_.resize(std::max(in_.size() * 2, in_len_ + kReadChunk));
    auto k = ReadSome(in_.data() + in_len_, in_.size() - in_len_, deadline_ns);
    if (!k.ok()) return k.status();
    in_len_ += *k;
  }
}

}  // namespace inferd::backends::python
