#include "repository/model.h"

#include <set>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "common/strings.h"
#include "common/logging.h"
#include "config/model_config_util.h"
#include "repository/placement.h"
#include "scheduling/ensemble_scheduler.h"
#include "scheduling/scheduler_factory.h"
#include "scheduling/sequence_batcher.h"

namespace inferd::repository {

std::string NamespacedName(std::string_view ns, std::string_view name) {
  if (ns.empty()) return std::string(name);
  return inferd::StrCat(ns, "::", name);
}
namespace {

// Builds the request a model_warmup sample describes (Triton's rules: dims exclude the batch
// dimension; zero_data, random_data, or a file under <model>/warmup/ repeated per batch item).
absl::Status BuildWarmupRequest(const config::ModelConfig& config, const std::string& model_dir,
                                const inference::ModelWarmup& sample, core::InferRequest* req) {
  const bool batching = config.max_batch_size() > 0;
  const int64_t batch = std::max<uint32_t>(1, sample.batch_size());
  if (!batching && batch != 1) {
    return absl::InvalidArgumentError(StrCat("warmup '", sample.name(),
                                             "': batch_size must be 1 for a model that does not batch"));
  }
  req->batch_size = batch;
  std::mt19937 rng(42);
  for (const auto& [name, in] : sample.inputs()) {
    const DataType type = config::FromProto(in.data_type());
    Shape item(in.dims().begin(), in.dims().end());
    auto count = ElementCount(item);
    if (!count.ok() || type == DataType::kInvalid) {
      return absl::InvalidArgumentError(StrCat("warmup '", sample.name(), "' input '", name,
                                               "': invalid data_type or dims"));
    }
    std::string one;
    if (in.has_input_data_file()) {
      const std::string path = StrCat(model_dir, "/warmup/", in.input_data_file());
      std::ifstream f(path, std::ios::binary);
      if (!f) {
        return absl::NotFoundError(StrCat("warmup '", sample.name(), "' input '", name,
                                          "': cannot read '", path, "'"));
      }
      one.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } else if (type == DataType::kBytes) {
      for (int64_t i = 0; i < *count; ++i) one.append(4, '\0');  // empty strings
    } else {
      one.assign(static_cast<size_t>(*count) * DataTypeSize(type), '\0');
      if (in.has_random_data()) {
        for (auto& c : one) c = static_cast<char>(rng() & (type == DataType::kBool ? 1 : 0x3f));
      }
    }
    std::string& data = req->owned.emplace_back();
    for (int64_t b = 0; b < batch; ++b) data.append(one);
    core::InputTensor t;
    t.name = name;
    t.datatype = type;
    if (batching) t.shape.push_back(batch);
    t.shape.insert(t.shape.end(), item.begin(), item.end());
    t.data = data;
    req->inputs.push_back(std::move(t));
  }
  return absl::OkStatus();
}

// --metrics-config, with the histogram bounds a config's model_metrics sets (tritonserver's one
// customizable family).
absl::StatusOr<metrics::LatencyMetricsConfig> LatencyMetricsFor(const config::ModelConfig& config,
                                                                const LoadOptions& options) {
  metrics::LatencyMetricsConfig out = options.latency_metrics;
  for (const auto& control : config.model_metrics().metric_control()) {
    const std::string& family = control.metric_identifier().family();
    if (family != "nv_inference_first_response_histogram_ms") {
      // As tritonserver (its MetricModelReporter): the model loads, the entry changes nothing.
      LOG_WARNING << "model '" << config.name() << "': Metric family '" << family
                  << "' in 'metric_identifier' is not a customizable metric in Triton core.";
      continue;
    }
    const auto& buckets = control.histogram_options().buckets();
    for (int i = 1; i < buckets.size(); ++i) {
      if (!(buckets[i] > buckets[i - 1])) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model_metrics: the buckets of '", family, "' must increase"));
      }
    }
    out.first_response_buckets.assign(buckets.begin(), buckets.end());
  }
  return out;
}

// "on the CPU", or each instance with its device as Triton's log names them
// ("m_0_0 (GPU device 0), m_0_0 (GPU device 1)").
std::string DescribeDevices(const std::vector<backends::InstanceDevice>& devices) {
  bool any_gpu = false;
  for (const auto& d : devices) any_gpu |= d.gpu;
  if (!any_gpu) return "on the CPU";
  std::string out;
  for (const auto& d : devices) {
    inferd::StrAppend(&out, out.empty() ? "" : ", ", d.name, " (", d.gpu ? "GPU" : "CPU",
                      " device ", d.id, ")");
  }
  return out;
}

}  // namespace

