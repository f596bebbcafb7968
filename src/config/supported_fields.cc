#include "config/supported_fields.h"

#include <algorithm>

#include "common/strings.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace inferd::config {
namespace {

namespace pb = google::protobuf;

// Which models a rule speaks for. A field with a rule for one scope only is refused in the
// other (e.g. `instance_group` in an ensemble, `ensemble_scheduling` in a backend model).
enum class Scope { kAny, kBackendModel, kEnsemble };

struct FieldRule {
  std::string_view path;
  FieldVerdict verdict;
  Scope scope = Scope::kAny;
  // The whole sub-message takes this verdict without its fields being looked at (for messages
  // that have no effect here whatever they hold, and for `parameters`, whose keys the backend
  // checks).
  bool subtree = false;
  std::string_view why = {};
};

constexpr FieldVerdict kYes = FieldVerdict::kImplemented;
constexpr FieldVerdict kNoEffect = FieldVerdict::kNoEffect;
constexpr FieldVerdict kNo = FieldVerdict::kRefused;
constexpr FieldVerdict kWarn = FieldVerdict::kWarned;
constexpr Scope kAny = Scope::kAny;
constexpr Scope kModel = Scope::kBackendModel;
constexpr Scope kEnsemble = Scope::kEnsemble;

// Every field of model_config.proto that inferd implements or accepts, audited against the code
// that reads it. A field set in a config and missing here is refused; the refused entries are
// listed only to give a better reason than the generic one. Keep in step with
// model_config.proto: tests/unit/config_coverage_test.cc walks the schema against this table.
constexpr FieldRule kRules[] = {
    {"name", kYes},
    {"platform", kYes},
    {"backend", kYes, kModel},
    // Issue 26's rule: never refuse what Triton accepts unless serving it would compute a wrong
    // answer; a field that only changes how (not what) is served loads with one WARNING (kWarn).
    {"runtime", kWarn, kAny, false,
     "it names a backend runtime library to load; inferd's backends are built in and 'backend' "
     "chooses one"},
    {"version_policy", kYes},
    {"version_policy.latest", kYes},
    {"version_policy.latest.num_versions", kYes},
    {"version_policy.all", kYes},
    {"version_policy.specific", kYes},
    {"version_policy.specific.versions", kYes},
    {"max_batch_size", kYes},

    {"input", kYes},
    {"input.name", kYes},
    {"input.data_type", kYes},
    // Metadata for clients (Triton checks only that NHWC/NCHW inputs have 3 dims, as
    // NormalizeAndValidate does); no backend reads it.
    {"input.format", kYes},
    {"input.dims", kYes},
    // Applied by the backend: backends::CheckConfigSupport refuses it where a backend does not.
    {"input.reshape", kYes, kModel},
    {"input.reshape.shape", kYes, kModel},
    {"input.is_shape_tensor", kNo, kAny, false, "shape tensors are a TensorRT feature"},
    // Model::Load refuses it for a backend that cannot take ragged batches.
    {"input.allow_ragged_batch", kYes, kModel},
    {"input.allow_ragged_batch", kNoEffect, kEnsemble, false,
     "an ensemble forms no batches; its composing models' own setting decides"},
    // In an ensemble: a request may leave the input out, and the steps it maps to then run
    // without it (scheduling/ensemble_scheduler.cc), as in Triton; such a step's model input
    // must be optional too, or that step fails naming the input.
    {"input.optional", kYes},
    {"input.is_non_linear_format_io", kNo, kAny, false, "non-linear I/O formats are a TensorRT feature"},

    {"output", kYes},
    {"output.name", kYes},
    {"output.data_type", kYes},
    {"output.dims", kYes},
    {"output.reshape", kYes, kModel},
    {"output.reshape.shape", kYes, kModel},
    {"output.label_filename", kYes},
    {"output.is_shape_tensor", kNo, kAny, false, "shape tensors are a TensorRT feature"},
    {"output.is_non_linear_format_io", kNo, kAny, false, "non-linear I/O formats are a TensorRT feature"},

    {"batch_input", kNo, kAny, false, "batch inputs (tensors derived from a whole batch) are not implemented"},
    {"batch_output", kNo, kAny, false, "batch outputs (a tensor scattered over a batch) are not implemented"},

    // Triton refuses `optimization` in an ensemble too.
    {"optimization", kYes, kModel},
    // Read by the onnxruntime backend (session_settings.cc); Triton's PyTorch backend ignores it
    // as inferd's does.
    {"optimization.graph", kYes, kModel},
    {"optimization.graph.level", kYes, kModel},
    // The CUDA stream priority of Triton's GPU backends.
    {"optimization.priority", kNoEffect, kModel, false, "a CUDA stream priority"},
    {"optimization.cuda", kNoEffect, kModel, true,
     "CUDA graphs and streams of GPU instances; only the onnxruntime backend's GPU instances "
     "read one key, cuda.graphs"},
    {"optimization.execution_accelerators", kYes, kModel},
    // Triton's onnxruntime backend adds GPU execution providers to GPU instances only; the
    // onnxruntime backend here logs them as not applying.
    {"optimization.execution_accelerators.gpu_execution_accelerator", kNoEffect, kModel, true,
     "GPU execution providers apply only to GPU instances"},
    // The onnxruntime backend warns that OpenVINO is not in this build (ONNX Runtime's CPU
    // provider computes the same results) and refuses a name Triton refuses.
    {"optimization.execution_accelerators.cpu_execution_accelerator", kYes, kModel, true},
    // Pinned host memory stages copies to and from a GPU. Triton's auto-complete writes
    // `enable: true` for both, so configs copied from its /config endpoint carry them.
    {"optimization.input_pinned_memory", kNoEffect, kModel, true,
     "pinned memory only stages GPU copies"},
    {"optimization.output_pinned_memory", kNoEffect, kModel, true,
     "pinned memory only stages GPU copies"},
    // Read only by Triton's TensorRT backend.
    {"optimization.gather_kernel_buffer_threshold", kNoEffect, kModel, false,
     "a GPU gather kernel of the TensorRT backend"},
    {"optimization.eager_batching", kNoEffect, kModel, false, "read only by the TensorRT backend"},

    // scheduling/dynamic_batcher.cc implements every field.
    {"dynamic_batching", kYes, kModel},
    {"dynamic_batching.preferred_batch_size", kYes, kModel},
    {"dynamic_batching.max_queue_delay_microseconds", kYes, kModel},
    {"dynamic_batching.preserve_ordering", kYes, kModel},
    {"dynamic_batching.priority_levels", kYes, kModel},
    {"dynamic_batching.default_priority_level", kYes, kModel},
    {"dynamic_batching.default_queue_policy", kYes, kModel},
    {"dynamic_batching.default_queue_policy.timeout_action", kYes, kModel},
    {"dynamic_batching.default_queue_policy.default_timeout_microseconds", kYes, kModel},
    {"dynamic_batching.default_queue_policy.allow_timeout_override", kYes, kModel},
    {"dynamic_batching.default_queue_policy.max_queue_size", kYes, kModel},
    {"dynamic_batching.priority_queue_policy", kYes, kModel},
    {"dynamic_batching.priority_queue_policy.timeout_action", kYes, kModel},
    {"dynamic_batching.priority_queue_policy.default_timeout_microseconds", kYes, kModel},
    {"dynamic_batching.priority_queue_policy.allow_timeout_override", kYes, kModel},
    {"dynamic_batching.priority_queue_policy.max_queue_size", kYes, kModel},
    // scheduling/sequence_batcher.cc.
    {"sequence_batching", kYes, kModel},
    {"sequence_batching.max_sequence_idle_microseconds", kYes, kModel},
    {"sequence_batching.control_input", kYes, kModel},
    {"sequence_batching.control_input.name", kYes, kModel},
    {"sequence_batching.control_input.control", kYes, kModel},
    {"sequence_batching.control_input.control.kind", kYes, kModel},
    {"sequence_batching.control_input.control.int32_false_true", kYes, kModel},
    {"sequence_batching.control_input.control.fp32_false_true", kYes, kModel},
    {"sequence_batching.control_input.control.bool_false_true", kYes, kModel},
    {"sequence_batching.control_input.control.data_type", kYes, kModel},
    {"sequence_batching.state", kYes, kModel},
    {"sequence_batching.state.input_name", kYes, kModel},
    {"sequence_batching.state.output_name", kYes, kModel},
    {"sequence_batching.state.data_type", kYes, kModel},
    {"sequence_batching.state.dims", kYes, kModel},
    {"sequence_batching.state.initial_state", kYes, kModel},
    {"sequence_batching.state.initial_state.name", kYes, kModel},
    {"sequence_batching.state.initial_state.data_type", kYes, kModel},
    {"sequence_batching.state.initial_state.dims", kYes, kModel},
    {"sequence_batching.state.initial_state.zero_data", kYes, kModel},
    {"sequence_batching.state.initial_state.data_file", kYes, kModel},
    // GPU buffer strategies for the state; here it is copied in host memory between requests.
    {"sequence_batching.state.use_same_buffer_for_input_output", kNoEffect, kModel, false,
     "the state is copied between requests in host memory"},
    {"sequence_batching.state.use_growable_memory", kNoEffect, kModel, false,
     "growable GPU memory for the state"},
    {"sequence_batching.direct", kYes, kModel},
    {"sequence_batching.direct.max_queue_delay_microseconds", kYes, kModel},
    {"sequence_batching.direct.minimum_slot_utilization", kYes, kModel},
    {"sequence_batching.oldest", kYes, kModel},
    {"sequence_batching.oldest.max_candidate_sequences", kYes, kModel},
    {"sequence_batching.oldest.preferred_batch_size", kYes, kModel},
    {"sequence_batching.oldest.max_queue_delay_microseconds", kYes, kModel},
    {"sequence_batching.oldest.preserve_ordering", kWarn, kModel, false,
     "responses of different sequences are not held back to arrival order (each sequence's own "
     "responses keep their order)"},
    {"sequence_batching.iterative_sequence", kNo, kModel, false,
     "iterative sequences (decoupled request rescheduling) are not implemented"},

    {"ensemble_scheduling", kYes, kEnsemble},
    {"ensemble_scheduling.step", kYes, kEnsemble},
    {"ensemble_scheduling.step.model_name", kYes, kEnsemble},
    {"ensemble_scheduling.step.model_version", kYes, kEnsemble},
    {"ensemble_scheduling.step.input_map", kYes, kEnsemble},
    {"ensemble_scheduling.step.output_map", kYes, kEnsemble},
    {"ensemble_scheduling.step.model_namespace", kNo, kEnsemble, false,
     "the server sets it (--model-namespacing: the ensemble's own repository first); "
     "a config cannot name a namespace"},
    {"ensemble_scheduling.max_inflight_requests", kYes, kEnsemble},

    // Triton refuses `instance_group` in an ensemble too.
    {"instance_group", kYes, kModel},
    {"instance_group.name", kYes, kModel},
    {"instance_group.kind", kYes, kModel},  // values: kRefusedValues
    {"instance_group.count", kYes, kModel},
    // Triton applies it only under --rate-limit=execution_count (off by default).
    {"instance_group.rate_limiter", kWarn, kModel, true,
     "there is no rate limiter (Triton's --rate-limit); instances run whenever they are free"},
    // repository/placement.h: KIND_GPU / KIND_AUTO placement, ids checked against the host's GPUs.
    {"instance_group.gpus", kYes, kModel},
    {"instance_group.secondary_devices", kNo, kModel, false, "no GPU or DLA is available on this server"},
    {"instance_group.profile", kWarn, kModel, false,
     "TensorRT optimization profiles, read only by the TensorRT backend"},
    {"instance_group.passive", kWarn, kModel, false,
     "passive instances are not implemented: these instances are scheduled like the others"},
    {"instance_group.host_policy", kWarn, kModel, false,
     "host policies (--host-policy: NUMA binding) are not implemented"},

    {"default_model_filename", kYes, kModel},
    // Triton picks a file by the GPU's compute capability, for GPU instances only.
    {"cc_model_filenames", kNoEffect, kModel, false,
     "per-GPU model files; CPU instances use default_model_filename"},
    {"metric_tags", kWarn, kAny, true, "labels added to a model's metrics are not implemented"},
    // Each backend reads its own keys and warns of the others (backends::CheckConfigSupport).
    {"parameters", kYes, kModel, true},
    {"parameters", kWarn, kEnsemble, true, "an ensemble has no backend to read them"},

    // repository/model.cc RunWarmup; Triton refuses warmup in an ensemble too.
    {"model_warmup", kYes, kModel},
    {"model_warmup.name", kYes, kModel},
    {"model_warmup.batch_size", kYes, kModel},
    {"model_warmup.inputs", kYes, kModel},
    {"model_warmup.inputs.data_type", kYes, kModel},
    {"model_warmup.inputs.dims", kYes, kModel},
    {"model_warmup.inputs.zero_data", kYes, kModel},
    {"model_warmup.inputs.random_data", kYes, kModel},
    {"model_warmup.inputs.input_data_file", kYes, kModel},
    {"model_warmup.count", kYes, kModel},

    {"model_operations", kWarn, kAny, true,
     "custom operator libraries are not loaded; a model that needs one fails in its backend"},
    // Decoupled models answer 0..N times per request (core/response_sender.h) over gRPC
    // ModelStreamInfer and HTTP generate/generate_stream; ensembles refuse them as steps.
    {"model_transaction_policy", kYes},
    {"model_transaction_policy.decoupled", kYes},
    {"model_repository_agents", kNo, kAny, false,
     "repository agents (checksum, decryption, ...) are not run"},
    {"response_cache", kYes},
    // Used when the server has a cache (--cache-config local,size=N); without one the model
    // loads and runs uncached, as in tritonserver.
    {"response_cache.enable", kYes},
    // Bucket bounds of the first-response histogram (Model::Load checks the family name).
    {"model_metrics", kYes},
    {"model_metrics.metric_control", kYes},
    {"model_metrics.metric_control.metric_identifier", kYes},
    {"model_metrics.metric_control.metric_identifier.family", kYes},
    {"model_metrics.metric_control.histogram_options", kYes},
    {"model_metrics.metric_control.histogram_options.buckets", kYes},
};

struct RefusedValue {
  std::string_view path;
  std::string_view value;
  std::string_view why;
};

constexpr RefusedValue kRefusedValues[] = {
    {"instance_group.kind", "KIND_MODEL",
     "the backend would choose the devices itself; inferd places every instance: use "
     "KIND_CPU, KIND_GPU or KIND_AUTO"},
};

constexpr std::string_view kIgnored =
    "it would be ignored; remove it or use a server that supports it";

bool InScope(Scope scope, bool ensemble) {
  return scope == Scope::kAny || (scope == Scope::kEnsemble) == ensemble;
}

// The rule for exactly `path` in this scope; `other_scope` tells whether one exists for the
// other scope only.
const FieldRule* FindRule(std::string_view path, bool ensemble, bool* other_scope) {
  *other_scope = false;
  for (const FieldRule& rule : kRules) {
    if (rule.path != path) continue;
    if (InScope(rule.scope, ensemble)) return &rule;
    *other_scope = true;
  }
  return nullptr;
}

// The verdict on `path` itself, not its ancestors.
FieldClass ClassifyOne(std::string_view path, bool ensemble, bool* subtree) {
  *subtree = false;
  bool other_scope = false;
  const FieldRule* rule = FindRule(path, ensemble, &other_scope);
  if (rule == nullptr) {
    if (other_scope) {
      return {FieldVerdict::kRefused,
              ensemble ? "it does not apply to an ensemble"
                       : "it applies only to an ensemble (platform: \"ensemble\")",
              path};
    }
    return {FieldVerdict::kRefused, {}, path};
  }
  *subtree = rule->subtree;
  return {rule->verdict, rule->why, path};
}

std::string Refusal(std::string_view path, std::string_view value, std::string_view why) {
  if (!value.empty()) {
    return inferd::StrCat("config.pbtxt field '", path, "' value ", value,
                          " is not supported by inferd (", why, ")");
  }
  if (why.empty()) {
    return inferd::StrCat("config.pbtxt field '", path, "' is not supported by inferd (", kIgnored,
                          ")");
  }
  return inferd::StrCat("config.pbtxt field '", path, "' is not supported by inferd (", why, "; ",
                        kIgnored, ")");
}

class Walker {
 public:
  explicit Walker(bool ensemble) : ensemble_(ensemble) {}

