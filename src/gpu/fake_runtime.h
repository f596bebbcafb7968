// A Runtime with set devices and host memory behind them, for tests of placement and backends
// on hosts without a GPU. Copies run at once (a stream is only a device number); device memory
// is counted against each device's total, so memory accounting is testable.
#ifndef INFERD_GPU_FAKE_RUNTIME_H_
#define INFERD_GPU_FAKE_RUNTIME_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
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

  // Called by a fake DeviceBuffer's destructor.
  void Release(int device, size_t bytes);

 private:
  absl::Status CheckDevice(int device) const;

  const std::vector<DeviceProperties> devices_;
  const std::string unavailable_reason_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> used_bytes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::gpu

#endif  // INFERD_GPU_FAKE_RUNTIME_H_
