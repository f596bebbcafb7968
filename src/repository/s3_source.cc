#include "repository/s3_source.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "common/mutex.h"
#include "common/rooted_dir.h"
#include "common/strings.h"

namespace inferd::repository {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kDoneSuffix = ".done";
constexpr std::string_view kTempPrefix = ".tmp-";

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// A model name that can be a folder name in the cache.
bool IsFolderName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         CheckS3RelativeKey(name).ok();
}

// An ETag as a file-name component (multipart ETags have a '-'; nothing else is expected).
std::string EtagForPath(std::string_view etag) {
  std::string out(etag);
  for (auto& c : out) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  }
  return out.empty() ? "noetag" : out;
}

// The prefix as one path component, reversibly ("models/v1/" -> "models%2Fv1%2F"), so no
// prefix can climb out of the bucket's folder or collide with another; "" -> "_root".
std::string FlattenPrefix(std::string_view prefix) {
  if (prefix.empty()) return "_root";
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : prefix) {
    if (isalnum(c) || c == '-' || c == '_') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// A directory marker ("model/" or "model/1/", zero bytes) as the S3 console creates them.
bool IsFolderMarker(const S3Object& o) { return o.size == 0 && EndsWith(o.key, "/"); }

uint64_t Fnv1a(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status Annotate(const absl::Status& st, std::string_view url) {
  return absl::Status(st.code(), StrCat("model repository '", url, "': ", st.message()));
}

// One file of a snapshot, as the manifest (`<snapshot>.done`) records it:
// "<size>\t<etag>\t<relative path>" per line. Paths hold no control characters
// (CheckS3RelativeKey), so tabs and newlines cannot occur in them.
struct ManifestEntry {
  int64_t size = 0;
  std::string etag;
};
using Manifest = std::map<std::string, ManifestEntry>;

std::string ManifestLine(std::string_view relative, const S3Object& o) {
  return StrCat(o.size, "\t", EtagForPath(o.etag), "\t", relative, "\n");
}

Manifest ReadManifest(const fs::path& path) {
  Manifest out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find('\t');
    const size_t b = a == std::string::npos ? a : line.find('\t', a + 1);
    if (b == std::string::npos) continue;
    ManifestEntry e;
    std::from_chars(line.data(), line.data() + a, e.size);
    e.etag = line.substr(a + 1, b - a - 1);
    out[line.substr(b + 1)] = std::move(e);
  }
  return out;
}

// Writes the marker through a temporary name, so a marker that exists is whole.
absl::Status WriteMarker(const fs::path& marker, const std::string& contents) {
  const fs::path tmp = marker.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << contents;
    out.flush();
    if (!out) return absl::InternalError(StrCat("cannot write '", tmp.string(), "'"));
  }
  std::error_code ec;
  fs::rename(tmp, marker, ec);
  if (ec)
    return absl::InternalError(StrCat("cannot write '", marker.string(), "': ", ec.message()));
  return absl::OkStatus();
}

// The complete snapshots of `name` in `base` (folders named "<name>@<tag>" with their marker),
// newest marker first.
std::vector<fs::path> CompleteSnapshots(const fs::path& base, std::string_view name) {
  std::vector<std::pair<fs::file_time_type, fs::path>> found;
  const std::string head = StrCat(name, "@");
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (!StartsWith(file, head) || !EndsWith(file, kDoneSuffix)) continue;
    const std::string tag =
        file.substr(head.size(), file.size() - head.size() - kDoneSuffix.size());
    if (tag.empty() || tag.find('@') != std::string::npos) continue;  // another model's
    std::error_code e2;
    const fs::path dir = base / StrCat(head, tag);
    if (!fs::is_directory(dir, e2)) continue;
    found.emplace_back(fs::last_write_time(it->path(), e2), dir);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

// Removes the snapshots of `name` older than `keep` and the newest other one: that one may
// still be loading or serving while `keep` replaces it. The marker goes first, so a snapshot
// half removed is never taken for complete.
void PruneSnapshots(const fs::path& base, std::string_view name, const fs::path& keep) {
  bool kept_previous = false;
  for (const fs::path& dir : CompleteSnapshots(base, name)) {
    if (dir == keep) continue;
    if (!kept_previous) {
      kept_previous = true;
      continue;
    }
    std::error_code ec;
    fs::remove(dir.string() + std::string(kDoneSuffix), ec);
    fs::remove_all(dir, ec);
  }
}

// Temporary folders left by processes that died mid-fetch ("<kTempPrefix><pid>-...").
void RemoveAbandonedTemps(const fs::path& base) {
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (!StartsWith(file, kTempPrefix)) continue;
    pid_t pid = 0;
    const char* digits = file.data() + kTempPrefix.size();
    std::from_chars(digits, file.data() + file.size(), pid);
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
      std::error_code e2;
      fs::remove_all(it->path(), e2);
    }
  }
}

