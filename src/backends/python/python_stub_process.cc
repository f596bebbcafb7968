#include "backends/python/python_stub_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/strings.h"
#include "common/subprocess.h"
#include "core/infer_request.h"

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
  p->tensors_.fd = HighFd(memfd);
  if (ftruncate(p->tensors_.fd, static_cast<off_t>(std::max<uint64_t>(spec.shm_default_bytes, 4096))) != 0) {
    close(child_sock);
    return Errno(inferd::StrCat("sizing the shared memory of ", spec.label, " to ",
                                spec.shm_default_bytes, " bytes"));
  }
  if (auto st = MapSlot(&p->tensors_); !st.ok()) {
    close(child_sock);
    return st;
  }
  // The message slots and their doorbells. The process blocks on its doorbell; inferd's is
  // non-blocking (it polls it with the socket, which tells it when the process is gone).
  p->doorbell_out_ = eventfd(0, EFD_CLOEXEC);
  p->doorbell_in_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  for (Slot* slot : {&p->slot_out_, &p->slot_in_}) {
    const int fd = memfd_create("inferd-python-messages", MFD_CLOEXEC);
    if (fd >= 0) slot->fd = HighFd(fd);
  }
  if (p->doorbell_out_ < 0 || p->doorbell_in_ < 0 || p->slot_out_.fd < 0 || p->slot_in_.fd < 0) {
    close(child_sock);
    return Errno(inferd::StrCat("creating the message channel of ", spec.label));
  }
  p->doorbell_out_ = HighFd(p->doorbell_out_);
  p->doorbell_in_ = HighFd(p->doorbell_in_);
  for (Slot* slot : {&p->slot_out_, &p->slot_in_}) {
    absl::Status st =
        ftruncate(slot->fd, kSlotBytes) == 0 ? MapSlot(slot) : Errno("sizing a message slot");
    if (!st.ok()) {
      close(child_sock);
      return st;
    }
  }

  std::string python_path;
  for (const auto& dir : spec.python_path) {
    if (!python_path.empty()) python_path += ":";
    python_path += dir;
  }
  SpawnOptions child;
  for (std::string& kv : CurrentEnvironment()) {
    if (kv.rfind("INFERD_PYTHON_", 0) == 0) continue;
    if (kv.rfind("PYTHONPATH=", 0) == 0) {
      if (!python_path.empty()) python_path += ":";
      python_path += kv.substr(11);
      continue;
    }
    bool overridden = false;
    for (const auto& [k, v] : spec.extra_env) overridden |= kv.rfind(k + "=", 0) == 0;
    if (!overridden) child.env.push_back(std::move(kv));
  }
  if (!python_path.empty()) child.env.push_back("PYTHONPATH=" + python_path);
  for (const auto& [k, v] : spec.extra_env) child.env.push_back(k + "=" + v);
  child.env.push_back("INFERD_PYTHON_FD=3");
  child.env.push_back("INFERD_PYTHON_SHM_FD=4");
  child.env.push_back("INFERD_PYTHON_DOORBELL_IN=5");   // the process's: inferd rings it
  child.env.push_back("INFERD_PYTHON_DOORBELL_OUT=6");
  child.env.push_back("INFERD_PYTHON_SLOT_IN=7");
  child.env.push_back("INFERD_PYTHON_SLOT_OUT=8");
  child.env.push_back(inferd::StrCat("INFERD_PYTHON_SHM_GROWTH=", p->growth_));
  child.env.push_back("PYTHONUNBUFFERED=1");
  child.program = spec.python;
  child.argv = {spec.python, spec.stub_dir + "/inferd_python_stub.py"};
  child.fds = {{child_sock, 3},           {p->tensors_.fd, 4},   {p->doorbell_out_, 5},
               {p->doorbell_in_, 6},      {p->slot_out_.fd, 7},  {p->slot_in_.fd, 8}};
  absl::StatusOr<pid_t> pid = SpawnProcess(child);
  close(child_sock);
  if (!pid.ok()) {
    return absl::FailedPreconditionError(
        inferd::StrCat(spec.label, ": cannot start the Python interpreter '", spec.python,
                       "': ", pid.status().message()));
  }
  p->pid_ = *pid;
  return p;
}

