#include "repository/source.h"

#include <algorithm>
#include <fstream>
#include <filesystem>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "repository/repository_scan.h"
#include "repository/s3_source.h"

namespace inferd::repository {
namespace fs = std::filesystem;

bool IsArchiveName(std::string_view path) {
  for (std::string_view ext : {".tar.gz", ".tgz", ".tar"}) {
    if (path.size() > ext.size() && path.substr(path.size() - ext.size()) == ext) return true;
  }
  return false;
}

namespace {

// A folder on this machine. Model folders are served in place; archives are extracted into
// `<cache>/local/<name>@<size>-<mtime>` once, and again only when the file changes.
class LocalDirSource final : public Source {
 public:
  LocalDirSource(std::string url, std::string dir, SourceOptions options)
      : url_(std::move(url)), dir_(std::move(dir)), options_(std::move(options)) {}

  const std::string& url() const override { return url_; }
  bool remote() const override { return false; }

  absl::StatusOr<std::vector<SourceModel>> List() override {
    std::error_code ec;
    if (!fs::is_directory(dir_, ec)) {
      return absl::NotFoundError(StrCat("model repository '", url_, "' is not a folder"));
    }
    std::vector<SourceModel> out;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      std::error_code e2;
      if (it->is_directory(e2)) {
        out.push_back({name, Fingerprint(it->path().string()), false});
      } else if (it->is_regular_file(e2) && IsArchiveName(name)) {
        out.push_back({name, FileStamp(it->path()), true});
      }
    }
    if (ec) {
      return absl::UnavailableError(StrCat("cannot read model repository '", url_, "': ", ec.message()));
    }
    std::sort(out.begin(), out.end(),
              [](const SourceModel& a, const SourceModel& b) { return a.name < b.name; });
    return out;
  }

  absl::StatusOr<std::string> Fetch(const std::string& name, FetchStats* stats) override {
    const fs::path path = fs::path(dir_) / name;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      if (stats) stats->cache_hit = true;
      return path.string();
    }
    if (!fs::is_regular_file(path, ec) || !IsArchiveName(name)) {
      return absl::NotFoundError(
          StrCat("model repository '", url_, "' holds no model '", name, "'"));
    }
    // One extraction per archive at a time; a second caller finds the finished folder.
    std::shared_ptr<inferd::Mutex> lock;
    {
      inferd::MutexLock g(&locks_mu_);
      auto& l = locks_[name];
      if (!l) l = std::make_shared<inferd::Mutex>();
      lock = l;
    }
    inferd::MutexLock g(lock.get());
    if (absl::Status st = CheckCacheDir(options_.cache_dir); !st.ok()) return st;
    const std::string stamp = FileStamp(path);
    const fs::path dest = fs::path(options_.cache_dir) / "local" / StrCat(name, "@", stamp);
    if (fs::exists(dest / ".complete", ec)) {
      if (stats) stats->cache_hit = true;
      ModelCacheCap::Touch(dest.string());  // the least recently used go first
      return dest.string();
    }
    const fs::path partial = dest.string() + ".partial";
    fs::remove_all(partial, ec);
    fs::create_directories(partial.parent_path(), ec);
    if (absl::Status st = ExtractArchive(path.string(), partial.string(), options_.extract_limits);
        !st.ok()) {
      fs::remove_all(partial, ec);
      // A bad archive is the client's fault (400); a cache the server cannot write, its own (500).
      return absl::Status(absl::IsInvalidArgument(st) ? st.code() : absl::StatusCode::kInternal,
                          StrCat("cannot extract '", path.string(), "': ", st.message()));
    }
    fs::remove_all(dest, ec);
    fs::rename(partial, dest, ec);
    if (ec) {
      return absl::InternalError(StrCat("cannot move the extracted archive into '",
                                        dest.string(), "': ", ec.message()));
    }
    std::ofstream(dest / ".complete").flush();
    if (options_.cache_cap) options_.cache_cap->Trim(dest.string());
    return dest.string();
  }

 private:
  static std::string FileStamp(const fs::path& path) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    const auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
    return StrCat(size, "-", mtime);
  }

  const std::string url_;
  const std::string dir_;
  const SourceOptions options_;
  inferd::Mutex locks_mu_;
  // One per archive name, held while that archive is extracted.
  std::map<std::string, std::shared_ptr<inferd::Mutex>> locks_ ABSL_GUARDED_BY(locks_mu_);
};

}  // namespace

absl::Status CheckCacheDir(const std::string& cache_dir) {
  absl::Status st = EnsurePrivateDir(cache_dir, "--model-cache-dir");
  if (st.ok()) return st;
  return absl::InternalError(st.message());
}

absl::StatusOr<std::unique_ptr<Source>> OpenSource(const std::string& url,
                                                   const SourceOptions& options) {
  if (url.rfind("s3://", 0) == 0) return MakeS3Source(url, options);
  std::error_code ec;
  if (!fs::is_directory(url, ec)) {
    return absl::NotFoundError(
        StrCat("model repository '", url, "' does not exist or is not a folder"));
  }
  return std::unique_ptr<Source>(
      new LocalDirSource(url, fs::absolute(url, ec).lexically_normal().string(), options));
}

}  // namespace inferd::repository
