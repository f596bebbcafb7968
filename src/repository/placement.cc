#include "repository/placement.h"

#include <absl/strings/str_format.h>

#include <set>

#include "common/strings.h"

namespace inferd::repository {
namespace {

std::string FormatCapability(double cc) { return absl::StrFormat("%.1f", cc); }

// Why no GPU can take a KIND_GPU instance here, for the error and the fallback warning.
std::string NoGpuReason(const PlacementOptions& options,
                        const std::vector<gpu::DeviceProperties>& devices) {
  if (options.gpus == nullptr) return "this server has no GPU runtime";
  if (devices.empty()) {
    std::string why = options.gpus->UnavailableReason();
    return why.empty() ? "no GPU is available" : why;
  }
  std::string out = inferd::StrCat("no GPU has compute capability ",
                                   FormatCapability(options.min_compute_capability),
                                   " or more (--min-supported-compute-capability):");
  for (const auto& d : devices) {
    out += inferd::StrCat(" GPU ", d.id, " '", d.name, "' is ", FormatCapability(d.ComputeCapability()),
                          ";");
  }
  out.pop_back();
  return out;
}

// The GPUs of at least --min-supported-compute-capability.
std::set<int> SupportedGpus(const std::vector<gpu::DeviceProperties>& devices,
                            const PlacementOptions& options) {
  std::set<int> supported;
  for (const auto& d : devices) {
    // The small epsilon keeps 8.6 >= 8.6 true whatever the flag's decimal rounding.
    if (d.ComputeCapability() + 1e-9 >= options.min_compute_capability) supported.insert(d.id);
  }
  return supported;
}

// KIND_AUTO: the GPUs when the group lists some (an id that cannot be used is then refused
// naming it; Triton refuses it too, as KIND_CPU with GPUs), else the GPU when the host has a
// supported one and the backend can run a GPU instance (Triton leaves that to the backend, whose
// KIND_GPU instance would then fail to load).
bool AutoOnGpu(const inference::ModelInstanceGroup& group, const absl::Status& backend_gpu,
               const std::set<int>& supported) {
  return group.gpus_size() > 0 || (backend_gpu.ok() && !supported.empty());
}

}  // namespace

int DefaultInstanceCount(bool on_gpu, std::string_view backend) {
  // Triton's SetDefaultInstanceCount: backends opt in to two CPU instances; the rest (PyTorch,
  // Python, ...) have one, and a GPU group one per GPU.
  if (!on_gpu && (backend == "onnxruntime" || backend == "tensorflow")) return 2;
  return 1;
}

void ResolveInstanceGroups(config::ModelConfig* config, const absl::Status& backend_gpu,
                           const PlacementOptions& options) {
  std::vector<gpu::DeviceProperties> devices;
  if (options.gpus != nullptr) devices = gpu::ListDevices(*options.gpus);
  const std::set<int> supported = SupportedGpus(devices, options);
  using Group = inference::ModelInstanceGroup;
  for (auto& group : *config->mutable_instance_group()) {
    if (group.kind() == Group::KIND_AUTO) {
      group.set_kind(AutoOnGpu(group, backend_gpu, supported) ? Group::KIND_GPU : Group::KIND_CPU);
    }
    if (group.count() < 1) {
      group.set_count(DefaultInstanceCount(group.kind() == Group::KIND_GPU, config->backend()));
    }
  }
}

absl::StatusOr<Placement> PlaceInstances(const config::ModelConfig& config,
                                         const absl::Status& backend_gpu,
                                         const PlacementOptions& options) {
  std::vector<gpu::DeviceProperties> devices;
  if (options.gpus != nullptr) devices = gpu::ListDevices(*options.gpus);
  const std::set<int> supported = SupportedGpus(devices, options);
  std::string supported_list;
  for (int id : supported) {
    inferd::StrAppend(&supported_list, supported_list.empty() ? "" : ", ", id);
  }

  Placement placement;
  std::vector<std::string> fell_back;  // groups moved to the CPU, for the one warning
  std::string fallback_reason;
  for (const auto& group : config.instance_group()) {
    using Group = inference::ModelInstanceGroup;
    const std::string where = inferd::StrCat("instance group ", group.name(), " of model ",
                                             config.name());
    std::vector<int> gpus(group.gpus().begin(), group.gpus().end());
    bool gpu = false;
    switch (group.kind()) {
      case Group::KIND_AUTO:
        gpu = AutoOnGpu(group, backend_gpu, supported);
        break;
      case Group::KIND_GPU:
        gpu = true;
        break;
      case Group::KIND_CPU:
        if (!gpus.empty()) {
          return absl::InvalidArgumentError(
              inferd::StrCat(where, " has kind KIND_CPU but specifies one or more GPUs"));
        }
        break;
      default:
        return absl::InvalidArgumentError(inferd::StrCat(
            where, " has kind ", Group::Kind_Name(group.kind()), ", which inferd does not place"));
    }
    // Triton's default count follows the group's kind, before any fallback to the CPU.
    const int count =
        group.count() >= 1 ? group.count() : DefaultInstanceCount(gpu, config.backend());
    int cpu_copies = 1;  // instances per `count` when a GPU group falls back to the CPU
    if (gpu) {
      std::string cannot;  // why this group cannot run on a GPU here; empty when it can
      // The host's reason first: on a host without a GPU, that is the one to fix.
      if (supported.empty()) {
        cannot = NoGpuReason(options, devices);
      } else if (!backend_gpu.ok()) {
        cannot = std::string(backend_gpu.message());
      }
      if (cannot.empty()) {
        // A listed id must be a GPU this server uses (Triton's message, the ids it has).
        for (int id : gpus) {
          if (supported.count(id) == 0) {
            return absl::InvalidArgumentError(inferd::StrCat(
                where, " specifies invalid or unsupported gpu id ", id,
                ". GPUs with at least the minimum required CUDA compute compatibility of ",
                FormatCapability(options.min_compute_capability), " are: ", supported_list));
          }
        }
        if (gpus.empty()) gpus.assign(supported.begin(), supported.end());
      } else if (!options.gpu_fallback_to_cpu) {
        return absl::FailedPreconditionError(inferd::StrCat(
            where, " has kind KIND_GPU but cannot run on a GPU: ", cannot,
            ". Use KIND_CPU or KIND_AUTO, or start inferd with --gpu-fallback-to-cpu to run "
            "KIND_GPU instances on the CPU"));
      } else {
        // The same number of instances as on the GPUs the config names (one GPU if none).
        cpu_copies = std::max<int>(1, static_cast<int>(gpus.size()));
        gpu = false;
        fell_back.push_back(group.name());
        fallback_reason = cannot;
      }
    }
    for (int n = 0; n < count; ++n) {
      const std::string name = inferd::StrCat(group.name(), "_", n);
      if (gpu) {
        for (int id : gpus) placement.instances.push_back({&group, {true, id, name}});
      } else {
        for (int c = 0; c < cpu_copies; ++c) placement.instances.push_back({&group, {false, 0, name}});
      }
    }
  }
  if (!fell_back.empty()) {
    placement.fallback_warning = inferd::StrCat(
        "model '", config.name(), "': instance group(s) ", inferd::StrJoin(fell_back, ", "),
        " ask for KIND_GPU, which cannot run here (", fallback_reason,
        "); running them on the CPU (--gpu-fallback-to-cpu)");
  }
  return placement;
}

}  // namespace inferd::repository
