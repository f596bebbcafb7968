// Nothing in a config.pbtxt is silently ignored: every field of model_config.proto, set to a
// non-default value, is either accepted (config/supported_fields.cc says inferd implements it, or
// that it has no effect on a CPU server as in Triton) or refused with a message naming it. The
// walk covers every field to a depth bound, so a field added to the schema is checked the day it
// is added; the lists below pin the audit (what is implemented, what is refused) so that editing
// the table is a visible decision.
#include <functional>
#include <string>
#include <vector>

#include "config/model_config_util.h"
#include "config/supported_fields.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"

namespace inferd::config {
namespace {

namespace pb = google::protobuf;
using ::testing::HasSubstr;

constexpr int kMaxDepth = 8;

ModelConfig Parse(const std::string& text) {
  auto cfg = ParseModelConfigText(text, "config.pbtxt");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : ModelConfig();
}

ModelConfig BackendModel() {
  return Parse(R"pb(
    name: "m" backend: "identity" max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ])pb");
}

ModelConfig Ensemble() {
  return Parse(R"pb(
    name: "e" platform: "ensemble" max_batch_size: 8
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
    ensemble_scheduling { step [ { model_name: "m" input_map { key: "INPUT0" value: "IN" }
                                   output_map { key: "OUTPUT0" value: "OUT" } } ] })pb");
}

// One field to set: the chain of fields from ModelConfig down to it. After a map field comes a
// field of the map's value message.
using Chain = std::vector<const pb::FieldDescriptor*>;

std::string PathOf(const Chain& chain) {
  std::string path;
  for (const auto* f : chain) path += (path.empty() ? "" : ".") + f->name();
  return path;
}

const pb::Descriptor* Inner(const pb::FieldDescriptor* f) {
  if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) return nullptr;
  if (!f->is_map()) return f->message_type();
  const pb::FieldDescriptor* value = f->message_type()->map_value();
  return value->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE ? value->message_type()
                                                                   : nullptr;
}

// Every field, and every message field on the way (set empty, a message is a case too).
void CollectChains(const pb::Descriptor* d, Chain& chain, std::vector<Chain>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    chain.push_back(d->field(i));
    out->push_back(chain);
    if (const pb::Descriptor* inner = Inner(d->field(i));
        inner != nullptr && chain.size() < kMaxDepth) {
      CollectChains(inner, chain, out);
    }
    chain.pop_back();
  }
}

std::vector<Chain> AllChains() {
  std::vector<Chain> chains;
  Chain chain;
  CollectChains(ModelConfig::descriptor(), chain, &chains);
  return chains;
}

void SetMapKey(pb::Message* entry) {
  const pb::FieldDescriptor* key = entry->GetDescriptor()->map_key();
  const pb::Reflection* r = entry->GetReflection();
  switch (key->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING: r->SetString(entry, key, "k"); break;
    case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(entry, key, 1); break;
    case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(entry, key, 1); break;
    case pb::FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(entry, key, 1); break;
    case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(entry, key, 1); break;
    default: FAIL() << "map key type of " << entry->GetDescriptor()->full_name();
  }
}

// The message field `f` of `msg` leads to: a new element, a new map entry's value, or the
// sub-message itself.
pb::Message* Descend(pb::Message* msg, const pb::FieldDescriptor* f) {
  const pb::Reflection* r = msg->GetReflection();
  if (f->is_map()) {
    pb::Message* entry = r->AddMessage(msg, f);
    SetMapKey(entry);
    const pb::FieldDescriptor* value = f->message_type()->map_value();
    return entry->GetReflection()->MutableMessage(entry, value);
  }
  return f->is_repeated() ? r->AddMessage(msg, f) : r->MutableMessage(msg, f);
}

