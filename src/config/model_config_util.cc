#include "config/model_config_util.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "common/logging.h"
#include "common/strings.h"
#include "common/status_macros.h"
#include "config/supported_fields.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferd::config {
namespace {

namespace pb = google::protobuf;

class CollectFirstError : public pb::io::ErrorCollector {
 public:
  explicit CollectFirstError(std::string_view file) : file_(file) {}
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) {
      // The parser counts from zero; editors count from one.
      first_ = inferd::StrCat(file_, ":", line + 1, ":", column + 1, ": ", message);
    }
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string file_;
  std::string first_;
};

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

void WriteMessage(const pb::Message& msg, JsonWriter& w);

// std::to_chars rather than rapidjson's Grisu code (which trips UBSan on some values).
template <typename T>
void WriteFloat(JsonWriter& w, T v) {
  if (!std::isfinite(v)) {
    w.String(std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity"));
    return;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  w.RawValue(buf, end - buf, rapidjson::kNumberType);
}

void WriteScalar(const pb::Message& msg, const pb::FieldDescriptor* f, int index,
                 JsonWriter& w) {
  const pb::Reflection* r = msg.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      w.Int(rep ? r->GetRepeatedInt32(msg, f, index) : r->GetInt32(msg, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      w.Int64(rep ? r->GetRepeatedInt64(msg, f, index) : r->GetInt64(msg, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      w.Uint(rep ? r->GetRepeatedUInt32(msg, f, index) : r->GetUInt32(msg, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      w.Uint64(rep ? r->GetRepeatedUInt64(msg, f, index) : r->GetUInt64(msg, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      WriteFloat(w, rep ? r->GetRepeatedDouble(msg, f, index) : r->GetDouble(msg, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      WriteFloat(w, rep ? r->GetRepeatedFloat(msg, f, index) : r->GetFloat(msg, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      w.Bool(rep ? r->GetRepeatedBool(msg, f, index) : r->GetBool(msg, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumValueDescriptor* e =
          rep ? r->GetRepeatedEnum(msg, f, index) : r->GetEnum(msg, f);
      w.String(e->name().c_str(), e->name().size());
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      std::string s = rep ? r->GetRepeatedString(msg, f, index) : r->GetString(msg, f);
      w.String(s.c_str(), s.size());
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      WriteMessage(rep ? r->GetRepeatedMessage(msg, f, index) : r->GetMessage(msg, f), w);
      break;
  }
}

void WriteMessage(const pb::Message& msg, JsonWriter& w) {
  const pb::Descriptor* d = msg.GetDescriptor();
  const pb::Reflection* r = msg.GetReflection();
  w.StartObject();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    // A oneof prints only its chosen member; every other field prints even when default.
    if (f->containing_oneof() != nullptr && !f->containing_oneof()->is_synthetic() &&
        !r->HasField(msg, f)) {
      continue;
    }
    // Unset sub-messages are left out, as protobuf's JSON printer does.
    if (!f->is_repeated() && f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE &&
        !r->HasField(msg, f)) {
      continue;
    }
    w.Key(f->name().c_str(), f->name().size());
    if (f->is_map()) {
      w.StartObject();
      const pb::FieldDescriptor* key_f = f->message_type()->map_key();
      const pb::FieldDescriptor* val_f = f->message_type()->map_value();
      for (int j = 0; j < r->FieldSize(msg, f); ++j) {
        const pb::Message& entry = r->GetRepeatedMessage(msg, f, j);
        const pb::Reflection* er = entry.GetReflection();
        std::string key;
        switch (key_f->cpp_type()) {
          case pb::FieldDescriptor::CPPTYPE_STRING: key = er->GetString(entry, key_f); break;
          case pb::FieldDescriptor::CPPTYPE_INT32: key = inferd::StrCat(er->GetInt32(entry, key_f)); break;
          case pb::FieldDescriptor::CPPTYPE_INT64: key = inferd::StrCat(er->GetInt64(entry, key_f)); break;
          case pb::FieldDescriptor::CPPTYPE_UINT32: key = inferd::StrCat(er->GetUInt32(entry, key_f)); break;
          case pb::FieldDescriptor::CPPTYPE_UINT64: key = inferd::StrCat(er->GetUInt64(entry, key_f)); break;
          case pb::FieldDescriptor::CPPTYPE_BOOL: key = er->GetBool(entry, key_f) ? "true" : "false"; break;
          default: break;
        }
        w.Key(key.c_str(), key.size());
        WriteScalar(entry, val_f, -1, w);
      }
      w.EndObject();
    } else if (f->is_repeated()) {
      w.StartArray();
      for (int j = 0; j < r->FieldSize(msg, f); ++j) WriteScalar(msg, f, j, w);
      w.EndArray();
    } else {
      WriteScalar(msg, f, -1, w);
    }
  }
  w.EndObject();
}

struct PlatformBackend {
  std::string_view platform;
  std::string_view backend;
};
constexpr PlatformBackend kPlatforms[] = {
    {"onnxruntime_onnx", "onnxruntime"},
    {"pytorch_libtorch", "pytorch"},
    {"tensorflow_savedmodel", "tensorflow"},
    {"tensorflow_graphdef", "tensorflow"},
    {"tensorrt_plan", "tensorrt"},
};

absl::Status ValidateTensorDims(std::string_view model, std::string_view kind,
                                const std::string& name,
                                const google::protobuf::RepeatedField<int64_t>& dims,
                                bool has_reshape,
                                const google::protobuf::RepeatedField<int64_t>& reshape) {
  for (int64_t d : dims) {
    if (d < -1 || d == 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", model, "': ", kind, " '", name, "' dims must be positive or -1 (variable), got ",
          d));
    }
  }
  if (has_reshape) {
    bool dims_variable = false, reshape_variable = false;
    int64_t dims_count = 1, reshape_count = 1;
    for (int64_t d : dims) {
      if (d == -1) dims_variable = true; else dims_count *= d;
    }
    for (int64_t d : reshape) {
      if (d < -1 || d == 0) {
        return absl::InvalidArgumentError(inferd::StrCat("model '", model, "': ", kind, " '", name,
                                                       "' reshape dims must be positive or -1"));
      }
      if (d == -1) reshape_variable = true; else reshape_count *= d;
    }
    if (!dims_variable && !reshape_variable && dims_count != reshape_count) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", model, "': ", kind, " '", name, "' has ", dims_count,
          " elements in dims but ", reshape_count, " in reshape"));
    }
  }
  return absl::OkStatus();
}

// The defaults Triton core's NormalizeModelConfig writes into every config it loads, so that
// GET /v2/models/<m>/config (HTTP and gRPC) reports the same configuration as tritonserver:
// clients and tools compare it, or paste it back as a config.pbtxt. None of them changes how a
// model is served here: a preferred batch size equal to max_batch_size forms the batches no
// preferred size forms (scheduling/batch_policy.cc), the sequence batcher's idle default is the
// same 1 s, and pinned memory only stages GPU copies.
void FillTritonDefaults(ModelConfig* config) {
  if (config->has_dynamic_batching() &&
      config->dynamic_batching().preferred_batch_size_size() == 0 &&
      config->max_batch_size() > 0) {
    config->mutable_dynamic_batching()->add_preferred_batch_size(config->max_batch_size());
  }
  if (config->has_sequence_batching()) {
    auto* sb = config->mutable_sequence_batching();
    if (sb->max_sequence_idle_microseconds() == 0) {
      sb->set_max_sequence_idle_microseconds(kDefaultSequenceIdleMicroseconds);
    }
    if (sb->has_oldest() && sb->oldest().preferred_batch_size_size() == 0 &&
        config->max_batch_size() > 0) {
      sb->mutable_oldest()->add_preferred_batch_size(config->max_batch_size());
    }
  }
  if (config->platform() == "ensemble") {
    // Triton's ValidateEnsembleConfig writes whether a step is decoupled; inferd refuses
    // decoupled steps (repository/ensemble_validation.cc), so an ensemble never is.
    config->mutable_model_transaction_policy()->set_decoupled(false);
  } else {
    auto* optimization = config->mutable_optimization();
    if (!optimization->has_input_pinned_memory()) {
      optimization->mutable_input_pinned_memory()->set_enable(true);
    }
    if (!optimization->has_output_pinned_memory()) {
      optimization->mutable_output_pinned_memory()->set_enable(true);
    }
  }
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfigText(std::string_view text,
                                                 std::string_view file_name) {
  ModelConfig config;
  pb::TextFormat::Parser parser;
  CollectFirstError errors(file_name);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(
        errors.first().empty() ? inferd::StrCat(file_name, ": failed to parse") : errors.first());
  }
  return config;
}

absl::StatusOr<ModelConfig> ReadModelConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(inferd::StrCat("cannot open '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfigText(ss.str(), path);
}

absl::StatusOr<ModelConfig> ParseModelConfigJson(std::string_view json) {
  ModelConfig config;
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &config,
                                              options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        inferd::StrCat("invalid model configuration JSON: ", status.ToString()));
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& config) {
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  WriteMessage(config, w);
  return std::string(buf.GetString(), buf.GetSize());
}

DataType FromProto(inference::DataType type) {
  switch (type) {
    case inference::TYPE_BOOL: return DataType::kBool;
    case inference::TYPE_UINT8: return DataType::kUint8;
    case inference::TYPE_UINT16: return DataType::kUint16;
    case inference::TYPE_UINT32: return DataType::kUint32;
    case inference::TYPE_UINT64: return DataType::kUint64;
    case inference::TYPE_INT8: return DataType::kInt8;
    case inference::TYPE_INT16: return DataType::kInt16;
    case inference::TYPE_INT32: return DataType::kInt32;
    case inference::TYPE_INT64: return DataType::kInt64;
    case inference::TYPE_FP16: return DataType::kFp16;
    case inference::TYPE_FP32: return DataType::kFp32;
    case inference::TYPE_FP64: return DataType::kFp64;
    case inference::TYPE_STRING: return DataType::kBytes;
    case inference::TYPE_BF16: return DataType::kBf16;
    default: return DataType::kInvalid;
  }
}

inference::DataType ToProto(DataType type) {
  switch (type) {
    case DataType::kBool: return inference::TYPE_BOOL;
    case DataType::kUint8: return inference::TYPE_UINT8;
    case DataType::kUint16: return inference::TYPE_UINT16;
    case DataType::kUint32: return inference::TYPE_UINT32;
    case DataType::kUint64: return inference::TYPE_UINT64;
    case DataType::kInt8: return inference::TYPE_INT8;
    case DataType::kInt16: return inference::TYPE_INT16;
    case DataType::kInt32: return inference::TYPE_INT32;
    case DataType::kInt64: return inference::TYPE_INT64;
    case DataType::kFp16: return inference::TYPE_FP16;
    case DataType::kFp32: return inference::TYPE_FP32;
    case DataType::kFp64: return inference::TYPE_FP64;
    case DataType::kBytes: return inference::TYPE_STRING;
    case DataType::kBf16: return inference::TYPE_BF16;
    default: return inference::TYPE_INVALID;
  }
}

std::string ProtoTypeName(inference::DataType type) { return inference::DataType_Name(type); }

absl::Status NormalizePlatformAndBackend(ModelConfig* config) {
  if (config->platform() == "ensemble") {
    return absl::OkStatus();
  }
  for (const auto& pb : kPlatforms) {
    if (config->platform() == pb.platform) {
      if (config->backend().empty()) config->set_backend(std::string(pb.backend));
      if (config->backend() != pb.backend) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", config->name(), "': platform '", config->platform(),
            "' does not match backend '", config->backend(), "'"));
      }
      return absl::OkStatus();
    }
  }
  if (!config->platform().empty()) {
    return absl::InvalidArgumentError(inferd::StrCat("model '", config->name(),
                                                   "': unknown platform '", config->platform(),
                                                   "'"));
  }
  if (config->backend() == "onnxruntime") config->set_platform("onnxruntime_onnx");
  if (config->backend() == "pytorch") {
    config->set_platform("pytorch_libtorch");
    // Triton's AutoCompleteBackendFields names the file only for a config that gave the
    // backend and no platform (one that gave the platform, or neither, keeps it empty, and
    // the backend opens model.pt): what the config reads back says the same.
    if (config->default_model_filename().empty()) config->set_default_model_filename("model.pt");
  }
  return absl::OkStatus();
}

std::string ModelFilename(const ModelConfig& config) {
  if (!config.default_model_filename().empty()) return config.default_model_filename();
  if (config.platform() == "onnxruntime_onnx" || config.backend() == "onnxruntime") {
    return "model.onnx";
  }
  if (config.platform() == "pytorch_libtorch" || config.backend() == "pytorch") return "model.pt";
  if (config.backend() == "python") return "model.py";
  return {};
}

absl::Status BackendFromModelName(std::string_view model_name, ModelConfig* config) {
  const size_t dot = model_name.find('.');
  if (dot == std::string_view::npos || dot + 1 == model_name.size()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", model_name, "': cannot tell which backend serves it: config.pbtxt sets "
        "neither 'backend' nor 'platform', no version folder holds model.onnx, model.pt or "
        "model.py, and the model name is not of the form '<model>.<backend>'"));
  }
  const std::string backend(model_name.substr(dot + 1));
  config->set_backend(backend);
  config->set_default_model_filename(inferd::StrCat("model.", backend));
  return absl::OkStatus();
}

absl::Status NormalizeAndValidate(ModelConfig* config, std::string_view model_name) {
  if (config->name().empty()) config->set_name(std::string(model_name));
  if (config->name() != model_name) {
    return absl::InvalidArgumentError(inferd::StrCat("model '", model_name,
                                                   "': config.pbtxt field 'name' is '",
                                                   config->name(), "'; it must match the directory name"));
  }
  // Before any default is filled in: the refusals name what the user wrote.
  std::vector<std::string> warnings;
  RETURN_IF_ERROR(CheckFieldsSupported(*config, model_name, &warnings));
  for (const auto& w : warnings) LOG_WARNING << w;
  RETURN_IF_ERROR(NormalizePlatformAndBackend(config));
  if (config->backend().empty() && config->platform() != "ensemble") {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", model_name, "': config.pbtxt must set 'platform' or 'backend'"));
  }
  if (config->model_transaction_policy().decoupled() && config->response_cache().enable()) {
    // As Triton: one cached response cannot stand for a stream of them.
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", model_name, "': response_cache does not support decoupled models "
        "(model_transaction_policy { decoupled: true })"));
  }
  // Triton's ValidateModelMetrics.
  for (const auto& control : config->model_metrics().metric_control()) {
    const char* missing = nullptr;
    if (!control.has_metric_identifier()) {
      missing = "metric_control must specify 'metric_identifier'";
    } else if (control.metric_identifier().family().empty()) {
      missing = "metric_identifier must specify a non-empty 'family'";
    } else if (!control.has_histogram_options()) {
      missing = "metric_control must specify 'histogram_options'";
    } else if (control.histogram_options().buckets_size() == 0) {
      missing = "histogram_options must specify non-empty 'buckets'";
    }
    if (missing != nullptr) {
      return absl::InvalidArgumentError(
          inferd::StrCat("model '", model_name, "': model_metrics: ", missing));
    }
  }
  if (config->max_batch_size() < 0) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", model_name, "': field 'max_batch_size' must be >= 0, got ",
        config->max_batch_size()));
  }
  // The checks an input and an output share (ModelInput / ModelOutput); `kind` is "input" or
  // "output". `names` holds the names of that kind seen so far.
  absl::flat_hash_set<std::string> names;
  auto check_tensor = [&](std::string_view kind, const auto& t) -> absl::Status {
    if (t.name().empty()) {
      return absl::InvalidArgumentError(
          inferd::StrCat("model '", model_name, "': an ", kind, " has no name"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(inferd::StrCat("model '", model_name, "': ", kind, " '",
                                                       t.name(), "' is declared twice"));
    }
    if (t.data_type() == inference::TYPE_INVALID) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", model_name, "': ", kind, " '", t.name(), "' must set 'data_type'"));
    }
    return ValidateTensorDims(model_name, kind, t.name(), t.dims(), t.has_reshape(),
                              t.reshape().shape());
  };
  for (const auto& in : config->input()) {
    RETURN_IF_ERROR(check_tensor("input", in));
    // Triton's rule: an image layout names three dimensions.
    if ((in.format() == inference::ModelInput::FORMAT_NHWC ||
         in.format() == inference::ModelInput::FORMAT_NCHW) &&
        in.dims_size() != 3) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", model_name, "': input '", in.name(), "' has format ",
          inference::ModelInput::Format_Name(in.format()), ", which needs 3 dims, got ",
          in.dims_size()));
    }
  }
  names.clear();
  for (const auto& out : config->output()) {
    RETURN_IF_ERROR(check_tensor("output", out));
  }
  if (config->platform() != "ensemble") {
    // Triton's NormalizeInstanceGroup: no group is one KIND_AUTO group named after the model.
    // Its kind and a count below 1 are resolved where the host's GPUs and the backend are known
    // (repository::ResolveInstanceGroups / PlaceInstances: Triton's default count).
    if (config->instance_group_size() == 0) {
      auto* group = config->add_instance_group();
      group->set_name(config->name());
      group->set_kind(inference::ModelInstanceGroup::KIND_AUTO);
    }
    for (int i = 0; i < config->instance_group_size(); ++i) {
      auto* group = config->mutable_instance_group(i);
      if (group->name().empty()) group->set_name(inferd::StrCat(model_name, "_", i));
    }
  }
  if (!config->has_version_policy()) {
    config->mutable_version_policy()->mutable_latest()->set_num_versions(1);
  }
  FillTritonDefaults(config);
  if (config->version_policy().has_latest() &&
      config->version_policy().latest().num_versions() == 0) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", model_name, "': version_policy.latest.num_versions must be >= 1"));
  }
  if (config->has_dynamic_batching()) {
    if (config->max_batch_size() == 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", model_name,
          "': dynamic_batching requires max_batch_size >= 1 (the model must support batching)"));
    }
    const auto& db = config->dynamic_batching();
    if (db.priority_levels() > 0 &&
        (db.default_priority_level() < 1 || db.default_priority_level() > db.priority_levels())) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", model_name, "': dynamic_batching.default_priority_level must be between 1 and priority_levels (",
          db.priority_levels(), "), got ", db.default_priority_level()));
    }
    for (const auto& [level, policy] : db.priority_queue_policy()) {
      if (level < 1 || level > db.priority_levels()) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", model_name, "': dynamic_batching.priority_queue_policy has level ", level,
            ", outside 1..priority_levels (", db.priority_levels(), ")"));
      }
    }
    if (db.preserve_ordering()) {
      // Triton's rules: responses in arrival order cannot also let a higher priority, or a
      // delayed request, overtake.
      if (db.priority_levels() > 1) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", model_name, "': dynamic_batching.preserve_ordering allows only one "
            "priority level, got priority_levels ", db.priority_levels()));
      }
      auto delays = [](const inference::ModelQueuePolicy& p) {
        return p.default_timeout_microseconds() != 0 &&
               p.timeout_action() == inference::ModelQueuePolicy::DELAY;
      };
      bool any_delay = delays(db.default_queue_policy());
      for (const auto& [level, policy] : db.priority_queue_policy()) any_delay |= delays(policy);
      if (any_delay) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", model_name, "': dynamic_batching.preserve_ordering cannot be combined "
            "with a queue policy whose timeout_action is DELAY"));
      }
    }
    for (int32_t size : config->dynamic_batching().preferred_batch_size()) {
      if (size < 1 || size > config->max_batch_size()) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", model_name, "': dynamic_batching.preferred_batch_size ", size,
            " must be between 1 and max_batch_size ", config->max_batch_size()));
      }
    }
  }
  if (config->default_model_filename().empty()) {
    if (config->platform() == "onnxruntime_onnx") config->set_default_model_filename("model.onnx");
    if (config->backend() == "python") config->set_default_model_filename("model.py");
  }
  return absl::OkStatus();
}

std::string ModelConfigPath(const std::string& model_dir, std::string_view config_name) {
  if (!config_name.empty()) {
    std::string custom = inferd::StrCat(model_dir, "/configs/", config_name, ".pbtxt");
    std::error_code ec;
    if (std::filesystem::is_regular_file(custom, ec)) return custom;
  }
  return inferd::StrCat(model_dir, "/config.pbtxt");
}

std::optional<std::string> GetParameter(const ModelConfig& config, std::string_view key) {
  auto it = config.parameters().find(std::string(key));
  if (it == config.parameters().end()) return std::nullopt;
  return it->second.string_value();
}

}  // namespace inferd::config
