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

}  // namespace

absl::StatusOr<Placement> PlaceInstances(const config::ModelConfig& config,
                                         const absl::Status& backend_gpu,
                                         const PlacementOptions& options) {
  std::vector<gpu::DeviceProperties> devices;
  if (options.gpus != nullptr) devices = gpu::ListDevices(*options.gpus);
  std::set<int> supported;
  for (const auto& d : devices) {
    // The small epsilon keeps 8.6 >= 8.6 true whatever the flag's decimal rounding.
    if (d.ComputeCapability() + 1e-9 >= options.min_compute_capability) supported.insert(d.id);
  }
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
        gpu = !gpus.empty() || (backend_gpu.ok() && !supported.empty());
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
    for (int n = 0; n < group.count(); ++n) {
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
