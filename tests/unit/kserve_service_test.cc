// The KServe v2 routes as plain functions of (method, path, headers, body): no socket. The
// identity backend stands in for a real runtime.
#include "frontends/http/kserve_service.h"

#include <future>
#include <filesystem>
#include <fstream>

#include "absl/synchronization/notification.h"
#include "backends/identity/identity_backend.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"
#include "rapidjson/document.h"

namespace inferd::http {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class KServeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = fs::temp_directory_path() / ("inferd_kserve_test_" + std::to_string(::getpid()));
    fs::remove_all(repo_);
    WriteModel("ident", R"(backend: "identity" max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ])");
    WriteModel("broken", "max_batch_size: [[[");
    backends_.Register(backends::MakeIdentityBackend());
    server::ServerOptions opts;
    opts.repositories = {repo_.string()};
    opts.exit_on_error = false;
    server_ = std::make_unique<server::Server>(opts, &backends_);
    ASSERT_TRUE(server_->Start().ok());
    service_ = std::make_unique<KServeHttpService>(server_.get());
  }
  void TearDown() override {
    server_->Shutdown();
    fs::remove_all(repo_);
  }

  void WriteModel(const std::string& name, const std::string& config) {
    fs::create_directories(repo_ / name / "1");
    std::ofstream(repo_ / name / "config.pbtxt") << config;
  }

  HttpResponse Call(std::string method, std::string path, std::string body = "",
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
    auto owner = std::make_shared<std::string>(std::move(body));
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.body = *owner;
    for (auto& [k, v] : headers) req.headers.emplace_back(k, v);
    // std::promise rather than absl::Notification: ThreadSanitizer sees the standard
    // library's synchronization but not the (uninstrumented) Debian Abseil's.
    std::promise<HttpResponse> done;
    auto result = done.get_future();
    service_->Handle(req, owner,
                     [&](std::function<HttpResponse()> make) { done.set_value(make()); });
    return result.get();
  }

  fs::path repo_;
  backends::BackendRegistry backends_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<KServeHttpService> service_;
};

TEST_F(KServeServiceTest, HealthAndServerMetadata) {
  EXPECT_EQ(Call("GET", "/v2/health/live").status, 200);
  // strict readiness: the broken model keeps the server from being ready.
  EXPECT_EQ(Call("GET", "/v2/health/ready").status, 400);
  HttpResponse md = Call("GET", "/v2");
  EXPECT_EQ(md.status, 200);
  EXPECT_THAT(md.body, HasSubstr("\"name\":\"triton\""));
  EXPECT_THAT(md.body, HasSubstr("binary_tensor_data"));
  EXPECT_EQ(Call("POST", "/v2/health/live").status, 405);
  EXPECT_EQ(Call("GET", "/nope").status, 404);
}

TEST_F(KServeServiceTest, ModelMetadataAndConfig) {
  HttpResponse md = Call("GET", "/v2/models/ident");
  ASSERT_EQ(md.status, 200) << md.body;
  EXPECT_EQ(md.body,
            R"({"name":"ident","versions":["1"],"platform":"identity","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,-1]}],"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,-1]}]})");
  EXPECT_EQ(Call("GET", "/v2/models/ident/versions/1/ready").status, 200);
  EXPECT_EQ(Call("GET", "/v2/models/ident/versions/2/ready").status, 400);
  HttpResponse cfg = Call("GET", "/v2/models/ident/config");
  EXPECT_THAT(cfg.body, HasSubstr("\"max_batch_size\":4"));
  EXPECT_EQ(Call("GET", "/v2/models/missing").status, 404);
  EXPECT_EQ(Call("GET", "/v2/models/ident/versions/x").status, 400);
}

TEST_F(KServeServiceTest, JsonInferRoundTripAndStatistics) {
  HttpResponse r = Call("POST", "/v2/models/ident/infer",
                        R"({"id":"7","inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,2.5,-3]}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body,
            R"({"model_name":"ident","model_version":"1","id":"7","outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[1,3],"data":[1.0,2.5,-3.0]}]})");
  HttpResponse stats = Call("GET", "/v2/models/ident/stats");
  rapidjson::Document doc;
  doc.Parse(stats.body.c_str());
  ASSERT_TRUE(doc.IsObject()) << stats.body;
  const auto& m = doc["model_stats"][0];
  EXPECT_EQ(m["inference_count"].GetUint64(), 1u);
  EXPECT_EQ(m["execution_count"].GetUint64(), 1u);
  EXPECT_EQ(m["inference_stats"]["success"]["count"].GetUint64(), 1u);
  EXPECT_EQ(m["batch_stats"][0]["batch_size"].GetUint64(), 1u);
}

