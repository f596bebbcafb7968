// CUDA shared memory in the server's one region manager, on the fake device layer: register
// with the raw IPC handle bytes as Triton's clients send them, status, unregister (deferred
// while a request holds the region), bounds checks for tensors in a region, one name space
// with the system regions, inputs copied to the host once (or kept on the GPU for a model that
// takes GPU inputs there), outputs copied into the region, and the refusals (no GPU, bad
// handle, bad device, duplicate name).
#include "gpu/cuda_shared_memory.h"

#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "backends/backend.h"
#include "gmock/gmock.h"
#include "gpu/copy.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"
#include "server/shared_memory.h"

namespace inferd::gpu {
namespace {

using server::SharedMemoryManager;
using ::testing::HasSubstr;

struct Client {
  // What a client process does with CuPy or tritonclient.utils.cuda_shared_memory: allocate on
  // a GPU and export the allocation's IPC handle.
  Client(FakeRuntime& rt, int device, size_t bytes)
      : buffer(*rt.AllocateDevice(device, bytes)), handle(rt.ExportIpcHandle(*buffer)) {}
  char* data() const { return static_cast<char*>(buffer->data()); }
  std::unique_ptr<DeviceBuffer> buffer;
  std::string handle;
};

core::SharedMemoryRef Ref(std::string region, uint64_t offset, uint64_t size) {
  return {std::move(region), offset, size};
}

TEST(CudaSharedMemoryTest, RegisterStatusUnregister) {
  auto rt = FakeRuntime::WithDevices(2);
  Client input(*rt, 1, 64);
  ASSERT_EQ(input.handle.size(), kIpcHandleBytes);
  SharedMemoryManager shm(rt.get());
  EXPECT_TRUE(shm.SupportsCuda());
  ASSERT_TRUE(shm.RegisterCuda("input_data", input.handle, 1, 64).ok());
  EXPECT_EQ(rt->OpenIpcHandles(), 1);
  auto all = shm.Status("", MemoryType::kGpu);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].name, "input_data");
  EXPECT_EQ((*all)[0].device_id, 1);
  EXPECT_EQ((*all)[0].byte_size, 64u);
  EXPECT_TRUE(shm.Status("", MemoryType::kCpu)->empty());  // the system list is apart
  EXPECT_EQ(shm.Status("other", MemoryType::kGpu).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(shm.Status("other", MemoryType::kGpu).status().message(),
              HasSubstr("unable to find cuda shared memory region: 'other'"));
  // Unregistering system regions leaves the CUDA one.
  ASSERT_TRUE(shm.Unregister("", MemoryType::kCpu).ok());
  ASSERT_TRUE(shm.Unregister("input_data", MemoryType::kCpu).ok());
  EXPECT_EQ(shm.Status("", MemoryType::kGpu)->size(), 1u);
  ASSERT_TRUE(shm.Unregister("input_data", MemoryType::kGpu).ok());
  EXPECT_EQ(rt->OpenIpcHandles(), 0);  // closed through the device layer
  EXPECT_TRUE(shm.Status("", MemoryType::kGpu)->empty());
  EXPECT_TRUE(shm.Unregister("never_registered", MemoryType::kGpu).ok());  // as Triton
}

TEST(CudaSharedMemoryTest, ResolveChecksBoundsAndGivesTheGpuPlace) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 64);
  SharedMemoryManager shm(rt.get());
  ASSERT_TRUE(shm.RegisterCuda("r", c.handle, 0, 64).ok());

  auto v = shm.Resolve(Ref("r", 16, 48), "input 'INPUT0'");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->data, c.data() + 16);
  EXPECT_EQ(v->size, 48u);
  EXPECT_EQ(v->place, MemoryPlace::Gpu(0));

  auto past = shm.Resolve(Ref("r", 16, 49), "input 'INPUT0'");
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(),
              HasSubstr("input 'INPUT0': shared_memory_offset 16 + shared_memory_byte_size 49 is "
                        "past the end of CUDA shared memory region 'r' of 64 bytes"));
  // An offset so large that offset + size wraps around is still past the end.
  EXPECT_FALSE(shm.Resolve(Ref("r", ~0ull, 2), "output 'OUT'").ok());
  EXPECT_FALSE(shm.Resolve(Ref("r", 65, 0), "output 'OUT'").ok());
  EXPECT_TRUE(shm.Resolve(Ref("r", 64, 0), "output 'OUT'").ok());
  auto unknown = shm.Resolve(Ref("nope", 0, 4), "input 'X'");
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("input 'X': unable to find shared memory region 'nope'"));
}

