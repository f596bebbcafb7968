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

enum class GraphLevel { kBasic, kExtended, kAll };

struct SessionSettings {
  int intra_op_threads = 1;
  int inter_op_threads = 1;
  bool parallel_execution = false;        // execution_mode 1
  bool mem_arena = true;                  // enable_mem_arena
  bool mem_pattern = true;                // enable_mem_pattern
  int arena_extend_strategy = 0;          // 0 next power of two, 1 same as requested
  bool arena_shrinkage = false;           // memory.enable_memory_arena_shrinkage
  bool allow_spinning = true;             // session.intra_op.allow_spinning
  GraphLevel graph_level = GraphLevel::kAll;
  // Knobs that only mean something to a GPU execution provider, accepted and reported.
  std::vector<std::string> not_applying;
};

// `total_instances` and `cpu_cores` set the default intra-op thread count so that
// instances x threads does not exceed the cores.
absl::StatusOr<SessionSettings> SettingsFromConfig(const config::ModelConfig& config,
                                                   int total_instances, int cpu_cores);

std::string DescribeSettings(const SessionSettings& s);

}  // namespace inferd::backends::ort
