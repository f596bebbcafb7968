#include "app/flags.h"

#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "common/strings.h"
#include "repository/model_cache.h"
#include "repository/s3.h"

namespace inferd::app {
namespace {

// tritonserver's spellings (true/on/1, false/off/0, any case) and yes/no.
absl::StatusOr<bool> ParseBool(const std::string& flag, const std::string& v) {
  for (const char* t : {"true", "1", "on", "yes"}) {
    if (inferd::EqualsIgnoreCase(v, t)) return true;
  }
  for (const char* f : {"false", "0", "off", "no"}) {
    if (inferd::EqualsIgnoreCase(v, f)) return false;
  }
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

// tritonserver's --backend-config value: "<backend>,<key>=<value>", or "<key>=<value>" for
// every backend. Its parser's rules and messages.
absl::Status ParseBackendConfig(const std::string& v, Flags* f) {
  const size_t comma = v.find(',');
  if (comma == 0) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "--backend-config: no backend named; the format is <backend name>,<setting>=<value> or "
        "<setting>=<value>, got '", v, "'"));
  }
  const size_t key_start = comma == std::string::npos ? 0 : comma + 1;
  const size_t eq = v.find('=', key_start);
  const std::string backend = comma == std::string::npos ? "" : v.substr(0, comma);
  const std::string key = eq == std::string::npos ? "" : v.substr(key_start, eq - key_start);
  const std::string value = eq == std::string::npos ? "" : v.substr(eq + 1);
  if (key.empty() || value.empty()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "--backend-config: the format is <backend name>,<setting>=<value> or <setting>=<value>, "
        "got '", v, "'"));
  }
  f->backend_config[backend][key] = value;
  return absl::OkStatus();
}

enum class Arg { kBool, kInt, kFloat, kString };

// tritonserver flags with no meaning on this server: parsed as tritonserver parses them (a bad
// value is still an error) and reported as having no effect. From tritonserver 2.5x's option
// table (src/command_line_parser.cc) up to 2.6x.
struct NoEffectFlag {
  std::string_view name;
  Arg arg;
  std::string_view why;
};

constexpr std::string_view kNoGpu = "no GPU on this server";
constexpr std::string_view kGrpcArg = "inferd's gRPC server keeps gRPC's own default";

