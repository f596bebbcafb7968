// Load-time checks of an ensemble against its composing models: every tensor a step maps
// exists in that model, and data types, shapes and batch sizes agree along every edge.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "config/model_config_util.h"
#include "scheduling/ensemble_scheduler.h"

namespace inferd::repository {

// `steps[i]` is the configuration of the model step i runs. Errors are INVALID_ARGUMENT and
// name the ensemble, the step, the model and the tensor.
absl::Status ValidateEnsembleSteps(const config::ModelConfig& ensemble,
                                   const scheduling::EnsembleGraph& graph,
                                   const std::vector<const config::ModelConfig*>& steps);

}  // namespace inferd::repository
