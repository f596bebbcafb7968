// The Python backend's FORCE_CPU_ONLY_INPUT_TENSORS 'no' (issue 30) on the fake device layer:
// an input on a GPU reaches model.py as a CUDA tensor over the same memory, through the CUDA
// IPC handle the server makes (gpu::Runtime::IpcGetMemHandle) and the stub opens. The real
// backend and a real Python process run; model.py replaces the stub's two CUDA calls
// (pb_utils._ipc_open / _ipc_close) with fakes that record what they were given and "map" a
// buffer of their own, then reports what it sees (is_cpu, shape, type, the DLPack capsule's
// device and pointer, the handle) as a JSON output. Values on a real GPU:
// tests/gpu/test_python_dlpack.py.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backends/python/python_backend.h"
#include "backends/tensor_places.h"
#include "config/model_config_util.h"
#include "core/response_sender.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"
#include "rapidjson/document.h"

namespace inferd::backends {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kModelPy[] = R"PY(
import ctypes
import json
import numpy as np
import triton_python_backend_utils as pb_utils

LOG = []      # what the fake CUDA calls were given
MAPPED = {}   # address -> the buffer standing for a mapping
FAIL = [False]


def fake_open(handle, device):
    if FAIL[0]:
        LOG.append(["open_failed", device])
        raise pb_utils.TritonModelException(
            "cudaIpcOpenMemHandle on GPU 0 failed: the fake driver refuses (cudaError 201)")
    buf = np.zeros(4096, dtype=np.uint8)
    MAPPED[buf.ctypes.data] = buf
    # the fake handle: "inferd-fake-ipc", then the exporting process's allocation address
    LOG.append(["open", device, handle[:15].decode(), len(handle),
                int.from_bytes(handle[16:24], "little"), buf.ctypes.data])
    return buf.ctypes.data


def fake_close(address, device):
    LOG.append(["close", device, address in MAPPED])
    MAPPED.pop(address, None)


pb_utils._ipc_open = fake_open
pb_utils._ipc_close = fake_close


def describe(t):
    d = {"is_cpu": t.is_cpu(), "shape": t.shape(), "dtype": t.triton_dtype(),
         "dlpack_device": list(t.__dlpack_device__())}
    if t.is_cpu():
        d["values"] = t.as_numpy().reshape(-1).tolist()
    else:
        d["ptr"] = t._dev.ptr
        d["nbytes"] = t._dev.nbytes
        cap = t.to_dlpack()
        dl = pb_utils._DLManagedTensor.from_address(
            pb_utils._capsule_pointer(cap, b"dltensor")).dl_tensor
        d["capsule"] = {"device": [dl.device.device_type, dl.device.device_id],
                        "data": dl.data, "shape": [dl.shape[i] for i in range(dl.ndim)],
                        "dtype": [dl.dtype.code, dl.dtype.bits]}
        try:
            t.as_numpy()
        except pb_utils.TritonModelException as e:
            d["as_numpy"] = str(e)
    return d


class TritonPythonModel:
    def initialize(self, args):
        FAIL[0] = args["model_name"].endswith("_fail_open")
        self.decoupled = args["model_name"].endswith("_decoupled")

    def execute(self, requests):
        if self.decoupled:
            return self.execute_decoupled(requests)
        out = []
        for r in requests:
            info = {"log": list(LOG)}
            for t in r.inputs():
                info[t.name()] = describe(t)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "INFO", np.array([json.dumps(info)], dtype=np.object_))]))
        return out

    def execute_decoupled(self, requests):
        # Answered from a thread after execute() returned: the input's mapping must still be
        # open then (the server holds the memory until the call is answered).
        import threading
        import time
        returned = threading.Event()

        def answer(r, x):
            returned.wait()
            time.sleep(0.2)  # lets a close at execute()'s return happen first (only if broken)
            info = {"log": list(LOG), "X": describe(x),
                    "mapped_open": any(x._dev.ptr - 64 == a for a in MAPPED)}
            r.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor(
                    "INFO", np.array([json.dumps(info)], dtype=np.object_))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X")
            threading.Thread(target=answer, args=(r, x)).start()
        returned.set()
        return None
)PY";

constexpr char kConfig[] = R"PB(
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, 3 ] },
        { name: "Z" data_type: TYPE_INT64 dims: [ 2 ] },
        { name: "H" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
)PB";

