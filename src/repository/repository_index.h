// The repository index: the model repositories (--model-repository, each a Source), the models
// they hold in one pass (Scan), and Triton's rules for a name several repositories hold:
// without --model-namespacing it is no model (each copy is a duplicate, with Triton's reason);
// with it, each repository's copy is its own model, keyed "<repository>::<name>" inside the
// store (NamespacedName), and PlainName gives the model's own name back.
//
// Thread-safe after Open: the sources are fixed from then on (each Source is thread-safe).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "repository/source.h"

namespace inferd::repository {

// NOT_FOUND for a model (or a version of it) that is not served, in Triton's words: "Request for
// unknown model: '<m>' is not found", or "... '<m>' version <v> is not found" (its
// ModelRepositoryManager::GetModel), then `detail` in parentheses when given. tritonclient's own
// examples (simple_http_infer_client.py and others) check that the message starts with
// "Request for unknown model".
absl::Status UnknownModelError(std::string_view name, int64_t version = -1,
                               std::string_view detail = "");

class RepositoryIndex {
 public:
  explicit RepositoryIndex(bool namespacing) : namespacing_(namespacing) {}

  // One model a repository holds, for one pass.
  struct Listed {
    Source* source = nullptr;
    SourceModel model;
  };
  struct Scan {
    // Keyed by name, or by "<repository>::<name>" for a name several repositories hold under
    // --model-namespacing (Listed::model.name stays the repository's own name).
    std::map<std::string, Listed> models;
    std::map<std::string, std::string> duplicates;  // name -> reason
    std::vector<std::string> errors;                // repositories that could not be listed
  };

  // Opens every repository, once, before anything else. A folder that does not exist or a
  // bucket that cannot be reached is an INVALID_ARGUMENT naming it (each one that failed).
  absl::Status Open(const std::vector<std::string>& urls, const SourceOptions& options);

  // Lists every repository now. One that cannot be listed is named in `errors` (and logged);
  // the others are listed still.
  Scan List() const;

  // What the store holds of one model, for a poll's diff.
  struct Held {
    std::string source_fingerprint;  // the listing's fingerprint at its last load
    // Loaded from the repositories and pinned: a listing without it unloads it (a model
    // loaded on demand or from a URL stays).
    bool removable = false;
    // The store keys its loaded ensemble's steps name (only needed under --model-namespacing).
    std::set<std::string> steps;
  };
  // What a poll acts on: the held models `scan` no longer lists, and the listed models that
  // are new or whose files changed (an archive's entries are never reloaded by a poll). Under
  // --model-namespacing a name that a repository gained or lost changes key ("m" <->
  // "<repository>::m"), so the ensembles that run it count as changed too (their steps resolve
  // again).
  struct Diff {
    std::vector<std::string> removed;
    std::map<std::string, Listed> changed;
  };
  Diff Compare(const Scan& scan, const std::map<std::string, Held, std::less<>>& held) const;

  // Where one model's files were found, fetched into a local folder.
  struct Located {
    Source* source = nullptr;  // the repository that holds it (null: named by a URL)
    std::string source_name;   // its name in that repository
    std::string dir;
    FetchStats fetch;
  };
  // Fetches `name` from `source` into a local folder: the store's fetch, which counts what it
  // downloaded and what failed in its metrics.
  using FetchFn =
      absl::FunctionRef<absl::StatusOr<std::string>(Source*, const std::string&, FetchStats*)>;
  // The first repository (in --model-repository order) that holds `source_name`, fetched.
  // NOT_FOUND naming every repository when none does; a fetch that fails otherwise (S3
  // unreachable, an unsafe archive) fails the search with its error.
  absl::StatusOr<Located> Locate(const std::string& source_name, FetchFn fetch) const;
  // A model named by a URL, as SageMaker's multi-model API and POST /models send it: a local
  // folder (used in place), a local archive, or s3://<bucket>/<key> (fetched through a source
  // for its parent folder or prefix). A URL that is malformed, missing or denied is an
  // INVALID_ARGUMENT naming it (the client's error).
  static absl::StatusOr<Located> LocateUrl(const std::string& url, const SourceOptions& options,
                                           FetchFn fetch);

  // The model's own name of a store key ("<repository>::m" -> "m"); the key itself otherwise.
  std::string PlainName(const std::string& key) const;
  // How many repositories' namespaced copies of `name` `scan` holds.
  size_t CopiesOf(const Scan& scan, std::string_view name) const;

  bool namespacing() const { return namespacing_; }
  const std::vector<std::unique_ptr<Source>>& sources() const { return sources_; }

 private:
  const bool namespacing_;
  std::vector<std::unique_ptr<Source>> sources_;  // set by Open, fixed after
};

}  // namespace inferd::repository
