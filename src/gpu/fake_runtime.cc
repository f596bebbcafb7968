#include "gpu/fake_runtime.h"

#include <cstdlib>
#include <cstring>

#include "common/strings.h"

namespace inferd::gpu {
namespace {

class FakeStream : public Stream {
 public:
  explicit FakeStream(int device) : device_(device) {}
  int device() const override { return device_; }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  void* native_handle() const override { return nullptr; }

 private:
  const int device_;
};

class HostBuffer : public PinnedBuffer {
 public:
  explicit HostBuffer(size_t bytes) : data_(std::malloc(bytes == 0 ? 1 : bytes)), size_(bytes) {}
  ~HostBuffer() override { std::free(data_); }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* const data_;
  const size_t size_;
};

class FakeDeviceBuffer : public DeviceBuffer {
 public:
  FakeDeviceBuffer(FakeRuntime* runtime, int device, size_t bytes)
      : runtime_(runtime), device_(device), data_(std::malloc(bytes == 0 ? 1 : bytes)),
        size_(bytes) {}
  ~FakeDeviceBuffer() override {
    runtime_->Release(device_, data_, size_);
    std::free(data_);
  }
  int device() const override { return device_; }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  FakeRuntime* const runtime_;
  const int device_;
  void* const data_;
  const size_t size_;
};

}  // namespace

FakeRuntime::FakeRuntime(std::vector<DeviceProperties> devices, std::string unavailable_reason)
    : devices_([&] {
        for (size_t i = 0; i < devices.size(); ++i) devices[i].id = static_cast<int>(i);
        return std::move(devices);
      }()),
      unavailable_reason_(std::move(unavailable_reason)),
      used_bytes_(devices_.size(), 0),
      streams_created_(devices_.size(), 0) {}

std::unique_ptr<FakeRuntime> FakeRuntime::WithDevices(int n, int major, int minor,
                                                      uint64_t memory_bytes) {
  std::vector<DeviceProperties> devices(n);
  for (int i = 0; i < n; ++i) {
    devices[i].name = inferd::StrCat("Fake GPU ", i);
    devices[i].compute_capability_major = major;
    devices[i].compute_capability_minor = minor;
    devices[i].total_memory_bytes = memory_bytes;
    devices[i].multiprocessor_count = 80;
  }
  return std::make_unique<FakeRuntime>(std::move(devices));
}

std::string FakeRuntime::UnavailableReason() const {
  return devices_.empty() ? unavailable_reason_ : std::string();
}

absl::Status FakeRuntime::CheckDevice(int device) const {
  if (device < 0 || device >= DeviceCount()) {
    return absl::OutOfRangeError(inferd::StrCat("GPU ", device, " does not exist: this host has ",
                                                DeviceCount(), " GPU(s)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceProperties> FakeRuntime::Properties(int device) const {
  if (absl::Status st = CheckDevice(device); !st.ok()) return st;
  return devices_[device];
}

absl::StatusOr<MemoryInfo> FakeRuntime::GetMemoryInfo(int device) const {
  if (absl::Status st = CheckDevice(device); !st.ok()) return st;
  inferd::MutexLock lock(&mu_);
  MemoryInfo info;
  info.total_bytes = devices_[device].total_memory_bytes;
  info.free_bytes = info.total_bytes - used_bytes_[device];
  return info;
}

absl::StatusOr<std::unique_ptr<Stream>> FakeRuntime::CreateStream(int device) {
  if (absl::Status st = CheckDevice(device); !st.ok()) return st;
  {
    inferd::MutexLock lock(&mu_);
    ++streams_created_[device];
  }
  return std::make_unique<FakeStream>(device);
}

int FakeRuntime::StreamsCreated(int device) const {
  if (device < 0 || device >= DeviceCount()) return 0;
  inferd::MutexLock lock(&mu_);
  return streams_created_[device];
}

absl::StatusOr<std::unique_ptr<PinnedBuffer>> FakeRuntime::AllocatePinned(size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> FakeRuntime::AllocateDevice(int device,
                                                                        size_t bytes) {
  if (absl::Status st = CheckDevice(device); !st.ok()) return st;
  {
    inferd::MutexLock lock(&mu_);
    const uint64_t free_bytes = devices_[device].total_memory_bytes - used_bytes_[device];
    if (bytes > free_bytes) {
      return absl::ResourceExhaustedError(inferd::StrCat(
          "GPU ", device, ": cannot allocate ", bytes, " bytes, ", free_bytes, " free"));
    }
    used_bytes_[device] += bytes;
  }
  auto buffer = std::make_unique<FakeDeviceBuffer>(this, device, bytes);
  inferd::MutexLock lock(&mu_);
  allocations_.push_back(
      Allocation{static_cast<const char*>(buffer->data()), bytes == 0 ? 1 : bytes, device});
  return buffer;
}

void FakeRuntime::Release(int device, const void* data, size_t bytes) {
  inferd::MutexLock lock(&mu_);
  used_bytes_[device] -= bytes;
  for (size_t i = 0; i < allocations_.size(); ++i) {
    if (allocations_[i].begin == data) {
      allocations_.erase(allocations_.begin() + i);
      break;
    }
  }
}

int FakeRuntime::DeviceOf(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  for (const Allocation& a : allocations_) {
    if (c >= a.begin && c < a.begin + a.size) {
      return bytes <= static_cast<size_t>(a.begin + a.size - c) ? a.device : -1;
    }
  }
  return -1;
}

// A fake handle: "inferd-fake-ipc" + the buffer's address and device, zero-padded to the size
// of a real one.
std::string FakeRuntime::ExportIpcHandle(const DeviceBuffer& buffer) const {
  std::string h(kIpcHandleBytes, '\0');
  constexpr std::string_view kMagic = "inferd-fake-ipc";
  std::memcpy(h.data(), kMagic.data(), kMagic.size());
  const void* data = buffer.data();
  const int device = buffer.device();
  std::memcpy(h.data() + 16, &data, sizeof(data));
  std::memcpy(h.data() + 24, &device, sizeof(device));
  return h;
}

absl::StatusOr<IpcExport> FakeRuntime::IpcGetMemHandle(int device, const void* ptr) {
  if (absl::Status st = CheckDevice(device); !st.ok()) return st;
  inferd::MutexLock lock(&mu_);
  const char* p = static_cast<const char*>(ptr);
  for (const Allocation& a : allocations_) {
    if (a.device == device && p >= a.begin && p < a.begin + a.size) {
      IpcExport out;
      out.handle.assign(kIpcHandleBytes, '\0');
      constexpr std::string_view kMagic = "inferd-fake-ipc";
      std::memcpy(out.handle.data(), kMagic.data(), kMagic.size());
      std::memcpy(out.handle.data() + 16, &a.begin, sizeof(a.begin));
      std::memcpy(out.handle.data() + 24, &device, sizeof(device));
      out.offset = static_cast<uint64_t>(p - a.begin);
      return out;
    }
  }
  return absl::InvalidArgumentError(inferd::StrCat(
      "cudaIpcGetMemHandle on GPU ", device, ": CUDA error 1 (cudaErrorInvalidValue)"));
}

absl::StatusOr<void*> FakeRuntime::IpcOpenMemHandle(int device, std::string_view handle) {
  if (handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "a CUDA IPC handle is ", kIpcHandleBytes, " bytes, got ", handle.size()));
  }
  if (absl::Status st = CheckDevice(device); !st.ok()) return st;
  void* data = nullptr;
  int exported_on = -1;
  std::memcpy(&data, handle.data() + 16, sizeof(data));
  std::memcpy(&exported_on, handle.data() + 24, sizeof(exported_on));
  inferd::MutexLock lock(&mu_);
  // As the driver: a handle that names no live allocation (garbage, or freed since) or one on
  // another device is refused.
  if (handle.substr(0, 15) != "inferd-fake-ipc" || DeviceOf(data, 1) != device ||
      exported_on != device) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "cudaIpcOpenMemHandle on GPU ", device, ": CUDA error 1 (cudaErrorInvalidValue)"));
  }
  open_ipc_.push_back(data);
  return data;
}

