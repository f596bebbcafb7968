// Where models come from. A `Source` is one model repository (`--model-repository`, or the
// location a SageMaker multi-model load names): it lists the models it holds and makes one of
// them available as a local folder, which is all the rest of the server ever reads.
//
//   local folder   /models            every sub-folder is a model; an archive file
//                                     (.tar.gz, .tgz, .tar) is a model named by its file name,
//                                     extracted into the cache on fetch
//   S3             s3://bucket/prefix, s3://host:port/bucket/prefix (Triton's form: the
//                                     endpoint is http://host:port)
//                                     the same layout under the prefix; objects are downloaded
//                                     into the cache, keyed by their ETags, which survives restarts
//
// Thread-safety: List and Fetch may be called from several threads at once, also for the same
// model (two fetches of one model return the same folder; the second waits or re-validates).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rooted_dir.h"
#include "repository/archive.h"
#include "repository/model_cache.h"
#include "repository/s3.h"

namespace inferd::repository {

// One model a repository holds.
struct SourceModel {
  std::string name;         // folder name, or an archive's file name ("resnet.tar.gz")
  std::string fingerprint;  // changes whenever the model's files change (poll mode)
  bool archive = false;     // an archive to extract, not a folder
};

// What one Fetch did, for the metrics and the log.
struct FetchStats {
  bool cache_hit = false;        // nothing was downloaded or extracted
  int64_t bytes_downloaded = 0;
  double download_seconds = 0;   // downloading (and, when streamed, extracting)
};

struct SourceOptions {
  // Where remote models are downloaded and archives extracted (--model-cache-dir). The
  // default is private to the server's user (common/rooted_dir.h DefaultPrivateCacheDir:
  // $XDG_CACHE_HOME/inferd or /tmp/inferd-<uid>), never a fixed name in a
  // world-writable folder where another user could plant a model first. Whatever folder is
  // named must pass CheckCacheDir before anything is read from or written to it.
  std::string cache_dir = DefaultPrivateCacheDir() + "/model-cache";
  // The cache's size cap (--model-cache-max-bytes), shared by every source; null: no cap.
  std::shared_ptr<ModelCacheCap> cache_cap;
  ExtractLimits extract_limits;
  S3Config s3;  // credentials, region, endpoint (AWS_* environment)
};

class Source {
 public:
  virtual ~Source() = default;

  // The location as the user wrote it, for messages.
  virtual const std::string& url() const = 0;
  // True for a repository whose listing and fetching reach over the network.
  virtual bool remote() const = 0;

  // Every model the repository holds, sorted by name. Errors name the repository:
  // NOT_FOUND (no such folder or bucket), PERMISSION_DENIED, UNAVAILABLE (unreachable).
  virtual absl::StatusOr<std::vector<SourceModel>> List() = 0;

  // Makes `name` (as List returns it) available as a local folder and returns its path: the
  // folder itself for a local model folder; for an archive or a remote model, a folder in the
  // cache holding what was extracted or downloaded (an archive's folder may hold one model or
  // an ensemble and its parts). NOT_FOUND when the repository does not hold `name`.
  virtual absl::StatusOr<std::string> Fetch(const std::string& name, FetchStats* stats) = 0;
};

// The source for `url`: "s3://..." or a local folder. A folder that does not exist, or a
// bucket that cannot be reached, is an error naming it.
// Makes `cache_dir` (and its parents) a folder only the server's user can write, or checks the
// one there, as ssh's StrictModes does: a link, a folder owned by another user or writable by
// group or others is refused with the command that fixes it. INTERNAL either way (a cache the
// server cannot trust or write is the server's fault: 500, not the client's).
absl::Status CheckCacheDir(const std::string& cache_dir);

absl::StatusOr<std::unique_ptr<Source>> OpenSource(const std::string& url,
                                                   const SourceOptions& options);

// True when `path` names an archive inferd extracts (.tar.gz, .tgz, .tar).
bool IsArchiveName(std::string_view path);

}  // namespace inferd::repository