// A request as a frontend leaves it: one FP32 input and one output, both naming regions.
std::unique_ptr<core::InferRequest> RequestWith(core::SharedMemoryRef in, core::SharedMemoryRef out,
                                                std::unique_ptr<core::InferResponse>* answer) {
  auto r = std::make_unique<core::InferRequest>();
  core::InputTensor t;
  t.name = "IN";
  t.datatype = DataType::kFp32;
  t.shape = {4};
  t.shm = std::move(in);
  r->inputs.push_back(std::move(t));
  core::RequestedOutput o;
  o.name = "OUT";
  o.shm = std::move(out);
  r->outputs.push_back(std::move(o));
  r->on_complete = [answer](std::unique_ptr<core::InferResponse> resp) { *answer = std::move(resp); };
  return r;
}

TEST(CudaSharedMemoryTest, AttachCopiesTheInputToTheHostOnceAndTheOutputIntoTheRegion) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 32);
  SharedMemoryManager shm(rt.get());
  ASSERT_TRUE(shm.RegisterCuda("io", c.handle, 0, 32).ok());
  std::memcpy(c.data(), "input bytes here", 16);  // the client's input, on its GPU
  std::unique_ptr<core::InferResponse> answer;
  auto request = RequestWith(Ref("io", 0, 16), Ref("io", 16, 16), &answer);
  ASSERT_TRUE(shm.Attach(request.get()).ok());
  // A host-only model's edge: one device-to-host copy, the tensor on the host.
  EXPECT_EQ(request->inputs[0].place, MemoryPlace::Host());
  EXPECT_EQ(request->inputs[0].data, "input bytes here");
  EXPECT_NE(request->inputs[0].data.data(), c.data());
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 1);
  // The model answers on the host; the output lands in the region's second half.
  auto response = std::make_unique<core::InferResponse>();
  core::OutputTensor out;
  out.name = "OUT";
  out.datatype = DataType::kFp32;
  out.shape = {4};
  out.data = "output bytes 16B";
  response->outputs.push_back(out);
  request->on_complete(std::move(response));
  ASSERT_NE(answer, nullptr);
  ASSERT_TRUE(answer->status.ok()) << answer->status;
  EXPECT_TRUE(answer->outputs[0].in_shared_memory);
  EXPECT_TRUE(answer->outputs[0].data.empty());
  EXPECT_EQ(std::string(c.data() + 16, 16), "output bytes 16B");
  EXPECT_EQ(rt->CopyCount(CopyKind::kHostToDevice), 1);
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 1);
}

TEST(CudaSharedMemoryTest, AModelTakingGpuInputsGetsTheRegionWithNoCopy) {
  auto rt = FakeRuntime::WithDevices(2);
  Client c(*rt, 1, 32);
  SharedMemoryManager shm(rt.get());
  ASSERT_TRUE(shm.RegisterCuda("io", c.handle, 1, 32).ok());
  std::unique_ptr<core::InferResponse> answer;
  auto request = RequestWith(Ref("io", 0, 16), Ref("io", 16, 16), &answer);
  ASSERT_TRUE(shm.Attach(request.get(), /*gpu_inputs_on=*/1).ok());
  EXPECT_EQ(request->inputs[0].place, MemoryPlace::Gpu(1));
  EXPECT_EQ(request->inputs[0].data.data(), c.data());
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 0);
  // A model whose GPU inputs are on another GPU gets host bytes.
  auto other = RequestWith(Ref("io", 0, 16), Ref("io", 16, 16), &answer);
  ASSERT_TRUE(shm.Attach(other.get(), /*gpu_inputs_on=*/0).ok());
  EXPECT_EQ(other->inputs[0].place, MemoryPlace::Host());
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 1);
}

