#include "backends/dali/dali_pipeline.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "common/strings.h"
#include "dali_pipeline.pb.h"

namespace inferd::backends::dali {
namespace {

constexpr int kMaxArgumentDepth = 4;  // a list of lists at most; DALI itself writes depth 2

absl::Status ArgError(const OpNode& node, std::string_view name, std::string_view what) {
  return absl::InvalidArgumentError(
      inferd::StrCat(node.Label(), " argument '", name, "': ", what));
}

// One scalar value of `arg` (of its declared type) appended to `out`.
absl::Status ReadScalar(const dali_proto::Argument& arg, ArgValue* out) {
  const std::string& t = arg.type();
  if (t == "int64") {
    if (arg.ints_size() < 1) return absl::InvalidArgumentError("an int64 argument holds no value");
    out->numbers.push_back(static_cast<double>(arg.ints(0)));
  } else if (t == "float") {
    if (arg.floats_size() < 1) return absl::InvalidArgumentError("a float argument holds no value");
    out->numbers.push_back(arg.floats(0));
  } else if (t == "bool") {
    if (arg.bools_size() < 1) return absl::InvalidArgumentError("a bool argument holds no value");
    out->numbers.push_back(arg.bools(0) ? 1.0 : 0.0);
  } else if (t == "string") {
    if (arg.strings_size() < 1) {
      return absl::InvalidArgumentError("a string argument holds no value");
    }
    out->strings.push_back(arg.strings(0));
  } else if (arg.ints_size() > 0) {
    // Another name for an integer (an enum written by another serializer): read the value.
    out->numbers.push_back(static_cast<double>(arg.ints(0)));
  } else if (arg.floats_size() > 0) {
    out->numbers.push_back(arg.floats(0));
  } else if (arg.bools_size() > 0) {
    out->numbers.push_back(arg.bools(0) ? 1.0 : 0.0);
  } else if (arg.strings_size() > 0) {
    out->strings.push_back(arg.strings(0));
  } else {
    return absl::InvalidArgumentError(
        inferd::StrCat("an argument of type '", t, "' holds no value"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ArgValue> ReadArgument(const dali_proto::Argument& arg, int depth) {
  if (depth > kMaxArgumentDepth) {
    return absl::InvalidArgumentError("arguments nested too deeply");
  }
  ArgValue v;
  v.type = arg.type();
  v.is_vector = arg.is_vector();
  if (!arg.is_vector()) {
    if (auto st = ReadScalar(arg, &v); !st.ok()) return st;
    return v;
  }
  // DALI writes a list as one extra argument per element ("element <i>"), each a scalar of
  // the list's type.
  for (const auto& element : arg.extra_args()) {
    if (element.is_vector()) {
      return absl::InvalidArgumentError("a list argument holds a list element");
    }
    if (element.type() != arg.type()) {
      return absl::InvalidArgumentError(inferd::StrCat("a list of ", arg.type(),
                                                       " holds an element of type ",
                                                       element.type()));
    }
    if (auto st = ReadScalar(element, &v); !st.ok()) return st;
  }
  return v;
}

}  // namespace

DaliType DaliTypeFromInt(int64_t value) {
  if (value < 0 || value > static_cast<int>(DaliType::kBool)) return DaliType::kNoType;
  return static_cast<DaliType>(value);
}

std::string_view DaliTypeName(DaliType type) {
  switch (type) {
    case DaliType::kUint8: return "UINT8";
    case DaliType::kUint16: return "UINT16";
    case DaliType::kUint32: return "UINT32";
    case DaliType::kUint64: return "UINT64";
    case DaliType::kInt8: return "INT8";
    case DaliType::kInt16: return "INT16";
    case DaliType::kInt32: return "INT32";
    case DaliType::kInt64: return "INT64";
    case DaliType::kFloat16: return "FLOAT16";
    case DaliType::kFloat: return "FLOAT";
    case DaliType::kFloat64: return "FLOAT64";
    case DaliType::kBool: return "BOOL";
    case DaliType::kNoType: break;
  }
  return "NO_TYPE";
}

DataType ToDataType(DaliType type) {
  switch (type) {
    case DaliType::kUint8: return DataType::kUint8;
    case DaliType::kUint16: return DataType::kUint16;
    case DaliType::kUint32: return DataType::kUint32;
    case DaliType::kUint64: return DataType::kUint64;
    case DaliType::kInt8: return DataType::kInt8;
    case DaliType::kInt16: return DataType::kInt16;
    case DaliType::kInt32: return DataType::kInt32;
    case DaliType::kInt64: return DataType::kInt64;
    case DaliType::kFloat16: return DataType::kFp16;
    case DaliType::kFloat: return DataType::kFp32;
    case DaliType::kFloat64: return DataType::kFp64;
    case DaliType::kBool: return DataType::kBool;
    case DaliType::kNoType: break;
  }
  return DataType::kInvalid;
}

DaliType FromDataType(DataType type) {
  for (int t = 0; t <= static_cast<int>(DaliType::kBool); ++t) {
    if (ToDataType(static_cast<DaliType>(t)) == type) return static_cast<DaliType>(t);
  }
  return DaliType::kNoType;
}

bool IsFloat(DaliType type) {
  return type == DaliType::kFloat16 || type == DaliType::kFloat || type == DaliType::kFloat64;
}

std::string OpNode::Label() const {
  return instance.empty() ? inferd::StrCat("operator '", op, "'")
                          : inferd::StrCat("operator '", op, "' (", instance, ")");
}

absl::StatusOr<double> OpNode::Number(std::string_view name, double fallback) const {
  auto it = args.find(name);
  if (it == args.end()) return fallback;
  const ArgValue& v = it->second;
  if (v.numbers.size() != 1 || v.is_vector) {
    return ArgError(*this, name, inferd::StrCat("expected one number, got ",
                                                v.is_vector ? "a list" : v.type));
  }
  return v.numbers[0];
}

absl::StatusOr<std::vector<double>> OpNode::Numbers(std::string_view name) const {
  auto it = args.find(name);
  if (it == args.end()) return std::vector<double>{};
  if (!it->second.strings.empty()) {
    return ArgError(*this, name, "expected numbers, got strings");
  }
  return it->second.numbers;
}

absl::StatusOr<std::string> OpNode::String(std::string_view name,
                                           std::string_view fallback) const {
  auto it = args.find(name);
  if (it == args.end()) return std::string(fallback);
  if (it->second.strings.size() != 1 || it->second.is_vector) {
    return ArgError(*this, name, "expected one string");
  }
  return it->second.strings[0];
}

absl::StatusOr<bool> OpNode::Bool(std::string_view name, bool fallback) const {
  auto v = Number(name, fallback ? 1.0 : 0.0);
  if (!v.ok()) return v.status();
  return *v != 0.0;
}

absl::StatusOr<PipelineGraph> ParsePipeline(std::string_view bytes) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError("model.dali is larger than 2 GiB");
  }
  dali_proto::PipelineDef def;
  if (!def.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "model.dali is not a serialized DALI pipeline (the PipelineDef protobuf does not parse)");
  }
  PipelineGraph g;
  if (def.batch_size() < 1 || def.batch_size() > (1 << 20)) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model.dali: batch_size ", def.batch_size(), " is not a positive batch size"));
  }
  g.batch_size = def.batch_size();
  g.num_threads = static_cast<int>(std::clamp<int64_t>(def.num_threads(), -1, 1024));
  g.device_id = def.device_id();

