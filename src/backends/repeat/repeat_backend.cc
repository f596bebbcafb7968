#include "backends/repeat/repeat_backend.h"

#include <cstring>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/strings.h"

namespace inferd::backends {
namespace {

// OUT and IDX of one response, kept alive by the response's holders.
struct Element {
  int32_t out = 0;
  uint32_t idx = 0;
};

// What one request's response thread needs; the request itself is gone once Execute returns.
struct Job {
  std::shared_ptr<core::ResponseSender> sender;
  std::vector<int32_t> in;
  std::vector<uint32_t> delay_ms;
  bool want_out = true;
  bool want_idx = true;
};

Shape Dims(const inference::ModelInput& t) { return {t.dims().begin(), t.dims().end()}; }
Shape Dims(const inference::ModelOutput& t) { return {t.dims().begin(), t.dims().end()}; }

// Triton's repeat backend checks, with its messages.
absl::Status ValidateConfig(const config::ModelConfig& cfg) {
  auto fail = [&](std::string what) {
    return absl::InvalidArgumentError(inferd::StrCat("repeat model '", cfg.name(), "': ", what));
  };
  if (cfg.max_batch_size() != 0) {
    return fail("repeat backend only supports models with max_batch_size == 0");
  }
  if (cfg.input_size() != 3) return fail(inferd::StrCat("expected 3 inputs, got ", cfg.input_size()));
  if (cfg.output_size() != 2) return fail(inferd::StrCat("expected 2 outputs, got ", cfg.output_size()));
  const char* in_names[] = {"IN", "DELAY", "WAIT"};
  const char* in_pos[] = {"first", "second", "third"};
  for (int i = 0; i < 3; ++i) {
    if (cfg.input(i).name() != in_names[i]) {
      return fail(inferd::StrCat("expected ", in_pos[i], " input tensor name to be ", in_names[i],
                                 ", got ", cfg.input(i).name()));
    }
  }
  const char* out_names[] = {"OUT", "IDX"};
  for (int i = 0; i < 2; ++i) {
    if (cfg.output(i).name() != out_names[i]) {
      return fail(inferd::StrCat("expected ", in_pos[i], " output tensor name to be ", out_names[i],
                                 ", got ", cfg.output(i).name()));
    }
  }
  const Shape in = Dims(cfg.input(0)), delay = Dims(cfg.input(1)), wait = Dims(cfg.input(2));
  const Shape out = Dims(cfg.output(0)), idx = Dims(cfg.output(1));
  if (in.size() != 1) return fail("expected IN shape to have one dimension, got " + ShapeToString(in));
  if (in != delay) {
    return fail("expected IN and DELAY shape to match, got " + ShapeToString(in) + " and " +
                ShapeToString(delay));
  }
  const Shape one = {1};
  if (wait != one) return fail("expected WAIT shape to be [1], got " + ShapeToString(wait));
  if (out != one) return fail("expected OUT shape to be [1], got " + ShapeToString(out));
  if (idx != one) return fail("expected IDX shape to be [1], got " + ShapeToString(idx));
  struct Want {
    const char* name;
    inference::DataType got;
    inference::DataType want;
    const char* want_name;
  } types[] = {{"IN", cfg.input(0).data_type(), inference::TYPE_INT32, "INT32"},
               {"DELAY", cfg.input(1).data_type(), inference::TYPE_UINT32, "UINT32"},
               {"WAIT", cfg.input(2).data_type(), inference::TYPE_UINT32, "UINT32"},
               {"OUT", cfg.output(0).data_type(), inference::TYPE_INT32, "INT32"},
               {"IDX", cfg.output(1).data_type(), inference::TYPE_UINT32, "UINT32"}};
  for (const auto& t : types) {
    if (t.got != t.want) {
      return fail(inferd::StrCat("expected ", t.name, " datatype to be ", t.want_name, ", got ",
                                 inference::DataType_Name(t.got)));
    }
  }
  if (!cfg.model_transaction_policy().decoupled()) {
    return fail(
        "the repeat backend sends several responses per request: set "
        "model_transaction_policy { decoupled: true }");
  }
  return absl::OkStatus();
}

class RepeatInstance : public ModelInstance {
 public:
  explicit RepeatInstance(std::string model_name) : model_name_(std::move(model_name)) {}

  // Response threads still running stop early (each sends UNAVAILABLE as its final response),
  // so unloading never waits out long DELAYs.
  ~RepeatInstance() override {
    std::list<std::thread> threads;
    {
      inferd::MutexLock lock(&mu_);
      stopping_ = true;
      threads.swap(threads_);
    }
    wake_.SignalAll();
    for (auto& t : threads) t.join();
  }

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    times->input_end_ns = core::NowNs();
    ReapFinished();
    uint32_t wait_ms = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      const core::InferRequest& req = *requests[r];
      if (req.response_sender == nullptr) {
        responses[r]->status = absl::InternalError(inferd::StrCat(
            "repeat model '", model_name_, "' got a request without a response sender"));
        continue;
      }
      auto job = std::make_unique<Job>();
      job->sender = req.response_sender;
      absl::Status st = ReadRequest(req, job.get(), &wait_ms);
      if (!st.ok()) {
        // As Triton's repeat backend: one error response, final, for this request.
        (void)job->sender->SendError(std::move(st));
        continue;
      }
      Start(std::move(job));
    }
    // Triton's repeat holds the instance WAIT ms (the last request's) before releasing.
    if (wait_ms > 0) Sleep(wait_ms);
    times->output_start_ns = core::NowNs();
  }

