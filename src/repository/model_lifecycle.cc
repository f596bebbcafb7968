#include "repository/model_lifecycle.h"

#include <filesystem>

#include "common/strings.h"
#include "common/logging.h"
#include "common/memory.h"
#include "common/status_macros.h"
#include "repository/ensemble_validation.h"
#include "repository/repository_scan.h"
#include "scheduling/ensemble_scheduler.h"

namespace inferd::repository {

namespace fs = std::filesystem;

namespace {
constexpr char kUnloadedReason[] = "unloaded";

// Frees versions taken out of the index (outside mu_: each drains its in-flight requests) and
// hands the memory they held back to the kernel, so an unload, a reload or an eviction shows
// up in RSS.
template <typename Map>
void FreeRetired(Map* retired) {
  if (retired->empty()) return;
  retired->clear();
  ReleaseFreeMemory();
}
}  // namespace

std::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading: return "LOADING";
    case ModelState::kReady: return "READY";
    case ModelState::kUnloading: return "UNLOADING";
    case ModelState::kUnavailable: return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

ModelLifecycle::ModelLifecycle(LifecycleOptions options, const backends::BackendRegistry* backends)
    : options_(std::move(options)), backends_(backends) {}

ModelLifecycle::~ModelLifecycle() { UnloadAll(); }

absl::StatusOr<config::ModelConfig> ModelLifecycle::BuildConfig(
    const std::string& name, const std::string& dir,
    const std::optional<config::ModelConfig>& override_config) {
  config::ModelConfig cfg;
  const std::string path = inferd::StrCat(dir, "/config.pbtxt");
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
  if (cfg.backend().empty() && cfg.platform().empty()) {
    // No config says which backend: recognise the model file, as Triton does.
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
    }
  }
  if (cfg.backend().empty() && cfg.platform().empty()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", name, "': cannot tell which backend serves it: config.pbtxt sets neither "
        "'backend' nor 'platform', and no version folder holds model.onnx or model.pt"));
  }
  backends::Backend* backend = backends_->Find(cfg.backend());
  if (backend == nullptr && cfg.platform() != "ensemble") {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", name, "': backend '", cfg.backend(), "' is not available in this server"));
  }
  if (options_.auto_complete && backend != nullptr && !versions.empty()) {
    std::string filename = cfg.default_model_filename();
    if (filename.empty() && cfg.backend() == "onnxruntime") filename = "model.onnx";
    std::string model_path = inferd::StrCat(dir, "/", versions.back(), "/", filename);
    if (!filename.empty() && fs::exists(model_path)) {
      RETURN_IF_ERROR(backend->AutoCompleteConfig(model_path, &cfg));
    }
  }
  RETURN_IF_ERROR(config::NormalizeAndValidate(&cfg, name));
  return cfg;
}

