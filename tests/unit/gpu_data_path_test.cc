// The GPU data path (issue 30) through the real KServe HTTP routes and the server facade, on
// the fake device layer: which copies a tensor makes between a CUDA shared-memory region, a
// GPU instance, a CPU instance, an ensemble's steps and the response body. A test backend
// ("gpuecho") runs KIND_GPU instances that take GPU inputs and answer input + 1 in fake device
// memory (OutputTensor::place GPU n), recording the place of every input it was given.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/escaping.h"
#include "backends/identity/identity_backend.h"
#include "backends/python/python_backend.h"
#include "backends/tensor_places.h"
#include "common/mutex.h"
#include "frontends/http/kserve_service.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"

namespace inferd::http {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every input place a gpuecho instance saw, in order.
inferd::Mutex seen_mu;
std::vector<MemoryPlace> seen ABSL_GUARDED_BY(seen_mu);

std::vector<MemoryPlace> Seen() {
  inferd::MutexLock lock(&seen_mu);
  return seen;
}

// `only_for_gpu_consumers`: as ONNX Runtime's CUDA instances, the output stays on the GPU
// only for a request whose consumer reads GPU bytes (an ensemble's step, a CUDA region on the
// instance's GPU: backends::OutputMayStayOnGpu), else it is written to host memory.
class GpuEchoInstance : public backends::ModelInstance {
 public:
  GpuEchoInstance(gpu::FakeRuntime* rt, int device, bool only_for_gpu_consumers)
      : rt_(rt), device_(device), only_for_gpu_consumers_(only_for_gpu_consumers) {}
  std::optional<int> GpuInputsOn() const override { return device_; }
  bool OutputsMayBeOnGpu() const override { return !only_for_gpu_consumers_; }
  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const> responses,
               backends::ExecutionTimes*) override {
    for (size_t r = 0; r < requests.size(); ++r) {
      const core::InputTensor& in = requests[r]->inputs.at(0);
      {
        inferd::MutexLock lock(&seen_mu);
        seen.push_back(in.place);
      }
      // The fake's device memory is host memory: the "kernel" reads and writes it directly.
      const bool on_gpu = !only_for_gpu_consumers_ ||
                          backends::OutputMayStayOnGpu(*requests[r], "OUTPUT0", device_);
      std::shared_ptr<void> out_mem;
      char* y_bytes;
      if (on_gpu) {
        std::shared_ptr<gpu::DeviceBuffer> d = *rt_->AllocateDevice(device_, in.data.size());
        y_bytes = static_cast<char*>(d->data());
        out_mem = std::move(d);
      } else {
        auto h = std::make_shared<std::string>(in.data.size(), '\0');
        y_bytes = h->data();
        out_mem = std::move(h);
      }
      const float* x = reinterpret_cast<const float*>(in.data.data());
      float* y = reinterpret_cast<float*>(y_bytes);
      for (size_t i = 0; i < in.data.size() / sizeof(float); ++i) y[i] = x[i] + 1;
      core::OutputTensor out;
      out.name = "OUTPUT0";
      out.datatype = in.datatype;
      out.shape = in.shape;
      out.data = std::string_view(y_bytes, in.data.size());
      out.holder = out_mem;
      out.place = on_gpu ? MemoryPlace::Gpu(device_) : MemoryPlace::Host();
      responses[r]->outputs.push_back(std::move(out));
    }
  }

 private:
  gpu::FakeRuntime* const rt_;
  const int device_;
  const bool only_for_gpu_consumers_;
};

class GpuEchoBackend : public backends::Backend {
 public:
  explicit GpuEchoBackend(gpu::FakeRuntime* rt) : rt_(rt) {}
  std::string_view name() const override { return "gpuecho"; }
  absl::Status GpuInstanceSupport() const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstance(
      const backends::ModelSpec&, const inference::ModelInstanceGroup&, int) override {
    return absl::FailedPreconditionError("gpuecho runs on a GPU only");
  }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstanceOn(
      const backends::ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const backends::InstanceDevice& device) override {
    if (!device.gpu) return CreateInstance(spec, group, index);
    return std::make_unique<GpuEchoInstance>(
        rt_, device.id, spec.config->parameters().contains("only_for_gpu_consumers"));
  }

