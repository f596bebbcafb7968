// The CUDA shared-memory region table on the fake device layer: register with the raw IPC
// handle bytes as Triton's clients send them, status, unregister (deferred while a request
// holds the region), bounds checks for tensors in a region, and the refusals (no GPU, bad
// handle, bad device, duplicate name).
#include "gpu/cuda_shared_memory.h"

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gpu/copy.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"

namespace inferd::gpu {
namespace {

using ::testing::HasSubstr;

struct Client {
  // What a client process does with CuPy or tritonclient.utils.cuda_shared_memory: allocate on
  // a GPU and export the allocation's IPC handle.
  Client(FakeRuntime& rt, int device, size_t bytes)
      : buffer(*rt.AllocateDevice(device, bytes)), handle(rt.ExportIpcHandle(*buffer)) {}
  std::unique_ptr<DeviceBuffer> buffer;
  std::string handle;
};

TEST(CudaSharedMemoryTest, RegisterStatusUnregister) {
  auto rt = FakeRuntime::WithDevices(2);
  Client input(*rt, 1, 64);
  ASSERT_EQ(input.handle.size(), kIpcHandleBytes);
  CudaSharedMemoryTable table(rt.get());
  ASSERT_TRUE(table.Register("input_data", input.handle, 1, 64).ok());
  EXPECT_EQ(rt->OpenIpcHandles(), 1);
  auto all = table.Status("");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].name, "input_data");
  EXPECT_EQ((*all)[0].device_id, 1);
  EXPECT_EQ((*all)[0].byte_size, 64u);
  EXPECT_EQ(table.Status("other").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(table.Status("other").status().message(),
              HasSubstr("unable to find cuda shared memory region: 'other'"));
  ASSERT_TRUE(table.Unregister("input_data").ok());
  EXPECT_EQ(rt->OpenIpcHandles(), 0);  // closed through the device layer
  EXPECT_TRUE(table.Status("")->empty());
  EXPECT_TRUE(table.Unregister("never_registered").ok());  // as Triton
}

TEST(CudaSharedMemoryTest, ResolveChecksBoundsAndGivesTheGpuPlace) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 64);
  CudaSharedMemoryTable table(rt.get());
  ASSERT_TRUE(table.Register("r", c.handle, 0, 64).ok());

  auto v = table.Resolve("r", 16, 48, "input 'INPUT0'");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->data, static_cast<char*>(c.buffer->data()) + 16);
  EXPECT_EQ(v->size, 48u);
  EXPECT_EQ(v->place, MemoryPlace::Gpu(0));

  auto past = table.Resolve("r", 16, 49, "input 'INPUT0'");
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(),
              HasSubstr("input 'INPUT0': shared_memory_offset 16 + shared_memory_byte_size 49 is "
                        "past the end of CUDA shared memory region 'r' of 64 bytes"));
  // An offset so large that offset + size wraps around is still past the end.
  EXPECT_FALSE(table.Resolve("r", ~0ull, 2, "output 'OUT'").ok());
  EXPECT_FALSE(table.Resolve("r", 65, 0, "output 'OUT'").ok());
  EXPECT_TRUE(table.Resolve("r", 64, 0, "output 'OUT'").ok());
  auto unknown = table.Resolve("nope", 0, 4, "input 'X'");
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("input 'X': unable to find CUDA shared memory region 'nope'"));
}

TEST(CudaSharedMemoryTest, InputAndOutputMoveThroughTheRegionOnTheDevice) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 32);
  CudaSharedMemoryTable table(rt.get());
  ASSERT_TRUE(table.Register("io", c.handle, 0, 32).ok());
  auto stream = rt->CreateStream(0);
  ASSERT_TRUE(stream.ok());
  // The client's input, written into its GPU buffer.
  std::memcpy(c.buffer->data(), "input bytes here", 16);
  auto in = table.Resolve("io", 0, 16, "input 'IN'");
  ASSERT_TRUE(in.ok());
  // A host-only backend's edge: one device-to-host copy.
  auto host = CopyToPlace(*rt, {static_cast<const char*>(in->data), in->size}, in->place,
                          MemoryPlace::Host(), stream->get());
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->view(), "input bytes here");
  // The output written into the second half of the region: one host-to-device copy.
  auto out = table.Resolve("io", 16, 16, "output 'OUT'");
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE(CopyBetween(*rt, out->data, out->place, "output bytes 16B", MemoryPlace::Host(), 16,
                          stream->get())
                  .ok());
  EXPECT_EQ(std::string(static_cast<char*>(c.buffer->data()) + 16, 16), "output bytes 16B");
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 1);
  EXPECT_EQ(rt->CopyCount(CopyKind::kHostToDevice), 1);
}

