// The identity backend: OUTPUTn is a copy of INPUTn (by position in the config). It needs no
// ML runtime, so unit tests and the protocol benchmark run on it (Triton ships the same).
#pragma once

#include <memory>

#include "backends/backend.h"

namespace inferd::backends {

std::unique_ptr<Backend> MakeIdentityBackend();

}  // namespace inferd::backends
