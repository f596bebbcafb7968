#include "server/server.h"

#include <algorithm>
#include <charconv>
#include <iterator>

#include "backends/tensor_places.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "core/response_sender.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "server/classification.h"
#include "server/request_validation.h"

namespace inferd::server {

Server::Server(ServerOptions options, const backends::BackendRegistry* backends,
               metrics::MetricsRegistry* registry)
    : options_(std::move(options)), backends_(backends), shared_memory_(options_.gpus) {
  if (options_.response_cache_bytes > 0) {
    response_cache_ = std::make_unique<ResponseCache>(options_.response_cache_bytes);
  }
  trace_ = std::make_unique<TraceManager>(options_.trace);
  if (registry != nullptr) {
    registry->AddCollector([this](metrics::PrometheusWriter& w) { CollectMetrics(w); });
  }
  // Models' own metrics (Triton's custom metrics), after the server's.
  custom_metrics_ = std::make_unique<metrics::CustomMetrics>(registry);
  repository::LifecycleOptions lo;
  lo.repositories = options_.repositories;
  lo.auto_complete = options_.auto_complete;
  lo.load.cpu_cores = options_.cpu_cores;
  lo.load.strict_parameters = options_.strict_model_config_parameters;
  lo.load.placement = options_.placement;
  lo.load.max_queue_size = options_.max_queue_size;
  lo.load.latency_metrics = options_.latency_metrics;
  lo.sources = options_.sources;
  lo.on_demand = options_.control_mode == ControlMode::kOnDemand;
  lo.load_threads = options_.load_threads;
  lo.load_wait = options_.load_wait;
  lo.memory_budget_bytes = options_.memory_budget_bytes;
  lo.footprint_from_disk = options_.footprint_from_disk;
  lo.eviction_policy = options_.eviction_policy;
  lo.gpu_load_limits = options_.gpu_load_limits;
  lo.model_config_name = options_.model_config_name;
  lo.namespacing = options_.model_namespacing;
  // Ensemble steps take the same path as a client's request: validation, then the model.
  lo.load.dispatch = [this](std::unique_ptr<core::InferRequest> r) { Infer(std::move(r)); };
  lo.load.gpus = options_.gpus;
  lo.load.is_model_ready = [this](const std::string& name, int64_t version) {
    return IsModelReady(name, version);
  };
  lo.load.custom_metrics = custom_metrics_.get();
  // pb_utils.load_model / unload_model: on the caller's thread (a model's initialize() or
  // execute()), not the loader pool, which may be running that very model's load.
  lo.load.load_model = [this](const std::string& name, const std::optional<std::string>& config,
                              const std::map<std::string, std::string>& files) {
    RETURN_IF_ERROR(CheckLoadRequest(name, config, files));
    return LoadModelNow(name, config, files);
  };
  lo.load.unload_model = [this](const std::string& name, bool unload_dependents) {
    RETURN_IF_ERROR(CheckRepositoryControl(name));
    return lifecycle_->Unload(name, unload_dependents);
  };
  lifecycle_ = std::make_unique<repository::ModelLifecycle>(lo, backends);
  resolver_ = std::make_unique<ModelResolver<repository::ModelLifecycle>>(
      lifecycle_.get(), options_.control_mode == ControlMode::kOnDemand);
  loader_ = std::make_unique<WorkerPool>(std::max(1, options_.load_threads), 256);
}

Server::~Server() { Shutdown(); }

std::vector<std::string> Server::Extensions() const {
  // Triton's list (core's InferenceServer constructor), in its order. cuda_shared_memory is
  // there when the build can serve it (CUDA in the build, or the fake devices in tests), as
  // Triton lists it whenever it is built with GPU support: on a host without a GPU, register
  // then answers 400 saying why, as Triton's does when cudaIpcOpenMemHandle fails. A build
  // without CUDA leaves it out (register: "GPUs not supported"), as Triton built without GPU;
  // status and unregister still answer there, so clients' teardown (perf_analyzer's) succeeds.
  std::vector<std::string> extensions = {
      "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
      "schedule_policy", "model_configuration", "system_shared_memory"};
  if (shared_memory_.SupportsCuda()) extensions.push_back("cuda_shared_memory");
  for (const char* e : {"binary_tensor_data", "parameters", "statistics", "trace", "logging"}) {
    extensions.push_back(e);
  }
  return extensions;
}

absl::Status Server::Start() {
  // A repository that does not exist or cannot be reached fails the start, whatever the mode.
  RETURN_IF_ERROR(lifecycle_->Open());
  absl::Status status;
  switch (options_.control_mode) {
    case ControlMode::kNone:
    case ControlMode::kPoll:
      status = lifecycle_->LoadAll();
      break;
    case ControlMode::kExplicit:
    case ControlMode::kOnDemand:
      for (const auto& name : options_.load_models) {
        absl::Status st = name == "*" ? lifecycle_->LoadAll() : lifecycle_->Load(name);
        if (!st.ok() && status.ok()) status = st;
      }
      break;
  }
  if (!status.ok() && options_.exit_on_error) return status;
  if (!status.ok()) LOG_WARNING << "some models failed to load: " << status.message();
  if (options_.control_mode == ControlMode::kPoll) {
    poller_ = std::thread([this] { PollLoop(); });
  }
  live_ = true;
  return absl::OkStatus();
}

void Server::PollLoop() {
  inferd::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time next = absl::Now() + absl::Seconds(std::max(1, options_.poll_secs));
    while (!stopping_ && !poll_now_ && absl::Now() < next) {
      stop_cv_.WaitWithTimeout(&mu_, next - absl::Now());
    }
    if (stopping_) break;
    poll_now_ = false;
    mu_.Unlock();
    lifecycle_->Poll();
    mu_.Lock();
  }
}

