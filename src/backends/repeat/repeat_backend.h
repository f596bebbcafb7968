// The repeat backend: Triton's decoupled test backend (triton-inference-server/repeat_backend)
// with the same tensors and behaviour, so decoupled serving is tested without an ML runtime.
// Inputs IN (INT32 [-1]), DELAY (UINT32, IN's shape) and WAIT (UINT32 [1]); outputs OUT
// (INT32 [1]) and IDX (UINT32 [1]). For each element e of IN it waits DELAY[e] ms, then sends
// one response {OUT: IN[e], IDX: e}; after the last it sends the final flag alone (an empty IN
// gives no response, only the flag). Execute returns after WAIT ms, while the responses may
// still be coming (from one thread per request). The model must be decoupled.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace inferd::backends {

std::unique_ptr<Backend> MakeRepeatBackend();

}  // namespace inferd::backends
