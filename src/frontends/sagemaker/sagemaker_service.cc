#include "frontends/sagemaker/sagemaker_service.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/logging.h"
#include "common/strings.h"
#include "core/infer_request.h"
#include "frontends/http/infer_codec.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"
#include "repository/s3.h"

namespace inferd::sagemaker {
namespace fs = std::filesystem;
using http::ErrorResponse;
using http::HttpRequest;
using http::HttpResponse;

namespace {

constexpr size_t kPageSize = 100;

HttpResponse Empty(int status) {
  HttpResponse r;
  r.status = status;
  return r;
}

HttpResponse JsonBody(rapidjson::StringBuffer& buf) {
  HttpResponse r;
  r.content_type = "application/json";
  r.body.assign(buf.GetString(), buf.GetSize());
  return r;
}

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

bool IsArchive(const std::string& path) {
  for (std::string_view ext : {".tar.gz", ".tgz", ".tar"}) {
    if (path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
      return true;
    }
  }
  return false;
}

bool IsEnsemble(const fs::path& model_dir) {
  std::ifstream in(model_dir / "config.pbtxt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // platform: "ensemble" with any spacing.
  for (size_t pos = text.find("platform"); pos != std::string::npos;
       pos = text.find("platform", pos + 1)) {
    size_t q = text.find('"', pos);
    if (q != std::string::npos && text.compare(q, 10, "\"ensemble\"") == 0) return true;
  }
  return false;
}

// SageMaker Triton's rules: a folder with config.pbtxt (or numeric version folders) is the
// model; otherwise it holds models, and the one to load is its only sub-folder, or the
// ensemble among several.
absl::StatusOr<fs::path> ChooseModelFolder(const fs::path& root) {
  if (fs::exists(root / "config.pbtxt")) return root;
  std::vector<fs::path> subdirs;
  bool has_version = false;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    const std::string n = e.path().filename().string();
    if (!n.empty() && std::all_of(n.begin(), n.end(), ::isdigit)) has_version = true;
    subdirs.push_back(e.path());
  }
  if (has_version) return root;
  if (subdirs.size() == 1) return ChooseModelFolder(subdirs[0]);
  for (const auto& d : subdirs) {
    if (IsEnsemble(d)) return d;
  }
  if (subdirs.empty()) {
    return absl::InvalidArgumentError(
        StrCat("'", root.filename().string(), "' holds no model (no config.pbtxt, no version folder)"));
  }
  return absl::InvalidArgumentError(StrCat(
      "'", root.filename().string(), "' holds ", subdirs.size(),
      " models and none is an ensemble: put one model (or one ensemble and its parts) in it"));
}

bool LooksLikeOutOfMemory(std::string_view message) {
  for (std::string_view s : {"out of memory", "Out of memory", "OutOfMemory", "bad_alloc",
                             "Failed to allocate memory", "failed to allocate memory",
                             "No space left on device"}) {
    if (message.find(s) != std::string_view::npos) return true;
  }
  return false;
}

// Rewrites a KServe answer for SageMaker: the binary JSON header length moves from
// Inference-Header-Content-Length into the content type.
HttpResponse ToSageMaker(HttpResponse r) {
  for (auto it = r.headers.begin(); it != r.headers.end(); ++it) {
    if (it->first == "Inference-Header-Content-Length") {
      r.content_type = StrCat(kBinaryMimePrefix, it->second);
      r.headers.erase(it);
      return r;
    }
  }
  return r;
}

}  // namespace

absl::StatusOr<std::optional<size_t>> ParseSageMakerContentType(std::string_view content_type,
                                                                size_t body_size) {
  const size_t pos = content_type.find(kBinaryMimePrefix);
  if (pos == std::string_view::npos) return std::optional<size_t>();
  if (pos != 0) {
    return absl::InvalidArgumentError(StrCat("expect MIME type for binary data starts with '",
                                             kBinaryMimePrefix, "', got: ", content_type));
  }
  std::string_view size = content_type.substr(kBinaryMimePrefix.size());
  if (const size_t semi = size.find(';'); semi != std::string_view::npos) size = size.substr(0, semi);
  while (!size.empty() && size.back() == ' ') size.remove_suffix(1);
  size_t n = 0;
  auto [p, ec] = std::from_chars(size.data(), size.data() + size.size(), n);
  if (size.empty() || ec != std::errc() || p != size.data() + size.size()) {
    return absl::InvalidArgumentError(StrCat("Unable to parse inference header size, got: ", size));
  }
  if (n > body_size) {
    return absl::InvalidArgumentError(StrCat("inference header size should be in range (0, ",
                                             body_size, "), got: ", size));
  }
  return std::optional<size_t>(n);
}

SageMakerService::SageMakerService(server::Server* server, http::KServeHttpService* kserve,
                                   SageMakerOptions options, metrics::MetricsRegistry* registry)
    : server_(server), kserve_(kserve), options_(std::move(options)) {
  if (registry != nullptr) {
    registry->AddCollector([this](metrics::PrometheusWriter& w) { Collect(w); });
  }
}

SageMakerService::~SageMakerService() = default;

http::HttpHandler SageMakerService::AsHandler() {
  return [this](const HttpRequest& request, std::shared_ptr<const void> owner,
                std::unique_ptr<http::Responder> responder) {
    std::shared_ptr<http::Responder> shared(std::move(responder));
    Handle(request, std::move(owner),
           [shared](std::function<HttpResponse()> make) { shared->Post(std::move(make)); });
  };
}

void SageMakerService::Handle(const HttpRequest& request, std::shared_ptr<const void> owner,
                              Reply reply) {
  auto now = [&reply](HttpResponse r) {
    auto shared = std::make_shared<HttpResponse>(std::move(r));
    reply([shared] { return std::move(*shared); });
  };
  const std::string_view path = request.path;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  if (path == "/ping") {
    if (!get) return now(ErrorResponse(405, "use GET /ping"));
    const bool ok = options_.ping_live ? server_->IsLive() : server_->IsReady();
    return now(Empty(ok ? 200 : 400));
  }
  if (path == "/invocations") {
    if (!post) return now(ErrorResponse(405, "use POST /invocations"));
    return Invocations(request, std::move(owner), std::move(reply));
  }
  if (path == "/models" || path == "/models/") {
    if (get) return now(ListModels(request));
    if (post) return LoadModel(request, std::move(reply));
    return now(ErrorResponse(405, "use GET or POST /models"));
  }
  if (path.rfind("/models/", 0) == 0) {
    std::string_view rest = path.substr(8);
    const size_t slash = rest.find('/');
    auto decoded = http::PercentDecode(rest.substr(0, slash));
    if (!decoded) return now(ErrorResponse(400, "malformed percent-escape in the URL path"));
    const std::string name = *std::move(decoded);
    const std::string_view action = slash == std::string_view::npos ? "" : rest.substr(slash);
    if (auto st = server::Server::ValidateModelName(name); !st.ok()) return now(ErrorResponse(st));
    if (action.empty()) {
      if (get) return now(GetModel(name));
      if (request.method == "DELETE") return UnloadModel(name, std::move(reply));
      return now(ErrorResponse(405, "use GET or DELETE /models/<name>"));
    }
    if (action == "/invoke") {
      if (!post) return now(ErrorResponse(405, "use POST /models/<name>/invoke"));
      {
        inferd::MutexLock lock(&mu_);
        if (models_.find(name) == models_.end()) {
          ++misses_;
          return now(ErrorResponse(404, StrCat("model '", name, "' is not loaded")));
        }
        ++hits_;
      }
      if (auto target = request.Header("X-Amzn-SageMaker-Target-Model")) {
        LOG_VERBOSE << "sagemaker: invoke '" << name << "' (TargetModel " << *target << ")";
      }
      return Invoke(request, std::move(owner), name, std::move(reply), /*track=*/true);
    }
  }
  return now(ErrorResponse(404, StrCat("no SageMaker route for ", request.method, " ", path)));
}

void SageMakerService::Invocations(const HttpRequest& request, std::shared_ptr<const void> owner,
                                   Reply reply) {
  std::string model = options_.default_model;
  if (model.empty()) {
    auto index = server_->RepositoryIndex(false);
    std::vector<std::string> names;
    for (const auto& e : index) {
      if (std::find(names.begin(), names.end(), e.name) == names.end()) names.push_back(e.name);
    }
    if (names.size() != 1) {
      return reply([n = names.size()] {
        return ErrorResponse(400, StrCat("the repository holds ", n,
                                         " models: set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to "
                                         "the one /invocations serves"));
      });
    }
    model = names[0];
  }
  Invoke(request, std::move(owner), model, std::move(reply), /*track=*/false);
}

void SageMakerService::Invoke(const HttpRequest& request, std::shared_ptr<const void> owner,
                              const std::string& model, Reply reply, bool track) {
  std::optional<size_t> header_length;
  if (auto ct = request.Header("Content-Type")) {
    auto parsed = ParseSageMakerContentType(*ct, request.body.size());
    if (!parsed.ok()) {
      return reply([st = parsed.status()] { return ErrorResponse(st); });
    }
    header_length = *parsed;
  }
  if (track) {
    inferd::MutexLock lock(&mu_);
    auto it = models_.find(model);
    if (it != models_.end()) {
      ++it->second.in_flight;
      it->second.last_used_ns = core::NowNs();
    }
  }
  auto wrapped = [this, reply, track, model](std::function<HttpResponse()> make) {
    if (track) {
      inferd::MutexLock lock(&mu_);
      auto it = models_.find(model);
      if (it != models_.end()) --it->second.in_flight;
    }
    reply([make = std::move(make)] { return ToSageMaker(make()); });
  };
  kserve_->InferWithHeaderLength(request, std::move(owner), model, -1, header_length,
                                 std::move(wrapped));
}

void SageMakerService::LoadModel(const HttpRequest& request, Reply reply) {
  auto now = [&reply](HttpResponse r) {
    auto shared = std::make_shared<HttpResponse>(std::move(r));
    reply([shared] { return std::move(*shared); });
  };
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseIterativeFlag>(request.body.data(), request.body.size());
  if (doc.HasParseError() || !doc.IsObject()) {
    return now(ErrorResponse(400, "the load request must be a JSON object {\"model_name\", \"url\"}"));
  }
  auto str = [&doc](const char* key) -> std::optional<std::string> {
    auto it = doc.FindMember(key);
    if (it == doc.MemberEnd() || !it->value.IsString()) return std::nullopt;
    return std::string(it->value.GetString(), it->value.GetStringLength());
  };
  auto name = str("model_name");
  auto url = str("url");
  if (!name || name->empty()) return now(ErrorResponse(400, "'model_name' (a string) is required"));
  if (!url || url->empty()) return now(ErrorResponse(400, "'url' (a string) is required"));
  if (auto st = server::Server::ValidateModelName(*name); !st.ok()) return now(ErrorResponse(st));
  const bool s3 = url->rfind("s3://", 0) == 0;
  std::string abs = *url;
  if (s3) {
    if (auto loc = repository::ParseS3Url(*url); !loc.ok()) return now(ErrorResponse(loc.status()));
  } else {
    abs = fs::absolute(fs::path(*url).lexically_normal()).string();
    for (std::string_view bad : {"/dev/", "/proc/", "/sys/"}) {
      if (abs.rfind(bad, 0) == 0) {
        return now(ErrorResponse(400, StrCat("'url' may not point into ", bad, ": ", *url)));
      }
    }
  }
  {
    inferd::MutexLock lock(&mu_);
    if (models_.count(*name) || pending_.count(*name)) {
      return now(ErrorResponse(409, StrCat("model '", *name, "' is already loaded")));
    }
    pending_[*name] = true;
  }
  auto shared_reply = std::make_shared<Reply>(std::move(reply));
  const bool queued = loader_.Submit([this, name = *name, url = abs, shared_reply] {
    absl::Status st = LoadNow(name, url);
    {
      inferd::MutexLock lock(&mu_);
      pending_.erase(name);
    }
    (*shared_reply)([st] {
      if (st.ok()) return Empty(200);
      const std::string message(st.message());
      if (st.code() == absl::StatusCode::kResourceExhausted) return ErrorResponse(507, message);
      if (st.code() == absl::StatusCode::kAlreadyExists) return ErrorResponse(409, message);
      if (LooksLikeOutOfMemory(message)) return ErrorResponse(507, message);
      return ErrorResponse(400, message);
    });
  });
  if (!queued) {
    inferd::MutexLock lock(&mu_);
    pending_.erase(*name);
    (*shared_reply)([] { return ErrorResponse(503, "too many model loads queued; retry later"); });
  }
}

absl::Status SageMakerService::LoadNow(const std::string& name, const std::string& url) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  std::string local = url;
  if (url.rfind("s3://", 0) == 0) {
    // Downloaded once per ETag into the cache; the archive is then extracted as a local one.
    auto location = repository::ParseS3Url(url);
    if (!location.ok()) return location.status();
    const auto fetch_start = std::chrono::steady_clock::now();
    bool hit = false;
    auto fetched = repository::FetchS3Object(repository::S3ConfigFromEnvironment(), *location,
                                          options_.model_cache_dir, &hit);
    if (!fetched.ok()) {
      if (fetched.status().code() == absl::StatusCode::kNotFound ||
          fetched.status().code() == absl::StatusCode::kPermissionDenied) {
        return absl::InvalidArgumentError(fetched.status().message());
      }
      return fetched.status();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - fetch_start).count();
    {
      inferd::MutexLock lock(&mu_);
      hit ? ++download_cache_hits_ : ++downloads_;
      download_seconds_ += seconds;
    }
    LOG_INFO << "sagemaker: " << (hit ? "found " : "downloaded ") << url << " "
             << (hit ? "in the cache" : "in ") << (hit ? "" : StrCat(seconds, " s"));
    local = *fetched;
  }
  if (!fs::exists(local, ec)) {
    return absl::InvalidArgumentError(StrCat("'url' ", url, " does not exist"));
  }
  std::string extracted;
  fs::path root = local;
  if (fs::is_regular_file(local, ec)) {
    if (!IsArchive(local)) {
      return absl::InvalidArgumentError(
          StrCat("'url' ", url, " is a file but not a .tar.gz, .tgz or .tar archive"));
    }
    {
      inferd::MutexLock lock(&mu_);
      extracted = StrCat(options_.model_cache_dir, "/", name, "-", ++extract_counter_);
    }
    fs::remove_all(extracted, ec);
    if (auto st = repository::ExtractArchive(local, extracted, options_.extract_limits); !st.ok()) {
      fs::remove_all(extracted, ec);
      return st;
    }
    root = extracted;
  }
  auto cleanup = [&] {
    if (!extracted.empty()) fs::remove_all(extracted, ec);
  };
  auto model_dir = ChooseModelFolder(root);
  if (!model_dir.ok()) {
    cleanup();
    return model_dir.status();
  }
  const int64_t on_disk = FolderBytes(*model_dir);
  // Before loading, the size on disk (or the average measured footprint, if larger) is the
  // estimate; after loading, the measured footprint is checked again.
  int64_t estimate = on_disk;
  {
    inferd::MutexLock lock(&mu_);
    if (!models_.empty()) {
      int64_t sum = 0;
      for (const auto& [n, e] : models_) sum += e.footprint;
      estimate = std::max<int64_t>(estimate, sum / static_cast<int64_t>(models_.size()));
    }
  }
  if (auto st = MakeRoom(name, estimate); !st.ok()) {
    cleanup();
    return st;
  }
  const int64_t rss_before = RssBytes();
  absl::Status st = server_->LoadModelFromDirectory(name, model_dir->string());
  if (!st.ok()) {
    // Leave nothing behind: the failed model is not part of the multi-model set.
    (void)server_->UnloadModelNow(name);
    cleanup();
    return st;
  }
  const int64_t footprint =
      options_.footprint_from_disk ? on_disk : std::max(RssBytes() - rss_before, on_disk);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    inferd::MutexLock lock(&mu_);
    Entry& e = models_[name];
    e.url = url;
    e.extracted = extracted;
    e.footprint = footprint;
    e.last_used_ns = core::NowNs();
    ++loads_;
    load_seconds_ += seconds;
  }
  LOG_INFO << "sagemaker: loaded model '" << name << "' from " << url << " in " << seconds
           << " s, footprint " << footprint << " bytes";
  // The measured footprint may exceed the estimate: make room for the difference now, or
  // give the model back.
  if (auto st = MakeRoom(name, 0); !st.ok()) {
    Entry entry;
    {
      inferd::MutexLock lock(&mu_);
      entry = models_[name];
      models_.erase(name);
    }
    (void)server_->UnloadModelNow(name);
    cleanup();
    return st;
  }
  return absl::OkStatus();
}