bool Server::PollNow() {
  if (options_.control_mode != ControlMode::kPoll) return false;
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_) return false;
    poll_now_ = true;
  }
  stop_cv_.SignalAll();
  return true;
}

void Server::Shutdown() {
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_cv_.SignalAll();
  if (poller_.joinable()) poller_.join();
  loader_->Stop();          // finishes queued API and multi-model loads; refuses new ones
  lifecycle_->Shutdown();   // finishes on-demand loads, then drains requests in flight
  trace_->Shutdown();       // writes the traces collected and closes the trace files
  live_ = false;
}

bool Server::IsLive() const { return live_.load(); }

bool Server::IsReady() const {
  if (!live_.load()) return false;
  return !options_.strict_readiness || lifecycle_->AllReady();
}

bool Server::IsModelReady(std::string_view name, int64_t version) const {
  return lifecycle_->IsReady(name, version);
}

absl::StatusOr<ModelMetadata> Server::GetModelMetadata(std::string_view name,
                                                       int64_t version) const {
  auto model = lifecycle_->Get(name, version);
  if (!model.ok()) return model.status();
  return MetadataOf(**model, name, version);
}

ModelMetadata Server::MetadataOf(const repository::Model& model, std::string_view name,
                                 int64_t version) const {
  const config::ModelConfig& cfg = model.config();
  ModelMetadata md;
  md.name = cfg.name();
  if (version >= 0) {
    md.versions.push_back(inferd::StrCat(version));
  } else {
    for (const auto& m : lifecycle_->ReadyVersions(name)) md.versions.push_back(inferd::StrCat(m->version()));
  }
  md.platform = cfg.platform().empty() ? cfg.backend() : cfg.platform();
  const bool batching = cfg.max_batch_size() > 0;
  auto tensor = [&](const std::string& n, inference::DataType t,
                    const google::protobuf::RepeatedField<int64_t>& dims) {
    TensorMetadata tm{n, config::FromProto(t), {}};
    if (batching) tm.shape.push_back(-1);
    for (int64_t d : dims) tm.shape.push_back(d);
    return tm;
  };
  for (const auto& in : cfg.input()) md.inputs.push_back(tensor(in.name(), in.data_type(), in.dims()));
  for (const auto& out : cfg.output()) md.outputs.push_back(tensor(out.name(), out.data_type(), out.dims()));
  return md;
}

