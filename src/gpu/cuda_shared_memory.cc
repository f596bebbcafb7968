#include "gpu/cuda_shared_memory.h"

#include <utility>

#include "common/logging.h"
#include "common/strings.h"

namespace inferd::gpu {

// One opened handle. Closed by the destructor, which runs when the table has dropped the name
// and the last request holding a View has finished.
struct CudaSharedMemoryTable::Region {
  Region(Runtime* runtime, CudaSharedMemoryRegionStatus status, void* base)
      : runtime(runtime), status(std::move(status)), base(base) {}
  ~Region() {
    if (absl::Status st = runtime->IpcCloseMemHandle(status.device_id, base); !st.ok()) {
      LOG_WARNING << "closing CUDA shared memory region '" << status.name << "': "
                  << st.message();
    }
  }
  Runtime* const runtime;
  const CudaSharedMemoryRegionStatus status;
  void* const base;
};

CudaSharedMemoryTable::CudaSharedMemoryTable(Runtime* runtime) : runtime_(runtime) {}
CudaSharedMemoryTable::~CudaSharedMemoryTable() = default;

absl::Status CudaSharedMemoryTable::Register(const std::string& name, std::string_view raw_handle,
                                             int64_t device_id, uint64_t byte_size) {
  auto fail = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        inferd::StrCat("failed to register CUDA shared memory region '", name, "': ", why));
  };
  if (runtime_->DeviceCount() == 0) {
    return absl::UnimplementedError(inferd::StrCat(
        "CUDA shared memory is not supported on this server: it has no GPU (",
        runtime_->UnavailableReason(), "); use system shared memory (/v2/systemsharedmemory)"));
  }
  if (name.empty()) return absl::InvalidArgumentError("a CUDA shared memory region needs a name");
  if (raw_handle.size() != kIpcHandleBytes) {
    return fail(inferd::StrCat("'raw_handle' must be the ", kIpcHandleBytes,
                               " bytes of a cudaIpcMemHandle_t, got ", raw_handle.size()));
  }
  if (byte_size == 0) return fail("'byte_size' must be positive");
  if (device_id < 0 || device_id >= runtime_->DeviceCount()) {
    return fail(inferd::StrCat("'device_id' ", device_id, " is not a GPU of this server (it has ",
                               runtime_->DeviceCount(), ")"));
  }
  {
    inferd::MutexLock lock(&mu_);
    if (regions_.count(name)) {
      return absl::InvalidArgumentError(
          inferd::StrCat("shared memory region '", name, "' is already registered"));
    }
  }
  // Opened outside the lock (a driver call); a second Register of the same name racing this
  // one is settled below, and the loser's handle closed by its Region's destructor.
  absl::StatusOr<void*> base = runtime_->IpcOpenMemHandle(static_cast<int>(device_id), raw_handle);
  if (!base.ok()) return fail(std::string(base.status().message()));
  auto region = std::make_shared<Region>(
      runtime_, CudaSharedMemoryRegionStatus{name, static_cast<int>(device_id), byte_size}, *base);
  inferd::MutexLock lock(&mu_);
  if (!regions_.emplace(name, std::move(region)).second) {
    return absl::InvalidArgumentError(
        inferd::StrCat("shared memory region '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::Status CudaSharedMemoryTable::Unregister(const std::string& name) {
  // The regions are released after the lock: closing a handle is a driver call.
  std::map<std::string, std::shared_ptr<Region>> dropped;
  {
    inferd::MutexLock lock(&mu_);
    if (name.empty()) {
      dropped.swap(regions_);
    } else if (auto it = regions_.find(name); it != regions_.end()) {
      dropped.insert(regions_.extract(it));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CudaSharedMemoryRegionStatus>> CudaSharedMemoryTable::Status(
    const std::string& name) const {
  std::vector<CudaSharedMemoryRegionStatus> out;
  inferd::MutexLock lock(&mu_);
  if (name.empty()) {
    for (const auto& [n, r] : regions_) out.push_back(r->status);
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        inferd::StrCat("unable to find cuda shared memory region: '", name, "'"));
  }
  out.push_back(it->second->status);
  return out;
}

absl::StatusOr<CudaSharedMemoryTable::View> CudaSharedMemoryTable::Resolve(
    const std::string& name, uint64_t offset, uint64_t byte_size, std::string_view what) const {
  std::shared_ptr<Region> region;
  {
    inferd::MutexLock lock(&mu_);
    auto it = regions_.find(name);
    if (it != regions_.end()) region = it->second;
  }
  if (region == nullptr) {
    return absl::InvalidArgumentError(inferd::StrCat(
        what, ": unable to find CUDA shared memory region '", name, "' (register it first)"));
  }
  const uint64_t size = region->status.byte_size;
  if (offset > size || byte_size > size - offset) {
    return absl::InvalidArgumentError(inferd::StrCat(
        what, ": shared_memory_offset ", offset, " + shared_memory_byte_size ", byte_size,
        " is past the end of CUDA shared memory region '", name, "' of ", size, " bytes"));
  }
  View v;
  v.data = static_cast<char*>(region->base) + offset;
  v.size = byte_size;
  v.place = MemoryPlace::Gpu(region->status.device_id);
  v.holder = std::move(region);
  return v;
}

}  // namespace inferd::gpu
