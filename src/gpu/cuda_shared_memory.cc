#include "gpu/cuda_shared_memory.h"

#include <utility>

#include "common/logging.h"
#include "common/strings.h"

namespace inferd::gpu {

bool SupportsCudaSharedMemory(const Runtime* runtime) {
  return runtime != nullptr && runtime->name() != "none";
}

absl::StatusOr<std::unique_ptr<CudaIpcRegion>> CudaIpcRegion::Open(Runtime* runtime,
                                                                   std::string_view name,
                                                                   std::string_view raw_handle,
                                                                   int64_t device_id,
                                                                   uint64_t byte_size) {
  if (!SupportsCudaSharedMemory(runtime)) {
    // Triton's answer when built without GPU support.
    return absl::InvalidArgumentError(inferd::StrCat(
        "failed to register CUDA shared memory region: '", name, "', GPUs not supported"));
  }
  auto fail = [&](std::string_view why) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "failed to register CUDA shared memory region '", name,
        "': failed to open CUDA IPC handle: ", why));
  };
  if (runtime->DeviceCount() == 0) {
    // Where Triton's cudaIpcOpenMemHandle fails for want of a device or a driver.
    return fail(inferd::StrCat("this server has no GPU (", runtime->UnavailableReason(),
                               "); use system shared memory (/v2/systemsharedmemory)"));
  }
  if (raw_handle.size() != kIpcHandleBytes) {
    return fail(inferd::StrCat("'raw_handle' must be the ", kIpcHandleBytes,
                               " bytes of a cudaIpcMemHandle_t, got ", raw_handle.size()));
  }
  if (byte_size == 0) return fail("'byte_size' must be positive");
  if (device_id < 0 || device_id >= runtime->DeviceCount()) {
    return fail(inferd::StrCat("'device_id' ", device_id, " is not a GPU of this server (it has ",
                               runtime->DeviceCount(), ")"));
  }
  absl::StatusOr<void*> base = runtime->IpcOpenMemHandle(static_cast<int>(device_id), raw_handle);
  if (!base.ok()) return fail(std::string(base.status().message()));
  return std::unique_ptr<CudaIpcRegion>(new CudaIpcRegion(
      runtime, std::string(name), static_cast<int>(device_id), byte_size, *base));
}

CudaIpcRegion::~CudaIpcRegion() {
  if (absl::Status st = runtime_->IpcCloseMemHandle(device_id_, base_); !st.ok()) {
    LOG_WARNING << "closing CUDA shared memory region '" << name_ << "': " << st.message();
  }
}

}  // namespace inferd::gpu
