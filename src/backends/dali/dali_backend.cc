#include "backends/dali/dali_backend.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "backends/dali/dali_ops.h"
#include "backends/dali/dali_pipeline.h"
#include "backends/module_backend.h"
#include "common/data_type.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "common/subprocess.h"

namespace inferd::backends {
namespace dali {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kParameters[] = {"num_threads", "device_id"};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::NotFoundError(inferd::StrCat("cannot open '", path, "'"));
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

template <typename T>
void Store(const FloatBuffer& v, char* out) {
  for (size_t i = 0; i < v.size(); ++i) {
    const T x = static_cast<T>(v[i]);
    std::memcpy(out + i * sizeof(T), &x, sizeof(T));
  }
}

// Writes `v` (already rounded for integer types) as `type` into `out`.
void WriteValues(DaliType type, const FloatBuffer& v, char* out) {
  switch (type) {
    case DaliType::kUint8: Store<uint8_t>(v, out); break;
    case DaliType::kUint16: Store<uint16_t>(v, out); break;
    case DaliType::kUint32: Store<uint32_t>(v, out); break;
    case DaliType::kUint64: Store<uint64_t>(v, out); break;
    case DaliType::kInt8: Store<int8_t>(v, out); break;
    case DaliType::kInt16: Store<int16_t>(v, out); break;
    case DaliType::kInt32: Store<int32_t>(v, out); break;
    case DaliType::kInt64: Store<int64_t>(v, out); break;
    case DaliType::kFloat: std::memcpy(out, v.data(), v.size() * sizeof(float)); break;
    case DaliType::kFloat64: Store<double>(v, out); break;
    case DaliType::kBool: Store<uint8_t>(v, out); break;
    case DaliType::kFloat16:
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = inferd::FloatToHalf(v[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    case DaliType::kNoType: break;
  }
}

template <typename T>
float Load(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return static_cast<float>(x);
}

// One element of a request tensor as float.
float ReadElement(DataType type, const char* p) {
  switch (type) {
    case DataType::kBool:
    case DataType::kUint8: return Load<uint8_t>(p);
    case DataType::kUint16: return Load<uint16_t>(p);
    case DataType::kUint32: return Load<uint32_t>(p);
    case DataType::kUint64: return Load<uint64_t>(p);
    case DataType::kInt8: return Load<int8_t>(p);
    case DataType::kInt16: return Load<int16_t>(p);
    case DataType::kInt32: return Load<int32_t>(p);
    case DataType::kInt64: return Load<int64_t>(p);
    case DataType::kFp32: return Load<float>(p);
    case DataType::kFp64: {
      double d;
      std::memcpy(&d, p, sizeof(d));
      if (std::isnan(d)) return static_cast<float>(d);
      return static_cast<float>(std::clamp<double>(d, -3.4028234663852886e38,
                                                   3.4028234663852886e38));
    }
    case DataType::kFp16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return inferd::HalfToFloat(h);
    }
    default: return 0.0f;
  }
}

// The pipeline file of a version folder: the configured file name, else model.dali, else
// dali.py (as Triton's DALI backend looks for them).
std::string PipelinePath(const std::string& version_dir, const std::string& filename) {
  if (!filename.empty()) return inferd::StrCat(version_dir, "/", filename);
  std::error_code ec;
  if (fs::exists(version_dir + "/model.dali", ec)) return version_dir + "/model.dali";
  if (fs::exists(version_dir + "/dali.py", ec)) return version_dir + "/dali.py";
  return version_dir + "/model.dali";
}

std::string PythonInterpreter() {
  const char* env = std::getenv("INFERD_DALI_PYTHON");
  return env != nullptr && *env ? env : "/usr/bin/python3";
}

absl::StatusOr<PipelineGraph> LoadPipeline(const std::string& path) {
  std::string bytes;
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, ".py") == 0) {
    auto serialized = SerializeDaliPy(PythonInterpreter(), path);
    if (!serialized.ok()) return serialized.status();
    bytes = *std::move(serialized);
  } else {
    auto read = ReadFile(path);
    if (!read.ok()) return read.status();
    bytes = *std::move(read);
  }
  return ParsePipeline(bytes);
}

// The loaded pipeline, shared by the instances of a model version. Immutable.
struct DaliModel {
  PipelineGraph graph;
  std::vector<std::unique_ptr<Operator>> ops;  // parallel to graph.ops; null for ExternalSource
};

absl::StatusOr<std::shared_ptr<const DaliModel>> BuildModel(const ModelSpec& spec) {
  const auto& cfg = *spec.config;
  auto graph = LoadPipeline(PipelinePath(spec.version_dir, cfg.default_model_filename()));
  if (!graph.ok()) {
    return absl::Status(graph.status().code(), inferd::StrCat("model '", cfg.name(), "': ",
                                                               graph.status().message()));
  }
  auto model = std::make_shared<DaliModel>();
  model->graph = *std::move(graph);
  std::vector<std::string> on_cpu;
  for (const OpNode& node : model->graph.ops) {
    if (node.op == "ExternalSource") {
      model->ops.push_back(nullptr);
      continue;
    }
    auto op = MakeOperator(node);
    if (!op.ok()) {
      return absl::Status(op.status().code(), inferd::StrCat("model '", cfg.name(), "': ",
                                                              op.status().message()));
    }
    model->ops.push_back(*std::move(op));
    if (node.device == "gpu" || node.device == "mixed") on_cpu.push_back(node.op);
  }
  if (!on_cpu.empty()) {
    LOG_WARNING << "model '" << cfg.name() << "': DALI operators placed on the GPU run on the CPU "
                << "in inferd: " << inferd::StrJoin(on_cpu, ", ");
  }
  // Inputs by name, both ways; outputs by position.
  for (const auto& in : cfg.input()) {
    bool found = false;
    for (const auto& ext : model->graph.inputs) found |= ext.name == in.name();
    if (!found) {
      std::vector<std::string> names;
      for (const auto& ext : model->graph.inputs) names.push_back(ext.name);
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", cfg.name(), "': input '", in.name(),
          "' is not an ExternalSource of the pipeline (it has ", inferd::StrJoin(names, ", "),
          ")"));
    }
  }
  for (const auto& ext : model->graph.inputs) {
    bool found = false;
    for (const auto& in : cfg.input()) found |= ext.name == in.name();
    if (!found) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "model '", cfg.name(), "': the pipeline's ExternalSource '", ext.name,
          "' has no input in config.pbtxt"));
    }
  }
  if (static_cast<size_t>(cfg.output_size()) != model->graph.outputs.size()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "model '", cfg.name(), "': config.pbtxt has ", cfg.output_size(),
        " outputs, the pipeline ", model->graph.outputs.size(),
        " (outputs map to the pipeline's outputs by position)"));
  }
  return model;
}

