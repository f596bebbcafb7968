#include "repository/model.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/strings.h"
#include "common/logging.h"
#include "scheduling/instance_pool_scheduler.h"

namespace inferd::repository {

absl::StatusOr<std::shared_ptr<Model>> Model::Load(const config::ModelConfig& config,
                                                   const std::string& model_dir, int64_t version,
                                                   backends::Backend* backend,
                                                   const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Model> model(new Model());
  model->config_ = config;
  model->version_ = version;
  model->stats_ = std::make_unique<metrics::ModelStats>();

  backends::ModelSpec spec;
  spec.config = &model->config_;
  spec.model_dir = model_dir;
  spec.version_dir = inferd::StrCat(model_dir, "/", version);
  spec.version = version;
  spec.model_path = inferd::StrCat(spec.version_dir, "/", config.default_model_filename());
  spec.cpu_cores = options.cpu_cores;
  spec.total_instances = 0;
  for (const auto& g : config.instance_group()) spec.total_instances += g.count();

  if (!config.default_model_filename().empty() &&
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

  std::vector<std::unique_ptr<backends::ModelInstance>> instances;
  int index = 0;
  for (const auto& group : config.instance_group()) {
    if (group.kind() == inference::ModelInstanceGroup::KIND_GPU) {
      return absl::FailedPreconditionError(inferd::StrCat(
          "model '", config.name(), "': instance_group '", group.name(),
          "' asks for KIND_GPU but no GPU is available; use KIND_CPU or KIND_AUTO"));
    }
    for (int i = 0; i < group.count(); ++i) {
      auto instance = backend->CreateInstance(spec, group, index++);
      if (!instance.ok()) return instance.status();
      instances.push_back(*std::move(instance));
    }
  }
  model->scheduler_ = std::make_unique<scheduling::InstancePoolScheduler>(
      config.name(), version, std::move(instances), options.max_queue_size,
      model->stats_.get());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG_INFO << "loaded model '" << config.name() << "' version " << version << " on backend '"
           << backend->name() << "': " << spec.total_instances << " instance(s), max_batch_size "
           << config.max_batch_size() << ", " << secs << " s";
  return model;
}

Model::~Model() {
  if (scheduler_) scheduler_->Shutdown();
}

void Model::Enqueue(std::unique_ptr<core::InferRequest> request) const {
  scheduler_->Enqueue(std::move(request));
}

}  // namespace inferd::repository
