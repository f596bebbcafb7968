#include "repository/model_lifecycle.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/logging.h"
#include "common/memory.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "config/model_files.h"
#include "core/infer_request.h"
#include "repository/ensemble_validation.h"
#include "repository/repository_scan.h"
#include "scheduling/ensemble_scheduler.h"

namespace inferd::repository {

namespace fs = std::filesystem;

namespace {
constexpr char kUnloadedReason[] = "unloaded";
// Triton's words for a load of a model it cannot find ("failed to load '<m>', failed to poll
// from model repository"), which scripts written against Triton look for in the message.
constexpr char kPollFailed[] = "failed to poll from model repository";
// References the store itself holds to a ready model: its version slot and the serving map.
constexpr long kStoreRefs = 2;
// A name no repository held is looked up again only after this long.
constexpr uint64_t kNotFoundTtlNs = 2'000'000'000;
// The longest name of one file or folder (Linux's NAME_MAX), and of a "file:" parameter's path.
constexpr size_t kMaxFileNameBytes = 255;
constexpr size_t kMaxOverridePathBytes = 1024;
// Poll mode: a model folder none of whose files was written for this long is taken as
// complete at first sight; otherwise it must look the same at two polls in a row.
constexpr auto kPollSettle = std::chrono::seconds(5);
// An on-demand load that failed is tried again on a request only after this long.
constexpr uint64_t kRetryFailedNs = 5'000'000'000;


// Resident set size of this process, from /proc/self/statm.
int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int64_t FolderBytes(const fs::path& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) total += static_cast<int64_t>(it->file_size(ec));
  }
  return total;
}

// How long ago the newest file or folder under `dir` was written (zero when it cannot be read).
std::chrono::nanoseconds NewestWriteAge(const fs::path& dir) {
  std::error_code ec;
  auto newest = fs::last_write_time(dir, ec);
  if (ec) return {};
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::error_code e2;
    const auto t = it->last_write_time(e2);
    if (e2) return {};
    newest = std::max(newest, t);
  }
  if (ec) return {};
  const auto age = fs::file_time_type::clock::now() - newest;
  return std::max(std::chrono::duration_cast<std::chrono::nanoseconds>(age),
                  std::chrono::nanoseconds(0));
}

bool IsEnsembleFolder(const fs::path& model_dir) {
  std::ifstream in(model_dir / "config.pbtxt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t pos = text.find("platform"); pos != std::string::npos;
       pos = text.find("platform", pos + 1)) {
    size_t q = text.find('"', pos);
    if (q != std::string::npos && text.compare(q, 10, "\"ensemble\"") == 0) return true;
  }
  return false;
}

bool IsVersionFolderName(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), ::isdigit);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::StatusOr<std::string> ChooseModelFolder(const std::string& root_str) {
  const fs::path root(root_str);
  std::error_code ec;
  if (fs::exists(root / "config.pbtxt", ec)) return root.string();
  std::vector<fs::path> subdirs;
  bool has_version = false;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (!it->is_directory(e2)) continue;
    const std::string n = it->path().filename().string();
    if (n.empty() || n[0] == '.') continue;
    if (IsVersionFolderName(n)) has_version = true;
    subdirs.push_back(it->path());
  }
  if (has_version) return root.string();
  if (subdirs.size() == 1) return ChooseModelFolder(subdirs[0].string());
  for (const auto& d : subdirs) {
    if (IsEnsembleFolder(d)) return d.string();
  }
  if (subdirs.empty()) {
    return absl::InvalidArgumentError(StrCat(
        "'", root.filename().string(), "' holds no model (no config.pbtxt, no version folder)"));
  }
  return absl::InvalidArgumentError(StrCat(
      "'", root.filename().string(), "' holds ", subdirs.size(),
      " models and none is an ensemble: put one model (or one ensemble and its parts) in it"));
}

ModelLifecycle::ModelLifecycle(LifecycleOptions options, const backends::BackendRegistry* backends)
    : options_(std::move(options)),
      backends_(backends),
      index_(options_.namespacing),
      budget_(options_.memory_budget_bytes,
              options_.eviction_policy == "lru" ? MakeLruPolicy() : MakeCostAwarePolicy(),
              options_.load_wait),
      waiters_(options_.load_wait) {
  loader_ = std::make_unique<WorkerPool>(std::max(1, options_.load_threads), 4096);
  const int gpus = options_.load.placement.gpus ? options_.load.placement.gpus->DeviceCount() : 0;
  for (int d = 0; d < gpus; ++d) device_load_mu_.push_back(std::make_unique<inferd::Mutex>());
  if (options_.sources.cache_cap) {
    // The cache keeps what a loaded or loading model uses (a version loaded, or being loaded).
    options_.sources.cache_cap->SetInUse([this](const std::string& entry) {
      const std::string below = entry + "/";
      inferd::MutexLock lock(&mu_);
      for (const auto& [name, e] : entries_) {
        if (e.dir != entry && e.dir.compare(0, below.size(), below) != 0) continue;
        for (const auto& [v, slot] : e.versions) {
          if (slot.model != nullptr || slot.state.state() == ModelState::kLoading) return true;
        }
      }
      return false;
    });
  }
}

ModelLifecycle::~ModelLifecycle() { Shutdown(); }

void ModelLifecycle::Shutdown() {
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  waiters_.StopReaper();
  // Finishes the loads already queued (their waiters are answered); WhenAvailable starts no
  // more once stopping_ is set.
  loader_->Stop();
  UnloadAll();
  // Anyone still waiting (a load that never finished) is answered now.
  waiters_.FireAll(absl::UnavailableError("the server is shutting down"));
}

absl::Status ModelLifecycle::Open() {
  return index_.Open(options_.repositories, options_.sources);
}

namespace {
// The config file (config.pbtxt, or configs/<n>.pbtxt for --model-config-name) must be the
// model folder's own, not a link to a file elsewhere.
absl::Status CheckConfigFileInside(const std::string& name, const std::string& dir,
                                   const std::string& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return absl::OkStatus();
  const std::string rel = fs::path(path).lexically_relative(dir).string();
  absl::StatusOr<std::string> inside = config::ResolveInside(dir, StrCat("config file '", rel, "'"), rel);
  if (!inside.ok()) {
    return absl::InvalidArgumentError(StrCat("model '", name, "': ", inside.status().message()));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<config::ModelConfig> ModelLifecycle::BuildConfig(
    const std::string& key, const std::string& dir,
    const std::optional<config::ModelConfig>& override_config) {
  const std::string name = PlainName(key);  // a namespaced copy's config names the model itself
  config::ModelConfig cfg;
  const std::string path = config::ModelConfigPath(dir, options_.model_config_name);
  RETURN_IF_ERROR(CheckConfigFileInside(name, dir, path));
  if (override_config) {
    cfg = *override_config;
  } else if (fs::exists(path)) {
    ASSIGN_OR_RETURN(cfg, config::ReadModelConfigFile(path));
  } else if (!options_.auto_complete) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", name, "': no config.pbtxt and auto-complete is disabled "
        "(--disable-auto-complete-config)"));
  }
  if (cfg.name().empty()) cfg.set_name(name);
  RETURN_IF_ERROR(config::NormalizePlatformAndBackend(&cfg));
  std::vector<int64_t> versions = ListVersions(dir);
  // Every field that names a file must name one inside this model's folder (issue 27), checked
  // before auto-complete reads the model file default_model_filename names.
  if (absl::Status st = config::CheckFilesInsideModel(cfg, dir, versions); !st.ok()) {
    return absl::InvalidArgumentError(StrCat("model '", name, "': ", st.message()));
  }
  if (cfg.backend().empty() && cfg.platform().empty()) {
    // No config says which backend: recognise the model file, as Triton core's
    // AutoCompleteBackendFields does (model.py picks the Python backend, whose
    // auto_complete_config then fills in the rest).
    for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
      std::string vdir = inferd::StrCat(dir, "/", *it);
      if (fs::exists(vdir + "/model.onnx")) {
        cfg.set_backend("onnxruntime");
        cfg.set_platform("onnxruntime_onnx");
        break;
      }
      if (fs::exists(vdir + "/model.pt")) {
        cfg.set_backend("pytorch");
        cfg.set_platform("pytorch_libtorch");
        break;
      }
      if (fs::exists(vdir + "/model.py")) {
        cfg.set_backend("python");
        break;
      }
    }
  }
  if (cfg.backend().empty() && cfg.platform().empty() && cfg.default_model_filename().empty()) {
    RETURN_IF_ERROR(config::BackendFromModelName(name, &cfg));  // "<model>.<backend>"
  }
  if (cfg.backend().empty() && cfg.platform().empty()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", name, "': cannot tell which backend serves it: config.pbtxt sets neither "
        "'backend' nor 'platform', and no version folder holds model.onnx, model.pt or "
        "model.py"));
  }
  backends::Backend* backend = backends_->Find(cfg.backend());
  if (backend == nullptr && cfg.platform() != "ensemble") {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", name, "': backend '", cfg.backend(), "' is not available in this server"));
  }
  if (options_.auto_complete && backend != nullptr && !versions.empty()) {
    std::string filename = cfg.default_model_filename();
    if (filename.empty() && cfg.backend() == "onnxruntime") filename = "model.onnx";
    if (filename.empty() && cfg.backend() == "python") filename = "model.py";
    if (filename.empty() && cfg.backend() == "dali") {
      // Triton's DALI backend takes model.dali, else dali.py (serialized at load).
      filename = fs::exists(inferd::StrCat(dir, "/", versions.back(), "/model.dali")) ? "model.dali"
                                                                                      : "dali.py";
    }
    std::string model_path = inferd::StrCat(dir, "/", versions.back(), "/", filename);
    if ((!filename.empty() && fs::exists(model_path)) || backend->AutoCompletesWithoutModelFile()) {
      RETURN_IF_ERROR(backend->AutoCompleteConfig(model_path, &cfg));
    }
  }
  RETURN_IF_ERROR(config::NormalizeAndValidate(&cfg, name));
  if (backend != nullptr && cfg.platform() != "ensemble") {
    ResolveInstanceGroups(&cfg, backend->GpuInstanceSupport(), options_.load.placement);
  }
  return cfg;
}

void ModelLifecycle::SetFailed(const std::string& name, const std::string& dir,
                               const absl::Status& status) {
  inferd::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  e.dir = dir;
  e.failed = true;
  e.failed_at_ns = core::NowNs();
  e.reason = std::string(status.message());
}