// One instance: runs the pipeline over each batch. Execute runs on one thread at a time and
// starts up to threads_ - 1 helpers per operator, joined before it returns.
class DaliInstance : public ModelInstance {
 public:
  DaliInstance(const config::ModelConfig* config, std::shared_ptr<const DaliModel> model,
               int threads)
      : config_(config), model_(std::move(model)), threads_(threads) {}

  int ThreadCount() const override { return threads_; }

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    times->input_end_ns = core::NowNs();
    FailBatchOnException("dali backend", responses, [&] { Run(requests, responses); });
    times->output_start_ns = core::NowNs();
  }

 private:

  // Appends the samples of request input `in` to `batch`: the rows of a [B, ...] tensor (one
  // sample, the whole tensor, when the model does not batch).
  absl::Status AddSamples(const core::InputTensor& in, const ExternalInput& ext,
                          std::string_view layout, Batch* batch, size_t* count) const {
    const bool batching = config_->max_batch_size() > 0;
    if (in.datatype == DataType::kBytes || in.datatype == DataType::kInvalid ||
        in.datatype == DataType::kBf16) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", in.name, "': ", DataTypeName(in.datatype), " is not a DALI type"));
    }
    Shape sample_shape = in.shape;
    int64_t rows = 1;
    if (batching) {
      if (in.shape.empty()) {
        return absl::InvalidArgumentError(
            inferd::StrCat("input '", in.name, "' has no batch dimension"));
      }
      rows = in.shape[0];
      sample_shape.erase(sample_shape.begin());
    }
    int64_t per_sample = 1;
    for (int64_t d : sample_shape) per_sample *= d;
    const size_t elem = DataTypeSize(in.datatype);
    if (rows < 0 || per_sample < 0 ||
        static_cast<size_t>(rows * per_sample) * elem != in.data.size()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "input '", in.name, "': ", in.data.size(), " bytes do not hold shape ",
          ShapeToString(in.shape)));
    }
    const DaliType type = FromDataType(in.datatype);
    for (int64_t r = 0; r < rows; ++r) {
      Sample s;
      s.type = type;
      s.shape = sample_shape;
      s.layout = std::string(layout);
      const std::string_view row =
          in.data.substr(static_cast<size_t>(r * per_sample) * elem, per_sample * elem);
      if (type == DaliType::kUint8) {
        s.bytes = row;
        s.is_view = true;
      } else {
        s.values.resize(static_cast<size_t>(per_sample));
        for (int64_t i = 0; i < per_sample; ++i) {
          s.values[i] = ReadElement(in.datatype, row.data() + i * elem);
        }
      }
      batch->push_back(std::move(s));
    }
    *count = static_cast<size_t>(rows);
    (void)ext;
    return absl::OkStatus();
  }

  void Run(std::span<core::InferRequest* const> requests,
           std::span<core::InferResponse* const> responses) {
    const PipelineGraph& g = model_->graph;
    // Each ExternalSource's batch, the requests' samples one after the other.
    absl::flat_hash_map<std::string, Batch> edges;
    std::vector<size_t> first(requests.size(), 0), count(requests.size(), 0);
    std::vector<bool> active(requests.size(), false);
    size_t total = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      const core::InferRequest& req = *requests[r];
      absl::Status st;
      std::vector<std::pair<const ExternalInput*, const core::InputTensor*>> feeds;
      for (const ExternalInput& ext : g.inputs) {
        const core::InputTensor* in = req.FindInput(ext.name);
        if (in == nullptr) {
          st = absl::InvalidArgumentError(inferd::StrCat("input '", ext.name, "' is missing"));
          break;
        }
        feeds.emplace_back(&ext, in);
      }
      // Validate every input of the request before adding any sample, so a bad request
      // leaves no samples behind.
      std::vector<Batch> staged(feeds.size());
      size_t n = 0;
      for (size_t k = 0; st.ok() && k < feeds.size(); ++k) {
        size_t rows = 0;
        st = AddSamples(*feeds[k].second, *feeds[k].first, LayoutOf(*feeds[k].first), &staged[k],
                        &rows);
        if (st.ok() && k > 0 && rows != n) {
          st = absl::InvalidArgumentError(inferd::StrCat(
              "inputs '", feeds[0].first->name, "' and '", feeds[k].first->name,
              "' hold different numbers of samples (", n, " and ", rows, ")"));
        }
        n = rows;
      }
      if (st.ok() && n == 0) st = absl::InvalidArgumentError("the request holds no samples");
      if (!st.ok()) {
        responses[r]->status = st;
        continue;
      }
      for (size_t k = 0; k < feeds.size(); ++k) {
        Batch& b = edges[feeds[k].first->edge];
        for (Sample& s : staged[k]) b.push_back(std::move(s));
      }
      active[r] = true;
      first[r] = total;
      count[r] = n;
      total += n;
    }
    if (total == 0) return;

    RunContext ctx;
    ctx.threads = threads_;
    ctx.batch_size = total;
    for (size_t i = 0; i < g.ops.size();) {
      const OpNode& node = g.ops[i];
      if (model_->ops[i] == nullptr) {  // ExternalSource: fed above
        ++i;
        continue;
      }
      if (model_->ops[i]->PerSample()) {
        i = RunChain(i, &edges, total);
        continue;
      }
      ++i;
      std::vector<const Batch*> inputs;
      for (const std::string& e : node.inputs) inputs.push_back(&edges[e]);
      Batch out;
      if (auto st = model_->ops[i]->Run(inputs, &out, ctx); !st.ok()) {
        FailBatch(responses, absl::Status(st.code(), inferd::StrCat(node.Label(), ": ", st.message())));
        return;
      }
      edges[node.output] = std::move(out);
    }

    for (size_t r = 0; r < requests.size(); ++r) {
      if (!active[r]) continue;
      auto st = Collect(*requests[r], edges, first[r], count[r], responses[r]);
      if (!st.ok()) {
        responses[r]->outputs.clear();
        responses[r]->status = st;
      }
    }
  }

  // Runs the chain of per-sample operators starting at op `start` sample by sample: one thread
  // takes a sample through the whole chain (better balanced than a barrier after each
  // operator). Returns the index of the first operator after the chain.
  size_t RunChain(size_t start, absl::flat_hash_map<std::string, Batch>* edges,
                  size_t total) const {
    const PipelineGraph& g = model_->graph;
    size_t end = start;
    while (end < g.ops.size() &&
           (model_->ops[end] == nullptr || model_->ops[end]->PerSample())) {
      if (model_->ops[end] != nullptr) (*edges)[g.ops[end].output].assign(total, Sample{});
      ++end;
    }
    // Pointers only after every key exists: the map may move its values on insertion.
    struct Step {
      const Operator* op;
      std::vector<const Batch*> inputs;
      Batch* output;
    };
    std::vector<Step> steps;
    for (size_t k = start; k < end; ++k) {
      if (model_->ops[k] == nullptr) continue;
      Step step{model_->ops[k].get(), {}, &(*edges)[g.ops[k].output]};
      for (const std::string& e : g.ops[k].inputs) step.inputs.push_back(&(*edges)[e]);
      steps.push_back(std::move(step));
    }
    RunContext one;
    one.batch_size = 1;
    ParallelFor(total, threads_, [&](size_t i) {
      std::vector<const Sample*> in;
      for (const Step& step : steps) {
        Sample& out = (*step.output)[i];
        in.clear();
        for (const Batch* b : step.inputs) {
          const Sample& s = (*b)[i];
          if (!s.error.ok()) {
            out.error = s.error;
            break;
          }
          in.push_back(&s);
        }
        if (!out.error.ok()) continue;
        absl::Status st = step.op->RunOneSample(in, one, &out);
        if (!st.ok()) out.error = st;
      }
    });
    return end;
  }

  std::string LayoutOf(const ExternalInput& ext) const {
    for (const OpNode& node : model_->graph.ops) {
      if (node.op == "ExternalSource" && node.output == ext.edge) {
        auto layout = node.String("layout", "");
        return layout.ok() ? *layout : "";
      }
    }
    return "";
  }

  absl::Status Collect(const core::InferRequest& req,
                       absl::flat_hash_map<std::string, Batch>& edges, size_t first,
                       size_t n, core::InferResponse* response) const {
    const bool batching = config_->max_batch_size() > 0;
    for (int o = 0; o < config_->output_size(); ++o) {
      const auto& out_cfg = config_->output(o);
      Batch& batch = edges.at(model_->graph.outputs[o]);
      for (size_t i = first; i < first + n; ++i) {
        if (!batch[i].error.ok()) {
          return absl::Status(batch[i].error.code(),
                              inferd::StrCat("sample ", i - first, ": ", batch[i].error.message()));
        }
      }
      if (!IsOutputRequested(req, out_cfg.name())) continue;
      const Sample& s0 = batch[first];
      for (size_t i = first + 1; i < first + n; ++i) {
        if (batch[i].shape != s0.shape) {
          return absl::InvalidArgumentError(inferd::StrCat(
              "output '", out_cfg.name(), "': the request's samples have different shapes (",
              ShapeToString(s0.shape), " and ", ShapeToString(batch[i].shape),
              "); a response tensor needs one shape: send them in separate requests"));
        }
      }
      const DataType type = ToDataType(s0.type);
      if (type != config::FromProto(out_cfg.data_type())) {
        return absl::InternalError(inferd::StrCat(
            "output '", out_cfg.name(), "': the pipeline produces ", DaliTypeName(s0.type),
            ", config.pbtxt declares ", config::ProtoTypeName(out_cfg.data_type())));
      }
      const auto& dims = out_cfg.dims();
      bool dims_ok = dims.size() == static_cast<int>(s0.shape.size());
      for (int d = 0; dims_ok && d < dims.size(); ++d) {
        dims_ok = dims[d] == -1 || dims[d] == s0.shape[d];
      }
      if (!dims_ok) {
        return absl::InternalError(inferd::StrCat(
            "output '", out_cfg.name(), "': the pipeline produces samples of shape ",
            ShapeToString(s0.shape), ", config.pbtxt declares dims ",
            ShapeToString(Shape(dims.begin(), dims.end()))));
      }
      if (!batching && n != 1) {
        return absl::InvalidArgumentError("a model without batching takes one sample a request");
      }
      const size_t elem = DataTypeSize(type);
      const size_t per = s0.NumElements();
      const bool listed_twice = std::count(model_->graph.outputs.begin(),
                                           model_->graph.outputs.end(),
                                           model_->graph.outputs[o]) > 1;
      if (n == 1 && s0.type == DaliType::kFloat && !s0.is_view && !listed_twice) {
        // One FLOAT sample: the response holds its values, no copy.
        auto values = std::make_shared<FloatBuffer>(std::move(batch[first].values));
        core::OutputTensor out;
        out.name = out_cfg.name();
        out.datatype = type;
        out.shape = batch[first].shape;
        if (batching) out.shape.insert(out.shape.begin(), 1);
        out.data = std::string_view(reinterpret_cast<const char*>(values->data()),
                                    values->size() * sizeof(float));
        out.holder = std::move(values);
        response->outputs.push_back(std::move(out));
        continue;
      }
      // Every byte is written below: no zeroing.
      std::shared_ptr<double[]> buffer(new double[(n * per * elem + 7) / 8]);
      char* base = reinterpret_cast<char*>(buffer.get());
      for (size_t i = 0; i < n; ++i) {
        const Sample& s = batch[first + i];
        if (s.is_view) {  // an input passed straight through
          std::memcpy(base + i * per * elem, s.bytes.data(), s.bytes.size());
        } else {
          WriteValues(s0.type, s.values, base + i * per * elem);
        }
      }
      core::OutputTensor out;
      out.name = out_cfg.name();
      out.datatype = type;
      out.shape = s0.shape;
      if (batching) out.shape.insert(out.shape.begin(), static_cast<int64_t>(n));
      out.data = std::string_view(base, n * per * elem);
      out.holder = std::move(buffer);
      response->outputs.push_back(std::move(out));
    }
    return absl::OkStatus();
  }

  const config::ModelConfig* config_;
  const std::shared_ptr<const DaliModel> model_;
  const int threads_;
};

