// The KServe v2 gRPC frontend on gRPC's callback API: every RPC, including the bidirectional
// ModelStreamInfer, and grpc.health.v1.Health/Check (health.proto) as tritonserver serves it.
// It converts messages to and from core types (grpc_codec.h) and calls server::Server, the
// same execution path HTTP uses. Raw input contents are used in place:
// the request message lives until the RPC finishes.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/restricted_api.h"
#include "server/server.h"

namespace grpc {
class Server;
}

namespace inferd::grpcfe {

struct GrpcOptions {
  std::string address = "0.0.0.0";
  int port = 8001;
  int max_message_bytes = 64 * 1024 * 1024;
  int infer_threads = 0;  // 0: gRPC's default
  // Requests of one ModelStreamInfer stream in the server at once; past it the stream is not
  // read until one completes (HTTP/2 flow control then holds the client). 0: unbounded.
  int stream_max_in_flight = 64;
  ApiRestrictions restrictions;  // --grpc-restricted-protocol
};

class GrpcFrontend {
 public:
  GrpcFrontend(server::Server* server, GrpcOptions options);
  ~GrpcFrontend();

  absl::Status Start();
  // Stops accepting RPCs and waits (bounded) for those in flight.
  void Stop();
  int port() const { return port_; }

 private:
  class Service;
  class HealthService;
  server::Server* server_;
  GrpcOptions options_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<HealthService> health_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
};

}  // namespace inferd::grpcfe