namespace {

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const bool overlong = (extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) ||
                          (extra == 3 && cp < 0x10000);
    if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace

absl::Status ValidateModelName(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  if (!IsValidUtf8(name)) return absl::InvalidArgumentError("the model name is not valid UTF-8");
  std::string_view why;
  if (name.size() > kMaxFileNameBytes) {
    // A folder of that name cannot exist (NAME_MAX): the client's mistake, not the server's.
    return absl::InvalidArgumentError(inferd::StrCat(
        "invalid model name '", name.substr(0, 40), "...': it is ", name.size(),
        " bytes long; a model name is one folder name, at most ", kMaxFileNameBytes, " bytes"));
  }
  if (name == "." || name == "..") {
    why = "is a path part";
  } else if (name.find_first_of("/\\") != std::string_view::npos) {
    why = "contains a path separator";
  } else {
    for (char c : name) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) why = "contains a control character";
    }
  }
  if (why.empty()) return absl::OkStatus();
  std::string printable;
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      printable += '?';
    } else {
      printable += c;
    }
  }
  return absl::InvalidArgumentError(inferd::StrCat("invalid model name '", printable, "': it ", why));
}

// ---- claims: one load of a model at a time ---------------------------------------------------

absl::StatusOr<bool> ModelLifecycle::Claim(const std::string& name, LoadContext& ctx) {
  inferd::MutexLock lock(&mu_);
  auto idle = [this, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return loading_.count(name) == 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&idle), options_.load_wait)) {
    return absl::UnavailableError(StrCat("model '", name, "' is still being loaded after ",
                                         absl::FormatDuration(options_.load_wait)));
  }
  if (ctx.pass != nullptr && !ctx.pass->insert(name).second) return false;
  loading_.insert(name);
  return true;
}

void ModelLifecycle::Unclaim(const std::string& name) {
  inferd::MutexLock lock(&mu_);
  loading_.erase(name);
}

absl::Status ModelLifecycle::LoadOne(const std::string& name, const std::string& dir,
                                     const std::optional<config::ModelConfig>& override_config,
                                     LoadContext& ctx) {
  ASSIGN_OR_RETURN(bool claimed, Claim(name, ctx));
  if (!claimed) {
    // Loaded earlier in this pass (say, as an ensemble's step); now it is named itself too.
    if (ctx.explicit_load) {
      inferd::MutexLock lock(&mu_);
      if (auto it = entries_.find(name); it != entries_.end()) it->second.explicit_load = true;
    }
    return absl::OkStatus();
  }
  absl::Status st = LoadClaimed(name, dir, override_config, ctx);
  Unclaim(name);
  return st;
}

// ---- the load of one model -------------------------------------------------------------------

ModelLifecycle::VersionSlot ModelLifecycle::NewSlot(const std::string& name, int64_t version) {
  VersionSlot slot;
  slot.state.set_what(StrCat("model '", name, "' version ", version));
  return slot;
}

absl::Status ModelLifecycle::LoadClaimed(const std::string& name, const std::string& dir,
                                         const std::optional<config::ModelConfig>& override_config,
                                         LoadContext& ctx) {
  const auto start = std::chrono::steady_clock::now();
  const std::string fingerprint = Fingerprint(dir);
  auto fail = [&](const absl::Status& st) { return RecordFailure(name, dir, fingerprint, ctx, st); };
  // 1. The config (and an ensemble's steps, loaded first).
  auto cfg = BuildConfig(name, dir, override_config);
  if (!cfg.ok()) return fail(cfg.status());
  if (cfg->platform() == "ensemble") {
    if (absl::Status st = PrepareEnsemble(*cfg, ctx); !st.ok()) return fail(st);
  }
  // 2. The versions the version policy serves.
  const ChosenVersions versions = ChooseVersions(*cfg, dir);
  if (versions.wanted.empty() && versions.missing.empty()) {
    return fail(absl::InvalidArgumentError(
        inferd::StrCat("model '", name, "': no version folders found in '", dir, "'")));
  }
  // 3. Room under the budget for the new versions.
  std::map<int64_t, int64_t> on_disk;
  int64_t on_disk_total = 0;
  for (int64_t v : versions.wanted) {
    on_disk[v] = FolderBytes(fs::path(dir) / std::to_string(v));
    on_disk_total += on_disk[v];
  }
  const absl::Time room_deadline = absl::Now() + options_.load_wait;
  int64_t reserved = 0;
  if (absl::Status st = ReserveRoom(name, on_disk_total, room_deadline, &reserved); !st.ok()) {
    // A budget full for now is not the model's fault: nothing is remembered, and its next
    // request tries again. One that can never fit is (RESOURCE_EXHAUSTED).
    if (st.code() == absl::StatusCode::kUnavailable) {
      LOG_WARNING << "model '" << name << "' not loaded: " << st.message();
      return st;
    }
    return fail(st);
  }
  // 4. Load the new versions (each measuring its footprint) while the old ones keep serving.
  std::map<int64_t, int64_t> measured_before = BeginLoadingVersions(name, dir, fingerprint,
                                                                    versions.wanted);
  backends::Backend* backend = backends_->Find(cfg->backend());
  std::map<int64_t, VersionSlot> fresh;
  absl::Status first_error;
  for (int64_t v : versions.wanted) {
    fresh[v] = LoadVersion(name, *cfg, dir, v, backend, ctx.ns, on_disk[v], measured_before[v],
                           &first_error);
  }
  for (auto& [v, reason] : versions.missing) {
    VersionSlot slot = NewSlot(name, v);
    (void)slot.state.TransitionTo(ModelState::kUnavailable, reason);
    fresh[v] = std::move(slot);
    if (first_error.ok()) first_error = absl::NotFoundError(reason);
  }
  // 5. Swap them in; the versions they replace are freed.
  const double seconds = SecondsSince(start);
  std::vector<std::shared_ptr<const Model>> retired;
  const int64_t total_footprint = SwapIn(name, fingerprint, ctx, std::move(fresh), on_disk,
                                         reserved, first_error.ok(), seconds, &retired);
  FreeRetired(&retired);
  if (!first_error.ok()) return first_error;
  LOG_INFO << "loaded model '" << name << "' in " << seconds << " s, footprint "
           << total_footprint << " bytes";
  // 6. The measured footprint may exceed the estimate: room for it, or the model goes back.
  return CheckFootprintFits(name, room_deadline);
}

absl::Status ModelLifecycle::RecordFailure(const std::string& name, const std::string& dir,
                                           const std::string& fingerprint,
                                           const LoadContext& ctx, const absl::Status& st) {
  LOG_ERROR << "failed to load model '" << name << "': " << st.message();
  SetFailed(name, dir, st);
  inferd::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  e.fingerprint = fingerprint;
  e.source_fingerprint = ctx.source_fingerprint;
  if (ctx.origin) e.origin = ctx.origin;
  if (e.versions.empty() || ctx.residency != Residency::kPinned) e.residency = ctx.residency;
  e.explicit_load = e.explicit_load || ctx.explicit_load;
  ++counters_.load_failures;
  return st;
}

ModelLifecycle::ChosenVersions ModelLifecycle::ChooseVersions(const config::ModelConfig& cfg,
                                                              const std::string& dir) {
  std::vector<int64_t> available = ListVersions(dir);
  ChosenVersions out;
  const auto& policy = cfg.version_policy();
  if (policy.has_all()) {
    out.wanted = available;
  } else if (policy.has_specific()) {
    for (int64_t v : policy.specific().versions()) {
      if (std::find(available.begin(), available.end(), v) != available.end()) {
        out.wanted.push_back(v);
      } else {
        out.missing[v] = inferd::StrCat(
            "version ", v, " named by version_policy.specific has no folder '", dir, "/", v, "'");
      }
    }
  } else {
    const size_t n = policy.latest().num_versions();
    for (size_t i = available.size() > n ? available.size() - n : 0; i < available.size(); ++i) {
      out.wanted.push_back(available[i]);
    }
  }
  return out;
}

absl::Status ModelLifecycle::ReserveRoom(const std::string& name, int64_t on_disk,
                                         absl::Time deadline, int64_t* reserved) {
  *reserved = 0;
  if (!budget_.enabled()) return absl::OkStatus();
  // Each load reserves its estimated footprint before it starts (its size on disk, or what it
  // measured the last time it was loaded, whichever is larger), so loads running together
  // cannot each fit alone and overshoot together; the reservation becomes the measured
  // footprint when the load ends.
  int64_t estimate;
  {
    inferd::ReaderMutexLock lock(&mu_);
    auto it = entries_.find(name);
    estimate = it == entries_.end() ? EstimateFootprintLocked(Entry(), on_disk)
                                    : EstimateFootprintLocked(it->second, on_disk);
  }
  return MakeRoom(name, estimate, on_disk, deadline, reserved);
}

std::map<int64_t, int64_t> ModelLifecycle::BeginLoadingVersions(
    const std::string& name, const std::string& dir, const std::string& fingerprint,
    const std::vector<int64_t>& wanted) {
  inferd::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  e.dir = dir;
  for (int64_t v : wanted) {
    // A new slot starts LOADING; a version already known keeps its state (and serves, when
    // READY) until the swap.
    if (!e.versions.count(v)) e.versions.emplace(v, NewSlot(name, v));
  }
  // The largest footprint measured for these same files before: RSS growth undercounts a load
  // that reuses memory the allocator kept from an earlier unload.
  if (e.fingerprint == fingerprint) return e.measured;
  return {};
}