constexpr NoEffectFlag kNoEffectFlags[] = {
    {"model-load-retry-count", Arg::kInt, "a failed load is not retried at start"},
    {"enable-peer-access", Arg::kBool, kNoGpu},
    {"reuse-http-port", Arg::kBool, "each HTTP event loop has its own SO_REUSEPORT socket anyway"},
    {"reuse-grpc-port", Arg::kBool, kGrpcArg},
    {"http-header-forward-pattern", Arg::kString,
     "no backend here reads request headers as parameters"},
    {"grpc-header-forward-pattern", Arg::kString,
     "no backend here reads request headers as parameters"},
    {"grpc-infer-allocation-pool-size", Arg::kInt, "gRPC requests are not pooled here"},
    {"grpc-max-response-pool-size", Arg::kInt, "gRPC responses are not pooled here"},
    {"grpc-use-ssl", Arg::kBool, "gRPC is served without TLS"},  // true is refused
    {"grpc-use-ssl-mutual", Arg::kBool, "gRPC is served without TLS"},  // true is refused
    {"grpc-server-cert", Arg::kString, "gRPC is served without TLS"},
    {"grpc-server-key", Arg::kString, "gRPC is served without TLS"},
    {"grpc-root-cert", Arg::kString, "gRPC is served without TLS"},
    {"grpc-infer-response-compression-level", Arg::kString, "gRPC responses are not compressed"},
    {"grpc-keepalive-time", Arg::kInt, kGrpcArg},
    {"grpc-keepalive-timeout", Arg::kInt, kGrpcArg},
    {"grpc-keepalive-permit-without-calls", Arg::kBool, kGrpcArg},
    {"grpc-http2-max-pings-without-data", Arg::kInt, kGrpcArg},
    {"grpc-http2-min-recv-ping-interval-without-data", Arg::kInt, kGrpcArg},
    {"grpc-http2-max-ping-strikes", Arg::kInt, kGrpcArg},
    {"grpc-max-connection-age", Arg::kInt, kGrpcArg},
    {"grpc-max-connection-age-grace", Arg::kInt, kGrpcArg},
    {"sagemaker-safe-port-range", Arg::kString, "ports are not checked against a range"},
    {"allow-vertex-ai", Arg::kBool, "there is no Vertex AI endpoint"},
    {"vertex-ai-port", Arg::kInt, "there is no Vertex AI endpoint"},
    {"vertex-ai-thread-count", Arg::kInt, "there is no Vertex AI endpoint"},
    {"vertex-ai-default-model", Arg::kString, "there is no Vertex AI endpoint"},
    {"cache-directory", Arg::kString, "the local response cache is built in; no cache library is loaded"},
    {"rate-limit", Arg::kString, "there is no rate limiter (models that configure one are refused)"},
    {"rate-limit-resource", Arg::kString, "there is no rate limiter"},
    {"pinned-memory-pool-byte-size", Arg::kInt, kNoGpu},
    {"cuda-memory-pool-byte-size", Arg::kString, kNoGpu},
    {"cuda-virtual-address-size", Arg::kString, kNoGpu},
    {"buffer-manager-thread-count", Arg::kInt, "tensors are not copied by a buffer manager here"},
    {"host-policy", Arg::kString, "host policies (NUMA, CPU sets) are not implemented"},
    {"repoagent-directory", Arg::kString, "repository agents are not run"},
    {"allow-client-shm", Arg::kBool, "clients may always register system shared memory here (CUDA shared memory is not supported)"},
};

absl::Status CheckNoEffectValue(const NoEffectFlag& flag, const std::string& v) {
  const std::string name(flag.name);
  switch (flag.arg) {
    case Arg::kBool: {
      auto b = ParseBool(name, v);
      if (!b.ok()) return b.status();
      // A server asked for TLS must not start in plaintext.
      if (*b && (name == "grpc-use-ssl" || name == "grpc-use-ssl-mutual")) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "--", name, "=", v, ": inferd's gRPC endpoint has no TLS; terminate TLS in front of "
            "it (a proxy or load balancer) and leave this flag false"));
      }
      return absl::OkStatus();
    }
    case Arg::kInt: {
      int64_t n;
      if (!absl::SimpleAtoi(v, &n)) {
        return absl::InvalidArgumentError(
            inferd::StrCat("--", name, " takes an integer, got '", v, "'"));
      }
      return absl::OkStatus();
    }
    case Arg::kFloat: {
      double d;
      if (!absl::SimpleAtod(v, &d)) {
        return absl::InvalidArgumentError(
            inferd::StrCat("--", name, " takes a number, got '", v, "'"));
      }
      return absl::OkStatus();
    }
    case Arg::kString:
      if (name == "grpc-infer-response-compression-level") {
        for (const char* level : {"none", "low", "medium", "high"}) {
          if (inferd::EqualsIgnoreCase(v, level)) return absl::OkStatus();
        }
        return absl::InvalidArgumentError(inferd::StrCat(
            "--", name, " takes none, low, medium or high, got '", v, "'"));
      }
      if (name == "rate-limit" && !inferd::EqualsIgnoreCase(v, "off") &&
          !inferd::EqualsIgnoreCase(v, "execution_count")) {
        return absl::InvalidArgumentError(
            inferd::StrCat("--", name, " takes execution_count or off, got '", v, "'"));
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// --trace-config and the deprecated --trace-* flags (tritonserver's command_line_parser):
// "<setting>=<value>" for the global settings (level, rate, count, mode) and
// "triton,<setting>=<value>" for the file and log-frequency.
struct TraceFlags {
  server::TraceOptions options;
  bool explicit_off = false;
};

absl::Status ParseTraceLevel(const std::string& flag, std::string v, TraceFlags* t) {
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "false" || v == "off") {
    t->explicit_off = true;
  } else if (v == "true" || v == "on" || v == "min" || v == "max" || v == "timestamps") {
    t->options.level |= server::kTraceTimestamps;
  } else if (v == "tensors") {
    return absl::InvalidArgumentError(inferd::StrCat(
        flag, ": trace level TENSORS is not supported by this server (only OFF and TIMESTAMPS)"));
  } else {
    return absl::InvalidArgumentError(inferd::StrCat(flag, ": invalid value for trace level option: ", v));
  }
  return absl::OkStatus();
}

