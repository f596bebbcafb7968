#include "frontends/http/kserve_service.h"

#include <charconv>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/logging.h"
#include "common/strings.h"
#include "config/model_config_util.h"
#include "frontends/http/content_encoding.h"
#include "frontends/http/generate.h"
#include "frontends/http/infer_codec.h"
#include "frontends/http/infer_route.h"
#include "frontends/http/shared_memory_routes.h"
#include "frontends/http/trace_logging_routes.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferd::http {
namespace {

// A compressed body may inflate to at most this (the default --http-max-input-size).
constexpr size_t kMaxDecodedBodyBytes = size_t{64} << 20;

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

HttpResponse Json(int status, rapidjson::StringBuffer& buf) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body.assign(buf.GetString(), buf.GetSize());
  return r;
}

HttpResponse Empty(int status) {
  HttpResponse r;
  r.status = status;
  return r;
}

void WriteString(JsonWriter& w, std::string_view s) { w.String(s.data(), s.size()); }

void WriteDuration(JsonWriter& w, const char* key, const metrics::Duration& d) {
  w.Key(key);
  w.StartObject();
  w.Key("count");
  w.Uint64(d.count);
  w.Key("ns");
  w.Uint64(d.ns);
  w.EndObject();
}

void WriteTensorMetadata(JsonWriter& w, const std::vector<server::TensorMetadata>& tensors) {
  w.StartArray();
  for (const auto& t : tensors) {
    w.StartObject();
    w.Key("name");
    WriteString(w, t.name);
    w.Key("datatype");
    WriteString(w, DataTypeName(t.datatype));
    w.Key("shape");
    w.StartArray();
    for (int64_t d : t.shape) w.Int64(d);
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
}

HttpResponse ModelMetadataJson(const server::ModelMetadata& md) {
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  w.Key("name");
  WriteString(w, md.name);
  w.Key("versions");
  w.StartArray();
  for (const auto& v : md.versions) WriteString(w, v);
  w.EndArray();
  w.Key("platform");
  WriteString(w, md.platform);
  w.Key("inputs");
  WriteTensorMetadata(w, md.inputs);
  w.Key("outputs");
  WriteTensorMetadata(w, md.outputs);
  w.EndObject();
  return Json(200, buf);
}

// "/v2/models/a%2Fb/infer" -> {"v2", "models", "a/b", "infer"}; nullopt on a bad escape.
std::optional<std::vector<std::string>> SplitPath(std::string_view path) {
  std::vector<std::string> out;
  out.reserve(8);  // the longest route has 7 segments: one allocation
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view seg = path.substr(pos, slash - pos);
    pos = slash + 1;
    if (seg.empty()) continue;
    auto decoded = PercentDecode(seg);
    if (!decoded) return std::nullopt;
    out.push_back(*std::move(decoded));
  }
  return out;
}