ModelLifecycle::VersionSlot ModelLifecycle::LoadVersion(
    const std::string& name, const config::ModelConfig& cfg, const std::string& dir,
    int64_t version, backends::Backend* backend, const std::string& ns, int64_t on_disk,
    int64_t measured_before, absl::Status* first_error) {
  VersionSlot slot = NewSlot(name, version);
  absl::StatusOr<std::shared_ptr<Model>> model;
  int64_t grown = 0;
  const auto version_start = std::chrono::steady_clock::now();
  // The GPUs this version's instances go to (the same placement Model::Load makes).
  std::vector<int> gpus;
  if (backend != nullptr && !device_load_mu_.empty()) {
    auto placement =
        PlaceInstances(cfg, backend->GpuInstanceSupport(), options_.load.placement);
    if (placement.ok()) {
      for (const auto& p : placement->instances) {
        if (p.device.gpu && p.device.id >= 0 &&
            p.device.id < static_cast<int>(device_load_mu_.size())) {
          gpus.push_back(p.device.id);
        }
      }
    }
    std::sort(gpus.begin(), gpus.end());
    gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  }
  std::map<int, int64_t> last_gpu;
  if (!gpus.empty()) {
    inferd::ReaderMutexLock lock(&mu_);
    if (auto it = entries_.find(name); it != entries_.end()) last_gpu = it->second.last_gpu_bytes;
  }
  std::map<int, int64_t> gpu_measured;
  {
    // Under a budget with RSS accounting, instance creation runs one model at a time so the
    // RSS growth is this version's own.
    std::optional<inferd::MutexLock> measure;
    if (budget_.enabled() && !options_.footprint_from_disk) measure.emplace(&measure_mu_);
    // The GPUs' load locks, in ascending order: another version's instances are not created on
    // these GPUs meanwhile, so the memory they lose is this version's (what else runs on the
    // GPU, inference included, may still move it: the backend's own report wins when it has
    // one).
    std::vector<std::unique_ptr<inferd::MutexLock>> device_locks;
    for (int d : gpus) device_locks.push_back(std::make_unique<inferd::MutexLock>(device_load_mu_[d].get()));
    absl::Status room;
    for (int d : gpus) {
      room = MakeDeviceRoom(name, d, last_gpu.count(d) ? last_gpu[d] : 0);
      if (!room.ok()) break;
    }
    std::map<int, uint64_t> free_before;
    for (int d : gpus) {
      auto info = options_.load.placement.gpus->GetMemoryInfo(d);
      if (info.ok()) free_before[d] = info->free_bytes;
    }
    const int active = instantiating_.fetch_add(1);
    const uint64_t started = instantiations_.fetch_add(1);
    const int64_t rss_before = RssBytes();
    if (!room.ok()) {
      model = room;
    } else if (options_.namespacing) {
      LoadOptions load = options_.load;
      load.model_namespace = ns;
      model = Model::Load(cfg, dir, version, backend, load);
    } else {
      model = Model::Load(cfg, dir, version, backend, options_.load);
    }
    grown = RssBytes() - rss_before;
    // Another load ran meanwhile (no budget, so nothing serialized them): the growth is not
    // this version's alone, and its size on disk is the better figure.
    if (active > 0 || instantiations_.load() != started + 1) grown = 0;
    instantiating_.fetch_sub(1);
    if (model.ok()) {
      for (const auto& [d, before] : free_before) {
        auto info = options_.load.placement.gpus->GetMemoryInfo(d);
        if (!info.ok()) continue;
        gpu_measured[d] = before > info->free_bytes ? static_cast<int64_t>(before - info->free_bytes) : 0;
      }
      // What a backend reports of its own allocations wins over the measurement.
      for (const auto& [d, bytes] : (*model)->ReportedGpuMemoryBytes()) gpu_measured[d] = bytes;
    }
  }
  if (!model.ok()) {
    (void)slot.state.TransitionTo(ModelState::kUnavailable, std::string(model.status().message()));
    LOG_ERROR << "failed to load model '" << name << "' version " << version << ": "
              << model.status().message();
    if (first_error->ok()) *first_error = model.status();
    return slot;
  }
  (void)slot.state.TransitionTo(ModelState::kReady);
  slot.footprint = options_.footprint_from_disk ? on_disk
                                                : std::max({grown, on_disk, measured_before});
  (*model)->set_footprint_bytes(slot.footprint);
  (*model)->set_gpu_memory_bytes(gpu_measured);
  slot.gpu_bytes = gpu_measured;
  slot.model = *std::move(model);
  // Triton's wording ("successfully loaded"), on every route that loads (start-up, the
  // repository API, on-demand, poll, SageMaker); the unload line is ~Model's.
  std::string gpu_line;
  for (const auto& [d, bytes] : gpu_measured) {
    StrAppend(&gpu_line, ", GPU ", d, ": ", bytes >> 20, " MiB (", bytes, " bytes)");
  }
  LOG_INFO << "successfully loaded '" << cfg.name() << "' version " << version << " in "
           << SecondsSince(version_start) << " s, memory " << slot.footprint << " bytes"
           << gpu_line;
  return slot;
}

int64_t ModelLifecycle::SwapIn(const std::string& name, const std::string& fingerprint,
                               const LoadContext& ctx, std::map<int64_t, VersionSlot> fresh,
                               const std::map<int64_t, int64_t>& on_disk, int64_t reserved,
                               bool all_loaded, double seconds,
                               std::vector<std::shared_ptr<const Model>>* retired) {
  int64_t total_footprint = 0;
  inferd::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  // A version that failed to reload keeps serving its old instance (TF Serving's "no
  // spontaneous unloading"); the failure is its reason in the index.
  for (auto& [v, slot] : fresh) {
    auto old = e.versions.find(v);
    if (!slot.state.ready() && old != e.versions.end() && old->second.model) {
      // A slot with a model is READY: it stays so, with the failure as its reason.
      old->second.state.set_reason(
          StrCat("reload failed, the previous load keeps serving: ", slot.state.reason()));
      slot = std::move(old->second);
    }
  }
  for (auto& [v, slot] : e.versions) {
    if (slot.model && (!fresh.count(v) || fresh[v].model != slot.model)) {
      // Replaced by the new load (or no longer wanted): out of service, freed by the caller.
      (void)slot.state.TransitionTo(ModelState::kUnloading);
      retired->push_back(std::move(slot.model));
      (void)slot.state.TransitionTo(ModelState::kUnavailable);
    }
  }
  e.versions = std::move(fresh);
  PublishLocked(name);
  bool any_ready = false;
  for (const auto& [v, slot] : e.versions) {
    total_footprint += slot.footprint;
    any_ready |= slot.state.ready();
  }
  // The measured footprint replaces the reservation, in one step.
  budget_.Settle(name, total_footprint, reserved);
  std::map<int, int64_t> gpu_total;
  for (const auto& [v, slot] : e.versions) {
    if (!slot.model) continue;
    for (const auto& [d, bytes] : slot.gpu_bytes) gpu_total[d] += bytes;
  }
  budget_.SettleDevices(name, gpu_total);
  if (any_ready) e.last_gpu_bytes = gpu_total;
  if (e.fingerprint != fingerprint) e.measured.clear();
  for (const auto& [v, slot] : e.versions) {
    if (slot.model) e.measured[v] = std::max(e.measured[v], slot.footprint);
  }
  if (any_ready) {
    e.last_footprint = total_footprint;
    if (!options_.footprint_from_disk) {
      for (const auto& [v, slot] : e.versions) {
        if (auto d = on_disk.find(v); slot.model && d != on_disk.end()) {
          budget_.NoteOverhead(slot.footprint - d->second);
        }
      }
    }
  }
  e.failed = false;
  e.reason.clear();
  e.fingerprint = fingerprint;
  e.source_fingerprint = ctx.source_fingerprint;
  if (ctx.origin) e.origin = ctx.origin;
  e.residency = ctx.residency;
  e.parts = ctx.parts;
  e.explicit_load = e.explicit_load || ctx.explicit_load;
  e.bound = e.bound || any_ready;
  if (all_loaded) {
    ++counters_.loads;
  } else {
    ++counters_.load_failures;
    e.failed_at_ns = core::NowNs();
  }
  counters_.load_seconds += seconds;
  if (any_ready) {
    // The policy weighs the model with the parts that come and go with it.
    for (const auto& p : e.parts) {
      if (auto it = entries_.find(p); it != entries_.end()) {
        for (const auto& [v, slot] : it->second.versions) total_footprint += slot.footprint;
      }
    }
    budget_.OnLoaded(name, total_footprint, seconds);
  }
  return total_footprint;
}

absl::Status ModelLifecycle::CheckFootprintFits(const std::string& name, absl::Time deadline) {
  if (!budget_.enabled()) return absl::OkStatus();
  absl::Status st = MakeRoom(name, 0, 0, deadline, nullptr);
  if (st.ok()) return st;
  std::vector<std::shared_ptr<const Model>> retired;
  {
    inferd::MutexLock lock(&mu_);
    RetireLocked(name, std::string(st.message()), &retired);
    // Remembered only when it can never fit; a full budget lets the next request retry.
    if (st.code() != absl::StatusCode::kUnavailable) {
      entries_[name].failed = true;
      entries_[name].failed_at_ns = core::NowNs();
      entries_[name].reason = std::string(st.message());
    }
  }
  FreeRetired(&retired);
  return st;
}