std::string Force(const std::string& value) {
  return "parameters { key: \"FORCE_CPU_ONLY_INPUT_TENSORS\" value: { string_value: \"" + value +
         "\" } }";
}

// A runtime that exports no memory at all, its own allocations included (so staging cannot help
// either); `copies_fail`: and whose copies fail too.
class NoExportRuntime : public gpu::FakeRuntime {
 public:
  explicit NoExportRuntime(bool copies_fail)
      : gpu::FakeRuntime({gpu::DeviceProperties{.total_memory_bytes = 1 << 20}}),
        copies_fail_(copies_fail) {}
  absl::StatusOr<gpu::IpcExport> IpcGetMemHandle(int device, const void* ptr) override {
    return absl::InvalidArgumentError("cudaIpcGetMemHandle: CUDA error 1 (cudaErrorInvalidValue)");
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, gpu::CopyKind kind,
                         gpu::Stream& stream) override {
    if (copies_fail_) return absl::InternalError("cudaMemcpyAsync: CUDA error 700 (fake)");
    return gpu::FakeRuntime::CopyAsync(dst, src, bytes, kind, stream);
  }

 private:
  const bool copies_fail_;
};

// A runtime that refuses to export one buffer (as CUDA refuses a CUDA shared-memory region,
// which the server mapped from a client's handle) and exports the rest, as the fake does.
class ForeignMemoryRuntime : public gpu::FakeRuntime {
 public:
  ForeignMemoryRuntime()
      : gpu::FakeRuntime({gpu::DeviceProperties{.name = "fake", .total_memory_bytes = 64 << 20}}) {}
  void Refuse(const gpu::DeviceBuffer* buffer) { refused_ = buffer; }
  absl::StatusOr<gpu::IpcExport> IpcGetMemHandle(int device, const void* ptr) override {
    const char* p = static_cast<const char*>(ptr);
    const char* begin = static_cast<const char*>(refused_->data());
    if (p >= begin && p < begin + refused_->size()) {
      return absl::InvalidArgumentError("cudaIpcGetMemHandle: CUDA error 1 (cudaErrorInvalidValue)");
    }
    return gpu::FakeRuntime::IpcGetMemHandle(device, ptr);
  }

 private:
  const gpu::DeviceBuffer* refused_ = nullptr;
};

class PythonGpuInputsTest : public ::testing::Test {
 protected:
  // Loads model `name` (config kConfig + `extra`) on the Python backend over `gpus`.
  void Load(const std::string& name, const std::string& extra, gpu::Runtime* gpus) {
    dir_ = ::testing::TempDir() + "/python_gpu_inputs_" + std::to_string(::getpid()) + "_" + name;
    fs::create_directories(dir_ + "/1");
    std::ofstream(dir_ + "/1/model.py") << kModelPy;
    auto cfg = config::ParseModelConfigText("name: \"" + name + "\"" + kConfig + extra, "c");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    config_ = *std::move(cfg);
    backend_ = MakePythonBackend(gpus);
    spec_.config = &config_;
    spec_.model_dir = dir_;
    spec_.version_dir = dir_ + "/1";
    spec_.version = 1;
    spec_.model_path = dir_ + "/1/model.py";
    auto instance = backend_->CreateInstance(spec_, config_.instance_group().empty()
                                                        ? inference::ModelInstanceGroup()
                                                        : config_.instance_group(0),
                                             0);
    ASSERT_TRUE(instance.ok()) << instance.status();
    instance_ = *std::move(instance);
  }