absl::StatusOr<config::ModelConfig> Server::GetModelConfig(std::string_view name,
                                                           int64_t version) const {
  auto model = lifecycle_->Get(name, version);
  if (!model.ok()) return model.status();
  return (*model)->config();
}

void Server::GetModelMetadata(std::string_view name, int64_t version,
                              const ResolveOptions& options,
                              std::function<void(absl::StatusOr<ModelMetadata>)> done) {
  resolver_->Resolve(
      name, version, WaitBounds{.received_ns = core::NowNs()}, options,
      [this, name = std::string(name), version, done = std::move(done)](
          absl::StatusOr<std::shared_ptr<const repository::Model>> model) {
        if (!model.ok()) return done(model.status());
        done(MetadataOf(**model, name, version));
      });
}

void Server::GetModelConfig(
    std::string_view name, int64_t version, const ResolveOptions& options,
    std::function<void(absl::StatusOr<const config::ModelConfig*>)> done) {
  resolver_->Resolve(name, version, WaitBounds{.received_ns = core::NowNs()}, options,
                     [done = std::move(done)](
                         absl::StatusOr<std::shared_ptr<const repository::Model>> model) {
                       if (!model.ok()) return done(model.status());
                       done(&(*model)->config());
                     });
}

absl::StatusOr<std::vector<ModelStatistics>> Server::GetStatistics(std::string_view name,
                                                                   int64_t version) const {
  std::vector<ModelStatistics> out;
  std::vector<std::shared_ptr<const repository::Model>> models;
  if (name.empty()) {
    models = lifecycle_->AllReadyModels();
  } else if (version >= 0) {
    auto m = lifecycle_->Get(name, version);
    if (!m.ok()) return m.status();
    models.push_back(*m);
  } else {
    models = lifecycle_->ReadyVersions(name);
    if (models.empty()) {
      auto m = lifecycle_->Get(name, -1);
      return m.status().ok() ? repository::UnknownModelError(name) : m.status();
    }
  }
  for (const auto& m : models) {
    out.push_back({m->config().name(), inferd::StrCat(m->version()), m->stats().Snapshot(),
                   lifecycle_->FootprintBytes(m->config().name(), m->version()),
                   m->gpu_memory_bytes()});
  }
  return out;
}

void Server::Infer(std::unique_ptr<core::InferRequest> request, const ResolveOptions& options) {
  if (request->times.received_ns == 0) request->times.received_ns = core::NowNs();
  core::AnswerOnceThroughStream(request.get());
  core::InferRequest& r = *request;
  resolver_->Resolve(r.model_name, r.model_version, WaitBounds::Of(r), options,
                     [this, request = std::move(request)](
                         absl::StatusOr<std::shared_ptr<const repository::Model>> model) mutable {
                       if (!model.ok()) {
                         core::CompleteWithError(std::move(request), model.status());
                         return;
                       }
                       InferOn(**model, std::move(request));
                     });
}