  absl::flat_hash_set<std::string> edges;
  // Legacy pipelines list their external inputs apart from the operators.
  for (const std::string& name : def.external_inputs()) {
    if (!edges.insert(name).second) {
      return absl::InvalidArgumentError(
          inferd::StrCat("model.dali: external input '", name, "' is declared twice"));
    }
    g.inputs.push_back(ExternalInput{name, name, DaliType::kNoType, -1});
  }
  for (int i = 0; i < def.op_size(); ++i) {
    const dali_proto::OpDef& op = def.op(i);
    OpNode node;
    // DALI once serialized ExternalSource as "_ExternalSource"; its reader renames it back.
    node.op = op.name() == "_ExternalSource" ? "ExternalSource" : op.name();
    node.instance = op.inst_name();
    if (node.op.empty()) {
      return absl::InvalidArgumentError(
          inferd::StrCat("model.dali: operator ", i, " has no name"));
    }
    for (const auto& arg : op.args()) {
      auto value = ReadArgument(arg, 0);
      if (!value.ok()) {
        return ArgError(node, arg.name(), std::string(value.status().message()));
      }
      node.args[arg.name()] = *std::move(value);
    }
    auto device = node.String("device", "cpu");
    if (!device.ok()) return device.status();
    node.device = *device;
    if (node.device != "cpu" && node.device != "gpu" && node.device != "mixed" &&
        node.device != "support") {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model.dali: ", node.Label(), " has device '", node.device,
          "'; DALI knows cpu, gpu and mixed"));
    }
    for (const auto& in : op.input()) {
      if (in.is_argument_input()) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model.dali: ", node.Label(), " takes its argument '", in.arg_name(),
            "' from another operator's output ('", in.name(),
            "'); inferd's dali backend runs only constant arguments"));
      }
      if (!edges.contains(in.name())) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model.dali: ", node.Label(), " reads '", in.name(),
            "', which no earlier operator produces"));
      }
      node.inputs.push_back(in.name());
    }
    if (op.output_size() != 1) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model.dali: ", node.Label(), " has ", op.output_size(),
          " outputs; inferd's dali backend runs operators with one output"));
    }
    node.output = op.output(0).name();
    if (!edges.insert(node.output).second) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model.dali: ", node.Label(), " writes '", node.output,
          "', which an earlier operator already produces"));
    }
    if (node.op == "ExternalSource") {
      ExternalInput in;
      auto name = node.String("name", "");
      if (!name.ok()) return name.status();
      in.name = name->empty() ? node.instance : *name;
      in.edge = node.output;
      auto dtype = node.Number("dtype", -1);
      if (!dtype.ok()) return dtype.status();
      in.dtype = DaliTypeFromInt(static_cast<int64_t>(*dtype));
      auto ndim = node.Number("ndim", -1);
      if (!ndim.ok()) return ndim.status();
      in.ndim = static_cast<int>(std::clamp(*ndim, -1.0, 64.0));
      if (in.name.empty()) {
        return absl::InvalidArgumentError(
            inferd::StrCat("model.dali: ", node.Label(), " has no name"));
      }
      for (const auto& other : g.inputs) {
        if (other.name == in.name) {
          return absl::InvalidArgumentError(inferd::StrCat(
              "model.dali: two ExternalSource operators are named '", in.name, "'"));
        }
      }
      g.inputs.push_back(std::move(in));
    }
    g.ops.push_back(std::move(node));
  }
  if (def.pipe_outputs_size() == 0) {
    return absl::InvalidArgumentError("model.dali: the pipeline has no outputs");
  }
  for (const auto& out : def.pipe_outputs()) {
    if (!edges.contains(out.name())) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model.dali: pipeline output '", out.name(), "' is produced by no operator"));
    }
    g.outputs.push_back(out.name());
  }
  if (g.inputs.empty()) {
    return absl::InvalidArgumentError(
        "model.dali: the pipeline has no ExternalSource, so nothing feeds it from a request");
  }
  return g;
}

}  // namespace inferd::backends::dali
