#include "gpu/runtime.h"

#include "common/strings.h"
#include "gpu/stream_pool.h"

namespace inferd::gpu {

// The pool only keeps a reference: it calls CreateStream on first use, once `this` is whole.
Runtime::Runtime() : edge_streams_(std::make_unique<StreamPool>(*this, kEdgeStreamsPerDevice)) {}

// Pooled streams are destroyed here, after the derived runtime's destructor: a stream's
// destructor must not need the runtime (CUDA's and the fake's do not).
Runtime::~Runtime() = default;

absl::StatusOr<IpcExport> Runtime::IpcGetMemHandle(int device, const void* ptr) {
  return absl::UnimplementedError(
      inferd::StrCat("the '", name(), "' device runtime cannot export device memory to another "
                     "process"));
}

std::vector<DeviceProperties> ListDevices(const Runtime& runtime) {
  std::vector<DeviceProperties> devices;
  for (int i = 0; i < runtime.DeviceCount(); ++i) {
    auto props = runtime.Properties(i);
    if (props.ok()) devices.push_back(*std::move(props));
  }
  return devices;
}

}  // namespace inferd::gpu
