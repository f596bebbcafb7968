#include "config/model_config_util.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::config {
namespace {

using ::testing::HasSubstr;

TEST(ModelConfigTest, ParsesTritonQuickStartConfig) {
  auto cfg = ParseModelConfigText(R"(
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
)", "config.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->max_batch_size(), 8);
  EXPECT_EQ(cfg->input_size(), 2);
  EXPECT_EQ(cfg->instance_group(0).count(), 2);
  EXPECT_EQ(cfg->dynamic_batching().preferred_batch_size(1), 8);
  EXPECT_EQ(GetParameter(*cfg, "intra_op_thread_count").value_or(""), "1");
  EXPECT_FALSE(GetParameter(*cfg, "missing").has_value());
}

TEST(ModelConfigTest, UnknownFieldNamesFileLineAndField) {
  auto cfg = ParseModelConfigText("name: \"m\"\nmax_batch_size: 1\nbogus_field: 3\n",
                                  "models/m/config.pbtxt");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cfg.status().message(), HasSubstr("models/m/config.pbtxt:3:"));
  EXPECT_THAT(cfg.status().message(), HasSubstr("bogus_field"));
}

TEST(ModelConfigTest, BadEnumValueIsAnError) {
  auto cfg = ParseModelConfigText("input [ { name: \"x\" data_type: TYPE_FLOAT32 } ]", "c.pbtxt");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.status().message(), HasSubstr("c.pbtxt:1:"));
  EXPECT_THAT(cfg.status().message(), HasSubstr("TYPE_FLOAT32"));
}

TEST(ModelConfigTest, NormalizeFillsDefaults) {
  ModelConfig cfg;
  cfg.set_backend("onnxruntime");
  ASSERT_TRUE(NormalizeAndValidate(&cfg, "m").ok());
  EXPECT_EQ(cfg.name(), "m");
  EXPECT_EQ(cfg.platform(), "onnxruntime_onnx");
  ASSERT_EQ(cfg.instance_group_size(), 1);
  // Triton's: one KIND_AUTO group named after the model, its kind and count resolved where the
  // GPUs and the backend are known (repository::ResolveInstanceGroups, placement_test.cc).
  EXPECT_EQ(cfg.instance_group(0).count(), 0);
  EXPECT_EQ(cfg.instance_group(0).kind(), inference::ModelInstanceGroup::KIND_AUTO);
  EXPECT_EQ(cfg.instance_group(0).name(), "m");
  EXPECT_EQ(cfg.version_policy().latest().num_versions(), 1u);
  EXPECT_EQ(cfg.default_model_filename(), "model.onnx");
}

// What Triton core's NormalizeModelConfig writes, so the config clients read back is
// tritonserver's (Triton's qa/L0_model_config expected files carry each of these).
TEST(ModelConfigTest, NormalizeFillsTritonsSchedulingAndOptimizationDefaults) {
  auto cfg = ParseModelConfigText(R"(
backend: "identity"
max_batch_size: 8
dynamic_batching { }
optimization { output_pinned_memory { enable: false } }
)", "c.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(NormalizeAndValidate(&*cfg, "m").ok());
  ASSERT_EQ(cfg->dynamic_batching().preferred_batch_size_size(), 1);
  EXPECT_EQ(cfg->dynamic_batching().preferred_batch_size(0), 8);
  EXPECT_TRUE(cfg->optimization().input_pinned_memory().enable());
  EXPECT_TRUE(cfg->optimization().has_output_pinned_memory());
  EXPECT_FALSE(cfg->optimization().output_pinned_memory().enable());  // the config's own
  EXPECT_FALSE(cfg->has_model_transaction_policy());

  // Sizes the config names are kept; an unbatched model gets none.
  cfg = ParseModelConfigText(R"(
backend: "identity"
max_batch_size: 8
sequence_batching { oldest { max_candidate_sequences: 4 } }
)", "c.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(NormalizeAndValidate(&*cfg, "m").ok());
  EXPECT_EQ(cfg->sequence_batching().max_sequence_idle_microseconds(), 1000000u);
  ASSERT_EQ(cfg->sequence_batching().oldest().preferred_batch_size_size(), 1);
  EXPECT_EQ(cfg->sequence_batching().oldest().preferred_batch_size(0), 8);

  cfg = ParseModelConfigText(R"(
backend: "identity"
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 2, 4 ] }
)", "c.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(NormalizeAndValidate(&*cfg, "m").ok());
  EXPECT_EQ(cfg->dynamic_batching().preferred_batch_size_size(), 2);

  cfg = ParseModelConfigText("backend: \"identity\"\nsequence_batching { max_sequence_idle_microseconds: 5 }",
                             "c.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(NormalizeAndValidate(&*cfg, "m").ok());
  EXPECT_EQ(cfg->sequence_batching().max_sequence_idle_microseconds(), 5u);
  EXPECT_EQ(cfg->sequence_batching().oldest().preferred_batch_size_size(), 0);

  // An ensemble: no optimization (Triton refuses one there), model_transaction_policy written.
  cfg = ParseModelConfigText(R"(
platform: "ensemble"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "a" model_version: -1
  input_map { key: "IN" value: "x" } output_map { key: "OUT" value: "y" } } ] }
)", "c.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(NormalizeAndValidate(&*cfg, "e").ok());
  EXPECT_FALSE(cfg->has_optimization());
  EXPECT_TRUE(cfg->has_model_transaction_policy());
  EXPECT_FALSE(cfg->model_transaction_policy().decoupled());
  EXPECT_THAT(ModelConfigToJson(*cfg), HasSubstr(R"("model_transaction_policy":{"decoupled":false})"));
}