StubProcess::~StubProcess() {
  for (Slot* slot : {&tensors_, &slot_out_, &slot_in_}) {
    if (slot->base != nullptr) munmap(slot->base, slot->mapped);
    if (slot->fd >= 0) close(slot->fd);
  }
  for (int fd : {sock_, doorbell_out_, doorbell_in_}) {
    if (fd >= 0) close(fd);
  }
}

absl::Status StubProcess::MapSlot(Slot* slot) {
  struct stat st;
  if (fstat(slot->fd, &st) != 0) return Errno("fstat of a shared mapping");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size <= slot->mapped) return absl::OkStatus();
  void* addr = slot->base == nullptr
                   ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, slot->fd, 0)
                   : mremap(slot->base, slot->mapped, size, MREMAP_MAYMOVE);
  if (addr == MAP_FAILED) {
    return Errno(inferd::StrCat("mapping ", size, " bytes of shared memory"));
  }
  slot->base = static_cast<uint8_t*>(addr);
  slot->mapped = size;
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> StubProcess::Reserve(uint64_t bytes) {
  if (bytes > tensors_.mapped) {
    struct stat st;
    if (fstat(tensors_.fd, &st) != 0) return Errno("fstat of the shared memory");
    if (static_cast<uint64_t>(st.st_size) < bytes) {
      const uint64_t size = (bytes + growth_ - 1) / growth_ * growth_;
      if (ftruncate(tensors_.fd, static_cast<off_t>(size)) != 0) {
        return absl::ResourceExhaustedError(inferd::StrCat(
            label_, ": cannot grow the shared memory to ", size, " bytes: ", std::strerror(errno)));
      }
    }
    if (auto st2 = MapSlot(&tensors_); !st2.ok()) return st2;
  }
  return tensors_.base;
}

absl::StatusOr<std::string_view> StubProcess::Region(uint64_t offset, uint64_t size) {
  if (offset + size > tensors_.mapped) {
    if (auto st = MapSlot(&tensors_); !st.ok()) return st;
    if (offset + size > tensors_.mapped || offset + size < offset) {
      return absl::InternalError(inferd::StrCat(label_, ": the Python process named bytes ",
                                                offset, "+", size, " past the shared memory (",
                                                tensors_.mapped, " bytes)"));
    }
  }
  return std::string_view(reinterpret_cast<const char*>(tensors_.base) + offset, size);
}

absl::Status StubProcess::Send(std::string_view message) {
  const uint64_t n = message.size();
  if (8 + n > slot_out_.mapped) {
    const uint64_t size =
        std::max(slot_out_.mapped * 2, (8 + n + kSlotBytes - 1) / kSlotBytes * kSlotBytes);
    if (ftruncate(slot_out_.fd, static_cast<off_t>(size)) != 0) {
      return absl::ResourceExhaustedError(inferd::StrCat(
          label_, ": cannot grow the message slot to ", size, " bytes: ", std::strerror(errno)));
    }
    if (auto st = MapSlot(&slot_out_); !st.ok()) return st;
  }
  std::memcpy(slot_out_.base, &n, 8);  // little-endian, as the process reads it
  if (n != 0) std::memcpy(slot_out_.base + 8, message.data(), n);
  const uint64_t one = 1;
  while (write(doorbell_out_, &one, 8) != 8) {
    if (errno != EINTR) return Errno(inferd::StrCat("ringing the Python process of ", label_));
  }
  return absl::OkStatus();
}

bool StubProcess::TakeSocketMessage(std::string* out) {
  const size_t avail = in_len_ - in_pos_;
  if (avail < 4) return false;
  const auto* h = reinterpret_cast<const unsigned char*>(in_.data() + in_pos_);
  const uint32_t n = h[0] | (h[1] << 8) | (h[2] << 16) | (uint32_t{h[3]} << 24);
  if (avail < 4 + uint64_t{n}) return false;
  out->assign(in_.data() + in_pos_ + 4, n);
  in_pos_ += 4 + n;
  if (in_pos_ == in_len_) in_pos_ = in_len_ = 0;
  return true;
}

