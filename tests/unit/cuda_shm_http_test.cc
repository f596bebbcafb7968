// The CUDA shared-memory extension through the real KServe HTTP routes and the server facade,
// on the fake device layer: register with the base64 raw handle a client exported, status in
// Triton's JSON, infer with the input and the output in the region, out-of-bounds tensors
// refused naming the region, a name clash with a system region, unregister while a request
// uses the region, and the extension in the server metadata.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/escaping.h"
#include "backends/identity/identity_backend.h"
#include "frontends/http/kserve_service.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"

namespace inferd::http {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CudaShmHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = fs::temp_directory_path() / ("inferd_cuda_shm_test_" + std::to_string(::getpid()));
    fs::remove_all(repo_);
    fs::create_directories(repo_ / "ident" / "1");
    std::ofstream(repo_ / "ident" / "config.pbtxt") << R"(backend: "identity" max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ])";
    backends_.Register(backends::MakeIdentityBackend());
    gpus_ = gpu::FakeRuntime::WithDevices(1);
    server::ServerOptions opts;
    opts.repositories = {repo_.string()};
    opts.exit_on_error = false;
    opts.gpus = gpus_.get();
    server_ = std::make_unique<server::Server>(opts, &backends_);
    ASSERT_TRUE(server_->Start().ok());
    service_ = std::make_unique<KServeHttpService>(server_.get());
    buffer_ = *gpus_->AllocateDevice(0, 64);
    handle_ = gpus_->ExportIpcHandle(*buffer_);
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
  HttpResponse RegisterCuda(const std::string& name, const std::string& handle, int device,
                            uint64_t size) {
    return Call("POST", "/v2/cudasharedmemory/region/" + name + "/register",
                R"({"raw_handle": {"b64": ")" + absl::Base64Escape(handle) +
                    R"("}, "device_id": )" + std::to_string(device) +
                    R"(, "byte_size": )" + std::to_string(size) + "}");
  }
  static std::string InferBody(uint64_t in_offset, uint64_t out_offset) {
    return R"({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {)"
           R"("shared_memory_region": "gpu_io", "shared_memory_byte_size": 16, )"
           R"("shared_memory_offset": )" + std::to_string(in_offset) + R"(}}],)"
           R"( "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "gpu_io", )"
           R"("shared_memory_byte_size": 16, "shared_memory_offset": )" +
           std::to_string(out_offset) + "}}]}";
  }
  // The handle closes when the last request holding the region is freed, which the instance
  // thread does just after answering: wait for it (a condition, with a generous bound).
  bool HandlesCloseTo(int n) {
    for (int i = 0; i < 20000 && gpus_->OpenIpcHandles() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return gpus_->OpenIpcHandles() == n;
  }
  float* Floats(size_t offset) { return reinterpret_cast<float*>(
      static_cast<char*>(buffer_->data()) + offset); }

  fs::path repo_;
  backends::BackendRegistry backends_;
  std::unique_ptr<gpu::FakeRuntime> gpus_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<KServeHttpService> service_;
  std::unique_ptr<gpu::DeviceBuffer> buffer_;  // the client's allocation on fake GPU 0
  std::string handle_;
};

TEST_F(CudaShmHttpTest, RegisterStatusInferUnregister) {
  HttpResponse md = Call("GET", "/v2");
  EXPECT_THAT(md.body, HasSubstr("\"system_shared_memory\",\"cuda_shared_memory\""));

  HttpResponse r = RegisterCuda("gpu_io", handle_, 0, 64);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Call("GET", "/v2/cudasharedmemory/status").body,
            R"([{"name":"gpu_io","device_id":0,"byte_size":64}])");
  EXPECT_EQ(Call("GET", "/v2/cudasharedmemory/region/gpu_io/status").body,
            R"([{"name":"gpu_io","device_id":0,"byte_size":64}])");
  EXPECT_EQ(Call("GET", "/v2/systemsharedmemory/status").body, "[]");

  const float x[4] = {1.5f, -2.0f, 3.25f, 4.0f};
  std::memcpy(Floats(0), x, sizeof x);
  HttpResponse inferred = Call("POST", "/v2/models/ident/infer", InferBody(0, 32));
  ASSERT_EQ(inferred.status, 200) << inferred.body;
  EXPECT_THAT(inferred.body, ::testing::Not(HasSubstr("\"data\"")));
  EXPECT_EQ(std::memcmp(Floats(32), x, sizeof x), 0);
  EXPECT_EQ(gpus_->CopyCount(gpu::CopyKind::kDeviceToHost), 1);  // the input, once
  EXPECT_EQ(gpus_->CopyCount(gpu::CopyKind::kHostToDevice), 1);  // the output, once

  EXPECT_EQ(Call("POST", "/v2/cudasharedmemory/region/gpu_io/unregister").status, 200);
  EXPECT_EQ(Call("GET", "/v2/cudasharedmemory/status").body, "[]");
  EXPECT_TRUE(HandlesCloseTo(0));
  ASSERT_EQ(RegisterCuda("gpu_io", handle_, 0, 64).status, 200);
  EXPECT_EQ(Call("POST", "/v2/cudasharedmemory/unregister").status, 200);
  EXPECT_TRUE(HandlesCloseTo(0));
}

TEST_F(CudaShmHttpTest, OutOfBoundsTensorsAreRefusedNamingTheRegion) {
  ASSERT_EQ(RegisterCuda("gpu_io", handle_, 0, 64).status, 200);
  HttpResponse r = Call("POST", "/v2/models/ident/infer", InferBody(56, 0));
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("input 'INPUT0': shared_memory_offset 56 + shared_memory_byte_size "
                                "16 is past the end of CUDA shared memory region 'gpu_io' of 64 "
                                "bytes"));
  r = Call("POST", "/v2/models/ident/infer", InferBody(0, 49));
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("output 'OUTPUT0': shared_memory_offset 49"));
  EXPECT_THAT(r.body, HasSubstr("'gpu_io'"));
}