void Server::InferOn(const repository::Model& model, std::unique_ptr<core::InferRequest> request) {
  request->model_version = model.version();
  if (model.config().model_transaction_policy().decoupled()) {
    const backends::Backend* backend =
        backends_ != nullptr ? backends_->Find(model.config().backend()) : nullptr;
    // An ensemble with a decoupled step is decoupled (the repository marks it); its scheduler
    // streams each flow's response and the final flag through the sender itself.
    const bool streams = model.config().platform() == "ensemble" ||
                         (backend != nullptr && backend->SupportsDecoupled());
    absl::Status st = core::PrepareDecoupledRequest(request.get(), streams);
    if (!st.ok()) {
      core::CompleteWithError(std::move(request), std::move(st));
      return;
    }
  }
  // Where inputs go (backends/tensor_places.h): an input in a CUDA region, or an ensemble
  // step's GPU output, stays on its GPU when every instance takes inputs there, and is copied
  // to the host once, here, otherwise. The response cache hashes input bytes on the CPU, so a
  // cached model takes host inputs.
  const bool cached = response_cache_ != nullptr && model.config().response_cache().enable();
  const std::optional<int> gpu_inputs_on = cached ? std::nullopt : model.gpu_inputs_on();
  absl::Status valid = shared_memory_.Attach(request.get(), gpu_inputs_on);
  if (valid.ok()) {
    for (const auto& in : request->inputs) {
      if (in.place.OnHost()) continue;
      valid = backends::PlaceInputsFor(options_.gpus, request.get(), gpu_inputs_on);
      break;
    }
  }
  if (valid.ok()) valid = ValidateRequest(model.config(), request.get());
  if (!valid.ok()) {
    model.stats().RecordFailure(core::NowNs() - request->times.received_ns,
                                    metrics::FailureReason::kOther);
    core::CompleteWithError(std::move(request), std::move(valid));
    return;
  }
  // The trace extension: one relaxed load when nothing traces.
  request->trace = trace_->Sample(request->model_name, request->model_version, request->id);
  bool classify = false;
  for (const auto& o : request->outputs) classify |= o.classification > 0;
  if (classify) {
    // Post-process on the completing thread; hold the labels, never the model itself.
    auto labels = model.labels();
    const bool batching = model.config().max_batch_size() > 0;
    auto requested = std::make_shared<std::vector<core::RequestedOutput>>(request->outputs);
    request->on_complete = [labels, batching, requested, next = std::move(request->on_complete)](
                               std::unique_ptr<core::InferResponse> response) {
      if (response->status.ok()) {
        absl::Status st = ApplyClassification(*requested, *labels, batching, response.get());
        if (!st.ok()) {
          response->outputs.clear();
          response->status = st;
        }
      }
      next(std::move(response));
    };
  }
  // As in Triton, only the default and dynamic-batch schedulers cache: a sequence carries
  // state from request to request, which an answer from the cache would skip.
  if (cached && !model.config().has_sequence_batching() && !ServeFromCache(model, request)) {
    return;
  }
  // Installed last, so it runs first: outputs a GPU instance left on its GPU are copied to the
  // host before the cache, classification or the frontend read them, except those bound for a
  // shared-memory region (copied from the GPU into it: device-to-device for a CUDA region)
  // when nothing before that reads them, and except for a consumer that reads GPU bytes (an
  // ensemble, unless the cache, classification or the sequence batcher's state reads the
  // outputs first). Host-only models skip this: one branch.
  if (cached || classify || model.config().has_sequence_batching()) {
    request->gpu_outputs_ok = false;
  }
  if (cached || classify) {
    // The cache or the classification reads the outputs before the region: host bytes.
    for (auto& o : request->outputs) o.gpu_region_on.reset();
  }
  if (model.outputs_may_be_on_gpu() && !request->gpu_outputs_ok) {
    std::vector<std::string> to_region;
    if (!cached && !classify) {
      for (const auto& o : request->outputs) {
        if (o.shm) to_region.push_back(o.name);
      }
    }
    auto edge = [gpus = options_.gpus,
                 to_region = std::move(to_region)](core::InferResponse* response) {
      if (backends::AnyOutputOnGpu(*response)) {
        backends::MakeOutputsHostReadable(gpus, response, [&](const core::OutputTensor& o) {
          return std::find(to_region.begin(), to_region.end(), o.name) != to_region.end();
        });
      }
    };
    // A decoupled model's responses reach the client through its sender, not on_complete:
    // the same edge runs there, before the sender's (shared-memory) edge.
    if (request->response_sender != nullptr) request->response_sender->AddEdge(edge);
    request->on_complete = [edge = std::move(edge), next = std::move(request->on_complete)](
                               std::unique_ptr<core::InferResponse> response) {
      edge(response.get());
      next(std::move(response));
    };
  }
  model.Enqueue(std::move(request));
}