void ModelLifecycle::SetFailed(const std::string& name, const std::string& dir,
                               const absl::Status& status) {
  inferd::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  e.dir = dir;
  e.failed = true;
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

absl::Status ModelLifecycle::Load(const std::string& name,
                                  const std::optional<config::ModelConfig>& override_config) {
  if (!IsSafeModelName(name)) {
    return absl::InvalidArgumentError(inferd::StrCat("invalid model name '", name, "'"));
  }
  inferd::MutexLock load_lock(&load_mu_);
  ScanResult scan = ScanRepositories(options_.repositories);
  if (auto dup = scan.duplicates.find(name); dup != scan.duplicates.end()) {
    return absl::InvalidArgumentError(dup->second);
  }
  auto it = scan.models.find(name);
  if (it == scan.models.end()) {
    return absl::NotFoundError(
        inferd::StrCat("failed to load '", name, "': no model folder '", name,
                     "' in the model repository"));
  }
  return LoadLocked(name, it->second.dir, override_config);
}

absl::Status ModelLifecycle::LoadFromDirectory(const std::string& name, const std::string& dir) {
  RETURN_IF_ERROR(ValidateModelName(name));
  std::optional<config::ModelConfig> override_config;
  const std::string path = inferd::StrCat(dir, "/config.pbtxt");
  if (fs::exists(path)) {
    ASSIGN_OR_RETURN(auto cfg, config::ReadModelConfigFile(path));
    cfg.set_name(name);
    override_config = std::move(cfg);
  }
  inferd::MutexLock load_lock(&load_mu_);
  return LoadLocked(name, dir, override_config);
}

absl::Status ModelLifecycle::LoadLocked(const std::string& name, const std::string& dir,
                                        const std::optional<config::ModelConfig>& override_config) {
  const std::string fingerprint = Fingerprint(dir);
  auto cfg = BuildConfig(name, dir, override_config);
  if (!cfg.ok()) {
    LOG_ERROR << "failed to load model '" << name << "': " << cfg.status().message();
    SetFailed(name, dir, cfg.status());
    {
      inferd::MutexLock lock(&mu_);
      entries_[name].fingerprint = fingerprint;
    }
    return cfg.status();
  }
  if (cfg->platform() == "ensemble") {
    absl::Status st = PrepareEnsemble(*cfg);
    if (!st.ok()) {
      LOG_ERROR << "failed to load model '" << name << "': " << st.message();
      SetFailed(name, dir, st);
      inferd::MutexLock lock(&mu_);
      entries_[name].fingerprint = fingerprint;
      return st;
    }
  }

  // Which versions the policy serves.
  std::vector<int64_t> available = ListVersions(dir);
  std::vector<int64_t> wanted;
  std::map<int64_t, std::string> missing;
  const auto& policy = cfg->version_policy();
  if (policy.has_all()) {
    wanted = available;
  } else if (policy.has_specific()) {
    for (int64_t v : policy.specific().versions()) {
      if (std::find(available.begin(), available.end(), v) != available.end()) {
        wanted.push_back(v);
      } else {
        missing[v] = inferd::StrCat("version ", v, " named by version_policy.specific has no folder '",
                                  dir, "/", v, "'");
      }
    }
  } else {
    const size_t n = policy.latest().num_versions();
    for (size_t i = available.size() > n ? available.size() - n : 0; i < available.size(); ++i) {
      wanted.push_back(available[i]);
    }
  }
  if (wanted.empty() && missing.empty()) {
    absl::Status st = absl::InvalidArgumentError(
        inferd::StrCat("model '", name, "': no version folders found in '", dir, "'"));
    LOG_ERROR << st.message();
    SetFailed(name, dir, st);
    return st;
  }

  {
    inferd::MutexLock lock(&mu_);
    Entry& e = entries_[name];
    e.dir = dir;
    for (int64_t v : wanted) {
      if (!e.versions.count(v)) e.versions[v].state = ModelState::kLoading;
    }
  }

  // Load the new versions while the old ones keep serving.
  backends::Backend* backend = backends_->Find(cfg->backend());
  std::map<int64_t, VersionSlot> fresh;
  absl::Status first_error;
  for (int64_t v : wanted) {
    VersionSlot slot;
    auto model = Model::Load(*cfg, dir, v, backend, options_.load);
    if (model.ok()) {
      slot.state = ModelState::kReady;
      slot.model = *std::move(model);
    } else {
      slot.state = ModelState::kUnavailable;
      slot.reason = std::string(model.status().message());
      LOG_ERROR << "failed to load model '" << name << "' version " << v << ": "
                << model.status().message();
      if (first_error.ok()) first_error = model.status();
    }
    fresh[v] = std::move(slot);
  }
  for (auto& [v, reason] : missing) {
    fresh[v] = VersionSlot{ModelState::kUnavailable, reason, nullptr};
    if (first_error.ok()) first_error = absl::NotFoundError(reason);
  }

  std::map<int64_t, VersionSlot> retired;
  {
    inferd::MutexLock lock(&mu_);
    Entry& e = entries_[name];
    retired.swap(e.versions);
    e.versions = std::move(fresh);
    e.failed = false;
    e.reason.clear();
    e.fingerprint = fingerprint;
  }
  FreeRetired(&retired);  // the versions this load replaced
  return first_error;
}

absl::Status ModelLifecycle::PrepareEnsemble(const config::ModelConfig& config) {
  ASSIGN_OR_RETURN(auto graph, scheduling::BuildEnsembleGraph(config));
  ensemble_stack_.push_back(config.name());
  struct Pop {
    std::vector<std::string>* stack;
    ~Pop() { stack->pop_back(); }
  } pop{&ensemble_stack_};
  std::optional<ScanResult> scan;
  std::vector<std::shared_ptr<const Model>> models;
  std::vector<const config::ModelConfig*> configs;
  for (size_t i = 0; i < graph.steps.size(); ++i) {
    const auto& step = graph.steps[i];
    const std::string where = inferd::StrCat("ensemble '", config.name(), "' step ", i,
                                             " (model '", step.model_name, "')");
    if (std::find(ensemble_stack_.begin(), ensemble_stack_.end(), step.model_name) !=
        ensemble_stack_.end()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          where, ": ensembles form a cycle (", inferd::StrJoin(ensemble_stack_, " -> "), " -> ",
          step.model_name, ")"));
    }
    auto model = Get(step.model_name, step.model_version);
    const bool tried = pass_loaded_ != nullptr && pass_loaded_->count(step.model_name) > 0;
    if (!model.ok() && !tried) {
      if (!scan) scan = ScanRepositories(options_.repositories);
      if (auto it = scan->models.find(step.model_name); it != scan->models.end()) {
        LOG_INFO << "loading model '" << step.model_name << "', which ensemble '"
                 << config.name() << "' runs";
        if (pass_loaded_ != nullptr) pass_loaded_->insert(step.model_name);
        (void)LoadLocked(step.model_name, it->second.dir, std::nullopt);
        model = Get(step.model_name, step.model_version);
      }
    }
    if (!model.ok()) {
      return absl::InvalidArgumentError(
          inferd::StrCat(where, ": the model is not available: ", model.status().message()));
    }
    configs.push_back(&(*model)->config());
    models.push_back(*std::move(model));
  }
  return ValidateEnsembleSteps(config, graph, configs);
}

