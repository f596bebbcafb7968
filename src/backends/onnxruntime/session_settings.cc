#include "backends/onnxruntime/session_settings.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "common/strings.h"

namespace inferd::backends::ort {
namespace {

absl::StatusOr<int> IntParameter(const config::ModelConfig& config, const std::string& key,
                                 int fallback) {
  auto value = config::GetParameter(config, key);
  if (!value) return fallback;
  int parsed;
  if (!absl::SimpleAtoi(*value, &parsed)) {
    return absl::InvalidArgumentError(inferd::StrCat("model '", config.name(), "': parameter '",
                                                   key, "' must be an integer, got '", *value,
                                                   "'"));
  }
  return parsed;
}

absl::StatusOr<bool> BoolParameter(const config::ModelConfig& config, const std::string& key,
                                   bool fallback) {
  auto value = config::GetParameter(config, key);
  if (!value) return fallback;
  if (std::optional<bool> b = config::ParseTritonBool(*value)) return *b;
  return absl::InvalidArgumentError(inferd::StrCat("model '", config.name(), "': parameter '", key,
                                                 "' must be true/false, on/off or 1/0, got '",
                                                 *value, "'"));
}

}  // namespace

absl::StatusOr<SessionSettings> SettingsFromConfig(const config::ModelConfig& config,
                                                   int total_instances, int cpu_cores) {
  SessionSettings s;
  const int budget = std::max(1, cpu_cores / std::max(1, total_instances));
  auto intra = IntParameter(config, "intra_op_thread_count", 0);
  if (!intra.ok()) return intra.status();
  s.intra_op_threads = *intra > 0 ? *intra : budget;
  auto inter = IntParameter(config, "inter_op_thread_count", 0);
  if (!inter.ok()) return inter.status();
  s.inter_op_threads = *inter > 0 ? *inter : 1;
  auto mode = IntParameter(config, "execution_mode", 0);
  if (!mode.ok()) return mode.status();
  if (*mode != 0 && *mode != 1) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", config.name(), "': parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got ", *mode));
  }
  s.parallel_execution = *mode == 1;
  auto arena = BoolParameter(config, "enable_mem_arena", true);
  if (!arena.ok()) return arena.status();
  s.mem_arena = *arena;
  auto pattern = BoolParameter(config, "enable_mem_pattern", true);
  if (!pattern.ok()) return pattern.status();
  s.mem_pattern = *pattern;
  // Triton gives arena_extend_strategy to the CUDA execution provider's arena only; the
  // value is checked as Triton checks it and reported as not applying on a CPU server.
  auto strategy = IntParameter(config, "arena_extend_strategy", 0);
  if (!strategy.ok()) return strategy.status();
  if (*strategy != 0 && *strategy != 1) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", config.name(), "': parameter 'arena_extend_strategy' must be 0 (next power of two) or 1 (same as requested), got ", *strategy));
  }
  if (auto shrink = config::GetParameter(config, "memory.enable_memory_arena_shrinkage")) {
    // ONNX Runtime's syntax: "<device>:<id>" entries separated by ';' (cpu:0, gpu:0).
    std::string_view rest = *shrink;
    while (true) {
      const size_t semi = rest.find(';');
      const std::string_view entry = rest.substr(0, semi);
      const size_t colon = entry.find(':');
      const std::string_view device = entry.substr(0, colon);
      const std::string_view id = colon == std::string_view::npos ? "" : entry.substr(colon + 1);
      int parsed;
      if ((device != "cpu" && device != "gpu") ||
          !absl::SimpleAtoi(absl::string_view(id.data(), id.size()), &parsed) || parsed < 0) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", config.name(), "': parameter 'memory.enable_memory_arena_shrinkage' takes "
            "'<device>:<id>' entries separated by ';' (e.g. \"cpu:0\"), got '", *shrink, "'"));
      }
      if (semi == std::string_view::npos) break;
      rest = rest.substr(semi + 1);
    }
    s.arena_shrinkage = *shrink;
  }
  for (const auto& entry : config.parameters()) {
    if (entry.first.rfind("session.", 0) == 0) {
      s.session_entries.emplace_back(entry.first, entry.second.string_value());
    }
  }
  std::sort(s.session_entries.begin(), s.session_entries.end());
  if (auto path = config::GetParameter(config, "optimized_model_filepath")) {
    s.optimized_model_filepath = *path;
  }
  // Spinning by the instances' thread budget (bench/onnx_spinning.sh, bench/RESULTS.md): with
  // cores to spare the pool threads spin (ONNX Runtime's default); when they fill the cores
  // exactly, they spin only inside a run (between its operators, where blocking costs a
  // wake-up per operator) and stop when it returns, so the HTTP threads get the cores between
  // runs; when they oversubscribe the cores, spinning only steals from each other: off.
  const int threads = total_instances * s.intra_op_threads;
  auto spin = BoolParameter(config, "allow_spinning", threads <= cpu_cores);
  if (!spin.ok()) return spin.status();
  s.allow_spinning = *spin;
  s.spin_during_runs_only =
      s.allow_spinning && !config::GetParameter(config, "allow_spinning") && threads == cpu_cores;

  // Triton's mapping: -1 basic, 1 extended, 2 disable all, anything else (default 0) all.
  const int level = config.optimization().graph().level();
  s.graph_level = level == -1  ? GraphLevel::kBasic
                  : level == 1 ? GraphLevel::kExtended
                  : level == 2 ? GraphLevel::kDisableAll
                               : GraphLevel::kAll;

  for (const char* key : {"gpu_mem_limit", "cudnn_conv_algo_search", "do_copy_in_default_stream",
                          "arena_extend_strategy"}) {
    if (config::GetParameter(config, key)) s.not_applying.push_back(key);
  }
  for (const auto& acc : config.optimization().execution_accelerators().gpu_execution_accelerator()) {
    s.not_applying.push_back(inferd::StrCat("gpu_execution_accelerator:", acc.name()));
  }
  for (const auto& acc : config.optimization().execution_accelerators().cpu_execution_accelerator()) {
    // Triton's onnxruntime backend knows one CPU accelerator, OpenVINO, and refuses any other
    // name. OpenVINO is not in this build: ONNX Runtime's own CPU provider runs the model and
    // computes the same results (the backend logs a WARNING).
    if (acc.name() != "openvino") {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", config.name(), "': unknown cpu_execution_accelerator '", acc.name(),
          "' (Triton's onnxruntime backend knows 'openvino')"));
    }
    s.not_applying.push_back("cpu_execution_accelerator:openvino");
  }
  return s;
}

