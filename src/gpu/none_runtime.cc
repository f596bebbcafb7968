// SystemRuntime() for a build without CUDA (-DINFERD_WITH_CUDA=OFF, or AUTO without the
// toolkit): no devices, and a reason that says so.
#include "gpu/fake_runtime.h"

namespace inferd::gpu {

namespace {
class NoneRuntime : public FakeRuntime {
 public:
  NoneRuntime() : FakeRuntime({}, "this inferd was built without CUDA (-DINFERD_WITH_CUDA=OFF)") {}
  std::string name() const override { return "none"; }
  // As CUDA's runtime without a device: nothing to pin memory for.
  absl::StatusOr<std::unique_ptr<PinnedBuffer>> AllocatePinned(size_t bytes) override {
    return absl::FailedPreconditionError(UnavailableReason());
  }
  // No device memory to export for another process (the Python backend's GPU inputs).
  absl::StatusOr<IpcExport> IpcGetMemHandle(int device, const void* ptr) override {
    return absl::UnimplementedError(UnavailableReason());
  }
};
}  // namespace

Runtime& SystemRuntime() {
  static Runtime* const runtime = new NoneRuntime();
  return *runtime;
}

bool BuiltWithCuda() { return false; }

}  // namespace inferd::gpu
