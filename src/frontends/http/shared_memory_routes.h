// The shared-memory extensions' HTTP routes, as a plain function of the request:
//   GET  /v2/systemsharedmemory[/region/<name>]/status
//   POST /v2/systemsharedmemory/region/<name>/register   {"key", "offset", "byte_size"}
//   POST /v2/systemsharedmemory[/region/<name>]/unregister
// and /v2/cudasharedmemory/...: register answered 501 (CUDA shared memory is not supported
// here); unregister succeeds as a no-op and status lists no region, as Triton without a GPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "frontends/http/http_server.h"
#include "server/shared_memory.h"

namespace inferd::http {

// nullopt when `segments` (the decoded path, starting "v2") is not a shared-memory route.
std::optional<HttpResponse> HandleSharedMemoryRoute(server::SharedMemoryManager& shm,
                                                    const HttpRequest& request,
                                                    const std::vector<std::string>& segments);

}  // namespace inferd::http