// Unloads idle models, least recently used first, until `needed` more bytes fit the budget.
absl::Status SageMakerService::MakeRoom(const std::string& name, int64_t needed) {
  if (options_.memory_budget_bytes <= 0) return absl::OkStatus();
  for (;;) {
    std::string victim;
    int64_t used = 0, busy = 0;
    {
      inferd::MutexLock lock(&mu_);
      uint64_t oldest = UINT64_MAX;
      for (const auto& [n, e] : models_) {
        used += e.footprint;
        if (n == name) continue;  // the model being made room for
        if (e.in_flight > 0) {
          busy += e.footprint;
        } else if (e.last_used_ns < oldest) {
          oldest = e.last_used_ns;
          victim = n;
        }
      }
    }
    if (used + needed <= options_.memory_budget_bytes) return absl::OkStatus();
    if (victim.empty()) {
      return absl::ResourceExhaustedError(StrCat(
          "model '", name, "' needs about ", needed > 0 ? needed : used - busy,
          " bytes but the memory budget is ", options_.memory_budget_bytes, " bytes, of which ",
          busy, " are held by models with requests in flight"));
    }
    Entry entry;
    {
      inferd::MutexLock lock(&mu_);
      auto it = models_.find(victim);
      if (it == models_.end() || it->second.in_flight > 0) continue;  // changed meanwhile
      entry = it->second;
      models_.erase(it);  // new invokes now get 404 while it drains
      ++evictions_;
    }
    const auto start = std::chrono::steady_clock::now();
    (void)server_->UnloadModelNow(victim);
    std::error_code ec;
    if (!entry.extracted.empty()) fs::remove_all(entry.extracted, ec);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      inferd::MutexLock lock(&mu_);
      ++unloads_;
      unload_seconds_ += seconds;
    }
    LOG_INFO << "sagemaker: evicted idle model '" << victim << "' (" << entry.footprint
             << " bytes) in " << seconds << " s to make room for '" << name << "'";
  }
}

