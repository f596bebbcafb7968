// The protocol limit: a hello-world server on inferd's own HTTP library (same event loops,
// parser and write path), answering every request on the loop thread with a fixed body.
// bench/protocol.sh divides inferd's infer/s by this server's requests/s.
#include <signal.h>

#include <cstdlib>
#include <iostream>

#include "frontends/http/http_server.h"

int main(int argc, char** argv) {
  using namespace inferd::http;
  HttpServerOptions options;
  options.port = argc > 1 ? std::atoi(argv[1]) : 8090;
  options.threads = argc > 2 ? std::atoi(argv[2]) : 2;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  HttpServer server(options, [](const HttpRequest&, std::shared_ptr<const void>,
                                std::unique_ptr<Responder> responder) {
    HttpResponse r;
    r.content_type = "text/plain";
    r.body = "hello";
    responder->Send(std::move(r));
  });
  if (auto st = server.Start(); !st.ok()) {
    std::cerr << st.message() << "\n";
    return 1;
  }
  int sig;
  sigwait(&signals, &sig);
  server.Stop();
  return 0;
}