 private:
  gpu::FakeRuntime* const rt_;
};

// A decoupled model on a GPU: answers each request with two responses whose OUTPUT0 (input +
// 1, then input + 2) is in fake GPU memory, sent through the request's ResponseSender after
// Execute returned (from a thread of its own, as the Python backend's decoupled mode does),
// then the final flag.
class GpuStreamInstance : public backends::ModelInstance {
 public:
  GpuStreamInstance(gpu::FakeRuntime* rt, int device) : rt_(rt), device_(device) {}
  ~GpuStreamInstance() override {
    for (auto& t : senders_) t.join();
  }
  std::optional<int> GpuInputsOn() const override { return device_; }
  bool OutputsMayBeOnGpu() const override { return true; }
  void Execute(std::span<core::InferRequest* const> requests,
               std::span<core::InferResponse* const>, backends::ExecutionTimes*) override {
    for (core::InferRequest* req : requests) {
      const core::InputTensor& in = req->inputs.at(0);
      std::vector<float> x(in.data.size() / sizeof(float));
      std::memcpy(x.data(), in.data.data(), in.data.size());  // the request dies with Execute
      senders_.emplace_back([rt = rt_, device = device_, x = std::move(x),
                             shape = in.shape, sender = req->response_sender] {
        for (int k = 1; k <= 2; ++k) {
          std::shared_ptr<gpu::DeviceBuffer> d = *rt->AllocateDevice(device, x.size() * 4);
          float* y = static_cast<float*>(d->data());
          for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] + k;
          auto response = sender->MakeResponse();
          core::OutputTensor& out = response->outputs.emplace_back();
          out.name = "OUTPUT0";
          out.datatype = DataType::kFp32;
          out.shape = shape;
          out.data = std::string_view(static_cast<const char*>(d->data()), x.size() * 4);
          out.holder = d;
          out.place = MemoryPlace::Gpu(device);
          (void)sender->Send(std::move(response), /*final=*/false);
        }
        (void)sender->SendFinal();
      });
    }
  }

 private:
  gpu::FakeRuntime* const rt_;
  const int device_;
  std::vector<std::thread> senders_;  // only the instance's thread touches it
};

class GpuStreamBackend : public backends::Backend {
 public:
  explicit GpuStreamBackend(gpu::FakeRuntime* rt) : rt_(rt) {}
  std::string_view name() const override { return "gpustream"; }
  bool SupportsDecoupled() const override { return true; }
  absl::Status GpuInstanceSupport() const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstance(
      const backends::ModelSpec&, const inference::ModelInstanceGroup&, int) override {
    return absl::FailedPreconditionError("gpustream runs on a GPU only");
  }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstanceOn(
      const backends::ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const backends::InstanceDevice& device) override {
    if (!device.gpu) return CreateInstance(spec, group, index);
    return std::make_unique<GpuStreamInstance>(rt_, device.id);
  }

 private:
  gpu::FakeRuntime* const rt_;
};

constexpr char kIo[] = R"(max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
)";

// A Python model with FORCE_CPU_ONLY_INPUT_TENSORS 'no' (GpuDataPathPythonTest): the stub's
// CUDA calls are fakes (the fake GPU's memory is this process's, which the Python process cannot
// read); OUTPUT0 says what model.py got: [on the GPU, DLPack device type, device id, handles
// opened so far].
constexpr char kPyGpuModel[] = R"PY(
import numpy as np
import triton_python_backend_utils as pb_utils

OPENED = []
pb_utils._ipc_open = lambda handle, device: OPENED.append(handle) or 4096
pb_utils._ipc_close = lambda address, device: None


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            d = x.__dlpack_device__()
            y = np.array([0 if x.is_cpu() else 1, d[0], d[1], len(OPENED)], dtype=np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return out
)PY";

