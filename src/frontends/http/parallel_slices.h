// Runs the slices of one large body's work (parsing or writing a JSON tensor, compressing a
// response) on the request's own thread and a few helper threads started once and shared by
// every request. Sized by the CPU budget (cgroup quota, cpuset, affinity: common/cpu_budget.h),
// not the host's cores: under a quota of one CPU a second slice would only wait for the first.
#pragma once

#include <cstddef>
#include <functional>

namespace inferd::http {

// Bodies of this many bytes or more are worth splitting (a 1x3x224x224 FP32 tensor is ~3 MB of
// text, ~5 ms of number conversion or ~30 ms of deflate on one core); smaller ones run whole.
inline constexpr size_t kParallelMinBytes = 512 * 1024;

// How many slices a body of `bytes` splits into: 1 below kParallelMinBytes, else at most one per
// usable CPU (up to 4) and one per 256 KiB.
size_t SlicesFor(size_t bytes);

// Runs fn(0..n-1) and returns when every call has returned. The caller runs slice 0 and then
// every slice no helper has claimed yet, so a request never waits for a helper to wake up.
// Thread-safe; fn must be safe to call concurrently for different indices.
void RunSlices(size_t n, const std::function<void(size_t)>& fn);

}  // namespace inferd::http
