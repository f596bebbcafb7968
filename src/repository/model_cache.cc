#include "repository/model_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <system_error>

#include "common/logging.h"
#include "common/strings.h"

namespace inferd::repository {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kDoneSuffix = ".done";  // the S3 snapshot's marker (s3_source.cc)
// An entry used this recently is kept whatever the store says: between a Fetch and the store
// recording the load that uses it, only this protects it.
constexpr int64_t kRecentNs = int64_t{60} * 1000000000;

// An entry's folder name: "<model>@<stamp>", not a temporary (".tmp-...", "*.partial").
bool IsEntryName(const std::string& name) {
  return name.find('@') != std::string::npos && name.front() != '.' &&
         name.find(".partial") == std::string::npos;
}

uint64_t TreeBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::error_code e2;
    if (it->is_regular_file(e2) && !it->is_symlink(e2)) total += it->file_size(e2);
  }
  return total;
}

void AddEntries(const fs::path& dir, int depth, std::vector<ModelCacheCap::Entry>* out) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (!it->is_directory(e2) || it->is_symlink(e2)) continue;
    if (depth > 0) {
      AddEntries(it->path(), depth - 1, out);
      continue;
    }
    const std::string name = it->path().filename().string();
    if (!IsEntryName(name)) continue;
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0) continue;
    out->push_back({it->path().string(), TreeBytes(it->path()),
                    int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec});
  }
}

}  // namespace

uint64_t DefaultCacheCapBytes(const std::string& cache_dir) {
  // The nearest folder that exists (the cache may not yet).
  fs::path p = fs::absolute(cache_dir);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  struct statvfs vfs;
  if (p.empty() || ::statvfs(p.c_str(), &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize / 2;
}

void ModelCacheCap::SetInUse(CacheInUse in_use) {
  inferd::MutexLock lock(&mu_);
  in_use_ = std::move(in_use);
}

void ModelCacheCap::Touch(const std::string& entry) {
  ::utimensat(AT_FDCWD, entry.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

std::vector<ModelCacheCap::Entry> ModelCacheCap::ListEntries() const {
  std::vector<Entry> out;
  AddEntries(fs::path(dir_) / "local", 0, &out);
  AddEntries(fs::path(dir_) / "s3", 2, &out);  // s3/<bucket>/<prefix>/<entry>
  return out;
}

uint64_t ModelCacheCap::Trim(const std::string& keep) {
  if (max_bytes_ == 0) return 0;
  inferd::MutexLock lock(&mu_);
  std::vector<Entry> entries = ListEntries();
  uint64_t total = 0;
  for (const Entry& e : entries) total += e.bytes;
  if (total <= max_bytes_) return 0;
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.last_use_ns < b.last_use_ns; });
  const std::string kept = fs::path(keep).lexically_normal().string();
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  uint64_t removed = 0;
  for (const Entry& e : entries) {
    if (total <= max_bytes_) break;
    if (fs::path(e.path).lexically_normal().string() == kept) continue;
    if (in_use_ && in_use_(e.path)) continue;
    // Fetched (or hit) moments ago: a load may be reading it before the store records it.
    if (now_ns - e.last_use_ns < kRecentNs) continue;
    std::error_code ec;
    fs::remove(e.path + std::string(kDoneSuffix), ec);  // unmark first: never a half entry
    fs::remove(fs::path(e.path) / ".complete", ec);
    fs::remove_all(e.path, ec);
    if (ec) {
      LOG_WARNING << "model cache: cannot remove '" << e.path << "': " << ec.message();
      continue;
    }
    LOG_INFO << "model cache: removed '" << e.path << "' (" << e.bytes
             << " bytes, not loaded) to stay under the cap of " << max_bytes_ << " bytes";
    total -= e.bytes;
    removed += e.bytes;
  }
  if (total > max_bytes_) {
    LOG_WARNING << "model cache: " << total << " bytes in use by loaded models exceed the cap of "
                << max_bytes_ << " bytes (--model-cache-max-bytes)";
  }
  return removed;
}

}  // namespace inferd::repository
