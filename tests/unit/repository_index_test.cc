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

// ---- a poll's diff -----------------------------------------------------------------------------

std::vector<std::string> ChangedKeys(const RepositoryIndex::Diff& diff) {
  std::vector<std::string> keys;
  for (const auto& [k, listed] : diff.changed) keys.push_back(k);
  return keys;
}

RepositoryIndex::Listed ListedAs(const std::string& name, const std::string& fingerprint,
                                 bool archive = false) {
  return {nullptr, SourceModel{name, fingerprint, archive}};
}

TEST(RepositoryIndexDiffTest, NewChangedAndRemovedModels) {
  RepositoryIndex index(/*namespacing=*/false);
  RepositoryIndex::Scan scan;
  scan.models["same"] = ListedAs("same", "f1");
  scan.models["edited"] = ListedAs("edited", "f2");
  scan.models["new"] = ListedAs("new", "f1");
  scan.models["pack.tar.gz"] = ListedAs("pack.tar.gz", "f1", /*archive=*/true);
  std::map<std::string, RepositoryIndex::Held, std::less<>> held;
  held["same"] = {"f1", true, {}};
  held["edited"] = {"f1", true, {}};
  held["gone"] = {"f1", true, {}};
  held["on_demand"] = {"f1", false, {}};  // loaded on demand or from a URL: a poll leaves it
  const RepositoryIndex::Diff diff = index.Compare(scan, held);
  EXPECT_THAT(diff.removed, ElementsAre("gone"));
  EXPECT_THAT(ChangedKeys(diff), ElementsAre("edited", "new"));
  EXPECT_EQ(diff.changed.at("edited").model.fingerprint, "f2");
}

TEST(RepositoryIndexDiffTest, NothingChangedIsAnEmptyDiff) {
  RepositoryIndex index(/*namespacing=*/false);
  RepositoryIndex::Scan scan;
  scan.models["m"] = ListedAs("m", "f1");
  std::map<std::string, RepositoryIndex::Held, std::less<>> held;
  held["m"] = {"f1", true, {}};
  const RepositoryIndex::Diff diff = index.Compare(scan, held);
  EXPECT_THAT(diff.removed, IsEmpty());
  EXPECT_THAT(ChangedKeys(diff), IsEmpty());
}

// Under --model-namespacing, "x" gaining a second copy changes its key: the ensemble that runs
// it is reloaded (its steps resolve again) though its own files did not change.
TEST_F(RepositoryIndexTest, ANameThatChangesKeyReloadsTheEnsemblesThatRunIt) {
  AddModel(a_, "e");
  RepositoryIndex index(/*namespacing=*/true);
  ASSERT_TRUE(index.Open({a_, b_}, SourceOptions{}).ok());
  const RepositoryIndex::Scan before = index.List();
  ASSERT_EQ(before.models.count("x"), 1u);
  std::map<std::string, RepositoryIndex::Held, std::less<>> held;
  for (const auto& [key, listed] : before.models) held[key] = {listed.model.fingerprint, true, {}};
  held["e"].steps = {"x"};
  EXPECT_THAT(ChangedKeys(index.Compare(before, held)), IsEmpty());

  AddModel(b_, "x");
  const RepositoryIndex::Diff diff = index.Compare(index.List(), held);
  EXPECT_THAT(diff.removed, ElementsAre("x"));
  EXPECT_THAT(ChangedKeys(diff), ElementsAre(a_ + "::x", b_ + "::x", "e"));

  // Without namespacing the same change makes "x" a duplicate: removed, and "e" is left alone.
  RepositoryIndex plain(/*namespacing=*/false);
  ASSERT_TRUE(plain.Open({a_, b_}, SourceOptions{}).ok());
  const RepositoryIndex::Diff plain_diff = plain.Compare(plain.List(), held);
  EXPECT_EQ(plain_diff.changed.count("e"), 0u);
}

// Locate asks the repositories in order, skips the ones that do not hold the name, and stops
// at a fetch that fails otherwise.
TEST_F(RepositoryIndexTest, LocateFetchesFromTheFirstRepositoryThatHoldsTheName) {
  RepositoryIndex index(/*namespacing=*/false);
  ASSERT_TRUE(index.Open({a_, b_}, SourceOptions{}).ok());
  std::vector<std::string> asked;
  auto fetch = [&](Source* source, const std::string& name, FetchStats* stats) {
    asked.push_back(source->url());
    return source->Fetch(name, stats);
  };
  auto y = index.Locate("y", fetch);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->source, index.sources()[1].get());
  EXPECT_EQ(y->source_name, "y");
  EXPECT_TRUE(fs::exists(fs::path(y->dir) / "config.pbtxt")) << y->dir;
  EXPECT_EQ(asked.size(), 2u);  // a: NOT_FOUND, then b

  asked.clear();
  auto m = index.Locate("m", fetch);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->source, index.sources()[0].get());  // the first that holds it
  EXPECT_EQ(asked.size(), 1u);

  auto none = index.Locate("nope", fetch);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("Request for unknown model: 'nope' is not found"));
  EXPECT_THAT(none.status().message(), HasSubstr(a_));
  EXPECT_THAT(none.status().message(), HasSubstr(b_));

  auto broken = index.Locate("y", [](Source*, const std::string&, FetchStats*)
                                      -> absl::StatusOr<std::string> {
    return absl::UnavailableError("bucket unreachable");
  });
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RepositoryIndexTest, LocateUrlTakesAFolderInPlaceAndRefusesWhatNamesNoModel) {
  int fetches = 0;
  auto fetch = [&](Source* source, const std::string& name, FetchStats* stats) {
    ++fetches;
    return source->Fetch(name, stats);
  };
  auto folder = RepositoryIndex::LocateUrl((fs::path(a_) / "x").string(), SourceOptions{}, fetch);
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(folder->dir, (fs::path(a_) / "x").string());
  EXPECT_EQ(folder->source, nullptr);
  EXPECT_EQ(fetches, 0);  // a folder is used in place

  std::ofstream(root_ / "notes.txt") << "hello";
  for (const std::string& bad :
       {(root_ / "missing").string(), (root_ / "notes.txt").string(), std::string("s3://bucket"),
        std::string("s3:///key")}) {
    auto r = RepositoryIndex::LocateUrl(bad, SourceOptions{}, fetch);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(bad));
  }
  EXPECT_EQ(fetches, 0);
}

}  // namespace
}  // namespace inferd::repository
