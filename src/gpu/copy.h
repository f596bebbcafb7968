// Copies between memory places (host, pinned host, GPU n) through the device layer, so that a
// tensor moves once, at the edge that needs it, whatever backend or frontend asks. The route is
// chosen from the two places: host<->host is a memcpy; anything with a GPU end is a CopyAsync
// on the given stream with the matching CopyKind.
#ifndef INFERD_GPU_COPY_H_
#define INFERD_GPU_COPY_H_

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/memory_place.h"
#include "gpu/runtime.h"

namespace inferd::gpu {

// Bytes at a place, owned: malloc'd host memory, a PinnedBuffer or a DeviceBuffer. Move-only.
class PlacedBuffer {
 public:
  // `bytes` at `place`: CPU from the heap, CPU_PINNED from runtime.AllocatePinned, GPU n from
  // runtime.AllocateDevice(n) (OUT_OF_RANGE for a device that does not exist,
  // RESOURCE_EXHAUSTED when it has not `bytes` free).
  static absl::StatusOr<PlacedBuffer> Allocate(Runtime& runtime, MemoryPlace place,
                                               size_t bytes);

  PlacedBuffer(PlacedBuffer&&) = default;
  PlacedBuffer& operator=(PlacedBuffer&&) = default;

  MemoryPlace place() const { return place_; }
  void* data() const { return data_; }
  size_t size() const { return size_; }
  // The bytes as a tensor view's `data`; host bytes only make sense to read through it when
  // place().OnHost().
  std::string_view view() const { return {static_cast<const char*>(data_), size_}; }

 private:
  PlacedBuffer(MemoryPlace place, std::shared_ptr<void> owner, void* data, size_t size)
      : place_(place), owner_(std::move(owner)), data_(data), size_(size) {}

  MemoryPlace place_;
  std::shared_ptr<void> owner_;  // what frees the bytes
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Copies `bytes` from `src` at `src_place` to `dst` at `dst_place`. A copy with a GPU end
// needs `stream`, on that GPU (for GPU to GPU, on either one: CUDA copies between peers under
// unified addressing); it is queued, and the memory must stay valid until the stream is
// synchronized. A copy between host places runs at once and needs no stream.
// INVALID_ARGUMENT naming what is wrong (no stream, a stream on another GPU), OUT_OF_RANGE
// for a GPU that does not exist, or the runtime's error.
absl::Status CopyBetween(Runtime& runtime, void* dst, MemoryPlace dst_place, const void* src,
                         MemoryPlace src_place, size_t bytes, Stream* stream);

// A new buffer at `dst` holding a copy of `src` (at `src_place`), for the edge where a tensor
// must move (a host-only backend given GPU bytes, a GPU backend given host bytes). Always
// copies; the caller skips it when the places are equal. Errors as Allocate and CopyBetween.
absl::StatusOr<PlacedBuffer> CopyToPlace(Runtime& runtime, std::string_view src,
                                         MemoryPlace src_place, MemoryPlace dst, Stream* stream);

// CopyBetween done by the time it returns, for an edge that has no stream of its own (the
// server copying a tensor between a CUDA shared-memory region, an instance and the host): a
// copy with a GPU end runs on a stream of the GPU end's device (the destination's, for GPU to
// GPU) leased from runtime->EdgeStreams() and waited for (gpu/stream_pool.h). `runtime` may be null when both places are on the host. Errors as
// CopyBetween, INTERNAL for a GPU place without a runtime.
absl::Status CopyNow(Runtime* runtime, void* dst, MemoryPlace dst_place, const void* src,
                     MemoryPlace src_place, size_t bytes);

// CopyToPlace done by the time it returns (CopyNow's stream): the edge copy of one tensor.
// `runtime` must not be null (INTERNAL).
absl::StatusOr<PlacedBuffer> CopyToPlaceNow(Runtime* runtime, std::string_view src,
                                            MemoryPlace src_place, MemoryPlace dst);

}  // namespace inferd::gpu

#endif  // INFERD_GPU_COPY_H_