inference::DataType ProtoType(DaliType t) { return config::ToProto(ToDataType(t)); }

class DaliBackend : public Backend {
 public:
  std::string_view name() const override { return "dali"; }
  // Each request's samples are taken from its own tensors: encoded images of different
  // lengths share a batch.
  bool SupportsRaggedBatch() const override { return true; }

  // Triton's DALI backend auto-complete: inputs from the ExternalSources (ragged batches
  // allowed), outputs from the pipeline's outputs by position, max_batch_size from the
  // pipeline's batch size.
  absl::Status AutoCompleteConfig(const std::string& model_path,
                                  config::ModelConfig* config) override {
    auto graph = LoadPipeline(model_path);
    if (!graph.ok()) {
      return absl::Status(graph.status().code(), inferd::StrCat("model '", config->name(),
                                                                 "': ", graph.status().message()));
    }
    absl::flat_hash_map<std::string, OutputMeta> meta;
    for (const OpNode& node : graph->ops) {
      std::vector<OutputMeta> ins;
      for (const auto& e : node.inputs) ins.push_back(meta[e]);
      meta[node.output] = InferOutputMeta(node, ins);
    }
    for (const ExternalInput& ext : graph->inputs) {
      inference::ModelInput* in = nullptr;
      for (auto& c : *config->mutable_input()) {
        if (c.name() == ext.name) in = &c;
      }
      if (in == nullptr) {
        in = config->add_input();
        in->set_name(ext.name);
        in->set_data_type(ProtoType(ext.dtype == DaliType::kNoType ? DaliType::kUint8 : ext.dtype));
        for (int d = 0; d < std::max(ext.ndim, 1); ++d) in->add_dims(-1);
      }
      in->set_allow_ragged_batch(true);
    }
    for (size_t i = config->output_size(); i < graph->outputs.size(); ++i) {
      const OutputMeta m = meta[graph->outputs[i]];
      if (m.type == DaliType::kNoType || m.ndim < 0) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", config->name(), "': config.pbtxt lists no output ", i,
            " and its type or rank does not follow from the pipeline: add it to config.pbtxt"));
      }
      auto* out = config->add_output();
      out->set_name(inferd::StrCat("DALI_OUTPUT_", i));
      out->set_data_type(ProtoType(m.type));
      for (int d = 0; d < m.ndim; ++d) out->add_dims(-1);
    }
    if (config->max_batch_size() == 0) config->set_max_batch_size(graph->batch_size);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& /*group*/,
      int index) override {
    if (auto st = CheckConfigSupport(spec, name(), {.parameters = kParameters}, index);
        !st.ok()) {
      return st;
    }
    // One pipeline for all the instances of a version (they are created one after another).
    std::shared_ptr<const DaliModel> model;
    {
      inferd::MutexLock lock(&mu_);
      if (auto it = cache_.find(spec.config); it != cache_.end()) model = it->second.lock();
    }
    if (model == nullptr) {
      auto built = BuildModel(spec);
      if (!built.ok()) return built.status();
      model = *std::move(built);
      inferd::MutexLock lock(&mu_);
      absl::erase_if(cache_, [](const auto& e) { return e.second.expired(); });
      cache_[spec.config] = model;
    }
    // num_threads as DALI's backend reads it (a string parameter), else the pipeline's own,
    // bounded by this instance's share of the cores.
    int threads = model->graph.num_threads;
    if (auto p = config::GetParameter(*spec.config, "num_threads"); p.has_value()) {
      char* end = nullptr;
      const long v = std::strtol(p->c_str(), &end, 10);
      if (p->empty() || *end != '\0' || v < 1 || v > 1024) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "model '", spec.config->name(), "': parameter 'num_threads' must be a positive "
            "integer, got '", *p, "'"));
      }
      threads = static_cast<int>(v);
    }
    const int share = std::max(1, spec.cpu_cores / std::max(1, spec.total_instances));
    threads = std::clamp(threads, 1, share);
    return std::make_unique<DaliInstance>(spec.config, std::move(model), threads);
  }

 private:
  inferd::Mutex mu_;
  // Keyed by the config a model version's instances share; weak so unloading frees it.
  absl::flat_hash_map<const config::ModelConfig*, std::weak_ptr<const DaliModel>> cache_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::string PyDaliDirectory() {
  std::error_code ec;
  if (const char* env = std::getenv("INFERD_DALI_PYTHON_DIR"); env != nullptr && *env) return env;
  const std::string exe = ExecutableDirectory();
  for (const std::string& dir : {exe + "/dali_python", exe + "/../lib/inferd/dali_python"}) {
    if (fs::is_regular_file(dir + "/inferd_dali_serialize.py", ec)) return dir;
  }
  return INFERD_DALI_PYTHON_SOURCE_DIR;
}

