// The registry of models: which exist in the repositories, which versions are loaded, their
// state and the reason a load failed. Loading, unloading, reloading on change (poll mode).
//
// States of a version: LOADING -> READY -> UNLOADING -> UNAVAILABLE, and LOADING ->
// UNAVAILABLE with a reason when the load fails. A model whose config does not parse has no
// versions and is UNAVAILABLE with the parse error as its reason.
//
// Thread-safe. Loads and unloads are serialized by one mutex (load_mu_) and run on the
// caller's thread; lookups (Get) take a short shared lock and never wait for a load.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "backends/backend.h"
#include "config/model_config_util.h"
#include "repository/model.h"

namespace inferd::repository {

// A model name must be usable as one folder name: not empty, not "." or "..", no '/', '\\' or
// control characters, valid UTF-8. Errors are InvalidArgument and quote the name.
absl::Status ValidateModelName(std::string_view name);

enum class ModelState { kLoading, kReady, kUnloading, kUnavailable };
std::string_view ModelStateName(ModelState state);

struct IndexEntry {
  std::string name;
  std::string version;  // empty when the model has no loaded or failed version
  std::string state;    // empty for a model present in the repository but never loaded
  std::string reason;
};

struct LifecycleOptions {
  std::vector<std::string> repositories;
  bool auto_complete = true;
  LoadOptions load;
};

class ModelLifecycle {
 public:
  ModelLifecycle(LifecycleOptions options, const backends::BackendRegistry* backends);
  ~ModelLifecycle();  // Unloads everything, draining requests in flight.

  // Loads (or reloads) `name` from the repositories; `override_config` replaces config.pbtxt.
  // Old versions keep serving until the new ones are READY. Returns the first version's
  // error when the load fails.
  absl::Status Load(const std::string& name,
                    const std::optional<config::ModelConfig>& override_config = std::nullopt);
  // Loads every model in the repositories (control mode none, `--load-model=*`).
  // Returns an error naming each model that failed.
  absl::Status LoadAll();
  // Loads `name` from the model folder `dir`, which need not be in a repository (SageMaker
  // multi-model loads). The model is served as `name` whatever its config.pbtxt calls it.
  absl::Status LoadFromDirectory(const std::string& name, const std::string& dir);
  absl::Status Unload(const std::string& name);
  // Poll mode: loads new models, reloads changed ones, unloads removed ones.
  void Poll();
  void UnloadAll();

  // The ready model for `version` (-1: the newest ready version).
  absl::StatusOr<std::shared_ptr<const Model>> Get(std::string_view name, int64_t version) const;
  // Every ready version of `name`, ascending (for metadata).
  std::vector<std::shared_ptr<const Model>> ReadyVersions(std::string_view name) const;
  // State of one version, for the ready endpoint.
  bool IsReady(std::string_view name, int64_t version) const;
  // Models in the repositories and their state.
  std::vector<IndexEntry> Index(bool ready_only) const;
  // True when every model that was asked to load is READY.
  bool AllReady() const;
  // Ready models, for the statistics endpoint.
  std::vector<std::shared_ptr<const Model>> AllReadyModels() const;

 private:
  struct VersionSlot {
    ModelState state = ModelState::kLoading;
    std::string reason;
    std::shared_ptr<const Model> model;
  };
  struct Entry {
    std::string dir;
    std::string fingerprint;
    std::string reason;  // load failure before any version (bad config)
    bool failed = false;
    std::map<int64_t, VersionSlot> versions;
  };

  absl::Status LoadLocked(const std::string& name, const std::string& dir,
                          const std::optional<config::ModelConfig>& override_config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);
  absl::StatusOr<config::ModelConfig> BuildConfig(
      const std::string& name, const std::string& dir,
      const std::optional<config::ModelConfig>& override_config);
  void SetFailed(const std::string& name, const std::string& dir, const absl::Status& status);
  // Checks an ensemble's steps against its composing models, loading those that are in a
  // repository but not loaded (as tritonserver does).
  absl::Status PrepareEnsemble(const config::ModelConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);
  bool IsReadyAtDepth(std::string_view name, int64_t version, int depth) const;

  const LifecycleOptions options_;
  const backends::BackendRegistry* backends_;

  inferd::Mutex load_mu_;  // serializes loads and unloads; taken before mu_
  // Models loaded during the current LoadAll or Poll pass, so an ensemble's composing model
  // is not loaded twice; null outside a pass.
  std::set<std::string>* pass_loaded_ ABSL_GUARDED_BY(load_mu_) = nullptr;
  // Ensembles whose composing models are being loaded, to refuse cycles between ensembles.
  std::vector<std::string> ensemble_stack_ ABSL_GUARDED_BY(load_mu_);
  mutable inferd::Mutex mu_;
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace inferd::repository
