#include "scheduling/instance_pool_scheduler.h"

#include "common/strings.h"

namespace inferd::scheduling {

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
}

InstancePoolScheduler::~InstancePoolScheduler() { Shutdown(); }

void InstancePoolScheduler::Enqueue(std::unique_ptr<core::InferRequest> request) {
  absl::Status refused;
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
    stats_->RecordFailure(core::NowNs() - request->times.received_ns,
                          metrics::FailureReason::kRejected);
    core::CompleteWithError(std::move(request), std::move(refused));
    return;
  }
  work_available_.Signal();
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
    auto response = std::make_unique<core::InferResponse>();
    response->model_name = model_name_;
    response->model_version = version_;
    response->id = request->id;
    request->times.compute_start_ns = core::NowNs();
    backends::ExecutionTimes times;
    core::InferRequest* reqs[1] = {request.get()};
    core::InferResponse* resps[1] = {response.get()};
    instance->Execute(reqs, resps, &times);
    const uint64_t end = core::NowNs();
    if (times.input_end_ns == 0) times.input_end_ns = request->times.compute_start_ns;
    if (times.output_start_ns == 0) times.output_start_ns = end;
    const uint64_t input_ns = times.input_end_ns - request->times.compute_start_ns;
    const uint64_t infer_ns = times.output_start_ns - times.input_end_ns;
    const uint64_t output_ns = end - times.output_start_ns;
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
  if (response->status.ok()) {
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
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
  workers_.clear();
}

size_t InstancePoolScheduler::InFlight() const {
  inferd::MutexLock lock(&mu_);
  return queue_.size() + executing_;
}

}  // namespace inferd::scheduling
