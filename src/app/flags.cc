#include "app/flags.h"

#include <unistd.h>

#include <cstdlib>

#include <functional>
#include <climits>
#include <map>

#include "absl/strings/numbers.h"
#include "common/strings.h"
#include "repository/s3.h"

namespace inferd::app {
namespace {

absl::StatusOr<bool> ParseBool(const std::string& flag, const std::string& v) {
  if (v == "true" || v == "1" || v == "True" || v == "on" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "False" || v == "off" || v == "no") return false;
  return absl::InvalidArgumentError(inferd::StrCat("--", flag, " takes true or false, got '", v, "'"));
}

absl::StatusOr<int64_t> ParseInt(const std::string& flag, const std::string& v, int64_t min) {
  int64_t n;
  if (!absl::SimpleAtoi(v, &n) || n < min) {
    return absl::InvalidArgumentError(
        inferd::StrCat("--", flag, " takes an integer >= ", min, ", got '", v, "'"));
  }
  return n;
}

// "<bytes>", "<n>K|M|G" (binary units) or "<n>%" of physical memory.
absl::StatusOr<int64_t> ParseMemoryBudget(const std::string& v) {
  auto bad = [&v] {
    return absl::InvalidArgumentError(inferd::StrCat(
        "--model-memory-budget takes bytes (e.g. 4G, 512M) or a percentage of RAM (e.g. 60%), got '",
        v, "'"));
  };
  if (v.empty()) return bad();
  double n = 0;
  size_t used = 0;
  try {
    n = std::stod(v, &used);
  } catch (...) {
    return bad();
  }
  const std::string unit = v.substr(used);
  if (n < 0) return bad();
  if (unit == "%") {
    if (n > 100) return bad();
    const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    return static_cast<int64_t>(ram * n / 100);
  }
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) return bad();
  return static_cast<int64_t>(n * scale);
}

}  // namespace

std::string Usage() {
  return R"(Usage: inferd --model-repository=<path> [options]

  --model-repository=<path>        model repository (repeatable)
  --model-control-mode=none|explicit|poll|on-demand   (default none); on-demand: a
                                   model's first request loads it (--load-model models are
                                   loaded at start and never evicted)
  --repository-poll-secs=<n>       poll interval (default 15)
  --load-model=<name>              explicit mode: load at start (repeatable, '*' for all)
  --strict-readiness=<bool>        ready only when every model is ready (default true)
  --exit-on-error=<bool>           exit when a model fails to load at start (default true)
  --disable-auto-complete-config   do not complete configs from model files
  --backend-directory=<path>       where backend libraries loaded on first use live
                                   (libinferd_backend_pytorch.so; default: inferd's folder)
  --allow-http=<bool>              serve HTTP (default true)
  --http-port=<n>                  (default 8000; 0 picks a free port)
  --http-address=<addr>            (default 0.0.0.0)
  --http-thread-count=<n>          I/O event loops (default: number of cores)
  --http-max-input-size=<bytes>    largest request body (default 67108864)
  --http-max-header-size=<bytes>   largest request header block (default 65536)
  --http-idle-timeout-secs=<n>     close connections idle this long (default 300)
  --http-request-timeout-secs=<n>  408 when a request takes longer to arrive (default 60)
  --http-max-connections=<n>       503 beyond this many (default: descriptor limit - 128)
  --http-restricted-api=<category>[,<category>...]:<key>=<value>
                                   only requests with header <key>: <value> may use these
                                   APIs (health, metadata, inference, shared-memory,
                                   model-config, model-repository, statistics, trace, logging);
                                   repeatable
  --grpc-restricted-protocol=<same form>   the same for gRPC (metadata key <key>)
  --max-queue-size=<n>             requests queued per model before 503 (default 4096)
  --allow-grpc=<bool>              serve gRPC (default true)
  --grpc-port=<n>                  (default 8001; 0 picks a free port)
  --grpc-address=<addr>            (default 0.0.0.0)
  --grpc-infer-thread-count=<n>    cap on gRPC's threads (default: gRPC's own)
  --allow-sagemaker=<bool>         serve the SageMaker contract (default false)
  --sagemaker-port=<n>             (default 8080)
  --sagemaker-address=<addr>       (default 0.0.0.0)
  --sagemaker-thread-count=<n>     event loops (default: number of cores)
  --model-memory-budget=<size>     bytes (4G, 512M) or % of RAM for every loaded model; idle
                                   on-demand and multi-model models are evicted to stay under it
  --model-memory-accounting=rss|disk   a model's footprint: RSS growth over its load (at
                                   least its size on disk; default) or its size on disk
  --model-eviction-policy=cost-aware|lru   which idle models go first (default cost-aware:
                                   weighs use frequency, recency, size and reload time)
  --model-cache-dir=<d>            where S3 models are downloaded and archives extracted
                                   (default /tmp/inferd-model-cache; kept across restarts)
  --sagemaker-model-cache-dir=<d>  the same (older name)
  --model-load-thread-count=<n>    models loaded in parallel (default 4)
  --model-load-wait-secs=<n>       how long a request waits for its model's on-demand load
                                   before 503 (default 60)
  --allow-metrics=<bool>           serve Prometheus metrics (default true)
  --metrics-port=<n>               (default 8002; 0 picks a free port)
  --metrics-address=<addr>         (default 0.0.0.0)
  --metrics-interval-ms=<n>        CPU/memory sampling interval (default 2000)
  --log-verbose=<n>                verbose logging level (default 0)
  --log-format=default|ISO8601
  --log-info/--log-warning/--log-error=<bool>   accepted for compatibility
  --version, --help
)";
}

absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args, int cpu_cores) {
  Flags f;
  f.server.cpu_cores = cpu_cores;
  f.http.threads = std::max(1, cpu_cores);
  f.http.limits.max_body_bytes = 64 * 1024 * 1024;
  f.metrics_http.port = 8002;
  f.metrics_http.threads = 1;
  f.sagemaker_http.port = 8080;
  f.sagemaker_http.threads = std::max(1, cpu_cores);
  f.sagemaker_http.limits.max_body_bytes = 64 * 1024 * 1024;
  // The SageMaker Triton container's environment.
  if (const char* m = std::getenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")) f.sagemaker.default_model = m;
  if (const char* m = std::getenv("SAGEMAKER_TRITON_PING_MODE")) f.sagemaker.ping_live = std::string(m) == "live";
  std::vector<std::string> load_models;

  using Setter = std::function<absl::Status(const std::string&)>;
  auto set_bool = [](const char* name, bool* out) -> Setter {
    return [name, out](const std::string& v) -> absl::Status {
      auto b = ParseBool(name, v);
      if (!b.ok()) return b.status();
      *out = *b;
      return absl::OkStatus();
    };
  };
  auto set_int = [](const char* name, int64_t min, std::function<void(int64_t)> out) -> Setter {
    return [name, min, out](const std::string& v) -> absl::Status {
      auto n = ParseInt(name, v, min);
      if (!n.ok()) return n.status();
      out(*n);
      return absl::OkStatus();
    };
  };
  bool ignored_bool = false;
  std::map<std::string, Setter> with_value = {
      {"model-repository", [&](const std::string& v) { f.server.repositories.push_back(v); return absl::OkStatus(); }},
      {"model-store", [&](const std::string& v) { f.server.repositories.push_back(v); return absl::OkStatus(); }},
      {"backend-directory", [&](const std::string& v) { f.backend_directory = v; return absl::OkStatus(); }},
      {"model-control-mode",
       [&](const std::string& v) -> absl::Status {
         if (v == "none") f.server.control_mode = server::ControlMode::kNone;
         else if (v == "explicit") f.server.control_mode = server::ControlMode::kExplicit;
         else if (v == "poll") f.server.control_mode = server::ControlMode::kPoll;
         else if (v == "on-demand") f.server.control_mode = server::ControlMode::kOnDemand;
         else return absl::InvalidArgumentError(inferd::StrCat("--model-control-mode takes none, explicit, poll or on-demand, got '", v, "'"));
         return absl::OkStatus();
       }},
      {"repository-poll-secs", set_int("repository-poll-secs", 0, [&](int64_t n) { f.server.poll_secs = static_cast<int>(n); })},
      {"load-model", [&](const std::string& v) { load_models.push_back(v); return absl::OkStatus(); }},
      {"strict-readiness", set_bool("strict-readiness", &f.server.strict_readiness)},
      {"exit-on-error", set_bool("exit-on-error", &f.server.exit_on_error)},
      {"strict-model-config", [&](const std::string& v) -> absl::Status {
         auto b = ParseBool("strict-model-config", v);
         if (!b.ok()) return b.status();
         f.server.auto_complete = !*b;
         return absl::OkStatus();
       }},
      {"allow-http", set_bool("allow-http", &f.allow_http)},
      {"http-port", set_int("http-port", 0, [&](int64_t n) { f.http.port = static_cast<int>(n); })},
      {"http-address", [&](const std::string& v) { f.http.address = v; return absl::OkStatus(); }},
      {"http-thread-count", set_int("http-thread-count", 1, [&](int64_t n) { f.http.threads = static_cast<int>(n); })},
      {"http-max-input-size", set_int("http-max-input-size", 1, [&](int64_t n) { f.http.limits.max_body_bytes = n; })},
      {"http-max-header-size", set_int("http-max-header-size", 256, [&](int64_t n) { f.http.limits.max_header_bytes = n; })},
      {"http-idle-timeout-secs", set_int("http-idle-timeout-secs", 1, [&](int64_t n) { f.http.idle_timeout_secs = static_cast<int>(n); })},
      {"http-request-timeout-secs", set_int("http-request-timeout-secs", 1, [&](int64_t n) { f.http.request_timeout_secs = static_cast<int>(n); })},
      {"http-max-connections", set_int("http-max-connections", 1, [&](int64_t n) { f.http.max_connections = static_cast<int>(n); })},
      {"http-restricted-api", [&](const std::string& v) { return f.http_restrictions.Add("http-restricted-api", v); }},
      {"grpc-restricted-protocol", [&](const std::string& v) { return f.grpc.restrictions.Add("grpc-restricted-protocol", v); }},
      {"allow-sagemaker", set_bool("allow-sagemaker", &f.allow_sagemaker)},
      {"sagemaker-port", set_int("sagemaker-port", 0, [&](int64_t n) { f.sagemaker_http.port = static_cast<int>(n); })},
      {"sagemaker-address", [&](const std::string& v) { f.sagemaker_http.address = v; return absl::OkStatus(); }},
      {"sagemaker-thread-count", set_int("sagemaker-thread-count", 1, [&](int64_t n) { f.sagemaker_http.threads = static_cast<int>(n); })},
      {"model-memory-accounting", [&](const std::string& v) -> absl::Status {
         if (v == "rss") f.server.footprint_from_disk = false;
         else if (v == "disk") f.server.footprint_from_disk = true;
         else return absl::InvalidArgumentError(inferd::StrCat("--model-memory-accounting takes rss or disk, got '", v, "'"));
         return absl::OkStatus();
       }},
      {"model-cache-dir", [&](const std::string& v) { f.server.sources.cache_dir = v; return absl::OkStatus(); }},
      {"sagemaker-model-cache-dir", [&](const std::string& v) { f.server.sources.cache_dir = v; return absl::OkStatus(); }},
      {"model-load-thread-count", set_int("model-load-thread-count", 1, [&](int64_t n) { f.server.load_threads = static_cast<int>(n); })},
      {"model-load-wait-secs", set_int("model-load-wait-secs", 0, [&](int64_t n) { f.server.load_wait = absl::Seconds(n); })},
      {"model-eviction-policy", [&](const std::string& v) -> absl::Status {
         if (v == "cost-aware" || v == "lru") {
           f.server.eviction_policy = v == "lru" ? "lru" : "cost";
           return absl::OkStatus();
         }
         return absl::InvalidArgumentError(inferd::StrCat("--model-eviction-policy takes cost-aware or lru, got '", v, "'"));
       }},
      {"model-memory-budget", [&](const std::string& v) -> absl::Status {
         auto bytes = ParseMemoryBudget(v);
         if (!bytes.ok()) return bytes.status();
         f.server.memory_budget_bytes = *bytes;
         return absl::OkStatus();
       }},
      {"allow-grpc", set_bool("allow-grpc", &f.allow_grpc)},
      {"grpc-port", set_int("grpc-port", 0, [&](int64_t n) { f.grpc.port = static_cast<int>(n); })},
      {"grpc-address", [&](const std::string& v) { f.grpc.address = v; return absl::OkStatus(); }},
      {"grpc-infer-thread-count", set_int("grpc-infer-thread-count", 1, [&](int64_t n) { f.grpc.infer_threads = static_cast<int>(n); })},
      {"allow-metrics", set_bool("allow-metrics", &f.allow_metrics)},
      {"allow-cpu-metrics", set_bool("allow-cpu-metrics", &ignored_bool)},
      {"metrics-port", set_int("metrics-port", 0, [&](int64_t n) { f.metrics_http.port = static_cast<int>(n); })},
      {"metrics-address", [&](const std::string& v) { f.metrics_http.address = v; return absl::OkStatus(); }},
      {"metrics-interval-ms", set_int("metrics-interval-ms", 1, [&](int64_t n) { f.metrics_interval_ms = static_cast<int>(n); })},
      {"max-queue-size", set_int("max-queue-size", 1, [&](int64_t n) { f.server.max_queue_size = n; })},
      {"log-verbose", set_int("log-verbose", 0, [&](int64_t n) { f.log_verbose = static_cast<int>(n); })},
      {"log-format",
       [&](const std::string& v) -> absl::Status {
         if (v == "default") f.log_iso8601 = false;
         else if (v == "ISO8601") f.log_iso8601 = true;
         else return absl::InvalidArgumentError(inferd::StrCat("--log-format takes default or ISO8601, got '", v, "'"));
         return absl::OkStatus();
       }},
      {"log-info", set_bool("log-info", &ignored_bool)},
      {"log-warning", set_bool("log-warning", &ignored_bool)},
      {"log-error", set_bool("log-error", &ignored_bool)},
  };

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(inferd::StrCat("unexpected argument '", arg, "'; see --help"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "help") { f.help = true; continue; }
    if (name == "version") { f.version = true; continue; }
    if (name == "disable-auto-complete-config") {
      f.server.auto_complete = false;
      continue;
    }
    auto it = with_value.find(name);
    if (it == with_value.end()) {
      return absl::InvalidArgumentError(inferd::StrCat("unknown flag '--", name, "'; see --help"));
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(inferd::StrCat("flag '--", name, "' needs a value"));
      }
      value = args[++i];
    }
    absl::Status st = it->second(*value);
    if (!st.ok()) return st;
  }
  f.server.load_models = load_models;
  f.grpc.max_message_bytes = static_cast<int>(std::min<size_t>(f.http.limits.max_body_bytes, INT32_MAX));
  if (!load_models.empty() && f.server.control_mode != server::ControlMode::kExplicit &&
      f.server.control_mode != server::ControlMode::kOnDemand) {
    return absl::InvalidArgumentError("--load-model needs --model-control-mode=explicit or on-demand");
  }
  f.server.sources.s3 = repository::S3ConfigFromEnvironment();
  if (f.server.repositories.empty() && !f.help && !f.version) {
    return absl::InvalidArgumentError("--model-repository is required; see --help");
  }
  return f;
}

}  // namespace inferd::app
