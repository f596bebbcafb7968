#include "frontends/http/generate.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "frontends/http/infer_codec.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferd::http {
namespace {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                                     rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>;
constexpr unsigned kParseFlags = rapidjson::kParseIterativeFlag |
                                 rapidjson::kParseValidateEncodingFlag |
                                 rapidjson::kParseNanAndInfFlag;

// Triton's shape for a generate input of `count` elements: fixed dimensions as the metadata
// says, the innermost variable one takes what is left, the other variable ones 1.
absl::StatusOr<Shape> FillShape(const std::string& name, Shape shape, int64_t count) {
  auto unfit = [&] {
    return absl::InvalidArgumentError(
        inferd::StrCat("The schema can not convert input '", name, "' to tensor with proper shape"));
  };
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
    if (*it != -1) {
      if (*it == 0 || count % *it != 0) return unfit();
      count /= *it;
    }
  }
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
    if (*it == -1) {
      *it = count;
      count = 1;
    }
  }
  if (count != 1) return unfit();
  return shape;
}

// The generate body as a KServe infer request body, so the one infer parser validates it.
absl::StatusOr<std::string> ToInferJson(std::string_view body, const server::ModelMetadata& md) {
  rapidjson::Document doc;
  if (body.empty()) {
    doc.SetObject();
  } else {
    doc.Parse<kParseFlags>(body.data(), body.size());
    if (doc.HasParseError()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "malformed JSON in the generate request body at offset ", doc.GetErrorOffset()));
    }
  }
  if (!doc.IsObject()) {
    return absl::InvalidArgumentError("the generate request body must be a JSON object");
  }
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  w.Key("parameters");
  w.StartObject();
  for (const auto& m : doc.GetObject()) {
    const std::string key(m.name.GetString(), m.name.GetStringLength());
    if (key == "id") continue;
    bool is_input = false;
    for (const auto& in : md.inputs) is_input |= in.name == key;
    if (is_input) continue;
    if (!(m.value.IsString() || m.value.IsNumber() || m.value.IsBool())) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "parameter '", key, "' must be a string, a number or a boolean (it names no input of model '",
          md.name, "')"));
    }
    w.Key(key.c_str(), static_cast<rapidjson::SizeType>(key.size()));
    m.value.Accept(w);
  }
  w.EndObject();
  if (auto id = doc.FindMember("id"); id != doc.MemberEnd()) {
    if (!id->value.IsString()) return absl::InvalidArgumentError("'id' must be a string");
    w.Key("id");
    id->value.Accept(w);
  }
  w.Key("inputs");
  w.StartArray();
  for (const auto& in : md.inputs) {
    auto m = doc.FindMember(in.name.c_str());
    if (m == doc.MemberEnd()) continue;  // the server names a missing input
    const rapidjson::Value& v = m->value;
    int64_t count = 1;
    if (v.IsArray()) {
      for (const auto& e : v.GetArray()) {
        if (e.IsArray() || e.IsObject()) {
          return absl::InvalidArgumentError(inferd::StrCat(
              "input '", in.name, "' must be a value or a 1-D array of values"));
        }
      }
      count = v.Size();
    } else if (v.IsObject() || v.IsNull()) {
      return absl::InvalidArgumentError(
          inferd::StrCat("input '", in.name, "' must be a value or a 1-D array of values"));
    }
    auto shape = FillShape(in.name, in.shape, count);
    if (!shape.ok()) return shape.status();
    w.StartObject();
    w.Key("name");
    w.String(in.name.c_str(), static_cast<rapidjson::SizeType>(in.name.size()));
    w.Key("datatype");
    const std::string_view dt = DataTypeName(in.datatype);
    w.String(dt.data(), static_cast<rapidjson::SizeType>(dt.size()));
    w.Key("shape");
    w.StartArray();
    for (int64_t d : *shape) w.Int64(d);
    w.EndArray();
    w.Key("data");
    if (v.IsArray()) {
      v.Accept(w);
    } else {
      w.StartArray();
      v.Accept(w);
      w.EndArray();
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return std::string(buf.GetString(), buf.GetSize());
}

// One successful response as generate's flat object.
std::string ResponseJson(core::InferResponse& response) {
  HttpResponse infer = SerializeInferResponse(response, OutputEncoding{});
  rapidjson::Document doc;
  doc.Parse<kParseFlags>(infer.body.data(), infer.body.size());
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  for (const auto& m : doc.GetObject()) {
    if (m.name == "outputs") continue;
    w.Key(m.name.GetString(), m.name.GetStringLength());
    m.value.Accept(w);
  }
  if (auto outs = doc.FindMember("outputs"); outs != doc.MemberEnd() && outs->value.IsArray()) {
    for (const auto& o : outs->value.GetArray()) {
      auto name = o.FindMember("name");
      auto data = o.FindMember("data");
      if (name == o.MemberEnd() || data == o.MemberEnd()) continue;
      w.Key(name->value.GetString(), name->value.GetStringLength());
      // One element: the value itself, as Triton strips the array.
      if (data->value.IsArray() && data->value.Size() == 1) {
        data->value[0].Accept(w);
      } else {
        data->value.Accept(w);
      }
    }
  }
  w.EndObject();
  return std::string(buf.GetString(), buf.GetSize());
}

std::string ErrorJson(const absl::Status& status) {
  return std::move(ErrorResponse(status).body);
}

// The responses of one generate call, in order, from the backend's thread.
class GenerateCall {
 public:
  GenerateCall(bool streaming, std::function<void(std::function<HttpResponse()>)> reply)
      : streaming_(streaming), reply_(std::move(reply)) {}

  void OnResponse(std::unique_ptr<core::InferResponse> response, bool final) {
    if (streaming_) {
      Stream(std::move(response), final);
    } else {
      Collect(std::move(response), final);
    }
  }

 private:
  void Stream(std::unique_ptr<core::InferResponse> response, bool final) {
    if (final && response != nullptr && !response->status.ok()) {
      inferd::MutexLock lock(&mu_);
      if (!started_) {
        // Refused before any response (a bad request, an unknown model, the backend's one
        // error): a plain JSON error with its status, as for /infer.
        started_ = true;
        return Post(ErrorResponse(response->status));
      }
    }
    HttpResponse part;
    if (response != nullptr) {
      part.body = inferd::StrCat(
          "data: ", response->status.ok() ? ResponseJson(*response) : ErrorJson(response->status),
          "\n\n");
    }
    inferd::MutexLock lock(&mu_);
    if (!started_) {
      started_ = true;
      // As Triton: the first response sets the status; later errors are events.
      HttpResponse head;
      head.stream = HttpResponse::Stream::kStart;
      head.status = response != nullptr && !response->status.ok()
                        ? HttpStatusFromStatus(response->status)
                        : 200;
      head.content_type = "text/event-stream; charset=utf-8";
      head.headers.emplace_back("Cache-Control", "no-cache");
      Post(std::move(head));
    }
    part.stream = final ? HttpResponse::Stream::kEnd : HttpResponse::Stream::kChunk;
    Post(std::move(part));
  }

  void Collect(std::unique_ptr<core::InferResponse> response, bool final) {
    inferd::MutexLock lock(&mu_);
    if (response != nullptr) {
      ++count_;
      if (!response->status.ok()) {
        if (error_.ok()) error_ = response->status;
      } else if (count_ == 1) {
        body_ = ResponseJson(*response);
      }
    }
    if (!final) return;
    if (!error_.ok()) return Post(ErrorResponse(error_));
    if (count_ != 1) {
      return Post(ErrorResponse(
          400, inferd::StrCat("generate expects model to produce exactly 1 response, use "
                              "generate stream for model that generates various number of "
                              "responses (this request got ", count_, ")")));
    }
    HttpResponse r;
    r.content_type = "application/json";
    r.body = std::move(body_);
    Post(std::move(r));
  }

  void Post(HttpResponse r) {
    auto shared = std::make_shared<HttpResponse>(std::move(r));
    reply_([shared] { return std::move(*shared); });
  }

  const bool streaming_;
  const std::function<void(std::function<HttpResponse()>)> reply_;
  // Held while a part is posted, so the parts of a stream leave in order.
  inferd::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::string body_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void HandleGenerate(server::Server* server, const HttpRequest& request,
                    std::shared_ptr<const void> body_owner, const std::string& model,
                    int64_t version, bool streaming,
                    std::function<void(std::function<HttpResponse()>)> reply) {
  auto fail = [reply](absl::Status st) {
    reply([st] { return ErrorResponse(st); });
  };
  const std::string_view body = request.body;
  auto cancel = request.cancel;  // the client disconnecting cancels the request (and the stream)
  // The model's inputs decide which keys are tensors: the server resolves the model first (an
  // on-demand one loads), then the body is translated and run.
  server->GetModelMetadata(model, version, {}, [=](absl::StatusOr<server::ModelMetadata> md) {
    if (!md.ok()) return fail(md.status());
    auto json = ToInferJson(body, *md);
    if (!json.ok()) return fail(json.status());
    auto owned = std::make_shared<std::string>(*std::move(json));
    auto parsed = ParseInferRequest(*owned, std::nullopt, owned);
    if (!parsed.ok()) return fail(parsed.status());
    std::unique_ptr<core::InferRequest> req = std::move(parsed->request);
    req->model_name = model;
    req->model_version = version;
    req->times.received_ns = core::NowNs();
    req->cancel = cancel;
    auto call = std::make_shared<GenerateCall>(streaming, reply);
    req->on_response = [call](std::unique_ptr<core::InferResponse> r, bool final) {
      call->OnResponse(std::move(r), final);
    };
    (void)body_owner;  // keeps `body` alive until the request is parsed
    server->Infer(std::move(req));
  });
}

}  // namespace inferd::http
