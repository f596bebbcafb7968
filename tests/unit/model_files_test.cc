// config/model_files.h and common/rooted_dir.h: file-naming config fields resolve inside the
// model folder (lexically and through links), and the private-folder check (issue 27).
#include "config/model_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/rooted_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::config {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() /
            ("inferd_model_files_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    model_ = base_ / "m";
    fs::create_directories(model_ / "1");
    fs::create_directories(base_ / "m-sibling");
    std::ofstream(model_ / "labels.txt") << "a\n";
    std::ofstream(base_ / "m-sibling" / "labels.txt") << "secret\n";
  }
  void TearDown() override { fs::remove_all(base_); }
  fs::path base_, model_;
};

TEST_F(ModelFilesTest, InsideIsAccepted) {
  EXPECT_TRUE(ResolveInside(model_.string(), "label_filename", "labels.txt").ok());
  EXPECT_TRUE(ResolveInside(model_.string(), "label_filename", "./1/../labels.txt").ok());
  EXPECT_TRUE(ResolveInside(model_.string(), "f", (model_ / "labels.txt").string()).ok());
}

TEST_F(ModelFilesTest, LexicalEscapesAreRefused) {
  for (const char* bad : {"../../../etc/passwd", "..", "1/../../m-sibling/labels.txt", "/etc/passwd",
                          "../m-sibling/labels.txt"}) {
    auto r = ResolveInside(model_.string(), "label_filename", bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("label_filename")) << bad;
  }
  // A NUL byte: open() would stop there (found by config_files_fuzz).
  EXPECT_FALSE(
      ResolveInside(model_.string(), "label_filename", std::string("x\0/../../../etc/passwd", 22)).ok());
  // The sibling whose name starts with the folder's: a prefix test without '/' let it by.
  EXPECT_FALSE(ResolveInside(model_.string(), "f", (base_ / "m-sibling/labels.txt").string()).ok());
}

TEST_F(ModelFilesTest, LinksOutAreRefused) {
  fs::create_symlink("/etc/passwd", model_ / "passwd");
  fs::create_directory_symlink("../m-sibling", model_ / "sib");
  fs::create_directory_symlink("1", model_ / "one");
  EXPECT_FALSE(ResolveInside(model_.string(), "label_filename", "passwd").ok());
  EXPECT_FALSE(ResolveInside(model_.string(), "label_filename", "sib/labels.txt").ok());
  EXPECT_TRUE(ResolveInside(model_.string(), "label_filename", "one/x").ok());
  // ".." after a link climbs from where the link leads (found by config_files_fuzz): checked
  // as the kernel resolves it, not as the text normalizes.
  fs::create_directories(model_ / "warmup");
  fs::create_directory_symlink("../1", model_ / "warmup" / "w");
  EXPECT_FALSE(ResolveInside((model_ / "warmup").string(), "input_data_file", "w/../x").ok());
  // A component that does not exist, then "..", then a link out (found by config_files_fuzz).
  EXPECT_FALSE(ResolveInside(model_.string(), "label_filename", "nothing/../passwd").ok());
  // And a link out of warmup/ leaves warmup/, even to elsewhere in the model.
  EXPECT_FALSE(ResolveInside((model_ / "warmup").string(), "input_data_file", "w/x").ok());
}

TEST_F(ModelFilesTest, EveryFieldIsChecked) {
  auto refused = [&](const std::string& text, const std::string& field) {
    ModelConfig cfg = *ParseModelConfigText(text, "config.pbtxt");
    absl::Status st = CheckFilesInsideModel(cfg, model_.string(), {1});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(st.message()), HasSubstr(field)) << text;
  };
  refused(R"(output [{ name: "o" data_type: TYPE_FP32 dims: [1] label_filename: "../x" }])",
          "label_filename");
  refused(R"(default_model_filename: "../../other/1/model.onnx")", "default_model_filename");
  refused(R"(default_model_filename: "../labels.txt")", "default_model_filename");
  refused(R"(model_warmup [{ name: "w" inputs { key: "i" value { data_type: TYPE_FP32 dims: [1]
            input_data_file: "../../x" } } }])",
          "input_data_file");
  refused(R"(sequence_batching { state [{ input_name: "a" output_name: "b" data_type: TYPE_FP32
            dims: [1] initial_state [{ data_type: TYPE_FP32 dims: [1] data_file: "../../x" }] }] })",
          "data_file");
  refused(R"(parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/opt/env.tar.gz" } })",
          "EXECUTION_ENV_PATH");
  refused(R"(parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/../e.tar.gz" } })",
          "EXECUTION_ENV_PATH");
  refused(R"(parameters { key: "optimized_model_filepath" value { string_value: "opt.onnx" } })",
          "optimized_model_filepath");
  ModelConfig ok = *ParseModelConfigText(
      R"(default_model_filename: "model.onnx"
         output [{ name: "o" data_type: TYPE_FP32 dims: [1] label_filename: "labels.txt" }]
         parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } })",
      "config.pbtxt");
  EXPECT_TRUE(CheckFilesInsideModel(ok, model_.string(), {1}).ok());
}

TEST_F(ModelFilesTest, PrivateDirIsCreated0700AndOthersAreRefused) {
  const fs::path p = base_ / "cache" / "inner";
  ASSERT_TRUE(EnsurePrivateDir(p.string(), "--model-cache-dir").ok());
  struct stat st;
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((base_ / "cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ::chmod(p.c_str(), 0777);
  absl::Status s = EnsurePrivateDir(p.string(), "--model-cache-dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("chmod go-w"));
  ::chmod(p.c_str(), 0700);
  // A world-writable parent without the sticky bit: its owner's neighbours could swap it.
  ::chmod((base_ / "cache").c_str(), 0777);
  EXPECT_FALSE(EnsurePrivateDir(p.string(), "--model-cache-dir").ok());
  ::chmod((base_ / "cache").c_str(), 01777);
  EXPECT_TRUE(EnsurePrivateDir(p.string(), "--model-cache-dir").ok());
  // A link is not a folder of one's own.
  fs::create_directory_symlink(p, base_ / "link");
  EXPECT_FALSE(EnsurePrivateDir((base_ / "link").string(), "--model-cache-dir").ok());
}

}  // namespace
}  // namespace inferd::config