absl::Status ModelLifecycle::PrepareEnsemble(config::ModelConfig& config, LoadContext& ctx) {
  ASSIGN_OR_RETURN(auto graph, scheduling::BuildEnsembleGraph(config));
  ctx.ensemble_stack.push_back(config.name());
  struct Pop {
    std::vector<std::string>* stack;
    ~Pop() { stack->pop_back(); }
  } pop{&ctx.ensemble_stack};
  std::optional<Scan> scan;
  std::vector<std::shared_ptr<const Model>> models;
  std::vector<const config::ModelConfig*> configs;
  for (size_t i = 0; i < graph.steps.size(); ++i) {
    const auto& step = graph.steps[i];
    const std::string where = inferd::StrCat("ensemble '", config.name(), "' step ", i,
                                             " (model '", step.model_name, "')");
    if (std::find(ctx.ensemble_stack.begin(), ctx.ensemble_stack.end(), step.model_name) !=
        ctx.ensemble_stack.end()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          where, ": ensembles form a cycle (", inferd::StrJoin(ctx.ensemble_stack, " -> "), " -> ",
          step.model_name, ")"));
    }
    // --model-namespacing: the copy in the ensemble's own repository first (Triton's preferred
    // identifier); else the name as a client would give it (one copy, or ambiguous).
    std::string key = step.model_name;
    if (options_.namespacing && !ctx.ns.empty()) {
      const std::string own = NamespacedName(ctx.ns, step.model_name);
      bool have_own;
      {
        inferd::ReaderMutexLock lock(&mu_);
        have_own = entries_.count(own) > 0;
      }
      if (!have_own) {
        if (!scan) scan = index_.List();
        have_own = scan->models.count(own) > 0;
      }
      if (have_own) {
        key = own;
        auto* mutable_step = config.mutable_ensemble_scheduling()->mutable_step(static_cast<int>(i));
        mutable_step->set_model_namespace(ctx.ns);
      }
    }
    auto model = Get(key, step.model_version);
    if (model.ok() && ctx.siblings.count(step.model_name) &&
        std::find(ctx.parts.begin(), ctx.parts.end(), step.model_name) == ctx.parts.end()) {
      // Another archive loaded a part of this name already: this ensemble shares it, and it
      // stays while either ensemble does.
      ctx.parts.push_back(step.model_name);
    }
    if (!model.ok()) {
      // A part beside the ensemble in its archive, else a model of the repositories.
      std::string dir;
      std::string source_fingerprint;
      std::string part_ns;
      std::optional<Origin> part_origin;
      if (auto s = ctx.siblings.find(step.model_name); s != ctx.siblings.end()) {
        dir = s->second;
      } else {
        if (!scan) scan = index_.List();
        if (auto it = scan->models.find(key);
            it != scan->models.end() && !it->second.model.archive) {
          FetchStats stats;
          auto fetched = FetchCounted(it->second.source, it->second.model.name, &stats);
          if (!fetched.ok()) {
            return absl::InvalidArgumentError(StrCat(where, ": ", fetched.status().message()));
          }
          dir = *fetched;
          source_fingerprint = it->second.model.fingerprint;
          if (options_.namespacing) part_ns = it->second.source->url();
          part_origin = Origin{it->second.source, it->second.model.name, ""};
        } else if (options_.namespacing && it == scan->models.end()) {
          // Not in the ensemble's repository and held by several others: no one model (Triton:
          // "contains models that are not available or ambiguous").
          const size_t copies = index_.CopiesOf(*scan, step.model_name);
          if (copies > 1) {
            return absl::InvalidArgumentError(StrCat(
                where, ": the model is ambiguous: There are ", copies, " identifiers of model '",
                step.model_name,
                "' in global map, model namespace must be provided to resolve ambiguity."));
          }
        }
      }
      if (!dir.empty()) {
        LoadContext part;
        part.pass = ctx.pass;
        part.ensemble_stack = ctx.ensemble_stack;
        part.siblings = ctx.siblings;
        part.source_fingerprint = source_fingerprint;
        part.explicit_load = false;  // loaded because the ensemble runs it
        part.ns = part_ns;
        const bool sibling = ctx.siblings.count(step.model_name) > 0;
        // A namespaced copy remembers its repository (so an eviction can load it again).
        if (key != step.model_name && part_origin) part.origin = part_origin;
        // An archive's parts come and go with their ensemble; a repository model loaded for an
        // ensemble is pinned (or evictable) like the ensemble.
        part.residency = sibling ? Residency::kPart : ctx.residency;
        auto claimed = Claim(key, part);
        if (!claimed.ok()) return absl::InvalidArgumentError(StrCat(where, ": ", claimed.status().message()));
        if (*claimed) {
          LOG_INFO << "loading model '" << key << "', which ensemble '"
                   << config.name() << "' runs";
          (void)LoadClaimed(key, dir, std::nullopt, part);
          Unclaim(key);
          if (sibling) ctx.parts.push_back(step.model_name);
        }
        model = Get(key, step.model_version);
      }
    }
    if (!model.ok()) {
      return absl::InvalidArgumentError(
          inferd::StrCat(where, ": the model is not available: ", model.status().message()));
    }
    configs.push_back(&(*model)->config());
    models.push_back(*std::move(model));
  }
  RETURN_IF_ERROR(ValidateEnsembleSteps(config, graph, configs));
  // As Triton: an ensemble with a decoupled step is decoupled (it answers 0..N times, through
  // ModelStreamInfer and generate_stream; /infer and ModelInfer refuse it).
  for (size_t i = 0; i < configs.size(); ++i) {
    if (!configs[i]->model_transaction_policy().decoupled()) continue;
    if (config.response_cache().enable()) {
      // As for any decoupled model (config normalization refuses the pair; this ensemble only
      // now turns out decoupled).
      return absl::InvalidArgumentError(inferd::StrCat(
          "ensemble '", config.name(), "': response_cache does not support decoupled models, and "
          "step ", i, " (model '", graph.steps[i].model_name, "') is decoupled, which makes the "
          "ensemble decoupled"));
    }
    config.mutable_model_transaction_policy()->set_decoupled(true);
  }
  return absl::OkStatus();
}

// ---- entry points ----------------------------------------------------------------------------

absl::StatusOr<std::string> ModelLifecycle::FetchCounted(Source* source, const std::string& name,
                                                         FetchStats* stats) {
  auto dir = source->Fetch(name, stats);
  inferd::MutexLock lock(&mu_);
  // A fetch that fails (S3 unreachable or stopping mid-download, a corrupt or unsafe archive)
  // fails the load that asked for it. NOT_FOUND is a repository that does not hold the name
  // (Locate asks each in turn); FetchUrl counts it itself, its URL naming one object.
  if (!dir.ok() && dir.status().code() != absl::StatusCode::kNotFound) ++counters_.load_failures;
  counters_.download_seconds += stats->download_seconds;
  counters_.download_bytes += static_cast<uint64_t>(stats->bytes_downloaded);
  if (dir.ok() && stats->cache_hit && source->remote()) ++counters_.fetch_cache_hits;
  return dir;
}

absl::StatusOr<ModelLifecycle::Located> ModelLifecycle::Locate(const std::string& source_name) {
  return index_.Locate(source_name, [this](Source* source, const std::string& name,
                                           FetchStats* stats) {
    return FetchCounted(source, name, stats);
  });
}

absl::StatusOr<ModelLifecycle::Located> ModelLifecycle::FetchUrl(const std::string& url) {
  return RepositoryIndex::LocateUrl(
      url, options_.sources, [this](Source* source, const std::string& name, FetchStats* stats) {
        auto dir = FetchCounted(source, name, stats);
        if (!dir.ok() && dir.status().code() == absl::StatusCode::kNotFound) {
          // A URL names one object: its absence fails the load (FetchCounted leaves NOT_FOUND
          // uncounted, Locate asking each repository in turn).
          inferd::MutexLock lock(&mu_);
          ++counters_.load_failures;
        }
        return dir;
      });
}

absl::Status ModelLifecycle::LoadFromRoot(const std::string& name, const std::string& root,
                                          LoadContext& ctx) {
  ASSIGN_OR_RETURN(std::string model_dir, ChooseModelFolder(root));
  // The other models beside the chosen one are its parts (an ensemble's composing models).
  if (fs::path(model_dir) != fs::path(root)) {
    std::error_code ec;
    for (fs::directory_iterator it(fs::path(model_dir).parent_path(), ec), end; !ec && it != end;
         it.increment(ec)) {
      std::error_code e2;
      if (!it->is_directory(e2) || it->path() == fs::path(model_dir)) continue;
      ctx.siblings[it->path().filename().string()] = it->path().string();
    }
  }
  std::optional<config::ModelConfig> override_config;
  const std::string path = config::ModelConfigPath(model_dir, options_.model_config_name);
  RETURN_IF_ERROR(CheckConfigFileInside(name, model_dir, path));
  if (fs::exists(path)) {
    ASSIGN_OR_RETURN(auto cfg, config::ReadModelConfigFile(path));
    cfg.set_name(name);
    override_config = std::move(cfg);
  }
  return LoadOne(name, model_dir, override_config, ctx);
}

absl::Status ValidateOverrideFilePath(const std::string& path) {
  auto bad = [&path](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("parameter 'file:", path, "': ", why));
  };
  if (path.empty()) return bad("names no file (the form is file:<version>/<file name>)");
  if (path.front() == '/') return bad("the path must be relative to the model folder");
  if (path.find('\0') != std::string::npos) return bad("the path holds a NUL character");
  if (path.size() > kMaxOverridePathBytes) {
    return bad(StrCat("the path is ", path.size(), " bytes long; at most ", kMaxOverridePathBytes));
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == ".") return bad("the path has an empty or '.' component");
    if (part == "..") return bad("the path may not leave the model folder ('..')");
    if (part.size() > kMaxFileNameBytes) {
      // The write would fail with ENAMETOOLONG: the client named an impossible file.
      return bad(StrCat("a path component is ", part.size(), " bytes long; at most ",
                        kMaxFileNameBytes, " bytes (the file system's NAME_MAX)"));
    }
    start = end + 1;
  }
  return absl::OkStatus();
}

absl::Status ModelLifecycle::Load(const std::string& name,
                                  const std::optional<config::ModelConfig>& override_config,
                                  const std::map<std::string, std::string>& files) {
  RETURN_IF_ERROR(ValidateModelName(name));
  if (!files.empty()) {
    if (!override_config) {
      return absl::InvalidArgumentError(StrCat(
          "failed to load '", name, "': parameter 'file:", files.begin()->first,
          "' needs the 'config' parameter too (the configuration of the model folder the files "
          "form)"));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const std::string> root, WriteOverrideFolder(name, files));
    LoadContext ctx;
    ctx.residency = Residency::kPinned;
    const absl::Status st = LoadOne(name, StrCat(*root, "/", name), override_config, ctx);
    inferd::MutexLock lock(&mu_);
    if (auto it = entries_.find(name); it != entries_.end()) {
      // On a failure the previous folder stays while its versions keep serving.
      if (st.ok() || !it->second.override_dir) it->second.override_dir = std::move(root);
    }
    return st;
  }
  absl::Status st = LoadFromRepository(name, override_config);
  if (st.ok()) {
    // Back to the repository's copy: the files of an earlier load with "file:" go.
    std::shared_ptr<const std::string> old;
    inferd::MutexLock lock(&mu_);
    if (auto it = entries_.find(name); it != entries_.end()) old = std::move(it->second.override_dir);
  }
  return st;
}

