// Where a tensor's bytes live: host memory, page-locked host memory, or one GPU's memory, as
// Triton's TRITONSERVER_MemoryType + memory_type_id. Every tensor is on the host unless a
// backend or the CUDA shared-memory extension says otherwise, so code that never heard of GPUs
// keeps working on the default. In common because core (tensor views) and gpu (the copies
// between places) both need it and neither may include the other.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/strings.h"

namespace inferd {

// The order and names are TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_CPU_PINNED,
// TRITONSERVER_MEMORY_GPU.
enum class MemoryType { kCpu, kCpuPinned, kGpu };

// "CPU", "CPU_PINNED", "GPU": TRITONSERVER_MemoryTypeString's names.
inline std::string_view MemoryTypeName(MemoryType t) {
  switch (t) {
    case MemoryType::kCpu: return "CPU";
    case MemoryType::kCpuPinned: return "CPU_PINNED";
    case MemoryType::kGpu: return "GPU";
  }
  return "UNKNOWN";
}

struct MemoryPlace {
  MemoryType type = MemoryType::kCpu;
  // The GPU's CUDA device number for kGpu; 0 for the host kinds (Triton's memory_type_id is 0
  // there too: there is one host).
  int device_id = 0;

  static constexpr MemoryPlace Host() { return {MemoryType::kCpu, 0}; }
  static constexpr MemoryPlace Pinned() { return {MemoryType::kCpuPinned, 0}; }
  static constexpr MemoryPlace Gpu(int device) { return {MemoryType::kGpu, device}; }

  // Whether the CPU can read the bytes through their pointer (CPU or CPU_PINNED).
  constexpr bool OnHost() const { return type != MemoryType::kGpu; }
  // "CPU", "CPU_PINNED", "GPU 1": for messages.
  std::string ToString() const {
    if (type == MemoryType::kGpu) return inferd::StrCat("GPU ", device_id);
    return std::string(MemoryTypeName(type));
  }
  friend constexpr bool operator==(const MemoryPlace& a, const MemoryPlace& b) {
    return a.type == b.type && a.device_id == b.device_id;
  }
};

}  // namespace inferd