class GpuDataPathTest : public ::testing::Test {
 protected:
  // GpuDataPathPythonTest: also the Python backend and its models.
  virtual bool WithPython() const { return false; }

  void SetUp() override {
    repo_ = fs::temp_directory_path() / ("inferd_gpu_data_path_test_" + std::to_string(::getpid()));
    fs::remove_all(repo_);
    auto model = [&](const std::string& name, const std::string& body) {
      fs::create_directories(repo_ / name / "1");
      std::ofstream(repo_ / name / "config.pbtxt") << body;
    };
    model("gpu0", std::string("backend: \"gpuecho\"\n") + kIo +
                      "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n");
    model("gpu1", std::string("backend: \"gpuecho\"\n") + kIo +
                      "instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]\n");
    model("gpu0s", std::string("backend: \"gpuecho\"\n") + kIo +
                       "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n"
                       "parameters { key: \"only_for_gpu_consumers\" value: { string_value: "
                       "\"1\" } }\n");
    model("cpu", std::string("backend: \"identity\"\n") + kIo);
    model("stream0", std::string("backend: \"gpustream\"\n") + kIo +
                         "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n"
                         "model_transaction_policy { decoupled: true }\n");
    auto ensemble = [&](const std::string& name, const std::string& first,
                        const std::string& second) {
      model(name, std::string("platform: \"ensemble\"\n") + kIo + R"(
ensemble_scheduling { step [
  { model_name: ")" + first + R"(" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: ")" + second + R"(" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
)");
    };
    ensemble("gpu0_gpu0", "gpu0", "gpu0");
    ensemble("gpu0_cpu", "gpu0", "cpu");
    ensemble("gpu0_gpu1", "gpu0", "gpu1");
    ensemble("gpu0s_gpu0s", "gpu0s", "gpu0s");
    gpus_ = gpu::FakeRuntime::WithDevices(2);
    if (WithPython()) {
      model("py_gpu", std::string("backend: \"python\"\n") + kIo +
                          "instance_group [ { kind: KIND_CPU } ]\n"
                          "parameters { key: \"FORCE_CPU_ONLY_INPUT_TENSORS\" value: { "
                          "string_value: \"no\" } }\n");
      std::ofstream(repo_ / "py_gpu" / "1" / "model.py") << kPyGpuModel;
      ensemble("gpu1_py_gpu", "gpu1", "py_gpu");
      backends_.Register(backends::MakePythonBackend(gpus_.get()));
    }
    backends_.Register(backends::MakeIdentityBackend());
    backends_.Register(std::make_unique<GpuEchoBackend>(gpus_.get()));
    backends_.Register(std::make_unique<GpuStreamBackend>(gpus_.get()));
    server::ServerOptions opts;
    opts.repositories = {repo_.string()};
    opts.exit_on_error = false;
    opts.gpus = gpus_.get();
    opts.placement.gpus = gpus_.get();
    server_ = std::make_unique<server::Server>(opts, &backends_);
    ASSERT_TRUE(server_->Start().ok());
    service_ = std::make_unique<KServeHttpService>(server_.get());
    buffer_ = *gpus_->AllocateDevice(0, 64);
    ASSERT_EQ(Call("POST", "/v2/cudasharedmemory/region/gpu_io/register",
                   R"({"raw_handle": {"b64": ")" +
                       absl::Base64Escape(gpus_->ExportIpcHandle(*buffer_)) +
                       R"("}, "device_id": 0, "byte_size": 64})")
                  .status,
              200);
    const float x[4] = {1, 2, 3, 4};
    std::memcpy(buffer_->data(), x, sizeof x);
    inferd::MutexLock lock(&seen_mu);
    seen.clear();
  }
  void TearDown() override {
    server_->Shutdown();
    fs::remove_all(repo_);
  }