bool Server::ServeFromCache(const repository::Model& model,
                            std::unique_ptr<core::InferRequest>& request) {
  const uint64_t start = core::NowNs();
  ResponseCache::Key key = ResponseCache::MakeKey(*request);
  auto hit = response_cache_->Lookup(key);
  const uint64_t looked_up = core::NowNs();
  metrics::ModelStats* stats = &model.stats();
  if (hit) {
    auto response = std::make_unique<core::InferResponse>();
    response->model_name = request->model_name;
    response->model_version = request->model_version;
    response->id = request->id;
    response->outputs = *std::move(hit);
    stats->RecordCacheHit(looked_up - request->times.received_ns,
                          start - request->times.received_ns, looked_up - start);
    request->on_complete(std::move(response));
    return false;
  }
  // A miss runs the model; its successful response goes into the cache before anything else
  // (classification, shared memory) sees it. The model outlives its requests in flight, so its
  // statistics may be reached through a plain pointer.
  request->on_complete = [cache = response_cache_.get(), stats, key = std::move(key),
                          lookup_ns = looked_up - start, next = std::move(request->on_complete)](
                             std::unique_ptr<core::InferResponse> response) {
    if (response->status.ok()) {
      const uint64_t t0 = core::NowNs();
      cache->Insert(key, *response);
      stats->RecordCacheMiss(lookup_ns + (core::NowNs() - t0));
    }
    next(std::move(response));
  };
  return true;
}

