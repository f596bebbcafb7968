// One Python stub process and the channels to it. Messages go through two shared-memory slots,
// one per direction (an 8-byte little-endian length, then the message), each announced by an
// eventfd doorbell: the exchange is strictly in turns (one side writes a message only after the
// other has read the one before), so one slot per direction suffices, and an eventfd wake-up
// costs about half a socket message's (no socket buffer to allocate, charge and free). A
// connected socket stays for what is not in turns (the model's log lines, which the process
// writes without waiting for an answer) and tells inferd when the process is gone (hang-up).
// Tensor bytes go in a third memfd. memfd_create needs no /dev/shm, so a small /dev/shm
// (SageMaker, Fargate) cannot fail a request; every mapping grows when a message needs more
// (the writer ftruncates; the reader remaps).
//
// Thread safety: none; the owning instance uses one process from one thread at a time.
// Lifetime: the destructor closes the descriptors and unmaps; it never waits for or kills the
// process (PythonInstance's monitor thread reaps it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd::backends::python {

struct LaunchSpec {
  std::string python = "/usr/bin/python3";
  std::string stub_dir;
  std::vector<std::string> python_path;         // prepended to PYTHONPATH
  std::map<std::string, std::string> extra_env;  // set in the child's environment
  uint64_t shm_default_bytes = 1 << 20;
  uint64_t shm_growth_bytes = 1 << 20;
  std::string label;  // "model 'm' instance 'i'", for messages
  // How long Receive polls before it sleeps (docs/python_backend.md: INFERD_PYTHON_SPIN_US).
  uint64_t spin_us = 0;
};

class StubProcess {
 public:
  static absl::StatusOr<std::unique_ptr<StubProcess>> Spawn(const LaunchSpec& spec);
  ~StubProcess();
  StubProcess(const StubProcess&) = delete;
  StubProcess& operator=(const StubProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Writes `message` to the process's slot and rings its doorbell.
  absl::Status Send(std::string_view message);
  // Waits for the next message (a log line from the socket, or the process's slot) until
  // `deadline_ns` (core::NowNs clock; 0: no deadline). UNAVAILABLE when the process closed its
  // end; DEADLINE_EXCEEDED past the deadline.
  absl::StatusOr<std::string> Receive(uint64_t deadline_ns);

  // Makes the shared region at least `bytes` long (ftruncate, rounded up to the growth step)
  // and maps it; returns its start.
  absl::StatusOr<uint8_t*> Reserve(uint64_t bytes);
  // The bytes [offset, offset+size) the other side wrote (remapping when the region grew).
  absl::StatusOr<std::string_view> Region(uint64_t offset, uint64_t size);
  uint64_t mapped_bytes() const { return tensors_.mapped; }

 private:
  // A memfd mapped here (the tensor region, a message slot), grown by its writer.
  struct Slot {
    int fd = -1;
    uint8_t* base = nullptr;
    uint64_t mapped = 0;
  };

  StubProcess() = default;
  static absl::Status MapSlot(Slot* slot);
  // A whole log line the socket brought, if one is buffered.
  bool TakeSocketMessage(std::string* out);
  // Reads what the socket holds without waiting; sets peer_closed_ at end of stream.
  absl::Status DrainSocket();
  absl::StatusOr<std::string> ReadSlot();

  static constexpr size_t kReadChunk = 64 * 1024;
  static constexpr uint64_t kSlotBytes = 64 * 1024;  // each slot's first size

  pid_t pid_ = -1;
  int sock_ = -1;
  int doorbell_out_ = -1;  // rung after writing slot_out_
  int doorbell_in_ = -1;   // rung by the process after writing slot_in_ (non-blocking here)
  Slot slot_out_;          // inferd -> process
  Slot slot_in_;           // process -> inferd
  bool slot_pending_ = false;  // slot_in_ holds a message not yet returned
  bool peer_closed_ = false;
  Slot tensors_;           // tensor bytes, both directions
  uint64_t growth_ = 1 << 20;
  std::string label_;
  uint64_t spin_ns_ = 0;
  std::vector<char> in_;  // socket bytes read, [in_pos_, in_len_) not yet returned by Receive
  size_t in_len_ = 0;
  size_t in_pos_ = 0;
};

}  // namespace inferd::backends::python
