#include "frontends/grpc/grpc_codec.h"

#include <charconv>
#include <cstring>
#include <limits>

#include "common/strings.h"

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
  for (const auto& [key, p] : message.parameters()) {
    if (key == "priority") {
      if (p.has_int64_param() && p.int64_param() >= 0) req->priority = p.int64_param();
      else if (p.has_uint64_param()) req->priority = p.uint64_param();
      else return absl::InvalidArgumentError("parameter 'priority' must be a non-negative integer");
    } else if (key == "timeout") {
      if (p.has_int64_param() && p.int64_param() >= 0) req->timeout_us = p.int64_param();
      else if (p.has_uint64_param()) req->timeout_us = p.uint64_param();
      else return absl::InvalidArgumentError("parameter 'timeout' must be a non-negative integer (microseconds)");
    }
  }
  const bool raw = message.raw_input_contents_size() > 0;
  if (raw && message.raw_input_contents_size() != message.inputs_size()) {
    return absl::InvalidArgumentError(StrCat(
        "raw_input_contents has ", message.raw_input_contents_size(), " entries but the request has ",
        message.inputs_size(), " inputs; send one raw entry per input, in order"));
  }
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
    if (raw) {
      if (HasContents(in.contents())) {
        return absl::InvalidArgumentError(StrCat(
            "input '", in.name(), "' has both typed contents and raw_input_contents; send one"));
      }
      t.data = message.raw_input_contents(i);
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
    req->outputs.push_back(std::move(ro));
  }
  return req;
}

void ResponseToProto(const core::InferResponse& response, inference::ModelInferResponse* message) {
  message->set_model_name(response.model_name);
  message->set_model_version(StrCat(response.model_version));
  message->set_id(response.id);
  for (const auto& out : response.outputs) {
    auto* o = message->add_outputs();
    o->set_name(out.name);
    o->set_datatype(std::string(DataTypeName(out.datatype)));
    for (int64_t d : out.shape) o->add_shape(d);
    message->add_raw_output_contents()->assign(out.data.data(), out.data.size());
  }
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl's canonical codes have the same numbers as gRPC's.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace inferd::grpcfe
