// Command-line flags with tritonserver's names and defaults where the meaning is the same.
// Every flag tritonserver accepts is accepted: the ones with a meaning here are implemented, the
// others (GPU, TLS, tracing, caches, ...) are parsed like tritonserver parses them and each one
// given becomes a line in `no_effect`, which main logs at start. A flag neither server knows is
// an error naming it (main exits 2).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "frontends/grpc/grpc_frontend.h"
#include "frontends/http/http_server.h"
#include "frontends/sagemaker/sagemaker_service.h"
#include "server/server.h"

namespace inferd::app {

struct Flags {
  server::ServerOptions server;
  http::HttpServerOptions http;
  ApiRestrictions http_restrictions;  // --http-restricted-api
  bool allow_http = true;
  bool allow_grpc = true;
  grpcfe::GrpcOptions grpc;
  bool allow_sagemaker = false;
  http::HttpServerOptions sagemaker_http;
  sagemaker::SageMakerOptions sagemaker;
  bool allow_metrics = true;
  http::HttpServerOptions metrics_http;
  int metrics_interval_ms = 2000;
  std::string backend_directory;  // --backend-directory; default: the executable's folder
  bool allow_cpu_metrics = true;  // --allow-cpu-metrics: the nv_cpu_* gauges
  bool allow_gpu_metrics = true;  // --allow-gpu-metrics: the nv_gpu_* figures from NVML
  int log_verbose = 0;
  bool log_iso8601 = false;
  bool log_info = true;     // --log-info
  bool log_warning = true;  // --log-warning
  bool log_error = true;    // --log-error
  std::string log_file;     // --log-file: log lines go there instead of stderr
  // --exit-timeout-secs: after SIGINT/SIGTERM, how long requests in flight may take before the
  // process exits anyway (status 1), as tritonserver does.
  int exit_timeout_secs = 30;
  // --backend-config=<backend>,<key>=<value>; backend "" holds the global <key>=<value> ones.
  std::map<std::string, std::map<std::string, std::string>> backend_config;
  // "--<flag>=<value> has no effect on this server (<why>)", one per such flag given, and
  // tritonserver's own warnings for its deprecated --strict-model-config; main logs each.
  std::vector<std::string> no_effect;
  bool help = false;
  bool version = false;
};

// Accepts "--name=value" and "--name value". Errors name the flag.
absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args, int cpu_cores);
std::string Usage();

// Hands each registered backend its --backend-config settings (its own over the global ones),
// before any model loads. Returns a "has no effect on this server" line for each setting no
// backend reads and each backend named that this server does not have; fails on a value a
// backend cannot use.
absl::StatusOr<std::vector<std::string>> ConfigureBackends(const Flags& flags,
                                                           const backends::BackendRegistry& registry);

}  // namespace inferd::app
