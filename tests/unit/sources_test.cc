// repository sources: safe archive extraction (archives written here with libarchive,
// including the hostile ones a model upload could carry), from a file and from a stream; S3
// URLs, listings and key safety without a network; the S3 source against a real S3 server
// (npm s3rver on loopback, skipped when scripts/setup.sh has not installed it) and against a
// fake one that fails on purpose; and the SageMaker binary+json content-type parser.
#include <archive.h>
#include <archive_entry.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <random>
#include <sstream>
#include <thread>

#include "frontends/sagemaker/sagemaker_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/rooted_dir.h"
#include "repository/archive.h"
#include "repository/model_cache.h"
#include "repository/s3.h"
#include "repository/s3_source.h"
#include "repository/source.h"

extern char** environ;

namespace inferd::repository {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Entry {
  // A constructor rather than an aggregate, so {"path", "contents"} leaves the rest at their
  // defaults without -Wmissing-field-initializers.
  Entry(std::string p, std::string c = "", mode_t t = AE_IFREG, std::string l = "")
      : path(std::move(p)), contents(std::move(c)), type(t), link_target(std::move(l)) {}
  std::string path;
  std::string contents;  // regular file contents
  mode_t type = AE_IFREG;
  std::string link_target;  // symlink or hard link target
};

// Writes a gzip-compressed tar archive holding `entries`, in order.
void WriteTarGz(const fs::path& out, const std::vector<Entry>& entries, bool gzip = true) {
  archive* a = archive_write_new();
  if (gzip) archive_write_add_filter_gzip(a);
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
           ("inferd_sources_test_" + std::to_string(::getpid()) + "_" +
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

// Everything under `dir` (files, folders, links), by path relative to it.
std::set<std::string> ListAll(const fs::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    out.insert(fs::relative(it->path(), dir).string());
  }
  return out;
}

// Issue 27: links extracted earlier must not carry later entries out of the destination,
// with openat2 (RESOLVE_BENEATH) and with the component-by-component walk alike.
class ArchiveLinkTest : public ArchiveTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    ArchiveTest::SetUp();
    RootedDir::ForceNoOpenat2ForTesting(GetParam());
  }
  void TearDown() override {
    RootedDir::ForceNoOpenat2ForTesting(false);
    ArchiveTest::TearDown();
  }
  // Extracts into dir_/out and checks nothing appeared beside it.
  absl::Status ExtractContained(const std::vector<Entry>& entries) {
    WriteTarGz(dir_ / "m.tar.gz", entries);
    const std::set<std::string> before = ListAll(dir_);
    absl::Status st = ExtractArchive((dir_ / "m.tar.gz").string(), (dir_ / "out").string());
    std::set<std::string> after;
    for (const std::string& p : ListAll(dir_)) {
      if (p != "out" && p.rfind("out/", 0) != 0) after.insert(p);
    }
    std::set<std::string> expected;
    for (const std::string& p : before) {
      if (p != "out" && p.rfind("out/", 0) != 0) expected.insert(p);
    }
    EXPECT_EQ(after, expected) << "something was created outside " << (dir_ / "out");
    return st;
  }
};

TEST_P(ArchiveLinkTest, LinkChainCannotClimbOut) {
  // 588 bytes in the issue: each link alone resolves inside its folder's text, together they
  // climb one level per link.
  absl::Status st = ExtractContained({{"a/", "", AE_IFDIR},
                                      {"a/l1", "", AE_IFLNK, ".."},
                                      {"a/l1/l2", "", AE_IFLNK, ".."},
                                      {"a/l1/l2/l3", "", AE_IFLNK, ".."},
                                      {"a/l1/l2/l3/x/", "", AE_IFDIR},
                                      {"a/l1/l2/l3/x/y/", "", AE_IFDIR},
                                      {"a/l1/l2/l3/x/y/f", "pwned"}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("a/l1/l2"));
  EXPECT_FALSE(fs::exists(dir_ / "x"));
}

TEST_P(ArchiveLinkTest, DirectoriesBelowAChainStayInside) {
  // The same chain, directories first and the links last, then in reverse: no order helps.
  for (bool links_first : {true, false}) {
    fs::remove_all(dir_ / "out");
    std::vector<Entry> links = {{"a/l1", "", AE_IFLNK, ".."},
                                {"a/l1/l2", "", AE_IFLNK, ".."},
                                {"a/l1/l2/l3", "", AE_IFLNK, ".."}};
    std::vector<Entry> dirs = {{"a/l1/x/", "", AE_IFDIR}, {"a/l1/l2/x/y/", "", AE_IFDIR}};
    std::vector<Entry> all = {{"a/", "", AE_IFDIR}};
    for (const auto& part : links_first ? std::vector{links, dirs} : std::vector{dirs, links}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    absl::Status st = ExtractContained(all);
    EXPECT_FALSE(st.ok());
  }
}

TEST_P(ArchiveLinkTest, SecondArchiveCannotPlantALinkOutside) {
  // The first archive leaves a link to its folder's parent in the cache (refused now); the
  // second writes a link through it. Each extraction is refused on its own.
  absl::Status first = ExtractContained({{"m/", "", AE_IFDIR}, {"m/up", "", AE_IFLNK, "../.."}});
  EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument) << first;
  fs::remove_all(dir_ / "out");
  absl::Status second = ExtractContained({{"m/", "", AE_IFDIR},
                                          {"m/l", "", AE_IFLNK, ".."},
                                          {"m/l/l", "", AE_IFLNK, ".."},
                                          {"m/l/l/authorized_keys", "", AE_IFLNK, "m/key"},
                                          {"m/key", "ssh-ed25519 AAAA attacker"}});
  EXPECT_EQ(second.code(), absl::StatusCode::kInvalidArgument) << second;
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / "authorized_keys")));
}