// Hard-links (or, across file systems, copies) `from` to `to`.
bool LinkOrCopy(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_hard_link(from, to, ec);
  if (!ec) return true;
  return fs::copy_file(from, to, ec) && !ec;
}

// A snapshot being built: a temporary folder, renamed into place by Commit, removed if never
// committed.
class SnapshotBuilder {
 public:
  SnapshotBuilder(fs::path base, std::string dir_name)
      : base_(std::move(base)), final_(base_ / dir_name) {
    static std::atomic<uint64_t> counter{0};
    temp_ = base_ / StrCat(kTempPrefix, ::getpid(), "-", counter.fetch_add(1), "-", dir_name);
  }
  ~SnapshotBuilder() {
    std::error_code ec;
    if (!committed_) fs::remove_all(temp_, ec);
  }

  absl::Status Create() {
    std::error_code ec;
    fs::remove_all(temp_, ec);
    fs::create_directories(temp_, ec);
    if (ec)
      return absl::InternalError(StrCat("cannot create '", temp_.string(), "': ", ec.message()));
    return absl::OkStatus();
  }
  const fs::path& temp() const { return temp_; }
  const fs::path& path() const { return final_; }

  // Moves the folder into place (replacing a leftover without marker), then writes the marker.
  absl::Status Commit(const std::string& manifest) {
    std::error_code ec;
    fs::remove_all(final_, ec);
    fs::rename(temp_, final_, ec);
    if (ec) {
      return absl::InternalError(
          StrCat("cannot move the snapshot into '", final_.string(), "': ", ec.message()));
    }
    committed_ = true;
    return WriteMarker(final_.string() + std::string(kDoneSuffix), manifest);
  }

 private:
  const fs::path base_;
  const fs::path final_;
  fs::path temp_;
  bool committed_ = false;
};

bool IsComplete(const fs::path& snapshot) {
  std::error_code ec;
  return fs::is_directory(snapshot, ec) &&
         fs::exists(snapshot.string() + std::string(kDoneSuffix), ec);
}

class S3Source final : public Source {
 public:
  S3Source(std::string url, S3RepositoryUrl where, S3Config config, SourceOptions options)
      : url_(std::move(url)),
        where_(std::move(where)),
        config_(std::move(config)),
        options_(std::move(options)),
        base_(fs::path(options_.cache_dir) / "s3" / where_.bucket / FlattenPrefix(where_.prefix)) {
    // Nothing is removed from a cache folder the server does not own (Fetch refuses it).
    if (CheckCacheDir(options_.cache_dir).ok()) RemoveAbandonedTemps(base_);
  }

  const std::string& url() const override { return url_; }
  bool remote() const override { return true; }

  absl::StatusOr<std::vector<SourceModel>> List() override {
    absl::StatusOr<std::vector<S3Object>> objects =
        ListS3Objects(config_, where_.bucket, where_.prefix);
    if (!objects.ok()) return Annotate(objects.status(), url_);
    return S3ModelsFromListing(where_.prefix, *objects);
  }

  absl::StatusOr<std::string> Fetch(const std::string& name, FetchStats* stats) override {
    if (!IsFolderName(name)) return NoSuchModel(name);
    if (absl::Status st = CheckCacheDir(options_.cache_dir); !st.ok()) return st;
    std::shared_ptr<inferd::Mutex> lock = LockFor(name);
    inferd::MutexLock hold(lock.get());
    FetchStats local;
    if (stats == nullptr) stats = &local;
    *stats = FetchStats{};
    const auto start = std::chrono::steady_clock::now();
    const std::string model_prefix = StrCat(where_.prefix, name, "/");
    absl::StatusOr<std::vector<S3Object>> objects =
        ListS3Objects(config_, where_.bucket, model_prefix);
    if (!objects.ok()) return Annotate(objects.status(), url_);
    absl::StatusOr<std::string> out;
    if (!objects->empty()) {
      out = FetchFolder(name, model_prefix, *objects, stats);
    } else if (IsArchiveName(name)) {
      out = FetchArchive(name, stats);
    } else {
      return NoSuchModel(name);
    }
    if (out.ok() && !stats->cache_hit) stats->download_seconds = SecondsSince(start);
    return out;
  }

 private:
  absl::Status NoSuchModel(std::string_view name) const {
    return absl::NotFoundError(StrCat("model repository '", url_, "' holds no model '", name, "'"));
  }