absl::Status ModelLifecycle::LoadFromRepository(
    const std::string& name, const std::optional<config::ModelConfig>& override_config) {
  Scan scan = index_.List();
  if (auto dup = scan.duplicates.find(name); dup != scan.duplicates.end()) {
    return absl::InvalidArgumentError(dup->second);
  }
  auto it = scan.models.find(name);
  if (it == scan.models.end() && options_.namespacing) {
    // --model-namespacing: as Triton, a load by a name several repositories hold loads each.
    std::vector<std::string> failures;
    size_t copies = 0;
    for (const auto& source : index_.sources()) {
      const std::string key = NamespacedName(source->url(), name);
      auto copy = scan.models.find(key);
      if (copy == scan.models.end()) continue;
      ++copies;
      FetchStats stats;
      auto dir = FetchCounted(copy->second.source, name, &stats);
      absl::Status st = dir.status();
      if (dir.ok()) {
        LoadContext ctx;
        ctx.residency = Residency::kPinned;
        ctx.source_fingerprint = copy->second.model.fingerprint;
        ctx.origin = Origin{copy->second.source, name, ""};
        ctx.ns = source->url();
        st = copy->second.model.archive ? LoadFromRoot(key, *dir, ctx)
                                        : LoadOne(key, *dir, override_config, ctx);
      }
      if (!st.ok()) failures.push_back(StrCat("load failed for model '", key, "': ", st.message()));
    }
    if (copies > 0) {
      if (failures.empty()) return absl::OkStatus();
      return absl::InvalidArgumentError(StrJoin(failures, "\n"));
    }
  }
  if (it == scan.models.end()) {
    if (!scan.errors.empty()) {
      // A repository that could not be listed may hold it: not the client's fault.
      return absl::UnavailableError(StrCat("failed to load '", name, "', ", kPollFailed, ": ",
                                           StrJoin(scan.errors, "; ")));
    }
    // NOT_FOUND (Triton: INTERNAL, HTTP 500): the client named a model no repository holds.
    return absl::NotFoundError(
        inferd::StrCat("failed to load '", name, "', ", kPollFailed, ": no model folder '", name,
                       "' in the model repository"));
  }
  FetchStats stats;
  auto dir = FetchCounted(it->second.source, name, &stats);
  if (!dir.ok()) return dir.status();
  LoadContext ctx;
  ctx.residency = Residency::kPinned;
  ctx.source_fingerprint = it->second.model.fingerprint;
  ctx.origin = Origin{it->second.source, name, ""};
  if (options_.namespacing) ctx.ns = it->second.source->url();
  if (it->second.model.archive) return LoadFromRoot(name, *dir, ctx);
  return LoadOne(name, *dir, override_config, ctx);
}

absl::Status ModelLifecycle::LoadAll() {
  inferd::MutexLock pass_lock(&pass_mu_);
  Scan scan = index_.List();
  std::vector<std::string> failures = scan.errors;
  for (const auto& [name, reason] : scan.duplicates) {
    SetFailed(name, "", absl::InvalidArgumentError(reason));
    failures.push_back(reason);
  }
  // Every model folder, in parallel on the loader pool; the archives in a repository are
  // loaded only on request. The pass's state is shared with the tasks: the last one to finish
  // may still be unlocking it when this thread returns.
  struct Pass {
    inferd::Mutex mu;
    inferd::CondVar cv;
    size_t outstanding ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::string> failures ABSL_GUARDED_BY(mu);
    std::set<std::string> claimed;  // guarded by the store's mu_ (LoadContext::pass)
  };
  auto state = std::make_shared<Pass>();
  for (const auto& [name, listed] : scan.models) {
    if (listed.model.archive) continue;
    {
      inferd::MutexLock lock(&state->mu);
      ++state->outstanding;
    }
    auto task = [this, name = name, listed = listed, state] {
      absl::Status st;
      FetchStats stats;
      auto dir = FetchCounted(listed.source, listed.model.name, &stats);
      if (!dir.ok()) {
        st = dir.status();
        SetFailed(name, "", st);
      } else {
        LoadContext ctx;
        ctx.pass = &state->claimed;
        ctx.residency = Residency::kPinned;
        ctx.source_fingerprint = listed.model.fingerprint;
        ctx.origin = Origin{listed.source, listed.model.name, ""};
        if (options_.namespacing) ctx.ns = listed.source->url();
        st = LoadOne(name, *dir, std::nullopt, ctx);
      }
      inferd::MutexLock lock(&state->mu);
      if (!st.ok()) state->failures.push_back(std::string(st.message()));
      --state->outstanding;
      state->cv.SignalAll();
    };
    if (!loader_->Submit(task)) {
      inferd::MutexLock lock(&state->mu);
      --state->outstanding;
      state->failures.push_back(StrCat("model '", name, "': the loader queue is full"));
    }
  }
  {
    inferd::MutexLock lock(&state->mu);
    while (state->outstanding > 0) state->cv.Wait(&state->mu);
    failures.insert(failures.end(), state->failures.begin(), state->failures.end());
  }
  if (failures.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(inferd::StrJoin(failures, "; "));
}

absl::Status ModelLifecycle::LoadFromUrl(const std::string& name, const std::string& url) {
  RETURN_IF_ERROR(ValidateModelName(name));
  {
    inferd::ReaderMutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it != entries_.end()) {
      for (const auto& [v, slot] : it->second.versions) {
        if (slot.model) {
          return absl::AlreadyExistsError(StrCat("model '", name, "' is already loaded"));
        }
      }
    }
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(Located found, FetchUrl(url));
  LoadContext ctx;
  ctx.residency = Residency::kEvictable;
  ctx.origin = Origin{nullptr, "", url};
  absl::Status st = LoadFromRoot(name, found.dir, ctx);
  if (!st.ok()) {
    // Leave nothing behind: a failed multi-model load is not part of the set.
    (void)Forget(name);
    return st;
  }
  LOG_INFO << "loaded model '" << name << "' from " << url << " in " << SecondsSince(start) << " s";
  return absl::OkStatus();
}

absl::Status ModelLifecycle::LoadOnDemand(const std::string& name, const std::string& source_name) {
  std::optional<Origin> origin;
  {
    inferd::ReaderMutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (auto it = entries_.find(name); it != entries_.end()) origin = it->second.origin;
  }
  if (origin && !origin->url.empty()) {
    ASSIGN_OR_RETURN(Located found, FetchUrl(origin->url));
    LoadContext ctx;
    ctx.residency = Residency::kEvictable;
    ctx.origin = origin;
    return LoadFromRoot(name, found.dir, ctx);
  }
  const std::string wanted =
      !source_name.empty() ? source_name : (origin ? origin->source_name : name);
  RETURN_IF_ERROR(ValidateModelName(wanted));
  if (wanted != name && !(origin && origin->source_name == wanted)) {
    // A request names another entry to load as `name`: never when the repositories hold a
    // model of that name, whose clients would get the other model's answers.
    Scan scan = index_.List();
    if (scan.models.count(name) || scan.duplicates.count(name)) {
      return absl::AlreadyExistsError(StrCat(
          "model '", name, "' is a model of the repository; the request names '", wanted,
          "' to load under that name: one name serves one model (use another name for '",
          wanted, "')"));
    }
  }
  if (options_.namespacing && source_name.empty()) {
    if (origin && origin->source != nullptr && wanted != name) {
      // A namespaced copy (an ensemble's step) evicted: loaded again from its own repository.
      Located again;
      ASSIGN_OR_RETURN(again.dir, FetchCounted(origin->source, wanted, &again.fetch));
      LoadContext ctx;
      ctx.residency = Residency::kEvictable;
      ctx.origin = origin;
      ctx.ns = origin->source->url();
      return LoadOne(name, again.dir, std::nullopt, ctx);
    }
    // A name several repositories hold names no one model (Triton's ambiguity).
    Scan scan = index_.List();
    const size_t copies = index_.CopiesOf(scan, name);
    if (copies > 1) {
      return absl::InvalidArgumentError(StrCat(
          "There are ", copies, " identifiers of model '", name,
          "' in global map, model namespace must be provided to resolve ambiguity."));
    }
  }
  auto found = Locate(wanted);
  if (!found.ok()) {
    if (found.status().code() == absl::StatusCode::kNotFound) {
      inferd::MutexLock lock(&mu_);
      const uint64_t now = core::NowNs();
      if (not_found_.size() >= 4096) {  // bounded: names older than the TTL go
        for (auto it = not_found_.begin(); it != not_found_.end();) {
          it = now - it->second >= kNotFoundTtlNs ? not_found_.erase(it) : std::next(it);
        }
      }
      // Keyed by the entry looked for, not by `name`: a request naming a good entry for the
      // same name right after one naming a missing entry loads it.
      if (not_found_.size() < 4096) not_found_[wanted] = now;
    }
    return found.status();
  }
  LoadContext ctx;
  ctx.residency = Residency::kEvictable;
  ctx.origin = Origin{found->source, wanted, ""};
  ctx.origin->targeted = !source_name.empty() || (origin && origin->targeted);
  if (options_.namespacing && found->source != nullptr) ctx.ns = found->source->url();
  if (wanted != name || IsArchiveName(wanted)) return LoadFromRoot(name, found->dir, ctx);
  return LoadOne(name, found->dir, std::nullopt, ctx);
}

absl::Status ModelLifecycle::Unload(const std::string& name, bool unload_dependents) {
  if (options_.namespacing) {
    // --model-namespacing: as Triton, an unload by a name several repositories hold unloads
    // each copy.
    std::vector<std::string> copies;
    {
      inferd::ReaderMutexLock lock(&mu_);
      if (!entries_.count(name)) {
        for (const auto& source : index_.sources()) {
          std::string key = NamespacedName(source->url(), name);
          if (entries_.count(key)) copies.push_back(std::move(key));
        }
      }
    }
    if (!copies.empty()) {
      absl::Status st;
      for (const auto& key : copies) st.Update(Unload(key, unload_dependents));
      return st;
    }
  }
  std::vector<std::shared_ptr<const Model>> retired;
  std::vector<std::shared_ptr<const std::string>> override_dirs;
  std::vector<std::string> dependents;
  {
    inferd::MutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      // Triton's unload of a name it has not loaded does nothing and succeeds (its
      // L0_lifecycle "Unload non-existing model, nothing should happen"): clients unload
      // unconditionally in their teardown, and an error there fails their scripts.
      LOG_INFO << "unload of model '" << name << "': not loaded, nothing to unload";
      return absl::OkStatus();
    }
    auto retire = [&](Entry& e, const std::string& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      // Like tritonserver, an unloaded model stays in the index as UNAVAILABLE ("unloaded").
      RetireLocked(n, kUnloadedReason, &retired);
      e.failed = false;
      e.reason.clear();
      e.explicit_load = false;
      if (e.override_dir) override_dirs.push_back(std::move(e.override_dir));
    };
    std::set<std::string> steps;
    if (unload_dependents) steps = StepModelsLocked(it->second);
    retire(it->second, name);
    // Triton's cascade: a step model leaves when it was loaded only for an ensemble and no
    // loaded ensemble runs it any more; its own steps are considered in turn.
    std::vector<std::string> work(steps.begin(), steps.end());
    while (!work.empty()) {
      const std::string step = work.back();
      work.pop_back();
      auto sit = entries_.find(step);
      if (sit == entries_.end() || sit->second.explicit_load) continue;
      bool loaded = false;
      for (const auto& [v, slot] : sit->second.versions) loaded |= slot.model != nullptr;
      if (!loaded) continue;
      bool still_run = false;
      for (const auto& [n, e] : entries_) {
        if (n != step && StepModelsLocked(e).count(step) != 0) still_run = true;
      }
      if (still_run) continue;
      const std::set<std::string> sub = StepModelsLocked(sit->second);
      retire(sit->second, step);
      dependents.push_back(step);
      work.insert(work.end(), sub.begin(), sub.end());
    }
  }
  FreeRetired(&retired);
  override_dirs.clear();
  LOG_INFO << "unloaded model '" << name << "'"
           << (dependents.empty() ? std::string()
                                  : StrCat(" and the models it ran: ", StrJoin(dependents, ", ")));
  return absl::OkStatus();
}

