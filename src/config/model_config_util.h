// Reading, normalizing and validating Triton model configurations (config.pbtxt), and the
// JSON form the HTTP API returns. The schema is model_config.proto, field-for-field Triton's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/data_type.h"
#include "model_config.pb.h"

namespace inferd::config {

using inference::ModelConfig;

// Parses protobuf text. Errors name `file_name`, the line and column, and the field.
absl::StatusOr<ModelConfig> ParseModelConfigText(std::string_view text,
                                                 std::string_view file_name);
absl::StatusOr<ModelConfig> ReadModelConfigFile(const std::string& path);

// Parses the JSON form (the `config` parameter of the repository load API).
absl::StatusOr<ModelConfig> ParseModelConfigJson(std::string_view json);

// The JSON the HTTP API returns: proto field names, every field printed, 64-bit integers as
// numbers (as tritonserver prints them).
std::string ModelConfigToJson(const ModelConfig& config);

DataType FromProto(inference::DataType type);
inference::DataType ToProto(DataType type);
// "TYPE_FP32"
std::string ProtoTypeName(inference::DataType type);

// Platform/backend pairs as tritonserver knows them ("onnxruntime_onnx" <-> "onnxruntime").
// Fills whichever of the two is missing; fails when they disagree. A config that names backend
// "pytorch" and no platform also gets default_model_filename "model.pt", as in Triton (one that
// names the platform keeps it empty).
absl::Status NormalizePlatformAndBackend(ModelConfig* config);

// The file in a version folder the backend opens: default_model_filename, or the backend's own
// default where it is empty (model.onnx, model.pt, model.py); empty for a backend without one.
std::string ModelFilename(const ModelConfig& config);

// Triton's custom-backend auto-complete for a config that names no backend, platform or
// default_model_filename and a version folder without a file that tells: a model named
// "<model>.<backend>" is served by <backend> (the text after the first '.'), with
// default_model_filename "model.<backend>". Fails, naming the model, for a name without '.'.
absl::Status BackendFromModelName(std::string_view model_name, ModelConfig* config);

// Triton's default max_sequence_idle_microseconds (SEQUENCE_IDLE_DEFAULT_MICROSECONDS).
inline constexpr uint64_t kDefaultSequenceIdleMicroseconds = 1000000;

// Refuses the fields inferd does not implement (supported_fields.h), fills the defaults Triton
// core's normalization fills (name, instance group, version policy, default_model_filename; a
// dynamic batcher's and an `oldest` sequence batcher's preferred_batch_size [max_batch_size]
// when none is given; max_sequence_idle_microseconds 1000000; optimization's
// input_pinned_memory / output_pinned_memory `enable: true` except in an ensemble; an
// ensemble's model_transaction_policy { decoupled: false }), so the config clients read back
// is tritonserver's, and checks the configuration is consistent. Errors start with
// "model '<name>': " and name the offending field.
absl::Status NormalizeAndValidate(ModelConfig* config, std::string_view model_name);

// The config file of the model in `model_dir`: tritonserver's --model-config-name=<name> selects
// `<model_dir>/configs/<name>.pbtxt` where it exists; otherwise (or with no name) it is
// `<model_dir>/config.pbtxt`. Whether that file exists is the caller's question.
std::string ModelConfigPath(const std::string& model_dir, std::string_view config_name);

// Looks up `parameters { key: ... value: { string_value: ... } }`.
std::optional<std::string> GetParameter(const ModelConfig& config, std::string_view key);

// A boolean parameter's value as Triton's backends read it (backend_common's ParseBoolValue):
// true/on/1 or false/off/0 in any case; nullopt for anything else. Inline: the PyTorch module,
// built apart from the executable, reads it too.
inline std::optional<bool> ParseTritonBool(std::string_view value) {
  auto is = [value](std::string_view word) {
    if (value.size() != word.size()) return false;
    for (size_t i = 0; i < word.size(); ++i) {
      char c = value[i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      if (c != word[i]) return false;
    }
    return true;
  };
  if (is("true") || is("on") || is("1")) return true;
  if (is("false") || is("off") || is("0")) return false;
  return std::nullopt;
}

}  // namespace inferd::config
