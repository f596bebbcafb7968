#include "gpu/copy.h"

#include <cstdlib>
#include <cstring>

#include "common/strings.h"
#include "gpu/stream_pool.h"

namespace inferd::gpu {
namespace {

absl::Status CheckGpu(const Runtime& runtime, MemoryPlace place) {
  if (place.type != MemoryType::kGpu) return absl::OkStatus();
  if (place.device_id < 0 || place.device_id >= runtime.DeviceCount()) {
    return absl::OutOfRangeError(inferd::StrCat(
        place.ToString(), " does not exist: this host has ", runtime.DeviceCount(), " GPU(s)",
        runtime.DeviceCount() == 0 ? inferd::StrCat(" (", runtime.UnavailableReason(), ")")
                                   : std::string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlacedBuffer> PlacedBuffer::Allocate(Runtime& runtime, MemoryPlace place,
                                                    size_t bytes) {
  switch (place.type) {
    case MemoryType::kCpu: {
      void* p = std::malloc(bytes == 0 ? 1 : bytes);
      if (p == nullptr) {
        return absl::ResourceExhaustedError(
            inferd::StrCat("cannot allocate ", bytes, " bytes of host memory"));
      }
      return PlacedBuffer(place, std::shared_ptr<void>(p, std::free), p, bytes);
    }
    case MemoryType::kCpuPinned: {
      absl::StatusOr<std::unique_ptr<PinnedBuffer>> b = runtime.AllocatePinned(bytes);
      if (!b.ok()) return b.status();
      void* data = (*b)->data();
      return PlacedBuffer(place, std::shared_ptr<PinnedBuffer>(std::move(*b)), data, bytes);
    }
    case MemoryType::kGpu: {
      if (absl::Status st = CheckGpu(runtime, place); !st.ok()) return st;
      absl::StatusOr<std::unique_ptr<DeviceBuffer>> b =
          runtime.AllocateDevice(place.device_id, bytes);
      if (!b.ok()) return b.status();
      void* data = (*b)->data();
      return PlacedBuffer(place, std::shared_ptr<DeviceBuffer>(std::move(*b)), data, bytes);
    }
  }
  return absl::InvalidArgumentError("unknown memory type");
}

absl::Status CopyBetween(Runtime& runtime, void* dst, MemoryPlace dst_place, const void* src,
                         MemoryPlace src_place, size_t bytes, Stream* stream) {
  if (absl::Status st = CheckGpu(runtime, dst_place); !st.ok()) return st;
  if (absl::Status st = CheckGpu(runtime, src_place); !st.ok()) return st;
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "copy of ", bytes, " bytes from ", src_place.ToString(), " to ", dst_place.ToString(),
        " with a null pointer"));
  }
  if (dst_place.OnHost() && src_place.OnHost()) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  const std::string route = inferd::StrCat(src_place.ToString(), " to ", dst_place.ToString());
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        inferd::StrCat("a copy from ", route, " needs a stream on the GPU"));
  }
  CopyKind kind;
  if (src_place.OnHost()) {
    kind = CopyKind::kHostToDevice;
  } else if (dst_place.OnHost()) {
    kind = CopyKind::kDeviceToHost;
  } else {
    kind = CopyKind::kDeviceToDevice;
  }
  const bool stream_fits = (!src_place.OnHost() && stream->device() == src_place.device_id) ||
                           (!dst_place.OnHost() && stream->device() == dst_place.device_id);
  if (!stream_fits) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "a copy from ", route, " cannot run on a stream of GPU ", stream->device()));
  }
  return runtime.CopyAsync(dst, src, bytes, kind, *stream);
}

absl::StatusOr<PlacedBuffer> CopyToPlace(Runtime& runtime, std::string_view src,
                                         MemoryPlace src_place, MemoryPlace dst, Stream* stream) {
  absl::StatusOr<PlacedBuffer> out = PlacedBuffer::Allocate(runtime, dst, src.size());
  if (!out.ok()) return out.status();
  if (absl::Status st = CopyBetween(runtime, out->data(), dst, src.data(), src_place, src.size(),
                                    stream);
      !st.ok()) {
    return st;
  }
  return out;
}

absl::Status CopyNow(Runtime* runtime, void* dst, MemoryPlace dst_place, const void* src,
                     MemoryPlace src_place, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_place.OnHost() && src_place.OnHost()) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  if (runtime == nullptr) {
    return absl::InternalError(inferd::StrCat("a copy from ", src_place.ToString(), " to ",
                                              dst_place.ToString(), " without a GPU runtime"));
  }
  const int device = dst_place.OnHost() ? src_place.device_id : dst_place.device_id;
  if (absl::Status st = CheckGpu(*runtime, MemoryPlace::Gpu(device)); !st.ok()) return st;
  absl::StatusOr<StreamPool::Lease> lease = runtime->EdgeStreams().Acquire(device);
  if (!lease.ok()) return lease.status();
  absl::Status st =
      CopyBetween(*runtime, dst, dst_place, src, src_place, bytes, &lease->stream());
  if (st.ok()) st = lease->stream().Synchronize();
  if (!st.ok()) lease->Discard();
  return st;
}

absl::StatusOr<PlacedBuffer> CopyToPlaceNow(Runtime* runtime, std::string_view src,
                                            MemoryPlace src_place, MemoryPlace dst) {
  if (runtime == nullptr) {
    return absl::InternalError(inferd::StrCat("a copy from ", src_place.ToString(), " to ",
                                              dst.ToString(), " without a GPU runtime"));
  }
  absl::StatusOr<PlacedBuffer> out = PlacedBuffer::Allocate(*runtime, dst, src.size());
  if (!out.ok()) return out.status();
  if (absl::Status st = CopyNow(runtime, out->data(), dst, src.data(), src_place, src.size());
      !st.ok()) {
    return st;
  }
  return out;
}

}  // namespace inferd::gpu
