// The classification extension: an output requested with `classification: N` is replaced by
// a BYTES tensor of its top N entries per batch item, "<value>:<index>[:<label>]", labels from
// the output's label_filename (as tritonserver formats them).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/infer_request.h"

namespace inferd::server {

using LabelMap = std::map<std::string, std::vector<std::string>>;

absl::Status ApplyClassification(const std::vector<core::RequestedOutput>& requested,
                                 const LabelMap& labels, bool batching,
                                 core::InferResponse* response);

}  // namespace inferd::server
