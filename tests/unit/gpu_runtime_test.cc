#include <cstring>

#include "gpu/fake_runtime.h"
#include "gpu/runtime.h"
#include "gtest/gtest.h"

namespace inferd::gpu {
namespace {

TEST(FakeRuntimeTest, DevicesAndProperties) {
  auto rt = FakeRuntime::WithDevices(2, 7, 5, 16ull << 30);
  ASSERT_EQ(rt->DeviceCount(), 2);
  EXPECT_EQ(rt->UnavailableReason(), "");
  auto props = rt->Properties(1);
  ASSERT_TRUE(props.ok()) << props.status();
  EXPECT_EQ(props->id, 1);
  EXPECT_DOUBLE_EQ(props->ComputeCapability(), 7.5);
  EXPECT_EQ(props->total_memory_bytes, 16ull << 30);
  EXPECT_EQ(ListDevices(*rt).size(), 2u);
  auto missing = rt->Properties(2);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(missing.status().message().find("GPU 2"), std::string::npos) << missing.status();
}

TEST(FakeRuntimeTest, MemoryIsAccountedAndReturned) {
  auto rt = FakeRuntime::WithDevices(1, 8, 6, 1000);
  {
    auto buf = rt->AllocateDevice(0, 600);
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_EQ(rt->GetMemoryInfo(0)->free_bytes, 400u);
    auto too_much = rt->AllocateDevice(0, 500);
    EXPECT_EQ(too_much.status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(rt->GetMemoryInfo(0)->free_bytes, 1000u);
}

TEST(FakeRuntimeTest, CopiesThroughPinnedBuffersOnAStream) {
  auto rt = FakeRuntime::WithDevices(1);
  auto stream = rt->CreateStream(0);
  ASSERT_TRUE(stream.ok());
  auto host = rt->AllocatePinned(16);
  auto dev = rt->AllocateDevice(0, 16);
  auto back = rt->AllocatePinned(16);
  ASSERT_TRUE(host.ok() && dev.ok() && back.ok());
  std::memcpy((*host)->data(), "0123456789abcdef", 16);
  ASSERT_TRUE(rt->CopyAsync((*dev)->data(), (*host)->data(), 16, CopyKind::kHostToDevice, **stream).ok());
  ASSERT_TRUE(rt->CopyAsync((*back)->data(), (*dev)->data(), 16, CopyKind::kDeviceToHost, **stream).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(std::memcmp((*back)->data(), "0123456789abcdef", 16), 0);
  EXPECT_EQ(rt->CreateStream(3).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(FakeRuntimeTest, NoDevicesSaysWhy) {
  FakeRuntime rt({}, "no NVIDIA driver on this host: CUDA error 35");
  EXPECT_EQ(rt.DeviceCount(), 0);
  EXPECT_EQ(rt.UnavailableReason(), "no NVIDIA driver on this host: CUDA error 35");
  EXPECT_FALSE(rt.Properties(0).ok());
}

// The process's real runtime. On this project's machines (toolkit, no driver) it must answer
// "no GPU" cleanly with CUDA's own reason (error 35, or 34 against the stub libcuda); on a GPU
// machine it lists the devices.
TEST(SystemRuntimeTest, ReportsDevicesOrWhyNone) {
  Runtime& rt = SystemRuntime();
  EXPECT_EQ(rt.name(), BuiltWithCuda() ? "cuda" : "none");
  if (rt.DeviceCount() == 0) {
    const std::string why = rt.UnavailableReason();
    EXPECT_FALSE(why.empty());
    if (BuiltWithCuda()) {
      EXPECT_TRUE(why.find("CUDA error 35") != std::string::npos ||
                  why.find("CUDA error 34") != std::string::npos ||
                  why.find("CUDA error 100") != std::string::npos ||
                  why.find("reports no GPU") != std::string::npos)
          << why;
    }
    EXPECT_EQ(rt.Properties(0).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_FALSE(rt.AllocatePinned(64).ok());
    // No device to open a client's CUDA IPC handle on.
    EXPECT_EQ(rt.IpcOpenMemHandle(0, std::string(kIpcHandleBytes, '\0')).status().code(),
              absl::StatusCode::kOutOfRange);
    // Nor memory to export for another process (the Python backend's GPU inputs).
    int dummy = 0;
    EXPECT_EQ(rt.IpcGetMemHandle(0, &dummy).status().code(),
              BuiltWithCuda() ? absl::StatusCode::kOutOfRange : absl::StatusCode::kUnimplemented);
  } else {
    // An address inside an allocation exports the allocation's handle and the offset.
    auto memory = rt.AllocateDevice(0, 256);
    ASSERT_TRUE(memory.ok()) << memory.status();
    auto ex = rt.IpcGetMemHandle(0, static_cast<char*>((*memory)->data()) + 64);
    ASSERT_TRUE(ex.ok()) << ex.status();
    EXPECT_EQ(ex->handle.size(), kIpcHandleBytes);
    EXPECT_EQ(ex->offset, 64u);
    auto props = rt.Properties(0);
    ASSERT_TRUE(props.ok()) << props.status();
    EXPECT_GT(props->total_memory_bytes, 0u);
    EXPECT_GT(props->compute_capability_major, 0);
    auto mem = rt.GetMemoryInfo(0);
    ASSERT_TRUE(mem.ok()) << mem.status();
    EXPECT_LE(mem->free_bytes, mem->total_bytes);
  }
}

}  // namespace
}  // namespace inferd::gpu
