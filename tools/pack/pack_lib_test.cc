#include "tools/pack/pack_lib.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace inferd::pack {
namespace {

namespace fs = std::filesystem;

constexpr char kSimple[] = R"(# the quick-start model
name: "simple"  # keep me
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }
)";

TEST(RenameModelConfig, RenamesOnlyTheTopLevelNameAndKeepsTheRest) {
  auto out = RenameModelConfig(kSimple, "simple/config.pbtxt", "copy7", {});
  ASSERT_TRUE(out.ok()) << out.status();
  std::string expected = kSimple;
  expected.replace(expected.find("\"simple\""), 8, "\"copy7\"");
  EXPECT_EQ(*out, expected);  // comments, layout and the inputs' names untouched
}

TEST(RenameModelConfig, AddsANameWhenTheConfigHasNone) {
  auto out = RenameModelConfig("platform: \"onnxruntime_onnx\"\n", "c", "m0", {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "name: \"m0\"\nplatform: \"onnxruntime_onnx\"\n");
  auto empty = RenameModelConfig("", "c", "m1", {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "name: \"m1\"\n");
}

TEST(RenameModelConfig, RenamesEnsembleStepsInBothListForms) {
  constexpr char kEnsemble[] = R"(name: "pipe"
platform: "ensemble"
input { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "mid" } }
  ]
  step { model_name: 'main' model_version: -1 input_map { key: "name" value: "mid" } output_map { key: "z" value: "OUT" } }
}
)";
  auto out = RenameModelConfig(kEnsemble, "pipe/config.pbtxt", "p3",
                               {{"pre", "p3_pre"}, {"main", "p3_main"}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("name: \"p3\""), std::string::npos);
  EXPECT_NE(out->find("model_name: \"p3_pre\""), std::string::npos);
  EXPECT_NE(out->find("model_name: \"p3_main\""), std::string::npos);
  // A map key called "name" inside a step is not the model's name.
  EXPECT_NE(out->find("key: \"name\""), std::string::npos);
}

TEST(RenameModelConfig, ABrokenConfigIsRefusedWithTheParsersMessage) {
  auto out = RenameModelConfig("name: \"x\"\nmax_batch: 3\n", "m/config.pbtxt", "y", {});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("m/config.pbtxt:2"), std::string_view::npos)
      << out.status();
  EXPECT_NE(out.status().message().find("max_batch"), std::string_view::npos) << out.status();
}

TEST(ParsePackArgs, CopiesNeedAPrefixAndValidNames) {
  EXPECT_FALSE(ParsePackArgs({"--copies=3", "m"}).ok());
  EXPECT_FALSE(ParsePackArgs({"--copies=3", "--name-prefix=a/b", "m"}).ok());
  EXPECT_FALSE(ParsePackArgs({"--copies=0", "--name-prefix=p", "m"}).ok());
  EXPECT_FALSE(ParsePackArgs({"--upload=http://x", "m"}).ok());
  EXPECT_FALSE(ParsePackArgs({}).ok());
  auto o = ParsePackArgs({"--copies", "3", "--name-prefix=p", "-o", "out", "m"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->copies, 3);
  EXPECT_EQ(ArchiveModelNames(*o, "m"), (std::vector<std::string>{"p0", "p1", "p2"}));
  EXPECT_EQ(o->output_dir, "out");
  EXPECT_EQ(o->input, "m");
}

class PackDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/pack_lib_test.XXXXXX";
    ASSERT_NE(mkdtemp(t), nullptr);
    root_ = t;
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const fs::path& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  // (name, content) of every entry, in archive order.
  std::vector<std::pair<std::string, std::string>> Read(const fs::path& tgz) {
    std::vector<std::pair<std::string, std::string>> out;
    archive* a = archive_read_new();
    archive_read_support_filter_all(a);
    archive_read_support_format_all(a);
    EXPECT_EQ(archive_read_open_filename(a, tgz.c_str(), 65536), ARCHIVE_OK);
    archive_entry* e;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
      std::string data(static_cast<size_t>(archive_entry_size(e)), '\0');
      if (!data.empty()) archive_read_data(a, data.data(), data.size());
      out.emplace_back(archive_entry_pathname(e), data);
    }
    archive_read_free(a);
    return out;
  }
  fs::path root_;
};

TEST_F(PackDir, TheArchiveHasTheModelFolderAtItsTopAndIsReproducible) {
  Write("repo/m/config.pbtxt", "name: \"m\"\n");
  Write("repo/m/1/model.onnx", "weights");
  Write("repo/m/.hidden", "left out");
  std::vector<ArchiveMember> members{{"renamed", (root_ / "repo/m").string(), "name: \"renamed\"\n"}};
  ASSERT_TRUE(WriteModelArchive(members, (root_ / "a.tar.gz").string()).ok());
  auto entries = Read(root_ / "a.tar.gz");
  std::vector<std::pair<std::string, std::string>> expected{
      {"renamed/", ""}, {"renamed/1/", ""}, {"renamed/1/model.onnx", "weights"},
      {"renamed/config.pbtxt", "name: \"renamed\"\n"}};
  EXPECT_EQ(entries, expected);
  // Same input, same bytes (and so the same S3 ETag).
  sleep(1);
  fs::last_write_time(root_ / "repo/m/1/model.onnx", fs::file_time_type::clock::now());
  ASSERT_TRUE(WriteModelArchive(members, (root_ / "b.tar.gz").string()).ok());
  EXPECT_EQ(*FileSha256((root_ / "a.tar.gz").string()), *FileSha256((root_ / "b.tar.gz").string()));
}

TEST_F(PackDir, PlanFindsAnEnsemblesPartsInItsFolder) {
  Write("repo/pre/config.pbtxt", "name: \"pre\"\nbackend: \"identity\"\n");
  Write("repo/main/config.pbtxt", "name: \"main\"\nbackend: \"identity\"\n");
  Write("repo/unrelated/config.pbtxt", "name: \"unrelated\"\nbackend: \"identity\"\n");
  Write("repo/pipe/config.pbtxt",
        "name: \"pipe\"\nplatform: \"ensemble\"\nensemble_scheduling { step { model_name: \"pre\" } "
        "step { model_name: \"main\" } step { model_name: \"missing\" } }\n");
  fs::create_directories(root_ / "repo/pipe/1");
  auto plan = PlanPack((root_ / "repo").string(), "");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->model, "pipe");
  EXPECT_EQ(plan->parts, (std::vector<std::string>{"pre", "main"}));
  // The ensemble's own folder as the input: the parts come from beside it.
  auto direct = PlanPack((root_ / "repo/pipe/").string(), "");
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->repository, (root_ / "repo").string());
  EXPECT_EQ(direct->parts.size(), 2u);
  EXPECT_FALSE(PlanPack((root_ / "repo").string(), "nope").ok());
}

}  // namespace
}  // namespace inferd::pack
