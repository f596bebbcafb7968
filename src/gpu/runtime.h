// The device layer: what inferd needs from a GPU runtime, behind one small interface, so that
// placement and backends are tested with fake devices on hosts without a GPU, and the CUDA code
// stays in its own library (inferd_gpu_cuda) that nothing else recompiles against.
//
// Implementations: SystemRuntime() (CUDA's runtime when built with INFERD_WITH_CUDA, else a
// runtime with no devices), FakeRuntime (N devices with set properties, host memory behind
// them, for tests).
#ifndef INFERD_GPU_RUNTIME_H_
#define INFERD_GPU_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferd::gpu {

struct DeviceProperties {
  int id = 0;
  std::string name;  // "NVIDIA A10G"
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  uint64_t total_memory_bytes = 0;
  int multiprocessor_count = 0;

  // 8.6 for sm_86, as Triton compares it with --min-supported-compute-capability.
  double ComputeCapability() const {
    return compute_capability_major + compute_capability_minor / 10.0;
  }
};

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

// An ordered queue of work on one device (cudaStream_t). Owned by whoever created it; not
// thread-safe (an instance's stream is used by that instance's thread).
class Stream {
 public:
  virtual ~Stream() = default;
  virtual int device() const = 0;
  // Waits for everything queued on the stream; the first error any of it hit.
  virtual absl::Status Synchronize() = 0;
  // The runtime's handle (cudaStream_t), for libraries that take one; null for the fake.
  virtual void* native_handle() const = 0;
};

// Page-locked host memory (cudaHostAlloc), so that async copies to and from it overlap with
// compute. Freed by the destructor.
class PinnedBuffer {
 public:
  virtual ~PinnedBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
};

// Memory on one device (cudaMalloc). Freed by the destructor.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual int device() const = 0;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// The size of cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE): the bytes a client process gets from
// cudaIpcGetMemHandle and sends in the CUDA shared-memory extension's `raw_handle`.
inline constexpr size_t kIpcHandleBytes = 64;

class StreamPool;  // gpu/stream_pool.h

// Device memory exported for another process (cudaIpcGetMemHandle): the handle names the whole
// allocation that holds the pointer; the pointer is `offset` bytes into it. The other process
// opens the handle (cudaIpcOpenMemHandle gives the allocation's start) and adds `offset`.
struct IpcExport {
  std::string handle;  // kIpcHandleBytes raw bytes
  uint64_t offset = 0;
};

// Streams per device in a runtime's EdgeStreams(): GPUs have one or two copy engines per
// direction, so more concurrent edge copies per device than this would not finish sooner.
inline constexpr int kEdgeStreamsPerDevice = 4;

// Thread-safe: every method may be called from any thread.
class Runtime {
 public:
  Runtime();
  virtual ~Runtime();

  // "cuda", "fake" or "none".
  virtual std::string name() const = 0;
  // Devices this process can use; 0 where there is no GPU, no driver or no CUDA in the build.
  virtual int DeviceCount() const = 0;
  // Why DeviceCount() is 0 ("no NVIDIA driver (CUDA error 35: ...)"); empty when it is not.
  virtual std::string UnavailableReason() const = 0;

  // Device `device` in [0, DeviceCount()); OUT_OF_RANGE naming it otherwise.
  virtual absl::StatusOr<DeviceProperties> Properties(int device) const = 0;
  virtual absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const = 0;

  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) = 0;
  virtual absl::StatusOr<std::unique_ptr<PinnedBuffer>> AllocatePinned(size_t bytes) = 0;
  // RESOURCE_EXHAUSTED when the device has not `bytes` free.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDevice(int device,
                                                                     size_t bytes) = 0;
  // Queues a copy of `bytes` on `stream`; the memory must stay valid until the stream is
  // synchronized. A pageable host pointer makes the copy synchronous, as in CUDA.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                                 Stream& stream) = 0;

  // Maps, on `device`, the memory another process exported with cudaIpcGetMemHandle
  // (cudaIpcOpenMemHandle with peer access enabled lazily). `handle` is the handle's
  // kIpcHandleBytes raw bytes. The pointer is the start of the exporting process's allocation
  // and stays valid until IpcCloseMemHandle. INVALID_ARGUMENT for a handle of another size,
  // OUT_OF_RANGE for a device that does not exist, the runtime's error for a handle it refuses.
  virtual absl::StatusOr<void*> IpcOpenMemHandle(int device, std::string_view handle) = 0;
  // Unmaps what IpcOpenMemHandle(device, ...) returned.
  virtual absl::Status IpcCloseMemHandle(int device, void* ptr) = 0;

  // Exports `ptr`, an address inside memory this process allocated on `device` (cudaMalloc),
  // for another process: cudaIpcGetMemHandle, and the pointer's offset inside its allocation.
  // The memory must stay allocated until the other process has closed the handle. The
  // runtime's error for memory it cannot export (memory this process itself opened from
  // another's handle, a pool allocation); OUT_OF_RANGE for a device that does not exist;
  // UNIMPLEMENTED for a runtime without IPC (the default).
  virtual absl::StatusOr<IpcExport> IpcGetMemHandle(int device, const void* ptr);

  // The streams of the copies made at the server's edges (CopyNow), reused from copy to copy:
  // at most kEdgeStreamsPerDevice per device, created on first use by CreateStream.
  StreamPool& EdgeStreams() { return *edge_streams_; }

 private:
  const std::unique_ptr<StreamPool> edge_streams_;
};

// Every device's properties, in id order; empty where there is none.
std::vector<DeviceProperties> ListDevices(const Runtime& runtime);

// The process's runtime: CUDA's when the build has it (INFERD_WITH_CUDA), else one with no
// devices. Created on first use (the CUDA runtime then asks the driver once); never freed.
// Defined by inferd_gpu_cuda or inferd_gpu_none, whichever the build links.
Runtime& SystemRuntime();

// Whether this build has the CUDA runtime (INFERD_WITH_CUDA), for the start-up log line.
bool BuiltWithCuda();

}  // namespace inferd::gpu

#endif  // INFERD_GPU_RUNTIME_H_
