// The model store: which models the repositories hold, which versions are loaded, their state
// and the reason a load failed; loading (at start, through the repository API, on a model's
// first request, from a SageMaker multi-model URL), unloading, reloading on change (poll
// mode), and one memory budget over every loaded model with an eviction policy.
//
// States of a version: LOADING -> READY -> UNLOADING -> UNAVAILABLE, and LOADING ->
// UNAVAILABLE with a reason when the load fails (VersionState, version_state.h, holds the
// table of legal transitions and refuses any other). A model whose config does not parse has no
// versions and is UNAVAILABLE with the parse error as its reason. A reload that fails leaves
// the versions that were serving in place (READY, with the failure as their reason).
//
// Residency: a model loaded at start (control modes none and poll), through the repository API
// or by --load-model is pinned: only an unload removes it. A model loaded on demand (its first
// request, in --model-control-mode=on-demand) or through the SageMaker multi-model API is
// evictable: when a load would exceed --model-memory-budget, the eviction policy picks idle
// evictable models to unload (never one with requests in flight); the store remembers where
// each came from and loads it again on its next request.
//
// Threads: loads of different models run in parallel on the store's loader pool
// (--model-load-thread-count) or on the caller's thread; two loads of one model never run at
// once (the second waits for the first, and an on-demand request joins the running load).
// Lookups (Get) take only the serving map's short shared lock and never wait for a load. With a budget and RSS
// accounting, the part of a load that creates the backend's instances is serialized, so each
// model's footprint is the process's RSS growth over its own load.
//
// Its rooms: RepositoryIndex (the repositories, one pass over what they hold, and a poll's
// diff of that pass against what the store holds, which the store then acts on), VersionState
// (one version's legal transitions), MemoryBudget (reservations, footprints, the eviction
// policy's calls) and LoadWaiters (requests waiting for on-demand loads, and their reaper).
// ServingMap (serving_map.h) is what serves: the store publishes each READY / unload
// transition into it, and Get and its friends read it without taking mu_.
// Their mutexes are leaves below this store's mu_.
//
// Thread-safe. Open() once before anything else.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "common/mutex.h"
#include "common/worker_pool.h"
#include "config/model_config_util.h"
#include "core/cancellation.h"
#include "metrics/prometheus.h"
#include "repository/eviction_policy.h"
#include "repository/load_waiters.h"
#include "repository/memory_budget.h"
#include "repository/model.h"
#include "repository/repository_index.h"
#include "repository/serving_map.h"
#include "repository/source.h"
#include "repository/version_state.h"