void SageMakerService::UnloadModel(const std::string& name, Reply reply) {
  Entry entry;
  {
    inferd::MutexLock lock(&mu_);
    auto it = models_.find(name);
    if (it == models_.end()) {
      return reply([name] { return ErrorResponse(404, StrCat("model '", name, "' is not loaded")); });
    }
    entry = it->second;
    models_.erase(it);  // new invokes get 404; those in flight finish before the unload does
  }
  auto shared_reply = std::make_shared<Reply>(std::move(reply));
  const bool queued = loader_.Submit([this, name, entry, shared_reply] {
    const auto start = std::chrono::steady_clock::now();
    absl::Status st = server_->UnloadModelNow(name);
    std::error_code ec;
    if (!entry.extracted.empty()) fs::remove_all(entry.extracted, ec);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      inferd::MutexLock lock(&mu_);
      ++unloads_;
      unload_seconds_ += seconds;
    }
    LOG_INFO << "sagemaker: unloaded model '" << name << "' in " << seconds << " s, freed about "
             << entry.footprint << " bytes";
    (*shared_reply)([st] {
      return st.ok() ? Empty(200) : ErrorResponse(400, std::string(st.message()));
    });
  });
  if (!queued) {
    (*shared_reply)([] { return ErrorResponse(503, "too many model unloads queued; retry later"); });
  }
}