absl::Status ModelLifecycle::LoadAll() {
  inferd::MutexLock load_lock(&load_mu_);
  ScanResult scan = ScanRepositories(options_.repositories);
  std::vector<std::string> failures;
  for (const auto& [name, reason] : scan.duplicates) {
    SetFailed(name, "", absl::InvalidArgumentError(reason));
    failures.push_back(reason);
  }
  std::set<std::string> pass;
  pass_loaded_ = &pass;
  for (const auto& [name, loc] : scan.models) {
    if (!pass.insert(name).second) continue;  // loaded already, with an ensemble
    absl::Status st = LoadLocked(name, loc.dir, std::nullopt);
    if (!st.ok()) failures.push_back(std::string(st.message()));
  }
  pass_loaded_ = nullptr;
  if (failures.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(inferd::StrJoin(failures, "; "));
}

absl::Status ModelLifecycle::Unload(const std::string& name) {
  inferd::MutexLock load_lock(&load_mu_);
  std::map<int64_t, VersionSlot> retired;
  {
    inferd::MutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      return absl::InvalidArgumentError(
          inferd::StrCat("failed to unload '", name, "': the model is not loaded"));
    }
    // Like tritonserver, an unloaded model stays in the index as UNAVAILABLE ("unloaded").
    for (auto& [v, slot] : it->second.versions) {
      retired[v].model = std::move(slot.model);
      slot.state = ModelState::kUnavailable;
      slot.reason = kUnloadedReason;
    }
    it->second.failed = false;
    it->second.reason.clear();
  }
  FreeRetired(&retired);
  LOG_INFO << "unloaded model '" << name << "'";
  return absl::OkStatus();
}

void ModelLifecycle::UnloadAll() {
  inferd::MutexLock load_lock(&load_mu_);
  std::map<std::string, Entry, std::less<>> retired;
  {
    inferd::MutexLock lock(&mu_);
    retired.swap(entries_);
  }
  retired.clear();
}

void ModelLifecycle::Poll() {
  inferd::MutexLock load_lock(&load_mu_);
  ScanResult scan = ScanRepositories(options_.repositories);
  std::vector<std::string> removed;
  std::map<std::string, std::string> changed;  // name -> dir
  {
    inferd::MutexLock lock(&mu_);
    for (const auto& [name, entry] : entries_) {
      if (!scan.models.count(name)) removed.push_back(name);
    }
  }
  for (const auto& [name, loc] : scan.models) {
    std::string fp = Fingerprint(loc.dir);
    inferd::MutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it == entries_.end() || it->second.fingerprint != fp) changed[name] = loc.dir;
  }
  for (const auto& name : removed) {
    std::map<int64_t, VersionSlot> retired;
    {
      inferd::MutexLock lock(&mu_);
      auto it = entries_.find(name);
      retired.swap(it->second.versions);
      entries_.erase(it);
    }
    FreeRetired(&retired);
    LOG_INFO << "poll: model '" << name << "' left the repository; unloaded";
  }
  std::set<std::string> pass;
  pass_loaded_ = &pass;
  for (const auto& [name, dir] : changed) {
    if (!pass.insert(name).second) continue;  // loaded already, with an ensemble
    LOG_INFO << "poll: loading new or changed model '" << name << "'";
    (void)LoadLocked(name, dir, std::nullopt);
  }
  pass_loaded_ = nullptr;
}

