// One KServe v2 infer body through the server facade: the translation from bytes to a
// core::InferRequest and from its response back to bytes, shared by the KServe route
// (/v2/models/<m>/infer) and SageMaker's invocations, which carry the JSON header's length
// differently (Inference-Header-Content-Length or the binary+json content type). The server
// resolves the model (server/model_resolver.h); nothing here asks whether it is loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "frontends/http/http_server.h"
#include "server/server.h"

namespace inferd::http {

// `header_length`: nullopt, the whole body is JSON; N, a JSON header of N bytes and binary
// tensors after it; 0, a raw body, the data of the model's only input (the model's config
// says its name, type and shape, so the server resolves the model before the body is parsed).
// `body_owner` keeps `request.body` alive. The reply carries Inference-Header-Content-Length
// when outputs are binary. `reply` is called exactly once, on any thread.
void InferFromBody(server::Server* server, const HttpRequest& request,
                   std::shared_ptr<const void> body_owner, const std::string& model,
                   int64_t version, std::optional<size_t> header_length,
                   const server::ResolveOptions& options,
                   std::function<void(std::function<HttpResponse()>)> reply);

}  // namespace inferd::http