std::optional<int64_t> ParseVersion(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0 || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

HttpHandler KServeHttpService::AsHandler() {
  return [this](const HttpRequest& request, std::shared_ptr<const void> owner,
                std::unique_ptr<Responder> responder) {
    std::shared_ptr<Responder> shared(std::move(responder));
    Handle(request, std::move(owner),
           [shared](std::function<HttpResponse()> make) { shared->Post(std::move(make)); });
  };
}

namespace {

// The restricted-API category of a /v2 route (tritonserver's grouping).
std::optional<ApiCategory> CategoryOf(const std::vector<std::string>& s) {
  if (s.size() == 1) return ApiCategory::kMetadata;
  const std::string& area = s[1];
  if (area == "health") return ApiCategory::kHealth;
  if (area == "repository") return ApiCategory::kModelRepository;
  if (area == "systemsharedmemory" || area == "cudasharedmemory") return ApiCategory::kSharedMemory;
  if (area == "trace") return ApiCategory::kTrace;
  if (area == "logging") return ApiCategory::kLogging;
  if (area != "models") return std::nullopt;
  if (s.size() == 3 && s[2] == "stats") return ApiCategory::kStatistics;
  const std::string& last = s.back();
  if (s.size() == 3 || (s.size() == 5 && s[3] == "versions")) return ApiCategory::kMetadata;
  if (last == "infer" || last == "generate" || last == "generate_stream") {
    return ApiCategory::kInference;
  }
  if (last == "ready") return ApiCategory::kHealth;
  if (last == "config") return ApiCategory::kModelConfig;
  if (last == "stats") return ApiCategory::kStatistics;
  if (last == "setting" && s[s.size() - 2] == "trace") return ApiCategory::kTrace;
  return std::nullopt;
}

}  // namespace

void KServeHttpService::Handle(const HttpRequest& request,
                               std::shared_ptr<const void> body_owner, Reply reply) {
  auto now = [&reply](HttpResponse r) {
    auto shared = std::make_shared<HttpResponse>(std::move(r));
    reply([shared] { return std::move(*shared); });
  };
  LOG_VERBOSE << "HTTP request: " << request.method << " " << request.path;
  try {
    auto segments = SplitPath(request.path);
    if (!segments) return now(ErrorResponse(400, "malformed percent-escape in the URL path"));
    const auto& s = *segments;
    const bool get = request.method == "GET" || request.method == "HEAD";
    const bool post = request.method == "POST";
    auto method_not_allowed = [&] {
      // Every route takes exactly one of GET (or HEAD) and POST.
      HttpResponse r = ErrorResponse(405, inferd::StrCat("method ", request.method,
                                                       " is not allowed on ", request.path,
                                                       "; use ", get ? "POST" : "GET"));
      r.headers.emplace_back("Allow", get ? "POST" : "GET, HEAD");
      return now(std::move(r));
    };
    if (s.empty() || s[0] != "v2") {
      return now(ErrorResponse(404, inferd::StrCat("no route for ", request.path)));
    }
    if (!restrictions_.empty()) {
      if (auto category = CategoryOf(s)) {
        if (const auto& rule = restrictions_.Find(*category)) {
          auto got = request.Header(rule->key);
          if (!got || *got != rule->value) {
            return now(ErrorResponse(403, ApiRestrictions::RefusalMessage(*rule)));
          }
        }
      }
    }
    if (s.size() == 1) {
      if (!get) return method_not_allowed();
      rapidjson::StringBuffer buf;
      JsonWriter w(buf);
      w.StartObject();
      w.Key("name");
      WriteString(w, server_->id());
      w.Key("version");
      WriteString(w, server::Server::kVersion);
      w.Key("extensions");
      w.StartArray();
      for (const auto& e : server_->Extensions()) WriteString(w, e);
      w.EndArray();
      w.EndObject();
      return now(Json(200, buf));
    }
    if (s[1] == "health" && s.size() == 3) {
      if (!get) return method_not_allowed();
      if (s[2] == "live") return now(Empty(server_->IsLive() ? 200 : 400));
      if (s[2] == "ready") return now(Empty(server_->IsReady() ? 200 : 400));
    }
    if (auto shm = HandleSharedMemoryRoute(server_->shared_memory(), request, s)) {
      return now(*std::move(shm));
    }
    if (auto r = HandleTraceLoggingRoute(server_, request, s)) return now(*std::move(r));
    if (s[1] == "repository") {
      if (s.size() == 3 && s[2] == "index") {
        if (!post) return method_not_allowed();
        return now(RepositoryIndex(request));
      }
      if (s.size() == 5 && s[2] == "models" && (s[4] == "load" || s[4] == "unload")) {
        if (!post) return method_not_allowed();
        return RepositoryLoad(request, s[3], s[4] == "load", std::move(reply));
      }
    }
    if (s[1] == "models" && s.size() >= 3) {
      if (s.size() == 3 && s[2] == "stats") {
        if (!get) return method_not_allowed();
        return now(ModelStats("", -1));
      }
      const std::string& model = s[2];
      size_t next = 3;
      int64_t version = -1;
      if (s.size() >= 5 && s[3] == "versions") {
        auto v = ParseVersion(s[4]);
        if (!v) {
          return now(ErrorResponse(400, inferd::StrCat("invalid model version '", s[4],
                                                     "': versions are non-negative integers")));
        }
        version = *v;
        next = 5;
      }
      if (s.size() == next) {
        if (!get) return method_not_allowed();
        // The server resolves the model: an on-demand one loads first (readiness never does).
        server_->GetModelMetadata(model, version, {},
                                  [reply](absl::StatusOr<server::ModelMetadata> md) {
                                    auto r = std::make_shared<HttpResponse>(
                                        md.ok() ? ModelMetadataJson(*md) : ErrorResponse(md.status()));
                                    reply([r] { return std::move(*r); });
                                  });
        return;
      }
      if (s.size() == next + 1) {
        const std::string& action = s[next];
        if (action == "infer") {
          if (!post) return method_not_allowed();
          return HandleInfer(request, std::move(body_owner), model, version, std::move(reply));
        }
        if (action == "generate" || action == "generate_stream") {
          if (!post) return method_not_allowed();
          return HandleGenerate(server_, request, std::move(body_owner), model, version,
                                action == "generate_stream", std::move(reply));
        }
        if (action == "ready") {
          if (!get) return method_not_allowed();
          return now(Empty(server_->IsModelReady(model, version) ? 200 : 400));
        }
        if (action == "config") {
          if (!get) return method_not_allowed();
          server_->GetModelConfig(
              model, version, {}, [reply](absl::StatusOr<const config::ModelConfig*> cfg) {
                HttpResponse r;
                if (cfg.ok()) {
                  r.content_type = "application/json";
                  r.body = config::ModelConfigToJson(**cfg);
                } else {
                  r = ErrorResponse(cfg.status());
                }
                auto shared = std::make_shared<HttpResponse>(std::move(r));
                reply([shared] { return std::move(*shared); });
              });
          return;
        }
        if (action == "stats") {
          if (!get) return method_not_allowed();
          return now(ModelStats(model, version));
        }
      }
    }
    return now(ErrorResponse(404, inferd::StrCat("no route for ", request.path)));
  } catch (const std::exception& e) {
    return now(ErrorResponse(500, inferd::StrCat("internal error: ", e.what())));
  }
}

void KServeHttpService::HandleInfer(const HttpRequest& request,
                                    std::shared_ptr<const void> body_owner,
                                    const std::string& model, int64_t version, Reply reply) {
  auto fail = [&reply](HttpResponse r) {
    auto shared = std::make_shared<HttpResponse>(std::move(r));
    reply([shared] { return std::move(*shared); });
  };
  std::optional<size_t> header_length;
  if (auto h = request.Header("Inference-Header-Content-Length")) {
    size_t n = 0;
    auto [p, ec] = std::from_chars(h->data(), h->data() + h->size(), n);
    if (ec != std::errc() || p != h->data() + h->size() || h->empty()) {
      return fail(ErrorResponse(400, inferd::StrCat("invalid Inference-Header-Content-Length '", *h, "'")));
    }
    header_length = n;
  }
  if (auto coding = request.Header("Accept-Encoding")) {
    // Triton compresses the infer response with the client's preferred coding, a successful one
    // only (InferRequestClass::FinalizeResponse): its error answers are plain JSON, and
    // tritonclient reads an error body without inflating it (http/_utils.py and http/aio
    // _get_error json-decode the raw bytes; aiohttp asks for gzip on every request), so a
    // compressed error reached the user as "an exception occurred in the client while decoding
    // the response".
    const ContentCoding chosen = ChooseResponseCoding(*coding);
    if (chosen != ContentCoding::kIdentity) {
      reply = [inner = std::move(reply), chosen](std::function<HttpResponse()> make) {
        inner([make = std::move(make), chosen] {
          HttpResponse r = make();
          if (r.status == 200) CompressResponse(chosen, &r);
          return r;
        });
      };
    }
  }
  if (auto coding = request.Header("Content-Encoding")) {
    // Inflated once the body is complete; the views the request makes point into `decoded`.
    auto decoded = DecodeBody(*coding, request.body, kMaxDecodedBodyBytes);
    if (!decoded.ok()) {
      return fail(absl::IsOutOfRange(decoded.status())
                      ? ErrorResponse(413, std::string(decoded.status().message()))
                      : ErrorResponse(decoded.status()));
    }
    auto body = std::make_shared<std::string>(*std::move(decoded));
    HttpRequest inflated = request;
    inflated.body = *body;
    auto owner = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<std::string>>>(
        std::move(body_owner), body);
    return InferFromBody(server_, inflated, std::move(owner), model, version, header_length, {},
                         std::move(reply));
  }
  InferFromBody(server_, request, std::move(body_owner), model, version, header_length, {},
                std::move(reply));
}


HttpResponse KServeHttpService::ModelStats(const std::string& model, int64_t version) {
  auto stats = server_->GetStatistics(model, version);
  if (!stats.ok()) return ErrorResponse(stats.status());
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  w.Key("model_stats");
  w.StartArray();
  for (const auto& m : *stats) {
    const auto& s = m.stats;
    w.StartObject();
    w.Key("name");
    WriteString(w, m.name);
    w.Key("version");
    WriteString(w, m.version);
    w.Key("last_inference");
    w.Uint64(s.last_inference_ms);
    w.Key("inference_count");
    w.Uint64(s.inference_count);
    w.Key("execution_count");
    w.Uint64(s.execution_count);
    w.Key("inference_stats");
    w.StartObject();
    WriteDuration(w, "success", s.success);
    WriteDuration(w, "fail", s.fail);
    WriteDuration(w, "queue", s.queue);
    WriteDuration(w, "compute_input", s.compute_input);
    WriteDuration(w, "compute_infer", s.compute_infer);
    WriteDuration(w, "compute_output", s.compute_output);
    WriteDuration(w, "cache_hit", s.cache_hit);
    WriteDuration(w, "cache_miss", s.cache_miss);
    w.EndObject();
    // Triton writes this key for every model: per response index, the statistics a backend
    // reports with TRITONBACKEND_ModelInstanceReportResponseStatistics. Its ONNX Runtime and
    // PyTorch backends report none, so Triton's object is empty for them; inferd's backends
    // report none either. The key is there so code reading it (Triton's own response
    // statistics tests, dashboards) finds Triton's shape.
    w.Key("response_stats");
    w.StartObject();
    w.EndObject();
    w.Key("batch_stats");
    w.StartArray();
    for (const auto& [size, b] : s.batch_stats) {
      w.StartObject();
      w.Key("batch_size");
      w.Uint64(size);
      WriteDuration(w, "compute_input", b.compute_input);
      WriteDuration(w, "compute_infer", b.compute_infer);
      WriteDuration(w, "compute_output", b.compute_output);
      w.EndObject();
    }
    w.EndArray();
    w.Key("memory_usage");
    w.StartArray();
    if (m.memory_bytes > 0) {
      w.StartObject();
      w.Key("type");
      w.String("CPU");
      w.Key("id");
      w.Int64(0);
      w.Key("byte_size");
      w.Uint64(static_cast<uint64_t>(m.memory_bytes));
      w.EndObject();
    }
    // Triton's entry per GPU the version holds memory on: {"type":"GPU","id":<gpu>,...}.
    for (const auto& [gpu, bytes] : m.gpu_memory_bytes) {
      w.StartObject();
      w.Key("type");
      w.String("GPU");
      w.Key("id");
      w.Int64(gpu);
      w.Key("byte_size");
      w.Uint64(static_cast<uint64_t>(bytes));
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return Json(200, buf);
}

HttpResponse KServeHttpService::RepositoryIndex(const HttpRequest& request) {
  bool ready_only = false;
  if (!request.body.empty()) {
    rapidjson::Document doc;
    doc.Parse<rapidjson::kParseIterativeFlag>(request.body.data(), request.body.size());
    if (doc.HasParseError() || !doc.IsObject()) {
      return ErrorResponse(400, "malformed JSON in the repository index request");
    }
    if (auto it = doc.FindMember("ready"); it != doc.MemberEnd()) {
      if (!it->value.IsBool()) return ErrorResponse(400, "'ready' must be a boolean");
      ready_only = it->value.GetBool();
    }
  }
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartArray();
  for (const auto& e : server_->RepositoryIndex(ready_only)) {
    w.StartObject();
    w.Key("name");
    WriteString(w, e.name);
    if (!e.version.empty()) {
      w.Key("version");
      WriteString(w, e.version);
    }
    if (!e.state.empty()) {
      w.Key("state");
      WriteString(w, e.state);
    }
    if (!e.reason.empty()) {
      w.Key("reason");
      WriteString(w, e.reason);
    }
    w.EndObject();
  }
  w.EndArray();
  return Json(200, buf);
}

void KServeHttpService::RepositoryLoad(const HttpRequest& request, const std::string& model,
                                       bool load, Reply reply) {
  auto now = [&reply](HttpResponse r) {
    auto shared = std::make_shared<HttpResponse>(std::move(r));
    reply([shared] { return std::move(*shared); });
  };
  std::optional<std::string> config_json;
  std::map<std::string, std::string> files;  // "file:<path>" parameters, decoded
  bool unload_dependents = false;
  if (!request.body.empty()) {
    rapidjson::Document doc;
    doc.Parse<rapidjson::kParseIterativeFlag>(request.body.data(), request.body.size());
    if (doc.HasParseError() || !doc.IsObject()) {
      return now(ErrorResponse(400, "malformed JSON in the repository request body"));
    }
    if (auto p = doc.FindMember("parameters"); p != doc.MemberEnd()) {
      if (!p->value.IsObject()) return now(ErrorResponse(400, "'parameters' must be an object"));
      for (auto it = p->value.MemberBegin(); it != p->value.MemberEnd(); ++it) {
        std::string_view key(it->name.GetString(), it->name.GetStringLength());
        if (key == "config" && load) {
          if (!it->value.IsString()) {
            return now(ErrorResponse(400, "parameter 'config' must be a string holding the model configuration as JSON"));
          }
          config_json.emplace(it->value.GetString(), it->value.GetStringLength());
        } else if (key.substr(0, 5) == "file:" && load) {
          // Triton's model file override: the file's content, base64-encoded.
          if (!it->value.IsString()) {
            return now(ErrorResponse(400, inferd::StrCat("parameter '", key, "' must be a string holding the file's content in base64")));
          }
          std::string content;
          if (!absl::Base64Unescape(absl::string_view(it->value.GetString(), it->value.GetStringLength()), &content)) {
            return now(ErrorResponse(400, inferd::StrCat("parameter '", key, "' is not valid base64")));
          }
          files[std::string(key.substr(5))] = std::move(content);
        } else if (key == "unload_dependents" && !load) {
          if (!it->value.IsBool()) {
            return now(ErrorResponse(400, "parameter 'unload_dependents' must be a boolean"));
          }
          unload_dependents = it->value.GetBool();
        }
      }
    }
  }
  auto done = [reply](absl::Status status) {
    reply([status]() -> HttpResponse {
      if (!status.ok()) return ErrorResponse(status);
      return Empty(200);
    });
  };
  if (load) {
    server_->LoadModel(model, std::move(config_json), std::move(done), std::move(files));
  } else {
    server_->UnloadModel(model, std::move(done), unload_dependents);
  }
}

}  // namespace inferd::http
