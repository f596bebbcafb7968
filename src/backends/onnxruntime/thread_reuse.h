// OS threads for ONNX Runtime's per-session thread pools, kept and reused across sessions.
//
// ONNX Runtime starts the intra-op (and inter-op) pool threads of every session it creates and
// ends them when the session is released. Each of those threads leaves about 2 KiB of heap
// behind when it ends (allocated on the thread by ONNX Runtime, never freed; measured with
// heaptrack: it disappears with intra_op_thread_count 1, which starts no pool thread), so every
// load/unload cycle of a model grew the process. With these hooks installed
// (SessionOptionsSetCustomCreateThreadFn / SetCustomJoinThreadFn) a pool "thread" is a loan of
// one of a set of parked OS threads: ONNX Runtime's worker function runs on it, and when the
// pool joins it the OS thread parks again for the next session instead of ending. The number of
// OS threads is bounded by the most pool threads alive at once (plus up to kMaxParked idle).
#pragma once

#include <cstddef>

#include "onnxruntime_cxx_api.h"

namespace inferd::backends::ort {

// Installs the create/join hooks on `options`: the session's pool threads come from the
// process-wide set. Thread-safe. The pools' thread affinity settings
// (session.intra_op_thread_affinities) do not apply to borrowed threads.
void UseReusedThreads(Ort::SessionOptions* options);

// For tests: OS threads started so far, and those parked now.
struct ReusedThreadCounts {
  size_t started = 0;
  size_t parked = 0;
};
ReusedThreadCounts GetReusedThreadCounts();

}  // namespace inferd::backends::ort