  void TearDown() override {
    instance_.reset();
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // A request with X (FP32 [2, 3]) at byte 64 and Z (INT64 [2]) at byte 128 of `device_memory`
  // on GPU 0 (null: both on the host), and H (INT32 [2]) on the host.
  std::unique_ptr<core::InferRequest> Request(gpu::DeviceBuffer* device_memory) {
    auto r = std::make_unique<core::InferRequest>();
    auto host = std::make_shared<std::string>(256, '\0');
    char* base = device_memory != nullptr ? static_cast<char*>(device_memory->data())
                                          : host->data();
    const float x[6] = {0.5f, 1.5f, -3.0f, 8.0f, 2.25f, -0.125f};
    const int64_t z[2] = {7, -9};
    std::memcpy(base + 64, x, sizeof(x));
    std::memcpy(base + 128, z, sizeof(z));
    const int32_t h[2] = {3, 4};
    std::memcpy(host->data() + 192, h, sizeof(h));
    const MemoryPlace place =
        device_memory != nullptr ? MemoryPlace::Gpu(0) : MemoryPlace::Host();
    r->inputs.push_back({"X", DataType::kFp32, {2, 3}, {base + 64, sizeof(x)}, {}, place});
    r->inputs.push_back({"Z", DataType::kInt64, {2}, {base + 128, sizeof(z)}, {}, place});
    r->inputs.push_back(
        {"H", DataType::kInt32, {2}, {host->data() + 192, sizeof(h)}, {}, MemoryPlace::Host()});
    r->holders.push_back(host);
    return r;
  }

  // Runs one request; its response.
  std::unique_ptr<core::InferResponse> Run(core::InferRequest* request) {
    auto response = std::make_unique<core::InferResponse>();
    core::InferRequest* reqs[] = {request};
    core::InferResponse* resps[] = {response.get()};
    ExecutionTimes times;
    instance_->Execute(reqs, resps, &times);
    return response;
  }

  // The JSON model.py answered.
  static rapidjson::Document Info(const core::InferResponse& response) {
    rapidjson::Document doc;
    EXPECT_TRUE(response.status.ok()) << response.status;
    if (response.outputs.size() != 1) {
      ADD_FAILURE() << "expected the INFO output";
      return doc;
    }
    const std::string_view bytes = response.outputs[0].data;
    uint32_t n = 0;
    std::memcpy(&n, bytes.data(), 4);
    doc.Parse(bytes.data() + 4, n);
    EXPECT_FALSE(doc.HasParseError()) << bytes;
    return doc;
  }

  std::string dir_;
  config::ModelConfig config_;
  std::unique_ptr<Backend> backend_;
  ModelSpec spec_;
  std::unique_ptr<ModelInstance> instance_;
};

TEST_F(PythonGpuInputsTest, AGpuInputReachesModelPyAsACudaTensorOverTheSameMemory) {
  auto gpus = gpu::FakeRuntime::WithDevices(1);
  ASSERT_NO_FATAL_FAILURE(Load("gin", Force("no"), gpus.get()));
  EXPECT_EQ(instance_->GpuInputsOn(), std::optional<int>(kAnyGpu));
  std::unique_ptr<gpu::DeviceBuffer> memory = *gpus->AllocateDevice(0, 256);
  auto request = Request(memory.get());
  rapidjson::Document info = Info(*Run(request.get()));
  ASSERT_TRUE(info.IsObject());

  // The stub opened the one allocation's handle once, for both inputs in it.
  const auto& log = info["log"];
  ASSERT_EQ(log.Size(), 1u);
  EXPECT_STREQ(log[0][0].GetString(), "open");
  EXPECT_EQ(log[0][1].GetInt(), 0);                          // device
  EXPECT_STREQ(log[0][2].GetString(), "inferd-fake-ipc");    // the server's handle ...
  EXPECT_EQ(log[0][3].GetInt(), 64);                         // ... all 64 bytes of it
  EXPECT_EQ(log[0][4].GetUint64(), reinterpret_cast<uint64_t>(memory->data()));  // its memory
  const uint64_t mapped = log[0][5].GetUint64();

  const auto& x = info["X"];
  EXPECT_FALSE(x["is_cpu"].GetBool());
  EXPECT_EQ(x["shape"][0].GetInt(), 2);
  EXPECT_EQ(x["shape"][1].GetInt(), 3);
  EXPECT_EQ(x["dtype"].GetInt(), 11);  // TYPE_FP32
  EXPECT_EQ(x["dlpack_device"][0].GetInt(), 2);  // kDLCUDA
  EXPECT_EQ(x["dlpack_device"][1].GetInt(), 0);
  EXPECT_EQ(x["ptr"].GetUint64(), mapped + 64);  // the mapping plus the input's offset in it
  EXPECT_EQ(x["nbytes"].GetInt(), 24);
  EXPECT_STREQ(x["as_numpy"].GetString(),
               "Tensor is stored in GPU and cannot be converted to NumPy.");
  const auto& cap = x["capsule"];  // to_dlpack(): what torch.from_dlpack reads
  EXPECT_EQ(cap["device"][0].GetInt(), 2);
  EXPECT_EQ(cap["device"][1].GetInt(), 0);
  EXPECT_EQ(cap["data"].GetUint64(), mapped + 64);
  EXPECT_EQ(cap["shape"].Size(), 2u);
  EXPECT_EQ(cap["dtype"][0].GetInt(), 2);   // kDLFloat
  EXPECT_EQ(cap["dtype"][1].GetInt(), 32);

  const auto& z = info["Z"];
  EXPECT_FALSE(z["is_cpu"].GetBool());
  EXPECT_EQ(z["dtype"].GetInt(), 9);  // TYPE_INT64
  EXPECT_EQ(z["ptr"].GetUint64(), mapped + 128);
  EXPECT_EQ(z["capsule"]["dtype"][0].GetInt(), 0);  // kDLInt
  EXPECT_EQ(z["capsule"]["dtype"][1].GetInt(), 64);

  const auto& h = info["H"];  // a host input stays a host tensor
  EXPECT_TRUE(h["is_cpu"].GetBool());
  EXPECT_EQ(h["values"][0].GetInt(), 3);
  EXPECT_EQ(h["values"][1].GetInt(), 4);
  EXPECT_EQ(gpus->CopyCount(gpu::CopyKind::kDeviceToHost), 0);  // no copy to the host

  // The mapping was closed once the call was answered: the next call's log shows it.
  auto again = Request(memory.get());
  rapidjson::Document next = Info(*Run(again.get()));
  ASSERT_TRUE(next.IsObject());
  ASSERT_GE(next["log"].Size(), 2u);
  EXPECT_STREQ(next["log"][1][0].GetString(), "close");
  EXPECT_EQ(next["log"][1][1].GetInt(), 0);
  EXPECT_TRUE(next["log"][1][2].GetBool());  // the address it opened
}

TEST_F(PythonGpuInputsTest, ADecoupledModelReadsItsGpuInputUntilItsFinalResponse) {
  auto gpus = gpu::FakeRuntime::WithDevices(1);
  ASSERT_NO_FATAL_FAILURE(Load("gin_decoupled",
                               Force("no") + " model_transaction_policy { decoupled: true }",
                               gpus.get()));
  std::unique_ptr<gpu::DeviceBuffer> memory = *gpus->AllocateDevice(0, 256);
  auto run = [&]() -> rapidjson::Document {
    auto request = Request(memory.get());
    std::vector<std::unique_ptr<core::InferResponse>> got;
    bool final = false;
    // Execute returns once the process has answered the call, after the final flag.
    request->on_response = [&](std::unique_ptr<core::InferResponse> r, bool last) {
      if (r != nullptr) got.push_back(std::move(r));
      final |= last;
    };
    EXPECT_TRUE(core::PrepareDecoupledRequest(request.get(), true).ok());
    auto unused = Run(request.get());
    EXPECT_TRUE(final);
    if (got.size() != 1) {
      ADD_FAILURE() << got.size() << " responses";
      return rapidjson::Document();
    }
    return Info(*got[0]);
  };
  rapidjson::Document info = run();
  ASSERT_TRUE(info.IsObject());
  EXPECT_FALSE(info["X"]["is_cpu"].GetBool());
  EXPECT_TRUE(info["mapped_open"].GetBool());  // still mapped after execute() returned
  ASSERT_EQ(info["log"].Size(), 1u);
  EXPECT_STREQ(info["log"][0][0].GetString(), "open");
  // Closed once the call was answered (after the final response).
  rapidjson::Document next = run();
  ASSERT_TRUE(next.IsObject());
  ASSERT_GE(next["log"].Size(), 2u);
  EXPECT_STREQ(next["log"][1][0].GetString(), "close");
}

TEST_F(PythonGpuInputsTest, WhenTheProcessCannotOpenTheHandleInputsComeAsHostCopies) {
  auto gpus = gpu::FakeRuntime::WithDevices(1);
  ASSERT_NO_FATAL_FAILURE(Load("gin_fail_open", Force("no"), gpus.get()));
  std::unique_ptr<gpu::DeviceBuffer> memory = *gpus->AllocateDevice(0, 256);
  auto request = Request(memory.get());
  rapidjson::Document info = Info(*Run(request.get()));
  ASSERT_TRUE(info.IsObject());
  ASSERT_EQ(info["log"].Size(), 1u);  // one try, then the execute went again with host bytes
  EXPECT_STREQ(info["log"][0][0].GetString(), "open_failed");
  EXPECT_TRUE(info["X"]["is_cpu"].GetBool());
  EXPECT_EQ(info["X"]["values"][3].GetDouble(), 8.0);
  EXPECT_TRUE(info["Z"]["is_cpu"].GetBool());
  EXPECT_EQ(info["Z"]["values"][1].GetInt(), -9);
  EXPECT_EQ(gpus->CopyCount(gpu::CopyKind::kDeviceToHost), 2);
  // The instance does not try again.
  auto again = Request(memory.get());
  rapidjson::Document next = Info(*Run(again.get()));
  ASSERT_TRUE(next.IsObject());
  EXPECT_EQ(next["log"].Size(), 1u);
  EXPECT_TRUE(next["X"]["is_cpu"].GetBool());
}

// Triton's Python backend copies a GPU input it cannot hand over as it is into its CUDA pool;
// inferd copies it, device to device, into the instance's staging buffer, and model.py still
// gets CUDA tensors. No byte goes through the host.
TEST_F(PythonGpuInputsTest, MemoryThatCannotBeExportedIsStagedOnItsGpuAndStillReachesModelPyThere) {
  ForeignMemoryRuntime gpus;
  ASSERT_NO_FATAL_FAILURE(Load("gin", Force("no"), &gpus));
  std::unique_ptr<gpu::DeviceBuffer> region = *gpus.AllocateDevice(0, 256);
  gpus.Refuse(region.get());
  auto request = Request(region.get());
  rapidjson::Document info = Info(*Run(request.get()));
  ASSERT_TRUE(info.IsObject());

  // One handle, for the staging buffer holding both inputs; not the region's.
  const auto& log = info["log"];
  ASSERT_EQ(log.Size(), 1u);
  EXPECT_STREQ(log[0][0].GetString(), "open");
  const uint64_t staging = log[0][4].GetUint64();
  EXPECT_NE(staging, reinterpret_cast<uint64_t>(region->data()));
  const uint64_t mapped = log[0][5].GetUint64();
  EXPECT_FALSE(info["X"]["is_cpu"].GetBool());
  EXPECT_FALSE(info["Z"]["is_cpu"].GetBool());
  EXPECT_EQ(info["X"]["ptr"].GetUint64(), mapped + 0);   // X at the buffer's start
  EXPECT_EQ(info["Z"]["ptr"].GetUint64(), mapped + 64);  // Z at the next aligned offset
  EXPECT_EQ(info["Z"]["nbytes"].GetInt(), 16);
  EXPECT_TRUE(info["H"]["is_cpu"].GetBool());

  // The staged bytes are the inputs' (the fake's device memory is this process's memory).
  const char* staged = reinterpret_cast<const char*>(staging);
  float x[6];
  std::memcpy(x, staged, sizeof(x));
  EXPECT_EQ(x[0], 0.5f);
  EXPECT_EQ(x[5], -0.125f);
  int64_t z[2];
  std::memcpy(z, staged + 64, sizeof(z));
  EXPECT_EQ(z[1], -9);
  EXPECT_EQ(gpus.CopyCount(gpu::CopyKind::kDeviceToDevice), 2);
  EXPECT_EQ(gpus.CopyCount(gpu::CopyKind::kDeviceToHost), 0);

  // The next batch reuses the staging buffer: the same allocation is exported again.
  auto again = Request(region.get());
  rapidjson::Document next = Info(*Run(again.get()));
  ASSERT_TRUE(next.IsObject());
  ASSERT_EQ(next["log"].Size(), 3u);  // open, close (the first call's), open
  EXPECT_STREQ(next["log"][2][0].GetString(), "open");
  EXPECT_EQ(next["log"][2][4].GetUint64(), staging);
  EXPECT_FALSE(next["X"]["is_cpu"].GetBool());
  instance_.reset();  // its staging buffer goes back to `gpus` before `gpus` goes
}

TEST_F(PythonGpuInputsTest, MemoryNothingCanExportIsCopiedToTheHost) {
  NoExportRuntime gpus(/*copies_fail=*/false);
  ASSERT_NO_FATAL_FAILURE(Load("gin", Force("no"), &gpus));
  std::unique_ptr<gpu::DeviceBuffer> memory = *gpus.AllocateDevice(0, 256);
  auto request = Request(memory.get());
  rapidjson::Document info = Info(*Run(request.get()));
  ASSERT_TRUE(info.IsObject());
  EXPECT_EQ(info["log"].Size(), 0u);  // nothing to open
  EXPECT_TRUE(info["X"]["is_cpu"].GetBool());
  EXPECT_EQ(info["X"]["values"][0].GetDouble(), 0.5);
  EXPECT_EQ(info["Z"]["values"][0].GetInt(), 7);
  EXPECT_EQ(gpus.CopyCount(gpu::CopyKind::kDeviceToHost), 2);
}

TEST_F(PythonGpuInputsTest, AnInputThatReachesModelPyNeitherWayFailsItsBatchNamingIt) {
  NoExportRuntime gpus(/*copies_fail=*/true);
  ASSERT_NO_FATAL_FAILURE(Load("gin", Force("no"), &gpus));
  std::unique_ptr<gpu::DeviceBuffer> memory = *gpus.AllocateDevice(0, 256);
  auto request = Request(memory.get());
  auto response = Run(request.get());
  EXPECT_EQ(response->status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(response->status.message(), HasSubstr("input 'X': copying from GPU 0 to the host"));
  EXPECT_THAT(response->status.message(), HasSubstr("cudaIpcGetMemHandle"));
  EXPECT_TRUE(instance_->Ready());  // the process is fine: the next request runs
  auto host = Request(nullptr);
  rapidjson::Document info = Info(*Run(host.get()));
  ASSERT_TRUE(info.IsObject());
  EXPECT_TRUE(info["X"]["is_cpu"].GetBool());
}

TEST_F(PythonGpuInputsTest, HostInputsOnlyWithYesOrWithoutAGpu) {
  auto gpus = gpu::FakeRuntime::WithDevices(1);
  ASSERT_NO_FATAL_FAILURE(Load("gin", Force("yes"), gpus.get()));
  EXPECT_EQ(instance_->GpuInputsOn(), std::nullopt);
  instance_.reset();
  ASSERT_NO_FATAL_FAILURE(Load("gin", "", gpus.get()));
  EXPECT_EQ(instance_->GpuInputsOn(), std::nullopt);
  instance_.reset();
  gpu::FakeRuntime none({}, "no NVIDIA driver on this host: CUDA error 35");
  ASSERT_NO_FATAL_FAILURE(Load("gin", Force("no"), &none));
  EXPECT_EQ(instance_->GpuInputsOn(), std::nullopt);
}

TEST(TensorPlacesTest, AModelTakingGpuInputsOnAnyGpuKeepsThemThere) {
  auto gpus = gpu::FakeRuntime::WithDevices(2);
  std::unique_ptr<gpu::DeviceBuffer> memory = *gpus->AllocateDevice(1, 16);
  core::InferRequest r;
  r.inputs.push_back({"X", DataType::kFp32, {4},
                      {static_cast<char*>(memory->data()), 16}, {}, MemoryPlace::Gpu(1)});
  r.inputs.push_back({"S", DataType::kBytes, {1},
                      {static_cast<char*>(memory->data()), 8}, {}, MemoryPlace::Gpu(1)});
  ASSERT_TRUE(PlaceInputsFor(gpus.get(), &r, kAnyGpu).ok());
  EXPECT_EQ(r.inputs[0].place, MemoryPlace::Gpu(1));
  EXPECT_EQ(r.inputs[1].place, MemoryPlace::Host());  // BYTES: always host bytes
  EXPECT_TRUE(TakesGpuInputOn(kAnyGpu, 3));
  EXPECT_TRUE(TakesGpuInputOn(1, 1));
  EXPECT_FALSE(TakesGpuInputOn(1, 0));
  EXPECT_FALSE(TakesGpuInputOn(std::nullopt, 0));
}

TEST(GpuIpcExportTest, TheFakeExportsTheAllocationAndTheOffsetInIt) {
  auto gpus = gpu::FakeRuntime::WithDevices(2);
  std::unique_ptr<gpu::DeviceBuffer> memory = *gpus->AllocateDevice(1, 64);
  const char* p = static_cast<const char*>(memory->data()) + 40;
  auto ex = gpus->IpcGetMemHandle(1, p);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->offset, 40u);
  EXPECT_EQ(ex->handle, gpus->ExportIpcHandle(*memory));
  auto opened = gpus->IpcOpenMemHandle(1, ex->handle);  // as another process would
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(*opened, memory->data());
  ASSERT_TRUE(gpus->IpcCloseMemHandle(1, *opened).ok());
  EXPECT_EQ(gpus->IpcGetMemHandle(0, p).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string host(8, 'h');
  EXPECT_EQ(gpus->IpcGetMemHandle(1, host.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpus->IpcGetMemHandle(2, p).status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace inferd::backends