TEST(CudaSharedMemoryTest, AModelTakingGpuInputsOnAnyGpuGetsEveryRegionWithNoCopy) {
  // The Python backend with FORCE_CPU_ONLY_INPUT_TENSORS 'no' (backends::kAnyGpu).
  auto rt = FakeRuntime::WithDevices(2);
  Client c(*rt, 1, 32);
  SharedMemoryManager shm(rt.get());
  ASSERT_TRUE(shm.RegisterCuda("io", c.handle, 1, 32).ok());
  std::unique_ptr<core::InferResponse> answer;
  auto request = RequestWith(Ref("io", 0, 16), Ref("io", 16, 16), &answer);
  ASSERT_TRUE(shm.Attach(request.get(), backends::kAnyGpu).ok());
  EXPECT_EQ(request->inputs[0].place, MemoryPlace::Gpu(1));
  EXPECT_EQ(request->inputs[0].data.data(), c.data());
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 0);
}

TEST(CudaSharedMemoryTest, AttachRefusesOutOfBoundsTensorsNamingTheRegion) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 32);
  SharedMemoryManager shm(rt.get());
  ASSERT_TRUE(shm.RegisterCuda("io", c.handle, 0, 32).ok());
  std::unique_ptr<core::InferResponse> answer;
  auto in_past = RequestWith(Ref("io", 24, 16), Ref("io", 0, 16), &answer);
  absl::Status st = shm.Attach(in_past.get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("input 'IN': shared_memory_offset 24 + "
                                      "shared_memory_byte_size 16 is past the end of CUDA "
                                      "shared memory region 'io' of 32 bytes"));
  auto out_past = RequestWith(Ref("io", 0, 16), Ref("io", 32, 1), &answer);
  EXPECT_THAT(shm.Attach(out_past.get()).message(),
              HasSubstr("output 'OUT': shared_memory_offset 32"));
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 1);  // only the second request's input
}

TEST(CudaSharedMemoryTest, UnregisterWhileInUseClosesWhenTheLastUserFinishes) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 32);
  SharedMemoryManager shm(rt.get());
  ASSERT_TRUE(shm.RegisterCuda("r", c.handle, 0, 32).ok());
  std::unique_ptr<core::InferResponse> answer;
  auto request = RequestWith(Ref("r", 0, 16), Ref("r", 16, 16), &answer);
  ASSERT_TRUE(shm.Attach(request.get()).ok());
  ASSERT_TRUE(shm.Unregister("", MemoryType::kGpu).ok());
  EXPECT_TRUE(shm.Status("", MemoryType::kGpu)->empty());
  EXPECT_EQ(rt->OpenIpcHandles(), 1);  // the request still holds it
  // The name is free again at once.
  ASSERT_TRUE(shm.RegisterCuda("r", c.handle, 0, 32).ok());
  EXPECT_EQ(rt->OpenIpcHandles(), 2);
  // The request finishes into the unregistered region, still open for it.
  auto response = std::make_unique<core::InferResponse>();
  core::OutputTensor out;
  out.name = "OUT";
  out.data = "sixteen bytes!!!";
  response->outputs.push_back(out);
  request->on_complete(std::move(response));
  ASSERT_TRUE(answer->status.ok()) << answer->status;
  EXPECT_EQ(std::string(c.data() + 16, 16), "sixteen bytes!!!");
  request.reset();
  EXPECT_EQ(rt->OpenIpcHandles(), 1);
}

TEST(CudaSharedMemoryTest, OneNameSpaceWithSystemRegions) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 16);
  const std::string key = "/inferd_cuda_shm_test_" + std::to_string(::getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  close(fd);
  SharedMemoryManager shm(rt.get());
  ASSERT_TRUE(shm.Register("sys", key, 0, 64).ok());
  absl::Status st = shm.RegisterCuda("sys", c.handle, 0, 16);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(), "shared memory region 'sys' already in manager");
  EXPECT_EQ(rt->OpenIpcHandles(), 0);
  ASSERT_TRUE(shm.RegisterCuda("gpu", c.handle, 0, 16).ok());
  st = shm.Register("gpu", key, 0, 64);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(), "shared memory region 'gpu' already in manager");
  // Each kind's status names the other's region as Triton does.
  EXPECT_EQ(shm.Status("sys", MemoryType::kGpu).status().message(),
            "The region named 'sys' is registered as system shared memory, not CUDA shared memory");
  EXPECT_EQ(shm.Status("gpu", MemoryType::kCpu).status().message(),
            "The region named 'gpu' is registered as CUDA shared memory, not system shared memory");
  // Unregistering a name through the other kind's route leaves it.
  ASSERT_TRUE(shm.Unregister("gpu", MemoryType::kCpu).ok());
  ASSERT_TRUE(shm.Unregister("sys", MemoryType::kGpu).ok());
  EXPECT_EQ(shm.Status("", MemoryType::kCpu)->size(), 1u);
  EXPECT_EQ(shm.Status("", MemoryType::kGpu)->size(), 1u);
  shm_unlink(key.c_str());
}