  void Walk(const pb::Message& msg, const std::string& prefix) {
    const pb::Reflection* r = msg.GetReflection();
    std::vector<const pb::FieldDescriptor*> fields;
    r->ListFields(msg, &fields);
    for (const pb::FieldDescriptor* f : fields) {
      const std::string path = prefix.empty() ? f->name() : inferd::StrCat(prefix, ".", f->name());
      bool subtree = false;
      const FieldClass c = ClassifyOne(path, ensemble_, &subtree);
      if (c.verdict == FieldVerdict::kRefused) {
        Add(Refusal(path, {}, c.why));
        continue;
      }
      if (c.verdict == FieldVerdict::kWarned) {
        std::string warning =
            inferd::StrCat("config.pbtxt field '", path, "' has no effect in inferd (", c.why, ")");
        if (std::find(warnings_.begin(), warnings_.end(), warning) == warnings_.end()) {
          warnings_.push_back(std::move(warning));
        }
        if (subtree) continue;
      }
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) CheckEnumValues(msg, f, path);
      if (subtree || f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
      if (f->is_map()) {
        const pb::FieldDescriptor* value = f->message_type()->map_value();
        if (value->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
        for (int i = 0; i < r->FieldSize(msg, f); ++i) {
          const pb::Message& entry = r->GetRepeatedMessage(msg, f, i);
          Walk(entry.GetReflection()->GetMessage(entry, value), path);
        }
      } else if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(msg, f); ++i) Walk(r->GetRepeatedMessage(msg, f, i), path);
      } else {
        Walk(r->GetMessage(msg, f), path);
      }
    }
  }

