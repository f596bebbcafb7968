// Conversions between the KServe v2 gRPC messages and inferd's core types, and the one
// function that maps an absl::Status to a gRPC status. Pure functions, unit-tested.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "core/infer_request.h"
#include "grpc_service.pb.h"
#include "grpcpp/support/status.h"

namespace inferd::grpcfe {

// Builds a request whose raw inputs are views into `message`, which `owner` keeps alive.
// Typed `contents` are decoded into buffers the request owns.
absl::StatusOr<std::unique_ptr<core::InferRequest>> RequestFromProto(
    const inference::ModelInferRequest& message, std::shared_ptr<const void> owner);

// Fills `message` from a successful response; outputs go to raw_output_contents.
void ResponseToProto(const core::InferResponse& response, inference::ModelInferResponse* message);

grpc::Status ToGrpcStatus(const absl::Status& status);

// "" -> -1 (latest); "3" -> 3; anything else is an error.
absl::StatusOr<int64_t> ParseVersion(const std::string& version);

}  // namespace inferd::grpcfe
