#include "backends/backend.h"

#include <cstring>

#include "common/strings.h"

namespace inferd::backends {

void BackendRegistry::Register(std::unique_ptr<Backend> backend) {
  std::string name(backend->name());
  backends_[name] = std::move(backend);
}

Backend* BackendRegistry::Find(std::string_view name) const {
  auto it = backends_.find(std::string(name));
  return it == backends_.end() ? nullptr : it->second.get();
}

bool IsOutputRequested(const core::InferRequest& request, std::string_view name) {
  if (request.outputs.empty()) return true;
  for (const auto& o : request.outputs) {
    if (o.name == name) return true;
  }
  return false;
}

Shape BackendInputShape(const inference::ModelInput& input, const Shape& request_shape,
                        bool batching) {
  if (!input.has_reshape()) return request_shape;
  Shape shape;
  if (batching && !request_shape.empty()) shape.push_back(request_shape[0]);
  for (int64_t d : input.reshape().shape()) shape.push_back(d);
  return shape;
}

absl::Status ForEachBytesElement(std::string_view buffer,
                                 const std::function<void(std::string_view)>& fn) {
  size_t pos = 0;
  while (pos < buffer.size()) {
    if (buffer.size() - pos < 4) {
      return absl::InvalidArgumentError("BYTES element is truncated: fewer than 4 length bytes");
    }
    uint32_t len;
    std::memcpy(&len, buffer.data() + pos, 4);
    pos += 4;
    if (len > buffer.size() - pos) {
      return absl::InvalidArgumentError(
          inferd::StrCat("BYTES element claims ", len, " bytes but only ", buffer.size() - pos,
                       " remain"));
    }
    fn(buffer.substr(pos, len));
    pos += len;
  }
  return absl::OkStatus();
}

}  // namespace inferd::backends