  HttpResponse Call(std::string method, std::string path, std::string body = "") {
    auto owner = std::make_shared<std::string>(std::move(body));
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.body = *owner;
    std::promise<HttpResponse> done;
    auto result = done.get_future();
    service_->Handle(req, owner,
                     [&](std::function<HttpResponse()> make) { done.set_value(make()); });
    return result.get();
  }
  // INPUT0 from the region (offset 0) or in the body; OUTPUT0 into the region (offset 32) or
  // in the body.
  HttpResponse Infer(const std::string& model, bool input_in_region, bool output_in_region) {
    std::string body = R"({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], )";
    body += input_in_region ? R"("parameters": {"shared_memory_region": "gpu_io", )"
                              R"("shared_memory_byte_size": 16}}])"
                            : R"("data": [1, 2, 3, 4]}])";
    if (output_in_region) {
      body += R"(, "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": )"
              R"("gpu_io", "shared_memory_byte_size": 16, "shared_memory_offset": 32}}])";
    }
    return Call("POST", "/v2/models/" + model + "/infer", body + "}");
  }
  // A streaming request (gRPC ModelStreamInfer, HTTP generate_stream) through the server
  // facade, as the frontends make it: every response until the final flag. INPUT0 in the
  // body; OUTPUT0 into the region (offset 32) when `output_in_region`.
  struct Streamed {
    std::vector<std::unique_ptr<core::InferResponse>> responses;
    bool final_seen = false;
  };
  Streamed InferStream(const std::string& model, bool output_in_region) {
    auto req = std::make_unique<core::InferRequest>();
    req->model_name = model;
    static const float kX[4] = {1, 2, 3, 4};
    req->inputs.push_back(core::InputTensor{
        "INPUT0", DataType::kFp32, {4}, std::string_view(reinterpret_cast<const char*>(kX), 16),
        std::nullopt, MemoryPlace::Host()});
    if (output_in_region) {
      core::RequestedOutput& o = req->outputs.emplace_back();
      o.name = "OUTPUT0";
      o.shm = core::SharedMemoryRef{"gpu_io", 32, 16};
    }
    auto state = std::make_shared<Streamed>();
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    // Calls for one request never overlap (core/response_sender.h).
    req->on_response = [state, done](std::unique_ptr<core::InferResponse> r, bool final) {
      if (r != nullptr) state->responses.push_back(std::move(r));
      if (final) {
        state->final_seen = true;
        done->set_value();
      }
    };
    server_->Infer(std::move(req));
    finished.wait();
    return std::move(*state);
  }
  int Copies(gpu::CopyKind kind) { return gpus_->CopyCount(kind); }
  std::vector<float> Region(size_t offset) {
    std::vector<float> v(4);
    std::memcpy(v.data(), static_cast<char*>(buffer_->data()) + offset, 16);
    return v;
  }

  fs::path repo_;
  backends::BackendRegistry backends_;
  std::unique_ptr<gpu::FakeRuntime> gpus_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<KServeHttpService> service_;
  std::unique_ptr<gpu::DeviceBuffer> buffer_;  // the client's allocation on fake GPU 0
};

TEST_F(GpuDataPathTest, RegionInputReachesGpuInstanceWithoutCopyAndOutputGoesDeviceToDevice) {
  HttpResponse r = Infer("gpu0", true, true);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(Seen(), ElementsAre(MemoryPlace::Gpu(0)));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 0);
  EXPECT_EQ(Copies(gpu::CopyKind::kHostToDevice), 0);
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToDevice), 1);  // the output into the region
  EXPECT_THAT(Region(32), ElementsAre(2, 3, 4, 5));
}

class GpuDataPathPythonTest : public GpuDataPathTest {
 protected:
  bool WithPython() const override { return true; }
};

TEST_F(GpuDataPathPythonTest, AGpuStepFeedsAPythonModelTakingGpuInputsWithNoHostCopy) {
  // FORCE_CPU_ONLY_INPUT_TENSORS 'no': the model takes inputs on any GPU, so the first step's
  // output stays on GPU 1 and model.py gets a CUDA tensor there through one IPC handle.
  HttpResponse r = Infer("gpu1_py_gpu", false, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr(R"("data":[1.0,2.0,1.0,1.0])")) << r.body;
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 0);
  // A host input stays a host tensor: nothing opened.
  HttpResponse host = Infer("py_gpu", false, false);
  ASSERT_EQ(host.status, 200) << host.body;
  EXPECT_THAT(host.body, HasSubstr(R"("data":[0.0,1.0,0.0,1.0])")) << host.body;
}

