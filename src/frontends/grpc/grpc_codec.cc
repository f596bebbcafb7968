#include "frontends/grpc/grpc_codec.h"

#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/strings.h"
#include "core/request_parameters.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferd::grpcfe {
namespace {

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename To, typename From>
absl::Status AppendChecked(const google::protobuf::RepeatedField<From>& values,
                           const std::string& name, std::string* out) {
  for (From v : values) {
    if constexpr (!std::is_same_v<To, From>) {
      if (v < static_cast<From>(std::numeric_limits<To>::lowest()) ||
          v > static_cast<From>(std::numeric_limits<To>::max())) {
        return absl::InvalidArgumentError(
            StrCat("input '", name, "': value ", v, " is out of range for its datatype"));
      }
    }
    Append<To>(out, static_cast<To>(v));
  }
  return absl::OkStatus();
}

// Decodes typed contents into the raw little-endian layout.
absl::Status DecodeContents(const inference::InferTensorContents& c, DataType type,
                            const std::string& name, std::string* out) {
  switch (type) {
    case DataType::kBool:
      for (bool b : c.bool_contents()) out->push_back(b ? 1 : 0);
      return absl::OkStatus();
    case DataType::kInt8: return AppendChecked<int8_t>(c.int_contents(), name, out);
    case DataType::kInt16: return AppendChecked<int16_t>(c.int_contents(), name, out);
    case DataType::kInt32: return AppendChecked<int32_t>(c.int_contents(), name, out);
    case DataType::kInt64: return AppendChecked<int64_t>(c.int64_contents(), name, out);
    case DataType::kUint8: return AppendChecked<uint8_t>(c.uint_contents(), name, out);
    case DataType::kUint16: return AppendChecked<uint16_t>(c.uint_contents(), name, out);
    case DataType::kUint32: return AppendChecked<uint32_t>(c.uint_contents(), name, out);
    case DataType::kUint64: return AppendChecked<uint64_t>(c.uint64_contents(), name, out);
    case DataType::kFp32: return AppendChecked<float>(c.fp32_contents(), name, out);
    case DataType::kFp64: return AppendChecked<double>(c.fp64_contents(), name, out);
    case DataType::kBytes:
      for (const std::string& s : c.bytes_contents()) {
        Append<uint32_t>(out, static_cast<uint32_t>(s.size()));
        out->append(s);
      }
      return absl::OkStatus();
    case DataType::kFp16:
    case DataType::kBf16:
      return absl::InvalidArgumentError(StrCat(
          "input '", name, "': ", DataTypeName(type),
          " tensors must be sent in raw_input_contents (the protocol has no typed field for them)"));
    default:
      return absl::InvalidArgumentError(StrCat("input '", name, "': unsupported datatype"));
  }
}

bool HasContents(const inference::InferTensorContents& c) {
  return c.bool_contents_size() || c.int_contents_size() || c.int64_contents_size() ||
         c.uint_contents_size() || c.uint64_contents_size() || c.fp32_contents_size() ||
         c.fp64_contents_size() || c.bytes_contents_size();
}

// An InferParameter in the protocols' common form (core/request_parameters.h).
core::ParameterValue ToParameterValue(const inference::InferParameter& p) {
  core::ParameterValue v;
  using Kind = core::ParameterValue::Kind;
  if (p.has_bool_param()) {
    v.kind = Kind::kBool;
    v.boolean = p.bool_param();
  } else if (p.has_int64_param()) {
    v.kind = Kind::kInt64;
    v.int64 = p.int64_param();
  } else if (p.has_uint64_param()) {
    v.kind = Kind::kUint64;
    v.uint64 = p.uint64_param();
  } else if (p.has_double_param()) {
    v.kind = Kind::kDouble;
    v.number = p.double_param();
  } else if (p.has_string_param()) {
    v.kind = Kind::kString;
    v.text = p.string_param();
  }
  return v;
}

// The shared-memory extension's parameters of one tensor (`kind` "input" or "output", named
// `name` in errors; nullopt without a region). A tensor without parameters costs nothing more.
absl::StatusOr<std::optional<core::SharedMemoryRef>> SharedMemoryParams(
    const google::protobuf::Map<std::string, inference::InferParameter>& params,
    std::string_view kind, const std::string& name) {
  if (params.empty()) return std::optional<core::SharedMemoryRef>();
  core::ParameterValue values[3];
  const core::ParameterValue* found[3] = {nullptr, nullptr, nullptr};
  const char* const keys[3] = {"shared_memory_region", "shared_memory_offset",
                               "shared_memory_byte_size"};
  for (int i = 0; i < 3; ++i) {
    if (auto it = params.find(keys[i]); it != params.end()) {
      values[i] = ToParameterValue(it->second);
      found[i] = &values[i];
    }
  }
  if (found[0] == nullptr && found[1] == nullptr && found[2] == nullptr) {
    return std::optional<core::SharedMemoryRef>();
  }
  return core::ParseSharedMemoryParameters(found[0], found[1], found[2], core::kGrpcParameterWords,
                                           StrCat(kind, " '", name, "'"));
}

}  // namespace