// Sets the last field of the chain to a non-default value (`enum_value` for an enum).
void SetLeaf(pb::Message* msg, const pb::FieldDescriptor* f,
             const pb::EnumValueDescriptor* enum_value) {
  const pb::Reflection* r = msg->GetReflection();
  if (f->is_map()) {
    pb::Message* entry = r->AddMessage(msg, f);
    SetMapKey(entry);
    const pb::FieldDescriptor* value = f->message_type()->map_value();
    if (value->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
      entry->GetReflection()->SetString(entry, value, "v");
    }
    return;
  }
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_MESSAGE: Descend(msg, f); break;
    case pb::FieldDescriptor::CPPTYPE_INT32:
      rep ? r->AddInt32(msg, f, 1) : r->SetInt32(msg, f, 1); break;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      rep ? r->AddInt64(msg, f, 1) : r->SetInt64(msg, f, 1); break;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      rep ? r->AddUInt32(msg, f, 1) : r->SetUInt32(msg, f, 1); break;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      rep ? r->AddUInt64(msg, f, 1) : r->SetUInt64(msg, f, 1); break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      rep ? r->AddFloat(msg, f, 0.5f) : r->SetFloat(msg, f, 0.5f); break;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      rep ? r->AddDouble(msg, f, 0.5) : r->SetDouble(msg, f, 0.5); break;
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      rep ? r->AddBool(msg, f, true) : r->SetBool(msg, f, true); break;
    case pb::FieldDescriptor::CPPTYPE_STRING:
      rep ? r->AddString(msg, f, "x") : r->SetString(msg, f, "x"); break;
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      rep ? r->AddEnum(msg, f, enum_value) : r->SetEnum(msg, f, enum_value); break;
  }
}

ModelConfig WithField(ModelConfig base, const Chain& chain,
                      const pb::EnumValueDescriptor* enum_value) {
  pb::Message* msg = &base;
  for (size_t i = 0; i + 1 < chain.size(); ++i) msg = Descend(msg, chain[i]);
  SetLeaf(msg, chain.back(), enum_value);
  return base;
}

// The non-default values to try: each enum value but the first, one value otherwise.
std::vector<const pb::EnumValueDescriptor*> ValuesToTry(const pb::FieldDescriptor* f) {
  if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_ENUM || f->is_map()) return {nullptr};
  std::vector<const pb::EnumValueDescriptor*> values;
  for (int i = 1; i < f->enum_type()->value_count(); ++i) values.push_back(f->enum_type()->value(i));
  return values;
}

// What the walk does with `path` set to `enum_value`, in a backend model or an ensemble:
// accepted, or refused naming the field (or the refused message holding it).
struct Outcome {
  bool accepted;
  std::string message;
};

Outcome Check(const std::string& path, bool ensemble, std::string_view enum_value = {}) {
  for (const Chain& chain : AllChains()) {
    if (PathOf(chain) != path) continue;
    const pb::EnumValueDescriptor* value = ValuesToTry(chain.back()).front();
    if (!enum_value.empty()) value = chain.back()->enum_type()->FindValueByName(std::string(enum_value));
    ModelConfig cfg = WithField(ensemble ? Ensemble() : BackendModel(), chain, value);
    absl::Status st = CheckFieldsSupported(cfg, cfg.name());
    return {st.ok(), std::string(st.message())};
  }
  ADD_FAILURE() << "no field '" << path << "' in model_config.proto";
  return {false, ""};
}

TEST(ConfigCoverageTest, TheBaseConfigsAreAccepted) {
  EXPECT_TRUE(CheckFieldsSupported(BackendModel(), "m").ok());
  EXPECT_TRUE(CheckFieldsSupported(Ensemble(), "e").ok());
}