// Every edge copy (into the region, to the host for the body, a region input to the host)
// leases its stream from the runtime's pool: one stream per device however many requests.
TEST_F(GpuDataPathTest, EdgeCopiesReuseOneStreamPerDevice) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(Infer("gpu0", true, true).status, 200);
    ASSERT_EQ(Infer("gpu0", true, false).status, 200);
    ASSERT_EQ(Infer("gpu1", true, false).status, 200);
  }
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToDevice), 5);
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 15);
  EXPECT_EQ(gpus_->StreamsCreated(0), 1);
  EXPECT_EQ(gpus_->StreamsCreated(1), 1);  // gpu1's outputs, to the host
}

TEST_F(GpuDataPathTest, GpuOutputInTheBodyIsCopiedToTheHostOnce) {
  HttpResponse r = Infer("gpu0", true, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("[2.0,3.0,4.0,5.0]"));
  EXPECT_THAT(Seen(), ElementsAre(MemoryPlace::Gpu(0)));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 1);  // the output, at the edge
}

TEST_F(GpuDataPathTest, RegionInputIsCopiedOnceForAnInstanceOnAnotherGpuOrTheCpu) {
  HttpResponse r = Infer("gpu1", true, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(Seen(), ElementsAre(MemoryPlace::Host()));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 2);  // the input at Attach, the output
  r = Infer("cpu", true, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("[1.0,2.0,3.0,4.0]"));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 3);  // the input, once
}

TEST_F(GpuDataPathTest, BodyInputToGpuInstance) {
  HttpResponse r = Infer("gpu0", false, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(Seen(), ElementsAre(MemoryPlace::Host()));
  EXPECT_THAT(r.body, HasSubstr("[2.0,3.0,4.0,5.0]"));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 1);
}

TEST_F(GpuDataPathTest, EnsembleHandsGpuOutputToNextGpuStepWithoutCopy) {
  HttpResponse r = Infer("gpu0_gpu0", false, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("[3.0,4.0,5.0,6.0]"));
  EXPECT_THAT(Seen(), ElementsAre(MemoryPlace::Host(), MemoryPlace::Gpu(0)));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 1);  // the ensemble's output, at the end
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToDevice), 0);
}

TEST_F(GpuDataPathTest, EnsembleCopiesGpuOutputToHostForCpuStepOrOtherGpu) {
  HttpResponse r = Infer("gpu0_cpu", false, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("[2.0,3.0,4.0,5.0]"));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 1);  // the hand-over to the CPU step
  r = Infer("gpu0_gpu1", false, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("[3.0,4.0,5.0,6.0]"));
  // The step on GPU 1 reads host bytes: its input came back from GPU 0.
  EXPECT_THAT(Seen(), ElementsAre(MemoryPlace::Host(), MemoryPlace::Host(), MemoryPlace::Host()));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 3);  // hand-over, ensemble output
}

TEST_F(GpuDataPathTest, InstanceAnsweringOnGpuOnlyForGpuConsumers) {
  // A client's request gets host outputs from it: no output edge, no copy.
  HttpResponse r = Infer("gpu0s", true, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("[2.0,3.0,4.0,5.0]"));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 0);
  // An ensemble's steps are marked: the output stays on GPU 0 between the steps.
  r = Infer("gpu0s_gpu0s", false, false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("[3.0,4.0,5.0,6.0]"));
  EXPECT_THAT(Seen(), ElementsAre(MemoryPlace::Gpu(0), MemoryPlace::Host(), MemoryPlace::Gpu(0)));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 1);  // the ensemble's output, in Finish
}