std::set<std::string> ModelLifecycle::StepModelsLocked(const Entry& e) const {
  std::set<std::string> steps;
  for (const auto& [v, slot] : e.versions) {
    if (!slot.model) continue;
    for (const auto& step : slot.model->config().ensemble_scheduling().step()) {
      steps.insert(NamespacedName(step.model_namespace(), step.model_name()));
    }
  }
  return steps;
}

absl::StatusOr<std::shared_ptr<const std::string>> ModelLifecycle::WriteOverrideFolder(
    const std::string& name, const std::map<std::string, std::string>& files) {
  for (const auto& [rel, content] : files) RETURN_IF_ERROR(ValidateOverrideFilePath(rel));
  std::string tmpl = (fs::temp_directory_path() / "inferd-override-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(StrCat("failed to load '", name,
                                      "': cannot create a temporary model folder: ",
                                      std::strerror(errno)));
  }
  // Removed when the last holder lets go (an unload, a later load, the entry's end).
  std::shared_ptr<const std::string> root(new std::string(tmpl), [](const std::string* p) {
    std::error_code ec;
    fs::remove_all(*p, ec);
    delete p;
  });
  const fs::path model_dir = fs::path(*root) / name;
  for (const auto& [rel, content] : files) {
    const fs::path path = model_dir / rel;
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    if (ec || !out) {
      return absl::InternalError(StrCat("failed to load '", name, "': cannot write parameter 'file:",
                                        rel, "' to ", path.string()));
    }
  }
  return root;
}

absl::Status ModelLifecycle::Forget(const std::string& name) {
  std::vector<std::shared_ptr<const Model>> retired;
  {
    inferd::MutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      return absl::NotFoundError(StrCat("model '", name, "' is not loaded"));
    }
    std::vector<std::string> parts = it->second.parts;
    std::vector<std::string> kept;
    for (const auto& p : parts) {
      if (SharedPartLocked(p, name)) kept.push_back(p);
    }
    RetireLocked(name, kUnloadedReason, &retired);
    entries_.erase(name);
    for (const auto& p : parts) {
      if (std::find(kept.begin(), kept.end(), p) == kept.end()) entries_.erase(p);
    }
  }
  FreeRetired(&retired);
  return absl::OkStatus();
}

void ModelLifecycle::FreeRetired(std::vector<std::shared_ptr<const Model>>* retired) {
  if (retired->empty()) return;
  std::vector<const void*> freed;
  for (const auto& m : *retired) freed.push_back(m.get());
  retired->clear();
  ReleaseFreeMemory();
  // Only now is their memory back: until here the budget still counted it, so a load on
  // another thread did not start in the room an eviction was still making.
  budget_.Freed(freed);
}

void ModelLifecycle::RetireLocked(const std::string& name, std::string_view reason,
                                  std::vector<std::shared_ptr<const Model>>* retired) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  // Counted against the budget until FreeRetired has freed them.
  std::vector<std::pair<const void*, int64_t>> leaving;
  for (auto& [v, slot] : it->second.versions) {
    if (slot.model && slot.footprint > 0) leaving.emplace_back(slot.model.get(), slot.footprint);
    switch (slot.state.state()) {
      case ModelState::kReady:
        (void)slot.state.TransitionTo(ModelState::kUnloading);
        break;
      case ModelState::kUnavailable:
        // Already out of service: only the reason changes (a failed or unloaded version).
        slot.state.set_reason(std::string(reason));
        break;
      default:
        break;
    }
    if (slot.model) retired->push_back(std::move(slot.model));
    slot.model = nullptr;
    slot.footprint = 0;
    if (slot.state.state() != ModelState::kUnavailable) {
      (void)slot.state.TransitionTo(ModelState::kUnavailable, std::string(reason));
    }
  }
  serving_.Unpublish(name);  // none of its versions serves now
  budget_.Retire(name, leaving);
  for (const auto& p : it->second.parts) {
    if (p != name && !SharedPartLocked(p, name)) RetireLocked(p, reason, retired);
  }
}

bool ModelLifecycle::SharedPartLocked(const std::string& part, const std::string& leaving) const {
  for (const auto& [n, e] : entries_) {
    if (n == leaving || std::find(e.parts.begin(), e.parts.end(), part) == e.parts.end()) continue;
    for (const auto& [v, slot] : e.versions) {
      if (slot.model) return true;  // another loaded ensemble still runs it
    }
  }
  return false;
}

void ModelLifecycle::UnloadAll() {
  std::map<std::string, Entry, std::less<>> retired;
  {
    inferd::MutexLock lock(&mu_);
    retired.swap(entries_);
    serving_.Clear();
    budget_.ClearSettled();
  }
  retired.clear();
}

void ModelLifecycle::Poll() {
  inferd::MutexLock pass_lock(&pass_mu_);
  Scan scan = index_.List();
  if (!scan.errors.empty()) return;  // an unreachable repository is not a removed model
  // What the store holds, for the index to compare with the listing.
  std::map<std::string, RepositoryIndex::Held, std::less<>> held;
  {
    inferd::MutexLock lock(&mu_);
    for (const auto& [name, entry] : entries_) {
      RepositoryIndex::Held& h = held[name];
      h.source_fingerprint = entry.source_fingerprint;
      h.removable = entry.residency == Residency::kPinned &&
                    !(entry.origin && !entry.origin->url.empty());
      if (options_.namespacing) h.steps = StepModelsLocked(entry);
    }
  }
  RepositoryIndex::Diff diff = index_.Compare(scan, held);
  std::vector<std::string>& removed = diff.removed;
  std::map<std::string, Listed>& changed = diff.changed;
  // Only what has settled loads: a model folder being copied or a file overwritten in place
  // would load half-written, and serve wrong answers (or fail) until the next change. Triton
  // reloads on the first change it sees; this waits one poll more, or none for files older
  // than kPollSettle. An object store's objects appear whole: they load at once.
  std::map<std::string, std::string> seen;
  for (const auto& [name, listed] : scan.models) seen[name] = listed.model.fingerprint;
  for (auto it = changed.begin(); it != changed.end();) {
    const auto& [name, listed] = *it;
    bool settled = listed.source->remote();
    if (auto prev = poll_seen_.find(name); prev != poll_seen_.end()) {
      settled = settled || prev->second == listed.model.fingerprint;
    }
    settled = settled ||
              NewestWriteAge(fs::path(listed.source->url()) / listed.model.name) >= kPollSettle;
    if (settled) {
      ++it;
    } else {
      LOG_INFO << "poll: model '" << name
               << "' is new or changed; it loads once its files are the same at the next poll";
      it = changed.erase(it);
    }
  }
  poll_seen_ = std::move(seen);
  for (const auto& name : removed) {
    std::vector<std::shared_ptr<const Model>> retired;
    {
      inferd::MutexLock lock(&mu_);
      RetireLocked(name, "removed from the repository", &retired);
      entries_.erase(name);
    }
    FreeRetired(&retired);
    LOG_INFO << "poll: model '" << name << "' left the repository; unloaded";
  }
  std::set<std::string> pass;
  for (const auto& [name, listed] : changed) {
    LOG_INFO << "poll: loading new or changed model '" << name << "'";
    FetchStats stats;
    auto dir = FetchCounted(listed.source, listed.model.name, &stats);
    if (!dir.ok()) {
      SetFailed(name, "", dir.status());
      continue;
    }
    LoadContext ctx;
    ctx.pass = &pass;
    ctx.source_fingerprint = listed.model.fingerprint;
    ctx.origin = Origin{listed.source, listed.model.name, ""};
    if (options_.namespacing) ctx.ns = listed.source->url();
    (void)LoadOne(name, *dir, std::nullopt, ctx);
  }
}

// ---- on demand -------------------------------------------------------------------------------

void ModelLifecycle::WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
                                   const std::string& source_name) {
  WhenAvailableImpl(name, std::move(then), source_name, WaitLimits{});
}

void ModelLifecycle::WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
                                   const WaitLimits& limits) {
  WhenAvailableImpl(name, std::move(then), "", limits);
}

