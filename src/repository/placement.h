// Where each instance of a model runs, as Triton decides it (model_config_utils.cc
// NormalizeInstanceGroup / ValidateInstanceGroup, backend_model.cc instance creation):
//   - KIND_AUTO: KIND_GPU when `gpus` is set, or when the backend can use a GPU and the host
//     has one of at least --min-supported-compute-capability; KIND_CPU otherwise.
//   - KIND_GPU without `gpus`: every supported GPU; `count` instances per GPU. A listed id that
//     is not a supported GPU is refused naming it. With no supported GPU the model fails to
//     load saying why (CUDA's answer, e.g. no driver), unless --gpu-fallback-to-cpu runs those
//     instances on the CPU (one WARNING per model).
//   - KIND_CPU with `gpus`: refused.
//   - No instance_group: one KIND_AUTO group named after the model. A group without `count`
//     (or below 1) has Triton's SetDefaultInstanceCount: 2 on the CPU for onnxruntime and
//     tensorflow, else 1 (per GPU).
// Instances are named "<group name>_<n>", n in [0, count), the same n on each GPU of a group.
#ifndef INFERD_REPOSITORY_PLACEMENT_H_
#define INFERD_REPOSITORY_PLACEMENT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "config/model_config_util.h"
#include "gpu/runtime.h"

namespace inferd::repository {

struct PlacementOptions {
  // The host's devices; null means none (as a build without CUDA).
  const gpu::Runtime* gpus = nullptr;
  // --min-supported-compute-capability: GPUs below it are not used (Triton's default 6.0).
  double min_compute_capability = 6.0;
  // --gpu-fallback-to-cpu: a KIND_GPU group that cannot run on a GPU here runs on the CPU.
  bool gpu_fallback_to_cpu = false;
};

struct InstancePlacement {
  const inference::ModelInstanceGroup* group = nullptr;  // in the model's config
  backends::InstanceDevice device;
};

struct Placement {
  std::vector<InstancePlacement> instances;  // creation order: group, n, then GPU
  // Set when --gpu-fallback-to-cpu moved KIND_GPU instances to the CPU: the one WARNING to log.
  std::string fallback_warning;
};

// Triton's default `count` for a group that sets none.
int DefaultInstanceCount(bool on_gpu, std::string_view backend);

// Writes into `config` what Triton's NormalizeInstanceGroup resolves, so that the config a client
// reads back says where the instances run: KIND_AUTO becomes KIND_GPU or KIND_CPU (the rule
// above), an unset count the default. PlaceInstances gives the same placement before and after.
void ResolveInstanceGroups(config::ModelConfig* config, const absl::Status& backend_gpu,
                           const PlacementOptions& options);

// Places every instance of `config` (normalized: groups named) for a backend that
// can (`backend_gpu` OK) or cannot (why not) run instances on a GPU. INVALID_ARGUMENT for a config error (a bad `gpus`
// id, KIND_CPU with `gpus`), FAILED_PRECONDITION when a KIND_GPU group cannot run here.
absl::StatusOr<Placement> PlaceInstances(const config::ModelConfig& config,
                                         const absl::Status& backend_gpu,
                                         const PlacementOptions& options);

}  // namespace inferd::repository

#endif  // INFERD_REPOSITORY_PLACEMENT_H_