// A decoupled model's responses go to the client through its sender, not on_complete: each
// passes the same output edge as a response that answers once.
TEST_F(GpuDataPathTest, DecoupledGpuOutputsAreCopiedToTheHostForEachResponse) {
  Streamed s = InferStream("stream0", false);
  ASSERT_TRUE(s.final_seen);
  ASSERT_EQ(s.responses.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const core::InferResponse& r = *s.responses[k];
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_EQ(r.outputs[0].place, MemoryPlace::Host());
    std::vector<float> y(4);
    ASSERT_EQ(r.outputs[0].data.size(), 16u);
    std::memcpy(y.data(), r.outputs[0].data.data(), 16);
    EXPECT_THAT(y, ElementsAre(2 + k, 3 + k, 4 + k, 5 + k));
  }
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 2);  // one per response
}

TEST_F(GpuDataPathTest, DecoupledGpuOutputsGoDeviceToDeviceIntoACudaRegion) {
  Streamed s = InferStream("stream0", true);
  ASSERT_TRUE(s.final_seen);
  ASSERT_EQ(s.responses.size(), 2u);
  for (const auto& r : s.responses) {
    ASSERT_TRUE(r->status.ok()) << r->status;
    ASSERT_EQ(r->outputs.size(), 1u);
    EXPECT_TRUE(r->outputs[0].in_shared_memory);
    EXPECT_TRUE(r->outputs[0].data.empty());
  }
  // Each response was written into the region in turn, as Triton does; the last one stays.
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToDevice), 2);
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 0);
  EXPECT_THAT(Region(32), ElementsAre(3, 4, 5, 6));
}

TEST_F(GpuDataPathTest, EnsembleOutputIntoCudaRegion) {
  HttpResponse r = Infer("gpu0_gpu0", true, true);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(Region(32), ElementsAre(3, 4, 5, 6));
  // The ensemble's output stays on GPU 0 for the region there: no trip through the host.
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToDevice), 1);
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 1);  // the input: an ensemble takes host bytes
  EXPECT_EQ(Copies(gpu::CopyKind::kHostToDevice), 0);
}

// An instance that answers on the GPU only for consumers reading GPU bytes (ONNX Runtime's CUDA
// instances) leaves a client's output there when it goes into a CUDA region on its GPU: one
// device-to-device copy instead of device-to-host + host-to-device.
TEST_F(GpuDataPathTest, OutputForACudaRegionOnTheInstancesGpuStaysOnIt) {
  HttpResponse r = Infer("gpu0s", true, true);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(Region(32), ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToDevice), 1);
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToHost), 0);
  EXPECT_EQ(Copies(gpu::CopyKind::kHostToDevice), 0);
}

TEST_F(GpuDataPathTest, OutputForACudaRegionOnAnotherGpuComesBackToTheHost) {
  std::unique_ptr<gpu::DeviceBuffer> on1 = *gpus_->AllocateDevice(1, 16);
  ASSERT_EQ(Call("POST", "/v2/cudasharedmemory/region/out1/register",
                 R"({"raw_handle": {"b64": ")" + absl::Base64Escape(gpus_->ExportIpcHandle(*on1)) +
                     R"("}, "device_id": 1, "byte_size": 16})")
                .status,
            200);
  HttpResponse r = Call(
      "POST", "/v2/models/gpu0s/infer",
      R"({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}],)"
      R"( "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out1",)"
      R"( "shared_memory_byte_size": 16}}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Copies(gpu::CopyKind::kHostToDevice), 1);  // host output, up into the region
  EXPECT_EQ(Copies(gpu::CopyKind::kDeviceToDevice), 0);
  std::vector<float> v(4);
  std::memcpy(v.data(), on1->data(), 16);
  EXPECT_THAT(v, ElementsAre(2, 3, 4, 5));
  ASSERT_EQ(Call("POST", "/v2/cudasharedmemory/region/out1/unregister").status, 200);
}

