// Triton's generate extension (docs/protocol/extension_generate.md): POST
// /v2/models/<m>[/versions/<v>]/generate and .../generate_stream. The body is one flat JSON
// object: keys naming a model input are tensors (a value or a 1-D array; the shape is filled in
// from the model's metadata as Triton does), every other key is a request parameter. Each
// response is one flat JSON object: model_name, model_version, id (when set) and each output by
// name (a value for one element, else an array).
//
// generate answers with exactly one response (an error otherwise, as Triton);
// generate_stream sends every response of a decoupled model as a server-sent event
// (`data: {...}\n\n`, text/event-stream, chunked) as it is produced, and ends after the final
// flag. Errors after the first event are events too ({"error": "..."}).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "frontends/http/http_server.h"
#include "server/server.h"

namespace inferd::http {

// `reply` is called once per part: once for generate, once per event for generate_stream
// (HttpResponse::stream marks the parts), in order, from any thread.
void HandleGenerate(server::Server* server, const HttpRequest& request,
                    std::shared_ptr<const void> body_owner, const std::string& model,
                    int64_t version, bool streaming,
                    std::function<void(std::function<HttpResponse()>)> reply);

}  // namespace inferd::http
