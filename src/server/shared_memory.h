// The shared-memory extensions: system regions a client created with shm_open (a key such as
// "/input_data") and CUDA regions it allocated on a GPU and exported with cudaIpcGetMemHandle,
// each registered by name, through which it sends inputs and receives outputs. As in Triton,
// both kinds share one name space: a name a system region holds cannot be registered as a
// CUDA region and the reverse ("shared memory region '<name>' already in manager").
//
// Each region is opened once: a system region mapped read/write shared, a CUDA region through
// the device layer (gpu::CudaIpcRegion). A request that names a region holds it through a
// shared_ptr, so unregistering a region while requests use it only drops the name: the mapping
// (or the IPC handle) goes when the last of them finishes (Triton's deferred unregister).
//
// Tensors in a CUDA region: an input is copied device-to-host once, at Attach, unless the
// caller says the model takes GPU inputs on that region's GPU (then the tensor keeps the GPU
// place and no copy is made); an output is copied into the region when the request completes:
// host-to-device, or device-to-device for an output a GPU instance left on its GPU
// (OutputTensor::place, backends/tensor_places.h).
//
// Thread-safe: one mutex around the name table; requests copy through their own references.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/memory_place.h"
#include "common/mutex.h"
#include "core/infer_request.h"
#include "gpu/runtime.h"

namespace inferd::server {

// One entry of a status answer. System regions: name, key, offset, byte_size (Triton's
// SystemSharedMemoryStatusResponse.RegionStatus); CUDA regions: name, device_id, byte_size
// (CudaSharedMemoryStatusResponse.RegionStatus).
struct SharedMemoryRegionStatus {
  MemoryType kind = MemoryType::kCpu;  // kCpu: system, kGpu: CUDA
  std::string name;
  std::string key;
  uint64_t offset = 0;
  int device_id = 0;
  uint64_t byte_size = 0;
};

class SharedMemoryManager {
 public:
  // `gpus` opens CUDA regions and copies between them and the host; null: CUDA regions are
  // refused as by Triton built without GPU support. Must outlive the manager.
  explicit SharedMemoryManager(gpu::Runtime* gpus = nullptr);
  ~SharedMemoryManager();

  // Whether CUDA regions can be registered at all in this build (gpu::SupportsCudaSharedMemory):
  // the cuda_shared_memory extension is advertised when they can.
  bool SupportsCuda() const;

  // Maps [offset, offset + byte_size) of the POSIX shared-memory object `key`. INVALID_ARGUMENT
  // for an empty name, an object that does not exist or is smaller than offset + byte_size;
  // ALREADY_EXISTS for a name already registered (of either kind).
  absl::Status Register(const std::string& name, const std::string& key, uint64_t offset,
                        uint64_t byte_size);
  // Opens the CUDA IPC handle `raw_handle` on GPU `device_id` as region `name` of `byte_size`
  // bytes. ALREADY_EXISTS for a name already registered (of either kind); INVALID_ARGUMENT
  // for an empty name and what gpu::CudaIpcRegion::Open refuses (no GPU, bad handle, device).
  absl::Status RegisterCuda(const std::string& name, std::string_view raw_handle,
                            int64_t device_id, uint64_t byte_size);
  // Regions of `kind` (kCpu or kGpu); empty name: every region of that kind. An unknown name,
  // or a name of the other kind, is not an error and changes nothing (as Triton).
  absl::Status Unregister(const std::string& name, MemoryType kind = MemoryType::kCpu);
  // Empty name: every region of `kind`, by name. NOT_FOUND for an unknown name or one
  // registered as the other kind (Triton's messages).
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> Status(
      const std::string& name, MemoryType kind = MemoryType::kCpu) const;

  // A view of `ref.byte_size` bytes at `ref.offset` inside the region, where they are (host
  // or the region's GPU), and what keeps the region open. INVALID_ARGUMENT naming the tensor
  // and the region for an unknown region or a range past its end.
  struct View {
    char* data = nullptr;
    size_t size = 0;
    MemoryPlace place;
    std::shared_ptr<const void> holder;
  };
  absl::StatusOr<View> Resolve(const core::SharedMemoryRef& ref, std::string_view what) const;

  // Points every shared-memory input of `request` at its region, and arranges for outputs that
  // name a region to be written there when the request completes (an output larger than its
  // region's byte size fails the request). An input in a CUDA region is copied to the host
  // once, unless the model's instances take GPU inputs there (`gpu_inputs_on` names that
  // region's GPU, or is backends::kAnyGpu): then the tensor carries the GPU place and no copy
  // is made. Call before validation.
  absl::Status Attach(core::InferRequest* request,
                      std::optional<int> gpu_inputs_on = std::nullopt) const;

 private:
  struct Region;
  absl::Status Insert(const std::string& name, std::shared_ptr<Region> region);

  gpu::Runtime* const gpus_;
  mutable inferd::Mutex mu_;
  std::map<std::string, std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::server
