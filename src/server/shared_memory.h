// The system shared-memory extension: regions a client created with shm_open (a key such as
// "/input_data") and registered by name, through which it sends inputs and receives outputs.
//
// Each registered region is mapped once (read/write, shared). A request that names a region
// holds the mapping through a shared_ptr, so unregistering a region while requests use it only
// drops the name: the mapping goes when the last of them finishes (Triton's deferred
// unregister). CUDA shared memory is not supported here.
//
// Thread-safe: one mutex around the name table; requests copy through their own references.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "core/infer_request.h"

namespace inferd::server {

struct SharedMemoryRegionStatus {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

class SharedMemoryManager {
 public:
  SharedMemoryManager();
  ~SharedMemoryManager();

  // Maps [offset, offset + byte_size) of the POSIX shared-memory object `key`. INVALID_ARGUMENT
  // for an empty name, a name already registered, an object that does not exist or is smaller
  // than offset + byte_size.
  absl::Status Register(const std::string& name, const std::string& key, uint64_t offset,
                        uint64_t byte_size);
  // Empty name: every region. An unknown name is not an error (as Triton).
  absl::Status Unregister(const std::string& name);
  // Empty name: every region. NOT_FOUND for an unknown name.
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> Status(const std::string& name) const;

  // A view of `ref.byte_size` bytes at `ref.offset` inside the region, and what keeps the
  // mapping alive. INVALID_ARGUMENT naming the tensor for an unknown region or a range past
  // its end.
  struct View {
    char* data = nullptr;
    size_t size = 0;
    std::shared_ptr<const void> holder;
  };
  absl::StatusOr<View> Resolve(const core::SharedMemoryRef& ref, std::string_view what) const;

  // Points every shared-memory input of `request` at its region, and arranges for outputs that
  // name a region to be written there when the request completes (an output larger than its
  // region's byte size fails the request). Call before validation.
  absl::Status Attach(core::InferRequest* request) const;

 private:
  struct Region;
  mutable inferd::Mutex mu_;
  std::map<std::string, std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::server