// Triton's AutoCompleteBackendFields: default_model_filename "model.pt" only for a config that
// gives backend "pytorch" and no platform; the file opened is model.pt either way.
TEST(ModelConfigTest, PyTorchFilenameAsTritonFillsIt) {
  ModelConfig by_backend;
  by_backend.set_backend("pytorch");
  ASSERT_TRUE(NormalizeAndValidate(&by_backend, "m").ok());
  EXPECT_EQ(by_backend.platform(), "pytorch_libtorch");
  EXPECT_EQ(by_backend.default_model_filename(), "model.pt");

  ModelConfig by_platform;
  by_platform.set_platform("pytorch_libtorch");
  ASSERT_TRUE(NormalizeAndValidate(&by_platform, "m").ok());
  EXPECT_EQ(by_platform.backend(), "pytorch");
  EXPECT_EQ(by_platform.default_model_filename(), "");
  EXPECT_EQ(ModelFilename(by_platform), "model.pt");

  ModelConfig named;
  named.set_platform("pytorch_libtorch");
  named.set_default_model_filename("traced.pt");
  EXPECT_EQ(ModelFilename(named), "traced.pt");
  ModelConfig onnx;
  onnx.set_platform("onnxruntime_onnx");
  EXPECT_EQ(ModelFilename(onnx), "model.onnx");
  ModelConfig identity;
  identity.set_backend("identity");
  EXPECT_EQ(ModelFilename(identity), "");
}

TEST(ModelConfigTest, BackendFromModelNameAsTritonsCustomBackendAutoComplete) {
  ModelConfig cfg;
  ASSERT_TRUE(BackendFromModelName("my_model.identity", &cfg).ok());
  EXPECT_EQ(cfg.backend(), "identity");
  EXPECT_EQ(cfg.default_model_filename(), "model.identity");
  ModelConfig dotted;
  ASSERT_TRUE(BackendFromModelName("a.b.c", &dotted).ok());
  EXPECT_EQ(dotted.backend(), "b.c");  // after the first '.', as Triton's
  ModelConfig none;
  absl::Status st = BackendFromModelName("plain", &none);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("model 'plain'"));
  EXPECT_THAT(st.message(), HasSubstr("'<model>.<backend>'"));
  EXPECT_FALSE(BackendFromModelName("trailing.", &none).ok());
}

