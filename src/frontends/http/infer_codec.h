// KServe v2 inference messages over HTTP: the JSON body, Triton's binary tensor extension
// (Inference-Header-Content-Length, binary_data_size, binary_data) and the raw-body form.
// Pure functions of bytes, tested and fuzzed without a socket.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/infer_request.h"
#include "frontends/http/http_server.h"

namespace inferd::http {

// How the client asked for outputs: binary_data per output and binary_data_output overall.
struct OutputEncoding {
  bool binary_default = false;
  std::vector<std::pair<std::string, bool>> per_output;  // name -> binary
  bool IsBinary(std::string_view name) const;
};

struct ParsedInfer {
  std::unique_ptr<core::InferRequest> request;
  OutputEncoding encoding;
};

// Parses an infer request body. `header_length` is the Inference-Header-Content-Length value
// (nullopt when absent: the whole body is JSON). `body` must stay alive through `owner`,
// which the request keeps. Errors are INVALID_ARGUMENT naming the offending field.
absl::StatusOr<ParsedInfer> ParseInferRequest(
    std::string_view body, std::optional<size_t> header_length,
    std::shared_ptr<const void> owner);

// The model input a raw (header length 0) body is for: its name, type and shape without the
// batch dimension, and whether the model batches.
struct RawInputSpec {
  std::string name;
  DataType datatype;
  Shape dims;
  bool batching;
};
absl::StatusOr<ParsedInfer> ParseRawInferRequest(
    std::string_view body, const RawInputSpec& spec, std::shared_ptr<const void> owner);

// Serializes a successful response. Binary outputs go into `tail` without a copy.
HttpResponse SerializeInferResponse(core::InferResponse& response, const OutputEncoding& encoding);

// {"error": "..."} with the status mapped to its HTTP code.
HttpResponse ErrorResponse(const absl::Status& status);
HttpResponse ErrorResponse(int http_status, std::string_view message);
int HttpStatusFromStatus(const absl::Status& status);

}  // namespace inferd::http