void Server::CollectMetrics(metrics::PrometheusWriter& w) const {
  struct Row {
    metrics::Labels labels;
    metrics::ModelStatsSnapshot s;
    size_t pending;
    size_t in_flight;
    double load_secs;
    metrics::LatencySnapshot latency;
  };
  std::vector<Row> rows;
  for (const auto& m : lifecycle_->AllReadyModels()) {
    metrics::Labels labels{{"model", m->config().name()}, {"version", StrCat(m->version())}};
    // --model-namespacing: Triton's "namespace" label (the model's repository) tells apart
    // same-named models.
    if (!m->model_namespace().empty()) {
      labels.insert(labels.begin(), {"namespace", m->model_namespace()});
    }
    rows.push_back({std::move(labels),
                    m->stats().Snapshot(), m->Queued(), m->InFlight(), m->load_seconds(),
                    m->stats().Latencies()});
  }
  auto family = [&](const char* name, const char* help, const char* type, auto value) {
    w.Family(name, help, type);
    for (const auto& r : rows) w.Sample(name, r.labels, value(r));
  };
  family("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
         "counter", [](const Row& r) { return double(r.s.success.count); });
  w.Family("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
           "counter");
  for (const auto& r : rows) {
    for (int i = 0; i < metrics::kNumFailureReasons; ++i) {
      // Triton (prometheus-cpp) writes labels in name order: model, reason, version. Clients
      // match the line as a whole (Triton's own QA does), so "reason" goes before "version".
      metrics::Labels l = r.labels;
      l.insert(l.end() - 1, {"reason", metrics::kFailureReasonNames[i]});
      w.Sample("nv_inference_request_failure", l, double(r.s.fail_by_reason[i]));
    }
  }
  family("nv_inference_count", "Number of inferences performed (does not include cached requests)",
         "counter", [](const Row& r) { return double(r.s.inference_count); });
  family("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
         "counter", [](const Row& r) { return double(r.s.execution_count); });
  family("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model.",
         "gauge", [](const Row& r) { return double(r.pending); });
  family("inferd_inference_in_flight_request_count",
         "Instantaneous number of requests queued or executing per-model.", "gauge",
         [](const Row& r) { return double(r.in_flight); });
  if (options_.latency_metrics.counters) {
  family("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)",
         "counter", [](const Row& r) { return double((r.s.success.ns + r.s.fail.ns) / 1000); });
  family("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)",
         "counter", [](const Row& r) { return double(r.s.queue.ns / 1000); });
  family("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)",
         "counter", [](const Row& r) { return double(r.s.compute_input.ns / 1000); });
  family("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)",
         "counter", [](const Row& r) { return double(r.s.compute_infer.ns / 1000); });
  family("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)",
         "counter", [](const Row& r) { return double(r.s.compute_output.ns / 1000); });
  }
  // --metrics-config histogram_latencies / summary_latencies: tritonserver's families.
  auto label_number = [](double v) {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
    return std::string(buf, end);
  };
  if (options_.latency_metrics.histograms) {
    constexpr const char* kName = "nv_inference_first_response_histogram_ms";
    w.Family(kName, "Duration from request to first response in milliseconds", "histogram");
    for (const auto& r : rows) {
      if (!r.latency.first_response_ms) continue;
      const auto& h = *r.latency.first_response_ms;
      w.Sample(StrCat(kName, "_count"), r.labels, double(h.count));
      w.Sample(StrCat(kName, "_sum"), r.labels, h.sum);
      for (size_t i = 0; i < h.cumulative.size(); ++i) {
        metrics::Labels l = r.labels;
        l.emplace_back("le", i < h.bounds.size() ? label_number(h.bounds[i]) : "+Inf");
        w.Sample(StrCat(kName, "_bucket"), l, double(h.cumulative[i]));
      }
    }
  }
  if (options_.latency_metrics.summaries) {
    static constexpr std::pair<const char*, const char*> kSummaries[] = {
        {"nv_inference_request_summary_us",
         "Summary of inference request duration in microseconds (includes cached requests)"},
        {"nv_inference_queue_summary_us",
         "Summary of inference queuing duration in microseconds (includes cached requests)"},
        {"nv_inference_compute_input_summary_us",
         "Cumulative compute input duration in microseconds (does not include cached requests)"},
        {"nv_inference_compute_infer_summary_us",
         "Cumulative compute inference duration in microseconds (does not include cached requests)"},
        {"nv_inference_compute_output_summary_us",
         "Cumulative inference compute output duration in microseconds (does not include cached "
         "requests)"}};
    for (size_t k = 0; k < std::size(kSummaries); ++k) {
      const char* name = kSummaries[k].first;
      w.Family(name, kSummaries[k].second, "summary");
      for (const auto& r : rows) {
        if (r.latency.summaries_us.size() <= k) continue;
        const auto& s = r.latency.summaries_us[k];
        w.Sample(StrCat(name, "_count"), r.labels, double(s.count));
        w.Sample(StrCat(name, "_sum"), r.labels, double(s.sum));
        for (const auto& [q, value] : s.quantiles) {
          metrics::Labels l = r.labels;
          l.emplace_back("quantile", label_number(q));
          w.Sample(name, l, value);
        }
      }
    }
  }
  family("nv_model_load_duration_secs", "Model load time in seconds", "gauge",
         [](const Row& r) { return r.load_secs; });
  family("nv_cache_num_hits_per_model", "Number of cache hits per model", "counter",
         [](const Row& r) { return double(r.s.cache_hit.count); });
  family("nv_cache_num_misses_per_model", "Number of cache misses per model", "counter",
         [](const Row& r) { return double(r.s.cache_miss.count); });
  family("nv_cache_hit_duration_per_model",
         "Total cache hit duration per model, in microseconds", "counter",
         [](const Row& r) { return double(r.s.cache_hit.ns / 1000); });
  family("nv_cache_miss_duration_per_model",
         "Total cache miss (insert + lookup) duration per model, in microseconds", "counter",
         [](const Row& r) { return double(r.s.cache_miss.ns / 1000); });
  if (response_cache_ != nullptr) {
    const auto c = response_cache_->GetCounters();
    auto gauge = [&](const char* name, const char* help, double v) {
      w.Family(name, help, "gauge");
      w.Sample(name, {}, v);
    };
    gauge("nv_cache_num_entries", "Number of responses stored in response cache", double(c.entries));
    gauge("nv_cache_num_lookups", "Number of cache lookups in response cache", double(c.lookups));
    gauge("nv_cache_num_hits", "Number of cache hits in response cache", double(c.hits));
    gauge("nv_cache_num_misses", "Number of cache misses in response cache", double(c.misses));
    gauge("nv_cache_num_evictions", "Number of cache evictions in response cache", double(c.evictions));
    gauge("nv_cache_util", "Cache utilization [0.0 - 1.0]",
          c.capacity ? double(c.bytes) / double(c.capacity) : 0.0);
  }
  lifecycle_->CollectMetrics(w);
}

