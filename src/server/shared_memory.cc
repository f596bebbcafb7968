#include "server/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backends/tensor_places.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "core/response_sender.h"
#include "gpu/copy.h"
#include "gpu/cuda_shared_memory.h"

namespace inferd::server {

struct SharedMemoryManager::Region {
  SharedMemoryRegionStatus status;
  // A system region: its mapping.
  void* map_base = MAP_FAILED;
  size_t map_length = 0;
  // Where the region's bytes start: map_base + (offset - the page-aligned offset) for a
  // system region, the opened handle's base for a CUDA one.
  char* data = nullptr;
  MemoryPlace place;
  std::unique_ptr<gpu::CudaIpcRegion> cuda;  // a CUDA region; closed by its destructor
  ~Region() {
    if (map_base != MAP_FAILED) munmap(map_base, map_length);
  }
};

namespace {

absl::Status AlreadyInManager(const std::string& name) {
  // Triton's ALREADY_EXISTS (gRPC ALREADY_EXISTS, HTTP 400), whichever kind holds the name.
  return absl::AlreadyExistsError(
      inferd::StrCat("shared memory region '", name, "' already in manager"));
}

std::string_view KindWords(MemoryType kind) {
  return kind == MemoryType::kGpu ? "CUDA shared memory" : "system shared memory";
}

}  // namespace

SharedMemoryManager::SharedMemoryManager(gpu::Runtime* gpus) : gpus_(gpus) {}
SharedMemoryManager::~SharedMemoryManager() = default;

bool SharedMemoryManager::SupportsCuda() const { return gpu::SupportsCudaSharedMemory(gpus_); }

absl::Status SharedMemoryManager::Insert(const std::string& name, std::shared_ptr<Region> region) {
  inferd::MutexLock lock(&mu_);
  if (!regions_.emplace(name, std::move(region)).second) return AlreadyInManager(name);
  return absl::OkStatus();
}

absl::Status SharedMemoryManager::Register(const std::string& name, const std::string& key,
                                          uint64_t offset, uint64_t byte_size) {
  auto fail = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        inferd::StrCat("failed to register shared memory region '", name, "': ", why));
  };
  if (name.empty()) {
    return absl::InvalidArgumentError("a shared memory region needs a name");
  }
  {
    inferd::MutexLock lock(&mu_);
    if (regions_.count(name)) return AlreadyInManager(name);
  }
  if (key.empty()) return fail("'key' is empty");
  if (key.find('\0') != std::string::npos) return fail("'key' contains a NUL character");
  if (byte_size == 0) return fail("'byte_size' must be positive");
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return fail(inferd::StrCat("unable to open shared memory object '", key, "': ",
                               std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return fail(inferd::StrCat("fstat of '", key, "' failed: ", std::strerror(err)));
  }
  const uint64_t object_size = static_cast<uint64_t>(st.st_size);
  if (offset > object_size || byte_size > object_size - offset) {
    close(fd);
    return fail(inferd::StrCat("offset ", offset, " + byte_size ", byte_size,
                               " is past the end of shared memory object '", key, "' of ",
                               object_size, " bytes"));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset - offset % page;
  auto region = std::make_shared<Region>();
  region->map_length = static_cast<size_t>(byte_size + (offset - aligned));
  region->map_base = mmap(nullptr, region->map_length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                          static_cast<off_t>(aligned));
  const int map_err = errno;
  close(fd);
  if (region->map_base == MAP_FAILED) {
    return fail(inferd::StrCat("mmap of '", key, "' failed: ", std::strerror(map_err)));
  }
  region->data = static_cast<char*>(region->map_base) + (offset - aligned);
  region->place = MemoryPlace::Host();
  region->status = {MemoryType::kCpu, name, key, offset, 0, byte_size};
  // A second Register of the same name racing this one is settled here; the loser's mapping
  // goes with its Region.
  return Insert(name, std::move(region));
}

absl::Status SharedMemoryManager::RegisterCuda(const std::string& name,
                                              std::string_view raw_handle, int64_t device_id,
                                              uint64_t byte_size) {
  if (name.empty()) {
    // Triton's prefix (its own test registers "" and expects it), then what is wrong.
    return absl::InvalidArgumentError(
        "failed to register CUDA shared memory region '': a region needs a name");
  }
  {
    inferd::MutexLock lock(&mu_);
    if (regions_.count(name)) return AlreadyInManager(name);
  }
  // Opened outside the lock (a driver call); a racing Register of the same name is settled by
  // Insert, and the loser's handle closed with its Region.
  auto cuda = gpu::CudaIpcRegion::Open(gpus_, name, raw_handle, device_id, byte_size);
  if (!cuda.ok()) return cuda.status();
  auto region = std::make_shared<Region>();
  region->data = (*cuda)->base();
  region->place = (*cuda)->place();
  region->status = {MemoryType::kGpu, name, "", 0, (*cuda)->device_id(), byte_size};
  region->cuda = *std::move(cuda);
  return Insert(name, std::move(region));
}

absl::Status SharedMemoryManager::Unregister(const std::string& name, MemoryType kind) {
  const bool cuda = kind == MemoryType::kGpu;
  std::vector<std::shared_ptr<Region>> dropped;  // unmapped / closed outside the lock
  inferd::MutexLock lock(&mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    const bool match = (name.empty() || it->first == name) &&
                       (it->second->status.kind == MemoryType::kGpu) == cuda;
    if (match) {
      dropped.push_back(std::move(it->second));
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SharedMemoryRegionStatus>> SharedMemoryManager::Status(
    const std::string& name, MemoryType kind) const {
  const bool cuda = kind == MemoryType::kGpu;
  std::vector<SharedMemoryRegionStatus> out;
  inferd::MutexLock lock(&mu_);
  if (name.empty()) {
    for (const auto& [n, r] : regions_) {
      if ((r->status.kind == MemoryType::kGpu) == cuda) out.push_back(r->status);
    }
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(inferd::StrCat("unable to find ", cuda ? "cuda" : "system",
                                              " shared memory region: '", name, "'"));
  }
  if ((it->second->status.kind == MemoryType::kGpu) != cuda) {
    // Triton's words for a name of the other kind.
    return absl::NotFoundError(inferd::StrCat(
        "The region named '", name, "' is registered as ",
        KindWords(it->second->status.kind), ", not ", KindWords(kind)));
  }
  out.push_back(it->second->status);
  return out;
}

absl::StatusOr<SharedMemoryManager::View> SharedMemoryManager::Resolve(
    const core::SharedMemoryRef& ref, std::string_view what) const {
  std::shared_ptr<Region> region;
  {
    inferd::MutexLock lock(&mu_);
    auto it = regions_.find(ref.region);
    if (it != regions_.end()) region = it->second;
  }
  if (region == nullptr) {
    return absl::InvalidArgumentError(inferd::StrCat(
        what, ": unable to find shared memory region '", ref.region, "' (register it first)"));
  }
  const uint64_t size = region->status.byte_size;
  if (ref.offset > size || ref.byte_size > size - ref.offset) {
    return absl::InvalidArgumentError(inferd::StrCat(
        what, ": shared_memory_offset ", ref.offset, " + shared_memory_byte_size ",
        ref.byte_size, " is past the end of ",
        region->status.kind == MemoryType::kGpu ? "CUDA " : "", "shared memory region '",
        ref.region, "' of ", size, " bytes"));
  }
  View v;
  v.data = region->data + ref.offset;
  v.size = static_cast<size_t>(ref.byte_size);
  v.place = region->place;
  v.holder = std::move(region);
  return v;
}

absl::Status SharedMemoryManager::Attach(core::InferRequest* request,
                                         std::optional<int> gpu_inputs_on) const {
  for (auto& in : request->inputs) {
    if (!in.shm) continue;
    auto view = Resolve(*in.shm, inferd::StrCat("input '", in.name, "'"));
    if (!view.ok()) return view.status();
    if (!view->place.OnHost() &&
        !backends::TakesGpuInputOn(gpu_inputs_on, view->place.device_id)) {
      // The model reads host bytes: one device-to-host copy, here at the edge.
      auto host = gpu::PlacedBuffer::Allocate(*gpus_, MemoryPlace::Host(), view->size);
      if (!host.ok()) return host.status();
      if (absl::Status st = gpu::CopyNow(gpus_, host->data(), MemoryPlace::Host(), view->data,
                                       view->place, view->size);
          !st.ok()) {
        return absl::InternalError(inferd::StrCat("input '", in.name,
                                                  "': copying from CUDA shared memory region '",
                                                  in.shm->region, "': ", st.message()));
      }
      auto owned = std::make_shared<gpu::PlacedBuffer>(*std::move(host));
      in.data = owned->view();
      in.place = MemoryPlace::Host();
      request->holders.push_back(std::move(owned));
      continue;
    }
    in.data = std::string_view(view->data, view->size);
    in.place = view->place;
    request->holders.push_back(std::move(view->holder));
  }
  struct Target {
    std::string name;
    View view;
    std::string region;
  };
  std::vector<Target> targets;
  for (auto& out : request->outputs) {
    if (!out.shm) continue;
    if (out.classification > 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "output '", out.name, "': can't set both 'shared_memory_region' and 'classification'"));
    }
    auto view = Resolve(*out.shm, inferd::StrCat("output '", out.name, "'"));
    if (!view.ok()) return view.status();
    if (!view->place.OnHost()) out.gpu_region_on = view->place.device_id;
    targets.push_back({out.name, *std::move(view), out.shm->region});
  }
  if (targets.empty()) return absl::OkStatus();
  // Runs on the completing thread (for a decoupled model, on the thread sending each response),
  // before the frontend serializes: copy each output into its region and leave only its
  // description in the response. Idempotent (core/response_sender.h): an output already in
  // its region is skipped.
  auto copy_to_regions = [gpus = gpus_, targets = std::move(targets)](
                             core::InferResponse* response) {
    if (response->status.ok()) {
      for (auto& out : response->outputs) {
        if (out.in_shared_memory) continue;
        for (const auto& t : targets) {
          if (t.name != out.name) continue;
          if (out.data.size() > t.view.size) {
            response->status = absl::InvalidArgumentError(inferd::StrCat(
                "output '", out.name, "' needs ", out.data.size(),
                " bytes but its shared memory region '", t.region, "' has shared_memory_byte_size ",
                t.view.size));
            break;
          }
          if (absl::Status st = gpu::CopyNow(gpus, t.view.data, t.view.place, out.data.data(),
                                           out.place, out.data.size());
              !st.ok()) {
            response->status = absl::InternalError(
                inferd::StrCat("output '", out.name, "': copying into shared memory region '",
                               t.region, "': ", st.message()));
            break;
          }
          out.data = {};
          out.holder.reset();
          out.place = MemoryPlace::Host();  // no bytes left to place
          out.in_shared_memory = true;
        }
        if (!response->status.ok()) break;
      }
      if (!response->status.ok()) response->outputs.clear();
    }
  };
  if (request->response_sender != nullptr) request->response_sender->AddEdge(copy_to_regions);
  request->on_complete = [copy_to_regions = std::move(copy_to_regions),
                          next = std::move(request->on_complete)](
                             std::unique_ptr<core::InferResponse> response) {
    copy_to_regions(response.get());
    next(std::move(response));
  };
  return absl::OkStatus();
}

}  // namespace inferd::server
