// Fuzzes archive extraction with links and folders in any order (issue 27): the input bytes
// are a program that builds a tar of folders, files and symbolic links over a small alphabet
// of names ("a", "l1", "..", ...), so the fuzzer reaches link chains like a/l1 -> ..,
// a/l1/l2 -> .. quickly instead of hoping to hit them through tar's checksums. Whatever the
// order, nothing may be created outside the destination, and no link left inside it may
// resolve outside it. Half of the inputs run without openat2 (the O_NOFOLLOW walk).
//
// The destination sits 24 folders below the fuzzer's base, deeper than any chain of the 24
// entries an input may hold can climb, so an escape lands where this target sees it.
#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/archive.h"
#include "common/rooted_dir.h"

namespace fs = std::filesystem;

namespace {

constexpr int kDepth = 24;
constexpr size_t kMaxEntries = 24;

const fs::path& Base() {
  static const fs::path base = [] {
    char tmpl[] = "/tmp/inferd_archive_links_fuzz.XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (dir == nullptr) abort();
    fs::path p(dir);
    for (int i = 0; i < kDepth; ++i) p /= "d";
    fs::create_directories(p);
    return fs::path(dir);
  }();
  return base;
}

fs::path Dest() {
  fs::path p = Base();
  for (int i = 0; i < kDepth; ++i) p /= "d";
  return p / "out";
}

// Reads bytes off the input; zeros once it is spent.
struct Input {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  uint8_t Next() { return pos < size ? data[pos++] : 0; }
  bool Done() const { return pos >= size; }
};

const char* const kNames[] = {"a", "b", "l1", "l2", "l3", "x", "..", ".", "out", "d"};

std::string Path(Input& in, bool for_target) {
  std::string p;
  const int n = 1 + in.Next() % 5;
  for (int i = 0; i < n; ++i) {
    if (!p.empty()) p += '/';
    const uint8_t b = in.Next();
    // Mostly plain names; ".." and "." often enough in link targets.
    p += kNames[for_target ? b % 10 : (b % 16 < 10 ? b % 6 : b % 10)];
  }
  return p;
}

std::string BuildTar(Input& in) {
  std::string out;
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  static thread_local std::string* sink;
  sink = &out;
  archive_write_open(
      a, nullptr, nullptr,
      [](archive*, void*, const void* buf, size_t n) -> la_ssize_t {
        sink->append(static_cast<const char*>(buf), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr);
  for (size_t i = 0; i < kMaxEntries && !in.Done(); ++i) {
    const uint8_t kind = in.Next() % 3;
    const std::string path = Path(in, false);
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, path.c_str());
    if (kind == 0) {
      archive_entry_set_filetype(e, AE_IFDIR);
      archive_entry_set_perm(e, 0755);
      archive_entry_set_size(e, 0);
    } else if (kind == 1) {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, 0644);
      archive_entry_set_size(e, 1);
    } else {
      archive_entry_set_filetype(e, AE_IFLNK);
      archive_entry_set_perm(e, 0777);
      archive_entry_set_symlink(e, Path(in, true).c_str());
      archive_entry_set_size(e, 0);
    }
    archive_write_header(a, e);
    if (kind == 1) archive_write_data(a, "x", 1);
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

// Everything under `dir` except `keep` (the one expected child).
void ExpectOnly(const fs::path& dir, const fs::path& keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path() != keep) {
      std::fprintf(stderr, "extraction created %s outside the destination\n", e.path().c_str());
      abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Input in{data + 1, size - 1};
  inferd::RootedDir::ForceNoOpenat2ForTesting(data[0] & 1);
  const std::string tar = BuildTar(in);
  const fs::path archive_path = Base() / "in.tar";
  if (FILE* f = std::fopen(archive_path.c_str(), "wb")) {
    std::fwrite(tar.data(), 1, tar.size(), f);
    std::fclose(f);
  }
  const fs::path out = Dest();
  inferd::ExtractLimits limits;
  limits.max_total_bytes = 1 << 20;
  limits.max_entries = kMaxEntries;
  (void)inferd::ExtractArchive(archive_path.string(), out.string(), limits);

  // Nothing beside the destination, at any level above it.
  fs::path dir = Base();
  std::error_code lec;
  for (const auto& e : fs::directory_iterator(dir, lec)) {
    if (e.path() != dir / "d" && e.path() != archive_path) {
      std::fprintf(stderr, "extraction created %s outside the destination\n", e.path().c_str());
      abort();
    }
  }
  for (int i = 0; i < kDepth; ++i) {
    dir /= "d";
    if (i + 1 < kDepth) ExpectOnly(dir, dir / "d");
  }
  ExpectOnly(dir, out);
  // No link inside resolves outside.
  std::error_code ec;
  const std::string root = fs::canonical(out, ec).string();
  for (auto it = fs::recursive_directory_iterator(out, fs::directory_options::none, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_symlink()) continue;
    std::error_code lec;
    const std::string t = fs::weakly_canonical(it->path(), lec).string();
    if (lec) continue;  // a loop (ELOOP): it leads nowhere
    if (t != root && t.rfind(root + "/", 0) != 0) {
      std::fprintf(stderr, "link %s resolves outside the destination: %s\n", it->path().c_str(),
                   t.c_str());
      abort();
    }
  }
  fs::remove_all(out, ec);
  return 0;
}
