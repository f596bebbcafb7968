#include "frontends/http/shared_memory_routes.h"

#include "absl/strings/escaping.h"
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

// A region name already registered: Triton's HTTP frontend answers its ALREADY_EXISTS with 400
// (HttpCodeFromError in its http_server.cc maps ALREADY_EXISTS, INVALID_ARG, CANCELLED and
// UNKNOWN to 400; it has no 409), so tritonclient's exception carries status "400". gRPC keeps
// ALREADY_EXISTS, as Triton's.
HttpResponse RegisterError(const absl::Status& st) {
  if (st.code() == absl::StatusCode::kAlreadyExists) {
    return ErrorResponse(400, std::string_view(st.message().data(), st.message().size()));
  }
  return ErrorResponse(st);
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
  return st.ok() ? Ok() : RegisterError(st);
}

// Triton's status JSON: system regions {name, key, offset, byte_size}, CUDA regions
// {name, device_id, byte_size}.
HttpResponse StatusJson(server::SharedMemoryManager& shm, const std::string& name,
                        MemoryType kind) {
  auto regions = shm.Status(name, kind);
  if (!regions.ok()) return ErrorResponse(regions.status());
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartArray();
  for (const auto& r : *regions) {
    w.StartObject();
    w.Key("name");
    w.String(r.name.data(), r.name.size());
    if (kind == MemoryType::kGpu) {
      w.Key("device_id");
      w.Uint64(static_cast<uint64_t>(r.device_id));
    } else {
      w.Key("key");
      w.String(r.key.data(), r.key.size());
      w.Key("offset");
      w.Uint64(r.offset);
    }
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

// {"raw_handle": {"b64": "<base64 of the 64-byte cudaIpcMemHandle_t>"}, "device_id": n,
// "byte_size": n}, as tritonclient's register_cuda_shared_memory sends it.
HttpResponse RegisterCuda(server::SharedMemoryManager& shm, const std::string& name,
                          const HttpRequest& request) {
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseIterativeFlag>(request.body.data(), request.body.size());
  if (doc.HasParseError() || !doc.IsObject()) {
    return ErrorResponse(400, "the CUDA shared memory register request must be a JSON object "
                              "{\"raw_handle\": {\"b64\": ...}, \"device_id\": ..., "
                              "\"byte_size\": ...}");
  }
  auto raw = doc.FindMember("raw_handle");
  if (raw == doc.MemberEnd()) {
    return ErrorResponse(400, "Shared memory register request has no 'raw_handle' field");
  }
  if (!raw->value.IsObject()) {
    return ErrorResponse(400, "'raw_handle' must be an object {\"b64\": \"<base64>\"}");
  }
  auto b64 = raw->value.FindMember("b64");
  if (b64 == raw->value.MemberEnd() || !b64->value.IsString()) {
    return ErrorResponse(400, "'raw_handle' must hold the handle as a base64 string in 'b64'");
  }
  std::string handle;
  if (!absl::Base64Unescape(
          absl::string_view(b64->value.GetString(), b64->value.GetStringLength()), &handle)) {
    return ErrorResponse(400, "'raw_handle' 'b64' is not valid base64");
  }
  auto device = doc.FindMember("device_id");
  if (device == doc.MemberEnd()) {
    return ErrorResponse(400, "Shared memory register request has no 'device_id' field");
  }
  if (!device->value.IsInt64()) return ErrorResponse(400, "'device_id' must be an integer");
  auto size = doc.FindMember("byte_size");
  if (size == doc.MemberEnd()) {
    return ErrorResponse(400, "Shared memory register request has no 'byte_size' field");
  }
  if (!size->value.IsUint64()) return ErrorResponse(400, "'byte_size' must be a non-negative integer");
  absl::Status st = shm.RegisterCuda(name, handle, device->value.GetInt64(), size->value.GetUint64());
  return st.ok() ? Ok() : RegisterError(st);
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
  const MemoryType kind = s[1] == "cudasharedmemory" ? MemoryType::kGpu : MemoryType::kCpu;
  if (action == "status") return StatusJson(shm, name, kind);
  if (action == "register") {
    if (name.empty()) {
      return ErrorResponse(400, inferd::StrCat("'region name' is necessary to register ",
                                               kind == MemoryType::kGpu ? "cuda" : "system",
                                               " shared memory region"));
    }
    return kind == MemoryType::kGpu ? RegisterCuda(shm, name, request)
                                    : Register(shm, name, request);
  }
  absl::Status st = shm.Unregister(name, kind);
  return st.ok() ? Ok() : ErrorResponse(st);
}

}  // namespace inferd::http