  std::shared_ptr<inferd::Mutex> LockFor(const std::string& name) {
    inferd::MutexLock lock(&locks_mu_);
    auto& m = locks_[name];
    if (!m) m = std::make_shared<inferd::Mutex>();
    return m;
  }

  absl::StatusOr<std::string> FetchFolder(const std::string& name, const std::string& model_prefix,
                                          std::vector<S3Object> objects, FetchStats* stats) {
    // Keys relative to the model folder; every one checked before anything is written.
    std::vector<S3Object> files;
    uint64_t total = 0;
    for (S3Object& o : objects) {
      if (IsFolderMarker(o)) continue;
      o.key.erase(0, model_prefix.size());
      if (absl::Status st = CheckS3RelativeKey(o.key); !st.ok()) {
        return absl::InvalidArgumentError(
            StrCat("s3://", where_.bucket, "/", model_prefix, ": ", st.message()));
      }
      total += static_cast<uint64_t>(o.size);
      files.push_back(std::move(o));
    }
    if (files.size() > options_.extract_limits.max_entries ||
        total > options_.extract_limits.max_total_bytes) {
      return absl::InvalidArgumentError(StrCat(
          "s3://", where_.bucket, "/", model_prefix, ": ", files.size(), " objects of ", total,
          " bytes exceed the model size limits (", options_.extract_limits.max_entries, " files, ",
          options_.extract_limits.max_total_bytes, " bytes)"));
    }
    SnapshotBuilder snapshot(base_, StrCat(name, "@", S3Fingerprint(files)));
    if (IsComplete(snapshot.path())) {
      stats->cache_hit = true;
      ModelCacheCap::Touch(snapshot.path().string());
      return snapshot.path().string();
    }
    if (absl::Status st = snapshot.Create(); !st.ok()) return st;
    const std::vector<fs::path> previous = CompleteSnapshots(base_, name);
    const Manifest reusable =
        previous.empty() ? Manifest{}
                         : ReadManifest(previous.front().string() + std::string(kDoneSuffix));
    std::string manifest;
    for (const S3Object& f : files) {
      absl::Status st =
          PlaceFile(model_prefix, f, snapshot.temp(),
                    previous.empty() ? fs::path() : previous.front(), reusable, stats);
      if (!st.ok()) return st;
      manifest += ManifestLine(f.key, f);
    }
    if (absl::Status st = snapshot.Commit(manifest); !st.ok()) return st;
    PruneSnapshots(base_, name, snapshot.path());
    if (options_.cache_cap) options_.cache_cap->Trim(snapshot.path().string());
    return snapshot.path().string();
  }

  // Puts one file of a folder model into the snapshot being built: linked from the previous
  // snapshot when that one holds the same ETag and size, else downloaded.
  absl::Status PlaceFile(const std::string& model_prefix, const S3Object& file, const fs::path& dir,
                         const fs::path& previous, const Manifest& reusable, FetchStats* stats) {
    const fs::path target = dir / file.key;
    std::error_code ec;
    // The key is checked (CheckS3RelativeKey) and the snapshot folder is fresh and private, so
    // no link can be on the way; its folders are still created beneath the snapshot, as an
    // archive's are (common/rooted_dir.h), so that holds by construction rather than by
    // reasoning.
    {
      absl::StatusOr<RootedDir> root = RootedDir::Open(dir.string());
      if (!root.ok()) return root.status();
      absl::StatusOr<UniqueFd> parent = root->MakeDirs(fs::path(file.key).parent_path().string());
      if (!parent.ok()) return parent.status();
    }
    if (auto it = reusable.find(file.key); it != reusable.end() && it->second.size == file.size &&
                                           it->second.etag == EtagForPath(file.etag)) {
      const fs::path old = previous / file.key;
      if (static_cast<int64_t>(fs::file_size(old, ec)) == file.size && !ec &&
          LinkOrCopy(old, target)) {
        return absl::OkStatus();
      }
    }
    const S3Location location{where_.bucket, StrCat(model_prefix, file.key)};
    if (absl::Status st = DownloadS3Object(config_, location, file, target.string()); !st.ok()) {
      return st;
    }
    stats->bytes_downloaded += file.size;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> FetchArchive(const std::string& name, FetchStats* stats) {
    const S3Location location{where_.bucket, StrCat(where_.prefix, name)};
    absl::StatusOr<S3Object> head = HeadS3Object(config_, location);
    if (absl::IsNotFound(head.status())) return NoSuchModel(name);
    if (!head.ok()) return head.status();
    SnapshotBuilder snapshot(base_, StrCat(name, "@", EtagForPath(head->etag)));
    if (!head->etag.empty() && IsComplete(snapshot.path())) {
      stats->cache_hit = true;
      ModelCacheCap::Touch(snapshot.path().string());
      return snapshot.path().string();
    }
    if (absl::Status st = snapshot.Create(); !st.ok()) return st;
    absl::Status st = ExtractS3Archive(config_, location, *head, snapshot.temp().string(),
                                       options_.extract_limits);
    if (!st.ok()) return st;
    stats->bytes_downloaded = head->size;
    if (st = snapshot.Commit(ManifestLine(name, *head)); !st.ok()) return st;
    PruneSnapshots(base_, name, snapshot.path());
    if (options_.cache_cap) options_.cache_cap->Trim(snapshot.path().string());
    return snapshot.path().string();
  }

  const std::string url_;
  const S3RepositoryUrl where_;
  const S3Config config_;
  const SourceOptions options_;
  const fs::path base_;  // this repository's folder in the cache
  inferd::Mutex locks_mu_;
  std::map<std::string, std::shared_ptr<inferd::Mutex>> locks_ ABSL_GUARDED_BY(locks_mu_);
};

}  // namespace