TEST_P(ArchiveLinkTest, SiblingWithTheRootsNameAsPrefixIsOutside) {
  // dir_/out-sibling starts with dir_/out: a prefix test without the trailing '/' let it by.
  absl::Status st = ExtractContained({{"a/", "", AE_IFDIR},
                                      {"a/l1", "", AE_IFLNK, ".."},
                                      {"a/l1/l2", "", AE_IFLNK, ".."},
                                      {"a/l1/l2/out-sibling/f", "pwned"}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_FALSE(fs::exists(dir_ / "out-sibling"));
}

TEST_P(ArchiveLinkTest, LinksThatStayInsideStillWork) {
  ASSERT_TRUE(ExtractContained({{"m/", "", AE_IFDIR},
                                {"m/1/", "", AE_IFDIR},
                                {"m/1/model.onnx", "weights"},
                                {"m/2", "", AE_IFLNK, "1"},
                                {"m/3/", "", AE_IFDIR},
                                {"m/3/model.onnx", "", AE_IFLNK, "../1/model.onnx"}})
                  .ok());
  EXPECT_EQ(ReadFile(dir_ / "out/m/2/model.onnx"), "weights");
  EXPECT_EQ(ReadFile(dir_ / "out/m/3/model.onnx"), "weights");
  // A ".." after a name is refused: through a link it climbs from wherever the link leads.
  fs::remove_all(dir_ / "out");
  EXPECT_FALSE(ExtractContained({{"m/1/f", "x"}, {"m/l", "", AE_IFLNK, "1/../1/f"}}).ok());
}

INSTANTIATE_TEST_SUITE_P(Openat2AndWalk, ArchiveLinkTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "walk" : "openat2"; });

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

// The cache's cap: least recently used first, never one in use, one just used, or the new one.
TEST_F(ArchiveTest, CacheCapTrimsLeastRecentlyUsedEntriesNotInUse) {
  const fs::path cache = dir_ / "cache";
  auto entry = [&](const std::string& rel, size_t bytes, int age_s) {
    const fs::path p = cache / rel;
    fs::create_directories(p);
    std::ofstream(p / "model.onnx") << std::string(bytes, 'x');
    std::ofstream(p.string() + ".done") << "";
    const auto t = fs::file_time_type::clock::now() - std::chrono::seconds(age_s);
    fs::last_write_time(p, t);
  };
  entry("local/old.tar.gz@1-1", 1000, 3600);
  entry("local/used.tar.gz@1-1", 1000, 7200);
  entry("s3/b/p/older@abc", 1000, 5400);
  entry("local/recent.tar.gz@1-1", 1000, 5);
  entry("local/new.tar.gz@1-1", 1000, 0);
  fs::create_directories(cache / "local" / "x.tar.gz@1-1.partial");  // not an entry
  ModelCacheCap cap(cache.string(), 3000);
  cap.SetInUse([&](const std::string& e) { return e == (cache / "local/used.tar.gz@1-1").string(); });
  EXPECT_EQ(cap.ListEntries().size(), 5u);
  EXPECT_EQ(cap.Trim((cache / "local/new.tar.gz@1-1").string()), 2000u);
  EXPECT_FALSE(fs::exists(cache / "s3/b/p/older@abc"));         // the oldest not in use
  EXPECT_FALSE(fs::exists(cache / "s3/b/p/older@abc.done"));
  EXPECT_FALSE(fs::exists(cache / "local/old.tar.gz@1-1"));     // then the next
  EXPECT_TRUE(fs::exists(cache / "local/used.tar.gz@1-1"));     // in use, though oldest
  EXPECT_TRUE(fs::exists(cache / "local/recent.tar.gz@1-1"));   // used seconds ago
  EXPECT_TRUE(fs::exists(cache / "local/new.tar.gz@1-1"));      // just made
  EXPECT_TRUE(fs::exists(cache / "local/x.tar.gz@1-1.partial"));
  // Under the cap: nothing more goes.
  EXPECT_EQ(cap.Trim(""), 0u);
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

// ---- streaming extraction ---------------------------------------------------------------------

// Every regular file under `dir`, by path relative to it.
std::map<std::string, std::string> ReadTree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = ReadFile(e.path());
  }
  return out;
}

std::map<std::string, std::string> RegularFiles(const std::vector<Entry>& entries) {
  std::map<std::string, std::string> out;
  for (const auto& e : entries) {
    if (e.type == AE_IFREG && e.link_target.empty()) out[e.path] = e.contents;
  }
  return out;
}

// Bytes that gzip cannot shrink, so an archive of them is as large as they are.
std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

// An ArchiveChunkReader over `bytes` in chunks of `chunk` bytes, then `end` (the end of the
// stream, or an error).
ArchiveChunkReader ChunksOf(const std::string& bytes, size_t chunk,
                            absl::StatusOr<std::string_view> end = std::string_view()) {
  auto pos = std::make_shared<size_t>(0);
  return [&bytes, chunk, end, pos]() -> absl::StatusOr<std::string_view> {
    if (*pos >= bytes.size()) return end;
    std::string_view out = std::string_view(bytes).substr(*pos, chunk);
    *pos += out.size();
    return out;
  };
}