 private:
  static absl::Status ReadRequest(const core::InferRequest& req, Job* job, uint32_t* wait_ms) {
    const core::InputTensor* wait = req.FindInput("WAIT");
    const core::InputTensor* in = req.FindInput("IN");
    const core::InputTensor* delay = req.FindInput("DELAY");
    if (wait == nullptr || in == nullptr || delay == nullptr) {
      return absl::InvalidArgumentError(
          inferd::StrCat("input '", wait == nullptr ? "WAIT" : in == nullptr ? "IN" : "DELAY",
                         "' is missing"));
    }
    if (wait->data.size() != sizeof(uint32_t)) {
      return absl::InvalidArgumentError("unexpected size for WAIT input");
    }
    std::memcpy(wait_ms, wait->data.data(), sizeof(uint32_t));
    if (in->shape != delay->shape) {
      return absl::InvalidArgumentError("expected IN and DELAY shape to match, got " +
                                        ShapeToString(in->shape) + " and " +
                                        ShapeToString(delay->shape));
    }
    const size_t n = in->data.size() / sizeof(int32_t);
    job->in.resize(n);
    job->delay_ms.resize(n);
    if (n > 0) {
      std::memcpy(job->in.data(), in->data.data(), n * sizeof(int32_t));
      std::memcpy(job->delay_ms.data(), delay->data.data(), n * sizeof(uint32_t));
    }
    job->want_out = IsOutputRequested(req, "OUT");
    job->want_idx = IsOutputRequested(req, "IDX");
    return absl::OkStatus();
  }

  void Start(std::unique_ptr<Job> job) {
    inferd::MutexLock lock(&mu_);
    auto it = threads_.emplace(threads_.end());
    *it = std::thread([this, j = std::shared_ptr<Job>(std::move(job)), it] {
      Respond(*j);
      inferd::MutexLock done_lock(&mu_);
      finished_.push_back(it);
    });
  }

  // Joins the threads that have sent their final flag.
  void ReapFinished() {
    std::vector<std::thread> done;
    {
      inferd::MutexLock lock(&mu_);
      for (auto it : finished_) {
        done.push_back(std::move(*it));
        threads_.erase(it);
      }
      finished_.clear();
    }
    for (auto& t : done) t.join();
  }

  // False when the instance is being destroyed.
  bool Sleep(uint32_t ms) {
    const absl::Time until = absl::Now() + absl::Milliseconds(ms);
    inferd::MutexLock lock(&mu_);
    while (!stopping_) {
      const absl::Duration left = until - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      wake_.WaitWithTimeout(&mu_, left);
    }
    return !stopping_;
  }

  void Respond(const Job& job) {
    core::ResponseSender& sender = *job.sender;
    for (size_t e = 0; e < job.in.size(); ++e) {
      if (sender.IsCancelled()) {
        LOG_INFO << "repeat model '" << model_name_ << "': request cancelled after " << e
                 << " of " << job.in.size() << " responses";
        break;
      }
      if (job.delay_ms[e] > 0 && !Sleep(job.delay_ms[e])) {
        (void)sender.SendError(absl::UnavailableError(
            inferd::StrCat("model '", model_name_, "' is unloading")));
        return;
      }
      auto value = std::make_shared<Element>();
      value->out = job.in[e];
      value->idx = static_cast<uint32_t>(e);
      auto response = sender.MakeResponse();
      if (job.want_out) {
        response->outputs.push_back(
            {"OUT", DataType::kInt32, {1},
             std::string_view(reinterpret_cast<const char*>(&value->out), sizeof(int32_t)), value});
      }
      if (job.want_idx) {
        response->outputs.push_back(
            {"IDX", DataType::kUint32, {1},
             std::string_view(reinterpret_cast<const char*>(&value->idx), sizeof(uint32_t)), value});
      }
      (void)sender.Send(std::move(response), /*final=*/false);
    }
    // As Triton's repeat: the final flag alone, after the last response (or none for an
    // empty IN).
    (void)sender.SendFinal();
  }

  const std::string model_name_;
  inferd::Mutex mu_;
  inferd::CondVar wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::list<std::thread>::iterator> finished_ ABSL_GUARDED_BY(mu_);
};

class RepeatBackend : public Backend {
 public:
  std::string_view name() const override { return "repeat"; }
  bool ReadsModelFile() const override { return false; }
  bool SupportsDecoupled() const override { return true; }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    if (auto st = CheckConfigSupport(spec, name(), {}, index); !st.ok()) return st;
    if (auto st = ValidateConfig(*spec.config); !st.ok()) return st;
    return std::make_unique<RepeatInstance>(spec.config->name());
  }
};

}  // namespace

std::unique_ptr<Backend> MakeRepeatBackend() { return std::make_unique<RepeatBackend>(); }

}  // namespace inferd::backends
