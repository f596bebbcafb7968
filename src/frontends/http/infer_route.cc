#include "frontends/http/infer_route.h"

#include <utility>

#include "common/strings.h"
#include "config/model_config_util.h"
#include "frontends/http/infer_codec.h"

namespace inferd::http {
namespace {

using Reply = std::function<void(std::function<HttpResponse()>)>;

void Fail(const Reply& reply, HttpResponse r) {
  auto shared = std::make_shared<HttpResponse>(std::move(r));
  reply([shared] { return std::move(*shared); });
}

// Hands a parsed request to the server; its response is serialized on the connection's thread.
void Run(server::Server* server, absl::StatusOr<ParsedInfer> parsed, const std::string& model,
         int64_t version, uint64_t received_ns, std::shared_ptr<core::CancellationToken> cancel,
         const server::ResolveOptions& options, const Reply& reply) {
  if (!parsed.ok()) return Fail(reply, ErrorResponse(parsed.status()));
  std::unique_ptr<core::InferRequest> req = std::move(parsed->request);
  req->model_name = model;
  req->model_version = version;
  req->times.received_ns = received_ns;
  req->cancel = std::move(cancel);  // the client disconnecting cancels it
  auto encoding = std::make_shared<OutputEncoding>(std::move(parsed->encoding));
  req->on_complete = [reply, encoding](std::unique_ptr<core::InferResponse> response) {
    std::shared_ptr<core::InferResponse> shared(std::move(response));
    reply([shared, encoding]() -> HttpResponse {
      if (!shared->status.ok()) return ErrorResponse(shared->status);
      return SerializeInferResponse(*shared, *encoding);
    });
  };
  server->Infer(std::move(req), options);
}

}  // namespace

void InferFromBody(server::Server* server, const HttpRequest& request,
                   std::shared_ptr<const void> body_owner, const std::string& model,
                   int64_t version, std::optional<size_t> header_length,
                   const server::ResolveOptions& options, Reply reply) {
  if (!header_length || *header_length != 0) {
    const uint64_t received = core::NowNs();
    Run(server, ParseInferRequest(request.body, header_length, std::move(body_owner)), model,
        version, received, request.cancel, options, reply);
    return;
  }
  // A raw body is the data of the model's only input: the config says which. `body_owner`
  // keeps the body's bytes alive while the model loads.
  server->GetModelConfig(
      model, version, options,
      [server, body = std::string_view(request.body), body_owner = std::move(body_owner),
       cancel = request.cancel, model, version, source = std::string(options.source_name),
       multi_model = options.multi_model,
       reply = std::move(reply)](absl::StatusOr<const config::ModelConfig*> cfg) {
        if (!cfg.ok()) return Fail(reply, ErrorResponse(cfg.status()));
        const config::ModelConfig& c = **cfg;
        if (c.input_size() != 1) {
          return Fail(reply, ErrorResponse(400, StrCat(
              "Inference-Header-Content-Length 0 sends a raw body, which needs a model with "
              "exactly one input; model '", model, "' has ", c.input_size())));
        }
        RawInputSpec spec;
        spec.name = c.input(0).name();
        spec.datatype = config::FromProto(c.input(0).data_type());
        spec.dims.assign(c.input(0).dims().begin(), c.input(0).dims().end());
        spec.batching = c.max_batch_size() > 0;
        const uint64_t received = core::NowNs();
        Run(server, ParseRawInferRequest(body, spec, body_owner), model, version, received,
            cancel, server::ResolveOptions{source, multi_model}, reply);
      });
}

}  // namespace inferd::http
