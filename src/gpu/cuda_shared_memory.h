// The region table of the CUDA shared-memory extension: GPU memory a client process allocated,
// exported with cudaIpcGetMemHandle and registered by name with the handle's raw bytes
// (Triton's HTTP body {"raw_handle": {"b64": ...}, "device_id": n, "byte_size": n}, gRPC
// CudaSharedMemoryRegisterRequest's `raw_handle` bytes), through which it sends inputs and
// receives outputs without a copy through the request body.
//
// Each region is opened once through the device layer (Runtime::IpcOpenMemHandle). A request
// that uses a region holds it through a shared_ptr, so unregistering while requests use it only
// drops the name: the handle is closed when the last of them finishes (Triton's deferred
// unregister, as the system shared-memory table does).
//
// Not wired to the routes yet: the frontends still answer register with 501 (no GPU) and list
// no CUDA regions. Thread-safe: one mutex around the name table.
#ifndef INFERD_GPU_CUDA_SHARED_MEMORY_H_
#define INFERD_GPU_CUDA_SHARED_MEMORY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/memory_place.h"
#include "common/mutex.h"
#include "gpu/runtime.h"

namespace inferd::gpu {

// One entry of the status answer (Triton's CudaSharedMemoryStatusResponse.RegionStatus and the
// HTTP status JSON: name, device_id, byte_size).
struct CudaSharedMemoryRegionStatus {
  std::string name;
  int device_id = 0;
  uint64_t byte_size = 0;
};

class CudaSharedMemoryTable {
 public:
  // `runtime` must outlive the table and every View it hands out.
  explicit CudaSharedMemoryTable(Runtime* runtime);
  ~CudaSharedMemoryTable();
  CudaSharedMemoryTable(const CudaSharedMemoryTable&) = delete;
  CudaSharedMemoryTable& operator=(const CudaSharedMemoryTable&) = delete;

  // Opens `raw_handle` (kIpcHandleBytes bytes) on GPU `device_id` and registers its first
  // `byte_size` bytes as `name`. UNIMPLEMENTED when the runtime has no GPU (the frontends'
  // 501, with the runtime's reason); INVALID_ARGUMENT for an empty name, a name already
  // registered, a handle of the wrong size, a zero byte_size, a device that does not exist,
  // or a handle the runtime refuses. The runtime cannot tell the size of the exporter's
  // allocation: `byte_size` is the client's word, as in Triton.
  absl::Status Register(const std::string& name, std::string_view raw_handle, int64_t device_id,
                        uint64_t byte_size);
  // Empty name: every region. An unknown name is not an error (as Triton).
  absl::Status Unregister(const std::string& name);
  // Empty name: every region, by name. NOT_FOUND for an unknown name.
  absl::StatusOr<std::vector<CudaSharedMemoryRegionStatus>> Status(
      const std::string& name) const;

  // `byte_size` bytes at `offset` inside region `name`, on its GPU, and what keeps the region
  // open. INVALID_ARGUMENT naming `what` (the tensor) for an unknown region or a range past
  // its end.
  struct View {
    void* data = nullptr;
    size_t size = 0;
    MemoryPlace place;  // GPU <device_id>
    std::shared_ptr<const void> holder;
  };
  absl::StatusOr<View> Resolve(const std::string& name, uint64_t offset, uint64_t byte_size,
                               std::string_view what) const;

 private:
  struct Region;
  Runtime* const runtime_;
  mutable inferd::Mutex mu_;
  std::map<std::string, std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::gpu

#endif  // INFERD_GPU_CUDA_SHARED_MEMORY_H_
