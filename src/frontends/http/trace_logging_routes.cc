#include "frontends/http/trace_logging_routes.h"

#include "common/strings.h"
#include "frontends/http/infer_codec.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"
#include "server/log_settings.h"

namespace inferd::http {
namespace {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

HttpResponse JsonBody(rapidjson::StringBuffer& buf) {
  HttpResponse r;
  r.status = 200;
  r.content_type = "application/json";
  r.body.assign(buf.GetString(), buf.GetSize());
  return r;
}

HttpResponse MethodNotAllowed(const HttpRequest& request) {
  HttpResponse r = ErrorResponse(405, StrCat("method ", request.method, " is not allowed on ",
                                             request.path, "; use GET or POST"));
  r.headers.emplace_back("Allow", "GET, HEAD, POST");
  return r;
}

// The body of a settings POST: a JSON object (an empty body is an empty object, as in
// tritonserver).
std::optional<HttpResponse> ParseObject(const HttpRequest& request, const char* what,
                                        rapidjson::Document* doc) {
  if (request.body.empty()) {
    doc->SetObject();
    return std::nullopt;
  }
  doc->Parse<rapidjson::kParseIterativeFlag>(request.body.data(), request.body.size());
  if (doc->HasParseError() || !doc->IsObject()) {
    return ErrorResponse(400, StrCat("the ", what, " request must be a JSON object"));
  }
  return std::nullopt;
}

HttpResponse Trace(server::Server* server, const HttpRequest& request, const std::string& model) {
  if (!model.empty() && !server->IsModelReady(model, -1)) {
    return ErrorResponse(400, StrCat("Request for unknown model : ", model));
  }
  if (request.method == "POST") {
    rapidjson::Document doc;
    if (auto err = ParseObject(request, "trace setting", &doc)) return *err;
    std::map<std::string, server::TraceSettingValue> settings;
    for (auto it = doc.MemberBegin(); it != doc.MemberEnd(); ++it) {
      const std::string key(it->name.GetString(), it->name.GetStringLength());
      server::TraceSettingValue v;
      const auto& j = it->value;
      if (j.IsNull()) {
        v.null = true;
      } else if (j.IsString()) {
        v.values.emplace_back(j.GetString(), j.GetStringLength());
      } else if (j.IsInt64()) {
        v.values.push_back(StrCat(j.GetInt64()));
      } else if (j.IsArray()) {
        for (const auto& e : j.GetArray()) {
          if (!e.IsString()) return ErrorResponse(400, StrCat("'", key, "' must hold strings"));
          v.values.emplace_back(e.GetString(), e.GetStringLength());
        }
      } else {
        return ErrorResponse(400, StrCat("'", key, "' must be a string, an array of strings or null"));
      }
      settings.emplace(key, std::move(v));
    }
    absl::Status st = server->trace().Update(model, settings);
    if (!st.ok()) return ErrorResponse(st);
  }
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  for (const auto& [key, values] : server->trace().Describe(model)) {
    w.Key(key.c_str());
    if (key == "trace_level") {
      w.StartArray();
      for (const auto& v : values) w.String(v.c_str(), v.size());
      w.EndArray();
    } else {
      w.String(values[0].c_str(), values[0].size());
    }
  }
  w.EndObject();
  return JsonBody(buf);
}

HttpResponse Logging(const HttpRequest& request) {
  if (request.method == "POST") {
    rapidjson::Document doc;
    if (auto err = ParseObject(request, "log setting", &doc)) return *err;
    std::map<std::string, server::LogSettingValue> settings;
    for (auto it = doc.MemberBegin(); it != doc.MemberEnd(); ++it) {
      server::LogSettingValue v;
      const auto& j = it->value;
      if (j.IsNull()) {
        v.kind = server::LogSettingValue::kNull;
      } else if (j.IsBool()) {
        v.kind = server::LogSettingValue::kBool;
        v.b = j.GetBool();
      } else if (j.IsUint64()) {
        v.kind = server::LogSettingValue::kUint;
        v.u = j.GetUint64();
      } else if (j.IsString()) {
        v.kind = server::LogSettingValue::kString;
        v.s.assign(j.GetString(), j.GetStringLength());
      } else {
        v.kind = server::LogSettingValue::kOther;
      }
      settings.emplace(std::string(it->name.GetString(), it->name.GetStringLength()), std::move(v));
    }
    absl::Status st = server::UpdateLogSettings(settings);
    if (!st.ok()) return ErrorResponse(st);
  }
  const server::LogSettingsView v = server::CurrentLogSettings();
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  w.Key("log_file");
  w.String(v.log_file.c_str(), v.log_file.size());
  w.Key("log_info");
  w.Bool(v.log_info);
  w.Key("log_warning");
  w.Bool(v.log_warning);
  w.Key("log_error");
  w.Bool(v.log_error);
  w.Key("log_verbose_level");
  w.Uint(v.log_verbose_level);
  w.Key("log_format");
  w.String(v.log_format.c_str(), v.log_format.size());
  w.EndObject();
  return JsonBody(buf);
}

}  // namespace

std::optional<HttpResponse> HandleTraceLoggingRoute(server::Server* server,
                                                    const HttpRequest& request,
                                                    const std::vector<std::string>& s) {
  const bool get_or_post =
      request.method == "GET" || request.method == "HEAD" || request.method == "POST";
  if (s.size() == 2 && s[1] == "logging") {
    return get_or_post ? Logging(request) : MethodNotAllowed(request);
  }
  if (s.size() == 3 && s[1] == "trace" && s[2] == "setting") {
    return get_or_post ? Trace(server, request, "") : MethodNotAllowed(request);
  }
  // /v2/models/<m>[/versions/<v>]/trace/setting (the version is accepted and ignored, as in
  // tritonserver: trace settings are per model).
  if (s.size() >= 5 && s[1] == "models" && s[s.size() - 2] == "trace" && s.back() == "setting" &&
      (s.size() == 5 || (s.size() == 7 && s[3] == "versions"))) {
    return get_or_post ? Trace(server, request, s[2]) : MethodNotAllowed(request);
  }
  return std::nullopt;
}

}  // namespace inferd::http