TEST(CudaSharedMemoryTest, RefusalsNameWhatIsWrong) {
  auto rt = FakeRuntime::WithDevices(2);
  Client c(*rt, 0, 16);
  SharedMemoryManager shm(rt.get());
  auto expect = [&](absl::Status st, absl::StatusCode code, std::string_view text) {
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_THAT(st.message(), HasSubstr(text));
  };
  expect(shm.RegisterCuda("", c.handle, 0, 16), absl::StatusCode::kInvalidArgument,
         "failed to register CUDA shared memory region '': a region needs a name");
  expect(shm.RegisterCuda("r", c.handle.substr(0, 63), 0, 16), absl::StatusCode::kInvalidArgument,
         "failed to register CUDA shared memory region 'r': failed to open CUDA IPC handle: "
         "'raw_handle' must be the 64 bytes of a cudaIpcMemHandle_t, got 63");
  expect(shm.RegisterCuda("r", c.handle, 0, 0), absl::StatusCode::kInvalidArgument,
         "'byte_size' must be positive");
  expect(shm.RegisterCuda("r", c.handle, 2, 16), absl::StatusCode::kInvalidArgument,
         "'device_id' 2 is not a GPU of this server (it has 2)");
  expect(shm.RegisterCuda("r", c.handle, -1, 16), absl::StatusCode::kInvalidArgument,
         "'device_id' -1");
  // A handle exported on GPU 0 opened as GPU 1's, and garbage: the driver refuses both.
  expect(shm.RegisterCuda("r", c.handle, 1, 16), absl::StatusCode::kInvalidArgument,
         "failed to register CUDA shared memory region 'r': failed to open CUDA IPC handle: "
         "cudaIpcOpenMemHandle on GPU 1");
  expect(shm.RegisterCuda("r", std::string(64, 'x'), 0, 16), absl::StatusCode::kInvalidArgument,
         "cudaIpcOpenMemHandle on GPU 0");
  ASSERT_TRUE(shm.RegisterCuda("r", c.handle, 0, 16).ok());
  expect(shm.RegisterCuda("r", c.handle, 0, 16), absl::StatusCode::kAlreadyExists,
         "shared memory region 'r' already in manager");
  EXPECT_EQ(rt->OpenIpcHandles(), 1);  // nothing refused was left open
}

TEST(CudaSharedMemoryTest, NoGpuIsAClientErrorWithTheReason) {
  FakeRuntime none({}, "no NVIDIA driver on this host: CUDA error 35");
  SharedMemoryManager shm(&none);
  EXPECT_TRUE(shm.SupportsCuda());  // a GPU build on a host without one, as Triton's
  absl::Status st = shm.RegisterCuda("r", std::string(64, '\0'), 0, 16);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);  // the routes' 400
  EXPECT_THAT(st.message(), HasSubstr("failed to register CUDA shared memory region 'r': failed "
                                      "to open CUDA IPC handle: this server has no GPU (no "
                                      "NVIDIA driver on this host"));
  EXPECT_TRUE(shm.Status("", MemoryType::kGpu)->empty());
  // No device layer at all: Triton built without GPU support.
  SharedMemoryManager cpu_only(nullptr);
  EXPECT_FALSE(cpu_only.SupportsCuda());
  EXPECT_EQ(cpu_only.RegisterCuda("r", std::string(64, '\0'), 0, 16).message(),
            "failed to register CUDA shared memory region: 'r', GPUs not supported");
}

}  // namespace
}  // namespace inferd::gpu