namespace inferd::repository {

// A model name must be usable as one folder name: not empty, not "." or "..", no '/', '\\' or
// control characters, valid UTF-8. Errors are InvalidArgument and quote the name.
absl::Status ValidateModelName(std::string_view name);


struct IndexEntry {
  std::string name;
  std::string version;  // empty when the model has no loaded or failed version
  std::string state;    // empty for a model present in the repository but never loaded
  std::string reason;
};

// The folder a model is loaded from when it came out of an archive or a multi-model URL: a
// model folder, or a folder of models of which one (the ensemble) is served and the others are
// its parts. SageMaker Triton's rules: a folder with config.pbtxt (or numeric version folders)
// is the model; otherwise its only sub-folder, or the ensemble among several.
absl::StatusOr<std::string> ChooseModelFolder(const std::string& root);

// The path of a "file:<path>" load parameter: relative, inside the model folder (no "..", no
// empty or "." part). INVALID_ARGUMENT naming the parameter.
absl::Status ValidateOverrideFilePath(const std::string& path);

struct LifecycleOptions {
  std::vector<std::string> repositories;  // folders or s3:// URLs
  bool auto_complete = true;
  LoadOptions load;
  SourceOptions sources;
  bool on_demand = false;  // --model-control-mode=on-demand
  int load_threads = 4;    // --model-load-thread-count
  absl::Duration load_wait = absl::Seconds(60);  // --model-load-wait-secs
  int64_t memory_budget_bytes = 0;               // 0: no budget
  // A model's footprint: the process's RSS growth over its load (at least its size on disk),
  // or only its size on disk (exact and repeatable, blind to what a backend allocates).
  bool footprint_from_disk = false;
  std::string eviction_policy = "cost";  // "cost" (recency, frequency, size, reload time) | "lru"
  std::string model_config_name;  // --model-config-name (config::ModelConfigPath)
  // --model-namespacing: a name held by several repositories is one model per repository
  // (keyed "<repository>::<name>" inside the store), each ensemble's steps resolve in its own
  // repository first, and a request by such a name is refused as ambiguous (Triton's rules).
  bool namespacing = false;
  // --model-load-gpu-limit: GPU id -> fraction of its memory. A load that places instances on
  // such a GPU is refused when the GPU's used memory plus what the model took there at its
  // last load would exceed the fraction of its total (Triton's check, which uses the current
  // usage alone), after evicting idle evictable models that hold memory on that GPU.
  std::map<int, double> gpu_load_limits;
};

// The store-wide counters behind the inferd_model_* metrics.
struct StoreCounters {
  uint64_t loads = 0, load_failures = 0;
  uint64_t evictions = 0;
  uint64_t hits = 0, misses = 0;     // requests that found their model loaded / had to load it
  uint64_t waited = 0, wait_timeouts = 0;
  double load_seconds = 0, download_seconds = 0;
  uint64_t download_bytes = 0, fetch_cache_hits = 0;
};

class ModelLifecycle {
 public:
  ModelLifecycle(LifecycleOptions options, const backends::BackendRegistry* backends);
  ~ModelLifecycle();  // Unloads everything, draining requests in flight.

  // Finishes the loads under way, answers every request still waiting for one, and unloads
  // everything, draining requests in flight. Idempotent; the destructor calls it.
  void Shutdown();

  // Opens every repository. A folder that does not exist or a bucket that cannot be reached
  // is an error naming it.
  absl::Status Open();

  // Loads (or reloads) `name` from the repositories; `override_config` replaces config.pbtxt.
  // Old versions keep serving until the new ones are READY, and keep serving if they fail.
  // Pinned. Returns the first version's error when the load fails.
  // `files` (Triton's "file:<version>/<path>" load parameters: relative path -> content) form
  // a temporary model folder that replaces the repository's copy of `name` (which need not
  // exist there); they need `override_config`. A later load without files reads the
  // repository again. The folder is deleted when the model is unloaded or loaded again.
  absl::Status Load(const std::string& name,
                    const std::optional<config::ModelConfig>& override_config = std::nullopt,
                    const std::map<std::string, std::string>& files = {});
  // Loads every model folder in the repositories (control modes none and poll, `--load-model=*`),
  // in parallel on the loader pool. Returns an error naming each model that failed.
  absl::Status LoadAll();
  // SageMaker multi-model load: `url` is a model folder, an archive (.tar.gz, .tgz, .tar) or
  // an s3:// object or prefix; the model chosen in it (ChooseModelFolder) is served as `name`
  // whatever its config.pbtxt calls it, and an ensemble's parts beside it are loaded too.
  // Evictable; ALREADY_EXISTS when `name` is loaded.
  absl::Status LoadFromUrl(const std::string& name, const std::string& url);
  // With `unload_dependents` (Triton's parameter), also unloads the models an ensemble runs
  // that were loaded only because it runs them (not loaded by name themselves) and that no
  // other loaded ensemble runs, recursively, as Triton's dependency graph does. A name that
  // is not loaded (unknown, or never loaded) is OK and changes nothing, as in Triton.
  absl::Status Unload(const std::string& name, bool unload_dependents = false);
  // Unload, and forget where the model came from (SageMaker DELETE /models/<name>).
  absl::Status Forget(const std::string& name);
  // Poll mode: loads new models, reloads changed ones, unloads removed ones. A new or changed
  // model of a local folder loads once it has settled: its files unchanged since the previous
  // poll, or none written for kPollSettle; until then the old version keeps serving.
  void Poll();
  void UnloadAll();

