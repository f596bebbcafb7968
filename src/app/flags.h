// Command-line flags with tritonserver's names and defaults where the meaning is the same.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
  int log_verbose = 0;
  bool log_iso8601 = false;
  bool help = false;
  bool version = false;
};

// Accepts "--name=value" and "--name value". Errors name the flag.
absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args, int cpu_cores);
std::string Usage();

}  // namespace inferd::app
