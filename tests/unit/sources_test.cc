// storage: safe archive extraction (archives written here with libarchive, including the
// hostile ones a model upload could carry), S3 URL parsing and addressing; and the SageMaker
// binary+json content-type parser.
#include <archive.h>
#include <archive_entry.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "frontends/sagemaker/sagemaker_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "repository/archive.h"
#include "repository/s3.h"

namespace inferd::repository {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Entry {
  std::string path;
  std::string contents;        // regular file contents
  mode_t type = AE_IFREG;
  std::string link_target;     // symlink or hard link target
};

// Writes a gzip-compressed tar archive holding `entries`, in order.
void WriteTarGz(const fs::path& out, const std::vector<Entry>& entries) {
  archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_pax_restricted(a);
  ASSERT_EQ(archive_write_open_filename(a, out.c_str()), ARCHIVE_OK);
  for (const auto& e : entries) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, e.path.c_str());
    archive_entry_set_filetype(entry, e.type);
    archive_entry_set_perm(entry, e.type == AE_IFDIR ? 0755 : 0644);
    if (e.type == AE_IFLNK) archive_entry_set_symlink(entry, e.link_target.c_str());
    if (e.type == AE_IFREG && !e.link_target.empty()) {
      archive_entry_set_hardlink(entry, e.link_target.c_str());
      archive_entry_set_size(entry, 0);
    } else {
      archive_entry_set_size(entry, e.type == AE_IFREG ? e.contents.size() : 0);
    }
    ASSERT_EQ(archive_write_header(a, entry), ARCHIVE_OK) << archive_error_string(a);
    if (e.type == AE_IFREG && !e.contents.empty() && e.link_target.empty()) {
      archive_write_data(a, e.contents.data(), e.contents.size());
    }
    archive_entry_free(entry);
  }
  archive_write_close(a);
  archive_write_free(a);
}

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class ArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("inferd_storage_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  absl::Status Extract(const std::vector<Entry>& entries, const ExtractLimits& limits = {}) {
    WriteTarGz(dir_ / "m.tar.gz", entries);
    return ExtractArchive((dir_ / "m.tar.gz").string(), (dir_ / "out").string(), limits);
  }
  fs::path dir_;
};

TEST_F(ArchiveTest, ExtractsAModelFolder) {
  ASSERT_TRUE(Extract({{"model/", "", AE_IFDIR},
                       {"model/config.pbtxt", "platform: \"onnxruntime_onnx\"\n"},
                       {"model/1/", "", AE_IFDIR},
                       {"model/1/model.onnx", std::string(100000, 'w')},
                       {"model/1/alias.onnx", "", AE_IFLNK, "model.onnx"}})
                  .ok());
  EXPECT_EQ(ReadFile(dir_ / "out/model/config.pbtxt"), "platform: \"onnxruntime_onnx\"\n");
  EXPECT_EQ(ReadFile(dir_ / "out/model/1/model.onnx"), std::string(100000, 'w'));
  // A link that stays inside the destination is kept.
  EXPECT_EQ(ReadFile(dir_ / "out/model/1/alias.onnx").size(), 100000u);
}

TEST_F(ArchiveTest, RefusesEntriesThatLeaveTheDestination) {
  for (const auto& bad : std::vector<std::vector<Entry>>{
           {{"../evil.txt", "x"}},
           {{"model/../../evil.txt", "x"}},
           {{"/tmp/inferd_absolute_evil.txt", "x"}},
           {{"model/link", "", AE_IFLNK, "/etc/passwd"}},
           {{"model/link", "", AE_IFLNK, "../../outside"}},
           {{"model/hard", "", AE_IFREG, "/etc/passwd"}},
       }) {
    fs::remove_all(dir_ / "out");
    absl::Status st = Extract(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad[0].path << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(bad[0].path)) << st;
  }
  EXPECT_FALSE(fs::exists(dir_ / "evil.txt"));
  EXPECT_FALSE(fs::exists("/tmp/inferd_absolute_evil.txt"));
}

TEST_F(ArchiveTest, RefusesDevicesAndFifos) {
  absl::Status st = Extract({{"model/fifo", "", AE_IFIFO}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("model/fifo"));
}

TEST_F(ArchiveTest, CapsTotalSizeAndEntryCount) {
  ExtractLimits limits;
  limits.max_total_bytes = 1000;
  absl::Status st = Extract({{"a", std::string(600, 'a')}, {"b", std::string(600, 'b')}}, limits);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("1000"));
  fs::remove_all(dir_ / "out");
  limits = {};
  limits.max_entries = 2;
  st = Extract({{"a", "1"}, {"b", "2"}, {"c", "3"}}, limits);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("2"));
}

TEST_F(ArchiveTest, CorruptArchiveIsInvalidArgument) {
  {
    std::ofstream f(dir_ / "m.tar.gz", std::ios::binary);
    f << "\x1f\x8b\x08\x00 this is not really gzip";
  }
  absl::Status st = ExtractArchive((dir_ / "m.tar.gz").string(), (dir_ / "out").string());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST(S3Test, ParsesUrlsAndBuildsAddresses) {
  auto loc = ParseS3Url("s3://my-bucket/models/resnet.tar.gz");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->bucket, "my-bucket");
  EXPECT_EQ(loc->key, "models/resnet.tar.gz");
  for (const char* bad : {"http://b/k", "s3://", "s3://bucket", "s3://bucket/", "s3:///key"}) {
    EXPECT_EQ(ParseS3Url(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  S3Config aws;
  aws.region = "eu-west-1";
  EXPECT_EQ(S3ObjectUrl(aws, *loc),
            "https://my-bucket.s3.eu-west-1.amazonaws.com/models/resnet.tar.gz");
  S3Config local;
  local.endpoint = "http://127.0.0.1:4569";
  EXPECT_EQ(S3ObjectUrl(local, *loc), "http://127.0.0.1:4569/my-bucket/models/resnet.tar.gz");
}

}  // namespace
}  // namespace inferd::repository

namespace inferd::sagemaker {
namespace {

TEST(SageMakerContentTypeTest, ParsesTheJsonHeaderSize) {
  const std::string prefix(kBinaryMimePrefix);
  auto n = ParseSageMakerContentType(prefix + "42", 100);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(**n, 42u);
  n = ParseSageMakerContentType(prefix + "7; charset=binary", 100);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(**n, 7u);
  // Not the binary media type: no header size, the body is JSON.
  n = ParseSageMakerContentType("application/json", 100);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->has_value());
}

TEST(SageMakerContentTypeTest, RejectsMalformedSizes) {
  const std::string prefix(kBinaryMimePrefix);
  auto st = ParseSageMakerContentType(prefix + "abc", 100).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "Unable to parse inference header size, got: abc");
  st = ParseSageMakerContentType(prefix + "101", 100).status();
  EXPECT_EQ(st.message(), "inference header size should be in range (0, 100), got: 101");
  st = ParseSageMakerContentType(prefix, 100).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  st = ParseSageMakerContentType(prefix + "-1", 100).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  st = ParseSageMakerContentType(prefix + "99999999999999999999999", 100).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  st = ParseSageMakerContentType("text/plain; " + prefix + "5", 100).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace inferd::sagemaker