HttpResponse SageMakerService::ListModels(const HttpRequest& request) {
  size_t start = 0;
  for (std::string_view q = request.query; !q.empty();) {
    const size_t amp = q.find('&');
    std::string_view kv = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (kv.rfind("next_page_token=", 0) == 0) {
      std::string_view v = kv.substr(16);
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), start);
      if (ec != std::errc() || p != v.data() + v.size()) {
        return ErrorResponse(400, StrCat("invalid next_page_token '", v, "'"));
      }
    }
  }
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  w.Key("models");
  w.StartArray();
  size_t i = 0;
  bool more = false;
  {
    inferd::MutexLock lock(&mu_);
    for (const auto& [name, e] : models_) {
      if (i++ < start) continue;
      if (i > start + kPageSize) {
        more = true;
        break;
      }
      w.StartObject();
      w.Key("modelName");
      w.String(name.data(), name.size());
      w.Key("modelUrl");
      w.String(e.url.data(), e.url.size());
      w.EndObject();
    }
  }
  w.EndArray();
  if (more) {
    w.Key("nextPageToken");
    const std::string token = StrCat(start + kPageSize);
    w.String(token.data(), token.size());
  }
  w.EndObject();
  return JsonBody(buf);
}

HttpResponse SageMakerService::GetModel(const std::string& name) {
  inferd::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return ErrorResponse(404, StrCat("model '", name, "' is not loaded"));
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  w.Key("modelName");
  w.String(name.data(), name.size());
  w.Key("modelUrl");
  w.String(it->second.url.data(), it->second.url.size());
  w.EndObject();
  return JsonBody(buf);
}