absl::Status StubProcess::DrainSocket() {
  // in_ only grows (resizing a string by the read size per message zero-filled 64 KiB each
  // time).
  for (;;) {
    if (in_pos_ > 0 && in_pos_ == in_len_) in_pos_ = in_len_ = 0;
    if (in_.size() - in_len_ < kReadChunk) {
      if (in_pos_ > 0) {
        std::memmove(in_.data(), in_.data() + in_pos_, in_len_ - in_pos_);
        in_len_ -= in_pos_;
        in_pos_ = 0;
      }
      if (in_.size() - in_len_ < kReadChunk) {
        in_.resize(std::max(in_.size() * 2, in_len_ + kReadChunk));
      }
    }
    const ssize_t k = recv(sock_, in_.data() + in_len_, in_.size() - in_len_, MSG_DONTWAIT);
    if (k > 0) {
      in_len_ += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) {
      peer_closed_ = true;
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
    return absl::UnavailableError(inferd::StrCat("reading from the Python process of ", label_,
                                                 ": ", std::strerror(errno)));
  }
}

absl::StatusOr<std::string> StubProcess::ReadSlot() {
  uint64_t n;
  std::memcpy(&n, slot_in_.base, 8);
  if (8 + n > slot_in_.mapped || 8 + n < n) {
    if (auto st = MapSlot(&slot_in_); !st.ok()) return st;  // the process grew it
    if (8 + n > slot_in_.mapped || 8 + n < n) {
      return absl::InternalError(inferd::StrCat(label_, ": the Python process wrote a message of ",
                                                n, " bytes past its slot (", slot_in_.mapped,
                                                " bytes)"));
    }
  }
  return std::string(reinterpret_cast<const char*>(slot_in_.base) + 8, n);
}

absl::StatusOr<std::string> StubProcess::Receive(uint64_t deadline_ns) {
  // The log lines the process wrote to the socket before it rang come first: it writes them,
  // then its slot, then rings, so a ring seen means they are already in the socket.
  // A short spin first (spin_ns_): an answer that comes within it is taken without the
  // scheduler's wake-up (tens of microseconds on a virtual machine).
  const uint64_t spin_until = spin_ns_ != 0 ? core::NowNs() + spin_ns_ : 0;
  std::string message;
  for (;;) {
    if (TakeSocketMessage(&message)) return message;
    if (slot_pending_) {
      slot_pending_ = false;
      return ReadSlot();
    }
    if (peer_closed_) {
      return absl::UnavailableError(
          inferd::StrCat("the Python process of ", label_, " closed its connection"));
    }
    if (spin_until != 0 && core::NowNs() < spin_until) {
      uint64_t rings;
      if (read(doorbell_in_, &rings, 8) == 8) slot_pending_ = true;
      if (auto st = DrainSocket(); !st.ok()) return st;
      if (!slot_pending_ && in_len_ == in_pos_ && !peer_closed_) {
        // Leaves the CPU to whatever else wants it (the Python process itself, when both
        // share a core), so a spin never starves the side it waits for.
        sched_yield();
      }
      continue;
    }
    // The doorbell first: poll reads the descriptors in order, so a ring it sees was rung after
    // any log line the socket shows in the same call.
    struct pollfd pfd[2] = {{doorbell_in_, POLLIN, 0}, {sock_, POLLIN, 0}};
    int timeout_ms = -1;
    if (deadline_ns != 0) {
      const uint64_t now = core::NowNs();
      if (now >= deadline_ns) {
        return absl::DeadlineExceededError(
            inferd::StrCat("the Python process of ", label_, " did not answer in time"));
      }
      timeout_ms = static_cast<int>(std::min<uint64_t>((deadline_ns - now) / 1000000 + 1, 1 << 30));
    }
    const int r = poll(pfd, 2, timeout_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("poll");
    }
    if (pfd[0].revents & POLLIN) {
      uint64_t rings;
      if (read(doorbell_in_, &rings, 8) == 8) slot_pending_ = true;
    }
    if (pfd[1].revents != 0) {
      if (auto st = DrainSocket(); !st.ok()) return st;
    }
  }
}

}  // namespace inferd::backends::python