// Triton's ValidateModelConfig refuses these too (qa/L0_model_config preserve_ordering*).
TEST(ModelConfigTest, PreserveOrderingRefusesPrioritiesAndDelays) {
  const std::string head = "backend: \"identity\" max_batch_size: 4 ";
  for (const std::string& db : {
           std::string("preserve_ordering: true priority_levels: 2 default_priority_level: 1"),
           std::string("preserve_ordering: true default_queue_policy { timeout_action: DELAY "
                       "default_timeout_microseconds: 100 }"),
           std::string("preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
                       "priority_queue_policy { key: 1 value: { timeout_action: DELAY "
                       "default_timeout_microseconds: 100 } }")}) {
    auto cfg = ParseModelConfigText(head + "dynamic_batching { " + db + " }", "c.pbtxt");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    absl::Status st = NormalizeAndValidate(&*cfg, "m");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << db;
    EXPECT_THAT(st.message(), HasSubstr("preserve_ordering")) << db;
  }
  // A DELAY that never times out (no timeout) and one level are fine, as in Triton.
  auto cfg = ParseModelConfigText(head + "dynamic_batching { preserve_ordering: true "
                                  "priority_levels: 1 default_priority_level: 1 "
                                  "default_queue_policy { timeout_action: DELAY } }", "c.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(NormalizeAndValidate(&*cfg, "m").ok());
}

TEST(ModelConfigTest, NormalizeRejectsInconsistentConfigs) {
  struct Case {
    const char* text;
    const char* message;
  } cases[] = {
      {"name: \"other\" backend: \"identity\"", "must match the directory name"},
      {"platform: \"onnxruntime_onnx\" backend: \"pytorch\"", "does not match backend"},
      {"backend: \"identity\" max_batch_size: -2", "max_batch_size"},
      {"backend: \"identity\" input [{name: \"a\" data_type: TYPE_FP32 dims: [0]}]", "dims must be positive"},
      {"backend: \"identity\" input [{name: \"a\" data_type: TYPE_FP32 dims: [2]}, {name: \"a\" data_type: TYPE_FP32 dims: [2]}]", "declared twice"},
      {"backend: \"identity\" input [{name: \"a\" dims: [2]}]", "data_type"},
      {"backend: \"identity\" max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }", "preferred_batch_size 8"},
      {"backend: \"identity\" dynamic_batching { }", "requires max_batch_size"},
      {"backend: \"identity\" input [{name: \"a\" data_type: TYPE_FP32 dims: [2, 3] reshape: { shape: [5] }}]", "reshape"},
      {"platform: \"tensorflow_lite\"", "unknown platform"},
  };
  for (const auto& c : cases) {
    auto cfg = ParseModelConfigText(c.text, "config.pbtxt");
    ASSERT_TRUE(cfg.ok()) << c.text << ": " << cfg.status();
    absl::Status st = NormalizeAndValidate(&*cfg, "m");
    EXPECT_FALSE(st.ok()) << c.text;
    EXPECT_THAT(st.message(), HasSubstr(c.message)) << c.text;
  }
}

// The whole message of each check inputs and outputs share, for both kinds (one function
// serves both: the kind must still be named right).
TEST(ModelConfigTest, InputAndOutputChecksNameTheKind) {
  struct Case {
    const char* text;
    const char* message;
  } cases[] = {
      {"backend: \"identity\" input [{data_type: TYPE_FP32 dims: [2]}]",
       "model 'm': an input has no name"},
      {"backend: \"identity\" output [{data_type: TYPE_FP32 dims: [2]}]",
       "model 'm': an output has no name"},
      {"backend: \"identity\" input [{name: \"a\" data_type: TYPE_FP32 dims: [2]}, "
       "{name: \"a\" data_type: TYPE_FP32 dims: [2]}]",
       "model 'm': input 'a' is declared twice"},
      {"backend: \"identity\" output [{name: \"a\" data_type: TYPE_FP32 dims: [2]}, "
       "{name: \"a\" data_type: TYPE_FP32 dims: [2]}]",
       "model 'm': output 'a' is declared twice"},
      {"backend: \"identity\" input [{name: \"a\" dims: [2]}]",
       "model 'm': input 'a' must set 'data_type'"},
      {"backend: \"identity\" output [{name: \"a\" dims: [2]}]",
       "model 'm': output 'a' must set 'data_type'"},
  };
  for (const auto& c : cases) {
    auto cfg = ParseModelConfigText(c.text, "config.pbtxt");
    ASSERT_TRUE(cfg.ok()) << c.text << ": " << cfg.status();
    absl::Status st = NormalizeAndValidate(&*cfg, "m");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(st.message(), c.message) << c.text;
  }
  // An input and an output may share a name (Triton allows it).
  auto cfg = ParseModelConfigText(
      "backend: \"identity\" input [{name: \"a\" data_type: TYPE_FP32 dims: [2]}] "
      "output [{name: \"a\" data_type: TYPE_FP32 dims: [2]}]",
      "config.pbtxt");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(NormalizeAndValidate(&*cfg, "m").ok());
}

TEST(ModelConfigTest, JsonPrintsIntegersAsNumbersAndEveryField) {
  auto cfg = ParseModelConfigText(
      "name: \"m\" max_batch_size: 4 input [{name: \"a\" data_type: TYPE_FP32 dims: [3, -1]}]",
      "c");
  ASSERT_TRUE(cfg.ok());
  std::string json = ModelConfigToJson(*cfg);
  EXPECT_THAT(json, HasSubstr("\"dims\":[3,-1]"));
  EXPECT_THAT(json, HasSubstr("\"data_type\":\"TYPE_FP32\""));
  EXPECT_THAT(json, HasSubstr("\"max_batch_size\":4"));
  EXPECT_THAT(json, HasSubstr("\"optional\":false"));
  auto back = ParseModelConfigJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->input(0).dims(1), -1);
}

