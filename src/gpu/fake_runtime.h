// A Runtime with set devices and host memory behind them, for tests of placement and backends
// on hosts without a GPU. Copies run at once (a stream is only a device number); device memory
// is counted against each device's total, so memory accounting is testable. The fake knows
// which host addresses stand for device memory, so a copy whose CopyKind does not match its
// pointers (host memory passed as device memory, or the reverse) fails as it would in CUDA,
// and it counts the copies of each kind, so tests can check that a tensor moved exactly once.
#ifndef INFERD_GPU_FAKE_RUNTIME_H_
#define INFERD_GPU_FAKE_RUNTIME_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "gpu/runtime.h"

namespace inferd::gpu {

class FakeRuntime : public Runtime {
 public:
  // Device i gets id i whatever `devices[i].id` says. No devices: DeviceCount() 0 with
  // `unavailable_reason` (e.g. a stand-in for the driver's error 35).
  explicit FakeRuntime(std::vector<DeviceProperties> devices,
                       std::string unavailable_reason = "no fake devices");

  // `n` devices named "Fake GPU <i>" with compute capability `major`.`minor` and
  // `memory_bytes` each.
  static std::unique_ptr<FakeRuntime> WithDevices(int n, int major = 8, int minor = 6,
                                                  uint64_t memory_bytes = 24ull << 30);

  std::string name() const override { return "fake"; }
  int DeviceCount() const override { return static_cast<int>(devices_.size()); }
  std::string UnavailableReason() const override;
  absl::StatusOr<DeviceProperties> Properties(int device) const override;
  absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const override;
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) override;
  absl::StatusOr<std::unique_ptr<PinnedBuffer>> AllocatePinned(size_t bytes) override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDevice(int device, size_t bytes) override;
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                         Stream& stream) override;

  absl::StatusOr<void*> IpcOpenMemHandle(int device, std::string_view handle) override;
  absl::Status IpcCloseMemHandle(int device, void* ptr) override;
  // ExportIpcHandle of the fake device allocation on `device` that holds `ptr`, and the
  // offset of `ptr` in it; INVALID_ARGUMENT (CUDA's cudaErrorInvalidValue) for other memory.
  absl::StatusOr<IpcExport> IpcGetMemHandle(int device, const void* ptr) override;

  // What cudaIpcGetMemHandle would give another process for `buffer` (which must be this
  // runtime's): kIpcHandleBytes bytes that IpcOpenMemHandle maps back to its memory.
  std::string ExportIpcHandle(const DeviceBuffer& buffer) const;
  // Handles opened and not yet closed.
  int OpenIpcHandles() const;

  // Copies made so far with `kind`.
  int CopyCount(CopyKind kind) const;
  // Streams CreateStream made so far on `device` (0 for one that does not exist).
  int StreamsCreated(int device) const;

  // Called by a fake DeviceBuffer's destructor.
  void Release(int device, const void* data, size_t bytes);

 private:
  absl::Status CheckDevice(int device) const;
  // The device whose fake memory holds [p, p + bytes), or -1 when none does.
  int DeviceOf(const void* p, size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Allocation {
    const char* begin;
    size_t size;
    int device;
  };

  const std::vector<DeviceProperties> devices_;
  const std::string unavailable_reason_;
  mutable inferd::Mutex mu_;
  std::vector<uint64_t> used_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<Allocation> allocations_ ABSL_GUARDED_BY(mu_);  // live fake device memory
  int copies_[3] ABSL_GUARDED_BY(mu_) = {0, 0, 0};             // by CopyKind
  std::vector<int> streams_created_ ABSL_GUARDED_BY(mu_);     // by device
  std::vector<const void*> open_ipc_ ABSL_GUARDED_BY(mu_);     // IpcOpenMemHandle's results
};

}  // namespace inferd::gpu

#endif  // INFERD_GPU_FAKE_RUNTIME_H_
