// Fuzzes the gRPC request conversion: arbitrary bytes parsed as a ModelInferRequest, then
// turned into an InferRequest.
#include <cstddef>
#include <cstdint>

#include "frontends/grpc/grpc_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  inference::ModelInferRequest message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto req = inferd::grpcfe::RequestFromProto(message, nullptr);
  (void)req;
  return 0;
}