TEST_F(CudaShmHttpTest, BadRegistrationsAreClientErrors) {
  auto expect = [&](HttpResponse r, int status, std::string_view text) {
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_THAT(r.body, HasSubstr(text));
  };
  const std::string path = "/v2/cudasharedmemory/region/c/register";
  expect(Call("POST", path, R"({"device_id": 0, "byte_size": 8})"), 400, "'raw_handle'");
  expect(Call("POST", path, R"({"raw_handle": "abc", "device_id": 0, "byte_size": 8})"), 400,
         "'raw_handle'");
  expect(Call("POST", path, R"({"raw_handle": {"b64": "***"}, "device_id": 0, "byte_size": 8})"),
         400, "base64");
  expect(Call("POST", path, R"({"raw_handle": {"b64": ""}, "byte_size": 8})"), 400, "'device_id'");
  expect(Call("POST", path, R"({"raw_handle": {"b64": ""}, "device_id": 0})"), 400, "'byte_size'");
  expect(Call("POST", path, "{not json"), 400, "JSON");
  expect(Call("GET", path), 405, "");
  expect(RegisterCuda("c", handle_.substr(0, 60), 0, 8), 400,
         "failed to register CUDA shared memory region 'c': failed to open CUDA IPC handle: "
         "'raw_handle' must be the 64 bytes");
  expect(RegisterCuda("c", handle_, 3, 8), 400, "'device_id' 3 is not a GPU of this server");
  expect(RegisterCuda("c", std::string(64, 'z'), 0, 8), 400, "failed to open CUDA IPC handle");
  expect(Call("GET", "/v2/cudasharedmemory/region/c/status"), 404,
         "unable to find cuda shared memory region: 'c'");
  EXPECT_EQ(gpus_->OpenIpcHandles(), 0);
}

TEST_F(CudaShmHttpTest, SystemAndCudaRegionsShareOneNameSpace) {
  const std::string key = "/inferd_cuda_shm_http_" + std::to_string(::getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  close(fd);
  ASSERT_EQ(Call("POST", "/v2/systemsharedmemory/region/shared/register",
                 R"({"key": ")" + key + R"(", "byte_size": 64})").status, 200);
  HttpResponse r = RegisterCuda("shared", handle_, 0, 64);
  EXPECT_EQ(r.status, 400);  // Triton's ALREADY_EXISTS, which its HTTP frontend answers 400
  EXPECT_THAT(r.body, HasSubstr("shared memory region 'shared' already in manager"));
  EXPECT_EQ(gpus_->OpenIpcHandles(), 0);
  r = Call("GET", "/v2/cudasharedmemory/region/shared/status");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.body, HasSubstr("is registered as system shared memory, not CUDA shared memory"));
  ASSERT_EQ(RegisterCuda("gpu", handle_, 0, 64).status, 200);
  r = Call("POST", "/v2/systemsharedmemory/region/gpu/register",
           R"({"key": ")" + key + R"(", "byte_size": 64})");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("shared memory region 'gpu' already in manager"));
  // Unregister of all CUDA regions leaves the system one, and the reverse.
  EXPECT_EQ(Call("POST", "/v2/cudasharedmemory/unregister").status, 200);
  EXPECT_EQ(Call("GET", "/v2/systemsharedmemory/region/shared/status").status, 200);
  EXPECT_EQ(Call("POST", "/v2/systemsharedmemory/unregister").status, 200);
  EXPECT_EQ(Call("GET", "/v2/systemsharedmemory/status").body, "[]");
  shm_unlink(key.c_str());
}

TEST_F(CudaShmHttpTest, UnregisterWhileARequestUsesTheRegionIsSafe) {
  ASSERT_EQ(RegisterCuda("gpu_io", handle_, 0, 64).status, 200);
  // The request resolves the region (Attach), then the region is unregistered before the
  // model answers: the request's hold keeps the handle open until it has written its output.
  auto request = std::make_unique<core::InferRequest>();
  core::InputTensor in;
  in.name = "INPUT0";
  in.datatype = DataType::kFp32;
  in.shape = {4};
  in.shm = core::SharedMemoryRef{"gpu_io", 0, 16};
  request->inputs.push_back(in);
  core::RequestedOutput out;
  out.name = "OUTPUT0";
  out.shm = core::SharedMemoryRef{"gpu_io", 16, 16};
  request->outputs.push_back(out);
  std::unique_ptr<core::InferResponse> answer;
  request->on_complete = [&](std::unique_ptr<core::InferResponse> r) { answer = std::move(r); };
  ASSERT_TRUE(server_->shared_memory().Attach(request.get()).ok());
  EXPECT_EQ(Call("POST", "/v2/cudasharedmemory/unregister").status, 200);
  EXPECT_EQ(gpus_->OpenIpcHandles(), 1);
  auto response = std::make_unique<core::InferResponse>();
  core::OutputTensor o;
  o.name = "OUTPUT0";
  o.data = "0123456789abcdef";
  response->outputs.push_back(o);
  request->on_complete(std::move(response));
  ASSERT_TRUE(answer->status.ok()) << answer->status;
  EXPECT_EQ(std::string(static_cast<char*>(buffer_->data()) + 16, 16), "0123456789abcdef");
  request.reset();
  EXPECT_EQ(gpus_->OpenIpcHandles(), 0);
}

}  // namespace
}  // namespace inferd::http