absl::Status CheckS3RelativeKey(std::string_view relative) {
  const auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        StrCat("key '", relative, "' cannot be written inside the model folder: ", why));
  };
  if (relative.empty()) return refuse("it is empty");
  if (relative.front() == '/') return refuse("it is absolute");
  for (unsigned char c : relative) {
    if (c < 0x20 || c == 0x7f) return refuse("it holds a control character");
  }
  for (size_t pos = 0; pos <= relative.size();) {
    size_t slash = relative.find('/', pos);
    if (slash == std::string_view::npos) slash = relative.size();
    const std::string_view segment = relative.substr(pos, slash - pos);
    if (segment.empty()) return refuse("it has an empty segment");
    if (segment == "." || segment == "..")
      return refuse(StrCat("it has a '", segment, "' segment"));
    pos = slash + 1;
  }
  return absl::OkStatus();
}

std::string S3Fingerprint(std::vector<S3Object> objects) {
  std::sort(objects.begin(), objects.end(),
            [](const S3Object& a, const S3Object& b) { return a.key < b.key; });
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 over length-prefixed fields
  for (const S3Object& o : objects) {
    for (std::string_view field : {std::string_view(o.key), std::string_view(o.etag)}) {
      h = Fnv1a(h, StrCat(field.size(), ":"));
      h = Fnv1a(h, field);
    }
    h = Fnv1a(h, StrCat(o.size, ";"));
  }
  static const char* kHex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[i] = kHex[h & 15];
  return out;
}

std::vector<SourceModel> S3ModelsFromListing(std::string_view prefix,
                                             const std::vector<S3Object>& objects) {
  std::map<std::string, std::vector<S3Object>> folders;
  std::map<std::string, S3Object> archives;
  for (const S3Object& o : objects) {
    if (!StartsWith(o.key, prefix)) continue;
    std::string_view rest = std::string_view(o.key).substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos) {
      if (IsArchiveName(rest) && IsFolderName(rest)) archives[std::string(rest)] = o;
      continue;
    }
    const std::string name(rest.substr(0, slash));
    if (!IsFolderName(name)) continue;
    std::vector<S3Object>& files = folders[name];  // a folder, even if only markers are in it
    if (IsFolderMarker(o)) continue;  // as in Fetch, which has no file to write for them
    S3Object relative = o;
    relative.key = std::string(rest.substr(slash + 1));
    files.push_back(std::move(relative));
  }
  std::vector<SourceModel> out;
  for (auto& [name, files] : folders) out.push_back({name, S3Fingerprint(files), false});
  for (auto& [name, object] : archives) {
    if (folders.count(name)) continue;  // a folder of that name wins, as in Fetch
    S3Object relative = object;
    relative.key.clear();
    out.push_back({name, S3Fingerprint({relative}), true});
  }
  std::sort(out.begin(), out.end(),
            [](const SourceModel& a, const SourceModel& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<std::unique_ptr<Source>> MakeS3Source(const std::string& url,
                                                     const SourceOptions& options) {
  absl::StatusOr<S3RepositoryUrl> where = ParseS3RepositoryUrl(url);
  if (!where.ok()) return where.status();
  S3Config config = options.s3;
  if (!where->endpoint.empty()) config.endpoint = where->endpoint;
  // The repository must exist and answer: one key of the listing is enough to know.
  absl::StatusOr<S3ListPage> probe = ListS3Page(config, where->bucket, where->prefix, "", 1);
  if (!probe.ok()) return Annotate(probe.status(), url);
  return std::unique_ptr<Source>(new S3Source(url, *std::move(where), std::move(config), options));
}

}  // namespace inferd::repository
