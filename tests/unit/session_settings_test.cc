#include "backends/onnxruntime/session_settings.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::backends::ort {
namespace {

using ::testing::HasSubstr;

config::ModelConfig Config(const std::string& text) {
  auto cfg = config::ParseModelConfigText("name: \"m\" backend: \"onnxruntime\" " + text, "c");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return *cfg;
}

std::string Param(const std::string& key, const std::string& value) {
  return "parameters { key: \"" + key + "\" value: { string_value: \"" + value + "\" } } ";
}

TEST(SessionSettingsTest, DefaultsFollowTheThreadBudget) {
  auto s = SettingsFromConfig(Config(""), /*total_instances=*/1, /*cpu_cores=*/2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->intra_op_threads, 2);
  EXPECT_EQ(s->inter_op_threads, 1);
  // 1 x 2 threads fill 2 cores exactly: they spin inside a run only.
  EXPECT_TRUE(s->allow_spinning);
  EXPECT_TRUE(s->spin_during_runs_only);
  EXPECT_EQ(s->graph_level, GraphLevel::kAll);
  auto two = SettingsFromConfig(Config(""), 2, 2);
  EXPECT_EQ(two->intra_op_threads, 1);
  auto four = SettingsFromConfig(Config(""), 4, 2);
  EXPECT_EQ(four->intra_op_threads, 1);
  EXPECT_FALSE(four->allow_spinning);  // 4 threads on 2 cores: spinning only steals
  EXPECT_FALSE(four->spin_during_runs_only);
  auto spare = SettingsFromConfig(Config(Param("intra_op_thread_count", "1")), 1, 4);
  EXPECT_TRUE(spare->allow_spinning);  // cores to spare: ONNX Runtime's own default
  EXPECT_FALSE(spare->spin_during_runs_only);
  // The user's word stands, whole.
  auto asked = SettingsFromConfig(Config(Param("allow_spinning", "1")), 1, 2);
  EXPECT_TRUE(asked->allow_spinning);
  EXPECT_FALSE(asked->spin_during_runs_only);
}

TEST(SessionSettingsTest, EveryKnobIsRead) {
  auto s = SettingsFromConfig(
      Config(Param("intra_op_thread_count", "3") + Param("inter_op_thread_count", "2") +
             Param("execution_mode", "1") + Param("enable_mem_arena", "0") +
             Param("enable_mem_pattern", "0") + Param("arena_extend_strategy", "1") +
             Param("memory.enable_memory_arena_shrinkage", "cpu:0") +
             Param("session.use_device_allocator_for_initializers", "1") +
             Param("session.disable_prepacking", "1") +
             Param("gpu_mem_limit", "1000") + Param("cudnn_conv_algo_search", "1") +
             Param("do_copy_in_default_stream", "1") + "optimization { graph { level: 1 } }"),
      1, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->intra_op_threads, 3);
  EXPECT_EQ(s->inter_op_threads, 2);
  EXPECT_TRUE(s->parallel_execution);
  EXPECT_FALSE(s->mem_arena);
  EXPECT_FALSE(s->mem_pattern);
  EXPECT_EQ(s->arena_shrinkage, "cpu:0");
  EXPECT_THAT(s->session_entries,
              ::testing::ElementsAre(
                  std::make_pair(std::string("session.disable_prepacking"), std::string("1")),
                  std::make_pair(std::string("session.use_device_allocator_for_initializers"),
                                 std::string("1"))));
  EXPECT_EQ(s->graph_level, GraphLevel::kExtended);
  // arena_extend_strategy is the CUDA arena's in Triton.
  EXPECT_THAT(s->not_applying, ::testing::ElementsAre("gpu_mem_limit", "cudnn_conv_algo_search",
                                                      "do_copy_in_default_stream",
                                                      "arena_extend_strategy"));
  EXPECT_THAT(DescribeSettings(*s), HasSubstr("execution_mode=parallel"));
}

TEST(SessionSettingsTest, GraphLevelMapping) {
  EXPECT_EQ(SettingsFromConfig(Config("optimization { graph { level: -1 } }"), 1, 2)->graph_level,
            GraphLevel::kBasic);
  EXPECT_EQ(SettingsFromConfig(Config("optimization { graph { level: 0 } }"), 1, 2)->graph_level,
            GraphLevel::kAll);
  EXPECT_EQ(SettingsFromConfig(Config("optimization { graph { level: 1 } }"), 1, 2)->graph_level,
            GraphLevel::kExtended);
  // Triton: 2 disables every optimization; any other value enables all.
  EXPECT_EQ(SettingsFromConfig(Config("optimization { graph { level: 2 } }"), 1, 2)->graph_level,
            GraphLevel::kDisableAll);
  EXPECT_EQ(SettingsFromConfig(Config("optimization { graph { level: 3 } }"), 1, 2)->graph_level,
            GraphLevel::kAll);
}

TEST(SessionSettingsTest, BadValuesAreErrors) {
  EXPECT_THAT(SettingsFromConfig(Config(Param("intra_op_thread_count", "two")), 1, 2).status().message(),
              HasSubstr("'intra_op_thread_count' must be an integer"));
  EXPECT_THAT(SettingsFromConfig(Config(Param("execution_mode", "2")), 1, 2).status().message(),
              HasSubstr("execution_mode"));
  EXPECT_THAT(SettingsFromConfig(Config(Param("enable_mem_arena", "maybe")), 1, 2).status().message(),
              HasSubstr("enable_mem_arena"));
  EXPECT_THAT(SettingsFromConfig(Config(Param("memory.enable_memory_arena_shrinkage", "true")), 1, 2)
                  .status().message(),
              HasSubstr("'<device>:<id>' entries"));
  EXPECT_TRUE(SettingsFromConfig(Config(Param("memory.enable_memory_arena_shrinkage", "cpu:0;gpu:1")), 1, 2).ok());
  EXPECT_THAT(SettingsFromConfig(Config(Param("arena_extend_strategy", "2")), 1, 2).status().message(),
              HasSubstr("arena_extend_strategy"));
  // OpenVINO loads (a WARNING: not in this build); a name Triton does not know is refused.
  EXPECT_TRUE(SettingsFromConfig(Config("optimization { execution_accelerators { cpu_execution_accelerator [ { name: \"openvino\" } ] } }"), 1, 2).ok());
  EXPECT_THAT(SettingsFromConfig(Config("optimization { execution_accelerators { cpu_execution_accelerator [ { name: \"vino\" } ] } }"), 1, 2)
                  .status().message(),
              HasSubstr("unknown cpu_execution_accelerator 'vino'"));
}

}  // namespace
}  // namespace inferd::backends::ort

