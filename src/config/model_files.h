// The fields of a model configuration that name files, and the rule they all follow: each
// resolves inside the model's own folder. A config may come from the load API (`config` and
// `file:` parameters) or from an archive anyone could upload to a bucket, so a field like
// `label_filename: ../../../etc/passwd` must not make the server read (and a classification
// answer echo) a file of the host.
//
// The rule is Triton's IsChildPathEscapingParentPath applied twice: to the lexically
// normalized path, and to its real path (links resolved), so a link in the model folder that
// points out is refused as well.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/model_config_util.h"

namespace inferd::config {

// Where each file-naming field is resolved from, below the model folder.
//   output[].label_filename                          <model>/
//   default_model_filename                           <model>/<version>/ (stays in the version)
//   model_warmup[].inputs[].input_data_file          <model>/warmup/
//   sequence_batching.state[].initial_state[].data_file  <model>/initial_state/
//   parameters EXECUTION_ENV_PATH (Python)           <model>/ ($$TRITON_MODEL_DIRECTORY expanded)
//   parameters optimized_model_filepath (ONNX)       absolute, inside <model>/
//
// Returns the real path of `within`/`value` (links resolved as far as it exists) when it lies
// inside `within` (a folder at or below the model folder), lexically and after resolving
// links. An absolute `value` is taken as it
// is and must lie inside `within` too. Otherwise INVALID_ARGUMENT naming `field` and `value`.
absl::StatusOr<std::string> ResolveInside(const std::string& within, std::string_view field,
                                          std::string_view value);

// Checks every file-naming field of `cfg` (above) against `model_dir`, for each version in
// `versions` where the field is per version. The first offender is INVALID_ARGUMENT naming
// the field, so the load is refused with 400.
absl::Status CheckFilesInsideModel(const ModelConfig& cfg, const std::string& model_dir,
                                   const std::vector<int64_t>& versions);

// EXECUTION_ENV_PATH with $$TRITON_MODEL_DIRECTORY replaced by `model_dir`.
std::string ExpandModelDirectory(std::string value, const std::string& model_dir);

}  // namespace inferd::config