void ModelLifecycle::WhenAvailableImpl(const std::string& name,
                                       std::function<void(absl::Status)> then,
                                       const std::string& source_name, const WaitLimits& limits) {
  auto waiter = waiters_.NewWaiter(name, std::move(then),
                                   LoadWaiters::Limits{limits.cancel, limits.deadline_ns});
  bool wait = false;
  bool submit_failed = false;
  bool stopping = false;
  absl::Status conflict;
  if (ValidateModelName(name).ok()) {
    inferd::MutexLock lock(&mu_);
    stopping = stopping_;
    auto it = entries_.find(name);
    bool ready = false;
    if (it != entries_.end()) {
      for (const auto& [v, slot] : it->second.versions) ready |= slot.state.ready();
    }
    const uint64_t now = core::NowNs();
    // One name, one source: a request that names another source than the one `name` was
    // loaded from (or is being loaded from) is refused, loaded or not. A model loaded from a
    // multi-model URL has no entry name to compare: the platform keys it by the name.
    std::string bound_to;
    if (!source_name.empty()) {
      if (it != entries_.end() && it->second.bound && it->second.origin &&
          it->second.origin->url.empty() && it->second.origin->source_name != source_name) {
        bound_to = it->second.origin->source_name;
      } else if (auto pending = waiters_.PendingSource(name);
                 pending && *pending != source_name) {
        bound_to = pending->empty() ? name : *pending;
      }
    }
    if (!bound_to.empty()) {
      conflict = absl::AlreadyExistsError(StrCat(
          "model '", name, "' serves '", bound_to, "'; the request names '", source_name,
          "' for it: one name serves one model (unload '", name, "' first, or use another name)"));
    }
    // Loads on demand: in on-demand mode, or a model the store evicted and remembers.
    bool may_load = conflict.ok() && !ready && !stopping &&
                    (options_.on_demand || (it != entries_.end() && it->second.origin &&
                                            it->second.residency == Residency::kEvictable));
    const std::string& looked_for = source_name.empty() ? name : source_name;
    if (may_load) {
      if (auto nf = not_found_.find(looked_for); nf != not_found_.end()) {
        if (now - nf->second < kNotFoundTtlNs) {
          may_load = false;
        } else {
          not_found_.erase(nf);
        }
      }
    }
    // A load that just failed: its reason answers until the retry delay, unless the request
    // names another source than the one that failed (a load still pending is joined).
    const bool failed_recently =
        may_load && it != entries_.end() && it->second.failed &&
        now - it->second.failed_at_ns < kRetryFailedNs &&
        (source_name.empty() || !it->second.origin ||
         it->second.origin->source_name == source_name);
    if (may_load) {
      const LoadWaiters::Joined joined =
          waiters_.Join(name, source_name, waiter, /*may_start=*/!failed_recently);
      if (joined != LoadWaiters::Joined::kNo) {
        ++counters_.misses;
        ++counters_.waited;
        wait = true;
      }
      // Submitted under mu_, so Shutdown (which sets stopping_ under it first) never sees a
      // load submitted after it drained the pool.
      if (joined == LoadWaiters::Joined::kStarted && !loader_->Submit([this, name, source_name] {
            absl::Status st;
            try {
              st = LoadOnDemand(name, source_name);
            } catch (const std::exception& e) {
              st = absl::InternalError(StrCat("loading model '", name, "': ", e.what()));
            }
            waiters_.Finish(name, st);
          })) {
        submit_failed = true;
      }
    }
  }
  if (!wait) {
    // The caller's lookup reports the model as it is.
    if (!conflict.ok()) return LoadWaiters::Fire(waiter, conflict);
    LoadWaiters::Fire(waiter, stopping ? absl::UnavailableError("the server is shutting down")
                                       : absl::OkStatus());
    return;
  }
  if (submit_failed) {
    waiters_.Finish(name, absl::UnavailableError(StrCat(
                              "model '", name, "' cannot be loaded now: too many loads queued")));
  }
}

// ---- the memory budget -----------------------------------------------------------------------

bool ModelLifecycle::EvictableLocked(const std::string& name, const Entry& e) const {
  // Not while loading, nor while the requests that waited for its load look it up.
  if (e.residency != Residency::kEvictable || loading_.count(name) || waiters_.IsPending(name)) {
    return false;
  }
  bool loaded = false;
  for (const auto& [v, slot] : e.versions) {
    if (!slot.model) continue;
    loaded = true;
    // The store's references (its slot and the serving map's) are the only ones: no request
    // holds the model.
    if (slot.model.use_count() > kStoreRefs || slot.model->InFlight() > 0) return false;
  }
  for (const auto& p : e.parts) {
    auto it = entries_.find(p);
    if (it == entries_.end()) continue;
    for (const auto& [v, slot] : it->second.versions) {
      if (slot.model && (slot.model.use_count() > kStoreRefs || slot.model->InFlight() > 0)) {
        return false;
      }
    }
  }
  return loaded;
}

int64_t ModelLifecycle::EstimateFootprintLocked(const Entry& e, int64_t on_disk) const {
  return budget_.Estimate(e.last_footprint, on_disk, options_.footprint_from_disk);
}

MemoryBudget::Models ModelLifecycle::BudgetModelsLocked() {
  MemoryBudget::Models models;
  // How each model has been used since the budget's policy last looked (requests only bump two
  // atomics), least recently used first so recency stays in order.
  std::vector<std::pair<uint64_t, RequestCount>> used;
  for (const auto& [n, e] : entries_) {
    const uint64_t uses = e.usage->uses.exchange(0, std::memory_order_relaxed);
    if (uses > 0) used.push_back({e.usage->last_used_ns.load(), RequestCount{n, uses}});
    if (e.residency == Residency::kEvictable) models.evictable.insert(n);
    const bool idle = EvictableLocked(n, e);
    if (idle) models.idle.insert(n);
    models.why[n] = e.residency == Residency::kPinned ? "pinned"
                    : e.residency == Residency::kPart ? "ensemble part"
                    : idle                            ? "idle"
                                                      : "in use";
  }
  std::sort(used.begin(), used.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  models.used.reserve(used.size());
  for (auto& [last, c] : used) models.used.push_back(std::move(c));
  return models;
}

absl::Status ModelLifecycle::MakeRoom(const std::string& name, int64_t needed, int64_t at_least,
                                      absl::Time deadline, int64_t* reserved) {
  for (;;) {
    MemoryBudget::Models models;
    bool stopping;
    {
      inferd::MutexLock lock(&mu_);
      stopping = stopping_;
      models = BudgetModelsLocked();
    }
    MemoryBudget::Room room =
        budget_.TryReserve(name, needed, at_least, reserved != nullptr, models);
    if (room.fits) {
      if (reserved != nullptr) *reserved = room.reserved;
      return absl::OkStatus();
    }
    if (!room.victims.empty()) {
      std::vector<std::shared_ptr<const Model>> retired;
      {
        inferd::MutexLock lock(&mu_);
        for (const auto& v : room.victims) {
          // A victim that became busy since is kept; the budget is asked again.
          auto it = entries_.find(v);
          if (it == entries_.end() || !EvictableLocked(v, it->second)) continue;
          RetireLocked(v, StrCat("evicted to make room for '", name, "' under the memory budget"),
                       &retired);
          ++counters_.evictions;
          LOG_INFO << "evicted idle model '" << v << "' to make room for '" << name << "'";
        }
      }
      FreeRetired(&retired);
      continue;
    }
    // Full for now: room comes back when requests in flight end (their models become
    // evictable) and other loads settle their reservations. Wait for it, up to the load-wait
    // limit; a model leaves "in use" without telling the budget, hence the bounded re-check.
    const absl::Time now = absl::Now();
    if (!room.forever && !stopping && now < deadline) {
      budget_.WaitForChange(room.generation, std::min(absl::Milliseconds(20), deadline - now));
      continue;
    }
    return room.status;
  }
}

absl::Status ModelLifecycle::MakeDeviceRoom(const std::string& name, int device, int64_t needed) {
  auto limit = options_.gpu_load_limits.find(device);
  if (limit == options_.gpu_load_limits.end()) return absl::OkStatus();
  const gpu::Runtime* gpus = options_.load.placement.gpus;
  std::string evicted;
  // Each round evicts one model or ends; a victim that turned busy under our feet is skipped.
  for (int round = 0;; ++round) {
    ASSIGN_OR_RETURN(gpu::MemoryInfo info, gpus->GetMemoryInfo(device));
    const uint64_t used = info.total_bytes - std::min(info.free_bytes, info.total_bytes);
    const double limit_bytes = limit->second * static_cast<double>(info.total_bytes);
    if (static_cast<double>(used) + static_cast<double>(needed) <= limit_bytes) {
      return absl::OkStatus();
    }
    MemoryBudget::Models models;
    {
      inferd::MutexLock lock(&mu_);
      models = BudgetModelsLocked();
    }
    const std::string victim = budget_.DeviceVictim(name, device, models);
    if (victim.empty() || round >= 4096) {
      return absl::ResourceExhaustedError(StrCat(
          "model '", name, "' cannot load on GPU ", device, ": its memory usage ", used >> 20,
          " MiB", needed > 0 ? StrCat(" + ", needed >> 20, " MiB this model took there before")
                             : std::string(),
          " exceeds the limit of ", limit->second, " x ", info.total_bytes >> 20, " MiB = ",
          static_cast<int64_t>(limit_bytes) >> 20, " MiB (--model-load-gpu-limit ", device, ":",
          limit->second, "); held on GPU ", device, " by ", budget_.DeviceHolders(device, models),
          ", none of it idle and evictable",
          evicted.empty() ? std::string() : StrCat(" (evicted for this load: ", evicted, ")")));
    }
    std::vector<std::shared_ptr<const Model>> retired;
    {
      inferd::MutexLock lock(&mu_);
      // A victim that became busy since is kept; the next round asks again.
      auto it = entries_.find(victim);
      if (it != entries_.end() && EvictableLocked(victim, it->second)) {
        RetireLocked(victim, StrCat("evicted to make room for '", name, "' on GPU ", device,
                                    " under --model-load-gpu-limit"),
                     &retired);
        ++counters_.evictions;
        LOG_INFO << "evicted idle model '" << victim << "' to make room for '" << name
                 << "' on GPU " << device;
        StrAppend(&evicted, evicted.empty() ? "" : ", ", victim);
      }
    }
    FreeRetired(&retired);
  }
}

// ---- lookups ---------------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<const Model>> ModelLifecycle::Get(std::string_view name,
                                                                 int64_t version) const {
  return Lookup(name, version, /*count_use=*/true);
}

absl::StatusOr<std::string> ModelLifecycle::ResolveLocked(std::string_view name) const {
  if (!options_.namespacing || entries_.count(name)) return std::string(name);
  // The namespaced copies of `name` (rare: only names several repositories hold).
  std::vector<std::string> keys;
  const std::string tail = StrCat("::", name);
  for (const auto& [key, entry] : entries_) {
    if (key.size() > tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0 &&
        PlainName(key) == name) {
      keys.push_back(key);
    }
  }
  if (keys.size() == 1) return keys.front();
  if (keys.size() > 1) {
    // Triton's words (FindModelIdentifier); a client cannot name a namespace.
    return absl::InvalidArgumentError(StrCat(
        "There are ", keys.size(), " identifiers of model '", name,
        "' in global map, model namespace must be provided to resolve ambiguity."));
  }
  return std::string(name);
}

std::string ModelLifecycle::PlainName(const std::string& key) const {
  return index_.PlainName(key);
}

void ModelLifecycle::PublishLocked(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return serving_.Unpublish(key);
  ServingMap::Versions ready;
  for (const auto& [v, slot] : it->second.versions) {
    if (slot.state.ready() && slot.model) ready.emplace(v, slot.model);
  }
  serving_.Publish(key, std::move(ready), it->second.usage);
}

absl::StatusOr<std::shared_ptr<const Model>> ModelLifecycle::Lookup(std::string_view name,
                                                                    int64_t version,
                                                                    bool count_use) const {
  // The hot path: one reader lock and one hash lookup in the serving map, never mu_.
  if (std::shared_ptr<const Model> model = serving_.Find(name, version, count_use)) {
    if (count_use) hits_.fetch_add(1, std::memory_order_relaxed);
    return model;
  }
  return LookupSlow(name, version, count_use);
}