absl::StatusOr<std::shared_ptr<const Model>> ModelLifecycle::Get(std::string_view name,
                                                                 int64_t version) const {
  RETURN_IF_ERROR(ValidateModelName(name));
  inferd::ReaderMutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(inferd::StrCat("unknown model '", name, "'"));
  }
  const auto& versions = it->second.versions;
  if (version < 0) {
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (v->second.state == ModelState::kReady) return v->second.model;
    }
    std::string reason = it->second.reason;
    if (reason.empty() && !versions.empty()) reason = versions.rbegin()->second.reason;
    if (reason == kUnloadedReason) {
      return absl::NotFoundError(inferd::StrCat("model '", name, "' is not loaded (unloaded)"));
    }
    return absl::UnavailableError(inferd::StrCat("model '", name, "' has no ready version",
                                               reason.empty() ? "" : ": ", reason));
  }
  auto v = versions.find(version);
  if (v == versions.end()) {
    return absl::NotFoundError(
        inferd::StrCat("unknown version ", version, " of model '", name, "'"));
  }
  if (v->second.state != ModelState::kReady) {
    return absl::UnavailableError(inferd::StrCat("model '", name, "' version ", version, " is ",
                                               ModelStateName(v->second.state),
                                               v->second.reason.empty() ? "" : ": ",
                                               v->second.reason));
  }
  return v->second.model;
}

std::vector<std::shared_ptr<const Model>> ModelLifecycle::ReadyVersions(
    std::string_view name) const {
  std::vector<std::shared_ptr<const Model>> out;
  inferd::ReaderMutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return out;
  for (const auto& [v, slot] : it->second.versions) {
    if (slot.state == ModelState::kReady) out.push_back(slot.model);
  }
  return out;
}

bool ModelLifecycle::IsReady(std::string_view name, int64_t version) const {
  return IsReadyAtDepth(name, version, 0);
}

// An ensemble is ready only while every model it runs is ready.
bool ModelLifecycle::IsReadyAtDepth(std::string_view name, int64_t version, int depth) const {
  auto model = Get(name, version);
  if (!model.ok()) return false;
  const config::ModelConfig& cfg = (*model)->config();
  if (cfg.platform() != "ensemble") return true;
  if (depth >= 16) return false;
  for (const auto& step : cfg.ensemble_scheduling().step()) {
    const int64_t v = step.model_version() > 0 ? step.model_version() : -1;
    if (!IsReadyAtDepth(step.model_name(), v, depth + 1)) return false;
  }
  return true;
}

std::vector<IndexEntry> ModelLifecycle::Index(bool ready_only) const {
  std::vector<IndexEntry> out;
  ScanResult scan = ScanRepositories(options_.repositories);
  inferd::ReaderMutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    if (entry.failed) {
      if (!ready_only) out.push_back({name, "", "UNAVAILABLE", entry.reason});
      continue;
    }
    for (const auto& [v, slot] : entry.versions) {
      if (ready_only && slot.state != ModelState::kReady) continue;
      out.push_back({name, inferd::StrCat(v), std::string(ModelStateName(slot.state)), slot.reason});
    }
  }
  if (!ready_only) {
    for (const auto& [name, loc] : scan.models) {
      if (!entries_.count(name)) out.push_back({name, "", "", ""});
    }
    for (const auto& [name, reason] : scan.duplicates) {
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
    if (entry.failed) return false;
    for (const auto& [v, slot] : entry.versions) {
      if (slot.state != ModelState::kReady && slot.reason != kUnloadedReason) return false;
    }
  }
  return true;
}

std::vector<std::shared_ptr<const Model>> ModelLifecycle::AllReadyModels() const {
  std::vector<std::shared_ptr<const Model>> out;
  inferd::ReaderMutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    for (const auto& [v, slot] : entry.versions) {
      if (slot.state == ModelState::kReady) out.push_back(slot.model);
    }
  }
  return out;
}

}  // namespace inferd::repository
