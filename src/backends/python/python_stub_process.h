// One Python stub process and the two channels to it: a connected socket for control messages
// (4-byte little-endian length + a message, one at a time in turn) and a memfd mapped on both sides
// for tensor bytes. memfd_create needs no /dev/shm, so a small /dev/shm (SageMaker, Fargate)
// cannot fail a request; the mapping starts at the default size and grows by the growth step
// whenever a message needs more (either side may ftruncate; the reader remaps).
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

  absl::Status Send(std::string_view message);
  // Waits for the next message until `deadline_ns` (core::NowNs clock; 0: no deadline).
  // UNAVAILABLE when the process closed its end; DEADLINE_EXCEEDED past the deadline.
  absl::StatusOr<std::string> Receive(uint64_t deadline_ns);

  // Makes the shared region at least `bytes` long (ftruncate, rounded up to the growth step)
  // and maps it; returns its start.
  absl::StatusOr<uint8_t*> Reserve(uint64_t bytes);
  // The bytes [offset, offset+size) the other side wrote (remapping when the region grew).
  absl::StatusOr<std::string_view> Region(uint64_t offset, uint64_t size);
  uint64_t mapped_bytes() const { return mapped_; }

 private:
  StubProcess() = default;
  absl::Status Remap();
  // Reads what the socket has (at least one byte) into `out`.
  absl::StatusOr<size_t> ReadSome(char* out, size_t cap, uint64_t deadline_ns);

  static constexpr size_t kReadChunk = 64 * 1024;

  pid_t pid_ = -1;
  int sock_ = -1;
  int shm_fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t mapped_ = 0;
  uint64_t growth_ = 1 << 20;
  std::string label_;
  uint64_t spin_ns_ = 0;
  std::vector<char> in_;  // bytes read, [in_pos_, in_len_) not yet returned by Receive
  size_t in_len_ = 0;
  size_t in_pos_ = 0;
};

// "exited with status 3", "was killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

}  // namespace inferd::backends::python
