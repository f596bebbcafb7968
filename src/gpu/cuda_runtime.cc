// SystemRuntime() on CUDA's runtime API (cudart), linked statically: the binary then needs no
// libcudart.so at run time and starts on any host; cudart_static opens the driver
// (libcuda.so.1) itself at the first call, and on a host without one that call answers
// cudaErrorInsufficientDriver (35) or, against the toolkit's stub libcuda, cudaErrorStubLibrary
// (34). Both mean "no GPU here": DeviceCount() is 0 and UnavailableReason() says why. No .cu
// file is compiled: everything here is host code calling the runtime API.
#include <cuda_runtime_api.h>

#include <cstring>

#include "common/logging.h"
#include "common/strings.h"
#include "gpu/runtime.h"

namespace inferd::gpu {
namespace {

std::string CudaError(cudaError_t err) {
  return inferd::StrCat("CUDA error ", static_cast<int>(err), " (", cudaGetErrorName(err), ": ",
                        cudaGetErrorString(err), ")");
}

absl::Status ToStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = inferd::StrCat(what, ": ", CudaError(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (err == cudaErrorInvalidDevice) return absl::OutOfRangeError(msg);
  return absl::InternalError(msg);
}

// Makes `device` current on the calling thread (CUDA's current device is per thread).
absl::Status Use(int device) { return ToStatus(cudaSetDevice(device), "cudaSetDevice"); }

class CudaStream : public Stream {
 public:
  CudaStream(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaStream() override {
    if (Use(device_).ok()) cudaStreamDestroy(stream_);
  }
  int device() const override { return device_; }
  absl::Status Synchronize() override {
    return ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void* native_handle() const override { return stream_; }

 private:
  const int device_;
  const cudaStream_t stream_;
};

class CudaPinnedBuffer : public PinnedBuffer {
 public:
  CudaPinnedBuffer(void* data, size_t size) : data_(data), size_(size) {}
  ~CudaPinnedBuffer() override { cudaFreeHost(data_); }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* const data_;
  const size_t size_;
};

class CudaDeviceBuffer : public DeviceBuffer {
 public:
  CudaDeviceBuffer(int device, void* data, size_t size)
      : device_(device), data_(data), size_(size) {}
  ~CudaDeviceBuffer() override {
    if (Use(device_).ok()) cudaFree(data_);
  }
  int device() const override { return device_; }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  const int device_;
  void* const data_;
  const size_t size_;
};

class CudaRuntime : public Runtime {
 public:
  CudaRuntime() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess) {
      count_ = count;
      if (count == 0) reason_ = "the NVIDIA driver reports no GPU";
    } else {
      // Clear the sticky error so that later calls report their own.
      cudaGetLastError();
      count_ = 0;
      reason_ = err == cudaErrorInsufficientDriver || err == cudaErrorStubLibrary
                    ? inferd::StrCat("no NVIDIA driver on this host: ", CudaError(err))
                : err == cudaErrorNoDevice ? inferd::StrCat("no GPU on this host: ", CudaError(err))
                                           : CudaError(err);
    }
  }

  std::string name() const override { return "cuda"; }
  int DeviceCount() const override { return count_; }
  std::string UnavailableReason() const override { return reason_; }

  absl::StatusOr<DeviceProperties> Properties(int device) const override {
    if (absl::Status st = Check(device); !st.ok()) return st;
    cudaDeviceProp prop{};
    if (absl::Status st = ToStatus(cudaGetDeviceProperties(&prop, device),
                                   "cudaGetDeviceProperties");
        !st.ok()) {
      return st;
    }
    DeviceProperties out;
    out.id = device;
    out.name = prop.name;
    out.compute_capability_major = prop.major;
    out.compute_capability_minor = prop.minor;
    out.total_memory_bytes = prop.totalGlobalMem;
    out.multiprocessor_count = prop.multiProcessorCount;
    return out;
  }

  absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) const override {
    if (absl::Status st = Check(device); !st.ok()) return st;
    if (absl::Status st = Use(device); !st.ok()) return st;
    size_t free_bytes = 0, total_bytes = 0;
    if (absl::Status st = ToStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
        !st.ok()) {
      return st;
    }
    return MemoryInfo{free_bytes, total_bytes};
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) override {
    if (absl::Status st = Check(device); !st.ok()) return st;
    if (absl::Status st = Use(device); !st.ok()) return st;
    cudaStream_t stream = nullptr;
    if (absl::Status st = ToStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                   "cudaStreamCreateWithFlags");
        !st.ok()) {
      return st;
    }
    return std::make_unique<CudaStream>(device, stream);
  }