// The edge functions alone: host tensors are left alone (no copy, no allocation).
TEST(TensorPlacesTest, HostTensorsUntouched) {
  auto rt = gpu::FakeRuntime::WithDevices(1);
  core::InferRequest req;
  core::InputTensor& in = req.inputs.emplace_back();
  in.name = "x";
  in.datatype = DataType::kFp32;
  in.shape = {1};
  in.data = "abcd";
  ASSERT_TRUE(backends::PlaceInputsFor(rt.get(), &req, std::nullopt).ok());
  EXPECT_TRUE(req.holders.empty());
  core::InferResponse resp;
  core::OutputTensor& out = resp.outputs.emplace_back();
  out.name = "y";
  out.data = "abcd";
  EXPECT_FALSE(backends::AnyOutputOnGpu(resp));
  EXPECT_TRUE(backends::MakeOutputsHostReadable(rt.get(), &resp));
  EXPECT_EQ(resp.outputs[0].holder, nullptr);
  EXPECT_EQ(rt->CopyCount(gpu::CopyKind::kDeviceToHost), 0);
}

TEST(TensorPlacesTest, OutputMayStayOnGpuForEnsembleStepsAndCudaRegionsOnThatGpu) {
  core::InferRequest all;  // every output, in the body
  EXPECT_FALSE(backends::OutputMayStayOnGpu(all, "y", 0));
  core::InferRequest step;
  step.gpu_outputs_ok = true;
  EXPECT_TRUE(backends::OutputMayStayOnGpu(step, "y", 0));
  core::InferRequest region;
  region.outputs.push_back(core::RequestedOutput{.name = "y", .gpu_region_on = 1});
  region.outputs.push_back(core::RequestedOutput{.name = "z"});
  EXPECT_TRUE(backends::OutputMayStayOnGpu(region, "y", 1));
  EXPECT_FALSE(backends::OutputMayStayOnGpu(region, "y", 0));  // a region on another GPU
  EXPECT_FALSE(backends::OutputMayStayOnGpu(region, "z", 1));  // in the body
  EXPECT_TRUE(backends::OutputMayStayOnGpu(region, "w", 1));   // not asked for
  std::vector<core::InferRequest*> batch = {&step, &region};
  EXPECT_TRUE(backends::BatchOutputMayStayOnGpu(batch, "y", 1));
  batch.push_back(&all);
  EXPECT_FALSE(backends::BatchOutputMayStayOnGpu(batch, "y", 1));
  EXPECT_FALSE(backends::BatchOutputMayStayOnGpu({}, "y", 1));
}

TEST(TensorPlacesTest, BytesInputOnGpuAlwaysComesToHost) {
  auto rt = gpu::FakeRuntime::WithDevices(1);
  std::shared_ptr<gpu::DeviceBuffer> mem = *rt->AllocateDevice(0, 5);
  std::memcpy(mem->data(), "\1\0\0\0z", 5);
  core::InferRequest req;
  core::InputTensor& in = req.inputs.emplace_back();
  in.name = "s";
  in.datatype = DataType::kBytes;
  in.shape = {1};
  in.data = std::string_view(static_cast<const char*>(mem->data()), 5);
  in.place = MemoryPlace::Gpu(0);
  ASSERT_TRUE(backends::PlaceInputsFor(rt.get(), &req, 0).ok());
  EXPECT_EQ(req.inputs[0].place, MemoryPlace::Host());
  EXPECT_EQ(req.inputs[0].data, std::string_view("\1\0\0\0z", 5));
  EXPECT_EQ(rt->CopyCount(gpu::CopyKind::kDeviceToHost), 1);
}

TEST(TensorPlacesTest, FailedOutputCopyFailsTheResponse) {
  auto rt = gpu::FakeRuntime::WithDevices(1);
  core::InferResponse resp;
  core::OutputTensor& out = resp.outputs.emplace_back();
  out.name = "y";
  out.data = "abcd";  // host memory claimed to be on GPU 0: the fake refuses the copy
  out.place = MemoryPlace::Gpu(0);
  EXPECT_FALSE(backends::MakeOutputsHostReadable(rt.get(), &resp));
  EXPECT_EQ(resp.status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(resp.status.message(), HasSubstr("output 'y'"));
  EXPECT_TRUE(resp.outputs.empty());
}

}  // namespace
}  // namespace inferd::http
