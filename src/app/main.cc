// inferd: wires the layers together, handles signals, and shuts down in order:
// stop taking new work, drain the models (answering everything in flight), then close the
// HTTP loops.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "app/flags.h"
#include "backends/backend.h"
#include "backends/identity/identity_backend.h"
#include "backends/repeat/repeat_backend.h"
#include "backends/dali/dali_backend.h"
#include "backends/image/image_backend.h"
#include "backends/onnxruntime/onnxruntime_backend.h"
#include "backends/python/python_backend.h"
#include "backends/module_backend.h"
#include "common/cpu_budget.h"
#include "gpu/runtime.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "frontends/grpc/grpc_frontend.h"
#include "frontends/http/http_server.h"
#include "frontends/http/kserve_service.h"
#include "frontends/sagemaker/sagemaker_service.h"
#include "metrics/prometheus.h"
#include "metrics/gpu_metrics.h"
#include "metrics/system_metrics.h"
#include "server/server.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define INFERD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define INFERD_SANITIZED 1
#endif
#endif

namespace {

// Opens --log-file again and points stderr at it: after logrotate moves the file, new lines go
// to a new file of that name (SIGHUP, SIGUSR1). The old descriptor is replaced atomically by
// dup2, so a line being written lands in one file or the other.
void ReopenLogFile(const std::string& path) {
  if (path.empty()) return;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    LOG_ERROR << "--log-file: cannot reopen '" << path << "': " << std::strerror(errno)
              << "; logging goes on to the file open before";
    return;
  }
  if (dup2(fd, STDERR_FILENO) < 0) {
    LOG_ERROR << "--log-file: cannot reopen '" << path << "': " << std::strerror(errno);
  }
  close(fd);
  LOG_INFO << "reopened the log file '" << path << "'";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace inferd;
#ifndef INFERD_SANITIZED
  // Debian's Abseil is built without NDEBUG, so absl::Mutex looks for lock-order cycles on every
  // lock (GraphCycles): ~1,000 instructions of a small request's ~60,000. The sanitizer builds,
  // which run the tests, keep the check.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  // Default thread counts follow the CPUs this process may use (cgroup quota and cpuset,
  // affinity), not the host's cores.
  const CpuBudget cpu_budget = DetectCpuBudget();
  const int cores = cpu_budget.cpus;
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
  if (!flags->log_file.empty()) {
    // Everything written to stderr from here on (inferd's lines and the runtimes' own) goes to
    // the file, appended as tritonserver does.
    const int fd = open(flags->log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) {
      std::cerr << "inferd: --log-file: cannot open '" << flags->log_file
                << "': " << std::strerror(errno) << "\n";
      return 2;
    }
    close(fd);
    SetLogFileName(flags->log_file);
  }
  SetLogVerbosity(flags->log_verbose);
  SetLogFormatIso8601(flags->log_iso8601);
  SetLogLevelEnabled(LogLevel::kInfo, flags->log_info);
  SetLogLevelEnabled(LogLevel::kWarning, flags->log_warning);
  SetLogLevelEnabled(LogLevel::kError, flags->log_error);
  LOG_INFO << "CPU budget: " << cpu_budget.describe;
  // The host's GPUs, asked once here (CUDA opens the driver on this first call).
  gpu::Runtime& gpus = gpu::SystemRuntime();
  flags->server.placement.gpus = &gpus;
  flags->server.gpus = &gpus;
  if (gpus.DeviceCount() == 0) {
    LOG_INFO << "GPUs: none (" << gpus.UnavailableReason() << ")";
  }
  for (const gpu::DeviceProperties& d : gpu::ListDevices(gpus)) {
    const bool used = d.ComputeCapability() + 1e-9 >= flags->server.placement.min_compute_capability;
    LOG_INFO << "GPU " << d.id << ": '" << d.name << "', compute capability "
             << d.compute_capability_major << "." << d.compute_capability_minor << ", "
             << (d.total_memory_bytes >> 20) << " MiB"
             << (used ? "" : "; below --min-supported-compute-capability, not used");
  }
  for (const std::string& line : flags->no_effect) LOG_WARNING << line;
  // --model-load-gpu-limit for a GPU this host does not have: tritonserver accepts it and never
  // consults it; so does inferd, saying so (one line; a CPU-only host still starts).
  if (!flags->server.gpu_load_limits.empty()) {
    std::vector<std::string> absent;
    for (const auto& [device, fraction] : flags->server.gpu_load_limits) {
      if (device >= gpus.DeviceCount()) absent.push_back(inferd::StrCat(device, ":", fraction));
    }
    if (!absent.empty()) {
      LOG_WARNING << "--model-load-gpu-limit " << inferd::StrJoin(absent, ", ")
                  << " names a GPU this host does not have, so it never applies ("
                  << (gpus.DeviceCount() == 0
                          ? inferd::StrCat("no GPU: ", gpus.UnavailableReason())
                          : inferd::StrCat(gpus.DeviceCount(), " GPU(s): 0 to ",
                                           gpus.DeviceCount() - 1))
                  << ")";
    }
  }

