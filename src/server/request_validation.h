// Checks an InferRequest against a model's configuration before it is queued, so schedulers
// and backends can trust it: names, data types, shapes, byte sizes, batch size.
#pragma once

#include "absl/status/status.h"
#include "config/model_config_util.h"
#include "core/infer_request.h"

namespace inferd::server {

// On success sets request->batch_size. Errors are INVALID_ARGUMENT and name the tensor.
absl::Status ValidateRequest(const config::ModelConfig& config, core::InferRequest* request);

}  // namespace inferd::server
