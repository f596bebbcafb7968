// How a model's config.pbtxt maps onto ONNX Runtime session options, exactly as Triton's
// onnxruntime backend reads them. A pure function of the config, so each knob is unit-tested;
// the backend applies the result to Ort::SessionOptions in one place.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/model_config_util.h"

namespace inferd::backends::ort {

// Triton's optimization.graph.level: -1 basic, 1 extended, 2 none, anything else all.
enum class GraphLevel { kBasic, kExtended, kDisableAll, kAll };

struct SessionSettings {
  int intra_op_threads = 1;
  int inter_op_threads = 1;
  bool parallel_execution = false;        // execution_mode 1
  bool mem_arena = true;                  // enable_mem_arena
  bool mem_pattern = true;                // enable_mem_pattern
  // memory.enable_memory_arena_shrinkage, passed as Triton passes it: the run option's
  // string ("cpu:0"), empty when not set.
  std::string arena_shrinkage;
  bool allow_spinning = true;             // session.{intra,inter}_op.allow_spinning
  // session.force_spinning_stop: the pool threads spin between a run's operators only and stop
  // when the run returns (set by default when the instances' threads exactly fill the cores).
  bool spin_during_runs_only = false;
  GraphLevel graph_level = GraphLevel::kAll;
  // Every `session.*` parameter (session.use_device_allocator_for_initializers among them),
  // added to the session options as a config entry, key and value unchanged, in key order.
  std::vector<std::pair<std::string, std::string>> session_entries;
  // optimized_model_filepath (inferd's, not Triton's): ONNX Runtime writes the graph it
  // optimized to this path when the session is created.
  std::string optimized_model_filepath;
  // Knobs that only mean something to a GPU execution provider (arena_extend_strategy is the
  // CUDA arena's in Triton), accepted, checked and reported.
  std::vector<std::string> not_applying;
};

// `total_instances` and `cpu_cores` set the default intra-op thread count so that
// instances x threads does not exceed the cores.
absl::StatusOr<SessionSettings> SettingsFromConfig(const config::ModelConfig& config,
                                                   int total_instances, int cpu_cores);

std::string DescribeSettings(const SessionSettings& s);

// The CUDA execution provider's options for a GPU instance on CUDA device `device_id`, from
// the keys Triton's onnxruntime backend gives that provider: gpu_mem_limit (bytes),
// cudnn_conv_algo_search (0 EXHAUSTIVE, 1 HEURISTIC, 2 DEFAULT), arena_extend_strategy
// (0 kNextPowerOfTwo, 1 kSameAsRequested), do_copy_in_default_stream (bool) and
// optimization { cuda { graphs: true } } (enable_cuda_graph), and every parameter of a
// gpu_execution_accelerator named "cuda" as it is (those four keys win over it; device_id is
// always `device_id`). A key the config leaves out keeps ONNX Runtime's default. In key order;
// INVALID_ARGUMENT naming a bad value.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CudaProviderOptions(
    const config::ModelConfig& config, int device_id);

}  // namespace inferd::backends::ort
