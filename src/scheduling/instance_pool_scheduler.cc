#include "scheduling/instance_pool_scheduler.h"

#include "absl/time/time.h"
#include "common/strings.h"
#include "scheduling/run_cancellation.h"

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
    metrics::ModelStats* stats)
    : model_name_(std::move(model_name)),
      version_(version),
      max_queue_size_(max_queue_size),
      stats_(stats),
      instances_(std::move(instances)) {
  for (auto& instance : instances_) {
    workers_.emplace_back([this, inst = instance.get()] { WorkerLoop(inst); });
  }
  sweeper_ = std::thread([this] { SweeperLoop(); });
}

InstancePoolScheduler::~InstancePoolScheduler() { Shutdown(); }

void InstancePoolScheduler::Enqueue(std::unique_ptr<core::InferRequest> request) {
  absl::Status refused;
  if (request->cancel) {
    // Before mu_ (the listener takes it): a cancellation wakes the sweeper.
    request->cancel->SetListener([this] {
      inferd::MutexLock lock(&mu_);
      sweep_.Signal();
    });
  }
  const bool has_deadline = DeadlineOf(*request) != 0;
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
      request->times.queue_start_ns = core::NowNs();
      queue_.push_back(std::move(request));
    }
  }
  if (!refused.ok()) {
    if (request->cancel) request->cancel->ClearListener();
    stats_->RecordFailure(core::NowNs() - request->times.received_ns,
                          metrics::FailureReason::kRejected);
    core::CompleteWithError(std::move(request), std::move(refused));
    return;
  }
  work_available_.Signal();
  if (has_deadline) sweep_.Signal();
}

void InstancePoolScheduler::Drop(std::unique_ptr<core::InferRequest> request, uint64_t now) {
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

void InstancePoolScheduler::SweeperLoop() {
  mu_.Lock();
  while (!stopping_) {
    const uint64_t now = core::NowNs();
    std::vector<std::unique_ptr<core::InferRequest>> gone;
    uint64_t next = 0;
    for (auto it = queue_.begin(); it != queue_.end();) {
      const uint64_t d = DeadlineOf(**it);
      if ((*it)->IsCancelled() || (d != 0 && now >= d)) {
        gone.push_back(std::move(*it));
        it = queue_.erase(it);
        continue;
      }
      if (d != 0 && (next == 0 || d < next)) next = d;
      ++it;
    }
    if (!gone.empty()) {
      mu_.Unlock();
      for (auto& r : gone) {
        if (r->cancel) r->cancel->ClearListener();
        Drop(std::move(r), now);
      }
      mu_.Lock();
      continue;
    }
    if (next) {
      sweep_.WaitWithTimeout(&mu_, absl::Nanoseconds(next - now));
    } else {
      sweep_.Wait(&mu_);
    }
  }
  mu_.Unlock();
}

void InstancePoolScheduler::WorkerLoop(backends::ModelInstance* instance) {
  for (;;) {
    std::unique_ptr<core::InferRequest> request;
    {
      inferd::MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_available_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping and drained
      request = std::move(queue_.front());
      queue_.pop_front();
      ++executing_;
    }
    if (request->cancel) request->cancel->ClearListener();
    const uint64_t deadline = DeadlineOf(*request);
    if (request->IsCancelled() || (deadline != 0 && core::NowNs() >= deadline)) {
      Drop(std::move(request), core::NowNs());  // never run what nobody waits for
      inferd::MutexLock lock(&mu_);
      --executing_;
      continue;
    }
    auto response = std::make_unique<core::InferResponse>();
    response->model_name = model_name_;
    response->model_version = version_;
    response->id = request->id;
    request->times.compute_start_ns = core::NowNs();
    backends::ExecutionTimes times;
    core::InferRequest* reqs[1] = {request.get()};
    core::InferResponse* resps[1] = {response.get()};
    {
      RunCancellation run_cancel(instance, reqs);
      instance->Execute(reqs, resps, &times);
    }
    const uint64_t end = core::NowNs();
    if (times.input_end_ns == 0) times.input_end_ns = request->times.compute_start_ns;
    if (times.output_start_ns == 0) times.output_start_ns = end;
    const uint64_t input_ns = times.input_end_ns - request->times.compute_start_ns;
    const uint64_t infer_ns = times.output_start_ns - times.input_end_ns;
    const uint64_t output_ns = end - times.output_start_ns;
    request->times.compute_input_end_ns = times.input_end_ns;  // for the trace extension
    request->times.compute_output_start_ns = times.output_start_ns;
    request->times.compute_end_ns = end;
    if (response->status.ok()) {
      stats_->RecordExecution(request->batch_size, input_ns, infer_ns, output_ns);
    }
    Complete(std::move(request), std::move(response), input_ns, infer_ns, output_ns);
    {
      inferd::MutexLock lock(&mu_);
      --executing_;
    }
  }
}

void InstancePoolScheduler::Complete(std::unique_ptr<core::InferRequest> request,
                                     std::unique_ptr<core::InferResponse> response,
                                     uint64_t input_ns, uint64_t infer_ns, uint64_t output_ns) {
  const uint64_t end = core::NowNs();
  if (!response->status.ok() && request->IsCancelled()) {
    // The run was stopped because the client left.
    response->status = core::CancelledError(*request, end);
    response->outputs.clear();
    stats_->RecordFailure(end - request->times.received_ns, metrics::FailureReason::kCanceled);
  } else if (response->status.ok()) {
    stats_->RecordSuccess(end - request->times.received_ns,
                          request->times.compute_start_ns - request->times.queue_start_ns,
                          input_ns, infer_ns, output_ns, request->batch_size);
  } else {
    stats_->RecordFailure(end - request->times.received_ns, metrics::FailureReason::kBackend);
  }
  core::InferCallback cb = std::move(request->on_complete);
  request.reset();
  if (cb) cb(std::move(response));
}

void InstancePoolScheduler::Shutdown() {
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  work_available_.SignalAll();
  sweep_.SignalAll();
  if (sweeper_.joinable()) sweeper_.join();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
  workers_.clear();
}

size_t InstancePoolScheduler::Queued() const {
  inferd::MutexLock lock(&mu_);
  return queue_.size();
}

size_t InstancePoolScheduler::InFlight() const {
  inferd::MutexLock lock(&mu_);
  return queue_.size() + executing_;
}

}  // namespace inferd::scheduling
