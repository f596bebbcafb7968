// The KServe v2 REST API with Triton's extensions (binary tensors, statistics, model
// repository, model configuration), as plain functions of an HTTP request: no socket, so
// every route is unit-tested directly. One execution path with the other frontends: this
// only converts between HTTP messages and server::Server calls.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/restricted_api.h"
#include "frontends/http/http_server.h"
#include "server/server.h"

namespace inferd::http {

class KServeHttpService {
 public:
  // Receives a function that builds the response; the caller runs it on the connection's
  // I/O thread. Called exactly once per request, on any thread.
  using Reply = std::function<void(std::function<HttpResponse()>)>;

  explicit KServeHttpService(server::Server* server, ApiRestrictions restrictions = {})
      : server_(server), restrictions_(std::move(restrictions)) {}

  void Handle(const HttpRequest& request, std::shared_ptr<const void> body_owner,
              Reply reply);

  // Adapts Handle to HttpServer's handler signature.
  HttpHandler AsHandler();

  // --http-restricted-api, for other HTTP frontends that serve the same categories.
  const ApiRestrictions& restrictions() const { return restrictions_; }

 private:
  void HandleInfer(const HttpRequest& request, std::shared_ptr<const void> body_owner,
                   const std::string& model, int64_t version, Reply reply);
  HttpResponse ModelStats(const std::string& model, int64_t version);
  HttpResponse RepositoryIndex(const HttpRequest& request);
  void RepositoryLoad(const HttpRequest& request, const std::string& model, bool load, Reply reply);

  server::Server* server_;
  ApiRestrictions restrictions_;
};

}  // namespace inferd::http
