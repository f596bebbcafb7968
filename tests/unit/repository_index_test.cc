// The repository index on local folders: one pass over several repositories, Triton's
// duplicate rule without --model-namespacing, one model per repository's copy with it, and a
// repository that cannot be opened.
#include "repository/repository_index.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "repository/model.h"

namespace inferd::repository {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class RepositoryIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "inferd-index-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    a_ = (root_ / "a").string();
    b_ = (root_ / "b").string();
    AddModel(a_, "m");
    AddModel(a_, "x");
    AddModel(b_, "m");
    AddModel(b_, "y");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  static void AddModel(const std::string& repo, const std::string& name) {
    fs::create_directories(fs::path(repo) / name / "1");
    std::ofstream(fs::path(repo) / name / "config.pbtxt") << "backend: \"identity\"\n";
  }
  static std::vector<std::string> Keys(const RepositoryIndex::Scan& scan) {
    std::vector<std::string> keys;
    for (const auto& [k, listed] : scan.models) keys.push_back(k);
    return keys;
  }

  fs::path root_;
  std::string a_, b_;
};

TEST_F(RepositoryIndexTest, ANameTwoRepositoriesHoldIsADuplicate) {
  RepositoryIndex index(/*namespacing=*/false);
  ASSERT_TRUE(index.Open({a_, b_}, SourceOptions{}).ok());
  const RepositoryIndex::Scan scan = index.List();
  EXPECT_THAT(Keys(scan), ElementsAre("x", "y"));
  ASSERT_EQ(scan.duplicates.count("m"), 1u);
  EXPECT_THAT(scan.duplicates.at("m"), HasSubstr("model appears in two or more repositories"));
  EXPECT_THAT(scan.duplicates.at("m"), HasSubstr(a_));
  EXPECT_THAT(scan.duplicates.at("m"), HasSubstr(b_));
  EXPECT_THAT(scan.errors, IsEmpty());
  EXPECT_EQ(scan.models.at("x").source->url(), a_);
  EXPECT_EQ(scan.models.at("y").source->url(), b_);
  EXPECT_EQ(index.PlainName(NamespacedName(a_, "m")), NamespacedName(a_, "m"));  // no namespaces
}

TEST_F(RepositoryIndexTest, WithNamespacingEachCopyIsItsOwnModel) {
  RepositoryIndex index(/*namespacing=*/true);
  ASSERT_TRUE(index.Open({a_, b_}, SourceOptions{}).ok());
  const RepositoryIndex::Scan scan = index.List();
  const std::string am = NamespacedName(a_, "m"), bm = NamespacedName(b_, "m");
  EXPECT_EQ(scan.models.count(am), 1u);
  EXPECT_EQ(scan.models.count(bm), 1u);
  EXPECT_EQ(scan.models.count("x"), 1u);
  EXPECT_EQ(scan.models.count("m"), 0u);
  EXPECT_THAT(scan.duplicates, IsEmpty());
  EXPECT_EQ(scan.models.at(bm).model.name, "m");  // the repository's own name
  EXPECT_EQ(scan.models.at(bm).source->url(), b_);
  EXPECT_EQ(index.PlainName(am), "m");
  EXPECT_EQ(index.PlainName(bm), "m");
  EXPECT_EQ(index.PlainName("x"), "x");
  EXPECT_EQ(index.CopiesOf(scan, "m"), 2u);
  EXPECT_EQ(index.CopiesOf(scan, "x"), 0u);
}

TEST_F(RepositoryIndexTest, ARepositoryThatDoesNotExistIsNamed) {
  RepositoryIndex index(false);
  const std::string missing = (root_ / "nope").string();
  absl::Status st = index.Open({a_, missing}, SourceOptions{});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr(missing));
  EXPECT_EQ(index.sources().size(), 1u);  // the one that opened
}

TEST_F(RepositoryIndexTest, AModelAddedIsSeenByTheNextPass) {
  RepositoryIndex index(false);
  ASSERT_TRUE(index.Open({a_}, SourceOptions{}).ok());
  EXPECT_THAT(Keys(index.List()), ElementsAre("m", "x"));
  AddModel(a_, "z");
  EXPECT_THAT(Keys(index.List()), ElementsAre("m", "x", "z"));
}

}  // namespace
}  // namespace inferd::repository
