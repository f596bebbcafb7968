#include "backends/backend.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>

#include "common/logging.h"
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

std::vector<Backend*> BackendRegistry::All() const {
  std::vector<Backend*> all;
  for (const auto& [name, backend] : backends_) all.push_back(backend.get());
  return all;
}

absl::StatusOr<std::vector<std::string>> Backend::Configure(
    const std::map<std::string, std::string>& settings) {
  std::vector<std::string> unread;
  for (const auto& [key, value] : settings) unread.push_back(key);
  return unread;
}

absl::Status Backend::GpuInstanceSupport() const {
  return absl::FailedPreconditionError(
      inferd::StrCat("backend '", name(), "' runs only on the CPU"));
}

absl::StatusOr<std::unique_ptr<ModelInstance>> Backend::CreateInstanceOn(
    const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
    const InstanceDevice& device) {
  if (device.gpu) {
    return absl::FailedPreconditionError(inferd::StrCat(
        "model '", spec.config->name(), "': instance '", device.name, "' of instance_group '",
        group.name(), "' is placed on GPU ", device.id, ", but backend '", name(),
        "' runs only on the CPU"));
  }
  return CreateInstance(spec, group, index);
}

absl::Status CheckConfigSupport(const ModelSpec& spec, std::string_view backend,
                                const ConfigSupport& support, int index) {
  const config::ModelConfig& config = *spec.config;
  std::vector<std::string> refusals;
  // Logged by the first instance only: once per model version.
  const bool warn = index == 0;
  std::vector<std::string> keys;
  for (const auto& entry : config.parameters()) keys.push_back(entry.first);
  std::sort(keys.begin(), keys.end());  // the map's order is unspecified
  for (const std::string& key : keys) {
    auto unapplied = std::find_if(support.unapplied.begin(), support.unapplied.end(),
                                  [&](const UnappliedParameter& u) { return u.key == key; });
    if (unapplied != support.unapplied.end()) {
      if (warn) {
        LOG_WARNING << "model '" << config.name() << "' version " << spec.version
                    << ": config.pbtxt 'parameters' key '" << key << "' has no effect on inferd's "
                    << backend << " backend: " << unapplied->effect;
      }
      continue;
    }
    if (support.backend_checks_parameters) continue;
    auto matches = [&](std::string_view known) {
      if (!known.empty() && known.back() == '*') {
        known.remove_suffix(1);
        return std::string_view(key).substr(0, known.size()) == known;
      }
      return key == known;
    };
    if (std::any_of(support.parameters.begin(), support.parameters.end(), matches)) continue;
    const std::string reads =
        support.parameters.empty()
            ? std::string("the backend reads no parameters")
            : inferd::StrCat("the keys it reads: ", inferd::StrJoin(support.parameters, ", "));
    if (spec.strict_parameters) {
      refusals.push_back(inferd::StrCat(
          "config.pbtxt field 'parameters' key '", key, "' is not supported by inferd's ", backend,
          " backend (it would be ignored; ", reads,
          "; --strict-model-config-parameters=false loads the model with a warning)"));
    } else if (warn) {
      LOG_WARNING << "model '" << config.name() << "' version " << spec.version
                  << ": config.pbtxt 'parameters' key '" << key << "' is not read by inferd's "
                  << backend << " backend and has no effect (" << reads
                  << "); --strict-model-config-parameters refuses such a model";
    }
  }
  auto reshape = [&](std::string_view kind, const auto& tensors, bool supported) {
    if (supported) return;
    for (const auto& t : tensors) {
      if (!t.has_reshape()) continue;
      refusals.push_back(inferd::StrCat("config.pbtxt field '", kind,
                                        ".reshape' is not supported by inferd's ", backend,
                                        " backend (", kind, " '", t.name(),
                                        "' would keep its dims; remove the reshape)"));
      return;
    }
  };
  reshape("input", config.input(), support.input_reshape);
  reshape("output", config.output(), support.output_reshape);
  if (refusals.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      inferd::StrCat("model '", config.name(), "': ", inferd::StrJoin(refusals, "; ")));
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

void FailBatch(std::span<core::InferResponse* const> responses, const absl::Status& status) {
  for (auto* r : responses) {
    r->outputs.clear();
    r->status = status;
  }
}

void FailBatchOnException(std::string_view who, std::span<core::InferResponse* const> responses,
                          absl::FunctionRef<void()> run) {
  try {
    run();
  } catch (const std::bad_alloc&) {
    FailBatch(responses, absl::ResourceExhaustedError(inferd::StrCat(who, ": out of memory")));
  } catch (const std::exception& e) {
    FailBatch(responses, absl::InternalError(inferd::StrCat(who, ": ", e.what())));
  }
}

}  // namespace inferd::backends