TEST_F(KServeServiceTest, BinaryInferMatchesJson) {
  std::string json = R"({"inputs":[{"name":"INPUT0","shape":[2,2],"datatype":"FP32","parameters":{"binary_data_size":16}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]})";
  float vals[4] = {1, 2, 3, 4};
  std::string body = json + std::string(reinterpret_cast<char*>(vals), 16);
  HttpResponse r = Call("POST", "/v2/models/ident/infer", body,
                        {{"Inference-Header-Content-Length", std::to_string(json.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.tail.size(), 1u);
  EXPECT_EQ(r.tail[0], std::string(reinterpret_cast<char*>(vals), 16));
  EXPECT_EQ(r.headers[0].first, "Inference-Header-Content-Length");
}

TEST_F(KServeServiceTest, BadRequestsGetClientErrors) {
  EXPECT_EQ(Call("POST", "/v2/models/ident/infer", "{oops").status, 400);
  HttpResponse unknown = Call("POST", "/v2/models/nope/infer", R"({"inputs":[]})");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(unknown.body, HasSubstr("Request for unknown model: 'nope' is not found"));
  HttpResponse badver = Call("POST", "/v2/models/ident/versions/9/infer", R"({"inputs":[]})");
  EXPECT_EQ(badver.status, 404);
  HttpResponse missing = Call("POST", "/v2/models/ident/infer", R"({"inputs":[]})");
  EXPECT_EQ(missing.status, 400);
  EXPECT_THAT(missing.body, HasSubstr("expects input 'INPUT0'"));
  HttpResponse badlen = Call("POST", "/v2/models/ident/infer", "{}",
                             {{"Inference-Header-Content-Length", "x"}});
  EXPECT_EQ(badlen.status, 400);
  HttpResponse broken = Call("POST", "/v2/models/broken/infer", R"({"inputs":[]})");
  EXPECT_EQ(broken.status, 503);
  // The server still answers.
  EXPECT_EQ(Call("GET", "/v2/models/ident/ready").status, 200);
}

TEST_F(KServeServiceTest, RepositoryIndexShowsTheBrokenModelWithItsReason) {
  HttpResponse r = Call("POST", "/v2/repository/index");
  ASSERT_EQ(r.status, 200);
  rapidjson::Document doc;
  doc.Parse(r.body.c_str());
  ASSERT_TRUE(doc.IsArray());
  ASSERT_EQ(doc.Size(), 2u);
  EXPECT_STREQ(doc[0]["name"].GetString(), "broken");
  EXPECT_STREQ(doc[0]["state"].GetString(), "UNAVAILABLE");
  EXPECT_THAT(doc[0]["reason"].GetString(), HasSubstr("config.pbtxt:1:"));
  EXPECT_STREQ(doc[1]["state"].GetString(), "READY");
  // Load/unload need explicit mode.
  EXPECT_EQ(Call("POST", "/v2/repository/models/ident/unload").status, 400);
}

// memory_usage as Triton writes it: the CPU footprint, then one {"type":"GPU","id":<gpu>,
// "byte_size":<bytes>} per GPU the version holds memory on (fake GPUs; the backend's instances
// allocate fake device memory).
class GpuStatsBackend : public backends::Backend {
 public:
  explicit GpuStatsBackend(gpu::FakeRuntime* rt) : rt_(rt) {}
  std::string_view name() const override { return "gpustats"; }
  absl::Status GpuInstanceSupport() const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstance(
      const backends::ModelSpec&, const inference::ModelInstanceGroup&, int) override {
    return absl::UnimplementedError("GPU only");
  }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstanceOn(
      const backends::ModelSpec&, const inference::ModelInstanceGroup&, int,
      const backends::InstanceDevice& device) override {
    auto memory = rt_->AllocateDevice(device.id, (device.id + 1) << 20);
    if (!memory.ok()) return memory.status();
    return std::make_unique<Instance>(*std::move(memory));
  }

 private:
  struct Instance : backends::ModelInstance {
    explicit Instance(std::unique_ptr<gpu::DeviceBuffer> m) : memory(std::move(m)) {}
    void Execute(std::span<core::InferRequest* const>, std::span<core::InferResponse* const>,
                 backends::ExecutionTimes*) override {}
    std::unique_ptr<gpu::DeviceBuffer> memory;
  };
  gpu::FakeRuntime* const rt_;
};

TEST(KServeGpuStatisticsTest, MemoryUsageHasAGpuEntryPerDevice) {
  const fs::path repo =
      fs::temp_directory_path() / ("inferd_kserve_gpu_test_" + std::to_string(::getpid()));
  fs::remove_all(repo);
  fs::create_directories(repo / "g" / "1");
  std::ofstream(repo / "g" / "config.pbtxt") << R"(backend: "gpustats" max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_GPU gpus: [ 1, 0 ] } ])";
  auto rt = gpu::FakeRuntime::WithDevices(2);
  backends::BackendRegistry backends;
  backends.Register(std::make_unique<GpuStatsBackend>(rt.get()));
  server::ServerOptions opts;
  opts.repositories = {repo.string()};
  opts.placement.gpus = rt.get();
  server::Server server(opts, &backends);
  ASSERT_TRUE(server.Start().ok());
  KServeHttpService service(&server);
  HttpRequest req;
  req.method = "GET";
  req.path = "/v2/models/g/stats";
  std::promise<HttpResponse> done;
  auto result = done.get_future();
  service.Handle(req, std::make_shared<std::string>(),
                 [&](std::function<HttpResponse()> make) { done.set_value(make()); });
  HttpResponse r = result.get();
  ASSERT_EQ(r.status, 200) << r.body;
  rapidjson::Document doc;
  doc.Parse(r.body.c_str());
  ASSERT_TRUE(doc.IsObject()) << r.body;
  const auto& usage = doc["model_stats"][0]["memory_usage"];
  ASSERT_TRUE(usage.IsArray()) << r.body;
  std::vector<std::string> gpu;
  for (const auto& u : usage.GetArray()) {
    ASSERT_TRUE(u["type"].IsString() && u["id"].IsInt64() && u["byte_size"].IsUint64()) << r.body;
    if (std::string(u["type"].GetString()) == "GPU") {
      gpu.push_back(std::to_string(u["id"].GetInt64()) + ":" +
                    std::to_string(u["byte_size"].GetUint64()));
    } else {
      EXPECT_EQ(std::string(u["type"].GetString()), "CPU") << r.body;
    }
  }
  EXPECT_THAT(gpu, ::testing::ElementsAre("0:1048576", "1:2097152")) << r.body;
  server.Shutdown();
  fs::remove_all(repo);
}

}  // namespace
}  // namespace inferd::http