absl::StatusOr<std::shared_ptr<const Model>> ModelLifecycle::LookupSlow(std::string_view name,
                                                                        int64_t version,
                                                                        bool count_use) const {
  inferd::ReaderMutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    // Checked only on a miss: a namespaced copy's key ("<repository>::<name>") is no folder
    // name, and only the store's ensembles dispatch to it.
    RETURN_IF_ERROR(ValidateModelName(name));
    ASSIGN_OR_RETURN(std::string key, ResolveLocked(name));
    it = entries_.find(key);
  }
  if (it == entries_.end()) return UnknownModelError(name);
  const auto& versions = it->second.versions;
  const Usage& usage = *it->second.usage;
  auto used = [this, &usage, count_use] {
    if (!count_use) return;
    hits_.fetch_add(1, std::memory_order_relaxed);
    const_cast<Usage&>(usage).uses.fetch_add(1, std::memory_order_relaxed);
    const_cast<Usage&>(usage).last_used_ns.store(core::NowNs(), std::memory_order_relaxed);
  };
  if (version < 0) {
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (v->second.state.ready()) {
        used();
        return v->second.model;
      }
    }
    std::string reason = it->second.reason;
    if (reason.empty() && !versions.empty()) reason = versions.rbegin()->second.state.reason();
    if (reason == kUnloadedReason) {
      return absl::NotFoundError(inferd::StrCat("model '", name, "' is not loaded (unloaded)"));
    }
    return absl::UnavailableError(inferd::StrCat("model '", name, "' has no ready version",
                                                 reason.empty() ? "" : ": ", reason));
  }
  auto v = versions.find(version);
  if (v == versions.end()) {
    return UnknownModelError(name, version);
  }
  if (!v->second.state.ready()) {
    const VersionState& state = v->second.state;
    return absl::UnavailableError(inferd::StrCat("model '", name, "' version ", version, " is ",
                                                 ModelStateName(state.state()),
                                                 state.reason().empty() ? "" : ": ",
                                                 state.reason()));
  }
  used();
  return v->second.model;
}

std::vector<std::shared_ptr<const Model>> ModelLifecycle::ReadyVersions(
    std::string_view name) const {
  std::vector<std::shared_ptr<const Model>> out = serving_.ReadyVersions(name);
  if (!out.empty()) return out;
  // Not served under that key: a namespaced copy, or nothing ready.
  inferd::ReaderMutexLock lock(&mu_);
  auto key = ResolveLocked(name);
  if (!key.ok()) return out;
  auto it = entries_.find(*key);
  if (it == entries_.end()) return out;
  for (const auto& [v, slot] : it->second.versions) {
    if (slot.state.ready()) out.push_back(slot.model);
  }
  return out;
}

bool ModelLifecycle::IsReady(std::string_view name, int64_t version) const {
  return IsReadyAtDepth(name, version, 0);
}

// An ensemble is ready only while every model it runs is ready.
bool ModelLifecycle::IsReadyAtDepth(std::string_view name, int64_t version, int depth) const {
  // A readiness probe is not a use: it must not keep a model from eviction.
  auto model = Lookup(name, version, /*count_use=*/false);
  if (!model.ok()) return false;
  const config::ModelConfig& cfg = (*model)->config();
  if (cfg.platform() != "ensemble") return (*model)->InstancesReady();
  if (depth >= 16) return false;
  for (const auto& step : cfg.ensemble_scheduling().step()) {
    const int64_t v = step.model_version() > 0 ? step.model_version() : -1;
    if (!IsReadyAtDepth(NamespacedName(step.model_namespace(), step.model_name()), v, depth + 1)) {
      return false;
    }
  }
  return true;
}

std::vector<IndexEntry> ModelLifecycle::Index(bool ready_only) const {
  std::vector<IndexEntry> out;
  std::optional<Scan> scan;
  if (!ready_only) scan = index_.List();
  inferd::ReaderMutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    if (entry.failed && !ready_only) {
      bool serving = false;
      for (const auto& [v, slot] : entry.versions) serving |= slot.state.ready();
      if (!serving) {
        out.push_back({PlainName(name), "", "UNAVAILABLE", entry.reason});
        continue;
      }
    }
    for (const auto& [v, slot] : entry.versions) {
      if (ready_only && !slot.state.ready()) continue;
      std::string reason = slot.state.reason();
      if (entry.failed && slot.state.ready()) {
        reason = StrCat("reload failed, the previous load keeps serving: ", entry.reason);
      }
      // A namespaced copy is listed under its own name, as Triton's index does.
      out.push_back({PlainName(name), inferd::StrCat(v), std::string(ModelStateName(slot.state.state())),
                     reason});
    }
  }
  if (scan) {
    for (const auto& [name, listed] : scan->models) {
      if (!entries_.count(name)) out.push_back({PlainName(name), "", "", ""});
    }
    for (const auto& [name, reason] : scan->duplicates) {
      if (!entries_.count(name)) out.push_back({name, "", "UNAVAILABLE", reason});
    }
  }
  std::sort(out.begin(), out.end(), [](const IndexEntry& a, const IndexEntry& b) {
    return a.name != b.name ? a.name < b.name : a.version < b.version;
  });
  return out;
}

bool ModelLifecycle::AllReady() const {
  inferd::ReaderMutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    if (entry.residency != Residency::kPinned) continue;  // on demand: they come and go
    bool serving = false;
    for (const auto& [v, slot] : entry.versions) serving |= slot.state.ready();
    if (entry.failed && !serving) return false;
    for (const auto& [v, slot] : entry.versions) {
      if (!slot.state.ready() && slot.state.reason() != kUnloadedReason) return false;
    }
  }
  return true;
}

std::vector<std::shared_ptr<const Model>> ModelLifecycle::AllReadyModels() const {
  std::vector<std::shared_ptr<const Model>> out;
  inferd::ReaderMutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    for (const auto& [v, slot] : entry.versions) {
      if (slot.state.ready()) out.push_back(slot.model);
    }
  }
  return out;
}

int64_t ModelLifecycle::FootprintBytes(std::string_view name, int64_t version) const {
  inferd::ReaderMutexLock lock(&mu_);
  auto key = ResolveLocked(name);
  if (!key.ok()) return 0;
  auto it = entries_.find(*key);
  if (it == entries_.end()) return 0;
  auto v = it->second.versions.find(version);
  return v == it->second.versions.end() ? 0 : v->second.footprint;
}

std::map<std::string, std::string> ModelLifecycle::UrlModels() const {
  std::map<std::string, std::string> out;
  inferd::ReaderMutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    if (!entry.origin) continue;
    if (!entry.origin->url.empty()) {
      out[name] = entry.origin->url;
    } else if (entry.origin->targeted && entry.bound && entry.origin->source != nullptr) {
      out[name] = StrCat(entry.origin->source->url(), "/", entry.origin->source_name);
    }
  }
  return out;
}

void ModelLifecycle::CollectMetrics(metrics::PrometheusWriter& w) const {
  struct Row {
    std::string name;
    int64_t version;
    int64_t bytes;
    std::string ns;  // --model-namespacing: the model's repository
  };
  std::vector<Row> rows;
  int64_t resident = 0;
  size_t loaded = 0;
  StoreCounters c;
  {
    inferd::ReaderMutexLock lock(&mu_);
    for (const auto& [name, e] : entries_) {
      bool any = false;
      for (const auto& [v, slot] : e.versions) {
        if (!slot.model) continue;
        any = true;
        rows.push_back({PlainName(name), v, slot.footprint, slot.model->model_namespace()});
        resident += slot.footprint;
      }
      loaded += any;
    }
    c = counters_;
  }
  c.hits = hits_.load();
  c.wait_timeouts = waiters_.timeouts();
  w.Family("inferd_model_memory_bytes",
           "Measured memory footprint of a loaded model version (RSS growth over its load, at "
           "least its size on disk)", "gauge");
  for (const auto& r : rows) {
    metrics::Labels labels{{"model", r.name}, {"version", StrCat(r.version)}};
    if (!r.ns.empty()) labels.insert(labels.begin(), {"namespace", r.ns});  // as Triton's
    w.Sample("inferd_model_memory_bytes", labels, static_cast<double>(r.bytes));
  }
  auto one = [&w](const char* name, const char* help, const char* type, double value) {
    w.Family(name, help, type);
    w.Sample(name, {}, value);
  };
  one("inferd_model_store_resident_bytes", "Sum of the loaded models' footprints", "gauge",
      static_cast<double>(resident));
  one("inferd_model_store_budget_bytes", "--model-memory-budget (0: none)", "gauge",
      static_cast<double>(options_.memory_budget_bytes));
  one("inferd_model_store_loaded_models", "Models with a loaded version", "gauge",
      static_cast<double>(loaded));
  w.Family("inferd_model_loads_total", "Model loads, by result", "counter");
  w.Sample("inferd_model_loads_total", {{"result", "success"}}, static_cast<double>(c.loads));
  w.Sample("inferd_model_loads_total", {{"result", "failure"}}, static_cast<double>(c.load_failures));
  w.Family("inferd_model_evictions_total", "Models unloaded by the store, by reason", "counter");
  w.Sample("inferd_model_evictions_total", {{"reason", "memory_budget"}},
           static_cast<double>(c.evictions));
  one("inferd_model_load_seconds_total", "Time spent loading models (fetch excluded)", "counter",
      c.load_seconds);
  one("inferd_model_download_seconds_total", "Time spent downloading models from remote repositories",
      "counter", c.download_seconds);
  one("inferd_model_download_bytes_total", "Bytes downloaded from remote repositories", "counter",
      static_cast<double>(c.download_bytes));
  one("inferd_model_fetch_cache_hits_total",
      "Remote model fetches answered by the local cache (same ETag)", "counter",
      static_cast<double>(c.fetch_cache_hits));
  one("inferd_model_cache_hits_total", "Requests whose model was loaded", "counter",
      static_cast<double>(c.hits));
  one("inferd_model_cache_misses_total", "Requests whose model had to be loaded first", "counter",
      static_cast<double>(c.misses));
  one("inferd_model_load_waits_total", "Requests that waited for an on-demand load", "counter",
      static_cast<double>(c.waited));
  one("inferd_model_load_wait_timeouts_total",
      "Requests answered 503 because their model's load outlasted --model-load-wait-secs",
      "counter", static_cast<double>(c.wait_timeouts));
}

}  // namespace inferd::repository