namespace {
std::string SessionEntries(const SessionSettings& s) {
  std::string out;
  for (const auto& [key, value] : s.session_entries) out += inferd::StrCat(" ", key, "=", value);
  return out;
}
}  // namespace

std::string DescribeSettings(const SessionSettings& s) {
  return inferd::StrCat(
      "intra_op_thread_count=", s.intra_op_threads, " inter_op_thread_count=", s.inter_op_threads,
      " execution_mode=", s.parallel_execution ? "parallel" : "sequential",
      " enable_mem_arena=", s.mem_arena, " enable_mem_pattern=", s.mem_pattern,
      " memory.enable_memory_arena_shrinkage=",
      s.arena_shrinkage.empty() ? std::string("off") : s.arena_shrinkage,
      " allow_spinning=", s.allow_spinning,
      s.spin_during_runs_only ? " (during runs only)" : "", " graph_optimization=",
      s.graph_level == GraphLevel::kBasic        ? "basic"
      : s.graph_level == GraphLevel::kExtended   ? "extended"
      : s.graph_level == GraphLevel::kDisableAll ? "disable_all"
                                                 : "all",
      SessionEntries(s),
      s.optimized_model_filepath.empty() ? "" : " optimized_model_filepath=",
      s.optimized_model_filepath);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CudaProviderOptions(
    const config::ModelConfig& config, int device_id) {
  std::map<std::string, std::string> options;
  auto bad = [&](std::string_view key, std::string_view want, std::string_view got) {
    return absl::InvalidArgumentError(inferd::StrCat("model '", config.name(), "': parameter '",
                                                     key, "' must be ", want, ", got '", got,
                                                     "'"));
  };
  // gpu_execution_accelerator { name: "cuda" parameters { ... } }: Triton's onnxruntime backend
  // hands every key to the CUDA provider as it is (booleans checked first); ONNX Runtime
  // refuses a key it does not know when the session is made. The keys of the `parameters`
  // section below win over these where both are set.
  for (const auto& acc : config.optimization().execution_accelerators().gpu_execution_accelerator()) {
    if (acc.name() != "cuda") continue;
    for (const auto& [key, value] : acc.parameters()) {
      if (value.empty()) continue;
      if (key == "do_copy_in_default_stream" || key == "use_ep_level_unified_stream") {
        const std::optional<bool> on = config::ParseTritonBool(value);
        if (!on) {
          return absl::InvalidArgumentError(inferd::StrCat(
              "model '", config.name(), "': gpu_execution_accelerator 'cuda' parameter '", key,
              "' must be true/false, on/off or 1/0, got '", value, "'"));
        }
        options[key] = *on ? "1" : "0";
      } else {
        options[key] = value;
      }
    }
  }
  if (auto algo = config::GetParameter(config, "cudnn_conv_algo_search")) {
    static constexpr const char* kAlgo[] = {"EXHAUSTIVE", "HEURISTIC", "DEFAULT"};
    int n = -1;
    if (!absl::SimpleAtoi(*algo, &n) || n < 0 || n > 2) {
      return bad("cudnn_conv_algo_search", "0 (EXHAUSTIVE), 1 (HEURISTIC) or 2 (DEFAULT)", *algo);
    }
    options["cudnn_conv_algo_search"] = kAlgo[n];
  }
  options["device_id"] = std::to_string(device_id);  // never the accelerator's
  if (auto copy = BoolParameter(config, "do_copy_in_default_stream", true); !copy.ok()) {
    return copy.status();
  } else if (config::GetParameter(config, "do_copy_in_default_stream")) {
    options["do_copy_in_default_stream"] = *copy ? "1" : "0";
  }
  if (config.optimization().cuda().graphs()) options["enable_cuda_graph"] = "1";
  if (auto limit = config::GetParameter(config, "gpu_mem_limit")) {
    uint64_t bytes = 0;
    if (!absl::SimpleAtoi(*limit, &bytes) || bytes == 0) {
      return bad("gpu_mem_limit", "a number of bytes > 0", *limit);
    }
    options["gpu_mem_limit"] = std::to_string(bytes);
  }
  if (auto strategy = config::GetParameter(config, "arena_extend_strategy")) {
    if (*strategy != "0" && *strategy != "1") {
      return bad("arena_extend_strategy", "0 (next power of two) or 1 (same as requested)",
                 *strategy);
    }
    options["arena_extend_strategy"] = *strategy == "0" ? "kNextPowerOfTwo" : "kSameAsRequested";
  }
  return std::vector<std::pair<std::string, std::string>>(options.begin(), options.end());
}

}  // namespace inferd::backends::ort
