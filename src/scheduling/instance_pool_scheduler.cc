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

bool Abandoned(const core::InferRequest& r, uint64_t now) {
  const uint64_t d = DeadlineOf(r);
  return r.IsCancelled() || (d != 0 && now >= d);
}

}  // namespace

InstancePoolScheduler::InstancePoolScheduler(
    std::string model_name, int64_t version,
    std::vector<std::unique_ptr<backends::ModelInstance>> instances, size_t max_queue_size,
    metrics::ModelStats* stats, DeadlineSweeper* sweeper)
    : model_name_(std::move(model_name)),
      version_(version),
      max_queue_size_(max_queue_size),
      stats_(stats),
      pool_({.model_name = model_name_, .version = version_, .stats = stats_},
            std::move(instances),
            [this](size_t) {
              std::vector<std::unique_ptr<core::InferRequest>> gone;
              const uint64_t now = core::NowNs();
              {
                inferd::MutexLock lock(&mu_);
                gone = DispatchLocked(now);
              }
              for (auto& r : gone) Drop(std::move(r), now);
            }),
      sweep_(sweeper->Register([this](uint64_t now) { return Sweep(now); })) {}

InstancePoolScheduler::~InstancePoolScheduler() { Shutdown(); }

void InstancePoolScheduler::Enqueue(std::unique_ptr<core::InferRequest> request) {
  absl::Status refused;
  if (request->cancel) {
    // Before mu_: a cancellation wakes the sweeper, which answers the request at once.
    request->cancel->SetListener([client = sweep_.get()] { client->WakeNow(); });
  }
  const uint64_t deadline = DeadlineOf(*request);
  std::vector<std::unique_ptr<core::InferRequest>> gone;
  const uint64_t now = core::NowNs();
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_) {
      refused = absl::UnavailableError(
          inferd::StrCat("model '", model_name_, "' version ", version_, " is unloading"));
    } else if (queue_.size() >= max_queue_size_) {
      refused = absl::UnavailableError(
          inferd::StrCat("model '", model_name_, "' has ", queue_.size(),
                       " requests queued, the limit (--max-queue-size); retry later"));
    } else {
      request->times.queue_start_ns = now;
      queue_.push_back(std::move(request));
      gone = DispatchLocked(now);
    }
  }
  if (!refused.ok()) {
    if (request->cancel) request->cancel->ClearListener();
    stats_->RecordFailure(core::NowNs() - request->times.received_ns,
                          metrics::FailureReason::kRejected);
    core::CompleteWithError(std::move(request), std::move(refused));
    return;
  }
  for (auto& r : gone) Drop(std::move(r), now);
  if (deadline != 0) sweep_->WakeAt(deadline);
}

std::vector<std::unique_ptr<core::InferRequest>> InstancePoolScheduler::DispatchLocked(
    uint64_t now) {
  std::vector<std::unique_ptr<core::InferRequest>> gone;
  while (!queue_.empty()) {
    if (Abandoned(*queue_.front(), now)) {  // never run what nobody waits for
      gone.push_back(std::move(queue_.front()));
      queue_.pop_front();
      continue;
    }
    const std::optional<size_t> free = pool_.FreeInstance();
    if (!free) break;
    Batch batch;
    batch.requests.push_back(std::move(queue_.front()));
    queue_.pop_front();
    pool_.Submit(*free, std::move(batch));
  }
  return gone;
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
  std::vector<std::unique_ptr<core::InferRequest>> gone;
  uint64_t next = 0;
  {
    inferd::MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (Abandoned(**it, now)) {
        gone.push_back(std::move(*it));
        it = queue_.erase(it);
        continue;
      }
      const uint64_t d = DeadlineOf(**it);
      if (d != 0 && (next == 0 || d < next)) next = d;
      ++it;
    }
  }
  for (auto& r : gone) Drop(std::move(r), now);
  return next;
}

void InstancePoolScheduler::Shutdown() {
  {
    inferd::MutexLock lock(&mu_);
    stopping_ = true;
    // Everything queued runs: the instances take it as they free up.
    mu_.Await(absl::Condition(this, &InstancePoolScheduler::Drained));
  }
  pool_.Shutdown();
}

size_t InstancePoolScheduler::Queued() const {
  inferd::MutexLock lock(&mu_);
  return queue_.size();
}

size_t InstancePoolScheduler::InFlight() const {
  inferd::MutexLock lock(&mu_);
  return queue_.size() + pool_.Executing();
}

}  // namespace inferd::scheduling