  // Signals are taken synchronously by this thread; every thread created below inherits
  // the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // Not fatal: SIGHUP re-reads the repository and reopens the log file, SIGUSR1 reopens the
  // log file (the operator's and logrotate's expectations); their default action would end
  // the process and drop every request in flight.
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Every connection is a descriptor: take the hard limit, which the HTTP servers' connection
  // caps are derived from.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  backends::BackendRegistry backends;
  backends.Register(backends::MakeIdentityBackend());
  backends.Register(backends::MakeRepeatBackend());
  backends.Register(backends::MakeImageBackend());
  backends.Register(backends::MakeDaliBackend());
  backends.Register(backends::MakeOnnxRuntimeBackend());
  backends.Register(backends::MakePythonBackend());
#ifdef INFERD_WITH_LIBTORCH
  // LibTorch is loaded when the first PyTorch model loads, not before.
  const std::string backend_dir = flags->backend_directory.empty()
                                      ? backends::ExecutableDirectory()
                                      : flags->backend_directory;
  backends.Register(backends::MakeModuleBackend(
      "pytorch", backend_dir + "/libinferd_backend_pytorch.so"));
#endif

  // Python-based backends (Triton's): <backend directory>/<name>/model.py serves the models
  // whose config names backend '<name>', where no backend of that name is built in.
  {
    const std::string dir = flags->backend_directory.empty() ? backends::ExecutableDirectory()
                                                             : flags->backend_directory;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      const std::filesystem::path model_py = entry.path() / "model.py";
      if (backends.Find(name) != nullptr || !std::filesystem::is_regular_file(model_py, ec)) {
        continue;
      }
      backends.Register(backends::MakePythonBasedBackend(name, model_py.string()));
      LOG_INFO << "backend '" << name << "': Python-based, " << model_py.string();
    }
  }

  if (auto no_effect = app::ConfigureBackends(*flags, backends); !no_effect.ok()) {
    std::cerr << "inferd: " << no_effect.status().message() << "\n";
    return 2;
  } else {
    for (const std::string& line : *no_effect) LOG_WARNING << line;
  }

  metrics::MetricsRegistry registry;
  server::Server server(flags->server, &backends, &registry);
  if (absl::Status st = server.Start(); !st.ok()) {
    LOG_ERROR << "failed to start: " << st.message();
    server.Shutdown();
    return 1;
  }

  http::KServeHttpService kserve(&server, flags->http_restrictions);
  std::unique_ptr<grpcfe::GrpcFrontend> grpc;
  if (flags->allow_grpc) {
    grpc = std::make_unique<grpcfe::GrpcFrontend>(&server, flags->grpc);
    if (absl::Status st = grpc->Start(); !st.ok()) {
      LOG_ERROR << st.message();
      server.Shutdown();
      return 1;
    }
    LOG_INFO << "started GRPCInferenceService on " << flags->grpc.address << ":" << grpc->port();
  }

  std::unique_ptr<sagemaker::SageMakerService> sagemaker;
  std::unique_ptr<http::HttpServer> sagemaker_http;
  if (flags->allow_sagemaker) {
    sagemaker = std::make_unique<sagemaker::SageMakerService>(&server, &kserve, flags->sagemaker);
    sagemaker_http = std::make_unique<http::HttpServer>(flags->sagemaker_http, sagemaker->AsHandler());
    if (absl::Status st = sagemaker_http->Start(); !st.ok()) {
      LOG_ERROR << st.message();
      server.Shutdown();
      return 1;
    }
    LOG_INFO << "started SageMaker service on " << flags->sagemaker_http.address << ":"
             << sagemaker_http->port();
  }

  std::unique_ptr<metrics::SystemMetrics> system_metrics;
  std::unique_ptr<metrics::GpuMetrics> gpu_metrics;
  std::unique_ptr<http::HttpServer> metrics_http;
  if (flags->allow_metrics) {
    if (flags->allow_cpu_metrics) {
      system_metrics =
          std::make_unique<metrics::SystemMetrics>(&registry, flags->metrics_interval_ms);
    }
    if (flags->allow_gpu_metrics) {
      gpu_metrics = metrics::StartGpuMetrics(&registry, flags->metrics_interval_ms);
    }
    metrics_http = std::make_unique<http::HttpServer>(
        flags->metrics_http,
        [&registry](const http::HttpRequest& req, std::shared_ptr<const void>,
                    std::unique_ptr<http::Responder> responder) {
          http::HttpResponse r;
          if (req.path != "/metrics") {
            r.status = 404;
            r.content_type = "text/plain";
            r.body = "only /metrics is served on this port\n";
          } else if (req.method != "GET" && req.method != "HEAD") {
            r.status = 405;
          } else {
            r.content_type = "text/plain; version=0.0.4; charset=utf-8";
            r.body = registry.Render();
          }
          responder->Send(std::move(r));
        });
    if (absl::Status st = metrics_http->Start(); !st.ok()) {
      LOG_ERROR << st.message();
      server.Shutdown();
      return 1;
    }
    LOG_INFO << "started Metrics Service on " << flags->metrics_http.address << ":"
             << metrics_http->port();
  }

  // The KServe HTTP port opens last: once GET /v2/health/live answers, the gRPC, SageMaker
  // and metrics ports are already accepting.
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
  for (;;) {
    sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGINT || sig == SIGTERM) break;
    if (sig == SIGHUP) {
      if (server.PollNow()) {
        LOG_INFO << "received SIGHUP: reading the model repository again";
      } else {
        LOG_INFO << "received SIGHUP: the model repository is read again only with "
                    "--model-control-mode=poll (load and unload through the repository API)";
      }
    } else {
      LOG_INFO << "received SIGUSR1";
    }
    ReopenLogFile(flags->log_file);
  }
  LOG_INFO << "received signal " << sig << ", shutting down";
  // --exit-timeout-secs, as tritonserver: what is in flight gets that long to finish, then the
  // process exits with status 1 whatever is left (a stuck model cannot hold it forever).
  inferd::Mutex exit_mu;
  bool stopped = false;
  std::thread exit_timer([&] {
    inferd::MutexLock lock(&exit_mu);
    if (!exit_mu.AwaitWithTimeout(absl::Condition(&stopped),
                                  absl::Seconds(flags->exit_timeout_secs))) {
      LOG_ERROR << "exit timeout (" << flags->exit_timeout_secs
                << " s, --exit-timeout-secs) expired with requests still in flight; exiting now";
      std::_Exit(1);
    }
  });
  if (grpc) grpc->Stop();  // stops new RPCs; those in flight finish below
  server.Shutdown();  // answers every request in flight through the still-running loops
  if (http) http->Stop();
  if (sagemaker_http) sagemaker_http->Stop();
  if (metrics_http) metrics_http->Stop();
  {
    inferd::MutexLock lock(&exit_mu);
    stopped = true;
  }
  exit_timer.join();
  LOG_INFO << "stopped";
  return 0;
}