std::map<int, int64_t> Model::ReportedGpuMemoryBytes() const {
  std::map<int, int64_t> reported;
  std::set<int> unknown;
  for (size_t i = 0; i < instances_.size() && i < devices_.size(); ++i) {
    if (!devices_[i].gpu) continue;
    const int64_t bytes = instances_[i]->DeviceMemoryBytes();
    if (bytes < 0) {
      unknown.insert(devices_[i].id);
    } else {
      reported[devices_[i].id] += bytes;
    }
  }
  for (int d : unknown) reported.erase(d);
  return reported;
}

absl::Status RunWarmup(const config::ModelConfig& config, const std::string& model_dir,
                       backends::ModelInstance* instance, size_t index) {
  for (const auto& sample : config.model_warmup()) {
    const uint32_t count = std::max<uint32_t>(1, sample.count());
    for (uint32_t i = 0; i < count; ++i) {
      core::InferRequest req;
      absl::Status st = BuildWarmupRequest(config, model_dir, sample, &req);
      if (!st.ok()) return st;
      core::InferResponse resp;
      core::InferRequest* reqs[1] = {&req};
      core::InferResponse* resps[1] = {&resp};
      backends::ExecutionTimes times;
      instance->Execute(reqs, resps, &times);
      if (!resp.status.ok()) {
        return absl::InvalidArgumentError(StrCat("model '", config.name(), "': warmup '",
                                                 sample.name(), "' failed on instance ", index,
                                                 ": ", resp.status.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Model>> Model::Load(const config::ModelConfig& config,
                                                   const std::string& model_dir, int64_t version,
                                                   backends::Backend* backend,
                                                   const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Model> model(new Model());
  model->config_ = config;
  model->version_ = version;
  model->model_namespace_ = options.model_namespace;
  auto latency_metrics = LatencyMetricsFor(config, options);
  if (!latency_metrics.ok()) return latency_metrics.status();
  model->stats_ = std::make_unique<metrics::ModelStats>(*latency_metrics);

  backends::ModelSpec spec;
  spec.config = &model->config_;
  if (config.has_sequence_batching()) {
    // The backend also binds the control inputs and the state tensors the scheduler supplies.
    auto backend_config = scheduling::SequenceBackendConfig(config);
    if (!backend_config.ok()) return backend_config.status();
    model->backend_config_ = *std::move(backend_config);
    spec.config = &model->backend_config_;
  }
  spec.model_dir = model_dir;
  spec.version_dir = inferd::StrCat(model_dir, "/", version);
  spec.version = version;
  const std::string filename = config::ModelFilename(config);
  spec.model_path = inferd::StrCat(spec.version_dir, "/", filename);
  spec.cpu_cores = options.cpu_cores;
  spec.strict_parameters = options.strict_parameters;

  // A backend that opens no file (identity, repeat: Triton's test backends, whose configs name
  // "model.<backend>" after the custom-backend auto-complete) needs none there.
  if (!filename.empty() && backend != nullptr && backend->ReadsModelFile() &&
      !std::filesystem::exists(spec.model_path)) {
    return absl::NotFoundError(inferd::StrCat("model '", config.name(), "' version ", version,
                                            ": model file '", spec.model_path, "' not found"));
  }

  auto labels = std::make_shared<LabelMap>();
  for (const auto& out : config.output()) {
    if (out.label_filename().empty()) continue;
    const std::string path = inferd::StrCat(model_dir, "/", out.label_filename());
    std::ifstream in(path);
    if (!in) {
      return absl::NotFoundError(inferd::StrCat("model '", config.name(), "': output '", out.name(),
                                                "' names label file '", path, "', which cannot be read"));
    }
    std::vector<std::string>& lines = (*labels)[out.name()];
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
    }
  }
  model->labels_ = std::move(labels);

  if (backend == nullptr) {
    auto graph = scheduling::BuildEnsembleGraph(model->config_);
    if (!graph.ok()) return graph.status();
    // A step the store resolved in a namespace (--model-namespacing) runs that copy.
    for (size_t i = 0; i < graph->steps.size(); ++i) {
      const auto& step = model->config_.ensemble_scheduling().step(static_cast<int>(i));
      graph->steps[i].model_name = NamespacedName(step.model_namespace(), step.model_name());
    }
    if (!options.dispatch) {
      return absl::FailedPreconditionError(
          inferd::StrCat("ensemble '", config.name(), "': this server cannot run ensembles"));
    }
    model->scheduler_ = std::make_unique<scheduling::EnsembleScheduler>(
        model->config_, version, *std::move(graph), options.dispatch, options.max_queue_size,
        model->stats_.get(), options.gpus);
    model->load_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    LOG_INFO << "loaded ensemble '" << config.name() << "' version " << version << ": "
             << config.ensemble_scheduling().step_size() << " step(s)";
    model->loaded_ = true;
    return model;
  }

  for (const auto& in : config.input()) {
    if (in.allow_ragged_batch() && !backend->SupportsRaggedBatch()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", config.name(), "': input '", in.name(),
          "' sets allow_ragged_batch, which backend '", backend->name(), "' does not support"));
    }
  }
  spec.dispatch = options.dispatch;
  spec.is_model_ready = options.is_model_ready;
  spec.custom_metrics = options.custom_metrics;
  spec.load_model = options.load_model;
  spec.unload_model = options.unload_model;
  std::vector<std::unique_ptr<backends::ModelInstance>> instances;
  auto placement = PlaceInstances(*spec.config, backend->GpuInstanceSupport(), options.placement);
  if (!placement.ok()) return placement.status();
  if (!placement->fallback_warning.empty()) LOG_WARNING << placement->fallback_warning;
  const std::vector<InstancePlacement>& places = placement->instances;
  spec.total_instances = static_cast<int>(places.size());
  {
    std::vector<absl::StatusOr<std::unique_ptr<backends::ModelInstance>>> created;
    for (size_t i = 0; i < places.size(); ++i) created.emplace_back(absl::UnknownError("not created"));
    auto create = [&](size_t i) {
      return backend->CreateInstanceOn(spec, *places[i].group, static_cast<int>(i),
                                       places[i].device);
    };
    if (backend->CreatesInstancesConcurrently() && places.size() > 1) {
      // The first read of a protobuf map field through reflection (ModelConfigToJson: the
      // Python backend hands each instance its config as JSON) builds the field's list form,
      // a write inside the shared config. Done once here, before the instances read the
      // config from several threads, every later read only reads.
      (void)config::ModelConfigToJson(*spec.config);
      std::vector<std::thread> threads;
      for (size_t i = 0; i < places.size(); ++i) {
        threads.emplace_back([&, i] { created[i] = create(i); });
      }
      for (auto& t : threads) t.join();
    } else {
      for (size_t i = 0; i < places.size(); ++i) {
        created[i] = create(i);
        if (!created[i].ok()) return created[i].status();
      }
    }
    for (auto& c : created) {
      if (!c.ok()) return c.status();
      instances.push_back(*std::move(c));
    }
  }
  for (const auto& p : places) model->devices_.push_back(p.device);
  for (const auto& inst : instances) model->instances_.push_back(inst.get());
  // Where the instances take inputs: one GPU for all of them, or the host.
  for (size_t i = 0; i < instances.size(); ++i) {
    const std::optional<int> on = instances[i]->GpuInputsOn();
    if (i == 0) model->gpu_inputs_on_ = on;
    if (on != model->gpu_inputs_on_) model->gpu_inputs_on_ = std::nullopt;
    if (!on.has_value()) break;
  }
  for (const auto& inst : instances) model->outputs_may_be_on_gpu_ |= inst->OutputsMayBeOnGpu();
  int threads = 0;
  for (const auto& inst : instances) threads += inst->ThreadCount();
  if (threads > options.cpu_cores) {
    LOG_WARNING << "model '" << config.name() << "': " << instances.size() << " instance(s) use "
                << threads << " compute threads on " << options.cpu_cores
                << " cores; they will compete for the cores";
  }
  const auto warmup_start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < instances.size(); ++i) {
    absl::Status st = RunWarmup(model->config_, model_dir, instances[i].get(), i);
    if (!st.ok()) return st;
  }
  const double warmup_secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - warmup_start).count();
  auto scheduler = scheduling::CreateScheduler(model->config_, model_dir, version,
                                               std::move(instances), options.max_queue_size,
                                               model->stats_.get());
  if (!scheduler.ok()) return scheduler.status();
  model->scheduler_ = *std::move(scheduler);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  model->load_seconds_ = secs;
  LOG_INFO << "loaded model '" << config.name() << "' version " << version << " on backend '"
           << backend->name() << "': " << spec.total_instances << " instance(s) ("
           << DescribeDevices(model->devices_) << "), max_batch_size "
           << config.max_batch_size() << ", " << threads << " compute thread(s) on "
           << options.cpu_cores << " core(s), scheduler "
           << scheduling::SchedulerName(config)
           << ", warmup "
           << config.model_warmup_size() << " sample(s) in " << warmup_secs << " s, total " << secs
           << " s";
  model->loaded_ = true;
  return model;
}

Model::~Model() {
  const auto start = std::chrono::steady_clock::now();
  if (scheduler_) scheduler_->Shutdown();
  scheduler_.reset();  // the instances: their memory is what the unload frees
  if (!loaded_) return;  // a load that failed part way: its error was logged
  LOG_INFO << "successfully unloaded '" << config_.name() << "' version " << version_ << " in "
           << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
           << " s, freed " << footprint_bytes_.load(std::memory_order_relaxed) << " bytes";
}

bool Model::InstancesReady() const {
  for (const auto* instance : instances_) {
    if (!instance->Ready()) return false;
  }
  return true;
}

void Model::Enqueue(std::unique_ptr<core::InferRequest> request) const {
  scheduler_->Enqueue(std::move(request));
}

}  // namespace inferd::repository