  absl::StatusOr<std::unique_ptr<PinnedBuffer>> AllocatePinned(size_t bytes) override {
    if (count_ == 0) return absl::FailedPreconditionError(reason_);
    void* data = nullptr;
    if (absl::Status st = ToStatus(cudaHostAlloc(&data, bytes, cudaHostAllocPortable),
                                   inferd::StrCat("cudaHostAlloc(", bytes, " bytes)"));
        !st.ok()) {
      return st;
    }
    return std::make_unique<CudaPinnedBuffer>(data, bytes);
  }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDevice(int device,
                                                             size_t bytes) override {
    if (absl::Status st = Check(device); !st.ok()) return st;
    if (absl::Status st = Use(device); !st.ok()) return st;
    void* data = nullptr;
    if (absl::Status st = ToStatus(cudaMalloc(&data, bytes),
                                   inferd::StrCat("GPU ", device, ": cudaMalloc(", bytes, " bytes)"));
        !st.ok()) {
      return st;
    }
    return std::make_unique<CudaDeviceBuffer>(device, data, bytes);
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                         Stream& stream) override {
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    return ToStatus(cudaMemcpyAsync(dst, src, bytes, k,
                                    static_cast<cudaStream_t>(stream.native_handle())),
                    "cudaMemcpyAsync");
  }

  absl::StatusOr<void*> IpcOpenMemHandle(int device, std::string_view handle) override {
    static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
    if (handle.size() != kIpcHandleBytes) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "a CUDA IPC handle is ", kIpcHandleBytes, " bytes, got ", handle.size()));
    }
    if (absl::Status st = Check(device); !st.ok()) return st;
    if (absl::Status st = Use(device); !st.ok()) return st;
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* ptr = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      // A handle the driver cannot open is the client's (stale, from another host, or made in
      // this very process): INVALID_ARGUMENT rather than a server error.
      return absl::InvalidArgumentError(
          inferd::StrCat("cudaIpcOpenMemHandle on GPU ", device, ": ", CudaError(err)));
    }
    return ptr;
  }

  absl::Status IpcCloseMemHandle(int device, void* ptr) override {
    if (absl::Status st = Use(device); !st.ok()) return st;
    return ToStatus(cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle");
  }

  absl::StatusOr<IpcExport> IpcGetMemHandle(int device, const void* ptr) override {
    if (absl::Status st = Check(device); !st.ok()) return st;
    if (absl::Status st = Use(device); !st.ok()) return st;
    // The handle names the whole allocation that holds `ptr`; where `ptr` lies in it comes
    // from the driver (cuMemGetAddressRange, reached through the runtime's entry point so the
    // build needs no libcuda), as Triton's Python backend finds it.
    using GetAddressRange = int (*)(unsigned long long* base, size_t* size,
                                    unsigned long long ptr);
    static const GetAddressRange get_range = [] {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                           &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        fn = nullptr;
      }
      return reinterpret_cast<GetAddressRange>(fn);
    }();
    if (get_range == nullptr) {
      return absl::UnavailableError("the NVIDIA driver has no cuMemGetAddressRange");
    }
    unsigned long long base = 0;
    size_t size = 0;
    const auto address = reinterpret_cast<unsigned long long>(ptr);
    if (int err = get_range(&base, &size, address); err != 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "cuMemGetAddressRange on GPU ", device, ": CUDA driver error ", err,
          " (not device memory of this process)"));
    }
    cudaIpcMemHandle_t h;
    if (cudaError_t err = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
        err != cudaSuccess) {
      cudaGetLastError();
      return absl::InvalidArgumentError(
          inferd::StrCat("cudaIpcGetMemHandle on GPU ", device, ": ", CudaError(err)));
    }
    IpcExport out;
    out.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    out.offset = address - base;
    return out;
  }

 private:
  absl::Status Check(int device) const {
    if (device < 0 || device >= count_) {
      return absl::OutOfRangeError(inferd::StrCat(
          "GPU ", device, " does not exist: this host has ", count_, " GPU(s)",
          reason_.empty() ? "" : inferd::StrCat(" (", reason_, ")")));
    }
    return absl::OkStatus();
  }

  int count_ = 0;
  std::string reason_;
};

}  // namespace

Runtime& SystemRuntime() {
  static Runtime* const runtime = new CudaRuntime();
  return *runtime;
}

bool BuiltWithCuda() { return true; }

}  // namespace inferd::gpu
