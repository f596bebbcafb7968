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
#include "frontends/http/infer_route.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

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

// A multi-model error names the platform's model name; where the request carried
// X-Amzn-SageMaker-Target-Model (the archive the platform resolved it to), the error names that
// too, so the user can tell which of their archives failed.
HttpResponse NameTargetModel(HttpResponse r, const std::string& target) {
  if (r.status < 400 || target.empty()) return r;
  rapidjson::Document doc;
  doc.Parse(r.body.data(), r.body.size());
  if (doc.HasParseError() || !doc.IsObject()) return r;
  auto it = doc.FindMember("error");
  if (it == doc.MemberEnd() || !it->value.IsString()) return r;
  const std::string message = StrCat(std::string_view(it->value.GetString(), it->value.GetStringLength()),
                                     " (X-Amzn-SageMaker-Target-Model: '", target, "')");
  HttpResponse named = ErrorResponse(r.status, message);
  named.headers = std::move(r.headers);
  return named;
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
                                   SageMakerOptions options)
    : server_(server), kserve_(kserve), options_(std::move(options)) {}

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
  // The multi-model routes load, unload and list models: --http-restricted-api's
  // model-repository category, as the KServe port's /v2/repository routes. (Invocations are
  // not restricted: SageMaker's runtime forwards no custom header with them.)
  const bool repository_route =
      path == "/models" || path == "/models/" ||
      (path.rfind("/models/", 0) == 0 && path.find('/', 8) == std::string_view::npos);
  if (repository_route) {
    if (const auto& rule = kserve_->restrictions().Find(ApiCategory::kModelRepository)) {
      auto got = request.Header(rule->key);
      if (!got || *got != rule->value) {
        return now(ErrorResponse(403, ApiRestrictions::RefusalMessage(*rule)));
      }
    }
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
      std::string target;
      if (auto t = request.Header("X-Amzn-SageMaker-Target-Model")) target = std::string(*t);
      if (!target.empty()) {
        reply = [inner = std::move(reply), target](std::function<HttpResponse()> make) {
          inner([make = std::move(make), target] { return NameTargetModel(make(), target); });
        };
      }
      // The server resolves the model: loaded, remembered after an eviction, or (on-demand)
      // the TargetModel archive of the repository, loaded if it must be; otherwise 404.
      server::ResolveOptions resolve;
      resolve.source_name = target;
      resolve.multi_model = true;
      return Invoke(request, std::move(owner), name, resolve, std::move(reply));
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
  Invoke(request, std::move(owner), model, {}, std::move(reply));
}

void SageMakerService::Invoke(const HttpRequest& request, std::shared_ptr<const void> owner,
                              const std::string& model, const server::ResolveOptions& resolve,
                              Reply reply) {
  std::optional<size_t> header_length;
  if (auto ct = request.Header("Content-Type")) {
    auto parsed = ParseSageMakerContentType(*ct, request.body.size());
    if (!parsed.ok()) {
      return reply([st = parsed.status()] { return ErrorResponse(st); });
    }
    header_length = *parsed;
  }
  auto wrapped = [reply](std::function<HttpResponse()> make) {
    reply([make = std::move(make)] { return ToSageMaker(make()); });
  };
  http::InferFromBody(server_, request, std::move(owner), model, -1, header_length, resolve,
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
  if (!s3) {
    abs = fs::absolute(fs::path(*url).lexically_normal()).string();
    for (std::string_view bad : {"/dev/", "/proc/", "/sys/"}) {
      if (abs.rfind(bad, 0) == 0) {
        return now(ErrorResponse(400, StrCat("'url' may not point into ", bad, ": ", *url)));
      }
    }
  }
  {
    inferd::MutexLock lock(&mu_);
    if (pending_.count(*name) || server_->UrlModels().count(*name) ||
        server_->IsModelReady(*name, -1)) {
      return now(ErrorResponse(409, StrCat("model '", *name, "' is already loaded")));
    }
    pending_.insert(*name);
  }
  auto shared_reply = std::make_shared<Reply>(std::move(reply));
  const bool queued = server_->SubmitLoad([this, name = *name, url = abs, shared_reply] {
    absl::Status st = server_->LoadModelFromUrl(name, url);
    {
      inferd::MutexLock lock(&mu_);
      pending_.erase(name);
    }
    (*shared_reply)([st] {
      if (st.ok()) return Empty(200);
      const std::string message(st.message());
      if (LooksLikeOutOfMemory(message)) return ErrorResponse(507, message);
      if (st.code() == absl::StatusCode::kUnavailable) return ErrorResponse(503, message);
      if (st.code() == absl::StatusCode::kInternal || st.code() == absl::StatusCode::kDataLoss) {
        return ErrorResponse(500, message);
      }
      if (st.code() == absl::StatusCode::kResourceExhausted ||
          st.code() == absl::StatusCode::kAlreadyExists) {
        return ErrorResponse(st);
      }
      return ErrorResponse(400, message);
    });
  });
  if (!queued) {
    inferd::MutexLock lock(&mu_);
    pending_.erase(*name);
    (*shared_reply)([] { return ErrorResponse(503, "too many model loads queued; retry later"); });
  }
}

void SageMakerService::UnloadModel(const std::string& name, Reply reply) {
  if (!server_->UrlModels().count(name)) {
    return reply([name] { return ErrorResponse(404, StrCat("model '", name, "' is not loaded")); });
  }
  auto shared_reply = std::make_shared<Reply>(std::move(reply));
  const bool queued = server_->SubmitLoad([this, name, shared_reply] {
    absl::Status st = server_->ForgetModel(name);
    (*shared_reply)([st] { return st.ok() ? Empty(200) : ErrorResponse(st); });
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
  for (const auto& [name, url] : server_->UrlModels()) {
    if (i++ < start) continue;
    if (i > start + kPageSize) {
      more = true;
      break;
    }
    w.StartObject();
    w.Key("modelName");
    w.String(name.data(), name.size());
    w.Key("modelUrl");
    w.String(url.data(), url.size());
    w.EndObject();
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
  const auto models = server_->UrlModels();
  auto it = models.find(name);
  if (it == models.end()) return ErrorResponse(404, StrCat("model '", name, "' is not loaded"));
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  w.Key("modelName");
  w.String(name.data(), name.size());
  w.Key("modelUrl");
  w.String(it->second.data(), it->second.size());
  w.EndObject();
  return JsonBody(buf);
}

}  // namespace inferd::sagemaker
