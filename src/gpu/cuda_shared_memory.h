// One region of the CUDA shared-memory extension: GPU memory a client process allocated and
// exported with cudaIpcGetMemHandle, opened here from the handle's raw bytes (Triton's HTTP body
// {"raw_handle": {"b64": ...}, "device_id": n, "byte_size": n}, gRPC
// CudaSharedMemoryRegisterRequest's `raw_handle` bytes). The name table, status, unregister and
// bounds checks are the server's SharedMemoryManager (server/shared_memory.h), which keeps
// system and CUDA regions in one name space as Triton does; this is only the opened handle.
//
// Closed by the destructor (IpcCloseMemHandle). The manager holds each region through a
// shared_ptr that requests using it share, so the handle closes when the region is
// unregistered and the last of those requests has finished (Triton's deferred unregister).
#ifndef INFERD_GPU_CUDA_SHARED_MEMORY_H_
#define INFERD_GPU_CUDA_SHARED_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/memory_place.h"
#include "gpu/runtime.h"

namespace inferd::gpu {

class CudaIpcRegion {
 public:
  // Opens `raw_handle` (kIpcHandleBytes bytes) on GPU `device_id`; the region is its first
  // `byte_size` bytes (the client's word: the runtime cannot tell the exporter's allocation
  // size, as in Triton). `name` is for messages. INVALID_ARGUMENT, with Triton's wording
  // ("failed to register CUDA shared memory region '<name>': failed to open CUDA IPC handle:
  // <why>"), for a handle of the wrong size, a zero byte_size, a device that does not exist,
  // a runtime with no GPU (its reason) or a handle the runtime refuses; and "..., GPUs not
  // supported" when `runtime` is null or a build without CUDA (Triton built without GPU).
  // `runtime` must outlive the region.
  static absl::StatusOr<std::unique_ptr<CudaIpcRegion>> Open(Runtime* runtime,
                                                             std::string_view name,
                                                             std::string_view raw_handle,
                                                             int64_t device_id,
                                                             uint64_t byte_size);
  ~CudaIpcRegion();
  CudaIpcRegion(const CudaIpcRegion&) = delete;
  CudaIpcRegion& operator=(const CudaIpcRegion&) = delete;

  // The start of the exporter's allocation, on device_id()'s GPU.
  char* base() const { return static_cast<char*>(base_); }
  int device_id() const { return device_id_; }
  uint64_t byte_size() const { return byte_size_; }
  MemoryPlace place() const { return MemoryPlace::Gpu(device_id_); }

 private:
  CudaIpcRegion(Runtime* runtime, std::string name, int device_id, uint64_t byte_size,
                void* base)
      : runtime_(runtime), name_(std::move(name)), device_id_(device_id),
        byte_size_(byte_size), base_(base) {}

  Runtime* const runtime_;
  const std::string name_;
  const int device_id_;
  const uint64_t byte_size_;
  void* const base_;
};

// Whether `runtime` can serve CUDA shared memory at all: a build with CUDA (even on a host
// without a GPU, where registering fails naming why, as Triton built with GPU support does)
// or the fake devices. False for null and the no-CUDA runtime.
bool SupportsCudaSharedMemory(const Runtime* runtime);

}  // namespace inferd::gpu

#endif  // INFERD_GPU_CUDA_SHARED_MEMORY_H_
