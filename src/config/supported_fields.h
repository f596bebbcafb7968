// Which config.pbtxt fields inferd implements. A field of Triton's schema that inferd parsed and
// then ignored would load a model that behaves differently from Triton without a word; instead
// every field set in a config is looked up in one table (supported_fields.cc), and a field that
// is not implemented fails the load with a message naming it where ignoring it would change an
// answer, and loads with one WARNING naming it where it would not (issue 26: never refuse what
// Triton accepts unless serving it would compute a wrong answer).
//
// Backends add their own part: the `parameters` keys each one reads and whether it applies
// `reshape` are checked by backends::CheckConfigSupport when an instance is created.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "model_config.pb.h"

namespace inferd::config {

enum class FieldVerdict {
  kImplemented,  // behaves as in Triton
  kNoEffect,     // accepted: it has no effect in Triton either on a CPU-only server
  kWarned,       // accepted with one WARNING: not implemented, but ignoring it changes no answer
  kRefused,      // the load fails naming the field
};

struct FieldClass {
  FieldVerdict verdict;
  std::string_view why;   // kNoEffect: why it is harmless; kRefused: what inferd lacks
  std::string_view path;  // the field the verdict is for: the path, or its deciding ancestor
};

// How inferd treats field `path` (names joined by '.', no indices or map keys; the fields of a
// message-valued map's values are "<map>.<field>", e.g. "dynamic_batching.priority_queue_policy.
// max_queue_size") set to a non-default value, in an ensemble's config or a backend model's.
// `enum_value` is the value's name for an enum field ("KIND_GPU"). A path below a refused or a
// wholly accepted message gets that message's verdict.
FieldClass ClassifyConfigField(std::string_view path, bool ensemble,
                               std::string_view enum_value = {});

// Every path the table names, for the test that checks each exists in model_config.proto.
std::vector<std::string_view> ConfigFieldTablePaths();

// Walks every field `config` sets (recursively, repeated and map fields included) and refuses
// those ClassifyConfigField refuses: INVALID_ARGUMENT "model '<m>': config.pbtxt field '<path>'
// is not supported by inferd (<why>)", every refused field named, "; "-separated. The kWarned
// fields set are appended to `warnings` (when given), one line each: "model '<m>': config.pbtxt
// field '<path>' has no effect in inferd (<why>)".
absl::Status CheckFieldsSupported(const inference::ModelConfig& config, std::string_view model_name,
                                  std::vector<std::string>* warnings = nullptr);

}  // namespace inferd::config
