#include "backends/identity/identity_backend.h"

#include <string>

#include "common/strings.h"

namespace inferd::backends {
namespace {

class IdentityInstance : public ModelInstance {
 public:
  explicit IdentityInstance(const config::ModelConfig* config) : config_(config) {}

  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses, ExecutionTimes* times) override {
    times->input_end_ns = core::NowNs();
    times->output_start_ns = times->input_end_ns;
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
  }

 private:
  const config::ModelConfig* config_;
};

class IdentityBackend : public Backend {
 public:
  std::string_view name() const override { return "identity"; }

  absl::StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(
      const ModelSpec& spec, const inference::ModelInstanceGroup& group, int index) override {
    // No parameters; outputs are the inputs as they came.
    if (auto st = CheckConfigSupport(*spec.config, name(), {}); !st.ok()) return st;
    const auto& cfg = *spec.config;
    for (int i = 0; i < std::min(cfg.input_size(), cfg.output_size()); ++i) {
      if (cfg.input(i).data_type() != cfg.output(i).data_type()) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "identity model '", cfg.name(), "': input '", cfg.input(i).name(), "' and output '",
            cfg.output(i).name(), "' must have the same data_type"));
      }
    }
    return std::make_unique<IdentityInstance>(spec.config);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeIdentityBackend() { return std::make_unique<IdentityBackend>(); }

}  // namespace inferd::backends
