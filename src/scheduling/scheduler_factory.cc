#include "scheduling/scheduler_factory.h"

#include "scheduling/dynamic_batcher.h"
#include "scheduling/instance_pool_scheduler.h"
#include "scheduling/sequence_batcher.h"

namespace inferd::scheduling {

absl::StatusOr<std::unique_ptr<Scheduler>> CreateScheduler(
    const config::ModelConfig& config, const std::string& model_dir, int64_t version,
    std::vector<std::unique_ptr<backends::ModelInstance>> instances, size_t max_queue_size,
    metrics::ModelStats* stats) {
  if (config.has_sequence_batching()) {
    auto batcher = SequenceBatcher::Create(config, model_dir, version, std::move(instances),
                                           max_queue_size, stats);
    if (!batcher.ok()) return batcher.status();
    return std::unique_ptr<Scheduler>(*std::move(batcher));
  }
  if (config.has_dynamic_batching()) {
    return std::make_unique<DynamicBatcher>(config, version, std::move(instances), max_queue_size,
                                            stats);
  }
  return std::make_unique<InstancePoolScheduler>(config.name(), version, std::move(instances),
                                                 max_queue_size, stats);
}

std::string_view SchedulerName(const config::ModelConfig& config) {
  if (config.has_sequence_batching()) return "sequence batching";
  if (config.has_dynamic_batching()) return "dynamic batching";
  return "default";
}

}  // namespace inferd::scheduling