const std::vector<Entry>& SampleModel() {
  static const std::vector<Entry> entries = {
      {"model/", "", AE_IFDIR},
      {"model/config.pbtxt", "platform: \"onnxruntime_onnx\"\n"},
      {"model/1/", "", AE_IFDIR},
      {"model/1/model.onnx", RandomBytes(300000, 1)},
      {"model/1/zeros.bin", std::string(200000, '\0')},
  };
  return entries;
}

TEST_F(ArchiveTest, StreamExtractsWhatTheFileExtractionDoes) {
  WriteTarGz(dir_ / "m.tar.gz", SampleModel());
  const std::string bytes = ReadFile(dir_ / "m.tar.gz");
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{65536}, bytes.size()}) {
    const fs::path out = dir_ / ("out" + std::to_string(chunk));
    absl::Status st = ExtractArchiveStream(ChunksOf(bytes, chunk), "s3://b/m.tar.gz", out.string());
    ASSERT_TRUE(st.ok()) << chunk << ": " << st;
    EXPECT_EQ(ReadTree(out), RegularFiles(SampleModel())) << chunk;
  }
}

TEST_F(ArchiveTest, StreamKeepsTheSafetyRules) {
  WriteTarGz(dir_ / "m.tar.gz", {{"../evil.txt", "x"}});
  const std::string bytes = ReadFile(dir_ / "m.tar.gz");
  absl::Status st =
      ExtractArchiveStream(ChunksOf(bytes, 100), "s3://b/m.tar.gz", (dir_ / "out").string());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("../evil.txt"));
  EXPECT_FALSE(fs::exists(dir_ / "evil.txt"));
}

TEST_F(ArchiveTest, StreamReturnsTheReadersErrorNotACorruptArchive) {
  WriteTarGz(dir_ / "m.tar.gz", SampleModel());
  const std::string bytes = ReadFile(dir_ / "m.tar.gz");
  const std::string half = bytes.substr(0, bytes.size() / 2);
  absl::Status st = ExtractArchiveStream(ChunksOf(half, 4096, absl::UnavailableError("link down")),
                                         "s3://b/m.tar.gz", (dir_ / "a").string());
  EXPECT_EQ(st, absl::UnavailableError("link down"));
  // The stream simply ending early is a truncated archive, named.
  st = ExtractArchiveStream(ChunksOf(half, 4096), "s3://b/m.tar.gz", (dir_ / "b").string());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("s3://b/m.tar.gz"));
}

// `data` gzip-compressed (libarchive's raw format: one stream, no archive format).
std::string Gzip(const fs::path& scratch, const std::string& data) {
  archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_raw(a);
  EXPECT_EQ(archive_write_open_filename(a, scratch.c_str()), ARCHIVE_OK);
  archive_entry* entry = archive_entry_new();
  archive_entry_set_pathname(entry, "data");
  archive_entry_set_filetype(entry, AE_IFREG);
  archive_entry_set_size(entry, data.size());
  EXPECT_EQ(archive_write_header(a, entry), ARCHIVE_OK) << archive_error_string(a);
  archive_write_data(a, data.data(), data.size());
  archive_entry_free(entry);
  archive_write_close(a);
  archive_write_free(a);
  return ReadFile(scratch);
}

TEST_F(ArchiveTest, StreamIsReadToItsEnd) {
  // The archive is whole, but the stream fails after it (a short download whose missing bytes
  // were only padding): still an error.
  WriteTarGz(dir_ / "m.tar.gz", SampleModel());
  const std::string bytes = ReadFile(dir_ / "m.tar.gz");
  absl::Status st =
      ExtractArchiveStream(ChunksOf(bytes, 4096, absl::DataLossError("short by 10 bytes")),
                           "s3://b/m.tar.gz", (dir_ / "out").string());
  EXPECT_EQ(st, absl::DataLossError("short by 10 bytes"));
  // The same with 32 MiB of zeros after the end-of-archive marker (tar pads to its record
  // size): the untar stage stops at the marker while the gunzip stage is still inflating, and
  // the rest of the stream must still be read.
  WriteTarGz(dir_ / "m.tar", SampleModel(), /*gzip=*/false);
  const std::string padded =
      Gzip(dir_ / "padded.gz", ReadFile(dir_ / "m.tar") + std::string(32 << 20, '\0'));
  st = ExtractArchiveStream(ChunksOf(padded, 4096), "s3://b/m.tar.gz", (dir_ / "out2").string());
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(ReadTree(dir_ / "out2"), RegularFiles(SampleModel()));
  st = ExtractArchiveStream(ChunksOf(padded, 4096, absl::DataLossError("short by 10 bytes")),
                            "s3://b/m.tar.gz", (dir_ / "out3").string());
  EXPECT_EQ(st, absl::DataLossError("short by 10 bytes"));
}

