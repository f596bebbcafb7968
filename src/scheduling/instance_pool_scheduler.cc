#include "scheduling/instance_pool_scheduler.h"

#include "common/strings.h"

namespace inferd::scheduling {
namespace {

// When a request stops being worth running (0: never): its `timeout` from arrival, or the
// client's deadline, whichever is first.
uint64_t DeadlineOf(const core::InferRequest& r) {
  uint64_t d = r.timeout_us ? r.times.received_ns + r.timeout_us * 1000 : 0;
  if (r.deadline_ns != 0 && (d == 0 || r.deadline_ns < d)) d = r.deadline_ns;
  return d;
}

}  // namespace

InstancePoolScheduler::InstancePoolScheduler(
    std::string model_name, int64_t version,
    std::vector<std::unique_ptr<backends::ModelInstance>> instances, size_t max_queue_size,
    metrics::ModelStats* stats, DeadlineSweeper* sweeper)
    : max_queue_size_(max_queue_size),
      stats_(stats),
      pool_({.model_name = std::move(model_name),
             .version = version,
             .stats = stats,
             .caller_runs = true},
            std::move(instances), /*on_free=*/nullptr),
      sweep_(sweeper->Register([this](uint64_t now) { return Sweep(now); })) {}

InstancePoolScheduler::~InstancePoolScheduler() { Shutdown(); }

void InstancePoolScheduler::Enqueue(std::unique_ptr<core::InferRequest> request) {
  if (request->cancel) {
    // A cancellation wakes the sweeper, which answers the request at once.
    request->cancel->SetListener([client = sweep_.get()] { client->WakeNow(); });
  }
  const uint64_t deadline = DeadlineOf(*request);
  request->times.queue_start_ns = core::NowNs();
  Batch batch;
  batch.requests.push_back(std::move(request));
  if (deadline != 0) {
    batch.deadline_ns = deadline;
    batch.expired = [this](std::unique_ptr<core::InferRequest> r, uint64_t now) {
      Drop(std::move(r), now);
    };
  }
  pool_.SubmitAny(std::move(batch), max_queue_size_);
  if (deadline != 0) sweep_->WakeAt(deadline);
}

void InstancePoolScheduler::Drop(std::unique_ptr<core::InferRequest> request, uint64_t now) {
  if (request->cancel) request->cancel->ClearListener();
  const uint64_t deadline = DeadlineOf(*request);
  // The deadline first: gRPC cancels a call whose deadline passed, and that is a timeout.
  if (request->IsCancelled() && (deadline == 0 || now < deadline)) {
    stats_->RecordFailure(now - request->times.received_ns, metrics::FailureReason::kCanceled);
    absl::Status st = core::CancelledError(*request, now);
    core::CompleteWithError(std::move(request), std::move(st));
    return;
  }
  stats_->RecordFailure(now - request->times.received_ns, metrics::FailureReason::kTimeout);
  absl::Status st = core::DeadlineError(
      *request, now,
      request->timeout_us && request->times.received_ns + request->timeout_us * 1000 <= now
          ? StrCat("timeout ", request->timeout_us, " us")
          : std::string("the client's deadline"));
  core::CompleteWithError(std::move(request), std::move(st));
}

uint64_t InstancePoolScheduler::Sweep(uint64_t now) {
  uint64_t next = 0;
  std::vector<Batch> gone = pool_.TakeQueuedIf([&](const Batch& b) {
    const core::InferRequest& r = *b.requests.front();
    const uint64_t d = DeadlineOf(r);
    if (r.IsCancelled() || (d != 0 && now >= d)) return true;
    if (d != 0 && (next == 0 || d < next)) next = d;
    return false;
  });
  for (Batch& b : gone) {
    for (auto& r : b.requests) Drop(std::move(r), now);
  }
  return next;
}

// Everything queued runs: the instances take it as they free up.
void InstancePoolScheduler::Shutdown() { pool_.Shutdown(); }

size_t InstancePoolScheduler::Queued() const { return pool_.Queued(); }

size_t InstancePoolScheduler::InFlight() const { return pool_.InFlight(); }

}  // namespace inferd::scheduling