// The heart of it: every field of the schema, in both kinds of model.
TEST(ConfigCoverageTest, EveryFieldIsAcceptedOrRefusedByName) {
  const std::vector<Chain> chains = AllChains();
  ASSERT_GT(chains.size(), 150u) << "the walk lost most of the schema";
  int accepted = 0, refused = 0;
  for (const Chain& chain : chains) {
    const std::string path = PathOf(chain);
    for (const pb::EnumValueDescriptor* value : ValuesToTry(chain.back())) {
      for (bool ensemble : {false, true}) {
        // `platform` decides which kind of model it is; any other value ends the ensemble.
        if (ensemble && path == "platform") continue;
        SCOPED_TRACE(path + (value ? " = " + value->name() : "") +
                     (ensemble ? " (ensemble)" : " (backend model)"));
        ModelConfig cfg = WithField(ensemble ? Ensemble() : BackendModel(), chain, value);
        const absl::Status st = CheckFieldsSupported(cfg, cfg.name());
        const FieldClass c =
            ClassifyConfigField(path, ensemble, value ? value->name() : std::string_view());
        if (c.verdict != FieldVerdict::kRefused) {
          EXPECT_TRUE(st.ok()) << "the table accepts it, the walk refused it: " << st;
          ++accepted;
          continue;
        }
        ++refused;
        ASSERT_FALSE(st.ok()) << "neither implemented nor refused: it would be ignored";
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(st.message(), HasSubstr("config.pbtxt field '" + std::string(c.path) + "'"));
        EXPECT_THAT(st.message(), HasSubstr("is not supported by inferd"));
        EXPECT_EQ(path.rfind(c.path, 0), 0u) << c.path << " does not hold " << path;
        if (value != nullptr && c.path == path) EXPECT_THAT(st.message(), HasSubstr(value->name()));
      }
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

TEST(ConfigCoverageTest, EveryTablePathIsInTheSchema) {
  const std::vector<Chain> chains = AllChains();
  for (std::string_view path : ConfigFieldTablePaths()) {
    bool found = false;
    for (const Chain& chain : chains) found = found || PathOf(chain) == path;
    EXPECT_TRUE(found) << "table entry '" << path << "' names no field of model_config.proto";
  }
}

// What inferd implements (checked against the code that reads each field): none is refused.
TEST(ConfigCoverageTest, ImplementedFieldsAreAccepted) {
  for (const char* path :
       {"name", "platform", "backend", "max_batch_size", "version_policy.latest.num_versions",
        "version_policy.all", "version_policy.specific.versions", "input.name",
        "input.data_type", "input.dims", "input.format", "input.reshape.shape",
        "input.allow_ragged_batch", "input.optional", "output.name", "output.data_type",
        "output.dims", "output.reshape.shape", "output.label_filename",
        "optimization.graph.level", "dynamic_batching", "dynamic_batching.preferred_batch_size",
        "dynamic_batching.max_queue_delay_microseconds", "dynamic_batching.preserve_ordering",
        "dynamic_batching.priority_levels", "dynamic_batching.default_priority_level",
        "dynamic_batching.default_queue_policy.timeout_action",
        "dynamic_batching.default_queue_policy.default_timeout_microseconds",
        "dynamic_batching.default_queue_policy.allow_timeout_override",
        "dynamic_batching.default_queue_policy.max_queue_size",
        "dynamic_batching.priority_queue_policy.max_queue_size", "instance_group.name",
        "instance_group.count", "default_model_filename", "parameters",
        "model_warmup.name", "model_warmup.batch_size", "model_warmup.count",
        "model_warmup.inputs.dims", "model_warmup.inputs.data_type",
        "model_warmup.inputs.zero_data", "model_warmup.inputs.random_data",
        "model_warmup.inputs.input_data_file", "model_transaction_policy", "response_cache",
        "sequence_batching", "sequence_batching.max_sequence_idle_microseconds",
        "sequence_batching.control_input.control.kind",
        "sequence_batching.control_input.control.data_type",
        "sequence_batching.state.initial_state.data_file",
        "sequence_batching.oldest.max_candidate_sequences",
        "sequence_batching.direct.minimum_slot_utilization"}) {
    SCOPED_TRACE(path);
    EXPECT_TRUE(Check(path, /*ensemble=*/false).accepted) << Check(path, false).message;
  }
  for (const char* kind : {"KIND_CPU"}) {
    EXPECT_TRUE(Check("instance_group.kind", false, kind).accepted);
  }
  for (const char* path :
       {"ensemble_scheduling.step.model_name", "ensemble_scheduling.step.model_version",
        "ensemble_scheduling.step.input_map", "ensemble_scheduling.step.output_map",
        "ensemble_scheduling.max_inflight_requests", "output.label_filename",
        "version_policy.specific.versions"}) {
    SCOPED_TRACE(path);
    EXPECT_TRUE(Check(path, /*ensemble=*/true).accepted) << Check(path, true).message;
  }
}

// Accepted because they do nothing in Triton either on a CPU-only server (GPU and TensorRT
// settings), several of which Triton's auto-complete writes into every config.
TEST(ConfigCoverageTest, SettingsWithoutEffectOnACpuServerAreAccepted) {
  for (const char* path :
       {"optimization.input_pinned_memory.enable", "optimization.output_pinned_memory.enable",
        "optimization.cuda.graphs", "optimization.cuda.graph_spec.graph_lower_bound.input.dim",
        "optimization.gather_kernel_buffer_threshold", "optimization.eager_batching",
        "optimization.execution_accelerators.gpu_execution_accelerator.name",
        "optimization.execution_accelerators.gpu_execution_accelerator.parameters",
        "cc_model_filenames"}) {
    SCOPED_TRACE(path);
    EXPECT_TRUE(Check(path, false).accepted) << Check(path, false).message;
    EXPECT_EQ(ClassifyConfigField(path, false).verdict, FieldVerdict::kNoEffect);
  }
  EXPECT_TRUE(Check("optimization.priority", false, "PRIORITY_MAX").accepted);
}

// Issue 26: fields Triton accepts whose absence here changes no answer load, with one WARNING
// line each naming the field.
TEST(ConfigCoverageTest, FieldsThatChangeNoAnswerLoadWithAWarning) {
  for (const auto& [path, named] : std::vector<std::pair<std::string, std::string>>{
           {"sequence_batching.oldest.preserve_ordering", "sequence_batching.oldest.preserve_ordering"},
           {"instance_group.rate_limiter.priority", "instance_group.rate_limiter"},
           {"metric_tags", "metric_tags"},
           {"model_operations.op_library_filename", "model_operations"},
           {"runtime", "runtime"},
           {"instance_group.passive", "instance_group.passive"},
           {"instance_group.host_policy", "instance_group.host_policy"},
           {"instance_group.profile", "instance_group.profile"}}) {
    SCOPED_TRACE(path);
    EXPECT_TRUE(Check(path, false).accepted) << Check(path, false).message;
    EXPECT_EQ(ClassifyConfigField(path, false).verdict, FieldVerdict::kWarned);
    for (const Chain& chain : AllChains()) {
      if (PathOf(chain) != path) continue;
      ModelConfig cfg = WithField(BackendModel(), chain, ValuesToTry(chain.back()).front());
      std::vector<std::string> warnings;
      ASSERT_TRUE(CheckFieldsSupported(cfg, cfg.name(), &warnings).ok());
      ASSERT_EQ(warnings.size(), 1u);
      EXPECT_THAT(warnings[0], HasSubstr("model 'm': config.pbtxt field '" + named +
                                         "' has no effect in inferd ("));
    }
  }
  EXPECT_TRUE(Check("parameters", /*ensemble=*/true).accepted);
  EXPECT_TRUE(Check("optimization.execution_accelerators.cpu_execution_accelerator.name", false).accepted);
}

// Parsed and then ignored before issue 16: each is refused by name now.
TEST(ConfigCoverageTest, UnimplementedFieldsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"sequence_batching.iterative_sequence", "sequence_batching.iterative_sequence"},
      {"batch_input.kind", "batch_input"},
      {"batch_output.target_name", "batch_output"},
      {"model_repository_agents.agents.name", "model_repository_agents"},
      {"input.is_shape_tensor", "input.is_shape_tensor"},
      {"output.is_non_linear_format_io", "output.is_non_linear_format_io"},
      {"instance_group.secondary_devices.device_id", "instance_group.secondary_devices"},
      {"ensemble_scheduling", "ensemble_scheduling"},  // in a backend model
  };
  for (const auto& [path, named] : refused) {
    SCOPED_TRACE(path);
    Outcome o = Check(path, false);
    EXPECT_FALSE(o.accepted);
    EXPECT_THAT(o.message, HasSubstr("model 'm': config.pbtxt field '" + named +
                                     "' is not supported by inferd ("));
  }
  for (const char* kind : {"KIND_MODEL"}) {
    Outcome o = Check("instance_group.kind", false, kind);
    EXPECT_FALSE(o.accepted);
    EXPECT_THAT(o.message, HasSubstr(std::string("config.pbtxt field 'instance_group.kind' value ") +
                                     kind + " is not supported by inferd"));
  }
  // As Triton does: an ensemble has no instances, optimization, warmup or backend.
  // (`parameters` loads with a WARNING since issue 26: FieldsThatChangeNoAnswerLoadWithAWarning.)
  for (const char* path : {"instance_group", "optimization.graph.level", "model_warmup.name",
                           "input.reshape",
                           "ensemble_scheduling.step.model_namespace", "dynamic_batching"}) {
    SCOPED_TRACE(path);
    Outcome o = Check(path, true);
    EXPECT_FALSE(o.accepted);
    EXPECT_THAT(o.message, HasSubstr("model 'e': config.pbtxt field '"));
  }
  // An optional ensemble input is Triton's too (qa/L0_optional_input): the steps run without it.
  Outcome optional = Check("input.optional", true);
  EXPECT_TRUE(optional.accepted) << optional.message;
}

TEST(ConfigCoverageTest, RefusalMessageSaysWhatToDo) {
  ModelConfig cfg = BackendModel();
  cfg.mutable_sequence_batching()->set_iterative_sequence(true);
  absl::Status st = NormalizeAndValidate(&cfg, "m");
  EXPECT_EQ(st.message(),
            "model 'm': config.pbtxt field 'sequence_batching.iterative_sequence' is not "
            "supported by inferd (iterative sequences (decoupled request rescheduling) are not "
            "implemented; it would be ignored; remove it or use a server that supports it)");
  // Every refused field is named, once.
  cfg = Parse(R"pb(
    name: "m" backend: "identity"
    instance_group [ { kind: KIND_MODEL }, { kind: KIND_MODEL count: 2 } ]
    batch_input [ { kind: BATCH_ELEMENT_COUNT } ])pb");
  st = NormalizeAndValidate(&cfg, "m");
  EXPECT_THAT(st.message(), HasSubstr("field 'instance_group.kind' value KIND_MODEL"));
  EXPECT_THAT(st.message(), HasSubstr("field 'batch_input'"));
  EXPECT_EQ(st.message().find("KIND_MODEL is"), st.message().rfind("KIND_MODEL is"));
}

// The false values say what inferd does anyway; an unset field is not "set".
TEST(ConfigCoverageTest, DefaultValuesAreNotRefused) {
  ModelConfig cfg = Parse(R"pb(
    name: "m" backend: "identity" max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] is_shape_tensor: false } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    model_transaction_policy { decoupled: false }
    response_cache { enable: false }
    dynamic_batching {})pb");
  EXPECT_TRUE(NormalizeAndValidate(&cfg, "m").ok());
}