absl::StatusOr<std::string> SerializeDaliPy(const std::string& python,
                                            const std::string& dali_py) {
  std::string tmpl = (fs::temp_directory_path() / "inferd-dali-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(
        inferd::StrCat("cannot create a temporary directory: ", std::strerror(errno)));
  }
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  const std::string out_path = dir + "/model.dali";
  const std::string log_path = dir + "/log.txt";
  const std::string script = PyDaliDirectory() + "/inferd_dali_serialize.py";

  SpawnOptions child;
  for (std::string& kv : CurrentEnvironment()) {
    if (kv.rfind("PYTHONPATH=", 0) != 0) child.env.push_back(std::move(kv));
  }
  // Our nvidia.dali first: a real DALI installed on the machine must not be picked up.
  child.env.push_back("PYTHONPATH=" + PyDaliDirectory());
  child.program = python;
  child.argv = {python, script, dali_py, out_path};

  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) return absl::InternalError("cannot create the serializer's log file");
  child.stdin_dev_null = true;
  child.fds = {{log_fd, 1}, {log_fd, 2}};
  absl::StatusOr<pid_t> pid = SpawnProcess(child);
  close(log_fd);
  if (!pid.ok()) {
    return absl::FailedPreconditionError(inferd::StrCat(
        "cannot start '", python, "' to serialize ", dali_py, ": ", pid.status().message()));
  }
  const int status = WaitForExit(*pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    auto log = ReadFile(log_path);
    std::string tail = log.ok() ? *log : "";
    if (tail.size() > 2000) tail = tail.substr(tail.size() - 2000);
    return absl::InvalidArgumentError(
        inferd::StrCat("serializing ", dali_py, " failed: ", tail));
  }
  return ReadFile(out_path);
}

}  // namespace dali

std::unique_ptr<Backend> MakeDaliBackend() { return std::make_unique<dali::DaliBackend>(); }

}  // namespace inferd::backends