absl::Status ParseTraceConfig(const std::string& arg, TraceFlags* t) {
  const size_t comma = arg.find(',');
  std::string mode;
  std::string rest = arg;
  if (comma != std::string::npos) {
    if (comma == 0) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> "
          "or <setting>=<value>. Got ", arg));
    }
    mode = arg.substr(0, comma);
    std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
    rest = arg.substr(comma + 1);
  }
  const size_t eq = rest.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == rest.size()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "--trace-config option format is '<trace mode>,<setting>=<value>'. Got ", arg));
  }
  const std::string key = rest.substr(0, eq);
  std::string value = rest.substr(eq + 1);
  const std::string flag = inferd::StrCat("--trace-config ", arg);
  auto number = [&](int64_t min, int64_t max, auto* out) -> absl::Status {
    int64_t n;
    if (!absl::SimpleAtoi(value, &n) || n < min || n > max) {
      return absl::InvalidArgumentError(
          inferd::StrCat(flag, ": ", key, " takes an integer from ", min, " to ", max, ", got '", value, "'"));
    }
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(n);
    return absl::OkStatus();
  };
  if (mode == "opentelemetry" || (mode.empty() && key == "mode")) {
    std::string m = mode.empty() ? value : mode;
    std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
    if (m == "triton") return absl::OkStatus();
    if (m == "opentelemetry") {
      return absl::InvalidArgumentError(inferd::StrCat(
          flag, ": OpenTelemetry trace mode is not supported by this server; it traces in mode "
          "'triton' only (the JSON trace file, --trace-config triton,file=<path>)"));
    }
    return absl::InvalidArgumentError(inferd::StrCat(
        flag, ": invalid value for trace mode option: ", m, ". Available options are \"triton\" and \"opentelemetry\""));
  }
  if (mode.empty()) {
    if (key == "level") return ParseTraceLevel(flag, value, t);
    if (key == "rate") return number(0, UINT32_MAX, &t->options.rate);
    if (key == "count") return number(-1, INT32_MAX, &t->options.count);
    return absl::InvalidArgumentError(inferd::StrCat(
        flag, ": unknown global trace setting '", key, "' (level, rate, count, mode; file and "
        "log-frequency are written triton,file=... and triton,log-frequency=...)"));
  }
  if (mode != "triton") {
    return absl::InvalidArgumentError(inferd::StrCat(
        flag, ": invalid value for trace mode option: ", mode, ". Available options are \"triton\" and \"opentelemetry\""));
  }
  if (key == "file") {
    t->options.file = value;
    return absl::OkStatus();
  }
  if (key == "log-frequency") return number(0, UINT32_MAX, &t->options.log_frequency);
  return absl::InvalidArgumentError(inferd::StrCat(
      flag, ": unknown trace setting '", key, "' for mode triton (file, log-frequency)"));
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
  --strict-model-config-parameters=<bool>
                                   refuse a model whose config 'parameters' hold a key its
                                   backend does not read (default false: load it and log one
                                   WARNING per such key, as Triton's backends ignore them)
  --exit-on-error=<bool>           exit when a model fails to load at start (default true)
  --min-supported-compute-capability=<x.y>
                                   GPUs below this CUDA compute capability are not used
                                   (default 6.0, as Triton)
  --gpu-fallback-to-cpu=<bool>     run KIND_GPU instances on the CPU where they cannot run on a
                                   GPU (no GPU, or a CPU-only backend), with one WARNING per
                                   model, instead of failing the load (default false)
  --model-load-gpu-limit=<gpu>:<fraction>
                                   refuse a load on that GPU when its used memory (plus what the
                                   model took there last time) would exceed the fraction of its
                                   total, after evicting idle on-demand models holding memory on
                                   it (repeatable, one GPU each; as tritonserver)
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
  --http-cancel-on-disconnect=<bool>  a client that disconnects before its answer cancels its
                                   request: queued, it never runs (default true)
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
  --grpc-stream-max-in-flight=<n>  requests of one ModelStreamInfer stream in the server at
                                   once; past it the stream is not read (backpressure) until
                                   one completes (default 64; 0: unbounded)
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
                                   (default $XDG_CACHE_HOME/inferd/model-cache, else
                                   /tmp/inferd-<uid>/model-cache; created 0700; refused when another user owns it or
                                   group/others can write it; kept across restarts)
  --model-cache-max-bytes=<n>      the cache's cap: bytes (20G), a share of the space free at
                                   start (default 50%), or 0 (none); models not loaded are
                                   removed, least recently used first, to stay under it
  --sagemaker-model-cache-dir=<d>  the same (older name)
  --model-load-thread-count=<n>    models loaded in parallel (default 4)
  --model-load-wait-secs=<n>       how long a request waits for its model's on-demand load
                                   before 503 (default 60)
  --allow-metrics=<bool>           serve Prometheus metrics (default true)
  --metrics-port=<n>               (default 8002; 0 picks a free port)
  --metrics-address=<addr>         (default 0.0.0.0)
  --metrics-interval-ms=<n>        CPU/GPU sampling interval (default 2000)
  --metrics-config=<key>=<value>   latency metrics, repeatable: counter_latencies=<bool>
                                   (default true), histogram_latencies=<bool>,
                                   summary_latencies=<bool> (default false),
                                   summary_quantiles=<q>:<err>,... (default
                                   0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001)
  --allow-cpu-metrics=<bool>       serve the nv_cpu_* gauges (default true)
  --allow-gpu-metrics=<bool>       serve the nv_gpu_* and nv_energy_consumption metrics from
                                   NVML (default true; none where there is no NVIDIA driver)
  --log-verbose=<n>                verbose logging level (default 0)
  --log-format=default|ISO8601
  --log-info/--log-warning/--log-error=<bool>   log lines of that level (default true)
  --log-file=<path>                write the log there (appended) instead of to stderr
  --trace-config=[triton,]<setting>=<value>   the trace extension (repeatable):
                                   level=OFF|TIMESTAMPS, rate=<n> (every n-th request,
                                   default 1000), count=<n> (-1: no limit), mode=triton,
                                   triton,file=<path>, triton,log-frequency=<n> (write
                                   <path>.<i> every n traces; 0: <path> at exit).
                                   TENSORS and mode=opentelemetry are refused.
                                   (--trace-file/-level/-rate/-count/-log-frequency: the
                                   same, tritonserver's deprecated spellings)
  --exit-timeout-secs=<n>          after SIGTERM, exit (status 1) if requests in flight take
                                   longer than this (default 30)
  --model-config-name=<name>       use <model>/configs/<name>.pbtxt where it exists
  --id=<string>                    the server's identifier, server metadata's "name"
                                   (default inferd)
  --model-namespacing=<bool>       true: a model name held by several repositories is one
                                   model per repository (each ensemble runs its own
                                   repository's copy; a request by that name is ambiguous);
                                   false (default): such a name is unavailable
  --backend-config=[<backend>,]<key>=<value>   e.g. onnxruntime,default-max-batch-size=8
                                   (the max_batch_size auto-complete gives a model that can
                                   batch; default 4); repeatable
  --cache-config=local,size=<bytes>  the response cache for models with response_cache
                                   { enable: true } (--response-cache-byte-size=<bytes>: the same)
  --version, --help

Every other tritonserver flag is accepted and logged at start as having no effect here (GPU,
TLS, tracing, rate limiter, Vertex AI, ...); --grpc-use-ssl=true is refused.
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
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> cache_settings;
  std::optional<int64_t> cache_byte_size;  // --response-cache-byte-size
  // tritonserver: --disable-auto-complete-config wins over --strict-model-config=false, in
  // either order, with its warning.
  std::optional<bool> strict_model_config;
  bool disable_auto_complete = false;

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
  TraceFlags trace;  // --trace-config, --trace-*
  std::string cache_cap = "50%";  // --model-cache-max-bytes
  std::map<std::string, Setter> with_value = {
      {"trace-config", [&](const std::string& v) { return ParseTraceConfig(v, &trace); }},
      // tritonserver's deprecated spellings of the same settings.
      {"trace-file", [&](const std::string& v) { trace.options.file = v; return absl::OkStatus(); }},
      {"trace-level", [&](const std::string& v) { return ParseTraceLevel("--trace-level", v, &trace); }},
      {"trace-rate", set_int("trace-rate", 0, [&](int64_t n) { trace.options.rate = static_cast<uint32_t>(std::min<int64_t>(n, UINT32_MAX)); })},
      {"trace-count", set_int("trace-count", -1, [&](int64_t n) { trace.options.count = static_cast<int32_t>(std::min<int64_t>(n, INT32_MAX)); })},
      {"trace-log-frequency", set_int("trace-log-frequency", 0, [&](int64_t n) { trace.options.log_frequency = static_cast<uint32_t>(std::min<int64_t>(n, UINT32_MAX)); })},
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
      {"strict-model-config-parameters",
       set_bool("strict-model-config-parameters", &f.server.strict_model_config_parameters)},
      {"exit-on-error", set_bool("exit-on-error", &f.server.exit_on_error)},
      {"min-supported-compute-capability", [&](const std::string& v) -> absl::Status {
         double cc = 0;
         if (!absl::SimpleAtod(v, &cc) || !(cc >= 0) || cc > 100) {
           return absl::InvalidArgumentError(inferd::StrCat(
               "--min-supported-compute-capability takes a compute capability such as 7.5, got '",
               v, "'"));
         }
         f.server.placement.min_compute_capability = cc;
         return absl::OkStatus();
       }},
      {"gpu-fallback-to-cpu", set_bool("gpu-fallback-to-cpu", &f.server.placement.gpu_fallback_to_cpu)},
      {"strict-model-config", [&](const std::string& v) -> absl::Status {
         auto b = ParseBool("strict-model-config", v);
         if (!b.ok()) return b.status();
         f.server.auto_complete = !*b;
         strict_model_config = *b;
         f.no_effect.push_back(
             "Warning: '--strict-model-config' has been deprecated! Please use "
             "'--disable-auto-complete-config' instead.");
         return absl::OkStatus();
       }},
      {"allow-http", set_bool("allow-http", &f.allow_http)},
      {"http-port", set_int("http-port", 0, [&](int64_t n) { f.http.port = static_cast<int>(n); })},
      {"http-address", [&](const std::string& v) { f.http.address = v; return absl::OkStatus(); }},
      {"http-thread-count", set_int("http-thread-count", 1, [&](int64_t n) { f.http.threads = static_cast<int>(n); })},
      {"http-max-input-size", set_int("http-max-input-size", 1, [&](int64_t n) { f.http.limits.max_body_bytes = n; })},
      {"http-max-header-size", set_int("http-max-header-size", 256, [&](int64_t n) { f.http.limits.max_header_bytes = n; })},
      {"http-idle-timeout-secs", set_int("http-idle-timeout-secs", 1, [&](int64_t n) { f.http.idle_timeout_secs = static_cast<int>(n); })},
      {"http-cancel-on-disconnect", set_bool("http-cancel-on-disconnect", &f.http.cancel_on_disconnect)},
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
      {"model-cache-max-bytes", [&](const std::string& v) -> absl::Status {
         cache_cap = v;
         return absl::OkStatus();
       }},
      {"model-load-gpu-limit", [&](const std::string& v) -> absl::Status {
         // tritonserver's <device_id>:<fraction>, repeatable, one GPU each; the fraction in
         // [0, 1] (TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit). A GPU named twice keeps
         // its first limit, as tritonserver's map does.
         const size_t colon = v.find(':');
         int device = 0;
         double fraction = 0;
         if (colon == std::string::npos) {
           return absl::InvalidArgumentError(inferd::StrCat(
               "--model-load-gpu-limit takes <device_id>:<fraction> (e.g. 0:0.8), got '", v, "'"));
         }
         if (!absl::SimpleAtoi(v.substr(0, colon), &device) || device < 0) {
           return absl::InvalidArgumentError(inferd::StrCat(
               "--model-load-gpu-limit '", v, "': the device id '", v.substr(0, colon),
               "' is not a GPU number (0, 1, ...)"));
         }
         if (!absl::SimpleAtod(v.substr(colon + 1), &fraction) || !(fraction >= 0.0) ||
             fraction > 1.0) {
           return absl::InvalidArgumentError(inferd::StrCat(
               "--model-load-gpu-limit '", v, "': the fraction '", v.substr(colon + 1),
               "' must be a number in [0.0, 1.0]"));
         }
         f.server.gpu_load_limits.emplace(device, fraction);
         return absl::OkStatus();
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
      {"grpc-stream-max-in-flight", set_int("grpc-stream-max-in-flight", 0, [&](int64_t n) { f.grpc.stream_max_in_flight = static_cast<int>(n); })},
      {"allow-metrics", set_bool("allow-metrics", &f.allow_metrics)},
      {"allow-cpu-metrics", set_bool("allow-cpu-metrics", &f.allow_cpu_metrics)},
      {"allow-gpu-metrics", set_bool("allow-gpu-metrics", &f.allow_gpu_metrics)},
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
      {"log-info", set_bool("log-info", &f.log_info)},
      {"log-warning", set_bool("log-warning", &f.log_warning)},
      {"log-error", set_bool("log-error", &f.log_error)},
      {"log-file", [&](const std::string& v) -> absl::Status {
         if (v.empty()) return absl::InvalidArgumentError("--log-file needs a file name");
         f.log_file = v;
         return absl::OkStatus();
       }},
      {"exit-timeout-secs", [&](const std::string& v) -> absl::Status {
         int64_t n;
         if (!absl::SimpleAtoi(v, &n)) {
           return absl::InvalidArgumentError(
               inferd::StrCat("--exit-timeout-secs takes an integer, got '", v, "'"));
         }
         // tritonserver treats a negative timeout as 0.
         f.exit_timeout_secs = static_cast<int>(std::clamp<int64_t>(n, 0, INT32_MAX));
         return absl::OkStatus();
       }},
      {"model-config-name", [&](const std::string& v) -> absl::Status {
         if (v.empty()) return absl::InvalidArgumentError("--model-config-name needs a name");
         if (v.find_first_of("/ \t") != std::string::npos || v == "." || v == "..") {
           return absl::InvalidArgumentError(inferd::StrCat(
               "--model-config-name takes a file name without spaces or '/', got '", v, "'"));
         }
         f.server.model_config_name = v;
         return absl::OkStatus();
       }},
      {"backend-config", [&](const std::string& v) { return ParseBackendConfig(v, &f); }},
      {"cache-config", [&](const std::string& v) -> absl::Status {
         // tritonserver's "<cache>,<key>=<value>", repeatable.
         const size_t comma = v.find(',');
         const size_t eq = v.find('=', comma == std::string::npos ? 0 : comma);
         if (comma == std::string::npos || comma == 0 || eq == std::string::npos) {
           return absl::InvalidArgumentError(inferd::StrCat(
               "--cache-config: the format is <cache name>,<setting>=<value> (e.g. local,size=1048576), got '", v, "'"));
         }
         cache_settings.push_back({v.substr(0, comma), {v.substr(comma + 1, eq - comma - 1), v.substr(eq + 1)}});
         return absl::OkStatus();
       }},
      {"response-cache-byte-size", [&](const std::string& v) -> absl::Status {
         // Deprecated in tritonserver: the same as --cache-config=local,size=<v>.
         auto n = ParseInt("response-cache-byte-size", v, 0);
         if (!n.ok()) return n.status();
         cache_byte_size = *n;
         return absl::OkStatus();
       }},
      {"metrics-config", [&](const std::string& v) { return metrics::ApplyMetricsConfigSetting(v, &f.server.latency_metrics); }},
      // tritonserver's --id: the server identifier, the server metadata's "name".
      {"id", [&](const std::string& v) { f.server.id = v; return absl::OkStatus(); }},
      {"model-namespacing", [&](const std::string& v) -> absl::Status {
         // Triton's model namespacing: a name several repositories hold is one model per
         // repository; ensembles run their own repository's copy; a request by that name is
         // refused as ambiguous.
         auto b = ParseBool("model-namespacing", v);
         if (!b.ok()) return b.status();
         f.server.model_namespacing = *b;
         return absl::OkStatus();
       }},
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
      disable_auto_complete = true;
      continue;
    }
    auto it = with_value.find(name);
    const NoEffectFlag* no_effect = nullptr;
    for (const NoEffectFlag& flag : kNoEffectFlags) {
      if (flag.name == name) no_effect = &flag;
    }
    if (it == with_value.end() && no_effect == nullptr) {
      return absl::InvalidArgumentError(inferd::StrCat("unknown flag '--", name, "'; see --help"));
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(inferd::StrCat("flag '--", name, "' needs a value"));
      }
      value = args[++i];
    }
    if (no_effect != nullptr) {
      absl::Status st = CheckNoEffectValue(*no_effect, *value);
      if (!st.ok()) return st;
      f.no_effect.push_back(inferd::StrCat("--", name, "=", *value,
                                           " has no effect on this server (", no_effect->why, ")"));
      continue;
    }
    absl::Status st = it->second(*value);
    if (!st.ok()) return st;
  }
  if (disable_auto_complete) {
    if (strict_model_config && !*strict_model_config) {
      f.no_effect.push_back(
          "Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
          "'--disable-auto-complete-config'!");
    }
    f.server.auto_complete = false;
  }
  if (cache_byte_size && !cache_settings.empty()) {
    return absl::InvalidArgumentError(
        "Incompatible flags --response-cache-byte-size and --cache-config both provided. Please "
        "provide one or the other.");
  }
  if (cache_byte_size) {
    cache_settings.push_back({"local", {"size", inferd::StrCat(*cache_byte_size)}});
  }
  {
    auto cache = server::ParseCacheConfig(cache_settings);
    if (!cache.ok()) return cache.status();
    f.server.response_cache_bytes = cache->size_bytes;
  }
  {
    if (trace.explicit_off) trace.options.level = server::kTraceOff;
    absl::Status st = server::TraceManager::Validate(trace.options);
    if (!st.ok()) return absl::InvalidArgumentError(inferd::StrCat("--trace-config: ", st.message()));
    f.server.trace = trace.options;
  }
  f.server.load_models = load_models;
  // tritonserver's gRPC takes messages up to INT32_MAX bytes whatever --http-max-input-size
  // says (MAX_GRPC_MESSAGE_SIZE): a tensor over 64 MiB goes over gRPC as it does there.
  f.grpc.max_message_bytes = INT32_MAX;
  if (!load_models.empty() && f.server.control_mode != server::ControlMode::kExplicit &&
      f.server.control_mode != server::ControlMode::kOnDemand) {
    return absl::InvalidArgumentError("--load-model needs --model-control-mode=explicit or on-demand");
  }
  f.server.sources.s3 = repository::S3ConfigFromEnvironment();
  {
    // bytes (4G), a share of the space free at start (50%, the default), or 0 for no cap.
    auto bad = [&] {
      return absl::InvalidArgumentError(inferd::StrCat(
          "--model-cache-max-bytes takes bytes (e.g. 20G), a share of the free space (e.g. 50%) "
          "or 0 (no cap), got '", cache_cap, "'"));
    };
    uint64_t cap = 0;
    if (!cache_cap.empty() && cache_cap.back() == '%') {
      double share = 0;
      if (!absl::SimpleAtod(cache_cap.substr(0, cache_cap.size() - 1), &share) || share <= 0 ||
          share > 100) {
        return bad();
      }
      cap = static_cast<uint64_t>(
          static_cast<double>(repository::DefaultCacheCapBytes(f.server.sources.cache_dir)) * 2 *
          share / 100);
    } else {
      auto bytes = ParseMemoryBudget(cache_cap);
      if (!bytes.ok()) return bad();
      cap = static_cast<uint64_t>(*bytes);
    }
    f.server.sources.cache_cap =
        std::make_shared<repository::ModelCacheCap>(f.server.sources.cache_dir, cap);
  }
  if (f.server.repositories.empty() && !f.help && !f.version) {
    return absl::InvalidArgumentError("--model-repository is required; see --help");
  }
  return f;
}

absl::StatusOr<std::vector<std::string>> ConfigureBackends(
    const Flags& flags, const backends::BackendRegistry& registry) {
  std::vector<std::string> no_effect;
  static const std::map<std::string, std::string> kNone;
  auto global_it = flags.backend_config.find("");
  const auto& global = global_it == flags.backend_config.end() ? kNone : global_it->second;
  std::map<std::string, bool> global_read;
  for (const auto& [key, value] : global) global_read[key] = false;
  for (backends::Backend* backend : registry.All()) {
    const std::string name(backend->name());
    std::map<std::string, std::string> settings = global;
    auto own_it = flags.backend_config.find(name);
    const auto& own = own_it == flags.backend_config.end() ? kNone : own_it->second;
    for (const auto& [key, value] : own) settings[key] = value;
    auto unread = backend->Configure(settings);
    if (!unread.ok()) return unread.status();
    for (const auto& [key, value] : settings) {
      const bool read = std::find(unread->begin(), unread->end(), key) == unread->end();
      if (own.count(key) != 0) {
        if (read) continue;
        no_effect.push_back(inferd::StrCat("--backend-config=", name, ",", key, "=", value,
                                           " has no effect on this server (the ", name,
                                           " backend does not read '", key, "')"));
      } else if (read) {
        global_read[key] = true;
      }
    }
  }
  for (const auto& [key, read] : global_read) {
    if (read) continue;
    no_effect.push_back(inferd::StrCat("--backend-config=", key, "=", global.at(key),
                                       " has no effect on this server (no backend here uses '",
                                       key, "')"));
  }
  for (const auto& [name, settings] : flags.backend_config) {
    if (name.empty() || registry.Find(name) != nullptr) continue;
    for (const auto& [key, value] : settings) {
      no_effect.push_back(inferd::StrCat("--backend-config=", name, ",", key, "=", value,
                                         " has no effect on this server (it has no '", name,
                                         "' backend)"));
    }
  }
  return no_effect;
}

}  // namespace inferd::app