  // Calls `then` once `name` can be looked up: at once (on this thread) when it is loaded, or
  // when nothing can load it; otherwise after the load it starts or joins (on a loader thread),
  // or with UNAVAILABLE after the wait limit. Loads only in on-demand mode or for a model the
  // store remembers (evicted). `source_name` is the repository entry to load when it differs
  // from `name` (SageMaker's TargetModel archive). One name is bound to one source: when
  // `name` is loaded (or remembered) from another source, is being loaded from another, or is
  // a model of the repositories itself, `then` gets ALREADY_EXISTS naming both (HTTP 409).
  void WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
                     const std::string& source_name = "");
  // The waiting request's own limits: when `cancel` fires, or at `deadline_ns` (monotonic; 0:
  // none) if that comes before the wait limit, `then` gets CANCELLED or DEADLINE_EXCEEDED (an
  // empty message: the caller names the request) at once, and the load goes on for others.
  struct WaitLimits {
    std::shared_ptr<core::CancellationToken> cancel;
    uint64_t deadline_ns = 0;
  };
  void WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
                     const WaitLimits& limits);

  // The ready model for `version` (-1: the newest ready version). Counts a use for eviction.
  absl::StatusOr<std::shared_ptr<const Model>> Get(std::string_view name, int64_t version) const;
  // Every ready version of `name`, ascending (for metadata).
  std::vector<std::shared_ptr<const Model>> ReadyVersions(std::string_view name) const;
  // State of one version, for the ready endpoint. Never loads.
  bool IsReady(std::string_view name, int64_t version) const;
  // Models in the repositories and their state.
  std::vector<IndexEntry> Index(bool ready_only) const;
  // True when every model that was asked to load is READY.
  bool AllReady() const;
  // Ready models, for the statistics endpoint.
  std::vector<std::shared_ptr<const Model>> AllReadyModels() const;
  // The measured footprint of one loaded version (0 when not loaded).
  int64_t FootprintBytes(std::string_view name, int64_t version) const;
  // Models loaded through LoadFromUrl and their URLs, and those an on-demand request loaded
  // from the repository entry it named (WhenAvailable's `source_name`), with the entry's URL
  // (SageMaker GET /models).
  std::map<std::string, std::string> UrlModels() const;

  void CollectMetrics(metrics::PrometheusWriter& w) const;

 private:
  enum class Residency { kPinned, kEvictable, kPart };
  struct VersionSlot {
    VersionState state;  // its reason is the index's
    std::shared_ptr<const Model> model;  // set while READY
    int64_t footprint = 0;
    std::map<int, int64_t> gpu_bytes;  // device memory by GPU id, measured or reported at load
  };
  // A slot for a version whose load begins (LOADING).
  static VersionSlot NewSlot(const std::string& name, int64_t version);
  // How often and how recently a model is used; counted by the serving map's lookups.
  using Usage = ModelUsage;
  // Where a model comes from, so it can be loaded again after an eviction.
  struct Origin {
    Source* source = nullptr;  // a repository entry (`source_name` in it)
    std::string source_name;
    std::string url;  // or a SageMaker multi-model URL
    // Named by the request that loaded it (SageMaker's TargetModel), not by the model's name:
    // listed by UrlModels, as a model loaded through POST /models is.
    bool targeted = false;
  };
  struct Entry {
    std::string dir;
    std::string fingerprint;
    std::string reason;  // load failure before any version (bad config)
    bool failed = false;
    uint64_t failed_at_ns = 0;
    std::string source_fingerprint;
    Residency residency = Residency::kPinned;
    std::optional<Origin> origin;
    std::vector<std::string> parts;  // an archive ensemble's composing models
    int64_t last_footprint = 0;      // its versions' footprint at its last load (kept after an eviction)
    std::map<int64_t, int64_t> measured;  // version -> largest footprint measured for `fingerprint`
    std::map<int, int64_t> last_gpu_bytes;  // GPU id -> device memory at its last load (kept)
    // Loaded once from `origin`: the name is bound to that source until it is forgotten, and a
    // request naming another source for it is refused (never served by the wrong model).
    bool bound = false;
    // Loaded by name (a load request, --load-model, the start, a poll, on demand), not only
    // as an ensemble's step: unload_dependents leaves it loaded.
    bool explicit_load = false;
    // The temporary folder of a load with "file:" parameters (removed with the entry's load).
    std::shared_ptr<const std::string> override_dir;
    std::shared_ptr<Usage> usage = std::make_shared<Usage>();
    std::map<int64_t, VersionSlot> versions;
  };
  using Listed = RepositoryIndex::Listed;
  using Scan = RepositoryIndex::Scan;
  // Per-call state of a load and the loads it starts (an ensemble's parts).
  struct LoadContext {
    std::set<std::string>* pass = nullptr;       // claimed during this LoadAll / Poll pass (mu_)
    std::vector<std::string> ensemble_stack;     // to refuse cycles
    std::map<std::string, std::string> siblings; // name -> folder, beside an archive's model
    Residency residency = Residency::kPinned;
    std::optional<Origin> origin;
    std::string source_fingerprint;              // the listing's fingerprint (poll mode)
    std::vector<std::string> parts;              // receives the siblings loaded
    bool explicit_load = true;                   // false for a model loaded as an ensemble's step
    std::string ns;  // the repository the model comes from (--model-namespacing: its namespace)
  };
  using Located = RepositoryIndex::Located;

  // Claims `name` for one load: waits while another load of it runs (up to the wait limit),
  // then false if this pass already loaded it. Unclaim when done.
  absl::StatusOr<bool> Claim(const std::string& name, LoadContext& ctx);
  void Unclaim(const std::string& name);
  // Claims, loads, unclaims.
  absl::Status LoadOne(const std::string& name, const std::string& dir,
                       const std::optional<config::ModelConfig>& override_config,
                       LoadContext& ctx);
  // The load itself; `name` is claimed.
  absl::Status LoadClaimed(const std::string& name, const std::string& dir,
                           const std::optional<config::ModelConfig>& override_config,
                           LoadContext& ctx);
  // LoadClaimed's steps, in order.
  // A failure before any version loaded: remembered (the index shows it), counted, returned.
  absl::Status RecordFailure(const std::string& name, const std::string& dir,
                             const std::string& fingerprint, const LoadContext& ctx,
                             const absl::Status& st);
  // The versions `cfg`'s version_policy serves from `dir`, and those it names that are missing.
  struct ChosenVersions {
    std::vector<int64_t> wanted;
    std::map<int64_t, std::string> missing;  // version -> reason
  };
  static ChosenVersions ChooseVersions(const config::ModelConfig& cfg, const std::string& dir);
  // Under a budget, reserves the load's estimated footprint (`reserved`), making room for it.
  absl::Status ReserveRoom(const std::string& name, int64_t on_disk, absl::Time deadline,
                           int64_t* reserved) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the new versions LOADING; returns the footprints measured before for these files.
  std::map<int64_t, int64_t> BeginLoadingVersions(const std::string& name, const std::string& dir,
                                                  const std::string& fingerprint,
                                                  const std::vector<int64_t>& wanted)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Loads one version and measures its footprint: a READY slot, or an UNAVAILABLE one with the
  // reason (also the first error, when none is set yet).
  VersionSlot LoadVersion(const std::string& name, const config::ModelConfig& cfg,
                          const std::string& dir, int64_t version, backends::Backend* backend,
                          const std::string& ns, int64_t on_disk, int64_t measured_before,
                          absl::Status* first_error);
  // Puts `fresh` in place of the model's versions (a failed reload keeps the old one serving),
  // settles the reservation with the measured footprints and records the load; the versions
  // replaced go to `retired`. Returns the footprint the policy weighs (with the parts).
  int64_t SwapIn(const std::string& name, const std::string& fingerprint, const LoadContext& ctx,
                 std::map<int64_t, VersionSlot> fresh, const std::map<int64_t, int64_t>& on_disk,
                 int64_t reserved, bool all_loaded, double seconds,
                 std::vector<std::shared_ptr<const Model>>* retired) ABSL_LOCKS_EXCLUDED(mu_);
  // Under a budget, makes room for what the load measured beyond its reservation, or gives the
  // model back (remembered as failed only when it can never fit).
  absl::Status CheckFootprintFits(const std::string& name, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Load's repository path (no "file:" parameters).
  absl::Status LoadFromRepository(const std::string& name,
                                  const std::optional<config::ModelConfig>& override_config);
  // Writes the "file:" parameters into <temporary folder>/<name>/ and returns the temporary
  // folder, deleted when the last holder lets go.
  absl::StatusOr<std::shared_ptr<const std::string>> WriteOverrideFolder(
      const std::string& name, const std::map<std::string, std::string>& files);
  absl::StatusOr<config::ModelConfig> BuildConfig(
      const std::string& name, const std::string& dir,
      const std::optional<config::ModelConfig>& override_config);
  void SetFailed(const std::string& name, const std::string& dir, const absl::Status& status);
  // Loads the models an ensemble runs; under --model-namespacing sets each step's
  // model_namespace to the repository whose copy it runs (its own repository's first).
  absl::Status PrepareEnsemble(config::ModelConfig& config, LoadContext& ctx);
  // --model-namespacing: the store key a name resolves to (itself when it is a key; the one
  // namespaced copy; INVALID_ARGUMENT, as Triton, when several repositories hold it).
  absl::StatusOr<std::string> ResolveLocked(std::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The model's own name of a store key ("<repository>::m" -> "m").
  std::string PlainName(const std::string& key) const;
  bool IsReadyAtDepth(std::string_view name, int64_t version, int depth) const;
  // Get, which counts a use (for the eviction policy and the hit metric) only with count_use:
  // the serving map, and on a miss LookupSlow.
  absl::StatusOr<std::shared_ptr<const Model>> Lookup(std::string_view name, int64_t version,
                                                      bool count_use) const;
  // Lookup under mu_: resolves a namespaced name, and says why a model is not served.
  absl::StatusOr<std::shared_ptr<const Model>> LookupSlow(std::string_view name, int64_t version,
                                                          bool count_use) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the serving map show `key`'s ready versions (none when it has no entry). Called after
  // every change to which of its versions are READY.
  void PublishLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds `source_name` in the repositories (first that holds it) and fetches it locally.
  absl::StatusOr<Located> Locate(const std::string& source_name);
  // source->Fetch, with what it downloaded counted in the metrics.
  absl::StatusOr<std::string> FetchCounted(Source* source, const std::string& name,
                                           FetchStats* stats);
  absl::StatusOr<Located> FetchUrl(const std::string& url);
  // Loads an archive's or URL's root folder: the chosen model as `name`, its parts beside it.
  absl::Status LoadFromRoot(const std::string& name, const std::string& root, LoadContext& ctx);
  void WhenAvailableImpl(const std::string& name, std::function<void(absl::Status)> then,
                         const std::string& source_name, const WaitLimits& limits);
  // The on-demand load of `name`, run on a loader thread.
  absl::Status LoadOnDemand(const std::string& name, const std::string& source_name);

  // Memory budget. Makes room for `needed` more bytes under the budget (budget_) by evicting
  // the victims it names, and (with `reserved`) holds them there until the load settles. While the budget
  // is full only for now (models in use, other loads' reservations), waits for room until
  // `deadline` (the load-wait limit) and then answers UNAVAILABLE: a full budget, not a broken
  // model. RESOURCE_EXHAUSTED when `at_least` bytes more could never fit (pinned models and
  // ensemble parts hold the rest).
  // `reserved` (when not null) receives the bytes held, which the caller gives back.
  absl::Status MakeRoom(const std::string& name, int64_t needed, int64_t at_least,
                        absl::Time deadline, int64_t* reserved) ABSL_LOCKS_EXCLUDED(mu_);
  // --model-load-gpu-limit for GPU `device`: OK when its used memory plus `needed` stays within
  // its limit (or it has none), evicting idle evictable models that hold memory on that GPU
  // (the policy's order, one at a time, measuring again after each); else RESOURCE_EXHAUSTED
  // naming the GPU, its limit, its usage and the models holding memory on it. The caller holds
  // the device's load lock.
  absl::Status MakeDeviceRoom(const std::string& name, int device, int64_t needed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The footprint a load of `name` will likely have: its own last measured footprint, else its
  // size on disk plus the largest overhead (footprint minus size on disk) measured so far.
  int64_t EstimateFootprintLocked(const Entry& e, int64_t on_disk) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // What the budget needs to know of the models to make room (and counts their uses as seen).
  MemoryBudget::Models BudgetModelsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EvictableLocked(const std::string& name, const Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a loaded entry other than `leaving` lists `part` among its parts.
  bool SharedPartLocked(const std::string& part, const std::string& leaving) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The models a loaded ensemble's steps name (empty for a model that is not a loaded ensemble).
  std::set<std::string> StepModelsLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees versions taken out of the registry (outside mu_: each drains its in-flight
  // requests), hands the memory they held back to the kernel (so an unload, a reload or an
  // eviction shows up in RSS), and only then stops counting it against the budget.
  void FreeRetired(std::vector<std::shared_ptr<const Model>>* retired) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes every version of `name` (and its parts no other ensemble shares) out of the registry; the caller frees them
  // outside mu_ with FreeRetired.
  void RetireLocked(const std::string& name, std::string_view reason,
                    std::vector<std::shared_ptr<const Model>>* retired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LifecycleOptions options_;
  const backends::BackendRegistry* backends_;
  RepositoryIndex index_;  // the repositories and what they hold
  // The memory budget and the eviction policy (its mutex is a leaf: called under mu_ too).
  MemoryBudget budget_;

  inferd::Mutex pass_mu_;     // one LoadAll / Poll pass at a time
  // Poll mode: each listed model's fingerprint at the previous poll. A new or changed model
  // loads only once its files are the same at two polls in a row (or older than the settle
  // time): a file still being written in place is never loaded half-written.
  std::map<std::string, std::string> poll_seen_ ABSL_GUARDED_BY(pass_mu_);
  inferd::Mutex measure_mu_;  // instance creation, when footprints are RSS growth under a budget
  // One per GPU: held around the creation of a version's GPU instances (and the limit check),
  // so that the device memory measured before and after is that version's own. Loads on other
  // GPUs and CPU-only loads go on meanwhile. Taken after measure_mu_, in ascending GPU order.
  std::vector<std::unique_ptr<inferd::Mutex>> device_load_mu_;
  std::atomic<int> instantiating_{0};          // loads creating instances right now
  std::atomic<uint64_t> instantiations_{0};    // ever started (to see an overlap)

  mutable inferd::Mutex mu_;
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  // Names being loaded (any route): a second load of one waits.
  std::set<std::string, std::less<>> loading_ ABSL_GUARDED_BY(mu_);
  // Names no repository held, and when that was seen: a storm of requests for unknown names
  // does not become a storm of repository listings.
  std::map<std::string, uint64_t, std::less<>> not_found_ ABSL_GUARDED_BY(mu_);
  mutable StoreCounters counters_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> hits_{0};
  // The ready versions, as requests see them (published under mu_; read without it).
  ServingMap serving_;

  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Requests waiting for on-demand loads, and their reaper (its mutex is a leaf: called under
  // mu_ too).
  LoadWaiters waiters_;

  std::unique_ptr<WorkerPool> loader_;  // last: its threads stop first
};

}  // namespace inferd::repository
