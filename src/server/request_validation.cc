#include "server/request_validation.h"

#include <cstring>

#include "common/strings.h"

namespace inferd::server {
namespace {

Shape ConfigShape(const google::protobuf::RepeatedField<int64_t>& dims, bool batching) {
  Shape s;
  if (batching) s.push_back(-1);
  for (int64_t d : dims) s.push_back(d);
  return s;
}

// Whether `actual` matches the config's dims (with the batch dimension in front when batching),
// -1 matching any size. Compares in place: the expected Shape is built only for an error.
bool ShapeMatches(const google::protobuf::RepeatedField<int64_t>& dims, bool batching,
                  const Shape& actual) {
  const size_t lead = batching ? 1 : 0;
  if (actual.size() != dims.size() + lead) return false;
  for (int i = 0; i < dims.size(); ++i) {
    if (dims[i] != -1 && dims[i] != actual[i + lead]) return false;
  }
  return true;
}

// Counts BYTES elements and checks each length prefix stays inside the buffer.
absl::StatusOr<int64_t> CountBytesElements(std::string_view data, const std::string& name) {
  int64_t count = 0;
  size_t pos = 0;
  while (pos < data.size()) {
    if (data.size() - pos < 4) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", name, "': BYTES element ", count, " is truncated (no 4-byte length)"));
    }
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    pos += 4;
    if (len > data.size() - pos) {
      return absl::InvalidArgumentError(inferd::StrCat("input '", name, "': BYTES element ", count,
                                                     " claims ", len, " bytes but only ",
                                                     data.size() - pos, " remain"));
    }
    pos += len;
    ++count;
  }
  return count;
}

}  // namespace

absl::Status ValidateRequest(const config::ModelConfig& config, core::InferRequest* request) {
  const bool batching = config.max_batch_size() > 0;
  const std::string& model = config.name();
  int64_t batch = -1;
  std::string_view batch_input;

  for (size_t i = 0; i < request->inputs.size(); ++i) {
    const core::InputTensor& in = request->inputs[i];
    for (size_t j = 0; j < i; ++j) {
      if (request->inputs[j].name == in.name) {
        return absl::InvalidArgumentError(
            inferd::StrCat("input '", in.name, "' appears more than once in the request"));
      }
    }
    const inference::ModelInput* cfg = nullptr;
    for (const auto& c : config.input()) {
      if (c.name() == in.name) cfg = &c;
    }
    if (cfg == nullptr) {
      std::vector<std::string> names;
      for (const auto& c : config.input()) names.push_back(c.name());
      return absl::InvalidArgumentError(inferd::StrCat("unexpected inference input '", in.name,
                                                     "' for model '", model,
                                                     "'; the model's inputs are: ",
                                                     inferd::StrJoin(names, ", ")));
    }
    const DataType expected_type = config::FromProto(cfg->data_type());
    if (in.datatype != expected_type) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", in.name, "' has datatype ", DataTypeName(in.datatype), " but model '",
          model, "' expects ", DataTypeName(expected_type)));
    }
    if (!ShapeMatches(cfg->dims(), batching, in.shape)) {
      const Shape expected = ConfigShape(cfg->dims(), batching);
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", in.name, "' has shape ", ShapeToString(in.shape), " but model '", model,
          "' expects ", ShapeToString(expected),
          batching ? " (the first dimension is the batch size)" : ""));
    }
    if (batching) {
      const int64_t b = in.shape[0];
      if (b < 1 || b > config.max_batch_size()) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "input '", in.name, "' has batch size ", b, " but model '", model,
            "' accepts 1 to ", config.max_batch_size(), " (max_batch_size)"));
      }
      if (batch == -1) {
        batch = b;
        batch_input = in.name;
      } else if (b != batch) {
        return absl::InvalidArgumentError(inferd::StrCat("inputs '", batch_input, "' and '",
                                                       in.name, "' have different batch sizes (",
                                                       batch, " and ", b, ")"));
      }
    }
    auto count = ElementCount(in.shape);
    if (!count.ok()) {
      return absl::InvalidArgumentError(inferd::StrCat("input '", in.name, "': ",
                                                     count.status().message()));
    }
    if (in.datatype == DataType::kBytes) {
      auto elements = CountBytesElements(in.data, in.name);
      if (!elements.ok()) return elements.status();
      if (*elements != *count) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "input '", in.name, "' has shape ", ShapeToString(in.shape), " (", *count,
            " elements) but ", *elements, " BYTES elements were sent"));
      }
    } else {
      const uint64_t expected_bytes = static_cast<uint64_t>(*count) * DataTypeSize(in.datatype);
      if (in.data.size() != expected_bytes) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "input '", in.name, "' has shape ", ShapeToString(in.shape), " and datatype ",
            DataTypeName(in.datatype), ", which needs ", expected_bytes, " bytes, but ",
            in.data.size(), " bytes were sent"));
      }
    }
  }
  for (const auto& c : config.input()) {
    if (c.optional()) continue;
    if (request->FindInput(c.name()) == nullptr) {
      return absl::InvalidArgumentError(inferd::StrCat("model '", model, "' expects input '",
                                                     c.name(), "' but the request does not have it"));
    }
  }
  for (size_t i = 0; i < request->outputs.size(); ++i) {
    const auto& out = request->outputs[i];
    bool found = false;
    for (const auto& c : config.output()) {
      if (c.name() == out.name) found = true;
    }
    if (!found) {
      return absl::InvalidArgumentError(inferd::StrCat("unexpected inference output '", out.name,
                                                     "' for model '", model, "'"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (request->outputs[j].name == out.name) {
        return absl::InvalidArgumentError(
            inferd::StrCat("output '", out.name, "' is requested more than once"));
      }
    }
  }
  request->batch_size = batching ? std::max<int64_t>(batch, 1) : 1;
  return absl::OkStatus();
}

}  // namespace inferd::server