  const std::vector<std::string>& refusals() const { return refusals_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  void CheckEnumValues(const pb::Message& msg, const pb::FieldDescriptor* f,
                       const std::string& path) {
    const pb::Reflection* r = msg.GetReflection();
    const int n = f->is_repeated() ? r->FieldSize(msg, f) : 1;
    for (int i = 0; i < n; ++i) {
      const pb::EnumValueDescriptor* v =
          f->is_repeated() ? r->GetRepeatedEnum(msg, f, i) : r->GetEnum(msg, f);
      for (const RefusedValue& refused : kRefusedValues) {
        if (refused.path == path && refused.value == v->name()) {
          Add(Refusal(path, v->name(), refused.why));
        }
      }
    }
  }

  void Add(std::string refusal) {
    if (std::find(refusals_.begin(), refusals_.end(), refusal) == refusals_.end()) {
      refusals_.push_back(std::move(refusal));
    }
  }

  const bool ensemble_;
  std::vector<std::string> refusals_;
  std::vector<std::string> warnings_;
};

}  // namespace

FieldClass ClassifyConfigField(std::string_view path, bool ensemble, std::string_view enum_value) {
  // The first refused or wholly accepted ancestor decides, as the walk stops there.
  for (size_t end = path.find('.'); end != std::string_view::npos; end = path.find('.', end + 1)) {
    bool subtree = false;
    const FieldClass c = ClassifyOne(path.substr(0, end), ensemble, &subtree);
    if (c.verdict == FieldVerdict::kRefused || subtree) return c;
  }
  bool subtree = false;
  const FieldClass c = ClassifyOne(path, ensemble, &subtree);
  if (c.verdict != FieldVerdict::kRefused && !enum_value.empty()) {
    for (const RefusedValue& refused : kRefusedValues) {
      if (refused.path == path && refused.value == enum_value) {
        return {FieldVerdict::kRefused, refused.why, path};
      }
    }
  }
  return c;
}

std::vector<std::string_view> ConfigFieldTablePaths() {
  std::vector<std::string_view> paths;
  for (const FieldRule& rule : kRules) paths.push_back(rule.path);
  for (const RefusedValue& refused : kRefusedValues) paths.push_back(refused.path);
  return paths;
}

absl::Status CheckFieldsSupported(const inference::ModelConfig& config, std::string_view model_name,
                                  std::vector<std::string>* warnings) {
  Walker walker(config.platform() == "ensemble");
  walker.Walk(config, "");
  if (warnings != nullptr) {
    for (const auto& w : walker.warnings()) {
      warnings->push_back(inferd::StrCat("model '", model_name, "': ", w));
    }
  }
  if (walker.refusals().empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      inferd::StrCat("model '", model_name, "': ", inferd::StrJoin(walker.refusals(), "; ")));
}

}  // namespace inferd::config
