#include "server/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/strings.h"

namespace inferd::server {

struct SharedMemoryManager::Region {
  SharedMemoryRegionStatus status;
  void* map_base = MAP_FAILED;
  size_t map_length = 0;
  char* data = nullptr;  // map_base + (offset - the page-aligned offset)
  ~Region() {
    if (map_base != MAP_FAILED) munmap(map_base, map_length);
  }
};

SharedMemoryManager::SharedMemoryManager() = default;
SharedMemoryManager::~SharedMemoryManager() = default;

absl::Status SharedMemoryManager::Register(const std::string& name, const std::string& key,
                                          uint64_t offset, uint64_t byte_size) {
  auto fail = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        inferd::StrCat("failed to register shared memory region '", name, "': ", why));
  };
  if (name.empty()) {
    return absl::InvalidArgumentError("a shared memory region needs a name");
  }
  if (key.empty()) return fail("'key' is empty");
  if (key.find('\0') != std::string::npos) return fail("'key' contains a NUL character");
  if (byte_size == 0) return fail("'byte_size' must be positive");
  {
    inferd::MutexLock lock(&mu_);
    if (regions_.count(name)) {
      return absl::InvalidArgumentError(
          inferd::StrCat("shared memory region '", name, "' is already registered"));
    }
  }
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
  region->status = {name, key, offset, byte_size};
  inferd::MutexLock lock(&mu_);
  if (!regions_.emplace(name, std::move(region)).second) {
    return absl::InvalidArgumentError(
        inferd::StrCat("shared memory region '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryManager::Unregister(const std::string& name) {
  std::vector<std::shared_ptr<Region>> dropped;  // unmapped outside the lock
  inferd::MutexLock lock(&mu_);
  if (name.empty()) {
    for (auto& [n, r] : regions_) dropped.push_back(std::move(r));
    regions_.clear();
  } else if (auto it = regions_.find(name); it != regions_.end()) {
    dropped.push_back(std::move(it->second));
    regions_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SharedMemoryRegionStatus>> SharedMemoryManager::Status(
    const std::string& name) const {
  std::vector<SharedMemoryRegionStatus> out;
  inferd::MutexLock lock(&mu_);
  if (name.empty()) {
    for (const auto& [n, r] : regions_) out.push_back(r->status);
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        inferd::StrCat("unable to find system shared memory region: '", name, "'"));
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
        ref.byte_size, " is past the end of shared memory region '", ref.region, "' of ", size,
        " bytes"));
  }
  View v;
  v.data = region->data + ref.offset;
  v.size = static_cast<size_t>(ref.byte_size);
  v.holder = std::move(region);
  return v;
}

absl::Status SharedMemoryManager::Attach(core::InferRequest* request) const {
  for (auto& in : request->inputs) {
    if (!in.shm) continue;
    auto view = Resolve(*in.shm, inferd::StrCat("input '", in.name, "'"));
    if (!view.ok()) return view.status();
    in.data = std::string_view(view->data, view->size);
    request->holders.push_back(std::move(view->holder));
  }
  struct Target {
    std::string name;
    View view;
    std::string region;
  };
  std::vector<Target> targets;
  for (const auto& out : request->outputs) {
    if (!out.shm) continue;
    if (out.classification > 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "output '", out.name, "': can't set both 'shared_memory_region' and 'classification'"));
    }
    auto view = Resolve(*out.shm, inferd::StrCat("output '", out.name, "'"));
    if (!view.ok()) return view.status();
    targets.push_back({out.name, *std::move(view), out.shm->region});
  }
  if (targets.empty()) return absl::OkStatus();
  // Runs on the completing thread, before the frontend serializes: copy each output into its
  // region and leave only its description in the response.
  request->on_complete = [targets = std::move(targets), next = std::move(request->on_complete)](
                             std::unique_ptr<core::InferResponse> response) {
    if (response->status.ok()) {
      for (auto& out : response->outputs) {
        for (const auto& t : targets) {
          if (t.name != out.name) continue;
          if (out.data.size() > t.view.size) {
            response->status = absl::InvalidArgumentError(inferd::StrCat(
                "output '", out.name, "' needs ", out.data.size(),
                " bytes but its shared memory region '", t.region, "' has shared_memory_byte_size ",
                t.view.size));
            break;
          }
          if (!out.data.empty()) std::memcpy(t.view.data, out.data.data(), out.data.size());
          out.data = {};
          out.holder.reset();
          out.in_shared_memory = true;
        }
        if (!response->status.ok()) break;
      }
      if (!response->status.ok()) response->outputs.clear();
    }
    next(std::move(response));
  };
  return absl::OkStatus();
}

}  // namespace inferd::server