TEST(ModelConfigTest, JsonOverrideRejectsUnknownFields) {
  auto cfg = ParseModelConfigJson(R"({"name":"m","no_such_field":1})");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.status().message(), HasSubstr("no_such_field"));
}

// tritonserver's --model-config-name: configs/<name>.pbtxt where it exists, config.pbtxt else.
TEST(ModelConfigTest, ModelConfigPathPicksTheNamedConfig) {
  const std::string dir = ::testing::TempDir() + "/config_path_model";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/configs");
  std::ofstream(dir + "/config.pbtxt") << "name: \"m\"\n";
  std::ofstream(dir + "/configs/h100.pbtxt") << "name: \"m\"\n";
  EXPECT_EQ(ModelConfigPath(dir, ""), dir + "/config.pbtxt");
  EXPECT_EQ(ModelConfigPath(dir, "h100"), dir + "/configs/h100.pbtxt");
  EXPECT_EQ(ModelConfigPath(dir, "a10"), dir + "/config.pbtxt");  // not there: the default
  std::filesystem::create_directories(dir + "/configs/dir.pbtxt");  // not a file
  EXPECT_EQ(ModelConfigPath(dir, "dir"), dir + "/config.pbtxt");
  std::filesystem::remove_all(dir);
}

// Triton's rule for image layouts.
TEST(ModelConfigTest, ImageFormatNeedsThreeDims) {
  auto cfg = ParseModelConfigText(R"(
backend: "identity" max_batch_size: 1
input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 224, 224 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ])", "c");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  absl::Status st = NormalizeAndValidate(&*cfg, "m");
  EXPECT_THAT(st.message(), HasSubstr("input 'x' has format FORMAT_NCHW, which needs 3 dims, got 2"));
  cfg->mutable_input(0)->add_dims(3);
  EXPECT_TRUE(NormalizeAndValidate(&*cfg, "m").ok());
}

// Every load path goes through NormalizeAndValidate: it refuses what inferd would ignore
// (the whole table is tested in config_coverage_test.cc).
TEST(ModelConfigTest, NormalizeRefusesFieldsInferdWouldIgnore) {
  for (const char* field : {"sequence_batching { iterative_sequence: true }",
                            "instance_group [ { kind: KIND_MODEL } ]",
                            "model_repository_agents { agents [ { name: \"checksum\" } ] }",
                            "batch_input [ { kind: BATCH_ELEMENT_COUNT } ]"}) {
    auto cfg = ParseModelConfigText(std::string("backend: \"identity\" ") + field, "c");
    ASSERT_TRUE(cfg.ok()) << field << ": " << cfg.status();
    absl::Status st = NormalizeAndValidate(&*cfg, "m");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(st.message(), HasSubstr("is not supported by inferd")) << field;
  }
}

}  // namespace
}  // namespace inferd::config