TEST_F(ArchiveTest, StreamStopsItsReaderWhenTheExtractionFails) {
  // An entry refused early; the reader would block: `cancel` is called, and after it the
  // reader fails at once.
  WriteTarGz(dir_ / "m.tar.gz", {{"../evil.txt", "x"}, {"model/big", RandomBytes(1 << 20, 7)}});
  const std::string bytes = ReadFile(dir_ / "m.tar.gz");
  std::atomic<bool> cancelled{false};
  std::atomic<size_t> pos{0};
  ArchiveChunkReader read = [&]() -> absl::StatusOr<std::string_view> {
    // Past the end a real download would wait for bytes that never come: only cancel ends it
    // (or, if cancel is never called, this test's patience).
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (pos >= bytes.size() && !cancelled && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (cancelled) return absl::CancelledError("stopped");
    std::string_view out = std::string_view(bytes).substr(pos, 512);
    pos += out.size();
    return out;
  };
  absl::Status st = ExtractArchiveStream(read, "s3://b/m.tar.gz", (dir_ / "out").string(), {},
                                         [&] { cancelled = true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(cancelled);
}

// ---- S3 without a network ---------------------------------------------------------------------

TEST(S3RepositoryUrlTest, ParsesBothForms) {
  struct Case {
    const char* url;
    const char* bucket;
    const char* prefix;
    const char* endpoint;
  };
  for (const Case& c : std::vector<Case>{
           {"s3://bucket", "bucket", "", ""},
           {"s3://bucket/", "bucket", "", ""},
           {"s3://bucket/models", "bucket", "models/", ""},
           {"s3://bucket/a/b/", "bucket", "a/b/", ""},
           {"s3://bucket//a///b", "bucket", "a/b/", ""},  // repeated slashes collapse (Triton)
           {"s3://127.0.0.1:9000/models/repo", "models", "repo/", "http://127.0.0.1:9000"},
           {"s3://minio.local:9000/models", "models", "", "http://minio.local:9000"},
           {"s3://https://s3.example.com:443/b/p/q", "b", "p/q/", "https://s3.example.com:443"},
           {"s3://http://localhost:4569/b", "b", "", "http://localhost:4569"},
       }) {
    auto got = ParseS3RepositoryUrl(c.url);
    ASSERT_TRUE(got.ok()) << c.url << ": " << got.status();
    EXPECT_EQ(got->bucket, c.bucket) << c.url;
    EXPECT_EQ(got->prefix, c.prefix) << c.url;
    EXPECT_EQ(got->endpoint, c.endpoint) << c.url;
  }
  for (const char* bad : {"http://b/k", "s3://", "s3:///", "s3://host:9000", "s3://host:9000/",
                          "s3://http://bucket/x", "s3://Bad!/x", "s3://host:123456/b"}) {
    auto got = ParseS3RepositoryUrl(bad);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(bad));
  }
}

TEST(S3ListTest, BuildsCanonicalListUrls) {
  S3Config local;
  local.endpoint = "http://127.0.0.1:4569";
  EXPECT_EQ(S3ListUrl(local, "models", "repo/a b/", "", 1000),
            "http://127.0.0.1:4569/models?list-type=2&max-keys=1000&prefix=repo%2Fa%20b%2F");
  // Continuation tokens are base64: '+', '/' and '=' must be encoded or '+' reads as a space.
  EXPECT_EQ(S3ListUrl(local, "models", "", "a+b/c=", 2),
            "http://127.0.0.1:4569/models?continuation-token=a%2Bb%2Fc%3D&list-type=2&max-keys=2");
  S3Config aws;
  aws.region = "eu-west-1";
  EXPECT_EQ(S3ListUrl(aws, "my-bucket", "m/", "", 1000),
            "https://my-bucket.s3.eu-west-1.amazonaws.com/?list-type=2&max-keys=1000&prefix=m%2F");
}

TEST(S3ListTest, ParsesListObjectsV2Pages) {
  // s3rver's first page of a listing with max-keys=2 (token before the contents)...
  const std::string first =
      R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://doc.s3.amazonaws.com/2006-03-01/"><Name>models</Name><Prefix>pre/</Prefix><NextContinuationToken>1U9p+z8s/TwG4=</NextContinuationToken><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated><Contents><Key>pre/a/1/x</Key><LastModified>2026-11-23T16:35:46.000Z</LastModified><ETag>&quot;dcdeb5dae58305213b892bb7196ab67b&quot;</ETag><Size>11</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>pre/d/we ird&amp;k&lt;e&gt;y&#13;</Key><ETag>"abc-2"</ETag><Size>20</Size></Contents></ListBucketResult>)";
  auto page = ParseListObjectsV2(first);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "pre/a/1/x");
  EXPECT_EQ(page->objects[0].etag, "dcdeb5dae58305213b892bb7196ab67b");
  EXPECT_EQ(page->objects[0].size, 11);
  EXPECT_EQ(page->objects[1].key, "pre/d/we ird&k<e>y\r");
  EXPECT_EQ(page->objects[1].etag, "abc-2");
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "1U9p+z8s/TwG4=");
  // ...and AWS's last page (token after the contents, none next).
  const std::string last =
      R"(<ListBucketResult><Name>b</Name><Contents><Key>m/c.onnx</Key><Size>12345678901</Size></Contents><ContinuationToken>x</ContinuationToken><IsTruncated>false</IsTruncated></ListBucketResult>)";
  page = ParseListObjectsV2(last);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].size, 12345678901);
  EXPECT_FALSE(page->truncated);
  EXPECT_EQ(page->next_token, "");
  // An empty listing is a page with no objects.
  page = ParseListObjectsV2(
      "<ListBucketResult><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></"
      "ListBucketResult>");
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->objects.empty());
  for (const char* bad : {
           "<Error><Code>InternalError</Code></Error>",
           "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key><Size>12x</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key><Size>1</Size>",
       }) {
    EXPECT_EQ(ParseListObjectsV2(bad).status().code(), absl::StatusCode::kInternal) << bad;
  }
}

