// The shared-memory extensions' HTTP routes, as a plain function of the request:
//   GET  /v2/systemsharedmemory[/region/<name>]/status
//   POST /v2/systemsharedmemory/region/<name>/register   {"key", "offset", "byte_size"}
//   POST /v2/systemsharedmemory[/region/<name>]/unregister
//   GET  /v2/cudasharedmemory[/region/<name>]/status
//   POST /v2/cudasharedmemory/region/<name>/register
//        {"raw_handle": {"b64": "<base64 cudaIpcMemHandle_t>"}, "device_id", "byte_size"}
//   POST /v2/cudasharedmemory[/region/<name>]/unregister
// Both kinds share the manager's one name space, as in Triton; status and unregister see only
// regions of the route's kind.
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
