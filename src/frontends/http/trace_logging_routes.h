// The trace and logging extensions' HTTP routes (docs/trace_and_logging.md):
//   GET/POST /v2/trace/setting, /v2/models/<m>[/versions/<v>]/trace/setting
//   GET/POST /v2/logging
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "frontends/http/http_server.h"
#include "server/server.h"

namespace inferd::http {

// nullopt when `segments` (the decoded path, starting "v2") is not one of these routes.
std::optional<HttpResponse> HandleTraceLoggingRoute(server::Server* server,
                                                    const HttpRequest& request,
                                                    const std::vector<std::string>& segments);

}  // namespace inferd::http