namespace inferd::backends::ort {
namespace {

TEST(CudaProviderOptionsTest, TritonKeysMapToTheCudaProvidersOptions) {
  auto o = CudaProviderOptions(
      Config(Param("gpu_mem_limit", "4294967296") + Param("cudnn_conv_algo_search", "1") +
             Param("do_copy_in_default_stream", "false") + Param("arena_extend_strategy", "1") +
             "optimization { cuda { graphs: true } }"),
      3);
  ASSERT_TRUE(o.ok()) << o.status();
  using P = std::pair<std::string, std::string>;
  EXPECT_THAT(*o, ::testing::ElementsAre(P{"arena_extend_strategy", "kSameAsRequested"},
                                         P{"cudnn_conv_algo_search", "HEURISTIC"},
                                         P{"device_id", "3"},
                                         P{"do_copy_in_default_stream", "0"},
                                         P{"enable_cuda_graph", "1"},
                                         P{"gpu_mem_limit", "4294967296"}));
  // Unset keys keep ONNX Runtime's defaults: only the device is named.
  o = CudaProviderOptions(Config(""), 0);
  ASSERT_TRUE(o.ok());
  EXPECT_THAT(*o, ::testing::ElementsAre(P{"device_id", "0"}));
}

TEST(CudaProviderOptionsTest, TheCudaAcceleratorsParametersGoToTheProvider) {
  // Triton's onnxruntime backend hands each key of gpu_execution_accelerator "cuda" to the CUDA
  // provider; the parameters section's keys win where both are set; the device is the
  // instance's.
  auto o = CudaProviderOptions(
      Config(Param("cudnn_conv_algo_search", "2") +
             "optimization { execution_accelerators { gpu_execution_accelerator [ { name: \"cuda\" "
             "parameters { key: \"cudnn_conv_use_max_workspace\" value: \"1\" } "
             "parameters { key: \"cudnn_conv_algo_search\" value: \"HEURISTIC\" } "
             "parameters { key: \"use_ep_level_unified_stream\" value: \"ON\" } "
             "parameters { key: \"device_id\" value: \"7\" } } ] } }"),
      1);
  ASSERT_TRUE(o.ok()) << o.status();
  using P = std::pair<std::string, std::string>;
  EXPECT_THAT(*o, ::testing::ElementsAre(P{"cudnn_conv_algo_search", "DEFAULT"},
                                         P{"cudnn_conv_use_max_workspace", "1"},
                                         P{"device_id", "1"},
                                         P{"use_ep_level_unified_stream", "1"}));
  o = CudaProviderOptions(
      Config("optimization { execution_accelerators { gpu_execution_accelerator [ { name: "
             "\"cuda\" parameters { key: \"do_copy_in_default_stream\" value: \"sometimes\" } } "
             "] } }"),
      0);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("'do_copy_in_default_stream'"));
  // A TensorRT accelerator's parameters are not the CUDA provider's.
  o = CudaProviderOptions(
      Config("optimization { execution_accelerators { gpu_execution_accelerator [ { name: "
             "\"tensorrt\" parameters { key: \"precision_mode\" value: \"FP16\" } } ] } }"),
      0);
  ASSERT_TRUE(o.ok());
  EXPECT_THAT(*o, ::testing::ElementsAre(P{"device_id", "0"}));
}

TEST(CudaProviderOptionsTest, BooleansAreReadAsTritonReadsThem) {
  // backend_common's ParseBoolValue: true/on/1, false/off/0, any case.
  for (const char* yes : {"1", "true", "TRUE", "On", "on"}) {
    auto o = CudaProviderOptions(Config(Param("do_copy_in_default_stream", yes)), 0);
    ASSERT_TRUE(o.ok()) << yes << ": " << o.status();
    EXPECT_THAT(*o, ::testing::Contains(std::pair<std::string, std::string>(
                        "do_copy_in_default_stream", "1")));
  }
  for (const char* no : {"0", "false", "FALSE", "Off"}) {
    auto s = SettingsFromConfig(Config(Param("enable_mem_arena", no)), 1, 2);
    ASSERT_TRUE(s.ok()) << no << ": " << s.status();
    EXPECT_FALSE(s->mem_arena) << no;
  }
  EXPECT_FALSE(SettingsFromConfig(Config(Param("enable_mem_arena", "yes")), 1, 2).ok());
}

TEST(CudaProviderOptionsTest, BadValuesAreRefusedNamingTheKey) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"cudnn_conv_algo_search", "3"}, {"gpu_mem_limit", "lots"},
           {"arena_extend_strategy", "2"}, {"do_copy_in_default_stream", "maybe"}}) {
    auto o = CudaProviderOptions(Config(Param(key, value)), 0);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(o.status().message(), HasSubstr("'" + key + "'"));
  }
}

}  // namespace
}  // namespace inferd::backends::ort