std::vector<repository::IndexEntry> Server::RepositoryIndex(bool ready_only) const {
  return lifecycle_->Index(ready_only);
}

absl::Status Server::CheckRepositoryControl(std::string_view name) const {
  if (auto st = repository::ValidateModelName(name); !st.ok()) return st;
  if (options_.control_mode != ControlMode::kExplicit &&
      options_.control_mode != ControlMode::kOnDemand) {
    return absl::FailedPreconditionError(
        "explicit model load / unload is not allowed unless --model-control-mode=explicit "
        "(or on-demand)");
  }
  return absl::OkStatus();
}

absl::Status Server::CheckLoadRequest(std::string_view name,
                                      const std::optional<std::string>& config_json,
                                      const std::map<std::string, std::string>& files) const {
  RETURN_IF_ERROR(CheckRepositoryControl(name));
  if (!files.empty() && !config_json) {
    return absl::InvalidArgumentError(StrCat(
        "failed to load '", name, "': parameter 'file:", files.begin()->first,
        "' needs the 'config' parameter too (the configuration of the model folder the files "
        "form)"));
  }
  for (const auto& [path, content] : files) {
    RETURN_IF_ERROR(repository::ValidateOverrideFilePath(path));
  }
  return absl::OkStatus();
}

absl::Status Server::LoadModelNow(const std::string& name,
                                  const std::optional<std::string>& config_json,
                                  const std::map<std::string, std::string>& files) {
  std::optional<config::ModelConfig> override_config;
  if (config_json) {
    auto cfg = config::ParseModelConfigJson(*config_json);
    if (!cfg.ok()) {
      // Triton's load errors start "failed to load '<m>'" and name a bad override "Invalid
      // config override"; tritonclient's simple_*_model_control.py examples look for the first.
      return absl::InvalidArgumentError(StrCat("failed to load '", name,
                                               "': Invalid config override: ",
                                               cfg.status().message()));
    }
    override_config = *std::move(cfg);
  }
  return lifecycle_->Load(name, override_config, files);
}

void Server::LoadModel(std::string name, std::optional<std::string> config_json,
                       std::function<void(absl::Status)> done,
                       std::map<std::string, std::string> files) {
  if (auto st = CheckLoadRequest(name, config_json, files); !st.ok()) {
    done(st);
    return;
  }
  auto task = [this, name = std::move(name), config_json = std::move(config_json),
               files = std::make_shared<std::map<std::string, std::string>>(std::move(files)),
               done]() { done(LoadModelNow(name, config_json, *files)); };
  if (!loader_->Submit(task)) {
    done(absl::UnavailableError("too many model loads queued; retry later"));
  }
}

void Server::UnloadModel(std::string name, std::function<void(absl::Status)> done,
                         bool unload_dependents) {
  if (auto st = CheckRepositoryControl(name); !st.ok()) {
    done(st);
    return;
  }
  auto task = [this, name = std::move(name), done, unload_dependents]() {
    done(lifecycle_->Unload(name, unload_dependents));
  };
  if (!loader_->Submit(task)) {
    done(absl::UnavailableError("too many model unloads queued; retry later"));
  }
}

absl::Status Server::LoadModelFromUrl(const std::string& name, const std::string& url) {
  return lifecycle_->LoadFromUrl(name, url);
}

absl::Status Server::ForgetModel(const std::string& name) {
  RETURN_IF_ERROR(repository::ValidateModelName(name));
  return lifecycle_->Forget(name);
}

std::map<std::string, std::string> Server::UrlModels() const { return lifecycle_->UrlModels(); }

bool Server::SubmitLoad(std::function<void()> task) { return loader_->Submit(std::move(task)); }

absl::Status Server::ValidateModelName(std::string_view name) {
  return repository::ValidateModelName(name);
}

}  // namespace inferd::server