TEST(S3SourceListingTest, GroupsObjectsIntoModels) {
  const std::vector<S3Object> listing = {
      {"repo/", "", 0},                 // the prefix's own marker
      {"repo/README.md", "e0", 10},     // not a model
      {"repo/bert.tar.gz", "e1", 100},  // an archive model
      {"repo/resnet/", "", 0},          // a folder marker
      {"repo/resnet/config.pbtxt", "e2", 20},
      {"repo/resnet/1/model.onnx", "e3", 3000},
      {"repo/empty/", "", 0},       // a folder holding only a marker
      {"repo/../escape", "e4", 1},  // never a model name
      {"repo/simple/1/model.onnx", "e5", 30},
      {"other/x/config.pbtxt", "e6", 1},  // outside the prefix
  };
  std::vector<SourceModel> models = S3ModelsFromListing("repo/", listing);
  std::vector<std::pair<std::string, bool>> names;
  for (const auto& m : models) names.emplace_back(m.name, m.archive);
  EXPECT_THAT(names, ::testing::ElementsAre(std::pair<std::string, bool>{"bert.tar.gz", true},
                                            std::pair<std::string, bool>{"empty", false},
                                            std::pair<std::string, bool>{"resnet", false},
                                            std::pair<std::string, bool>{"simple", false}));
  // A changed ETag, size or key changes the model's fingerprint, and only that model's;
  // listing order does not matter.
  auto fingerprint = [](const std::vector<S3Object>& l, const std::string& name) {
    for (const auto& m : S3ModelsFromListing("repo/", l)) {
      if (m.name == name) return m.fingerprint;
    }
    return std::string("missing");
  };
  std::vector<S3Object> changed = listing;
  changed[5].etag = "e3b";
  EXPECT_NE(fingerprint(changed, "resnet"), fingerprint(listing, "resnet"));
  EXPECT_EQ(fingerprint(changed, "simple"), fingerprint(listing, "simple"));
  changed = listing;
  changed[5].size = 3001;
  EXPECT_NE(fingerprint(changed, "resnet"), fingerprint(listing, "resnet"));
  changed = listing;
  changed[2].etag = "e1b";
  EXPECT_NE(fingerprint(changed, "bert.tar.gz"), fingerprint(listing, "bert.tar.gz"));
  std::vector<S3Object> reversed(listing.rbegin(), listing.rend());
  EXPECT_EQ(fingerprint(reversed, "resnet"), fingerprint(listing, "resnet"));
  EXPECT_EQ(fingerprint(listing, "resnet").size(), 16u);
  // The whole bucket as the repository.
  models = S3ModelsFromListing("", {{"m/config.pbtxt", "e", 1}, {"a.tgz", "e", 1}});
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].name, "a.tgz");
  EXPECT_EQ(models[1].name, "m");
}

TEST(S3SourceListingTest, RefusesKeysThatLeaveTheModelFolder) {
  for (const char* ok : {"config.pbtxt", "1/model.onnx", "1/a b/c..d", ".hidden", "x..", "é/ü"}) {
    EXPECT_TRUE(CheckS3RelativeKey(ok).ok()) << ok;
  }
  for (const char* bad : {"", "/etc/passwd", "..", "../x", "1/../../x", "1/..", "a//b", "./a",
                          "a/./b", "a/", "a\nb", "a\tb"}) {
    absl::Status st = CheckS3RelativeKey(bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(S3TransferTest, PlansPartsAboveTheThreshold) {
  S3TransferOptions t;
  t.parallel_threshold = 100;
  t.part_size = 40;
  auto parts = PlanS3Parts(100, t);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].end, 100);
  parts = PlanS3Parts(0, t);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].end, 0);
  parts = PlanS3Parts(101, t);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].begin, 0);
  EXPECT_EQ(parts[1].begin, 40);
  EXPECT_EQ(parts[2].begin, 80);
  EXPECT_EQ(parts[2].end, 101);
}

// ---- loopback HTTP helpers --------------------------------------------------------------------

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads the answer until the server closes; the HTTP status, or -1.
int HttpExchange(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return -1;
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  ::close(fd);
  return answer.size() > 12 && answer.rfind("HTTP/1.", 0) == 0 ? std::stoi(answer.substr(9, 3))
                                                               : -1;
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A server that answers every connection with `answer(fd)` after reading the request's
// headers: the failures a real S3 server is hard to make produce.
class FakeHttpServer {
 public:
  explicit FakeHttpServer(std::function<void(int)> answer) : answer_(std::move(answer)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_fd_, 16);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeHttpServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  int requests() const { return requests_.load(); }

 private:
  void Serve() {
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        request.append(buf, n);
      }
      ++requests_;
      answer_(fd);
      ::close(fd);
    }
  }
  std::function<void(int)> answer_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

