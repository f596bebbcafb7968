#include "gpu/stream_pool.h"

#include <algorithm>
#include <utility>

#include "common/strings.h"
#include "gpu/runtime.h"

namespace inferd::gpu {

StreamPool::Lease::~Lease() {
  if (pool_ != nullptr && stream_ != nullptr) {
    const int device = stream_->device();
    pool_->Return(device, std::move(stream_), keep_);
  }
}

StreamPool::StreamPool(Runtime& runtime, int max_per_device)
    : runtime_(runtime), max_per_device_(std::max(1, max_per_device)) {}

StreamPool::~StreamPool() = default;

absl::StatusOr<StreamPool::Lease> StreamPool::Acquire(int device) {
  if (device < 0 || device >= runtime_.DeviceCount()) {
    return absl::OutOfRangeError(inferd::StrCat("GPU ", device, " does not exist: this host has ",
                                                runtime_.DeviceCount(), " GPU(s)"));
  }
  {
    inferd::MutexLock lock(&mu_);
    // A deque: growing it keeps `d` valid while Await lets other threads in.
    if (devices_.size() <= static_cast<size_t>(device)) devices_.resize(device + 1);
    Device* d = &devices_[device];
    const int max = max_per_device_;
    auto ready = [d, max] { return !d->idle.empty() || d->created < max; };
    mu_.Await(absl::Condition(&ready));
    if (!d->idle.empty()) {
      std::unique_ptr<Stream> s = std::move(d->idle.back());
      d->idle.pop_back();
      return Lease(this, std::move(s));
    }
    ++d->created;  // reserve the slot; created outside the lock (cudaStreamCreate is not free)
  }
  absl::StatusOr<std::unique_ptr<Stream>> created = runtime_.CreateStream(device);
  if (!created.ok()) {
    inferd::MutexLock lock(&mu_);
    --devices_[device].created;
    return created.status();
  }
  return Lease(this, *std::move(created));
}

void StreamPool::Return(int device, std::unique_ptr<Stream> stream, bool keep) {
  if (!keep) stream.reset();  // destroyed outside the lock
  inferd::MutexLock lock(&mu_);
  if (devices_.size() <= static_cast<size_t>(device)) return;  // not one of ours
  if (keep) {
    devices_[device].idle.push_back(std::move(stream));
  } else {
    --devices_[device].created;
  }
}

}  // namespace inferd::gpu