absl::StatusOr<int64_t> ParseVersion(const std::string& version) {
  if (version.empty()) return -1;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(version.data(), version.data() + version.size(), v);
  if (ec != std::errc() || p != version.data() + version.size() || v < 0) {
    return absl::InvalidArgumentError(
        StrCat("invalid model version '", version, "': versions are non-negative integers"));
  }
  return v;
}

absl::StatusOr<std::unique_ptr<core::InferRequest>> RequestFromProto(
    const inference::ModelInferRequest& message, std::shared_ptr<const void> owner) {
  auto req = std::make_unique<core::InferRequest>();
  req->payload = std::move(owner);
  req->model_name = message.model_name();
  auto version = ParseVersion(message.model_version());
  if (!version.ok()) return version.status();
  req->model_version = *version;
  req->id = message.id();
  // Parameters the server does not read itself, as a JSON object (NaN/Infinity as Python's json
  // reads them).
  rapidjson::StringBuffer params;
  rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                    rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>
      params_writer(params);
  bool any_params = false;
  for (const auto& [key, p] : message.parameters()) {
    // The ones the server reads (core/request_parameters.h).
    auto taken = core::ApplyRequestParameter(key, ToParameterValue(p), core::kGrpcParameterWords,
                                             req.get());
    if (!taken.ok()) return taken.status();
    if (!*taken) {
      // The rest travel with the request as JSON (Triton's Python backend:
      // request.parameters()).
      if (!p.has_bool_param() && !p.has_int64_param() && !p.has_uint64_param() &&
          !p.has_double_param() && !p.has_string_param()) {
        continue;
      }
      if (!any_params) params_writer.StartObject();
      any_params = true;
      params_writer.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
      if (p.has_bool_param()) {
        params_writer.Bool(p.bool_param());
      } else if (p.has_int64_param()) {
        params_writer.Int64(p.int64_param());
      } else if (p.has_uint64_param()) {
        params_writer.Uint64(p.uint64_param());
      } else if (p.has_double_param()) {
        params_writer.Double(p.double_param());
      } else {
        params_writer.String(p.string_param().data(),
                             static_cast<rapidjson::SizeType>(p.string_param().size()));
      }
    }
  }
  if (any_params) {
    params_writer.EndObject();
    req->parameters.assign(params.GetString(), params.GetSize());
  }
  const bool raw = message.raw_input_contents_size() > 0;
  // Inputs in shared memory have no raw entry: the raw entries are the other inputs, in order.
  int expected_raw = 0;
  for (const auto& in : message.inputs()) {
    expected_raw += in.parameters().count("shared_memory_region") == 0 ? 1 : 0;
  }
  if (raw && message.raw_input_contents_size() != expected_raw) {
    return absl::InvalidArgumentError(StrCat(
        "raw_input_contents has ", message.raw_input_contents_size(), " entries but the request has ",
        expected_raw, " inputs not in shared memory; send one raw entry per such input, in order"));
  }
  int raw_index = 0;
  for (int i = 0; i < message.inputs_size(); ++i) {
    const auto& in = message.inputs(i);
    core::InputTensor t;
    t.name = in.name();
    t.datatype = DataTypeFromString(in.datatype());
    if (t.datatype == DataType::kInvalid) {
      return absl::InvalidArgumentError(
          StrCat("input '", in.name(), "': unknown datatype '", in.datatype(), "'"));
    }
    for (int64_t d : in.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            StrCat("input '", in.name(), "': 'shape' must hold non-negative integers"));
      }
      t.shape.push_back(d);
    }
    auto count = ElementCount(t.shape);
    if (!count.ok()) {
      return absl::InvalidArgumentError(StrCat("input '", in.name(), "': ", count.status().message()));
    }
    auto shm = SharedMemoryParams(in.parameters(), "input", in.name());
    if (!shm.ok()) return shm.status();
    if (*shm) {
      if (HasContents(in.contents())) {
        return absl::InvalidArgumentError(StrCat(
            "input '", in.name(), "': unexpected 'contents' with shared memory; send one"));
      }
      t.shm = *std::move(shm);  // the server points `data` into the region
    } else if (raw) {
      if (HasContents(in.contents())) {
        return absl::InvalidArgumentError(StrCat(
            "input '", in.name(), "' has both typed contents and raw_input_contents; send one"));
      }
      t.data = message.raw_input_contents(raw_index++);
    } else {
      std::string& buf = req->owned.emplace_back();
      absl::Status st = DecodeContents(in.contents(), t.datatype, in.name(), &buf);
      if (!st.ok()) return st;
      t.data = buf;
    }
    req->inputs.push_back(std::move(t));
  }
  for (const auto& out : message.outputs()) {
    core::RequestedOutput ro;
    ro.name = out.name();
    if (auto it = out.parameters().find("classification"); it != out.parameters().end()) {
      if (!it->second.has_int64_param() || it->second.int64_param() < 0) {
        return absl::InvalidArgumentError(StrCat(
            "output '", out.name(), "': 'classification' must be a non-negative int64_param"));
      }
      ro.classification = it->second.int64_param();
    }
    auto shm = SharedMemoryParams(out.parameters(), "output", out.name());
    if (!shm.ok()) return shm.status();
    ro.shm = *std::move(shm);
    req->outputs.push_back(std::move(ro));
  }
  return req;
}

void ResponseToProto(const core::InferResponse& response, inference::ModelInferResponse* message) {
  message->set_model_name(response.model_name);
  message->set_model_version(StrCat(response.model_version));
  for (const auto& p : response.parameters) {
    inference::InferParameter& param = (*message->mutable_parameters())[p.name];
    if (const bool* b = std::get_if<bool>(&p.value)) {
      param.set_bool_param(*b);
    } else if (const int64_t* n = std::get_if<int64_t>(&p.value)) {
      param.set_int64_param(*n);
    } else {
      param.set_string_param(std::get<std::string>(p.value));
    }
  }
  message->set_id(response.id);
  for (const auto& out : response.outputs) {
    auto* o = message->add_outputs();
    o->set_name(out.name);
    o->set_datatype(std::string(DataTypeName(out.datatype)));
    for (int64_t d : out.shape) o->add_shape(d);
    // An output written to shared memory keeps its (empty) place, so indices still match.
    auto* raw = message->add_raw_output_contents();
    if (!out.in_shared_memory) raw->assign(out.data.data(), out.data.size());
  }
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl's canonical codes have the same numbers as gRPC's.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace inferd::grpcfe