void SendAll(int fd, const std::string& s) { (void)::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

// Waits (at most 10 s) for the client to close the connection.
void WaitForClose(int fd) {
  pollfd p{fd, POLLIN, 0};
  char buf[256];
  while (::poll(&p, 1, 10000) > 0 && ::recv(fd, buf, sizeof(buf), 0) > 0) {
  }
}

S3Config FastFailing(int port) {
  S3Config c;
  c.endpoint = "http://127.0.0.1:" + std::to_string(port);
  c.transfer.retries = 0;
  return c;
}

TEST(S3FaultTest, ShortDownloadIsDataLossNamingTheObject) {
  FakeHttpServer server([](int fd) {
    SendAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nETag: \"e1\"\r\n\r\n" +
                    std::string(500, 'x'));
  });
  const fs::path dir =
      fs::temp_directory_path() / ("inferd_s3_short_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const S3Location where{"models", "m.tar.gz"};
  absl::Status st = ExtractS3Archive(FastFailing(server.port()), where, {"m.tar.gz", "e1", 1000},
                                     (dir / "out").string(), {});
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("s3://models/m.tar.gz"));
  st = DownloadS3Object(FastFailing(server.port()), where, {"m.tar.gz", "e1", 1000},
                        (dir / "file").string());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  fs::remove_all(dir);
}

TEST(S3FaultTest, AccessDeniedCarriesS3sCodeAndMessage) {
  FakeHttpServer server([](int fd) {
    const std::string body =
        "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Access "
        "Denied</Message></Error>";
    SendAll(fd, "HTTP/1.1 403 Forbidden\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n\r\n" + body);
  });
  auto list = ListS3Objects(FastFailing(server.port()), "models", "repo/");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kPermissionDenied) << list.status();
  EXPECT_THAT(std::string(list.status().message()),
              HasSubstr("s3://models/repo/: access denied (HTTP 403 AccessDenied: Access Denied)"));
  SourceOptions options;
  options.s3 = FastFailing(server.port());
  auto source = MakeS3Source("s3://models/repo", options);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(source.status().message()), HasSubstr("'s3://models/repo'"));
}