// A config copied from tritonserver's GET /v2/models/<m>/config for an auto-completed ONNX model
// on a CPU machine: every field printed, defaults included.
TEST(ConfigCoverageTest, ConfigCopiedFromTritonLoads) {
  auto cfg = ParseModelConfigJson(R"({
    "name": "densenet_onnx", "platform": "onnxruntime_onnx", "backend": "onnxruntime",
    "runtime": "", "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 4,
    "input": [{"name": "data_0", "data_type": "TYPE_FP32", "format": "FORMAT_NONE",
               "dims": [3, 224, 224], "is_shape_tensor": false, "allow_ragged_batch": false,
               "optional": false, "is_non_linear_format_io": false}],
    "output": [{"name": "fc6_1", "data_type": "TYPE_FP32", "dims": [1000, 1, 1],
                "label_filename": "", "is_shape_tensor": false, "is_non_linear_format_io": false}],
    "batch_input": [], "batch_output": [],
    "optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": true},
                     "output_pinned_memory": {"enable": true},
                     "gather_kernel_buffer_threshold": 0, "eager_batching": false},
    "dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay_microseconds": 0,
                         "preserve_ordering": false, "priority_levels": 0,
                         "default_priority_level": 0, "priority_queue_policy": {}},
    "instance_group": [{"name": "densenet_onnx", "kind": "KIND_CPU", "count": 2, "gpus": [],
                        "secondary_devices": [], "profile": [], "passive": false,
                        "host_policy": ""}],
    "default_model_filename": "model.onnx", "cc_model_filenames": {}, "metric_tags": {},
    "parameters": {}, "model_warmup": []})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(NormalizeAndValidate(&*cfg, "densenet_onnx").ok())
      << NormalizeAndValidate(&*cfg, "densenet_onnx");
}

}  // namespace
}  // namespace inferd::config