TEST(CudaSharedMemoryTest, UnregisterWhileInUseClosesWhenTheLastUserFinishes) {
  auto rt = FakeRuntime::WithDevices(1);
  Client c(*rt, 0, 16);
  CudaSharedMemoryTable table(rt.get());
  ASSERT_TRUE(table.Register("r", c.handle, 0, 16).ok());
  auto v = table.Resolve("r", 0, 16, "input 'X'");
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(table.Unregister("").ok());
  EXPECT_TRUE(table.Status("")->empty());
  EXPECT_EQ(rt->OpenIpcHandles(), 1);  // the request still holds it
  // The name is free again at once.
  ASSERT_TRUE(table.Register("r", c.handle, 0, 16).ok());
  EXPECT_EQ(rt->OpenIpcHandles(), 2);
  v->holder.reset();
  EXPECT_EQ(rt->OpenIpcHandles(), 1);
}

TEST(CudaSharedMemoryTest, RefusalsNameWhatIsWrong) {
  auto rt = FakeRuntime::WithDevices(2);
  Client c(*rt, 0, 16);
  CudaSharedMemoryTable table(rt.get());
  auto expect = [&](absl::Status st, absl::StatusCode code, std::string_view text) {
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_THAT(st.message(), HasSubstr(text));
  };
  expect(table.Register("", c.handle, 0, 16), absl::StatusCode::kInvalidArgument, "needs a name");
  expect(table.Register("r", c.handle.substr(0, 63), 0, 16), absl::StatusCode::kInvalidArgument,
         "'raw_handle' must be the 64 bytes of a cudaIpcMemHandle_t, got 63");
  expect(table.Register("r", c.handle, 0, 0), absl::StatusCode::kInvalidArgument,
         "'byte_size' must be positive");
  expect(table.Register("r", c.handle, 2, 16), absl::StatusCode::kInvalidArgument,
         "'device_id' 2 is not a GPU of this server (it has 2)");
  expect(table.Register("r", c.handle, -1, 16), absl::StatusCode::kInvalidArgument,
         "'device_id' -1");
  // A handle exported on GPU 0 opened as GPU 1's, and garbage: the driver refuses both.
  expect(table.Register("r", c.handle, 1, 16), absl::StatusCode::kInvalidArgument,
         "failed to register CUDA shared memory region 'r': cudaIpcOpenMemHandle on GPU 1");
  expect(table.Register("r", std::string(64, 'x'), 0, 16), absl::StatusCode::kInvalidArgument,
         "cudaIpcOpenMemHandle on GPU 0");
  ASSERT_TRUE(table.Register("r", c.handle, 0, 16).ok());
  expect(table.Register("r", c.handle, 0, 16), absl::StatusCode::kInvalidArgument,
         "shared memory region 'r' is already registered");
  EXPECT_EQ(rt->OpenIpcHandles(), 1);  // nothing refused was left open
}

TEST(CudaSharedMemoryTest, NoGpuIsUnimplementedWithTheReason) {
  FakeRuntime none({}, "no NVIDIA driver on this host: CUDA error 35");
  CudaSharedMemoryTable table(&none);
  absl::Status st = table.Register("r", std::string(64, '\0'), 0, 16);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);  // the routes' 501
  EXPECT_THAT(st.message(), HasSubstr("it has no GPU (no NVIDIA driver on this host"));
  EXPECT_TRUE(table.Status("")->empty());
}

}  // namespace
}  // namespace inferd::gpu
