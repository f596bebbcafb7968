// A bounded pool of streams per device for the edge copies (gpu/copy.h CopyNow): the server
// copying a tensor between a CUDA shared-memory region, an instance and the host has no stream
// of its own, and creating and destroying a CUDA stream per copy costs more than a small copy
// (cudaStreamDestroy may wait on the device). The pool creates a device's streams lazily, at
// most `max_per_device`, and a copy returns its stream after it synchronized it.
//
// When every stream of a device is in use, Acquire waits for one to come back rather than
// creating one more: a device has a few copy engines (one or two per direction), so more
// concurrent copies than that do not finish sooner, and the pool stays bounded however many
// threads copy at once. The wait is bounded by one copy: a lease is held only around one
// CopyAsync + Synchronize, and nothing holding one acquires another, so waiting cannot
// deadlock.
//
// Thread safety: every method may be called from any thread. A Lease belongs to one thread.
// Lifetime: the pool outlives its leases (it is owned by the Runtime it creates streams from).
#ifndef INFERD_GPU_STREAM_POOL_H_
#define INFERD_GPU_STREAM_POOL_H_

#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace inferd::gpu {

class Runtime;
class Stream;

class StreamPool {
 public:
  // A stream taken from the pool, given back by the destructor (or dropped, after Discard).
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(other.pool_), stream_(std::move(other.stream_)), keep_(other.keep_) {
      other.pool_ = nullptr;
    }
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    Stream& stream() const { return *stream_; }
    // The stream hit an error: destroy it instead of giving it back, so the next copy does not
    // inherit a stream in an unknown state (the pool creates a fresh one in its place).
    void Discard() { keep_ = false; }

   private:
    friend class StreamPool;
    Lease(StreamPool* pool, std::unique_ptr<Stream> stream)
        : pool_(pool), stream_(std::move(stream)) {}
    StreamPool* pool_;
    std::unique_ptr<Stream> stream_;
    bool keep_ = true;
  };

  // At most `max_per_device` (>= 1) streams per device, created by `runtime.CreateStream`.
  StreamPool(Runtime& runtime, int max_per_device);
  ~StreamPool();
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  // An idle stream of `device`, a new one while fewer than max_per_device exist, else the next
  // one given back (waiting for it). The runtime's error when it cannot create one
  // (OUT_OF_RANGE for a device that does not exist).
  absl::StatusOr<Lease> Acquire(int device);

  int max_per_device() const { return max_per_device_; }

 private:
  struct Device {
    std::vector<std::unique_ptr<Stream>> idle;
    int created = 0;  // idle + leased
  };
  void Return(int device, std::unique_ptr<Stream> stream, bool keep);

  Runtime& runtime_;
  const int max_per_device_;
  inferd::Mutex mu_;
  std::deque<Device> devices_ ABSL_GUARDED_BY(mu_);  // by id, grown on first use
};

}  // namespace inferd::gpu

#endif  // INFERD_GPU_STREAM_POOL_H_
