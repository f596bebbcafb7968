#include "frontends/http/shared_memory_routes.h"

#include "common/strings.h"
#include "frontends/http/infer_codec.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferd::http {
namespace {

HttpResponse Ok() {
  HttpResponse r;
  r.status = 200;
  return r;
}

HttpResponse MethodNotAllowed(const HttpRequest& request, bool wants_get) {
  HttpResponse r = ErrorResponse(405, inferd::StrCat("method ", request.method, " is not allowed on ",
                                                   request.path, "; use ", wants_get ? "GET" : "POST"));
  r.headers.emplace_back("Allow", wants_get ? "GET, HEAD" : "POST");
  return r;
}

HttpResponse Register(server::SharedMemoryManager& shm, const std::string& name,
                      const HttpRequest& request) {
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseIterativeFlag>(request.body.data(), request.body.size());
  if (doc.HasParseError() || !doc.IsObject()) {
    return ErrorResponse(400, "the shared memory register request must be a JSON object "
                              "{\"key\": ..., \"offset\": ..., \"byte_size\": ...}");
  }
  auto key = doc.FindMember("key");
  if (key == doc.MemberEnd()) return ErrorResponse(400, "Shared memory register request has no 'key' field");
  if (!key->value.IsString()) return ErrorResponse(400, "'key' must be a string");
  uint64_t offset = 0;
  if (auto it = doc.FindMember("offset"); it != doc.MemberEnd()) {
    if (!it->value.IsUint64()) return ErrorResponse(400, "'offset' must be a non-negative integer");
    offset = it->value.GetUint64();
  }
  auto size = doc.FindMember("byte_size");
  if (size == doc.MemberEnd()) {
    return ErrorResponse(400, "Shared memory register request has no 'byte_size' field");
  }
  if (!size->value.IsUint64()) return ErrorResponse(400, "'byte_size' must be a non-negative integer");
  absl::Status st = shm.Register(
      name, std::string(key->value.GetString(), key->value.GetStringLength()), offset,
      size->value.GetUint64());
  return st.ok() ? Ok() : ErrorResponse(st);
}

HttpResponse StatusJson(server::SharedMemoryManager& shm, const std::string& name) {
  auto regions = shm.Status(name);
  if (!regions.ok()) return ErrorResponse(regions.status());
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartArray();
  for (const auto& r : *regions) {
    w.StartObject();
    w.Key("name");
    w.String(r.name.data(), r.name.size());
    w.Key("key");
    w.String(r.key.data(), r.key.size());
    w.Key("offset");
    w.Uint64(r.offset);
    w.Key("byte_size");
    w.Uint64(r.byte_size);
    w.EndObject();
  }
  w.EndArray();
  HttpResponse resp;
  resp.status = 200;
  resp.content_type = "application/json";
  resp.body.assign(buf.GetString(), buf.GetSize());
  return resp;
}

}  // namespace

std::optional<HttpResponse> HandleSharedMemoryRoute(server::SharedMemoryManager& shm,
                                                    const HttpRequest& request,
                                                    const std::vector<std::string>& s) {
  if (s.size() < 2 || (s[1] != "systemsharedmemory" && s[1] != "cudasharedmemory")) {
    return std::nullopt;
  }
  // [v2, area, action] or [v2, area, region, <name>, action]
  std::string name;
  std::string action;
  if (s.size() == 3) {
    action = s[2];
  } else if (s.size() == 5 && s[2] == "region") {
    name = s[3];
    action = s[4];
  } else {
    return std::nullopt;
  }
  if (action != "status" && action != "register" && action != "unregister") return std::nullopt;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  if (action == "status" ? !get : !post) return MethodNotAllowed(request, action == "status");
  if (s[1] == "cudasharedmemory") {
    // As Triton built without GPU support: no CUDA region can exist, so unregister (of all, or
    // of a name) has nothing to do and succeeds, and status lists none (a named region is not
    // found); only register is refused. perf_analyzer's teardown always unregisters.
    if (action == "register") {
      return ErrorResponse(501, "CUDA shared memory is not supported on this server (it has no "
                                "GPU); use system shared memory (/v2/systemsharedmemory)");
    }
    if (action == "unregister") return Ok();
    if (!name.empty()) {
      return ErrorResponse(absl::NotFoundError(
          inferd::StrCat("unable to find cuda shared memory region: '", name, "'")));
    }
    HttpResponse r = Ok();
    r.content_type = "application/json";
    r.body = "[]";
    return r;
  }
  if (action == "status") return StatusJson(shm, name);
  if (action == "register") {
    if (name.empty()) {
      return ErrorResponse(400, "'region name' is necessary to register system shared memory region");
    }
    return Register(shm, name, request);
  }
  absl::Status st = shm.Unregister(name);
  return st.ok() ? Ok() : ErrorResponse(st);
}

}  // namespace inferd::http