void SageMakerService::Collect(metrics::PrometheusWriter& w) const {
  inferd::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& [n, e] : models_) bytes += e.footprint;
  w.Family("inferd_mme_loaded_models", "Models loaded through the SageMaker multi-model API", "gauge");
  w.Sample("inferd_mme_loaded_models", {}, static_cast<double>(models_.size()));
  w.Family("inferd_mme_loaded_bytes", "Measured footprint of the loaded multi-model models", "gauge");
  w.Sample("inferd_mme_loaded_bytes", {}, static_cast<double>(bytes));
  w.Family("inferd_mme_memory_budget_bytes", "--model-memory-budget (0: none)", "gauge");
  w.Sample("inferd_mme_memory_budget_bytes", {}, static_cast<double>(options_.memory_budget_bytes));
  w.Family("inferd_mme_cache_hits_total", "Invokes of a loaded model", "counter");
  w.Sample("inferd_mme_cache_hits_total", {}, static_cast<double>(hits_));
  w.Family("inferd_mme_cache_misses_total", "Invokes of a model that was not loaded (404)", "counter");
  w.Sample("inferd_mme_cache_misses_total", {}, static_cast<double>(misses_));
  w.Family("inferd_mme_evictions_total", "Idle models unloaded to make room under the budget", "counter");
  w.Sample("inferd_mme_evictions_total", {}, static_cast<double>(evictions_));
  w.Family("inferd_mme_loads_total", "Successful multi-model loads", "counter");
  w.Sample("inferd_mme_loads_total", {}, static_cast<double>(loads_));
  w.Family("inferd_mme_load_seconds_total", "Time spent loading (extraction included)", "counter");
  w.Sample("inferd_mme_load_seconds_total", {}, load_seconds_);
  w.Family("inferd_mme_unloads_total", "Multi-model unloads (DELETE and evictions)", "counter");
  w.Sample("inferd_mme_unloads_total", {}, static_cast<double>(unloads_));
  w.Family("inferd_mme_downloads_total", "Model archives downloaded from S3", "counter");
  w.Sample("inferd_mme_downloads_total", {}, static_cast<double>(downloads_));
  w.Family("inferd_mme_download_cache_hits_total", "S3 archives found in the local cache (same ETag)", "counter");
  w.Sample("inferd_mme_download_cache_hits_total", {}, static_cast<double>(download_cache_hits_));
  w.Family("inferd_mme_download_seconds_total", "Time spent downloading from S3", "counter");
  w.Sample("inferd_mme_download_seconds_total", {}, download_seconds_);
  w.Family("inferd_mme_unload_seconds_total", "Time spent unloading, draining included", "counter");
  w.Sample("inferd_mme_unload_seconds_total", {}, unload_seconds_);
}

}  // namespace inferd::sagemaker
