// inferd: wires the layers together, handles signals, and shuts down in order:
// stop taking new work, drain the models (answering everything in flight), then close the
// HTTP loops.
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <thread>

#include "app/flags.h"
#include "backends/backend.h"
#include "backends/identity/identity_backend.h"
#include "backends/onnxruntime/onnxruntime_backend.h"
#include "common/logging.h"
#include "frontends/http/http_server.h"
#include "frontends/http/kserve_service.h"
#include "server/server.h"

int main(int argc, char** argv) {
  using namespace inferd;
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> args(argv + 1, argv + argc);
  auto flags = app::ParseFlags(args, cores);
  if (!flags.ok()) {
    std::cerr << "inferd: " << flags.status().message() << "\n";
    return 2;
  }
  if (flags->help) {
    std::cout << app::Usage();
    return 0;
  }
  if (flags->version) {
    std::cout << "inferd " << server::Server::kVersion << "\n";
    return 0;
  }
  SetLogVerbosity(flags->log_verbose);
  SetLogFormatIso8601(flags->log_iso8601);

  // Signals are taken synchronously by this thread; every thread created below inherits
  // the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  backends::BackendRegistry backends;
  backends.Register(backends::MakeIdentityBackend());
  backends.Register(backends::MakeOnnxRuntimeBackend());

  server::Server server(flags->server, &backends);
  if (absl::Status st = server.Start(); !st.ok()) {
    LOG_ERROR << "failed to start: " << st.message();
    server.Shutdown();
    return 1;
  }

  http::KServeHttpService kserve(&server);
  std::unique_ptr<http::HttpServer> http;
  if (flags->allow_http) {
    http = std::make_unique<http::HttpServer>(flags->http, kserve.AsHandler());
    if (absl::Status st = http->Start(); !st.ok()) {
      LOG_ERROR << st.message();
      server.Shutdown();
      return 1;
    }
    LOG_INFO << "started HTTP service on " << flags->http.address << ":" << http->port()
             << " (" << flags->http.threads << " event loops)";
  }

  int sig = 0;
  sigwait(&signals, &sig);
  LOG_INFO << "received signal " << sig << ", shutting down";
  server.Shutdown();  // answers every request in flight through the still-running loops
  if (http) http->Stop();
  LOG_INFO << "stopped";
  return 0;
}
