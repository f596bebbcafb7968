// Which scheduler runs a model with instances (ensembles have their own): the sequence batcher
// for sequence_batching, the dynamic batcher for dynamic_batching, the default scheduler
// otherwise; all of them run their batches on one InstancePool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "config/model_config_util.h"
#include "metrics/model_stats.h"
#include "scheduling/scheduler.h"

namespace inferd::scheduling {

// `config` is the client-visible config; `model_dir` holds what a scheduler reads from the
// model (a sequence's initial state). Takes the instances; `stats` must outlive the scheduler.
// Fails with INVALID_ARGUMENT naming what is wrong in the scheduling part of the config.
absl::StatusOr<std::unique_ptr<Scheduler>> CreateScheduler(
    const config::ModelConfig& config, const std::string& model_dir, int64_t version,
    std::vector<std::unique_ptr<backends::ModelInstance>> instances, size_t max_queue_size,
    metrics::ModelStats* stats);

// The name of the scheduler CreateScheduler picks, for the log.
std::string_view SchedulerName(const config::ModelConfig& config);

}  // namespace inferd::scheduling