TEST(S3FaultTest, StalledServerTimesOut) {
  FakeHttpServer server([](int fd) { WaitForClose(fd); });  // reads, never answers
  S3Config config = FastFailing(server.port());
  config.transfer.low_speed_seconds = 1;
  const auto start = std::chrono::steady_clock::now();
  auto head = HeadS3Object(config, {"models", "m.tar.gz"});
  EXPECT_EQ(head.status().code(), absl::StatusCode::kUnavailable) << head.status();
  EXPECT_THAT(std::string(head.status().message()), HasSubstr("s3://models/m.tar.gz: timed out"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
}

TEST(S3FaultTest, RetriesTransientErrors) {
  FakeHttpServer server([](int fd) {
    SendAll(fd, "HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  S3Config config = FastFailing(server.port());
  config.transfer.retries = 2;
  auto list = ListS3Objects(config, "models", "");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnavailable) << list.status();
  EXPECT_THAT(std::string(list.status().message()), HasSubstr("HTTP 503"));
  EXPECT_EQ(server.requests(), 3);
}

TEST(S3FaultTest, ConnectionRefusedIsUnavailableNamingTheRepository) {
  SourceOptions options;
  options.s3 = FastFailing(FreePort());  // nothing listens there
  auto source = MakeS3Source("s3://models/repo", options);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnavailable) << source.status();
  EXPECT_THAT(std::string(source.status().message()), HasSubstr("'s3://models/repo'"));
  EXPECT_THAT(std::string(source.status().message()), HasSubstr("cannot reach http://127.0.0.1:"));
}

// ---- against a real S3 server (npm s3rver) -----------------------------------------------------

fs::path S3rverBinary() {
  std::string cache;
  if (const char* c = std::getenv("INFERD_CACHE_DIR")) {
    cache = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME")) {
    cache = std::string(x) + "/inferd";
  } else {
    cache = std::string(std::getenv("HOME") ? std::getenv("HOME") : "/root") + "/.cache/inferd";
  }
  return fs::path(cache) / "s3rver-3.7.1/node_modules/.bin/s3rver";
}

std::string PercentEncodePath(std::string_view key) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

class S3rverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("inferd_s3rver_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    const fs::path binary = S3rverBinary();
    if (!fs::exists(binary)) GTEST_SKIP() << binary << " is missing: run scripts/setup.sh";
    port_ = FreePort();
    const std::string port = std::to_string(port_), data = (dir_ / "data").string();
    std::vector<std::string> args = {binary.string(), "-d",      data, "-a",
                                     "127.0.0.1",     "-p",      port, "--configure-bucket",
                                     "models",        "--silent"};
    // s3rver 3.7.1 encrypts continuation tokens with DES, which Node 17+ (OpenSSL 3) only
    // offers through its legacy provider: without it a truncated listing is a 500.
    std::vector<std::string> env = {"NODE_OPTIONS=--openssl-legacy-provider"};
    for (char** e = environ; *e; ++e) {
      if (std::string_view(*e).rfind("NODE_OPTIONS=", 0) != 0) env.push_back(*e);
    }
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    for (auto& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    posix_spawn_file_actions_t quiet;  // it prints "S3rver listening" even with --silent
    posix_spawn_file_actions_init(&quiet);
    posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&quiet, 2, "/dev/null", O_WRONLY, 0);
    const int spawned = ::posix_spawn(&pid_, argv[0], &quiet, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&quiet);
    ASSERT_EQ(spawned, 0) << strerror(spawned);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (HttpExchange(port_,
                        "GET /models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n") !=
           200) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "s3rver did not start";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    options_.cache_dir = (dir_ / "cache").string();
    options_.s3.endpoint = "http://127.0.0.1:" + port;
    options_.s3.access_key = "S3RVER";
    options_.s3.secret_key = "S3RVER";
    options_.s3.transfer.retries = 0;
  }

  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    fs::remove_all(dir_);
  }

  void Put(const std::string& key, const std::string& body) {
    const std::string request = "PUT /models/" + PercentEncodePath(key) +
                                " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                "x-amz-content-sha256: UNSIGNED-PAYLOAD\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                                body;
    ASSERT_EQ(HttpExchange(port_, request), 200) << key;
  }

  std::string TarGz(const std::vector<Entry>& entries) {
    const fs::path path = dir_ / "upload.tar.gz";
    fs::remove(path);
    WriteTarGz(path, entries);
    return ReadFile(path);
  }

  std::unique_ptr<Source> Open(const std::string& url) {
    auto source = MakeS3Source(url, options_);
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? *std::move(source) : nullptr;
  }

  // The cache's entries for the repository s3://models/repo/.
  std::vector<std::string> CacheEntries() {
    std::vector<std::string> out;
    const fs::path base = dir_ / "cache/s3/models/repo%2F";
    std::error_code ec;
    for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
      out.push_back(it->path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  fs::path dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  SourceOptions options_;
};

TEST_F(S3rverTest, ListsEveryPage) {
  for (int i = 0; i < 3; ++i) {
    Put("repo/m" + std::to_string(i) + "/config.pbtxt", "name: \"m\"");
    Put("repo/m" + std::to_string(i) + "/1/model.onnx", "weights" + std::to_string(i));
  }
  Put("repo/z.tar.gz", TarGz(SampleModel()));
  Put("other/m9/config.pbtxt", "x");
  options_.s3.transfer.list_max_keys = 2;  // 7 objects under the prefix: 4 pages
  auto objects = ListS3Objects(options_.s3, "models", "repo/");
  ASSERT_TRUE(objects.ok()) << objects.status();
  EXPECT_EQ(objects->size(), 7u);
  auto source = Open("s3://models/repo");
  ASSERT_TRUE(source);
  auto models = source->List();
  ASSERT_TRUE(models.ok()) << models.status();
  std::vector<std::string> names;
  for (const auto& m : *models) names.push_back(m.name);
  EXPECT_THAT(names, ::testing::ElementsAre("m0", "m1", "m2", "z.tar.gz"));
  EXPECT_TRUE(models->back().archive);
}

TEST_F(S3rverTest, FetchesAFolderModelAndHitsTheCacheAfterARestart) {
  const std::string weights = RandomBytes(200000, 2);
  Put("repo/simple/config.pbtxt", "name: \"simple\"\n");
  Put("repo/simple/1/model.onnx", weights);
  Put("repo/simple/1/", "");  // a folder marker: no file to write
  std::string path;
  {
    auto source = Open("s3://models/repo/");
    ASSERT_TRUE(source);
    FetchStats stats;
    auto fetched = source->Fetch("simple", &stats);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    path = *fetched;
    EXPECT_FALSE(stats.cache_hit);
    EXPECT_EQ(stats.bytes_downloaded, static_cast<int64_t>(weights.size() + 15));
    EXPECT_EQ(ReadTree(path),
              (std::map<std::string, std::string>{{"config.pbtxt", "name: \"simple\"\n"},
                                                  {"1/model.onnx", weights}}));
  }
  // A new source over the same cache (a restarted server): nothing is downloaded.
  auto source = Open("s3://models/repo");
  ASSERT_TRUE(source);
  FetchStats stats;
  auto again = source->Fetch("simple", &stats);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, path);
  EXPECT_TRUE(stats.cache_hit);
  EXPECT_EQ(stats.bytes_downloaded, 0);
  // A model the repository does not hold.
  EXPECT_EQ(source->Fetch("nothing", &stats).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(source->Fetch("gone.tar.gz", &stats).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(source->Fetch("..", &stats).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3rverTest, AChangedEtagMakesANewSnapshot) {
  Put("repo/m/config.pbtxt", "name: \"m\"\n");
  // Same sizes throughout: only the ETags tell the versions apart.
  Put("repo/m/1/model.onnx", "version one!");
  auto source = Open("s3://models/repo");
  ASSERT_TRUE(source);
  auto fingerprint = [&] {
    auto models = source->List();
    EXPECT_TRUE(models.ok() && models->size() == 1) << models.status();
    return models.ok() && !models->empty() ? (*models)[0].fingerprint : "";
  };
  const std::string fp1 = fingerprint();
  FetchStats stats;
  auto first = source->Fetch("m", &stats);
  ASSERT_TRUE(first.ok()) << first.status();
  Put("repo/m/1/model.onnx", "version two!");
  const std::string fp2 = fingerprint();
  EXPECT_NE(fp1, fp2);
  auto second = source->Fetch("m", &stats);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  EXPECT_FALSE(stats.cache_hit);
  EXPECT_EQ(stats.bytes_downloaded, 12);  // only the changed file; the config is linked
  EXPECT_EQ(ReadFile(fs::path(*second) / "1/model.onnx"), "version two!");
  EXPECT_EQ(fs::hard_link_count(fs::path(*second) / "config.pbtxt"), 2u);
  EXPECT_EQ(ReadFile(fs::path(*first) / "1/model.onnx"), "version one!");  // kept: may be serving
  // A third version: the first snapshot goes, the second stays.
  Put("repo/m/1/model.onnx", "version 3333");
  auto third = source->Fetch("m", &stats);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(fs::exists(*first));
  EXPECT_FALSE(fs::exists(*first + ".done"));
  EXPECT_TRUE(fs::exists(*second));
  EXPECT_EQ(ReadFile(fs::path(*third) / "1/model.onnx"), "version 3333");
}

TEST_F(S3rverTest, StreamsAnArchiveIntoTheCache) {
  Put("repo/model.tar.gz", TarGz(SampleModel()));
  auto source = Open("s3://models/repo");
  ASSERT_TRUE(source);
  FetchStats stats;
  auto fetched = source->Fetch("model.tar.gz", &stats);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_FALSE(stats.cache_hit);
  EXPECT_GT(stats.bytes_downloaded, 0);
  EXPECT_EQ(ReadTree(*fetched), RegularFiles(SampleModel()));
  auto again = source->Fetch("model.tar.gz", &stats);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *fetched);
  EXPECT_TRUE(stats.cache_hit);
}

TEST_F(S3rverTest, LargeObjectsComeInRangedParts) {
  // Over the threshold: 3 MiB in 256 KiB parts over 3 connections, a window of 4 parts.
  options_.s3.transfer.parallel_threshold = 1 << 20;
  options_.s3.transfer.part_size = 256 << 10;
  options_.s3.transfer.connections = 3;
  std::vector<Entry> entries = {{"big/", "", AE_IFDIR},
                                {"big/config.pbtxt", "name: \"big\"\n"},
                                {"big/1/model.onnx", RandomBytes(3 << 20, 3)},
                                {"big/1/tail.bin", RandomBytes(100001, 4)}};
  const std::string archive = TarGz(entries);
  ASSERT_GT(archive.size(), 3u << 20);
  Put("repo/big.tar.gz", archive);
  Put("repo/folder/1/model.onnx", entries[2].contents);  // a folder model's large file
  auto source = Open("s3://models/repo");
  ASSERT_TRUE(source);
  FetchStats stats;
  auto fetched = source->Fetch("big.tar.gz", &stats);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(stats.bytes_downloaded, static_cast<int64_t>(archive.size()));
  EXPECT_EQ(ReadTree(*fetched), RegularFiles(entries));
  fetched = source->Fetch("folder", &stats);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(ReadFile(fs::path(*fetched) / "1/model.onnx"), entries[2].contents);
}

TEST_F(S3rverTest, MissingBucketOrPrefix) {
  auto source = MakeS3Source("s3://nobucket/repo", options_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound) << source.status();
  EXPECT_THAT(std::string(source.status().message()), HasSubstr("'s3://nobucket/repo'"));
  EXPECT_THAT(std::string(source.status().message()), HasSubstr("NoSuchBucket"));
  // An existing bucket with nothing under the prefix is an empty repository.
  auto empty = Open("s3://models/nothing-here");
  ASSERT_TRUE(empty);
  auto models = empty->List();
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_TRUE(models->empty());
  auto head = HeadS3Object(options_.s3, {"models", "nothing-here/x.tar.gz"});
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(head.status().message()),
              HasSubstr("s3://models/nothing-here/x.tar.gz does not exist (HTTP 404"));
}

TEST_F(S3rverTest, TritonsHostPortForm) {
  Put("repo/m/config.pbtxt", "x");
  options_.s3.endpoint.clear();  // the URL names the endpoint
  auto source = Open("s3://127.0.0.1:" + std::to_string(port_) + "/models/repo");
  ASSERT_TRUE(source);
  auto fetched = source->Fetch("m", nullptr);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(ReadFile(fs::path(*fetched) / "config.pbtxt"), "x");
}

TEST_F(S3rverTest, ATruncatedArchiveLeavesNoCacheFolder) {
  const std::string archive = TarGz(SampleModel());
  Put("repo/model.tar.gz", archive.substr(0, archive.size() / 2));
  auto source = Open("s3://models/repo");
  ASSERT_TRUE(source);
  auto fetched = source->Fetch("model.tar.gz", nullptr);
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kInvalidArgument) << fetched.status();
  EXPECT_THAT(std::string(fetched.status().message()), HasSubstr("s3://models/repo/model.tar.gz"));
  EXPECT_THAT(CacheEntries(), ::testing::IsEmpty());
  // Fixed in the bucket, the same model loads.
  Put("repo/model.tar.gz", archive);
  fetched = source->Fetch("model.tar.gz", nullptr);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(ReadTree(*fetched), RegularFiles(SampleModel()));
}

TEST_F(S3rverTest, ConcurrentFetchesOfOneModelAgree) {
  Put("repo/model.tar.gz", TarGz(SampleModel()));
  Put("repo/m/1/model.onnx", RandomBytes(100000, 5));
  auto source = Open("s3://models/repo");
  ASSERT_TRUE(source);
  std::vector<absl::StatusOr<std::string>> results(6);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = source->Fetch(i % 2 ? "m" : "model.tar.gz", nullptr); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(*results[i], *results[i % 2]);
  }
  EXPECT_EQ(ReadTree(*results[0]), RegularFiles(SampleModel()));
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