absl::Status FakeRuntime::IpcCloseMemHandle(int device, void* ptr) {
  if (absl::Status st = CheckDevice(device); !st.ok()) return st;
  inferd::MutexLock lock(&mu_);
  for (size_t i = 0; i < open_ipc_.size(); ++i) {
    if (open_ipc_[i] == ptr) {
      open_ipc_.erase(open_ipc_.begin() + i);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("cudaIpcCloseMemHandle of a pointer that is not open");
}

int FakeRuntime::OpenIpcHandles() const {
  inferd::MutexLock lock(&mu_);
  return static_cast<int>(open_ipc_.size());
}

int FakeRuntime::CopyCount(CopyKind kind) const {
  inferd::MutexLock lock(&mu_);
  return copies_[static_cast<int>(kind)];
}

absl::Status FakeRuntime::CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                                    Stream& stream) {
  if (absl::Status st = CheckDevice(stream.device()); !st.ok()) return st;
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError("copy with a null pointer");
  }
  if (bytes == 0) return absl::OkStatus();
  {
    inferd::MutexLock lock(&mu_);
    const bool dst_on_device = DeviceOf(dst, bytes) >= 0;
    const bool src_on_device = DeviceOf(src, bytes) >= 0;
    const bool want_dst = kind != CopyKind::kDeviceToHost;
    const bool want_src = kind != CopyKind::kHostToDevice;
    if (dst_on_device != want_dst || src_on_device != want_src) {
      constexpr const char* kKinds[] = {"host to device", "device to host", "device to device"};
      return absl::InvalidArgumentError(inferd::StrCat(
          "fake ", kKinds[static_cast<int>(kind)], " copy of ", bytes, " bytes: the source ",
          src_on_device ? "is" : "is not", " device memory and the destination ",
          dst_on_device ? "is" : "is not"));
    }
    ++copies_[static_cast<int>(kind)];
  }
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

}  // namespace inferd::gpu
