#include "backends/identity/identity_backend.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/strings.h"

namespace inferd::backends {
namespace {

// The parameter Triton's identity backend reads to stand for a slow model: each execution
// takes this long (an interruptible wait: CancelExecution ends it, failing the batch).
constexpr std::string_view kIdentityParameters[] = {"execute_delay_ms"};

class IdentityInstance : public ModelInstance {
 public:
  IdentityInstance(const config::ModelConfig* config, int64_t delay_ms)
      : config_(config), delay_ms_(delay_ms) {}

  // Copies bytes; with execute_delay_ms it stands for a slow model and keeps its thread.
  bool RunsOnAnyThread() const override { return delay_ms_ == 0; }

  void CancelExecution() override {
    inferd::MutexLock lock(&mu_);
    if (!waiting_) return;
    cancelled_ = true;
    cv_.Signal();
  }

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    // The delay and the copy are this model's compute: perf_analyzer's "compute infer" (Triton's
    // identity backend stamps compute start/end around its copy). Inputs need no preparing.
    times->input_end_ns = core::NowNs();
    if (delay_ms_ > 0) {
      inferd::MutexLock lock(&mu_);
      waiting_ = true;
      const absl::Time until = absl::Now() + absl::Milliseconds(delay_ms_);
      while (!cancelled_ && absl::Now() < until) cv_.WaitWithTimeout(&mu_, until - absl::Now());
      const bool cancelled = cancelled_;
      waiting_ = false;
      cancelled_ = false;
      if (cancelled) {
        FailBatch(responses, absl::CancelledError("identity: execution cancelled"));
        return;
      }
    }
    for (size_t r = 0; r < requests.size(); ++r) {
      const core::InferRequest& req = *requests[r];
      core::InferResponse& resp = *responses[r];
      const int n = std::min(config_->input_size(), config_->output_size());
      for (int i = 0; i < n; ++i) {
        const auto& out_cfg = config_->output(i);
        if (!IsOutputRequested(req, out_cfg.name())) continue;
        const core::InputTensor* in = req.FindInput(config_->input(i).name());
        if (in == nullptr) continue;  // optional input not sent
        auto data = std::make_shared<std::string>(in->data);
        core::OutputTensor out;
        out.name = out_cfg.name();
        out.datatype = in->datatype;
        out.shape = in->shape;
        out.data = *data;
        out.holder = std::move(data);
        resp.outputs.push_back(std::move(out));
      }
    }
    times->output_start_ns = core::NowNs();
  }

 private:
  const config::ModelConfig* config_;
  const int64_t delay_ms_;
  inferd::Mutex mu_;
  inferd::CondVar cv_;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class IdentityBackend : public Backend {
 public:
  std::string_view name() const override { return "identity"; }
  bool ReadsModelFile() const override { return false; }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    // Outputs are the inputs as they came, after `execute_delay_ms` when set.
    ConfigSupport support;
    support.parameters = kIdentityParameters;
    if (auto st = CheckConfigSupport(spec, name(), support, index); !st.ok()) return st;
    const auto& cfg = *spec.config;
    int64_t delay_ms = 0;
    if (auto it = cfg.parameters().find("execute_delay_ms"); it != cfg.parameters().end()) {
      if (!absl::SimpleAtoi(it->second.string_value(), &delay_ms) || delay_ms < 0) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "identity model '", cfg.name(), "': parameter 'execute_delay_ms' must be a "
            "non-negative integer (milliseconds), got '", it->second.string_value(), "'"));
      }
    }
    for (int i = 0; i < std::min(cfg.input_size(), cfg.output_size()); ++i) {
      if (cfg.input(i).data_type() != cfg.output(i).data_type()) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "identity model '", cfg.name(), "': input '", cfg.input(i).name(), "' and output '",
            cfg.output(i).name(), "' must have the same data_type"));
      }
    }
    return std::make_unique<IdentityInstance>(spec.config, delay_ms);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeIdentityBackend() { return std::make_unique<IdentityBackend>(); }

}  // namespace inferd::backends
